"""UAI inference-competition files of Bayesian networks (``BAYES``), read as one stream.

The reader never holds the file: it decompresses and tokenizes it a chunk at a time
(:data:`CHUNK_BYTES`), keeps no token beyond its chunk, and finds a token's line only when
one is needed (a function's first line, an error). Its memory is the network's (the CPTs,
sized from their declarations against ``max_memory`` before they exist) plus a chunk, not the
file's; the file may have ``max_memory / TEXT_SHARE`` bytes (decompressed), like the other
formats. Numbers are ASCII only: an integer is ASCII digits (no superscripts, no other
scripts, at most :data:`MAX_INT_DIGITS`), a table entry what ``float`` reads from ASCII.
"""

from __future__ import annotations

import gzip
import math
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

import numpy as np

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import open_regular, quote, show_path, size_text
from boxwatch.offline.bn.formats.common import (
    MAX_PARENTS,
    TEXT_SHARE,
    Budget,
    NetworkFormat,
    finish,
)
from boxwatch.offline.bn.formats.writing import cpt_texts
from boxwatch.offline.bn.limits import Deadline, default_max_memory
from boxwatch.offline.bn.network import Network

UAI_MAX_VARIABLES = 100_000
CHUNK_BYTES = 1 << 20
"""Bytes decompressed and tokenized at a time."""
MAX_TOKEN_BYTES = 1024
"""Longest token (a number far longer is not one: the stream is refused there)."""
MAX_INT_DIGITS = 18
"""Digits of an integer (counts, indices); more is out of every range the format has."""
STATE_BYTES = 64
"""What one state's name costs (``"17"`` and its slot in the variable's tuple): charged
with the CPTs against the memory limit, since a few digits can declare millions of states."""
_SPACE = b" \t\n\r\x0b\x0c"
"""What ``bytes.split()`` splits on (ASCII whitespace)."""
_IS_SPACE = np.zeros(256, dtype=bool)
_IS_SPACE[list(_SPACE)] = True


def read_uai(
    path: str | Path,
    *,
    max_bytes: int | None = None,
    max_memory: float | None = None,
    deadline: Deadline | None = None,
) -> Network:
    """Read a UAI ``BAYES`` file (``.uai``, or gzipped ``.uai.gz``) as a stream.

    At most ``max_bytes`` are read (default ``max_memory / TEXT_SHARE``, at least 1 MiB),
    after decompression for ``.gz``: a small file that inflates past the bound is refused
    when the bound is reached, holding one chunk, not the file.
    """
    path = Path(path)
    where = show_path(path)
    limit = default_max_memory() if max_memory is None else int(max_memory)
    cap = max(1 << 20, limit // TEXT_SHARE) if max_bytes is None else max_bytes
    packed = path.name.lower().endswith(".gz")
    with open_regular(path, what="file") as fh:
        size = fh.seek(0, 2)
        fh.seek(0)
        if size > cap:
            raise _too_big(where, cap, packed, limit)
        if packed and fh.read(2) != b"\x1f\x8b":
            raise ConfigError(f"{where}: not a valid gzip file (bad magic number)")
        fh.seek(0)
        source: IO[bytes] | gzip.GzipFile = gzip.GzipFile(fileobj=fh, mode="rb") if packed else fh
        with source:
            return parse_uai_chunks(
                _bounded_chunks(source, cap, where, packed, limit),
                where=where,
                name=path.name.split(".")[0],
                max_memory=limit,
                deadline=deadline,
            )


def _too_big(where: str, cap: int, packed: bool, limit: int) -> ConfigError:
    inflated = " (decompressed)" if packed else ""
    return ConfigError(
        f"{where}: more than {cap:,} bytes{inflated}; not read as a UAI network (a network "
        f"file may have {size_text(cap)}: 1/{TEXT_SHARE} of the memory limit "
        f"{size_text(limit)}; raise --max-memory)"
    )


def _bounded_chunks(
    source: IO[bytes] | gzip.GzipFile, cap: int, where: str, packed: bool, limit: int
) -> Iterator[bytes]:
    """Chunks of ``source`` (a binary file) until its end; refused past ``cap`` bytes."""
    total = 0
    while True:
        try:
            data = source.read(CHUNK_BYTES)
        except (OSError, EOFError, ValueError, zlib.error) as exc:
            raise ConfigError(f"{where}: not a valid gzip file ({exc})") from None
        if not data:
            return
        total += len(data)
        if total > cap:
            raise _too_big(where, cap, packed, limit)
        yield data


def parse_uai(
    text: str,
    *,
    where: str = "<uai>",
    name: str = "network",
    max_memory: float | None = None,
    deadline: Deadline | None = None,
) -> Network:
    """Parse UAI inference-competition text of a Bayesian network (``BAYES`` preamble).

    Variable ``i`` is named ``var_<i>`` with states ``"0"``, ``"1"``, ...; each function's
    scope lists the parents and then the child, whose table has the child's states fastest
    (the same layout as :class:`Network`'s CPTs). Every table must belong to a distinct
    child, have the declared number of entries and rows that sum to 1.
    """
    data = text.encode("utf-8", "surrogatepass")
    chunks = (data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES))
    return parse_uai_chunks(
        chunks, where=where, name=name, max_memory=max_memory, deadline=deadline
    )


def parse_uai_chunks(
    chunks: Iterable[bytes],
    *,
    where: str,
    name: str,
    max_memory: float | None = None,
    deadline: Deadline | None = None,
) -> Network:
    """:func:`parse_uai` of a stream of byte chunks, cut anywhere (one pass, one chunk held).

    Declared sizes are checked before anything of that size exists: a CPT's cells and its
    variable's state names against ``max_memory`` (:class:`~.common.Budget`), a scope
    against numpy's 64 axes.
    """
    t = _Stream(iter(chunks), where, deadline)
    budget = Budget(max_memory)
    if not t.more():
        raise ConfigError(f"{where}:1: empty file, expected 'BAYES'")
    if t.peek().upper() != b"BAYES":
        raise t.error(f"expected 'BAYES' (a Bayesian network), found {_shown(t.peek())}")
    t.take()
    n = t.integer("the number of variables", 1, UAI_MAX_VARIABLES)
    most = 10**MAX_INT_DIGITS - 1
    cards = [t.integer(f"the number of states of variable {i}", 1, most) for i in range(n)]
    names = [f"var_{i}" for i in range(n)]
    fn_line = t.line()
    n_fn = t.integer("the number of functions", 0, UAI_MAX_VARIABLES)
    if n_fn != n:
        raise t.error(f"{n_fn} functions for {n} variables; a BAYES file has one CPT each", fn_line)
    scopes: list[tuple[int, list[int]]] = []
    for f in range(n_fn):
        start = t.line()
        size = t.integer(f"the scope size of function {f}", 1, n)
        scope = [
            t.integer(f"a variable index in the scope of function {f}", 0, n - 1)
            for _ in range(size)
        ]
        if len(set(scope)) != len(scope):
            raise t.error(f"function {f} names a variable twice: {_scope_text(scope)}", start)
        if size > MAX_PARENTS + 1:
            raise t.error(
                f"function {f} ({names[scope[-1]]}) has a scope of {size} variables; at most "
                f"{MAX_PARENTS + 1} ({MAX_PARENTS} parents and the variable) are supported",
                start,
            )
        scopes.append((start, scope))
    child_of: dict[int, int] = {}
    for f, (start, scope) in enumerate(scopes):
        if scope[-1] in child_of:
            raise t.error(
                f"functions {child_of[scope[-1]]} and {f} are both CPTs of var_{scope[-1]}",
                start,
            )
        child_of[scope[-1]] = f
    shapes = []
    for start, scope in scopes:
        var = names[scope[-1]]
        shape = tuple(cards[i] for i in scope)
        cells = math.prod(shape)  # Python ints: no overflow before the check
        budget.take(
            8 * cells + STATE_BYTES * shape[-1],
            f"the CPT of {quote(var)} has {cells:,} cells and {shape[-1]:,} states",
            f"{where}:{start}",
        )
        shapes.append(shape)
    parents: dict[str, tuple[str, ...]] = {}
    cpts: dict[str, np.ndarray] = {}
    lines: dict[str, int] = {}
    for f, ((_, scope), shape) in enumerate(zip(scopes, shapes, strict=True)):
        var = names[scope[-1]]
        expected = math.prod(shape)
        start = t.line()
        count = t.integer(f"the number of entries of function {f} ({var})", 0, most)
        if count != expected:
            raise t.error(
                f"table of function {f} ({var}) declares {count} entries, expected {expected} "
                f"for shape {shape}",
                start,
            )
        values = t.numbers(count, f"table of function {f} ({var})", start)
        parents[var] = tuple(names[i] for i in scope[:-1])
        cpts[var] = values.reshape(shape)
        lines[var] = start
    if t.more():
        raise t.error(f"unexpected {_shown(t.peek())} after the last table")
    # named last: a file that declares millions of states but lacks their numbers is
    # refused before their names exist
    states = {v: tuple(str(j) for j in range(c)) for v, c in zip(names, cards, strict=True)}
    return finish(name, tuple(names), states, parents, cpts, where, lines)


def _shown(tok: bytes) -> str:
    """A token for a message: quoted, escaped, cut (read as UTF-8, else latin-1, as the
    text readers do)."""
    try:
        return quote(tok.decode("utf-8"))
    except UnicodeDecodeError:
        return quote(tok.decode("latin-1"))


def _scope_text(scope: list[int]) -> str:
    shown = ", ".join(map(str, scope[:20]))
    return f"[{shown}{', ...' if len(scope) > 20 else ''}]"


class _Stream:
    """The tokens of a stream of byte chunks, one chunk held at a time.

    Each chunk is cut after its last whitespace byte (the partial token goes with the next
    one) and split; its tokens' lines are computed with numpy, once per chunk and only when
    a line is asked for.
    """

    def __init__(self, chunks: Iterator[bytes], where: str, deadline: Deadline | None):
        self.chunks = chunks
        self.where = where
        self.deadline = deadline or Deadline(None, where)
        self.toks: list[bytes] = []
        self.i = 0
        self.buf = b""
        self.buf_line = 1
        self.tok_lines: np.ndarray | None = None
        self.carry = b""
        self.next_line = 1
        self.last_byte = b""

    # -------------------------------------------------------------------- chunks
    def more(self) -> bool:
        """Whether a token is left (loading chunks until one holds a token)."""
        while self.i >= len(self.toks):
            if not self._load():
                return False
        return True

    def _load(self) -> bool:
        """Load the next chunk's whole tokens; False at the end of the stream."""
        data = next(self.chunks, None)
        if data is None:
            if not self.carry:
                return False
            buf, self.carry = self.carry, b""
        else:
            data = self.carry + data
            cut = max(data.rfind(c) for c in _SPACE)
            if cut < 0 and len(data) > MAX_TOKEN_BYTES:
                raise self.error(
                    f"a token of more than {MAX_TOKEN_BYTES:,} bytes: not a UAI network",
                    self.next_line,
                )
            buf, self.carry = data[: cut + 1], data[cut + 1 :]
            if len(self.carry) > MAX_TOKEN_BYTES:
                raise self.error(
                    f"a token of more than {MAX_TOKEN_BYTES:,} bytes: not a UAI network",
                    self.next_line + buf.count(b"\n"),
                )
            self.last_byte = data[-1:]
        self.deadline.check(f"reading line {self.next_line:,}")
        self.buf, self.buf_line = buf, self.next_line
        self.next_line += buf.count(b"\n")
        self.toks, self.i, self.tok_lines = buf.split(), 0, None
        return True

    def _line_of(self, i: int) -> int:
        """Line of token ``i`` of the current chunk."""
        if self.tok_lines is None:
            a = np.frombuffer(self.buf, dtype=np.uint8)
            space = _IS_SPACE[a]
            starts = np.flatnonzero(~space & np.concatenate(([True], space[:-1])))
            self.tok_lines = self.buf_line + np.searchsorted(np.flatnonzero(a == 10), starts)
        return int(self.tok_lines[i])

    # -------------------------------------------------------------------- tokens
    def line(self) -> int:
        """Line of the next token (the file's last line at its end)."""
        if self.more():
            return self._line_of(self.i)
        return max(1, self.next_line - (self.last_byte == b"\n"))

    def error(self, problem: str, line: int | None = None) -> ConfigError:
        """A ConfigError naming the file and the line (default: the next token's)."""
        return ConfigError(f"{self.where}:{self.line() if line is None else line}: {problem}")

    def peek(self) -> bytes:
        """The next token (there is one: :meth:`more` said so)."""
        return self.toks[self.i]

    def take(self) -> bytes:
        """Consume the next token (there is one: :meth:`more` said so)."""
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def integer(self, what: str, low: int, high: int) -> int:
        """Consume an integer in ``low..high``: ASCII digits only."""
        if not self.more():
            raise self.error(f"unexpected end of file, expected {what}")
        tok = self.toks[self.i]
        if not (tok.isdigit() and len(tok) <= MAX_INT_DIGITS and low <= int(tok) <= high):
            within = f"in {low}..{high:,}" if high < 10**MAX_INT_DIGITS - 1 else f">= {low}"
            raise self.error(f"expected {what} (an integer {within}), found {_shown(tok)}")
        self.i += 1
        return int(tok)

    def numbers(self, count: int, what: str, start: int) -> np.ndarray:
        """Consume ``count`` table entries into a float array (filled a chunk at a time)."""
        out = np.empty(count, dtype=np.float64)
        done = 0
        while done < count:
            if not self.more():
                raise self.error(
                    f"{what} has {done} of its {count} entries before the end of the file", start
                )
            part = self.toks[self.i : self.i + count - done]
            try:
                out[done : done + len(part)] = np.array(part, dtype=np.float64)
            except ValueError:
                bad = next(j for j, tok in enumerate(part) if not _is_float(tok))
                raise self.error(
                    f"{what}: {_shown(part[bad])} is not a number", self._line_of(self.i + bad)
                ) from None
            self.i += len(part)
            done += len(part)
        return out


def _is_float(tok: bytes) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def _read(path: Path, max_memory: float | None, deadline: Deadline | None = None) -> Network:
    """:func:`read_uai` bounded by ``max_memory`` (its text and its tables)."""
    return read_uai(path, max_memory=max_memory, deadline=deadline)


def write_uai(network: Network) -> str:
    """UAI ``BAYES`` text of ``network`` that :func:`parse_uai` reads back exactly: one CPT per
    variable (scope: the parents, then the variable), each number as written.

    UAI files hold no names: the network's must be the ones :func:`parse_uai` gives
    (``var_<i>`` in file order, states ``"0"``, ``"1"``, ...); others are refused.
    """
    wrong = [
        v
        for i, v in enumerate(network.variables)
        if v != f"var_{i}" or network.states[v] != tuple(map(str, range(network.card(v))))
    ]
    if wrong:
        shown = ", ".join(wrong[:20]) + (f" and {len(wrong) - 20} more" if len(wrong) > 20 else "")
        raise ConfigError(
            f"names that UAI cannot hold: {shown} (UAI names variable i var_<i>, its states "
            "0, 1, ...)"
        )
    index = {v: i for i, v in enumerate(network.variables)}
    n = len(network.variables)
    out = ["BAYES", str(n), " ".join(str(network.card(v)) for v in network.variables), str(n)]
    for v in network.variables:
        scope = [*(index[p] for p in network.parents[v]), index[v]]
        out.append(" ".join(map(str, [len(scope), *scope])))
    for v in network.variables:
        table = cpt_texts(network, v)
        out += ["", str(table.size)]
        out += [" ".join(row) for row in table.reshape(-1, table.shape[-1]).tolist()]
    return "\n".join(out) + "\n"


FORMAT = NetworkFormat("UAI", (".uai", ".uai.gz"), _read, write_uai)
