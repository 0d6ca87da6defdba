"""CNF encoding of a reduced decision diagram, so a SAT solver can answer queries about it.

The encoding is the Tseitin/path scheme of the paper's Table 1, adapted to reduced diagrams
whose edges may skip levels. Variables (one ``IDPool`` per encoding, kept with it):

* ``x[i][j]``: feature ``i`` takes value ``j``; exactly one per feature (ALO + pairwise AMO,
  or past :data:`PAIRWISE_LIMIT` values a chain of prefix ORs: linear, not quadratic, in
  the states), for every feature, whether or not the diagram tests it on a given path;
* ``v[n]``: node ``n`` (internal or sink) lies on the active path; the root is a unit clause;
* ``e[n, m]``: the active path goes from node ``n`` to child ``m`` (one variable per distinct
  child; it covers every value ``j`` of ``n``'s level with ``children[n, j] == m``).

Clauses, for each internal node ``n`` at level ``l`` and each distinct child ``m`` reached on
values ``J``: ``e -> v[n]`` (T2), ``e -> OR_{j in J} x[l][j]`` (T4), ``v[n] & x[l][j] -> e``
for ``j in J`` (T5/P1), ``e -> v[m]`` (T3). For each non-root node ``m``:
``v[m] -> OR of its incoming e`` (P2; a unit ``-v[m]`` when nothing enters it). At most one
sink is active (implied, added for propagation).

Given the feature values, these clauses determine every other variable (by induction along
the levels: ``e[n,m] <-> v[n] & OR_J x``, ``v[m] <-> OR incoming e``), so models correspond
one-to-one to full feature assignments (a chain's prefix ORs are determined by the values
too) and exactly the reached sink is true. The classifier's
output is therefore the literal of a sink, which queries constrain with unit clauses or
assumptions.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from pysat.formula import CNF, IDPool

from boxwatch.agent.diagram import DecisionDiagram

DEFAULT_SOLVER = "minisat22"
PAIRWISE_LIMIT = 64
"""At-most-one over at most this many literals is pairwise (``m (m - 1) / 2`` clauses);
over more -- a feature or class of thousands of states -- a chain of prefix ORs (4 clauses
a literal)."""


def at_most_one(lits: Sequence[int], pool: IDPool, tag: tuple[object, ...]) -> list[list[int]]:
    """Clauses allowing at most one of ``lits`` to be true.

    Pairwise up to :data:`PAIRWISE_LIMIT` literals; past it, with ``s[i]`` (pool ids
    ``(*tag, i)``) defined as ``lits[0] or ... or lits[i]`` in both directions (so every
    model of the literals extends to exactly one model) and ``lits[i] -> not s[i - 1]``.
    """
    if len(lits) <= PAIRWISE_LIMIT:
        return [[-a, -b] for a, b in itertools.combinations(lits, 2)]
    s = [pool.id((*tag, i)) for i in range(len(lits) - 1)]
    clauses = [[-s[0], lits[0]]]
    for i, x in enumerate(lits):
        if i < len(s):
            clauses.append([-x, s[i]])
        if i > 0:
            clauses.append([-x, -s[i - 1]])
            if i < len(s):
                clauses.append([-s[i - 1], s[i]])
                clauses.append([-s[i], s[i - 1], x])
    return clauses


@dataclass
class DiagramEncoding:
    """CNF of one copy of a diagram, with the variable map to decode models.

    Attributes
    ----------
    diagram : DecisionDiagram
    pool : IDPool
        The pool the variables came from (shared by copies encoded together).
    feature_vars : tuple of tuple of int
        ``feature_vars[i][j]`` is the variable of ``features[i] == states[i][j]``.
    node_vars : tuple of int
        Variable per node id (sinks ``0..n_terminals-1`` first).
    clauses : list of list of int
        The clauses of this copy (shared feature variables' clauses appear in the copy that
        created them only).
    """

    diagram: DecisionDiagram
    pool: IDPool
    feature_vars: tuple[tuple[int, ...], ...]
    node_vars: tuple[int, ...]
    clauses: list[list[int]] = field(default_factory=list)

    @property
    def n_vars(self) -> int:
        """Highest variable id used by the pool so far."""
        return self.pool.top

    def sink_literal(self, terminal: str | int) -> int:
        """Literal that is true iff the classifier outputs ``terminal`` (label or sink id)."""
        t = terminal if isinstance(terminal, int) else self.diagram.terminals.index(terminal)
        return self.node_vars[t]

    def cnf(self) -> CNF:
        """The clauses as a PySAT ``CNF``."""
        return CNF(from_clauses=self.clauses)

    def restrict(self, allowed: Mapping[int, Iterable[int]]) -> list[int]:
        """Assumption literals confining feature ``i`` to the values ``allowed[i]``.

        With exactly-one per feature, negating each excluded value is equivalent to the
        premise clause ``OR_{j allowed} x[i][j]`` and works as solver assumptions.
        """
        lits: list[int] = []
        for i, values in allowed.items():
            keep = set(values)
            lits.extend(-v for j, v in enumerate(self.feature_vars[i]) if j not in keep)
        return lits

    def decode(self, model: Sequence[int]) -> np.ndarray:
        """Feature values of a model (``Solver.get_model()``).

        Returns
        -------
        ndarray of shape (n_features,), int64
            State index of every feature.

        Raises
        ------
        ValueError
            When the model does not set exactly one value of some feature.
        """
        true = {lit for lit in model if lit > 0}
        out = np.empty(len(self.feature_vars), dtype=np.int64)
        for i, vars_i in enumerate(self.feature_vars):
            hits = [j for j, v in enumerate(vars_i) if v in true]
            if len(hits) != 1:
                raise ValueError(
                    f"model sets {len(hits)} values of feature "
                    f"{self.diagram.features[i]!r}; expected exactly one"
                )
            out[i] = hits[0]
        return out


def encode_diagram(
    diagram: DecisionDiagram,
    *,
    pool: IDPool | None = None,
    copy: int = 0,
    shared: Mapping[int, Sequence[int]] | None = None,
) -> DiagramEncoding:
    """Encode a reduced (or quasi-reduced) diagram into CNF; see the module docstring.

    Parameters
    ----------
    diagram : DecisionDiagram
    pool : IDPool, optional
        Variable pool; a new one by default. Copies encoded together share one pool.
    copy : int
        Tag of this copy in the pool's variable names (``("x", copy, i, j)`` and so on).
    shared : mapping of int to sequence of int, optional
        Feature index -> existing value variables to reuse (ties copies' features together);
        their exactly-one clauses are left to the copy that created them.

    Returns
    -------
    DiagramEncoding
    """
    pool = IDPool() if pool is None else pool
    shared = shared or {}
    clauses: list[list[int]] = []
    feature_vars: list[tuple[int, ...]] = []
    for i, states in enumerate(diagram.states):
        if i in shared:
            feature_vars.append(tuple(shared[i]))
            continue
        xs = tuple(pool.id(("x", copy, i, j)) for j in range(len(states)))
        feature_vars.append(xs)
        clauses.append(list(xs))
        clauses.extend(at_most_one(xs, pool, ("x-amo", copy, i)))
    nt, k = diagram.n_terminals, diagram.n_nodes
    node_vars = tuple(pool.id(("v", copy, n)) for n in range(nt + k))
    clauses.append([node_vars[diagram.root]])
    incoming: list[list[int]] = [[] for _ in range(nt + k)]
    cards = diagram.cardinalities.tolist()
    levels = diagram.node_level.tolist()
    table = diagram.node_children.tolist()
    for kk in range(k):
        n = nt + kk
        lvl = levels[kk]
        row = table[kk][: cards[lvl]]
        for m in dict.fromkeys(row):
            values = [j for j, c in enumerate(row) if c == m]
            e = pool.id(("e", copy, n, m))
            xs = tuple(feature_vars[lvl][j] for j in values)
            clauses.append([-e, node_vars[n]])
            clauses.append([-e, *xs])
            clauses.extend([-node_vars[n], -x, e] for x in xs)
            clauses.append([-e, node_vars[m]])
            incoming[m].append(e)
    for m in range(nt + k):
        if m != diagram.root:
            clauses.append([-node_vars[m], *incoming[m]])
    clauses.extend(at_most_one(node_vars[:nt], pool, ("v-amo", copy)))
    return DiagramEncoding(diagram, pool, tuple(feature_vars), node_vars, clauses)


def encode_copies(
    diagram: DecisionDiagram, n_copies: int, free: int
) -> tuple[list[DiagramEncoding], list[list[int]]]:
    """Encode ``n_copies`` copies sharing every feature except feature index ``free``.

    Returns the encodings (one pool) and all their clauses concatenated.
    """
    pool = IDPool()
    first = encode_diagram(diagram, pool=pool, copy=0)
    shared = {i: first.feature_vars[i] for i in range(diagram.n_features) if i != free}
    copies = [first] + [
        encode_diagram(diagram, pool=pool, copy=c, shared=shared) for c in range(1, n_copies)
    ]
    clauses = [cl for enc in copies for cl in enc.clauses]
    return copies, clauses


def strictly_increasing(
    low: DiagramEncoding, high: DiagramEncoding, feature: int, order: Sequence[int]
) -> list[list[int]]:
    """Clauses forcing ``feature`` to be strictly higher in ``high`` than in ``low``.

    ``order`` lists the feature's value indices from lowest to highest. With exactly-one per
    copy, ``low = order[a] -> OR_{b > a} high = order[b]`` for every ``a`` says it directly
    (the highest value of ``low`` gets a unit clause forbidding it). Past
    :data:`PAIRWISE_LIMIT` values the ORs (quadratic in all) are suffix-OR variables of
    ``high``, defined in both directions: linear.
    """
    lo_vars, hi_vars = low.feature_vars[feature], high.feature_vars[feature]
    m = len(order)
    if m <= PAIRWISE_LIMIT:
        return [
            [-lo_vars[order[a]], *(hi_vars[order[b]] for b in range(a + 1, m))] for a in range(m)
        ]
    tag = ("above", high.node_vars[0], feature)
    t = [high.pool.id((*tag, b)) for b in range(m)]  # t[b] = high takes order[b..m-1]
    clauses = [[-t[m - 1], hi_vars[order[m - 1]]], [-hi_vars[order[m - 1]], t[m - 1]]]
    for b in range(m - 1):
        x = hi_vars[order[b]]
        clauses += [[-x, t[b]], [-t[b + 1], t[b]], [-t[b], x, t[b + 1]]]
    clauses += [[-lo_vars[order[a]], t[a + 1]] for a in range(m - 1)]
    clauses.append([-lo_vars[order[m - 1]]])
    return clauses
