"""Read discrete Bayesian networks into one form: one module per file format, and pgmpy models.

Own small parsers rather than pgmpy's readers: they are fast (parse time is reported apart
from compile time) and every error names the file, the line and the problem. A parsed
network is a :class:`~boxwatch.offline.bn.network.Network`: variables in file order, state
names, parents and CPTs as numpy arrays of shape ``(*parent_cards, card)`` (``P(var |
parents)`` on the last axis), with the CPT numbers as written (``Network.texts``).

Each format's module declares its :class:`~.common.NetworkFormat` (name, file suffixes,
reader, writer) as ``FORMAT``; :data:`FORMATS` lists them, and the choice by suffix, the
error for an unknown one and the help texts (:func:`formats_text`) come from it. A new format
is one module and one entry here. :func:`write_network` writes a network in the format its
path names, each number as written (:mod:`.writing`).
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

from boxwatch.agent.atomic import write_atomic
from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import show_path
from boxwatch.offline.bn.formats import bif, hugin, uai, xmlbif
from boxwatch.offline.bn.formats.bif import parse_bif, write_bif
from boxwatch.offline.bn.formats.common import NetworkFormat
from boxwatch.offline.bn.formats.hugin import parse_net, write_net
from boxwatch.offline.bn.formats.pgmpy_model import from_pgmpy
from boxwatch.offline.bn.formats.uai import parse_uai, read_uai, write_uai
from boxwatch.offline.bn.formats.xmlbif import parse_xmlbif, write_xmlbif
from boxwatch.offline.bn.limits import Deadline
from boxwatch.offline.bn.network import Network

__all__ = [
    "FORMATS",
    "Network",
    "NetworkFormat",
    "format_of",
    "formats_text",
    "from_pgmpy",
    "load_network",
    "parse_bif",
    "parse_net",
    "parse_uai",
    "parse_xmlbif",
    "read_uai",
    "write_bif",
    "write_net",
    "write_network",
    "write_uai",
    "write_xmlbif",
]

FORMATS: dict[str, NetworkFormat] = {
    f.name: f for f in (bif.FORMAT, xmlbif.FORMAT, hugin.FORMAT, uai.FORMAT)
}
"""Every network file format the readers know, by name, in the order help texts list them."""


def formats_text() -> str:
    """The formats and their suffixes, for help texts and errors:
    ``BIF (.bif, .bif.gz), ... or UAI (.uai, .uai.gz)``."""
    named = [f"{f.name} ({', '.join(f.suffixes)})" for f in FORMATS.values()]
    return ", ".join(named[:-1]) + " or " + named[-1]


def format_of(path: str | Path) -> NetworkFormat:
    """The format of a network file, by its name's (case-insensitive) suffix.

    Raises
    ------
    ConfigError
        Naming the file and the formats known, when no suffix matches.
    """
    name = Path(path).name.lower()
    for fmt in FORMATS.values():
        if name.endswith(fmt.suffixes):
            return fmt
    raise ConfigError(f"{show_path(path)}: unknown network format; expected {formats_text()}")


def load_network(
    source: str | Path | Any,
    *,
    max_memory: float | None = None,
    deadline: Deadline | None = None,
) -> Network:
    """Read a network from a path (format by suffix: :func:`format_of`) or take a pgmpy model.

    Bounded before it allocates: a text file (and a ``.gz`` file's decompressed stream) may
    have ``max_memory / TEXT_SHARE`` bytes, and every CPT is sized from its declared shape
    against ``max_memory`` before its table exists (UAI files are read as a stream:
    :func:`~.uai.read_uai`). Text is UTF-8 (latin-1 is accepted for old Hugin files); NUL
    bytes are refused.

    Parameters
    ----------
    source : path or pgmpy ``DiscreteBayesianNetwork``
        A file of one of the :data:`FORMATS` (:func:`formats_text` lists them).
    max_memory : float, optional
        Bytes the compilation may use; default
        :func:`~boxwatch.offline.bn.limits.default_max_memory`.
    deadline : Deadline, optional
        A wall-clock limit checked while the file is read and parsed.

    Raises
    ------
    ConfigError
        Naming the file, line and problem.
    """
    if not isinstance(source, (str, Path)):
        return from_pgmpy(source)
    path = Path(source)
    return format_of(path).read(path, max_memory, deadline)


def write_network(network: Network, path: str | Path) -> None:
    """Write ``network`` to ``path`` in the format its suffix names (:func:`format_of`),
    gzipped when the name ends in ``.gz``, atomically; each number as written, so
    :func:`load_network` gives back the same exact classifier.

    Raises
    ------
    ConfigError
        For an unknown suffix, or names the format cannot hold.
    """
    data = format_of(path).write(network).encode("utf-8")
    if Path(path).name.lower().endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    write_atomic(path, data)
