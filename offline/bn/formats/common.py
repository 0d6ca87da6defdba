"""What the network readers share: the record a format module declares, the bounded reading
of a text file, memory bounds, the tokenizer of BIF and Hugin text, and the final checks
(completeness, CPT sums, acyclicity) that make a :class:`Network`."""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import (
    quote,
    read_bounded,
    read_gzip_bounded,
    show_path,
    size_text,
)
from boxwatch.offline.bn.limits import Deadline, default_max_memory
from boxwatch.offline.bn.network import Network

CPT_SUM_TOLERANCE = 1e-3
MAX_PARENTS = 63
"""Parents a CPT may have: numpy arrays have at most 64 axes (parents + the variable's own)."""
TEXT_SHARE = 64
"""A network file may have ``max_memory / TEXT_SHARE`` bytes of text: its tokens, positions
and numbers take tens of bytes per byte of text while it is parsed."""
CPT_SHARE = 4
"""All CPTs together may take ``max_memory / CPT_SHARE`` bytes (the compiler needs the rest)."""
CHECK_TOKENS = 1 << 16
"""Tokens made or consumed between two deadline checks."""
CPT_FLOOR = 16 << 20
"""...but at least this much: small tables are never what exhausts memory (a tiny
``--max-memory`` is then refused by the compiler's route estimates, naming them)."""


@dataclass(frozen=True)
class NetworkFormat:
    """One network file format, declared by its module as ``FORMAT``: a row of
    :data:`boxwatch.offline.bn.formats.FORMATS`."""

    name: str
    """What help texts and errors call it (``BIF``, ``Hugin``)."""
    suffixes: tuple[str, ...]
    """The lower-case file-name endings it is read from, ``.gz`` variants included."""
    read: Callable[[Path, float | None, Deadline | None], Network]
    """Reads a file of the format: ``read(path, max_memory, deadline)`` (the deadline, when
    given, checked while it reads)."""
    write: Callable[[Network], str]
    """The file's text for a network, each number as written (``read`` gives it back)."""


class TextParser(Protocol):
    """A parser of a text format: ``parse(text, where=..., max_memory=..., deadline=...)``."""

    def __call__(
        self, text: str, *, where: str, max_memory: float | None, deadline: Deadline | None
    ) -> Network: ...


def read_network_text(
    path: Path, parse: TextParser, max_memory: float | None, deadline: Deadline | None = None
) -> Network:
    """Read a text network file (gzipped when its name ends in ``.gz``) and ``parse`` it.

    Bounded before it allocates: the file (and a ``.gz`` file's decompressed stream) may
    have ``max_memory / TEXT_SHARE`` bytes. Text is UTF-8 (latin-1 is accepted for old Hugin
    files); NUL bytes are refused. ``deadline`` is checked while it is parsed.
    """
    where = show_path(path)
    limit = default_max_memory() if max_memory is None else int(max_memory)
    cap = max(1 << 20, limit // TEXT_SHARE)
    if path.name.lower().endswith(".gz"):
        raw = read_gzip_bounded(path, cap, max_compressed=cap, what="file")
    else:
        raw = read_bounded(path, cap, what="file")
    if b"\0" in raw:
        raise ConfigError(
            f"{where}: holds NUL bytes: not a network text file (UTF-16? save it as UTF-8)"
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    del raw
    if deadline is not None:
        deadline.check("the file was read, not yet parsed")
    return parse(text, where=where, max_memory=limit, deadline=deadline)


class Budget:
    """What the CPTs of one network may still allocate; checked from shapes, before allocating."""

    def __init__(self, max_memory: float | None):
        limit = default_max_memory() if max_memory is None else int(max_memory)
        self.limit = limit
        self.bytes_left = max(CPT_FLOOR, limit // CPT_SHARE)

    def shape(
        self,
        var: str,
        par: Sequence[str],
        states: Mapping[str, Sequence[str]],
        where_line: str,
    ) -> tuple[int, ...]:
        """The CPT shape of ``var`` given ``par``, refused when it cannot be held.

        Sizes are Python integers (no ``np.prod`` wrap-around); refuses more than
        :data:`MAX_PARENTS` parents, a parent listed twice, and tables whose bytes exceed
        what is left of the budget.
        """
        if len(par) > MAX_PARENTS:
            raise ConfigError(
                f"{where_line}: {quote(var)} has {len(par)} parents; at most {MAX_PARENTS} "
                "are supported"
            )
        seen: set[str] = set()
        for p in par:
            if p in seen:
                raise ConfigError(f"{where_line}: {quote(var)} lists parent {quote(p)} twice")
            seen.add(p)
        if var in seen:
            raise ConfigError(f"{where_line}: {quote(var)} lists itself as a parent")
        shape = (*(len(states[p]) for p in par), len(states[var]))
        cells = math.prod(shape)
        self.take(8 * cells, f"the CPT of {quote(var)} has {cells:,} cells", where_line)
        return shape

    def take(self, nbytes: int, what: str, where_line: str) -> None:
        """Charge ``nbytes`` (``what`` says of what, for the error) to the budget, or refuse."""
        if nbytes > self.bytes_left:
            raise ConfigError(
                f"{where_line}: {what} ({size_text(nbytes)}), more than the memory limit "
                f"{size_text(self.limit)} leaves for the network's tables "
                f"({size_text(self.bytes_left)}); raise --max-memory or give a smaller network"
            )
        self.bytes_left -= nbytes


# ---------------------------------------------------------------------------- tokenising
_TOKEN_BODY = r'"(?:[^"\\]|\\.)*"|[{}()\[\];,|=]|[^\s{}()\[\];,|="]+'
_BIF_TOKEN_RE = re.compile(r"\s+|//[^\n]*|" + _TOKEN_BODY, re.DOTALL)
_PERCENT_TOKEN_RE = re.compile(r"\s+|%[^\n]*|" + _TOKEN_BODY, re.DOTALL)


class Tokens:
    """A token stream that knows each token's line, for error messages.

    Linear in the text: every regular expression matches without backtracking over the rest
    of the file, and a ``/* ... */`` comment is found with one ``str.find`` (an unterminated
    one is an error, not a rescan per ``/*``). ``deadline`` is checked every
    :data:`CHECK_TOKENS` tokens, as they are made and as they are consumed.
    """

    def __init__(
        self,
        text: str,
        where: str,
        *,
        percent_comments: bool,
        deadline: Deadline | None = None,
    ):
        self.where = where
        self.deadline = deadline
        self.text = text
        self.toks: list[str] = []
        self.pos: list[int] = []
        newlines = [m.start() for m in re.finditer("\n", text)]
        token_re = _PERCENT_TOKEN_RE if percent_comments else _BIF_TOKEN_RE
        skip = ("%",) if percent_comments else ("//", "/*")
        i = 0
        while i < len(text):
            if not percent_comments and text.startswith("/*", i):
                end = text.find("*/", i + 2)
                if end < 0:
                    raise ConfigError(
                        f"{where}:{bisect.bisect(newlines, i) + 1}: unterminated /* comment"
                    )
                i = end + 2
                continue
            m = token_re.match(text, i)
            if m is None:
                raise ConfigError(
                    f"{where}:{bisect.bisect(newlines, i) + 1}: unterminated quoted string"
                )
            tok = m.group()
            if not (tok.isspace() or tok.startswith(skip)):
                self.toks.append(tok)
                self.pos.append(i)
                if deadline is not None and not len(self.toks) % CHECK_TOKENS:
                    deadline.check(f"tokenizing line {bisect.bisect(newlines, i) + 1:,}")
            i = m.end()
        self.lines = [bisect.bisect(newlines, p) + 1 for p in self.pos]
        self.i = 0
        self.eof_line = len(newlines) + 1
        self.numbers: list[str] = []
        """Every number consumed, as written (the CPTs' exact values)."""

    def line(self) -> int:
        """Line of the next token (the last line at end of file)."""
        return self.lines[self.i] if self.i < len(self.toks) else self.eof_line

    def error(self, problem: str, line: int | None = None) -> ConfigError:
        """A ConfigError naming the file and line."""
        return ConfigError(f"{self.where}:{line or self.line()}: {problem}")

    def peek(self) -> str | None:
        """The next token without consuming it (None at end of file)."""
        return self.toks[self.i] if self.i < len(self.toks) else None

    def next(self, what: str = "a token") -> str:
        """Consume the next token; ``what`` names the expectation for the error."""
        if self.i >= len(self.toks):
            raise self.error(f"unexpected end of file, expected {what}")
        tok = self.toks[self.i]
        self.i += 1
        if self.deadline is not None and not self.i % CHECK_TOKENS:
            self.deadline.check(f"parsing line {self.lines[self.i - 1]:,}")
        return tok

    def expect(self, tok: str) -> None:
        """Consume ``tok`` or fail naming what was found."""
        got = self.next(repr(tok))
        if got != tok:
            self.i -= 1
            raise self.error(f"expected {tok!r}, found {quote(got)}")

    def name(self, what: str) -> str:
        """Consume a name (quotes removed)."""
        tok = self.next(what)
        if tok in "{}()[];,|=":
            self.i -= 1
            raise self.error(f"expected {what}, found {quote(tok)}")
        return tok[1:-1] if tok.startswith('"') else tok

    def number(self) -> float:
        """Consume a floating-point number; its text goes to :attr:`numbers`."""
        tok = self.next("a number")
        try:
            value = float(tok)
            self.numbers.append(tok)
            return value
        except ValueError:
            self.i -= 1
            raise self.error(f"expected a number, found {quote(tok)}") from None

    def skip_block(self) -> None:
        """Skip a balanced ``{ ... }`` block (the opening brace is next)."""
        self.expect("{")
        depth = 1
        while depth:
            tok = self.next("'}'")
            depth += tok == "{"
            depth -= tok == "}"

    def skip_statement(self) -> None:
        """Skip tokens up to and including the next ``;``."""
        while self.next("';'") != ";":
            pass


# ---------------------------------------------------------------------------- checks
def finish(
    name: str,
    order: tuple[str, ...],
    states: Mapping[str, tuple[str, ...]],
    parents: Mapping[str, tuple[str, ...]],
    cpts: Mapping[str, np.ndarray],
    where: str,
    lines: Mapping[str, int],
    texts: Mapping[str, np.ndarray] | None = None,
) -> Network:
    """Check completeness, CPT sums and acyclicity; every problem names a line.

    ``texts`` (the numbers as written) are kept as they are: the sum check is a validation,
    the numbers are never renormalised.
    """

    def at(var: str) -> str:
        return f"{where}:{lines[var]}" if var in lines else where

    problems = []
    if not order:
        problems.append(f"{where}: the network declares no variables")
    for var in order:
        if var not in cpts:
            problems.append(f"{at(var)}: variable {var!r} has no probability table")
            continue
        table = cpts[var]
        if not np.isfinite(table).all() or (table < 0).any():
            problems.append(f"{at(var)}: probabilities of {var!r} must be finite and >= 0")
            continue
        sums = table.sum(axis=-1)
        worst = float(np.abs(sums - 1.0).max())
        if worst > CPT_SUM_TOLERANCE:
            problems.append(
                f"{at(var)}: probabilities of {var!r} sum to "
                f"{float(sums.reshape(-1)[np.abs(sums - 1).argmax()]):.6g}, not 1"
            )
    if problems:
        raise ConfigError(problems)
    cycle = _find_cycle(order, parents)
    if cycle:
        raise ConfigError(f"{at(cycle[0])}: the network has a cycle: {' -> '.join(cycle)}")
    return Network(
        name=name,
        variables=tuple(order),
        states={v: tuple(states[v]) for v in order},
        parents={v: tuple(parents[v]) for v in order},
        cpts={v: np.asarray(cpts[v], dtype=np.float64) for v in order},
        source=where,
        texts=dict(texts) if texts is not None else None,
    )


def _find_cycle(order: Sequence[str], parents: Mapping[str, Sequence[str]]) -> list[str]:
    """A directed cycle as a list of variables, or [] when the graph is acyclic."""
    color: dict[str, int] = {}
    for start in order:
        if start in color:
            continue
        stack = [(start, iter(parents[start]))]
        path = [start]
        color[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                color[node] = 2
                stack.pop()
                path.pop()
            elif color.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt][::-1]
            elif nxt not in color:
                color[nxt] = 1
                stack.append((nxt, iter(parents[nxt])))
                path.append(nxt)
    return []
