"""BIF, the bnlearn repository's format: :func:`parse_bif` reads it, :func:`write_bif` writes it."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import one_line, quote
from boxwatch.offline.bn.formats.common import (
    Budget,
    NetworkFormat,
    Tokens,
    finish,
    read_network_text,
)
from boxwatch.offline.bn.formats.writing import cpt_texts
from boxwatch.offline.bn.limits import Deadline
from boxwatch.offline.bn.network import Network, text_table


def parse_bif(
    text: str,
    *,
    where: str = "<bif>",
    max_memory: float | None = None,
    deadline: Deadline | None = None,
) -> Network:
    """Parse BIF text (the bnlearn repository's format); CPTs sized against ``max_memory``,
    ``deadline`` checked as it goes."""
    budget = Budget(max_memory)
    t = Tokens(text, where, percent_comments=False, deadline=deadline)
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
    return finish(name, tuple(order), states, parents, cpts, where, lines, texts)


def _bif_variable(t: Tokens, var: str) -> tuple[str, ...]:
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


def _bif_entries(t: Tokens) -> list[tuple[int, list[str] | None, list[float]]]:
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


def write_bif(network: Network) -> str:
    """BIF text of ``network`` that :func:`parse_bif` reads back exactly: each number as
    written (:func:`~.writing.cpt_texts`: the file's decimal, else the float's ``repr``)."""
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
        table = cpt_texts(network, v)
        head = f"probability ( {v} | {', '.join(par)} ) {{" if par else f"probability ( {v} ) {{"
        lines.append(head)
        if not par:
            lines.append(f"  table {', '.join(table.tolist())};")
        for idx in np.ndindex(*table.shape[:-1]) if par else ():
            key = ", ".join(network.states[p][i] for p, i in zip(par, idx, strict=True))
            lines.append(f"  ({key}) {', '.join(table[idx].tolist())};")
        lines.append("}")
    return "\n".join(lines) + "\n"


def read_bif(
    path: Path, max_memory: float | None = None, deadline: Deadline | None = None
) -> Network:
    """Read a BIF file, gzipped when its name ends in ``.gz``; ``max_memory`` bounds
    its text and tables."""
    return read_network_text(path, parse_bif, max_memory, deadline)


FORMAT = NetworkFormat("BIF", (".bif", ".bif.gz"), read_bif, write_bif)
