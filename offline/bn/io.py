"""Read discrete Bayesian networks (BIF, .bif.gz, XMLBIF, Hugin .net, UAI, pgmpy) into one form.

Own small parsers rather than pgmpy's readers: they are fast (parse time is reported apart
from compile time) and every error names the file, the line and the problem. A parsed
network is a :class:`Network`: variables in file order, state names, parents and CPTs as
numpy arrays of shape ``(*parent_cards, card)`` (``P(var | parents)`` on the last axis).

Numbers as written: beside each float table a reader keeps the CPT's numbers as the decimal
strings of the file (:attr:`Network.texts`, one object array per CPT, references to the
tokens the tokenizer made anyway); :meth:`Network.exact_cpt` turns them into the exact
rationals they denote, lazily, when the compiler has to decide an input exactly
(:mod:`boxwatch.offline.bn.exact`). The numbers are used as written and never renormalised:
:data:`CPT_SUM_TOLERANCE` is a validation check on the rows' sums, nothing more. A reader of
another format keeps its value tokens the same way: the strings in file order,
:func:`text_table` to shape them, ``texts=`` to :class:`Network`.
"""

from __future__ import annotations

import bisect
import gzip
import math
import re
import xml.parsers.expat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import (
    one_line,
    quote,
    read_bounded,
    read_gzip_bounded,
    show_path,
    size_text,
)
from boxwatch.offline.bn.limits import default_max_memory

CPT_SUM_TOLERANCE = 1e-3
MAX_PARENTS = 63
"""Parents a CPT may have: numpy arrays have at most 64 axes (parents + the variable's own)."""
TEXT_SHARE = 64
"""A network file may have ``max_memory / TEXT_SHARE`` bytes of text: its tokens, positions
and numbers take tens of bytes per byte of text while it is parsed."""
CPT_SHARE = 4
"""All CPTs together may take ``max_memory / CPT_SHARE`` bytes (the compiler needs the rest)."""
CPT_FLOOR = 16 << 20
"""...but at least this much: small tables are never what exhausts memory (a tiny
``--max-memory`` is then refused by the compiler's route estimates, naming them)."""


class _Budget:
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
        nbytes = 8 * cells
        if nbytes > self.bytes_left:
            raise ConfigError(
                f"{where_line}: the CPT of {quote(var)} has {cells:,} cells "
                f"({size_text(nbytes)}), more than the memory limit "
                f"{size_text(self.limit)} leaves for the network's tables "
                f"({size_text(self.bytes_left)}); raise --max-memory or give a smaller network"
            )
        self.bytes_left -= nbytes
        return shape


def text_table(texts: Sequence[str], shape: Sequence[int]) -> np.ndarray:
    """A CPT's numbers as written (decimal strings, file order) as an object array of
    ``shape``: what a reader passes as ``texts=`` to :class:`Network`."""
    out = np.empty(len(texts), dtype=object)
    out[:] = list(texts)
    return out.reshape(tuple(shape))


def exact_value(text: str) -> Fraction:
    """The rational a number's decimal string denotes (``"0.98"`` is 49/50, not the float)."""
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return Fraction(float(text))


_PLAIN_DECIMALS = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?: (?:[0-9]+\.?[0-9]*|\.[0-9]+))*")
"""Space-separated plain decimals (no sign, no exponent)."""


@dataclass(frozen=True)
class Network:
    """A discrete Bayesian network: the only form the compiler reads.

    Attributes
    ----------
    name : str
    variables : tuple of str
        Variables in file order.
    states : dict of str to tuple of str
        State names per variable, in file order (state index j is ``states[v][j]``).
    parents : dict of str to tuple of str
    cpts : dict of str to ndarray of shape (*parent_cards, card)
        ``cpts[v][p1, ..., pk, j] = P(v = j | parents = (p1, ..., pk))``.
    source : str
        Where the network came from (a path, or ``"<pgmpy>"``).
    texts : dict of str to object ndarray, optional
        The CPT numbers as written in the file (decimal strings, same shapes as ``cpts``).
        Absent (a network built in memory, or from pgmpy) or missing for a variable: each
        float's shortest round-trip decimal (``repr``), the text :func:`write_bif` writes,
        so a network and its BIF dump define the same exact classifier.
    """

    name: str
    variables: tuple[str, ...]
    states: Mapping[str, tuple[str, ...]]
    parents: Mapping[str, tuple[str, ...]]
    cpts: Mapping[str, np.ndarray]
    source: str = "<memory>"
    texts: Mapping[str, np.ndarray] | None = field(default=None, repr=False, compare=False)
    _exact: dict[str, np.ndarray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _scaled: dict[str, tuple[np.ndarray, int]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def exact_cpt(self, var: str) -> np.ndarray:
        """``P(var | parents)`` as written: an object array of :class:`~fractions.Fraction`.

        Built on first use and kept; the numbers are not renormalised.
        """
        table = self._exact.get(var)
        if table is None:
            text = self.texts.get(var) if self.texts is not None else None
            if text is None:
                floats = self.cpts[var].reshape(-1).tolist()
                text = text_table([repr(x) for x in floats], self.cpts[var].shape)
            flat = [exact_value(t) for t in text.reshape(-1).tolist()]
            table = np.empty(len(flat), dtype=object)
            table[:] = flat
            table = table.reshape(self.cpts[var].shape)
            self._exact[var] = table
        return table

    def scaled_cpt(self, var: str) -> tuple[np.ndarray, int]:
        """:meth:`exact_cpt` times a common denominator ``D`` of its numbers: an object
        array of Python ints, and ``D`` (exact arithmetic on integers, no gcd per step).

        Plain decimal strings (``0.908257``) are read as digits over ``D = 10**k``, ``k``
        their most decimal places, without a :class:`~fractions.Fraction` each; any other
        text goes through :meth:`exact_cpt` (``D`` the least common denominator). Built on
        first use and kept.
        """
        got = self._scaled.get(var)
        if got is None:
            shape = self.cpts[var].shape
            text = self.texts.get(var) if self.texts is not None else None
            words = text.reshape(-1).tolist() if text is not None else []
            if words and _PLAIN_DECIMALS.fullmatch(" ".join(words)):
                # plain decimals (the readers parsed each as a number): digits over 10**k
                parts = [w.partition(".") for w in words]
                k = max(len(f) for _, _, f in parts)
                values = [int(a + f + "0" * (k - len(f))) for a, _, f in parts]
                scale = 10**k
            else:
                flat = self.exact_cpt(var).reshape(-1).tolist()
                scale = math.lcm(*(q.denominator for q in flat)) if flat else 1
                values = [q.numerator * (scale // q.denominator) for q in flat]
            ints = np.empty(len(values), dtype=object)
            ints[:] = values
            got = (ints.reshape(shape), scale)
            self._scaled[var] = got
        return got

    def card(self, var: str) -> int:
        """Number of states of ``var``."""
        return len(self.states[var])

    def children(self, var: str) -> tuple[str, ...]:
        """Variables that have ``var`` as a parent, in file order."""
        return tuple(v for v in self.variables if var in self.parents[v])

    def leaves(self) -> tuple[str, ...]:
        """Variables without children, in file order."""
        has_child = {p for v in self.variables for p in self.parents[v]}
        return tuple(v for v in self.variables if v not in has_child)

    def ancestors(self, nodes: Sequence[str]) -> set[str]:
        """``nodes`` and all their ancestors."""
        out: set[str] = set()
        stack = list(nodes)
        while stack:
            v = stack.pop()
            if v not in out:
                out.add(v)
                stack.extend(self.parents[v])
        return out

    def to_pgmpy(self) -> Any:
        """The same network as a pgmpy ``DiscreteBayesianNetwork`` (for exact inference)."""
        from pgmpy.factors.discrete import TabularCPD
        from pgmpy.models import DiscreteBayesianNetwork

        model = DiscreteBayesianNetwork()
        model.add_nodes_from(self.variables)
        model.add_edges_from([(p, v) for v in self.variables for p in self.parents[v]])
        for v in self.variables:
            par = list(self.parents[v])
            table = np.moveaxis(self.cpts[v], -1, 0).reshape(self.card(v), -1)
            model.add_cpds(
                TabularCPD(
                    v,
                    self.card(v),
                    table,
                    evidence=par or None,
                    evidence_card=[self.card(p) for p in par] or None,
                    state_names={u: list(self.states[u]) for u in [v, *par]},
                )
            )
        return model


def load_network(source: str | Path | Any, *, max_memory: float | None = None) -> Network:
    """Read a network from a path (format by suffix) or take a pgmpy model.

    Bounded before it allocates: the file (and a ``.gz`` file's decompressed stream) may
    have ``max_memory / TEXT_SHARE`` bytes, and every CPT is sized from its declared shape
    against ``max_memory`` before its table exists. Text is UTF-8 (latin-1 is accepted for
    old Hugin files); NUL bytes are refused.

    Parameters
    ----------
    source : path or pgmpy ``DiscreteBayesianNetwork``
        ``.bif``, ``.bif.gz``, ``.xml``/``.xmlbif`` (optionally ``.gz``), Hugin ``.net`` or
        UAI ``.uai``/``.uai.gz`` (read with its own size bounds: :func:`read_uai`).
    max_memory : float, optional
        Bytes the compilation may use; default
        :func:`~boxwatch.offline.bn.limits.default_max_memory`.

    Raises
    ------
    ConfigError
        Naming the file, line and problem.
    """
    if not isinstance(source, (str, Path)):
        return from_pgmpy(source)
    path = Path(source)
    if path.name.lower().endswith((".uai", ".uai.gz")):
        return read_uai(path)
    where = show_path(path)
    limit = default_max_memory() if max_memory is None else int(max_memory)
    cap = max(1 << 20, limit // TEXT_SHARE)
    name = path.name.lower()
    if name.endswith(".gz"):
        raw = read_gzip_bounded(path, cap, max_compressed=cap, what="file")
        name = name[:-3]
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
    if name.endswith(".bif"):
        return parse_bif(text, where=where, max_memory=limit)
    if name.endswith(".net"):
        return parse_net(text, where=where, max_memory=limit)
    if name.endswith((".xml", ".xmlbif")):
        return parse_xmlbif(text, where=where, max_memory=limit)
    raise ConfigError(
        f"{where}: unknown network format; expected .bif, .bif.gz, .xml/.xmlbif, Hugin .net "
        "or .uai/.uai.gz"
    )


def from_pgmpy(model: Any) -> Network:
    """Convert a pgmpy ``DiscreteBayesianNetwork`` (with CPDs) to a :class:`Network`."""
    try:
        nodes = list(model.nodes())
        cpds = {cpd.variable: cpd for cpd in model.get_cpds()}
    except AttributeError:
        raise ConfigError(
            f"expected a path or a pgmpy DiscreteBayesianNetwork, got {type(model).__name__}"
        ) from None
    problems = [f"<pgmpy>: variable {v!r} has no CPD" for v in nodes if v not in cpds]
    if problems:
        raise ConfigError(problems)
    states: dict[str, tuple[str, ...]] = {}
    parents: dict[str, tuple[str, ...]] = {}
    tables: dict[str, np.ndarray] = {}
    for v in nodes:
        cpd = cpds[v]
        scope = list(cpd.variables)
        names = cpd.state_names
        for u in scope:
            states.setdefault(str(u), tuple(str(s) for s in names[u]))
        parents[str(v)] = tuple(str(u) for u in scope[1:])
        tables[str(v)] = np.moveaxis(np.asarray(cpd.values, dtype=np.float64), 0, -1)
    return _finish(
        "pgmpy", tuple(str(v) for v in nodes), states, parents, tables, "<pgmpy>", lines={}
    )


def write_bif(network: Network) -> str:
    """BIF text of ``network`` that :func:`parse_bif` reads back exactly (floats by ``repr``)."""
    bad = [
        f"{v}={s!r}"
        for v in network.variables
        for s in (v, *network.states[v])
        if not s or s != s.strip() or any(c in s for c in '{}(),;|"')
    ]
    if bad:
        raise ConfigError(f"names that BIF cannot hold: {bad}")
    lines = [f"network {network.name.replace(' ', '_') or 'network'} {{", "}"]
    for v in network.variables:
        states = ", ".join(network.states[v])
        lines += [f"variable {v} {{", f"  type discrete [ {network.card(v)} ] {{ {states} }};", "}"]
    for v in network.variables:
        par = network.parents[v]
        table = network.cpts[v]
        head = f"probability ( {v} | {', '.join(par)} ) {{" if par else f"probability ( {v} ) {{"
        lines.append(head)
        if not par:
            lines.append(f"  table {', '.join(repr(float(x)) for x in table)};")
        for idx in np.ndindex(*table.shape[:-1]) if par else ():
            key = ", ".join(network.states[p][i] for p, i in zip(par, idx, strict=True))
            lines.append(f"  ({key}) {', '.join(repr(float(x)) for x in table[idx])};")
        lines.append("}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- tokenising
_TOKEN_BODY = r'"(?:[^"\\]|\\.)*"|[{}()\[\];,|=]|[^\s{}()\[\];,|="]+'
_BIF_TOKEN_RE = re.compile(r"\s+|//[^\n]*|" + _TOKEN_BODY, re.DOTALL)
_NET_TOKEN_RE = re.compile(r"\s+|%[^\n]*|" + _TOKEN_BODY, re.DOTALL)


class _Tokens:
    """A token stream that knows each token's line, for error messages.

    Linear in the text: every regular expression matches without backtracking over the rest
    of the file, and a ``/* ... */`` comment is found with one ``str.find`` (an unterminated
    one is an error, not a rescan per ``/*``).
    """

    def __init__(self, text: str, where: str, *, percent_comments: bool):
        self.where = where
        self.text = text
        self.toks: list[str] = []
        self.pos: list[int] = []
        newlines = [m.start() for m in re.finditer("\n", text)]
        token_re = _NET_TOKEN_RE if percent_comments else _BIF_TOKEN_RE
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


# ---------------------------------------------------------------------------- BIF
def parse_bif(text: str, *, where: str = "<bif>", max_memory: float | None = None) -> Network:
    """Parse BIF text (the bnlearn repository's format); CPTs sized against ``max_memory``."""
    budget = _Budget(max_memory)
    t = _Tokens(text, where, percent_comments=False)
    name = "network"
    order: list[str] = []
    states: dict[str, tuple[str, ...]] = {}
    lines: dict[str, int] = {}
    blocks: list[
        tuple[str, tuple[str, ...], int, list[tuple[int, list[str] | None, list[float]]]]
    ] = []
    block_texts: list[list[str]] = []
    while t.peek() is not None:
        kw = t.next()
        if kw == "network":
            name = t.name("a network name")
            t.skip_block()
        elif kw == "variable":
            line = t.line()
            var = t.name("a variable name")
            if var in states:
                raise t.error(f"variable {var!r} is declared twice", line)
            states[var] = _bif_variable(t, var)
            order.append(var)
            lines[var] = line
        elif kw == "probability":
            line = t.line()
            t.expect("(")
            var = t.name("a variable name")
            read_parents: list[str] = []
            if t.peek() == "|":
                t.next()
                while t.peek() != ")":
                    read_parents.append(t.name("a parent name"))
                    if t.peek() == ",":
                        t.next()
            t.expect(")")
            first = len(t.numbers)
            blocks.append((var, tuple(read_parents), line, _bif_entries(t)))
            block_texts.append(t.numbers[first:])
        else:
            t.i -= 1
            raise t.error(f"expected 'network', 'variable' or 'probability', found {quote(kw)}")
    parents: dict[str, tuple[str, ...]] = {}
    cpts: dict[str, np.ndarray] = {}
    texts: dict[str, np.ndarray] = {}
    for (var, par, line, entries), numbers in zip(blocks, block_texts, strict=True):
        where_line = f"{where}:{line}"
        if var not in states:
            raise ConfigError(f"{where_line}: probability for undeclared variable {var!r}")
        if var in cpts:
            raise ConfigError(f"{where_line}: second probability block for {var!r}")
        missing = [p for p in par if p not in states]
        if missing:
            raise ConfigError(f"{where_line}: {var!r} has undeclared parent(s) {missing}")
        shape = budget.shape(var, par, states, where_line)
        parents[var] = par
        cpts[var] = _bif_table(var, par, states, entries, where_line, shape)
        texts[var] = _bif_texts(var, par, states, entries, numbers, where_line, shape)
        lines.setdefault(var, line)
    return _finish(name, tuple(order), states, parents, cpts, where, lines, texts)


def _bif_variable(t: _Tokens, var: str) -> tuple[str, ...]:
    t.expect("{")
    found: tuple[str, ...] | None = None
    while t.peek() != "}":
        kw = t.next("'type' or 'property'")
        if kw == "type":
            line = t.line()
            kind = t.next("'discrete'")
            if kind != "discrete":
                raise t.error(f"variable {var!r}: only discrete variables are supported", line)
            t.expect("[")
            n = t.next("the number of states")
            t.expect("]")
            t.expect("{")
            start = t.pos[t.i - 1] + 1
            while t.next("'}'") != "}":
                pass
            raw = t.text[start : t.pos[t.i - 1]]
            names = [s.strip().strip('"') for s in raw.split(",")]
            if "" in names:
                raise t.error(f"variable {var!r}: empty state name", line)
            t.expect(";")
            if not re.fullmatch(r"[0-9]{1,9}", n) or int(n) != len(names):
                raise t.error(
                    f"variable {var!r} declares [{one_line(n[:20])}] states but lists {len(names)}",
                    line,
                )
            if len(set(names)) != len(names):
                raise t.error(f"variable {var!r} lists a state twice: {names}", line)
            found = tuple(names)
        elif kw == "property":
            t.skip_statement()
        else:
            t.i -= 1
            raise t.error(f"variable {var!r}: expected 'type' or 'property', found {quote(kw)}")
    t.expect("}")
    if found is None:
        raise t.error(f"variable {var!r} has no 'type discrete [...] {{...}};' line")
    return found


def _bif_entries(t: _Tokens) -> list[tuple[int, list[str] | None, list[float]]]:
    """Entries of a probability block: (line, parent states or None for table/default, values)."""
    t.expect("{")
    out: list[tuple[int, list[str] | None, list[float]]] = []
    while t.peek() != "}":
        line = t.line()
        tok = t.next("'table', 'default', '(' or '}'")
        key: list[str] | None
        if tok in ("table", "default"):
            key = None if tok == "table" else ["<default>"]
        elif tok == "(":
            key = []
            while t.peek() != ")":
                key.append(t.name("a parent state"))
                if t.peek() == ",":
                    t.next()
            t.expect(")")
        elif tok == "property":
            t.skip_statement()
            continue
        else:
            t.i -= 1
            raise t.error(f"expected 'table', 'default' or '(', found {quote(tok)}")
        values: list[float] = [t.number()]
        while t.peek() == ",":
            t.next()
            values.append(t.number())
        t.expect(";")
        out.append((line, key, values))
    t.expect("}")
    return out


def _bif_table(
    var: str,
    par: tuple[str, ...],
    states: Mapping[str, tuple[str, ...]],
    entries: list[tuple[int, list[str] | None, list[float]]],
    where_line: str,
    shape: tuple[int, ...],
) -> np.ndarray:
    """CPT of ``var`` (of ``shape``, already sized) from its entries; errors name the entry's
    line (else the block's)."""
    where = where_line.rsplit(":", 1)[0]
    card = len(states[var])
    pcards = list(shape[:-1])
    table = np.full(shape, np.nan)
    for line, key, values in entries:
        if key is None:
            if len(values) != table.size:
                raise ConfigError(
                    f"{where}:{line}: table for {var!r} has {len(values)} values, "
                    f"expected {table.size}"
                )
            table[...] = np.moveaxis(np.asarray(values).reshape(card, *pcards), 0, -1)
            continue
        if len(values) != card:
            raise ConfigError(
                f"{where}:{line}: {var!r} entry has {len(values)} values, expected {card}"
            )
        if key == ["<default>"]:
            rows = np.isnan(table[..., 0])
            table[rows] = values
            continue
        if len(key) != len(par):
            raise ConfigError(
                f"{where}:{line}: {var!r} entry names {len(key)} parent states, "
                f"expected {len(par)} ({', '.join(par)})"
            )
        idx = []
        for p, s in zip(par, key, strict=True):
            if s not in states[p]:
                raise ConfigError(f"{where}:{line}: {quote(s)} is not a state of {p!r}")
            idx.append(states[p].index(s))
        table[tuple(idx)] = values
    if np.isnan(table).any():
        first = np.argwhere(np.isnan(table[..., 0]))
        row = ", ".join(states[p][i] for p, i in zip(par, first[0], strict=True)) if par else ""
        raise ConfigError(f"{where_line}: probability of {var!r} has no entry for parents ({row})")
    return table


def _bif_texts(
    var: str,
    par: Sequence[str],
    states: Mapping[str, tuple[str, ...]],
    entries: list[tuple[int, list[str] | None, list[float]]],
    numbers: list[str],
    where_line: str,
    shape: tuple[int, ...],
) -> np.ndarray:
    """The decimal strings of ``var``'s CPT (``numbers``: the block's, in file order),
    placed as :func:`_bif_table` places the floats: it places each value's position."""
    positions: list[tuple[int, list[str] | None, list[float]]] = []
    start = 0
    for line, key, values in entries:
        positions.append((line, key, [float(i) for i in range(start, start + len(values))]))
        start += len(values)
    where_pos = _bif_table(var, tuple(par), states, positions, where_line, shape)
    return text_table(numbers, (len(numbers),))[where_pos.astype(np.int64)]


# ---------------------------------------------------------------------------- Hugin .net
def parse_net(text: str, *, where: str = "<net>", max_memory: float | None = None) -> Network:
    """Parse a Hugin ``.net`` network (discrete nodes, ``potential`` blocks with ``data``)."""
    budget = _Budget(max_memory)
    t = _Tokens(text, where, percent_comments=True)
    name = "network"
    order: list[str] = []
    states: dict[str, tuple[str, ...]] = {}
    lines: dict[str, int] = {}
    pots: list[tuple[str, tuple[str, ...], int, int, list[float]]] = []
    pot_texts: list[list[str]] = []
    while t.peek() is not None:
        kw = t.next()
        if kw == "net":
            t.skip_block()
        elif kw in ("node", "discrete"):
            line = t.line()
            if kw == "discrete":
                t.expect("node")
            var = t.name("a node name")
            if var in states:
                raise t.error(f"node {var!r} is declared twice", line)
            states[var] = _net_node(t, var, line)
            order.append(var)
            lines[var] = line
        elif kw in ("continuous", "decision", "utility"):
            raise t.error(f"{kw} nodes are not supported (discrete chance nodes only)")
        elif kw == "potential":
            line = t.line()
            t.expect("(")
            var = t.name("a node name")
            read_parents: list[str] = []
            if t.peek() == "|":
                t.next()
                while t.peek() != ")":
                    read_parents.append(t.name("a parent name"))
            t.expect(")")
            first = len(t.numbers)
            data_line, values = _net_potential(t, var)
            pots.append((var, tuple(read_parents), line, data_line, values))
            pot_texts.append(t.numbers[first:])
        else:
            t.i -= 1
            raise t.error(f"expected 'net', 'node' or 'potential', found {quote(kw)}")
    parents: dict[str, tuple[str, ...]] = {}
    cpts: dict[str, np.ndarray] = {}
    texts: dict[str, np.ndarray] = {}
    for (var, par, line, data_line, values), numbers in zip(pots, pot_texts, strict=True):
        if var not in states:
            raise ConfigError(f"{where}:{line}: potential for undeclared node {var!r}")
        if var in cpts:
            raise ConfigError(f"{where}:{line}: second potential for {var!r}")
        missing = [p for p in par if p not in states]
        if missing:
            raise ConfigError(f"{where}:{line}: {var!r} has undeclared parent(s) {missing}")
        shape = budget.shape(var, par, states, f"{where}:{line}")
        if len(values) != math.prod(shape):
            raise ConfigError(
                f"{where}:{data_line}: data for {var!r} has {len(values)} numbers, "
                f"expected {math.prod(shape)} for shape {shape}"
            )
        parents[var] = par
        cpts[var] = np.asarray(values, dtype=np.float64).reshape(shape)
        texts[var] = text_table(numbers, shape)
    return _finish(name, tuple(order), states, parents, cpts, where, lines, texts)


def _net_node(t: _Tokens, var: str, line: int) -> tuple[str, ...]:
    t.expect("{")
    found: tuple[str, ...] | None = None
    while t.peek() != "}":
        key = t.name("an attribute name")
        t.expect("=")
        if key == "states":
            sline = t.line()
            t.expect("(")
            names = []
            while t.peek() != ")":
                names.append(t.name("a state name"))
            t.expect(")")
            t.expect(";")
            if not names or len(set(names)) != len(names):
                raise t.error(f"node {var!r}: states must be distinct and non-empty", sline)
            found = tuple(names)
        else:
            depth = 0
            while True:
                tok = t.next("';'")
                depth += tok == "("
                depth -= tok == ")"
                if tok == ";" and depth == 0:
                    break
    t.expect("}")
    if found is None:
        raise t.error(f"node {var!r} has no 'states = (...);' attribute", line)
    return found


def _net_potential(t: _Tokens, var: str) -> tuple[int, list[float]]:
    t.expect("{")
    data_line = t.line()
    values: list[float] | None = None
    while t.peek() != "}":
        key = t.name("an attribute name")
        t.expect("=")
        if key == "data":
            data_line = t.line()
            values = []
            depth = 0
            while True:
                tok = t.peek()
                if tok == "(":
                    depth += 1
                    t.next()
                elif tok == ")":
                    depth -= 1
                    t.next()
                elif tok == ";" and depth == 0:
                    t.next()
                    break
                else:
                    values.append(t.number())
            if depth:
                raise t.error(f"potential of {var!r}: unbalanced parentheses in data")
        else:
            while t.next("';'") != ";":
                pass
    t.expect("}")
    if values is None:
        raise t.error(f"potential of {var!r} has no 'data = (...);'", data_line)
    return data_line, values


# ---------------------------------------------------------------------------- XMLBIF
@dataclass
class _Elem:
    tag: str
    line: int
    children: list[_Elem]
    text: str = ""
    chunks: list[str] | None = None

    def find_all(self, tag: str) -> list[_Elem]:
        """Child elements with this (upper-case) tag."""
        return [c for c in self.children if c.tag.upper() == tag]

    def find_text(self, tag: str) -> list[tuple[str, int]]:
        """(stripped text, line) of child elements with this tag."""
        return [(c.text.strip(), c.line) for c in self.find_all(tag)]


def _xml_tree(text: str, where: str) -> _Elem:
    """The element tree of ``text``: text gathered in chunks (linear), DTDs refused (so no
    entity expansion), no external entities."""
    parser = xml.parsers.expat.ParserCreate()
    parser.SetParamEntityParsing(xml.parsers.expat.XML_PARAM_ENTITY_PARSING_NEVER)
    root = _Elem("#document", 1, [], chunks=[])
    stack = [root]

    def start(tag: str, _attrs: dict[str, str]) -> None:
        el = _Elem(tag, parser.CurrentLineNumber, [], chunks=[])
        stack[-1].children.append(el)
        stack.append(el)

    def end(_tag: str) -> None:
        el = stack.pop()
        el.text = "".join(el.chunks or ())
        el.chunks = None

    def chars(data: str) -> None:
        chunks = stack[-1].chunks
        if chunks is not None:
            chunks.append(data)

    def doctype(*_args: Any) -> None:
        raise ConfigError(
            f"{where}:{parser.CurrentLineNumber}: XML with a DTD (<!DOCTYPE ...>) is not "
            "accepted (entities could expand without bound)"
        )

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = doctype
    try:
        parser.Parse(text, True)
    except xml.parsers.expat.ExpatError as exc:
        raise ConfigError(f"{where}:{exc.lineno}: XML error: {exc}") from None
    return root


def parse_xmlbif(text: str, *, where: str = "<xmlbif>", max_memory: float | None = None) -> Network:
    """Parse XMLBIF 0.3 text (``<VARIABLE>`` and ``<DEFINITION>`` elements); no DTDs."""
    budget = _Budget(max_memory)
    doc = _xml_tree(text, where)
    nets = [n for b in doc.find_all("BIF") for n in b.find_all("NETWORK")]
    if len(nets) != 1:
        raise ConfigError(f"{where}:1: expected one <BIF><NETWORK> element, found {len(nets)}")
    net = nets[0]
    names = net.find_text("NAME")
    name = names[0][0] if names else "network"
    order: list[str] = []
    states: dict[str, tuple[str, ...]] = {}
    lines: dict[str, int] = {}
    for el in net.find_all("VARIABLE"):
        vn = el.find_text("NAME")
        if len(vn) != 1 or not vn[0][0]:
            raise ConfigError(f"{where}:{el.line}: <VARIABLE> needs exactly one <NAME>")
        var = vn[0][0]
        if var in states:
            raise ConfigError(f"{where}:{el.line}: variable {var!r} is declared twice")
        outcomes = [s for s, _ in el.find_text("OUTCOME")]
        if not outcomes or len(set(outcomes)) != len(outcomes) or "" in outcomes:
            raise ConfigError(
                f"{where}:{el.line}: variable {var!r} needs distinct non-empty <OUTCOME>s"
            )
        states[var] = tuple(outcomes)
        order.append(var)
        lines[var] = el.line
    parents: dict[str, tuple[str, ...]] = {}
    cpts: dict[str, np.ndarray] = {}
    texts: dict[str, np.ndarray] = {}
    for el in net.find_all("DEFINITION") + net.find_all("PROBABILITY"):
        fv = el.find_text("FOR")
        if len(fv) != 1 or fv[0][0] not in states:
            raise ConfigError(f"{where}:{el.line}: <DEFINITION> must name one declared <FOR>")
        var = fv[0][0]
        if var in cpts:
            raise ConfigError(f"{where}:{el.line}: second definition for {var!r}")
        par = tuple(p for p, _ in el.find_text("GIVEN"))
        missing = [p for p in par if p not in states]
        if missing:
            raise ConfigError(f"{where}:{el.line}: {var!r} has undeclared parent(s) {missing}")
        tables = el.find_text("TABLE")
        if len(tables) != 1:
            raise ConfigError(f"{where}:{el.line}: definition of {var!r} needs one <TABLE>")
        shape = budget.shape(var, par, states, f"{where}:{el.line}")
        body, tline = tables[0]
        numbers = body.split()
        values = []
        for x in numbers:
            try:
                values.append(float(x))
            except ValueError:
                raise ConfigError(
                    f"{where}:{tline}: <TABLE> of {var!r}: {quote(x)} is not a number"
                ) from None
        if len(values) != math.prod(shape):
            raise ConfigError(
                f"{where}:{tline}: <TABLE> of {var!r} has {len(values)} numbers, "
                f"expected {math.prod(shape)}"
            )
        parents[var] = par
        cpts[var] = np.asarray(values, dtype=np.float64).reshape(shape)
        texts[var] = text_table(numbers, shape)
    return _finish(name, tuple(order), states, parents, cpts, where, lines, texts)


# ---------------------------------------------------------------------------- UAI
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
    return _finish(name, tuple(names), states, parents, cpts, where, lines)


def _is_float(tok: str) -> bool:
    try:
        float(tok)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------- checks
def _finish(
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
