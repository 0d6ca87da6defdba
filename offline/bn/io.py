"""Read discrete Bayesian networks (BIF, .bif.gz, XMLBIF, Hugin .net, UAI, pgmpy) into one form.

Own small parsers rather than pgmpy's readers: they are fast (parse time is reported apart
from compile time) and every error names the file, the line and the problem. A parsed
network is a :class:`Network`: variables in file order, state names, parents and CPTs as
numpy arrays of shape ``(*parent_cards, card)`` (``P(var | parents)`` on the last axis).
"""

from __future__ import annotations

import bisect
import gzip
import math
import re
import xml.parsers.expat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from boxwatch.agent.errors import ConfigError

CPT_SUM_TOLERANCE = 1e-3


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
    """

    name: str
    variables: tuple[str, ...]
    states: Mapping[str, tuple[str, ...]]
    parents: Mapping[str, tuple[str, ...]]
    cpts: Mapping[str, np.ndarray]
    source: str = "<memory>"

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


def load_network(source: str | Path | Any) -> Network:
    """Read a network from a path (format by suffix) or take a pgmpy model.

    Parameters
    ----------
    source : path or pgmpy ``DiscreteBayesianNetwork``
        ``.bif``, ``.bif.gz``, ``.xml``/``.xmlbif`` (optionally ``.gz``), Hugin ``.net`` or
        UAI ``.uai``/``.uai.gz`` (read with its own size bounds: :func:`read_uai`).

    Raises
    ------
    ConfigError
        Naming the file, line and problem.
    """
    if not isinstance(source, (str, Path)):
        return from_pgmpy(source)
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    if path.name.lower().endswith((".uai", ".uai.gz")):
        return read_uai(path)
    raw = path.read_bytes()
    name = path.name.lower()
    if name.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise ConfigError(f"{path}: not a valid gzip file ({exc})") from None
        name = name[:-3]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    if name.endswith(".bif"):
        return parse_bif(text, where=str(path))
    if name.endswith(".net"):
        return parse_net(text, where=str(path))
    if name.endswith((".xml", ".xmlbif")):
        return parse_xmlbif(text, where=str(path))
    raise ConfigError(
        f"{path}: unknown network format; expected .bif, .bif.gz, .xml/.xmlbif, Hugin .net "
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
_BIF_TOKEN_RE = re.compile(r"\s+|//[^\n]*|/\*.*?\*/|" + _TOKEN_BODY, re.DOTALL)
_NET_TOKEN_RE = re.compile(r"\s+|%[^\n]*|" + _TOKEN_BODY, re.DOTALL)


class _Tokens:
    """A token stream that knows each token's line, for error messages."""

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
            raise self.error(f"expected {tok!r}, found {got!r}")

    def name(self, what: str) -> str:
        """Consume a name (quotes removed)."""
        tok = self.next(what)
        if tok in "{}()[];,|=":
            self.i -= 1
            raise self.error(f"expected {what}, found {tok!r}")
        return tok[1:-1] if tok.startswith('"') else tok

    def number(self) -> float:
        """Consume a floating-point number."""
        tok = self.next("a number")
        try:
            return float(tok)
        except ValueError:
            self.i -= 1
            raise self.error(f"expected a number, found {tok!r}") from None

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
def parse_bif(text: str, *, where: str = "<bif>") -> Network:
    """Parse BIF text (the bnlearn repository's format)."""
    t = _Tokens(text, where, percent_comments=False)
    name = "network"
    order: list[str] = []
    states: dict[str, tuple[str, ...]] = {}
    lines: dict[str, int] = {}
    blocks: list[
        tuple[str, tuple[str, ...], int, list[tuple[int, list[str] | None, list[float]]]]
    ] = []
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
            par: list[str] = []
            if t.peek() == "|":
                t.next()
                while t.peek() != ")":
                    par.append(t.name("a parent name"))
                    if t.peek() == ",":
                        t.next()
            t.expect(")")
            blocks.append((var, tuple(par), line, _bif_entries(t)))
        else:
            t.i -= 1
            raise t.error(f"expected 'network', 'variable' or 'probability', found {kw!r}")
    parents: dict[str, tuple[str, ...]] = {}
    cpts: dict[str, np.ndarray] = {}
    for var, par, line, entries in blocks:
        where_line = f"{where}:{line}"
        if var not in states:
            raise ConfigError(f"{where_line}: probability for undeclared variable {var!r}")
        if var in cpts:
            raise ConfigError(f"{where_line}: second probability block for {var!r}")
        missing = [p for p in par if p not in states]
        if missing:
            raise ConfigError(f"{where_line}: {var!r} has undeclared parent(s) {missing}")
        parents[var] = par
        cpts[var] = _bif_table(var, par, states, entries, f"{where}:{line}")
        lines.setdefault(var, line)
    return _finish(name, tuple(order), states, parents, cpts, where, lines)


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
            if not n.isdigit() or int(n) != len(names):
                raise t.error(
                    f"variable {var!r} declares [{n}] states but lists {len(names)}", line
                )
            if len(set(names)) != len(names):
                raise t.error(f"variable {var!r} lists a state twice: {names}", line)
            found = tuple(names)
        elif kw == "property":
            t.skip_statement()
        else:
            t.i -= 1
            raise t.error(f"variable {var!r}: expected 'type' or 'property', found {kw!r}")
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
            raise t.error(f"expected 'table', 'default' or '(', found {tok!r}")
        values = [t.number()]
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
) -> np.ndarray:
    """CPT of ``var`` from its entries; errors name the entry's line (else the block's)."""
    where = where_line.rsplit(":", 1)[0]
    card = len(states[var])
    pcards = [len(states[p]) for p in par]
    table = np.full((*pcards, card), np.nan)
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
                raise ConfigError(
                    f"{where}:{line}: {s!r} is not a state of {p!r} {list(states[p])}"
                )
            idx.append(states[p].index(s))
        table[tuple(idx)] = values
    if np.isnan(table).any():
        first = np.argwhere(np.isnan(table[..., 0]))
        row = ", ".join(states[p][i] for p, i in zip(par, first[0], strict=True)) if par else ""
        raise ConfigError(f"{where_line}: probability of {var!r} has no entry for parents ({row})")
    return table


# ---------------------------------------------------------------------------- Hugin .net
def parse_net(text: str, *, where: str = "<net>") -> Network:
    """Parse a Hugin ``.net`` network (discrete nodes, ``potential`` blocks with ``data``)."""
    t = _Tokens(text, where, percent_comments=True)
    name = "network"
    order: list[str] = []
    states: dict[str, tuple[str, ...]] = {}
    lines: dict[str, int] = {}
    pots: list[tuple[str, tuple[str, ...], int, int, list[float]]] = []
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
            par: list[str] = []
            if t.peek() == "|":
                t.next()
                while t.peek() != ")":
                    par.append(t.name("a parent name"))
            t.expect(")")
            data_line, values = _net_potential(t, var)
            pots.append((var, tuple(par), line, data_line, values))
        else:
            t.i -= 1
            raise t.error(f"expected 'net', 'node' or 'potential', found {kw!r}")
    parents: dict[str, tuple[str, ...]] = {}
    cpts: dict[str, np.ndarray] = {}
    for var, par, line, data_line, values in pots:
        if var not in states:
            raise ConfigError(f"{where}:{line}: potential for undeclared node {var!r}")
        if var in cpts:
            raise ConfigError(f"{where}:{line}: second potential for {var!r}")
        missing = [p for p in par if p not in states]
        if missing:
            raise ConfigError(f"{where}:{line}: {var!r} has undeclared parent(s) {missing}")
        shape = (*(len(states[p]) for p in par), len(states[var]))
        if len(values) != int(np.prod(shape)):
            raise ConfigError(
                f"{where}:{data_line}: data for {var!r} has {len(values)} numbers, "
                f"expected {int(np.prod(shape))} for shape {shape}"
            )
        parents[var] = par
        cpts[var] = np.asarray(values, dtype=np.float64).reshape(shape)
    return _finish(name, tuple(order), states, parents, cpts, where, lines)


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
    data_line, values = t.line(), None
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

    def find_all(self, tag: str) -> list[_Elem]:
        """Child elements with this (upper-case) tag."""
        return [c for c in self.children if c.tag.upper() == tag]

    def find_text(self, tag: str) -> list[tuple[str, int]]:
        """(stripped text, line) of child elements with this tag."""
        return [(c.text.strip(), c.line) for c in self.find_all(tag)]


def _xml_tree(text: str, where: str) -> _Elem:
    parser = xml.parsers.expat.ParserCreate()
    root = _Elem("#document", 1, [])
    stack = [root]

    def start(tag: str, _attrs: dict[str, str]) -> None:
        el = _Elem(tag, parser.CurrentLineNumber, [])
        stack[-1].children.append(el)
        stack.append(el)

    def end(_tag: str) -> None:
        stack.pop()

    def chars(data: str) -> None:
        stack[-1].text += data

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    try:
        parser.Parse(text, True)
    except xml.parsers.expat.ExpatError as exc:
        raise ConfigError(f"{where}:{exc.lineno}: XML error: {exc}") from None
    return root


def parse_xmlbif(text: str, *, where: str = "<xmlbif>") -> Network:
    """Parse XMLBIF 0.3 text (``<VARIABLE>`` and ``<DEFINITION>`` elements)."""
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
        body, tline = tables[0]
        try:
            values = [float(x) for x in body.split()]
        except ValueError as exc:
            raise ConfigError(f"{where}:{tline}: <TABLE> of {var!r}: {exc}") from None
        shape = (*(len(states[p]) for p in par), len(states[var]))
        if len(values) != int(np.prod(shape)):
            raise ConfigError(
                f"{where}:{tline}: <TABLE> of {var!r} has {len(values)} numbers, "
                f"expected {int(np.prod(shape))}"
            )
        parents[var] = par
        cpts[var] = np.asarray(values).reshape(shape)
    return _finish(name, tuple(order), states, parents, cpts, where, lines)


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
) -> Network:
    """Check completeness, CPT sums and acyclicity; every problem names a line."""

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
