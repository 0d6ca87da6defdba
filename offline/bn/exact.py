"""Exact decisions: a float error bound per route, and exact rational arithmetic inside it.

The classifier a network defines is ``P(C = positive | x) >= T`` with the CPT numbers as
written in the file (:meth:`~boxwatch.offline.bn.io.Network.exact_cpt`) and ``T`` the
decimal the user wrote (:func:`exact_threshold`). The routes compute ``P(C, x)`` in float64;
each knows how many roundings every term of its sums can meet, which gives a rigorous bound
on the float margin's error (:class:`ErrorBound`; the derivation is in
``docs/exactness.md``). Inputs whose float margin lies within that bound are recomputed in
exact integer arithmetic (:class:`ExactJoint`: variable elimination over the relevant CPTs
scaled to integers, restricted to those inputs) and decided exactly; every other input's
float decision is provably the exact one.

The same bound serves any margin of the form ``a - t * b`` with nonnegative ``a`` and ``b``
(an argmax classifier compares ``P(c, x) - P(c', x)``: ``t = 1``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from boxwatch.offline.bn.io import Network

U = 2.0**-53
"""Unit roundoff of float64 (round to nearest)."""
TINY = 2.0**-1074
"""Smallest positive float64: the most an underflowing product or conversion loses."""
NO_UNDERFLOW_LOG2 = -1000.0
"""Products of CPT entries at least ``2**NO_UNDERFLOW_LOG2`` never leave the normal range."""
CHUNK = 1 << 22
EXACT_LIMIT = 1 << 20
"""Inputs one compilation decides exactly at most; past it the rest are reported uncertified."""
EXACT_CELLS = 1 << 18
_ZERO_TEXT = re.compile(r"[+-]?(0+\.?0*|\.0+)([eE][+-]?\d+)?")


def exact_threshold(threshold: float) -> Fraction:
    """The threshold as the user wrote it: the shortest decimal of the float (0.98 is 49/50)."""
    return Fraction(repr(float(threshold)))


def gamma(n: int) -> float:
    """``n u / (1 - n u)``: the relative error of ``n`` roundings of nonnegative terms."""
    nu = n * U
    return math.inf if nu >= 0.5 else nu / (1.0 - nu)


def contraction_roundings(info: Any) -> int:
    """Roundings any one term meets in a planned opt_einsum contraction (its ``PathInfo``).

    A step multiplying ``m`` operands and summing ``s`` index states rounds each term at most
    ``(m - 1) + (s - 1)`` times (any summation order, BLAS included); a term passes through
    every step of the tree, so the counts add up.
    """
    total = 0
    for entry in info.contraction_list:
        inputs, out = entry[2].split("->")
        operands = inputs.split(",")
        summed = set("".join(operands)) - set(out)
        total += len(operands) - 1 + math.prod(info.size_dict[c] for c in summed) - 1
    return total


@dataclass(frozen=True)
class ErrorBound:
    """Error bound of a float margin ``num - t * den`` computed from float ``num``, ``den``.

    ``num`` meets at most ``k_num`` relative roundings (CPT conversions included) and ``den``
    ``k_den``; each may also be off by an absolute ``abs_num`` / ``abs_den`` (underflow; 0
    when no product of CPT entries can leave the normal range). ``t`` is the float
    threshold, itself within ``u * t`` of the exact one.
    """

    k_num: int
    k_den: int
    abs_num: float = 0.0
    abs_den: float = 0.0

    def coefficients(self, t: float) -> tuple[float, float, float]:
        """``(a, b, c)``: the window is ``a num + b den + c``, twice the bound on
        ``|(num - t den) - exact margin|`` (docs/exactness.md)."""
        e_num = gamma(self.k_num) / (1.0 - gamma(self.k_num)) + U
        e_den = gamma(self.k_den) / (1.0 - gamma(self.k_den)) + 4 * U
        extra = 2.0 * (self.abs_num + self.abs_den + TINY)
        return 2.0 * e_num, 2.0 * t * e_den, 2.0 * extra

    def window(self, num: np.ndarray, den: np.ndarray, t: float) -> np.ndarray:
        """Twice the bound on ``|(num - t den) - exact margin|`` (docs/exactness.md)."""
        a, b, c = self.coefficients(t)
        return a * num + b * den + c

    def undecided(
        self, num: np.ndarray, den: np.ndarray, t: float, margin: np.ndarray | None = None
    ) -> np.ndarray:
        """Where the float margin's sign may differ from the exact one.

        Decided as ``|margin| < beta den + c``, a window at least :meth:`window` (exact
        ``P(pos, x) <= P(x)`` bounds the ``num`` term by the ``den`` one; the strict ``<``
        with ``beta`` enlarged by ``2u`` covers ``<=``). Without underflow (``abs_* = 0``)
        ``c = 0``: a float ``P(x)`` of 0 is an exact 0 (decided, negative), and a nonzero
        one is at least ``2**NO_UNDERFLOW_LOG2``, so ``2**-60 den`` covers the rounding of
        ``t den`` below the normal range. ``margin`` (``num - t den``, if already computed)
        is overwritten.
        """
        beta, c = self._beta(t)
        m = num - t * den if margin is None else margin
        np.abs(m, out=m)
        return m < beta * den + c if c else m < beta * den

    def _beta(self, t: float) -> tuple[float, float]:
        a, b, c = self.coefficients(t)
        g_num, g_den = gamma(self.k_num), gamma(self.k_den)
        grow = (1.0 + g_num) / (1.0 - g_den) * (1.0 + 4 * U)
        beta = (a * grow + b) * (1.0 + 4 * U)
        if self.abs_num == 0 and self.abs_den == 0:
            return beta + 2.0**-60, 0.0
        return beta, c + 2.0 * a * (self.abs_num + 2.0 * self.abs_den)


def absolute_error(
    network: Network, factors: Sequence[tuple[tuple[str, ...], np.ndarray]], flops: float, kept
) -> float:
    """Absolute error from underflow and from CPT numbers too small for a normal float.

    0 when the product of every factor's smallest nonzero entry is at least
    ``2**NO_UNDERFLOW_LOG2`` and no number written nonzero became 0.0: then no intermediate
    of a sum-product over these factors underflows. Otherwise every multiplication and
    conversion may lose :data:`TINY`, weighted by how much one cell can weigh in the result
    (at most the hidden variables' joint states times ``max(1, largest entry) ** factors``).
    """
    log_min, log_max = 0.0, 0.0
    flushed = False
    for scope, table in factors:
        nonzero = table[table > 0]
        if nonzero.size:
            log_min += min(0.0, math.log2(float(nonzero.min())))
            log_max = max(log_max, math.log2(float(nonzero.max())))
        if nonzero.size < table.size:
            flushed = flushed or _flushed_zero(network, scope[-1], table)
    if log_min >= NO_UNDERFLOW_LOG2 and not flushed:
        return 0.0
    hidden = {v for scope, _ in factors for v in scope} - set(kept)
    log_weight = sum(math.log2(network.card(v)) for v in hidden) + len(factors) * log_max
    cells = flops + sum(t.size for _, t in factors)
    log_err = 1.0 + math.log2(max(cells, 1.0)) + log_weight - 1074.0
    return math.inf if log_err > 1000 else 2.0**log_err


def _flushed_zero(network: Network, var: str, table: np.ndarray) -> bool:
    """Whether a number of ``var``'s CPT is written nonzero but read as 0.0."""
    texts = network.texts.get(var) if network.texts is not None else None
    if texts is None or texts.shape != table.shape or var not in network.cpts:
        return False
    return any(_ZERO_TEXT.fullmatch(s) is None for s in texts[table == 0].tolist())


# ---------------------------------------------------------------------------- exact joint
class ExactJoint:
    """``P(C, x)`` of chosen inputs in exact arithmetic, as the file's numbers define it.

    Each relevant CPT is scaled to integers by the common denominator of its numbers; a
    batch of inputs becomes one more axis of every factor that mentions a feature, and the
    hidden variables are summed out one at a time (smallest merged table first) in Python
    integers. The scale is the same for every class state and input, so comparisons of
    ``P(c, x)`` with ``T * P(x)`` are exact on the scaled integers.

    For decisions, the CPTs over features only (no class, no hidden variable) are left
    out: at a given input each is one number common to ``P(pos, x)`` and ``P(x)``, so only
    whether it is 0 matters (a leaf class, as in credit.net, then costs one CPT row per
    input).
    """

    def __init__(self, network: Network, class_variable: str, features: Sequence[str]):
        self.network = network
        self.cls = class_variable
        self.features = tuple(features)
        self._factors: list[_IntFactor] | None = None
        self._order: list[str] | None = None

    def _integer_factors(self) -> list[_IntFactor]:
        if self._factors is None:
            net = self.network
            keep = net.ancestors([self.cls, *self.features])
            col = {f: i for i, f in enumerate(self.features)}
            out = []
            for v in net.variables:
                if v not in keep:
                    continue
                exact = net.exact_cpt(v)
                flat = exact.reshape(-1).tolist()
                scale = math.lcm(*(q.denominator for q in flat)) if flat else 1
                ints = np.empty(len(flat), dtype=object)
                ints[:] = [q.numerator * (scale // q.denominator) for q in flat]
                scope = (*net.parents[v], v)
                fixed = [i for i, u in enumerate(scope) if u in col]
                moved = np.moveaxis(ints.reshape(exact.shape), fixed, range(len(fixed)))
                out.append(
                    _IntFactor(
                        scope,
                        moved,
                        np.equal(moved, 0).astype(bool),
                        tuple(col[scope[i]] for i in fixed),
                        tuple(u for i, u in enumerate(scope) if i not in fixed),
                    )
                )
            self._factors = out
        return self._factors

    def joint(self, X: np.ndarray) -> np.ndarray:
        """Scaled integers ``P(C = c, x) * D`` for each row of ``X`` (feature indices in
        ``features`` order): object array of shape ``(len(X), card(C))``."""
        return self._joint(X, drop_common=False)[0]

    def _joint(self, X: np.ndarray, *, drop_common: bool) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`joint`, or (``drop_common``) the same up to a positive factor per input
        and where that factor is 0; batches of about :data:`EXACT_CELLS` cells."""
        X = np.asarray(X, dtype=np.int64).reshape(-1, len(self.features))
        cc = self.network.card(self.cls)
        if X.shape[0] == 0:
            return np.zeros((0, cc), dtype=object), np.zeros(0, dtype=bool)
        factors = self._integer_factors()
        cells = max(f.table.size for f in factors)
        batch = max(1, EXACT_CELLS // max(1, cells))
        parts = [
            self._joint_batch(X[i : i + batch], drop_common) for i in range(0, X.shape[0], batch)
        ]
        return (
            np.concatenate([p[0] for p in parts], axis=0),
            np.concatenate([p[1] for p in parts]),
        )

    def _joint_batch(self, X: np.ndarray, drop_common: bool) -> tuple[np.ndarray, np.ndarray]:
        batch = "#"
        factors: list[tuple[tuple[str, ...], np.ndarray]] = []
        zero = np.zeros(X.shape[0], dtype=bool)
        for f in self._integer_factors():
            if not f.columns:
                factors.append((f.rest, f.table))
                continue
            at = tuple(X[:, c] for c in f.columns)
            if drop_common and not f.rest:
                zero |= f.zero[at]
                continue
            factors.append(((batch, *f.rest), f.table[at]))
        cards = {v: self.network.card(v) for v in self.network.variables}
        cards[batch] = X.shape[0]
        if self._order is None:
            self._order = _greedy_order([s for s, _ in factors], cards, {self.cls, batch})
        for v in self._order:
            group = [f for f in factors if v in f[0]]
            if not group:
                continue
            factors = [f for f in factors if v not in f[0]]
            scope, table = _product(group, cards)
            axis = scope.index(v)
            factors.append((scope[:axis] + scope[axis + 1 :], table.sum(axis=axis)))
        scope, table = _product(factors, cards)
        full = _align(scope, table, (batch, self.cls), cards)
        return np.broadcast_to(full, (X.shape[0], cards[self.cls])).copy(), zero

    def decide(self, X: np.ndarray, t: Fraction, positive: int) -> ExactDecisions:
        """Exact decisions ``P(positive | x) >= t`` of the rows of ``X``.

        Inputs that agree on every feature the remaining CPTs mention (after leaving out
        those over features only) are computed once.
        """
        X = np.asarray(X, dtype=np.int64).reshape(-1, len(self.features))
        factors = self._integer_factors()
        zero = np.zeros(X.shape[0], dtype=bool)
        for f in factors:
            if f.columns and not f.rest:
                zero |= f.zero[tuple(X[:, c] for c in f.columns)]
        used = sorted({c for f in factors if f.rest for c in f.columns})
        cards = [self.network.card(self.features[c]) for c in used]
        reduced = np.zeros((0, X.shape[1]), dtype=np.int64)
        if math.prod(cards) < 1 << 62:
            flat = np.ravel_multi_index(tuple(X[:, used].T), cards) if used else np.zeros(len(X))
            keys, inverse = np.unique(flat, return_inverse=True)
            reduced = np.zeros((keys.size, X.shape[1]), dtype=np.int64)
            if used:
                reduced[:, used] = np.stack(np.unravel_index(keys, cards), axis=1)
        else:
            rows, inverse = np.unique(X[:, used], axis=0, return_inverse=True)
            reduced = np.zeros((rows.shape[0], X.shape[1]), dtype=np.int64)
            reduced[:, used] = rows
        joint, _ = self._joint(reduced, drop_common=True)
        num = joint[:, positive]
        den = joint.sum(axis=1)
        lhs = num * t.denominator
        rhs = den * t.numerator
        inverse = inverse.reshape(-1)
        possible = np.greater(den, 0).astype(bool)[inverse] & ~zero
        decision = np.greater_equal(lhs, rhs).astype(bool)[inverse]
        tie = np.equal(lhs, rhs).astype(bool)[inverse]
        return ExactDecisions(decision & possible, tie & possible, ~possible)


@dataclass(frozen=True)
class _IntFactor:
    """A CPT scaled to integers, its feature axes first (``columns``: their feature
    positions), ``rest`` the scope's other variables; ``zero`` where the entry is 0."""

    scope: tuple[str, ...]
    table: np.ndarray
    zero: np.ndarray
    columns: tuple[int, ...]
    rest: tuple[str, ...]


@dataclass(frozen=True)
class ExactDecisions:
    """Per input: decided positive, posterior exactly ``T``, probability exactly 0."""

    positive: np.ndarray
    tie: np.ndarray
    impossible: np.ndarray


def _greedy_order(
    scopes: Sequence[tuple[str, ...]], cards: dict[str, int], keep: set[str]
) -> list[str]:
    """Elimination order of the variables not in ``keep``: smallest merged table first
    (ties by first appearance), on the interaction graph of ``scopes``."""
    rank: dict[str, int] = {}
    for s in scopes:
        for v in s:
            rank.setdefault(v, len(rank))
    nbr: dict[str, set[str]] = {v: set() for v in rank}
    for s in scopes:
        for v in s:
            nbr[v].update(w for w in s if w != v)
    hidden = {v for v in rank if v not in keep}
    order = []
    while hidden:
        v = min(hidden, key=lambda h: (cards[h] * math.prod(cards[w] for w in nbr[h]), rank[h]))
        hidden.remove(v)
        order.append(v)
        near = nbr.pop(v)
        for a in near:
            nbr[a].discard(v)
            nbr[a].update(w for w in near if w != a)
    return order


def _align(
    scope: tuple[str, ...], table: np.ndarray, target: tuple[str, ...], cards: dict[str, int]
) -> np.ndarray:
    """``table`` over ``scope`` (a subset of ``target``) transposed and reshaped to broadcast
    against ``target``."""
    order = [scope.index(v) for v in target if v in scope]
    moved = np.transpose(np.asarray(table, dtype=object), order)
    shape = [cards[v] if v in scope else 1 for v in target]
    return moved.reshape(shape)


def _product(
    group: Sequence[tuple[tuple[str, ...], np.ndarray]], cards: dict[str, int]
) -> tuple[tuple[str, ...], np.ndarray]:
    """Pointwise product of factors over the union of their scopes."""
    scope = tuple(dict.fromkeys(v for s, _ in group for v in s))
    out: Any = None
    for s, t in group:
        a = _align(s, t, scope, cards)
        out = a if out is None else out * a
    if out is None:
        return (), np.ones((), dtype=object)
    return scope, np.broadcast_to(out, tuple(cards[v] for v in scope))


# ---------------------------------------------------------------------------- the post-pass
@dataclass
class Refinement:
    """What the exact post-pass did: inputs decided exactly, exact ties among them, the
    correction to the float count of impossible inputs (underflowed ``P(x)`` that is not 0),
    and the inputs left undecided once the budget ran out (decided in floats)."""

    exact_inputs: int = 0
    ties: int = 0
    impossible_delta: int = 0
    uncertified: int = 0

    def add(self, other: Refinement) -> None:
        """Accumulate another block's figures."""
        self.exact_inputs += other.exact_inputs
        self.ties += other.ties
        self.impossible_delta += other.impossible_delta
        self.uncertified += other.uncertified


@dataclass
class ExactBudget:
    """Inputs one compilation may still decide exactly (:data:`EXACT_LIMIT` to start)."""

    left: int = 0

    def __post_init__(self) -> None:
        if self.left <= 0:
            self.left = EXACT_LIMIT


def refine(
    num: np.ndarray,
    den: np.ndarray,
    decision: np.ndarray,
    bound: ErrorBound,
    threshold: float,
    exact: ExactJoint,
    positive: int,
    locate: Callable[[np.ndarray], np.ndarray],
    budget: ExactBudget,
) -> Refinement:
    """Make ``decision`` (same shape as ``num``) exact, in place.

    Float decisions are taken from the margin's sign where it exceeds the bound; the inputs
    inside it are located (``locate(flat indices) -> feature index rows``) and decided by
    ``exact``. When they are more than ``budget`` has left, none of them is: they are
    decided positive where the float ``P(x)`` is not 0 (within rounding of ``T``, as a tie
    would be) and counted as uncertified, and the budget is spent.
    """
    if not decision.flags.c_contiguous:
        raise ValueError("refine() needs a C-contiguous decision array (it writes in place)")
    t = float(threshold)
    flat_num, flat_den = num.reshape(-1), den.reshape(-1)
    flat_dec = decision.reshape(-1)
    undecided: list[np.ndarray] = []
    count = 0
    for s in range(0, flat_num.size, CHUNK):
        n, d = flat_num[s : s + CHUNK], flat_den[s : s + CHUNK]
        margin = n - t * d
        np.greater(margin, 0.0, out=flat_dec[s : s + CHUNK])
        mask = bound.undecided(n, d, t, margin)
        count += int(np.count_nonzero(mask))
        if count > budget.left:
            flat_dec[s : s + CHUNK] |= mask & (d > 0)
        elif count:
            near = np.nonzero(mask)[0]
            if near.size:
                undecided.append(near + s)
    if count > budget.left:
        for idx in undecided:
            flat_dec[idx] = flat_den[idx] > 0
        budget.left = 0
        return Refinement(uncertified=count)
    if not undecided:
        return Refinement()
    budget.left -= count
    idx = np.concatenate(undecided)
    got = exact.decide(locate(idx), exact_threshold(threshold), positive)
    flat_dec[idx] = got.positive
    was_impossible = ~(flat_den[idx] > 0)
    delta = int(np.count_nonzero(got.impossible)) - int(np.count_nonzero(was_impossible))
    return Refinement(int(idx.size), int(np.count_nonzero(got.tie)), delta)
