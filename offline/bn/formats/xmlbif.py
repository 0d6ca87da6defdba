"""XMLBIF 0.3 networks, parsed with expat: DTDs refused, so no entity can expand."""

from __future__ import annotations

import math
import xml.parsers.expat
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import numpy as np

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import quote
from boxwatch.offline.bn.formats.common import (
    CHECK_TOKENS,
    Budget,
    NetworkFormat,
    finish,
    read_network_text,
)
from boxwatch.offline.bn.formats.writing import check_names, cpt_texts
from boxwatch.offline.bn.limits import Deadline
from boxwatch.offline.bn.network import Network, text_table


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


def _xml_tree(text: str, where: str, deadline: Deadline | None = None) -> _Elem:
    """The element tree of ``text``: text gathered in chunks (linear), DTDs refused (so no
    entity expansion), no external entities; ``deadline`` checked every
    :data:`~.common.CHECK_TOKENS` elements."""
    parser = xml.parsers.expat.ParserCreate()
    parser.SetParamEntityParsing(xml.parsers.expat.XML_PARAM_ENTITY_PARSING_NEVER)
    root = _Elem("#document", 1, [], chunks=[])
    stack = [root]
    seen = [0]

    def start(tag: str, _attrs: dict[str, str]) -> None:
        seen[0] += 1
        if deadline is not None and not seen[0] % CHECK_TOKENS:
            deadline.check(f"parsing line {parser.CurrentLineNumber:,}")
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


def parse_xmlbif(
    text: str,
    *,
    where: str = "<xmlbif>",
    max_memory: float | None = None,
    deadline: Deadline | None = None,
) -> Network:
    """Parse XMLBIF 0.3 text (``<VARIABLE>`` and ``<DEFINITION>`` elements); no DTDs;
    ``deadline`` checked as it goes."""
    budget = Budget(max_memory)
    doc = _xml_tree(text, where, deadline)
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
        if deadline is not None:
            deadline.check(f"the definition at line {el.line:,}")
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
    return finish(name, tuple(order), states, parents, cpts, where, lines, texts)


def read_xmlbif(
    path: Path, max_memory: float | None = None, deadline: Deadline | None = None
) -> Network:
    """Read an XMLBIF file, gzipped when its name ends in ``.gz``; ``max_memory`` bounds
    its text and tables."""
    return read_network_text(path, parse_xmlbif, max_memory, deadline)


def write_xmlbif(network: Network) -> str:
    """XMLBIF 0.3 text of ``network`` that :func:`parse_xmlbif` reads back exactly: names
    escaped, each ``<TABLE>`` in CPT order (the variable's states fastest), each number as
    written."""
    check_names(network, "XMLBIF", lambda v: False, lambda s: False)
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<BIF VERSION="0.3">',
        "<NETWORK>",
        f"<NAME>{escape(network.name)}</NAME>",
    ]
    for v in network.variables:
        out.append('<VARIABLE TYPE="nature">')
        out.append(f"  <NAME>{escape(v)}</NAME>")
        out += [f"  <OUTCOME>{escape(s)}</OUTCOME>" for s in network.states[v]]
        out.append("</VARIABLE>")
    for v in network.variables:
        out += ["<DEFINITION>", f"  <FOR>{escape(v)}</FOR>"]
        out += [f"  <GIVEN>{escape(p)}</GIVEN>" for p in network.parents[v]]
        out += [f"  <TABLE>{' '.join(cpt_texts(network, v).reshape(-1).tolist())}</TABLE>"]
        out.append("</DEFINITION>")
    out += ["</NETWORK>", "</BIF>"]
    return "\n".join(out) + "\n"


FORMAT = NetworkFormat(
    "XMLBIF", (".xml", ".xml.gz", ".xmlbif", ".xmlbif.gz"), read_xmlbif, write_xmlbif
)
