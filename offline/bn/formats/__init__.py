"""Read discrete Bayesian networks (BIF, .bif.gz, XMLBIF, Hugin .net, UAI, pgmpy) into one form.

Own small parsers rather than pgmpy's readers: they are fast (parse time is reported apart
from compile time) and every error names the file, the line and the problem. A parsed
network is a :class:`~boxwatch.offline.bn.network.Network`: variables in file order, state
names, parents and CPTs as numpy arrays of shape ``(*parent_cards, card)`` (``P(var |
parents)`` on the last axis), with the CPT numbers as written (``Network.texts``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import read_bounded, read_gzip_bounded, show_path
from boxwatch.offline.bn.formats.bif import parse_bif, write_bif
from boxwatch.offline.bn.formats.common import TEXT_SHARE
from boxwatch.offline.bn.formats.hugin import parse_net
from boxwatch.offline.bn.formats.pgmpy_model import from_pgmpy
from boxwatch.offline.bn.formats.uai import parse_uai, read_uai
from boxwatch.offline.bn.formats.xmlbif import parse_xmlbif
from boxwatch.offline.bn.limits import default_max_memory
from boxwatch.offline.bn.network import Network

__all__ = [
    "Network",
    "from_pgmpy",
    "load_network",
    "parse_bif",
    "parse_net",
    "parse_uai",
    "parse_xmlbif",
    "read_uai",
    "write_bif",
]


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
