"""A pgmpy ``DiscreteBayesianNetwork`` taken as a network (no file, no pgmpy import)."""

from __future__ import annotations

from typing import Any

import numpy as np

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn.formats.common import finish
from boxwatch.offline.bn.network import Network


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
    return finish(
        "pgmpy", tuple(str(v) for v in nodes), states, parents, tables, "<pgmpy>", lines={}
    )
