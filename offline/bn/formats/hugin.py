"""Hugin ``.net`` networks: discrete nodes, ``potential`` blocks with ``data``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import quote
from boxwatch.offline.bn.formats.common import (
    Budget,
    NetworkFormat,
    Tokens,
    finish,
    read_network_text,
)
from boxwatch.offline.bn.formats.writing import PLAIN_NAME, check_names, cpt_texts
from boxwatch.offline.bn.limits import Deadline
from boxwatch.offline.bn.network import Network, text_table


def parse_net(
    text: str,
    *,
    where: str = "<net>",
    max_memory: float | None = None,
    deadline: Deadline | None = None,
) -> Network:
    """Parse a Hugin ``.net`` network (discrete nodes, ``potential`` blocks with ``data``);
    ``deadline`` checked as it goes."""
    budget = Budget(max_memory)
    t = Tokens(text, where, percent_comments=True, deadline=deadline)
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
    return finish(name, tuple(order), states, parents, cpts, where, lines, texts)


def _net_node(t: Tokens, var: str, line: int) -> tuple[str, ...]:
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


def _net_potential(t: Tokens, var: str) -> tuple[int, list[float]]:
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


def read_net(
    path: Path, max_memory: float | None = None, deadline: Deadline | None = None
) -> Network:
    """Read a Hugin ``.net`` file, gzipped when its name ends in ``.gz``; ``max_memory`` bounds
    its text and tables."""
    return read_network_text(path, parse_net, max_memory, deadline)


def write_net(network: Network) -> str:
    """Hugin ``.net`` text of ``network`` that :func:`parse_net` reads back exactly: node
    names plain identifiers, states quoted, each number as written (one CPT row a line)."""
    check_names(
        network,
        "Hugin",
        lambda v: PLAIN_NAME.fullmatch(v) is None,
        lambda s: any(c in s for c in '"\\\n'),
    )
    lines = ["net", "{", "}"]
    for v in network.variables:
        states = " ".join(f'"{s}"' for s in network.states[v])
        lines += [f"node {v}", "{", f"  states = ( {states} );", "}"]
    for v in network.variables:
        table = cpt_texts(network, v)
        rows = table.reshape(-1, table.shape[-1]).tolist()
        lines += [f"potential ( {v} | {' '.join(network.parents[v])} )", "{", "  data = ("]
        lines += [f"    ({' '.join(row)})" for row in rows]
        lines += ["  );", "}"]
    return "\n".join(lines) + "\n"


FORMAT = NetworkFormat("Hugin", (".net", ".net.gz"), read_net, write_net)
