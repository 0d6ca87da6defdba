"""Compile a Bayesian-network classifier into its exact, canonical decision diagram (MDD).

Two regimes behind :func:`compile_classifier`:

* ``joint`` (fast path): one ``opt_einsum`` contraction gives ``P(C, X)`` over the features
  in diagram order; the posterior is thresholded into sink ids and the quasi-reduced diagram
  is built bottom-up, one ``unique rows`` per level. Needs the joint table in memory.
* ``decompose``: the features are split at a level ``k`` into a prefix and a suffix, each
  enumerated on its own, so memory follows ``max(prefixes, completions)`` and not their
  product. Prefixes with the same sub-classifier over the suffix are merged (Shih, Choi &
  Darwiche's equivalence). Two routes:

  - *additive* (binary class, every ancestor of a feature is a feature or the class, strictly
    positive CPTs; naive Bayes and tree-augmented naive Bayes): the decision is
    ``sum_l W_l(x_l | context) >= tau`` in log-odds, and the nodes of level ``l`` are the
    intervals between the sorted completion sums of levels ``l..n-1`` per context (the
    "equivalence intervals"). Handles 1e12 inputs and more.
  - *separator* (any network): ``P(c, u, v) = sum_Z U[u, Z] L[ctx(u), v, Z]`` over the
    hidden variables ``Z`` shared by the prefix's and the suffix's CPTs; the decisions of
    each prefix over all completions are computed block by block with matrix products and
    equal rows (identical sub-classifiers) merged. Memory is ``distinct sub-classifiers x
    completions``; time is still the size of the feature space.

Every input whose posterior lies within :data:`TIE_TOLERANCE` of the threshold is a *tie*:
ties are counted and decided positive (``>=``), i.e. the decision is
``P(C = positive | x) >= threshold - TIE_TOLERANCE`` on every route, so both regimes agree
on exact ties computed with different rounding.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import opt_einsum

from boxwatch.agent.diagram import DecisionDiagram, unique_rows
from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn_classifier import ClassifierSpec, ResolvedSpec, resolve_spec
from boxwatch.offline.bn_io import Network, load_network

TIE_TOLERANCE = 1e-9
JOINT_MAX_INPUTS = 1 << 24
JOINT_HARD_LIMIT = 1 << 28
DECOMPOSE_MAX_SIDE = 1 << 24
SEPARATOR_MAX_INPUTS = 1 << 34
_BLOCK_CELLS = 1 << 23
METHODS = ("auto", "joint", "decompose")


@dataclass(frozen=True)
class CompileResult:
    """A compiled classifier and the figures users ask about.

    Attributes
    ----------
    diagram : DecisionDiagram
        The canonical reduced diagram.
    method : str
        ``"joint"``, ``"decompose/additive"`` or ``"decompose/separator"``.
    nodes, nodes_quasi : int
        Internal nodes of the reduced and of the quasi-reduced diagram.
    nodes_per_level, nodes_quasi_per_level : tuple of int
    edges : int
        Edges of the reduced diagram.
    positives, inputs : int
        Inputs decided positive; all inputs (product of the cardinalities).
    ties : int
        Inputs whose posterior is within ``tie_tolerance`` of the threshold (decided ``>=``).
    impossible : int
        Inputs of probability 0 (posterior undefined; decided negative).
    seconds : float
        Compilation time, excluding parsing.
    posterior : ndarray of shape (card_0, ..., card_{n-1}) or None
        ``P(C = positive | x)`` in diagram order, kept by the joint route only.
    """

    diagram: DecisionDiagram
    method: str
    nodes: int
    nodes_quasi: int
    nodes_per_level: tuple[int, ...]
    nodes_quasi_per_level: tuple[int, ...]
    edges: int
    positives: int
    inputs: int
    ties: int
    impossible: int
    seconds: float
    tie_tolerance: float = TIE_TOLERANCE
    posterior: np.ndarray | None = None

    def posterior_of(self, X: Any) -> np.ndarray:
        """``P(C = positive | x)`` per assignment, from the kept joint table.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), or records
            As for :meth:`DecisionDiagram.predict`.

        Returns
        -------
        ndarray of shape (n_samples,); NaN for inputs of probability 0.

        Raises
        ------
        ValueError
            When the decomposition route compiled the classifier (no table was kept).
        """
        if self.posterior is None:
            raise ValueError(
                f"no posterior table: the {self.method} route keeps none; "
                "compile with method='joint' to keep it"
            )
        X = self.diagram.check_indices(X)
        return self.posterior[tuple(X.T)]

    def summary(self) -> dict[str, Any]:
        """JSON-able figures (what ``boxwatch compile-bn --json`` prints)."""
        d = self.diagram
        return {
            "class_variable": d.class_variable,
            "positive": d.positive,
            "threshold": d.threshold,
            "features": sorted(d.features),
            "order": list(d.features),
            "terminals": list(d.terminals),
            "method": self.method,
            "nodes": self.nodes,
            "nodes_quasi": self.nodes_quasi,
            "nodes_per_level": list(self.nodes_per_level),
            "nodes_quasi_per_level": list(self.nodes_quasi_per_level),
            "edges": self.edges,
            "positives": self.positives,
            "inputs": self.inputs,
            "ties": self.ties,
            "tie_tolerance": self.tie_tolerance,
            "impossible": self.impossible,
            "constant": d.root < d.n_terminals,
            "seconds": self.seconds,
        }


def compile_classifier(
    network: Network | str | Any,
    spec: ClassifierSpec | ResolvedSpec,
    *,
    method: str = "auto",
) -> CompileResult:
    """Compile ``P(C = positive | x) >= threshold`` into its canonical decision diagram.

    Parameters
    ----------
    network : Network, path or pgmpy ``DiscreteBayesianNetwork``
    spec : ClassifierSpec or ResolvedSpec
    method : {"auto", "joint", "decompose"}
        ``auto`` takes the joint route while the feature space has at most
        :data:`JOINT_MAX_INPUTS` inputs, else the decomposition.

    Returns
    -------
    CompileResult

    Raises
    ------
    ConfigError
        For an invalid spec, unknown method, or a classifier too large for every route.
    """
    if method not in METHODS:
        raise ConfigError(f"method {method!r} is not one of {list(METHODS)}")
    if not isinstance(network, Network):
        network = load_network(network)
    if not isinstance(spec, ResolvedSpec):
        spec = resolve_spec(network, spec)
    start = time.perf_counter()
    cards = [network.card(f) for f in spec.order]
    inputs = math.prod(cards)
    if method == "auto":
        method = "joint" if inputs <= JOINT_MAX_INPUTS else "decompose"
    if method == "joint" and inputs > JOINT_HARD_LIMIT:
        raise ConfigError(
            f"{inputs:.3g} inputs is too many for the joint table (at most "
            f"{JOINT_HARD_LIMIT:.3g}); use method 'decompose' or 'auto'"
        )
    if method == "joint" or len(spec.order) < 2:
        built = _compile_joint(network, spec)
    elif _additive_applies(network, spec):
        built = _compile_additive(network, spec)
    else:
        built = _compile_separator(network, spec)
    diagram = built.diagram
    counts = diagram.counts()
    seconds = time.perf_counter() - start
    return CompileResult(
        diagram=diagram,
        method=built.method,
        nodes=diagram.n_nodes,
        nodes_quasi=built.nodes_quasi,
        nodes_per_level=diagram.nodes_per_level,
        nodes_quasi_per_level=built.nodes_quasi_per_level,
        edges=diagram.n_edges,
        positives=counts[diagram.positive],
        inputs=inputs,
        ties=built.ties,
        impossible=built.impossible,
        seconds=seconds,
        posterior=built.posterior,
    )


# ---------------------------------------------------------------------------- shared pieces
@dataclass
class _Built:
    diagram: DecisionDiagram
    method: str
    nodes_quasi: int
    nodes_quasi_per_level: tuple[int, ...]
    ties: int
    impossible: int
    posterior: np.ndarray | None = None


def terminals_for(network: Network, class_variable: str, positive: str) -> tuple[tuple[str, ...], int]:
    """Sink labels and the positive sink id.

    A binary class keeps its two states in the network's order; a class with more states
    gets ``(f"not {positive}", positive)``.
    """
    states = network.states[class_variable]
    if len(states) == 2:
        return tuple(states), states.index(positive)
    return (f"not {positive}", positive), 1


class _NodeStore:
    """Accumulates quasi-reduced nodes level by level; ids start after the sinks."""

    def __init__(self, n_terminals: int, cards: Sequence[int]):
        self.nt = n_terminals
        self.cards = list(cards)
        self.width = max(self.cards) if self.cards else 1
        self.levels: list[np.ndarray] = []
        self.rows: list[np.ndarray] = []
        self.count = 0
        self.per_level = [0] * len(self.cards)

    def add_level(self, level: int, rows: np.ndarray) -> np.ndarray:
        """Store unique ``rows`` (n, card) as nodes of ``level``; return their ids."""
        n = rows.shape[0]
        padded = np.full((n, self.width), -1, dtype=np.int64)
        padded[:, : rows.shape[1]] = rows
        self.levels.append(np.full(n, level, dtype=np.int64))
        self.rows.append(padded)
        ids = self.nt + self.count + np.arange(n, dtype=np.int64)
        self.count += n
        self.per_level[level] += n
        return ids

    def bottom_up(self, table: np.ndarray, first_level: int) -> np.ndarray:
        """Merge equal rows level by level, deepest first.

        ``table`` has shape ``(m, card_first, ..., card_last)`` and holds node ids of the
        level below ``last``; returns shape ``(m,)``: the ids at ``first_level``.
        """
        ids = table
        for level in range(first_level + table.ndim - 2, first_level - 1, -1):
            card = self.cards[level]
            rows = ids.reshape(-1, card)
            uniq, inverse = unique_rows(rows)
            node_ids = self.add_level(level, uniq)
            ids = node_ids[inverse].reshape(ids.shape[:-1])
        return ids

    def diagram(self, root: int, **kw: Any) -> DecisionDiagram:
        """The canonical diagram of the stored nodes below ``root``."""
        if self.levels:
            level = np.concatenate(self.levels)
            children = np.concatenate(self.rows)
        else:
            level = np.zeros(0, dtype=np.int64)
            children = np.zeros((0, self.width), dtype=np.int64)
        return DecisionDiagram.canonical(
            node_level=level, node_children=children, root=root, **kw
        )


def _diagram_kw(network: Network, spec: ResolvedSpec) -> dict[str, Any]:
    terminals, _ = terminals_for(network, spec.class_variable, spec.positive)
    return {
        "features": spec.order,
        "states": [network.states[f] for f in spec.order],
        "terminals": terminals,
        "class_variable": spec.class_variable,
        "positive": spec.positive,
        "threshold": spec.threshold,
    }


def _relevant_factors(network: Network, keep: Sequence[str]) -> list[tuple[tuple[str, ...], np.ndarray]]:
    """CPTs of ``keep`` and their ancestors (the rest are barren and sum to one)."""
    rel = network.ancestors(keep)
    return [
        ((*network.parents[v], v), network.cpts[v]) for v in network.variables if v in rel
    ]


def _contract(
    factors: Sequence[tuple[tuple[str, ...], np.ndarray]], out: Sequence[str]
) -> np.ndarray:
    """``sum`` over all variables not in ``out`` of the product of ``factors``."""
    names: dict[str, str] = {}
    for scope, _ in factors:
        for v in scope:
            names.setdefault(v, opt_einsum.get_symbol(len(names)))
    subs = ",".join("".join(names[v] for v in scope) for scope, _ in factors)
    expr = f"{subs}->{''.join(names[v] for v in out)}"
    return opt_einsum.contract(expr, *[t for _, t in factors], optimize="auto")


def _decide(
    num: np.ndarray, den: np.ndarray, threshold: float
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Posterior, decisions (``>= T - tol``), ties and impossible inputs of a block."""
    with np.errstate(invalid="ignore", divide="ignore"):
        post = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    decision = post >= threshold - TIE_TOLERANCE
    ties = int(np.count_nonzero(np.abs(post - threshold) <= TIE_TOLERANCE))
    impossible = int(np.count_nonzero(~(den > 0)))
    return post, decision, ties, impossible


def _positive_index(network: Network, spec: ResolvedSpec) -> int:
    """Index of the positive state among the class variable's states."""
    return network.states[spec.class_variable].index(spec.positive)


# ---------------------------------------------------------------------------- joint route
def _compile_joint(network: Network, spec: ResolvedSpec) -> _Built:
    """Fast path: the joint table over class and features, thresholded, unique rows upward."""
    cls, order = spec.class_variable, spec.order
    joint = _contract(_relevant_factors(network, [cls, *order]), [cls, *order])
    pos = _positive_index(network, spec)
    post, decision, ties, impossible = _decide(joint[pos], joint.sum(axis=0), spec.threshold)
    terminals, pos_sink = terminals_for(network, cls, spec.positive)
    sinks = np.where(decision, pos_sink, 1 - pos_sink).astype(np.int64)
    store = _NodeStore(len(terminals), [network.card(f) for f in order])
    root = int(store.bottom_up(sinks[None, ...], 0)[0])
    diagram = store.diagram(root, **_diagram_kw(network, spec))
    return _Built(diagram, "joint", store.count, tuple(store.per_level), ties, impossible, post)


def _split_level(cards: Sequence[int], contexts: int = 1) -> int:
    """Split ``k`` in 1..n-1 minimising the larger of prefixes and completions."""
    best, best_k = None, 1
    for k in range(1, len(cards)):
        cost = max(math.prod(cards[:k]), math.prod(cards[k:]) * contexts)
        if best is None or cost < best:
            best, best_k = cost, k
    return best_k


# ---------------------------------------------------------------------------- separator route
def _compile_separator(network: Network, spec: ResolvedSpec) -> _Built:
    """Decomposition for any network: prefix and suffix messages over a separator."""
    cls, order = spec.class_variable, list(spec.order)
    cards = [network.card(f) for f in order]
    k = _split_level(cards)
    prefix, suffix = order[:k], order[k:]
    n_pre, n_suf = math.prod(cards[:k]), math.prod(cards[k:])
    if n_pre > DECOMPOSE_MAX_SIDE or n_suf > DECOMPOSE_MAX_SIDE or n_pre * n_suf > SEPARATOR_MAX_INPUTS:
        raise ConfigError(
            f"{network.source}: {n_pre * n_suf:.3g} inputs is beyond the separator "
            f"decomposition (at most {SEPARATOR_MAX_INPUTS:.3g}): hidden variables link the "
            "features, so equivalence intervals do not apply; give fewer features"
        )
    factors = _relevant_factors(network, [cls, *order])
    sset = set(suffix)
    lower = [f for f in factors if sset.intersection(f[0])]
    upper = [f for f in factors if not sset.intersection(f[0])]
    vars_up = {v for scope, _ in upper for v in scope}
    vars_lo = {v for scope, _ in lower for v in scope}
    feats = set(order)
    shared = [v for v in network.variables if v in vars_up and v in vars_lo and v not in feats]
    z = [cls, *(v for v in shared if v != cls)]
    ctx = [f for f in prefix if f in vars_lo]
    ones = [((v,), np.ones(network.card(v))) for v in z]
    pre_ones = [((f,), np.ones(network.card(f))) for f in prefix]
    up = _contract(upper + ones + pre_ones, [*prefix, *z]).reshape(n_pre, -1)
    lo = _contract(lower + ones + [((f,), np.ones(network.card(f))) for f in ctx],
                   [*ctx, *suffix, *z])
    n_ctx = math.prod(network.card(f) for f in ctx)
    zc = network.card(cls)
    lo = lo.reshape(n_ctx, n_suf, zc, -1)
    up = up.reshape(n_pre, zc, -1)
    pos = _positive_index(network, spec)
    # context index of every prefix (mixed radix over ctx, in prefix-grid order)
    grid = np.indices(cards[:k]).reshape(k, -1)
    ctx_idx = np.zeros(n_pre, dtype=np.int64)
    for f in ctx:
        ctx_idx = ctx_idx * network.card(f) + grid[prefix.index(f)]
    terminals, pos_sink = terminals_for(network, cls, spec.positive)
    key_of_prefix = np.empty(n_pre, dtype=np.int64)
    patterns: dict[bytes, int] = {}
    rows: list[np.ndarray] = []
    ties = impossible = 0
    block = max(1, _BLOCK_CELLS // max(1, n_suf))
    for c in range(n_ctx):
        members = np.nonzero(ctx_idx == c)[0]
        l_pos = lo[c][:, pos, :]
        for s in range(0, members.size, block):
            part = members[s : s + block]
            u = up[part]
            num = u[:, pos, :] @ l_pos.T
            den = np.einsum("bcr,vcr->bv", u, lo[c])
            _, decision, t, imp = _decide(num, den, spec.threshold)
            ties += t
            impossible += imp
            packed = np.ascontiguousarray(np.packbits(decision, axis=1))
            keys = packed.view(np.dtype((np.void, packed.shape[1]))).reshape(-1)
            _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
            local = np.empty(first.size, dtype=np.int64)
            for q, f in enumerate(first):
                key = keys[f].tobytes()
                idx = patterns.get(key)
                if idx is None:
                    idx = patterns[key] = len(rows)
                    rows.append(np.where(decision[f], pos_sink, 1 - pos_sink))
                local[q] = idx
            key_of_prefix[part] = local[inverse.reshape(-1)]
    store = _NodeStore(len(terminals), cards)
    table = np.stack(rows).astype(np.int64).reshape(len(rows), *cards[k:])
    level_k_ids = store.bottom_up(table, k)
    prefix_table = level_k_ids[key_of_prefix].reshape(1, *cards[:k])
    root = int(store.bottom_up(prefix_table, 0)[0])
    diagram = store.diagram(root, **_diagram_kw(network, spec))
    quasi = diagram.quasi_nodes_per_level()
    return _Built(diagram, "decompose/separator", sum(quasi), quasi, ties, impossible)


# ---------------------------------------------------------------------------- additive route
def _additive_applies(network: Network, spec: ResolvedSpec) -> bool:
    """Binary class, no hidden ancestors, strictly positive relevant CPTs."""
    cls = spec.class_variable
    if network.card(cls) != 2:
        return False
    keep = [cls, *spec.order]
    if network.ancestors(keep) != set(keep):
        return False
    return all((network.cpts[v] > 0).all() for v in keep)


def _compile_additive(network: Network, spec: ResolvedSpec) -> _Built:
    """Equivalence intervals over log-odds sums with per-level feature contexts."""
    cls, order = spec.class_variable, list(spec.order)
    n = len(order)
    cards = [network.card(f) for f in order]
    pos_of = {f: i for i, f in enumerate(order)}
    pos = _positive_index(network, spec)
    terminals, pos_sink = terminals_for(network, cls, spec.positive)
    # log-odds terms: level -> list of (feature positions in scope, table over them)
    const = 0.0
    terms: list[list[tuple[list[int], np.ndarray]]] = [[] for _ in range(n)]
    for v in [cls, *order]:
        scope = (*network.parents[v], v)
        if cls not in scope:
            continue
        table = np.moveaxis(np.log(network.cpts[v]), scope.index(cls), 0)
        w = table[pos] - table[1 - pos]
        fscope = [pos_of[u] for u in scope if u != cls]
        if not fscope:
            const += float(w)
            continue
        perm = np.argsort(fscope)
        terms[max(fscope)].append((sorted(fscope), np.transpose(w, perm)))
    tau = _logit(spec.threshold - TIE_TOLERANCE) - const
    tau_hi = _logit(spec.threshold + TIE_TOLERANCE) - const
    # context of level l: earlier features in the scope of a term at level >= l
    ctx: list[list[int]] = []
    for lvl in range(n + 1):
        need = {p for t in terms[lvl:] for sc, _ in t for p in sc if p < lvl}
        ctx.append(sorted(need))
    k = _split_level(cards, contexts=max(1, max(math.prod(cards[p] for p in c) for c in ctx)))
    n_pre, n_suf = math.prod(cards[:k]), math.prod(cards[k:])
    worst_ctx = max(math.prod(cards[p] for p in c) for c in ctx[k:])
    if n_pre > DECOMPOSE_MAX_SIDE or n_suf * worst_ctx > DECOMPOSE_MAX_SIDE:
        raise ConfigError(
            f"{network.source}: split at level {k} leaves {n_pre} prefixes and "
            f"{n_suf * worst_ctx} completions; both must be at most {DECOMPOSE_MAX_SIDE}"
        )

    def level_weights(lvl: int, values: dict[int, np.ndarray]) -> np.ndarray:
        """Sum of level ``lvl``'s terms for arrays of feature values (broadcast)."""
        total = 0.0
        for sc, w in terms[lvl]:
            total = total + w[tuple(values[p] for p in sc)]
        return np.asarray(total, dtype=np.float64)

    def ctx_index(lvl: int, values: dict[int, np.ndarray]) -> np.ndarray:
        """Mixed-radix index of level ``lvl``'s context for arrays of feature values."""
        idx: Any = np.int64(0)
        for p in ctx[lvl]:
            idx = idx * cards[p] + values[p]
        return idx

    def ctx_values(lvl: int) -> dict[int, np.ndarray]:
        """Arrays of feature values for every context index of level ``lvl``."""
        c = ctx[lvl]
        grid = np.indices([cards[p] for p in c]).reshape(len(c), -1) if c else np.zeros((0, 1), np.int64)
        return {p: grid[i] for i, p in enumerate(c)}

    # completion sums: sums[l] has shape (n_ctx_l, prod cards[l:]), suffix in grid order
    sums: dict[int, np.ndarray] = {n: np.zeros((1, 1))}
    for lvl in range(n - 1, k - 1, -1):
        cv = ctx_values(lvl)
        n_c = next(iter(cv.values())).shape[0] if cv else 1
        x = np.arange(cards[lvl])
        vals = {p: a[:, None] for p, a in cv.items()}
        vals[lvl] = x[None, :]
        w = np.broadcast_to(level_weights(lvl, vals), (n_c, cards[lvl]))
        nxt = np.broadcast_to(ctx_index(lvl + 1, vals), (n_c, cards[lvl]))
        below = sums[lvl + 1]
        sums[lvl] = (w[:, :, None] + below[nxt]).reshape(n_c, -1)
    sorted_all = {lvl: np.sort(s, axis=1) for lvl, s in sums.items()}
    uniq = {
        lvl: [np.unique(row) for row in s] for lvl, s in sorted_all.items()
    }
    # lower half: nodes (level, ctx, j); id arrays per level, deepest first
    store = _NodeStore(len(terminals), cards)
    # level n: ctx 0, j = 0 -> 0 >= theta -> positive; j = 1 -> negative
    ids_below = [np.array([pos_sink, 1 - pos_sink], dtype=np.int64)]
    for lvl in range(n - 1, k - 1, -1):
        cv = ctx_values(lvl)
        ids_here = []
        for c, u in enumerate(uniq[lvl]):
            theta = _representatives(u)
            vals = {p: a[c] for p, a in cv.items()}
            vals[lvl] = np.arange(cards[lvl])
            w = np.broadcast_to(level_weights(lvl, vals), (cards[lvl],))
            nxt = np.broadcast_to(ctx_index(lvl + 1, vals), (cards[lvl],))
            child = np.empty((theta.size, cards[lvl]), dtype=np.int64)
            for x in range(cards[lvl]):
                below_u = uniq[lvl + 1][nxt[x]]
                j = np.searchsorted(below_u, theta - w[x], side="left")
                child[:, x] = ids_below[nxt[x]][j]
            ids_here.append(store.add_level(lvl, child))
        ids_below = ids_here
    # upper half: every prefix's sum and context -> node at level k
    grid = np.indices(cards[:k]).reshape(k, -1)
    values = {p: grid[p] for p in range(k)}
    prefix_sum = np.zeros(n_pre)
    for lvl in range(k):
        prefix_sum = prefix_sum + level_weights(lvl, values)
    cidx = np.broadcast_to(ctx_index(k, values), (n_pre,))
    theta_u = tau - prefix_sum
    level_k = np.empty(n_pre, dtype=np.int64)
    ties = 0
    for c in range(len(uniq[k])):
        sel = np.nonzero(cidx == c)[0]
        j = np.searchsorted(uniq[k][c], theta_u[sel], side="left")
        level_k[sel] = ids_below[c][j]
        full = sorted_all[k][c]
        hi = tau_hi - prefix_sum[sel]
        ties += int(
            (np.searchsorted(full, hi, side="right") - np.searchsorted(full, theta_u[sel], side="left")).sum()
        )
    root = int(store.bottom_up(level_k.reshape(1, *cards[:k]), 0)[0])
    diagram = store.diagram(root, **_diagram_kw(network, spec))
    quasi = diagram.quasi_nodes_per_level()
    return _Built(diagram, "decompose/additive", sum(quasi), quasi, ties, 0)


def _logit(p: float) -> float:
    """log(p / (1 - p)), infinite outside (0, 1)."""
    if p <= 0.0:
        return -math.inf
    if p >= 1.0:
        return math.inf
    return math.log(p / (1.0 - p))


def _representatives(u: np.ndarray) -> np.ndarray:
    """One threshold inside each interval of sorted distinct sums ``u`` (``len(u) + 1``)."""
    theta = np.empty(u.size + 1)
    theta[0] = -np.inf
    theta[-1] = np.inf
    theta[1:-1] = (u[:-1] + u[1:]) / 2.0
    return theta
