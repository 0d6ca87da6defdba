"""What the network writers share: a CPT's numbers as written, and the names a format can hold.

A writer writes each CPT number as the network holds it (:attr:`Network.texts`, the decimal
strings of the file it was read from, else each float's shortest round-trip decimal), so a
network and the file written from it define the same exact classifier
(:mod:`boxwatch.offline.bn.exact`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn.network import Network


def cpt_texts(network: Network, var: str) -> np.ndarray:
    """``var``'s CPT numbers as written: an object array of decimal strings, the CPT's shape.

    The file's own strings when the network keeps them, else ``repr`` of each float (the
    text :meth:`Network.exact_cpt` reads those as).
    """
    table = network.cpts[var]
    text = network.texts.get(var) if network.texts is not None else None
    if text is not None and text.shape == table.shape:
        return text
    out = np.empty(table.size, dtype=object)
    out[:] = [repr(float(x)) for x in table.reshape(-1).tolist()]
    return out.reshape(table.shape)


def check_names(
    network: Network,
    fmt: str,
    bad_variable: Callable[[str], bool],
    bad_state: Callable[[str], bool],
) -> None:
    """Refuse a network whose variable or state names ``fmt`` cannot hold (empty names, names
    with surrounding blanks, and those ``bad_variable`` / ``bad_state`` flag), naming them."""
    found = [
        f"{v}={s!r}"
        for v in network.variables
        for s, bad in ((v, bad_variable), *((s, bad_state) for s in network.states[v]))
        if not s or s != s.strip() or bad(s)
    ]
    if found:
        shown = ", ".join(found[:20]) + (f" and {len(found) - 20} more" if len(found) > 20 else "")
        raise ConfigError(f"names that {fmt} cannot hold: {shown}")


PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
"""A name every text format writes unquoted."""
