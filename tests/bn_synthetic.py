"""Seeded synthetic Bayesian networks: naive Bayes, chain TAN and random DAGs.

For tests and benchmarks that must run without the shared network files, and for feature
spaces far past enumeration (40 binary features: 1.1e12 inputs).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from boxwatch.offline.bn.network import Network


def _cpt(rng: np.random.Generator, shape: Sequence[int], floor: float) -> np.ndarray:
    """Random CPT of ``shape`` (last axis = the variable), entries >= ``floor``."""
    raw = rng.dirichlet(np.ones(shape[-1]), size=tuple(shape[:-1]))
    return floor + (1.0 - floor * shape[-1]) * raw


def _network(
    name: str,
    order: Sequence[str],
    states: dict[str, tuple[str, ...]],
    parents: dict[str, tuple[str, ...]],
    rng: np.random.Generator,
    floor: float,
) -> Network:
    cpts = {
        v: _cpt(rng, [*(len(states[p]) for p in parents[v]), len(states[v])], floor) for v in order
    }
    return Network(
        name=name,
        variables=tuple(order),
        states=states,
        parents=parents,
        cpts=cpts,
        source=f"<{name}>",
    )


def naive_bayes(n_features: int, *, seed: int, card: int = 2, floor: float = 0.01) -> Network:
    """Class ``C`` (states ``neg``, ``pos``) with ``n_features`` children ``x0 .. x{n-1}``."""
    rng = np.random.default_rng(seed)
    feats = [f"x{i}" for i in range(n_features)]
    states = {"C": ("neg", "pos"), **{f: tuple(f"v{j}" for j in range(card)) for f in feats}}
    parents = {"C": (), **{f: ("C",) for f in feats}}
    return _network(f"naive_bayes_{n_features}", ["C", *feats], states, parents, rng, floor)


def chain_tan(n_features: int, *, seed: int, card: int = 2, floor: float = 0.01) -> Network:
    """Tree-augmented naive Bayes whose feature tree is the chain ``x0 -> x1 -> ...``."""
    rng = np.random.default_rng(seed)
    feats = [f"x{i}" for i in range(n_features)]
    states = {"C": ("neg", "pos"), **{f: tuple(f"v{j}" for j in range(card)) for f in feats}}
    parents = {"C": (), feats[0]: ("C",)}
    parents.update({feats[i]: ("C", feats[i - 1]) for i in range(1, n_features)})
    return _network(f"chain_tan_{n_features}", ["C", *feats], states, parents, rng, floor)


def random_dag(
    n_variables: int,
    *,
    seed: int,
    max_parents: int = 3,
    max_card: int = 3,
    floor: float = 0.0,
) -> Network:
    """Random DAG over ``v0 .. v{n-1}`` (edges go forward), cardinalities 2..max_card.

    With ``floor=0`` some CPT entries may be tiny but not zero; pass a ``floor`` to keep them
    bounded away from zero.
    """
    rng = np.random.default_rng(seed)
    names = [f"v{i}" for i in range(n_variables)]
    states = {v: tuple(f"s{j}" for j in range(int(rng.integers(2, max_card + 1)))) for v in names}
    parents: dict[str, tuple[str, ...]] = {}
    for i, v in enumerate(names):
        k = int(rng.integers(0, min(i, max_parents) + 1))
        chosen = sorted(rng.choice(i, size=k, replace=False)) if k else []
        parents[v] = tuple(names[j] for j in chosen)
    return _network(f"random_dag_{n_variables}_{seed}", names, states, parents, rng, floor)


def qmr(
    n_roots: int, n_features: int, *, seed: int, per_feature: int = 2, floor: float = 0.05
) -> Network:
    """QMR-like network: class ``C`` and hidden roots ``h0 ..`` over feature leaves ``f0 ..``.

    Each feature has ``per_feature`` hidden roots as parents, drawn at random; ``f0`` and
    ``f1`` also have the class. Roots are listed before features (file order), features in
    index order, so a depth-first search from the class reaches the features by root, not by
    how many roots they share (tcc4e's shape, small).
    """
    rng = np.random.default_rng(seed)
    roots = [f"h{i}" for i in range(n_roots)]
    feats = [f"f{i}" for i in range(n_features)]
    states: dict[str, tuple[str, ...]] = {
        v: ("neg", "pos") if v == "C" else ("0", "1") for v in ["C", *roots, *feats]
    }
    parents: dict[str, tuple[str, ...]] = {"C": (), **{h: () for h in roots}}
    for i, f in enumerate(feats):
        chosen = sorted(rng.choice(n_roots, size=per_feature, replace=False))
        parents[f] = (*(("C",) if i < 2 else ()), *(roots[j] for j in chosen))
    return _network(
        f"qmr_{n_roots}_{n_features}_{seed}", ["C", *roots, *feats], states, parents, rng, floor
    )
