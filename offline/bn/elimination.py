"""Variable-elimination orders on the moral graph, written as opt_einsum contraction paths.

A sum-product over CPTs is planned by eliminating the summed-out variables one at a time,
each time picking the variable with the fewest fill-in edges (``min-fill``) or the smallest
merged table (``min-weight``) in the factors' interaction graph (the moralised network
restricted to the relevant CPTs). Eliminating ``v`` multiplies the factors that mention it,
two at a time, each time the pair that leaves the smallest table; what is left is multiplied
the same way. Ties are broken by the
order in which variables first appear, so the path depends on nothing but the input
(opt_einsum's random-greedy search does not: its paths vary with Python's string hashing).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping, Sequence

from boxwatch.offline.bn.limits import Deadline

HEURISTICS = ("min-fill", "min-weight")


def elimination_path(
    scopes: Sequence[Sequence[str]],
    cards: Mapping[str, int],
    out: Sequence[str],
    heuristic: str = "min-fill",
    deadline: Deadline | None = None,
) -> list[tuple[int, ...]]:
    """An opt_einsum linear path that eliminates every variable not in ``out``.

    ``deadline`` is checked at every step (hundreds of operands take a while: the last
    products pick among every pair left).

    Parameters
    ----------
    scopes : sequence of sequence of str
        The variables of each operand, in operand order.
    cards : mapping of str to int
        Cardinality of every variable.
    out : sequence of str
        Variables kept in the result.
    heuristic : {"min-fill", "min-weight"}

    Returns
    -------
    list of tuple of int
        Positions contracted at each step, as :func:`opt_einsum.contract` takes them (the
        result of a step goes to the end of the operand list).
    """
    if heuristic not in HEURISTICS:
        raise ValueError(f"heuristic {heuristic!r} is not one of {list(HEURISTICS)}")
    keep = set(out)
    rank: dict[str, int] = {}
    for scope in scopes:
        for v in scope:
            rank.setdefault(v, len(rank))
    nbr: dict[str, set[str]] = {v: set() for v in rank}
    for scope in scopes:
        for a in scope:
            nbr[a].update(u for u in scope if u != a)
    ops = [tuple(dict.fromkeys(s)) for s in scopes]
    hidden = {v for v in rank if v not in keep}
    path: list[tuple[int, ...]] = []

    def score(v: str) -> tuple[int, int, int]:
        weight = math.prod(cards[u] for u in nbr[v]) * cards[v]
        if heuristic == "min-weight":
            return (weight, 0, rank[v])
        fill = sum(
            1
            for a, b in itertools.combinations(sorted(nbr[v], key=rank.__getitem__), 2)
            if b not in nbr[a]
        )
        return (fill, weight, rank[v])

    def size(i: int) -> int:
        return math.prod(cards[u] for u in ops[i])

    def eliminate(u: str) -> None:
        """Remove ``u`` from the graph, joining its neighbours; rescore them."""
        near = nbr.pop(u)
        for a in near:
            nbr[a].discard(u)
            nbr[a].update(w for w in near if w != a)
        for a in near:
            if a in hidden:
                scores[a] = score(a)

    def merge(positions: Sequence[int]) -> None:
        """Contract ``positions``; sum out the variables no other operand or the output needs."""
        merged = tuple(dict.fromkeys(u for i in positions for u in ops[i]))
        for i in sorted(positions, reverse=True):
            del ops[i]
        elsewhere = keep.union(*ops)
        summed = [u for u in merged if u not in elsewhere]
        hidden.difference_update(summed)
        ops.append(tuple(u for u in merged if u in elsewhere))
        path.append(tuple(positions))
        for u in summed:
            eliminate(u)

    def best_pair(group: Sequence[int]) -> list[int]:
        """The pair of ``group`` whose contraction leaves the smallest table."""
        if len(group) < 2:
            return list(group)
        uses = Counter(u for scope in ops for u in scope)

        def left(pair: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
            a, b = ops[pair[0]], ops[pair[1]]
            union = set(a).union(b)
            cells = math.prod(cards[u] for u in union if u in keep or uses[u] > (u in a) + (u in b))
            return cells, pair

        best = min(itertools.combinations(sorted(group), 2), key=left)
        return list(best)

    def step() -> None:
        if deadline is not None:
            deadline.check(f"a {heuristic} path: step {len(path):,} of {len(scopes) - 1:,}")

    scores = {v: score(v) for v in hidden}
    while hidden:
        v = min(hidden, key=scores.__getitem__)
        while v in hidden:
            step()
            merge(best_pair([i for i, s in enumerate(ops) if v in s]))
    while len(ops) > 1:
        step()
        merge(best_pair(range(len(ops))))
    return path
