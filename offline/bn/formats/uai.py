"""UAI inference-competition files of Bayesian networks (``BAYES``), with their own size bounds."""

from __future__ import annotations

import gzip
import math
from pathlib import Path
from typing import Any

import numpy as np

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn.formats.common import NetworkFormat, finish
from boxwatch.offline.bn.network import Network

UAI_MAX_BYTES = 256 << 20
UAI_MAX_VARIABLES = 100_000


def read_uai(path: str | Path, *, max_bytes: int = UAI_MAX_BYTES) -> Network:
    """Read a UAI ``BAYES`` file (``.uai``, or gzipped ``.uai.gz``) with bounded reading.

    At most ``max_bytes`` are read, after decompression for ``.gz`` (streamed, so a small
    file that inflates past the bound is refused before it fills memory).
    """
    path = Path(path)
    try:
        opener: Any = gzip.open if path.name.lower().endswith(".gz") else open
        with opener(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except (OSError, EOFError) as exc:
        raise ConfigError(f"{path}: not a valid gzip file ({exc})") from None
    if len(raw) > max_bytes:
        raise ConfigError(
            f"{path}: more than {max_bytes:,} bytes (decompressed); not read as a UAI network"
        )
    return parse_uai(raw.decode("latin-1"), where=str(path), name=path.name.split(".")[0])


def parse_uai(text: str, *, where: str = "<uai>", name: str = "network") -> Network:
    """Parse UAI inference-competition text of a Bayesian network (``BAYES`` preamble).

    Variable ``i`` is named ``var_<i>`` with states ``"0"``, ``"1"``, ...; each function's
    scope lists the parents and then the child, whose table has the child's states fastest
    (the same layout as :class:`Network`'s CPTs). Every table must belong to a distinct
    child, have the declared number of entries and rows that sum to 1.
    """
    toks: list[str] = []
    tok_lines: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        for tok in line.split():
            toks.append(tok)
            tok_lines.append(number)
    pos = 0
    last_line = len(text.splitlines()) or 1

    def line_of(i: int) -> int:
        return tok_lines[i] if i < len(toks) else last_line

    def error(problem: str, i: int | None = None) -> ConfigError:
        return ConfigError(f"{where}:{line_of(pos if i is None else i)}: {problem}")

    def integer(what: str, low: int, high: int) -> int:
        nonlocal pos
        if pos >= len(toks):
            raise error(f"unexpected end of file, expected {what}")
        tok = toks[pos]
        if not tok.isdigit() or not low <= int(tok) <= high:
            raise error(f"expected {what} (an integer in {low}..{high:,}), found {tok!r}")
        pos += 1
        return int(tok)

    if not toks:
        raise ConfigError(f"{where}:1: empty file, expected 'BAYES'")
    if toks[0].upper() != "BAYES":
        raise error(f"expected 'BAYES' (a Bayesian network), found {toks[0]!r}")
    pos = 1
    n = integer("the number of variables", 1, UAI_MAX_VARIABLES)
    cards = [integer(f"the number of states of variable {i}", 1, len(toks)) for i in range(n)]
    names = [f"var_{i}" for i in range(n)]
    n_fn = integer("the number of functions", 0, len(toks))
    if n_fn != n:
        raise error(f"{n_fn} functions for {n} variables; a BAYES file has one CPT each", pos - 1)
    scopes: list[tuple[int, list[int]]] = []
    for f in range(n_fn):
        start = pos
        size = integer(f"the scope size of function {f}", 1, n)
        scope = [integer(f"a variable index in the scope of function {f}", 0, n - 1)]
        scope += [
            integer(f"a variable index in the scope of function {f}", 0, n - 1)
            for _ in range(size - 1)
        ]
        if len(set(scope)) != len(scope):
            raise error(f"function {f} names a variable twice: {scope}", start)
        scopes.append((start, scope))
    child_of: dict[int, int] = {}
    for f, (start, scope) in enumerate(scopes):
        if scope[-1] in child_of:
            raise error(
                f"functions {child_of[scope[-1]]} and {f} are both CPTs of var_{scope[-1]}",
                start,
            )
        child_of[scope[-1]] = f
    states = {v: tuple(str(j) for j in range(c)) for v, c in zip(names, cards, strict=True)}
    parents: dict[str, tuple[str, ...]] = {}
    cpts: dict[str, np.ndarray] = {}
    lines: dict[str, int] = {}
    for f, (_, scope) in enumerate(scopes):
        var = names[scope[-1]]
        shape = tuple(cards[i] for i in scope)
        expected = math.prod(shape)  # Python ints: no overflow before the check
        start = pos
        count = integer(f"the number of entries of function {f} ({var})", 0, len(toks))
        if count != expected:
            raise error(
                f"table of function {f} ({var}) declares {count} entries, expected {expected} "
                f"for shape {shape}",
                start,
            )
        if pos + count > len(toks):
            raise error(
                f"table of function {f} ({var}) has {len(toks) - pos} of its {count} entries "
                "before the end of the file",
                start,
            )
        try:
            values = np.array(toks[pos : pos + count], dtype=np.float64)
        except ValueError:
            bad = next(t for t in toks[pos : pos + count] if not _is_float(t))
            raise error(
                f"table of function {f} ({var}): {bad!r} is not a number",
                pos + toks[pos : pos + count].index(bad),
            ) from None
        pos += count
        parents[var] = tuple(names[i] for i in scope[:-1])
        cpts[var] = values.reshape(shape)
        lines[var] = line_of(start)
    if pos < len(toks):
        raise error(f"unexpected {toks[pos]!r} after the last table")
    return finish(name, tuple(names), states, parents, cpts, where, lines)


def _is_float(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


def _read(path: Path, _max_memory: float | None) -> Network:
    """:func:`read_uai` with its own bounds (:data:`UAI_MAX_BYTES`), whatever ``max_memory``."""
    return read_uai(path)


FORMAT = NetworkFormat("UAI", (".uai", ".uai.gz"), _read)
