"""Test helpers: reduced diagrams built from truth tables, and brute-force query answers.

Written apart from the compiler and the verifier so tests can check both against a
construction simple enough to trust: enumerate every assignment.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from bn_reference import REFERENCE_CLASSIFIERS
from locations import SHARED_BN

from boxwatch.agent.diagram import DecisionDiagram


def all_assignments(cards: Sequence[int]) -> np.ndarray:
    """Every assignment, row-major (last feature fastest): shape (prod(cards), n)."""
    return np.indices(tuple(cards)).reshape(len(cards), -1).T.astype(np.int64)


def diagram_from_table(
    table: np.ndarray,
    *,
    terminals: Sequence[str] = ("neg", "pos"),
    positive: str = "pos",
    features: Sequence[str] | None = None,
    states: Sequence[Sequence[str]] | None = None,
) -> DecisionDiagram:
    """Reduced diagram of the function ``table[x]`` (sink ids), built bottom-up with a dict.

    Redundant nodes (all children equal) are skipped, so edges jump levels.
    """
    cards = table.shape
    n = len(cards)
    features = list(features or [f"f{i}" for i in range(n)])
    states = [list(s) for s in states] if states else [[f"s{j}" for j in range(c)] for c in cards]
    nt = len(terminals)
    unique: dict[tuple[int, tuple[int, ...]], int] = {}
    level_of: list[int] = []
    kids: list[tuple[int, ...]] = []
    ids = np.asarray(table, dtype=np.int64)
    for lvl in range(n - 1, -1, -1):
        flat = ids.reshape(-1, cards[lvl])
        out = np.empty(flat.shape[0], dtype=np.int64)
        for r, row in enumerate(map(tuple, flat)):
            if all(c == row[0] for c in row):
                out[r] = row[0]
                continue
            key = (lvl, row)
            if key not in unique:
                unique[key] = nt + len(level_of)
                level_of.append(lvl)
                kids.append(row)
            out[r] = unique[key]
        ids = out.reshape(cards[:lvl]) if lvl else out.reshape(())
    width = max(cards) if n else 1
    children = np.full((len(kids), width), -1, dtype=np.int64)
    for k, row in enumerate(kids):
        children[k, : len(row)] = row
    return DecisionDiagram(
        features=tuple(features),
        states=tuple(tuple(s) for s in states),
        terminals=tuple(terminals),
        node_level=np.array(level_of),
        node_children=children,
        root=int(ids),
        class_variable="C",
        positive=positive,
        threshold=0.5,
    )


def random_table(
    rng: np.random.Generator, cards: Sequence[int], *, kind: str = "additive", n_terminals: int = 2
) -> np.ndarray:
    """A random classifier table: ``additive`` (thresholded sum, with structure), or ``random``."""
    if kind == "random":
        return rng.integers(0, n_terminals, size=tuple(cards))
    total = np.zeros(tuple(cards))
    for i, c in enumerate(cards):
        shape = [1] * len(cards)
        shape[i] = c
        total = total + rng.normal(size=c).reshape(shape)
    if len(cards) >= 2:
        shape = [1] * len(cards)
        shape[0], shape[1] = cards[0], cards[1]
        total = total + rng.normal(size=(cards[0], cards[1])).reshape(shape)
    return (total >= np.median(total)).astype(np.int64)


def table_of(diagram: DecisionDiagram) -> np.ndarray:
    """Sink id of every assignment, as a tensor of shape ``cardinalities``."""
    cards = tuple(int(c) for c in diagram.cardinalities)
    return diagram.predict(all_assignments(cards)).reshape(cards)


def brute_rule(
    table: np.ndarray, allowed: Sequence[Sequence[int]], violating_sinks: Sequence[int]
) -> tuple[int, int]:
    """(inputs inside the premise, violating inputs among them) by enumeration."""
    sub = table[np.ix_(*[np.asarray(a) for a in allowed])]
    return int(sub.size), int(np.isin(sub, list(violating_sinks)).sum())


def cube_all_violate(
    table: np.ndarray,
    allowed: Sequence[Sequence[int]],
    cube: dict[int, int],
    violating_sinks: Sequence[int],
) -> bool:
    """Does every completion of ``cube`` inside the premise violate?"""
    region = [[cube[i]] if i in cube else list(a) for i, a in enumerate(allowed)]
    if any(i in cube and cube[i] not in allowed[i] for i in range(len(allowed))):
        return False
    sub = table[np.ix_(*[np.asarray(a) for a in region])]
    return bool(np.isin(sub, list(violating_sinks)).all())


def brute_monotone(
    table: np.ndarray,
    feature: int,
    order: Sequence[int],
    allowed: Sequence[Sequence[int]],
    positive: int,
    kind: str,
) -> bool:
    """Does the query hold? Enumerates every fixed assignment of the other features."""
    region = [list(a) for a in allowed]
    region[feature] = list(order)
    sub = np.moveaxis(table[np.ix_(*[np.asarray(a) for a in region])], feature, -1)
    seqs = (sub == positive).reshape(-1, len(order))
    for seq in seqs:
        for a, b in itertools.combinations(range(len(order)), 2):
            if kind == "increasing" and seq[a] and not seq[b]:
                return False
            if kind == "decreasing" and not seq[a] and seq[b]:
                return False
        if kind == "fmo" and int(np.count_nonzero(np.diff(seq.astype(np.int8)))) >= 2:
            return False
    return True


DATA = SHARED_BN


def compile_reference(name: str):
    """(diagram, network) of a reference classifier; skips the test without ../shared data.

    Positive state: the class's second state in file order, as in the paper's code.
    """
    import pytest

    from boxwatch.offline.bn.compile import compile_classifier
    from boxwatch.offline.bn.formats import load_network

    path = DATA / f"{name}.bif.gz"
    if not path.is_file():
        pytest.skip(f"{path} is absent (../shared data not available)")
    network = load_network(path)
    spec = REFERENCE_CLASSIFIERS[name].spec(network)
    return compile_classifier(network, spec).diagram, network
