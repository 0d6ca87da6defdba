"""Smallest separator between a prefix and a suffix of the features, on the moral graph.

The separator route multiplies a message over the prefix by one over the suffix, both over
the variables the two sides share; its time is proportional to their joint states. The
variables a CPT split must share form a vertex separator of the moral graph (each CPT's scope
is a clique), so the cheapest split is a minimum-weight vertex cut between the prefix and the
suffix features, weights ``log(states)``: one max-flow on the node-split graph. The class is
kept on both sides anyway and is left out of the graph. A prefix feature may sit in the
separator (the suffix's *context*); that multiplies the suffix's table by its states, so its
weight also carries ``log(completions)``. Suffix features never do.

Everything is computed on integer capacities and ordered lists, so the result does not
depend on Python's string hashing.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from boxwatch.offline.bn.network import Network

_SCALE = 1 << 20
_INF = 1 << 62


def prefix_side(
    network: Network,
    scopes: Sequence[Sequence[str]],
    class_variable: str,
    prefix: Sequence[str],
    suffix: Sequence[str],
) -> tuple[set[str], set[str]]:
    """Variables on the prefix's side of a minimum vertex cut, and the cut itself.

    Parameters
    ----------
    network : Network
        For the cardinalities.
    scopes : sequence of variable-name sequences
        The CPT scopes taking part (cliques of the moral graph).
    class_variable : str
        Left out of the graph (it is in every message).
    prefix, suffix : sequences of str
        The features before and after the split.

    Returns
    -------
    (side, cut) : the variables reachable from the prefix without crossing the cut (the cut
    excluded), and the cut's variables. Every scope lies within ``side | cut`` or within the
    complement of ``side``.
    """
    rank = {v: i for i, v in enumerate(network.variables)}
    names = sorted(
        {v for scope in scopes for v in scope if v != class_variable}, key=rank.__getitem__
    )
    index = {v: i for i, v in enumerate(names)}
    pre, suf = set(prefix), set(suffix)
    completions = math.prod(network.card(f) for f in suffix)
    n = 2 * len(names) + 2
    source, sink = n - 2, n - 1
    graph: list[dict[int, int]] = [{} for _ in range(n)]

    def edge(a: int, b: int, cap: int) -> None:
        graph[a][b] = graph[a].get(b, 0) + cap
        graph[b].setdefault(a, 0)

    for v, i in index.items():
        if v in suf:
            weight = _INF
        else:
            weight = (
                round(
                    _SCALE
                    * (math.log(network.card(v)) + (math.log(completions) if v in pre else 0.0))
                )
                + 1
            )
        edge(2 * i, 2 * i + 1, weight)
    for scope in scopes:
        members = [index[v] for v in scope if v != class_variable]
        for a in members:
            for b in members:
                if a != b:
                    edge(2 * a + 1, 2 * b, _INF)
    for f in prefix:
        edge(source, 2 * index[f], _INF)
    for f in suffix:
        edge(2 * index[f] + 1, sink, _INF)
    reached = _max_flow_reach(graph, source, sink)
    side = {v for v, i in index.items() if 2 * i + 1 in reached}
    cut = {v for v, i in index.items() if 2 * i in reached and 2 * i + 1 not in reached}
    return side, cut


def _max_flow_reach(graph: list[dict[int, int]], source: int, sink: int) -> set[int]:
    """Run Edmonds-Karp on the residual ``graph`` in place; the source side of the min cut."""
    while True:
        parent = {source: source}
        queue = deque([source])
        while queue and sink not in parent:
            a = queue.popleft()
            for b, cap in graph[a].items():
                if cap > 0 and b not in parent:
                    parent[b] = a
                    queue.append(b)
        if sink not in parent:
            return set(parent)
        path, b = [], sink
        while b != source:
            path.append((parent[b], b))
            b = parent[b]
        push = min(graph[a][b] for a, b in path)
        for a, b in path:
            graph[a][b] -= push
            graph[b][a] += push
