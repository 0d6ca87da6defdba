"""Untrusted input files, read within bounds: regular files only, size caps, one YAML dialect.

Release pipelines hand the builder (and the agent) files from many hands. Every reader of a
user-supplied file goes through here so that none can hang, exhaust memory or echo what it
read:

* :func:`open_regular` refuses anything but a regular file (``/dev/zero``, FIFOs, sockets,
  directories) before reading a byte; :func:`read_bounded` reads at most a cap (``/proc``
  files report size 0, so the cap is enforced on what is read, not on ``st_size`` alone);
  :func:`read_gzip_bounded` decompresses as a stream and stops at a cap.
* :func:`load_yaml` is the one YAML dialect of the build config, the rules files and the
  agent config (``docs/yaml.md``): the YAML 1.2 core schema (``true``/``false`` only;
  ``yes``, ``no``, ``on``, ``off`` and dates stay strings), no aliases, nesting at most
  :data:`MAX_YAML_DEPTH`, integers of at most :data:`MAX_INT_DIGITS` digits, no ``.inf`` or
  ``.nan``; each refusal is a :class:`~boxwatch.agent.errors.ConfigError` naming file,
  line and column.
* :func:`quote` and :func:`one_line` keep echoed input short and free of control
  characters, so that an error message is always one printable line.

The agent never imports the builder; the builder's readers (BN files, data sets) use these
helpers too, and so should any new reader (the UAI reader is next).
"""

from __future__ import annotations

import gzip
import os
import re
import stat
import unicodedata
from collections.abc import Callable
from typing import IO, Any

import yaml

from boxwatch.agent.errors import ConfigError

MAX_CONFIG_BYTES = 4 << 20
"""Bytes a YAML file (build config, rules, agent config) may have."""
MAX_KEY_BYTES = 64 << 10
"""Bytes a PEM key file may have."""
MAX_YAML_DEPTH = 64
"""Nesting depth of a YAML document (collections inside collections)."""
MAX_INT_DIGITS = 100
"""Digits of a YAML integer (far beyond any setting; Python refuses > 4,300 anyway)."""
MAX_ECHO = 80
"""Characters of user input echoed in a message."""
MAX_MESSAGE = 2000
"""Characters of a whole error line."""


# ---------------------------------------------------------------------------- echoes
def _printable(ch: str) -> str:
    if ch == "\t" or unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp", "Cs"):
        return ch
    return ascii(ch)[1:-1]


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` as one printable line: control and format characters escaped, length capped."""
    out = "".join(_printable(c) for c in str(text))
    if len(out) > limit:
        out = out[: limit - 20] + f"... ({len(out) - limit + 20} more)"
    return out


def quote(value: Any, limit: int = MAX_ECHO) -> str:
    """A user-supplied value for a message: ``repr``-quoted, escaped and cut to ``limit``."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        return repr(text[:limit])[:-1] + f"...' ({len(text):,} characters)"
    return one_line(repr(text))


def show_path(path: str | os.PathLike[str]) -> str:
    """A path for a message: control characters escaped, long paths cut in the middle."""
    text = one_line(os.fspath(path), limit=10_000)
    if len(text) > 200:
        text = text[:90] + "..." + text[-90:]
    return text


def size_text(n: int) -> str:
    """``n`` bytes in binary units (``"4 MiB"``)."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


# ---------------------------------------------------------------------------- files
def open_regular(path: str | os.PathLike[str], *, what: str = "file") -> IO[bytes]:
    """Open ``path`` for reading if it is a regular file; :class:`ConfigError` otherwise.

    Opened non-blocking so that a FIFO does not hang, then checked with ``fstat`` (no race
    between the check and the read).
    """
    where = show_path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(f"{where}: cannot read: no such {what}") from None
    except IsADirectoryError:
        raise ConfigError(f"{where}: is a directory, not a regular file") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read ({exc.strerror or type(exc).__name__})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{where}: not a regular file (the {what} must be one)")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _too_big(path: str | os.PathLike[str], what: str, limit: int, size: int | None) -> ConfigError:
    has = f"{size:,} bytes" if size is not None else "more bytes"
    return ConfigError(
        f"{show_path(path)}: the {what} has {has}, more than the {size_text(limit)} "
        f"({limit:,} bytes) allowed"
    )


def read_bounded(path: str | os.PathLike[str], max_bytes: int, *, what: str = "file") -> bytes:
    """All bytes of a regular file of at most ``max_bytes`` (checked before and while reading)."""
    with open_regular(path, what=what) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_bytes:
            raise _too_big(path, what, max_bytes, size)
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise _too_big(path, what, max_bytes, None)
    return data


def read_gzip_bounded(
    path: str | os.PathLike[str], max_bytes: int, *, max_compressed: int, what: str = "file"
) -> bytes:
    """The decompressed bytes of a gzip file, streamed: refused past ``max_bytes``."""
    with open_regular(path, what=what) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > max_compressed:
            raise _too_big(path, what, max_compressed, size)
        if fh.read(2) != b"\x1f\x8b":
            raise ConfigError(f"{show_path(path)}: not a valid gzip file (bad magic number)")
        fh.seek(0)
        try:
            with gzip.GzipFile(fileobj=fh, mode="rb") as gz:
                data = gz.read(max_bytes + 1)
        except (OSError, EOFError, ValueError) as exc:
            raise ConfigError(f"{show_path(path)}: not a valid gzip file ({exc})") from None
    if len(data) > max_bytes:
        raise ConfigError(
            f"{show_path(path)}: decompresses to more than the {size_text(max_bytes)} "
            f"({max_bytes:,} bytes) a {what} may have"
        )
    return data


def decode_utf8(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text (a BOM is dropped); :class:`ConfigError` naming the bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{where}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


# ---------------------------------------------------------------------------- YAML
class _Refused(yaml.MarkedYAMLError):
    """A document this dialect refuses (aliases, depth, huge or non-finite numbers)."""


_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|"
    r"\.(?:nan|NaN|NAN))$"
)
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")


YAML_CHECK_EVERY = 4096
"""Nodes composed between two calls of :func:`load_yaml`'s ``check``."""


class SafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader held to the dialect of :func:`load_yaml` (YAML 1.2 core schema)."""

    yaml_implicit_resolvers: dict[Any, Any] = {}
    _depth = 0
    _nodes = 0
    check: Callable[[], None] | None = None
    """Called every :data:`YAML_CHECK_EVERY` nodes (a caller's deadline); may raise."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._nodes += 1
        if self.check is not None and not self._nodes % YAML_CHECK_EVERY:
            self.check()
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(
                None,
                None,
                f"aliases (*{quote(event.anchor, 40)[1:-1]}) are not allowed",
                event.start_mark,
            )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _Refused(
                    None,
                    None,
                    f"nesting deeper than {MAX_YAML_DEPTH} levels is not allowed",
                    self.peek_event().start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_yaml_int(self, node: Any) -> int:
        value = self.construct_scalar(node)
        digits = value.lstrip("+-")
        if len(digits) > MAX_INT_DIGITS:
            raise _Refused(
                None,
                None,
                f"an integer of {len(digits):,} digits (at most {MAX_INT_DIGITS} allowed)",
                node.start_mark,
            )
        if digits.startswith("0o"):
            return int(value.replace("0o", "", 1), 8)
        if digits.startswith("0x"):
            return int(value.replace("0x", "", 1), 16)
        return int(value, 10)

    def construct_yaml_float(self, node: Any) -> float:
        value = self.construct_scalar(node)
        if "inf" in value.lower() or "nan" in value.lower():
            raise _Refused(
                None, None, f"{value} is not a finite number (not allowed)", node.start_mark
            )
        if len(value) > MAX_INT_DIGITS + 20:
            raise _Refused(None, None, f"a number of {len(value):,} characters", node.start_mark)
        result = float(value)
        if result in (float("inf"), float("-inf")):
            raise _Refused(None, None, f"{value[:40]} is not a finite number", node.start_mark)
        return result


for _tag, _rx, _first in (
    ("tag:yaml.org,2002:bool", _BOOL, list("tTfF")),
    ("tag:yaml.org,2002:int", _INT, list("-+0123456789")),
    ("tag:yaml.org,2002:float", _FLOAT, list("-+.0123456789")),
    ("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""]),
):
    SafeLoader.add_implicit_resolver(_tag, _rx, _first)
SafeLoader.add_constructor("tag:yaml.org,2002:int", SafeLoader.construct_yaml_int)
SafeLoader.add_constructor("tag:yaml.org,2002:float", SafeLoader.construct_yaml_float)


def load_yaml(text: str, *, where: str, check: Callable[[], None] | None = None) -> Any:
    """Parse one YAML document in the project's dialect (see the module docstring).

    ``check``, when given, is called every :data:`YAML_CHECK_EVERY` nodes (a deadline: what
    it raises ends the parse).

    Raises
    ------
    ConfigError
        ``WHERE:LINE:COLUMN: invalid YAML (problem)``, one line.
    """
    loader = None
    try:
        loader = SafeLoader(text)  # the reader refuses control characters here already
        loader.check = check
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark is not None else where
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(f"{at}: invalid YAML ({one_line(problem, 300)})") from None
    except RecursionError:
        raise ConfigError(f"{where}: invalid YAML (nested too deeply)") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml_file(
    path: str | os.PathLike[str],
    *,
    what: str = "YAML file",
    max_bytes: int = MAX_CONFIG_BYTES,
    check: Callable[[], None] | None = None,
) -> Any:
    """Read (bounded, regular file, UTF-8) and parse a YAML file; see :func:`load_yaml`."""
    where = show_path(path)
    text = decode_utf8(read_bounded(path, max_bytes, what=what), where)
    return load_yaml(text, where=where, check=check)


__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_ECHO",
    "MAX_KEY_BYTES",
    "MAX_MESSAGE",
    "MAX_YAML_DEPTH",
    "SafeLoader",
    "decode_utf8",
    "load_yaml",
    "load_yaml_file",
    "one_line",
    "open_regular",
    "quote",
    "read_bounded",
    "read_gzip_bounded",
    "show_path",
    "size_text",
]
