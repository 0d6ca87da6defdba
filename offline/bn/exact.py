"""Exact decisions: a float error bound per route, and exact rational arithmetic inside it.

The classifier a network defines is ``P(C = positive | x) >= T`` with the CPT numbers of
the network it is given (:meth:`~boxwatch.offline.bn.network.Network.exact_cpt`; the
compiler gives it the file's numbers, each row divided by its sum:
:attr:`~boxwatch.offline.bn.network.Network.renormalised`) and ``T`` the
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

import functools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from boxwatch.offline.bn.network import Network

U = 2.0**-53
"""Unit roundoff of float64 (round to nearest)."""
TINY = 2.0**-1074
"""Smallest positive float64: the most an underflowing product or conversion loses."""
NO_UNDERFLOW_LOG2 = -1000.0
"""Products of CPT entries at least ``2**NO_UNDERFLOW_LOG2`` never leave the normal range."""
CHUNK = 1 << 15
"""Inputs per pass of the float window test (its temporaries stay in cache)."""
EXACT_LIMIT = 1 << 20
"""Inputs one compilation decides exactly at most; past it the rest are reported uncertified."""
EXACT_CELLS = 1 << 18
EXACT_FREE_CELLS = 1 << 19
"""Largest intermediate (cells of Python ints) of the whole exact table over the features."""
_ZERO_TEXT = re.compile(r"[+-]?(0+\.?0*|\.0+)([eE][+-]?\d+)?")


@functools.lru_cache(maxsize=64)
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
    if var not in network.cpts or network.cpts[var].shape != table.shape:
        return False
    texts = network.texts.get(var) if network.texts is not None else None
    if texts is None or texts.shape != table.shape:
        # no strings (a renormalised CPT, a UAI or pgmpy network): its exact rationals
        return bool(np.not_equal(network.exact_cpt(var)[table == 0], 0).any())
    # few distinct strings ("0", "0.0") stand for the many zeros of deterministic rows
    return any(_ZERO_TEXT.fullmatch(s) is None for s in set(texts[table == 0].tolist()))


# ---------------------------------------------------------------------------- exact joint
class ExactJoint:
    """``P(C, x)`` of chosen inputs in exact arithmetic, as the network's numbers define it.

    Each relevant CPT is scaled to integers by the common denominator of its numbers; a
    batch of inputs becomes one more axis of every factor that mentions a feature, and the
    hidden variables are summed out one at a time (smallest merged table first) in Python
    integers. The scale is the same for every class state and input, so comparisons of
    ``P(c, x)`` with ``T * P(x)`` are exact on the scaled integers.

    For decisions, the CPTs over features only (no class, no hidden variable) are left
    out: at a given input each is one number common to ``P(pos, x)`` and ``P(x)``, so only
    whether it is 0 matters, and only CPTs that hold an exact 0 are looked at (none with
    ``positive_cpts``: the caller checked that every relevant float entry is above 0, and a
    float above 0 is read from a number above 0). A decision therefore depends on the few
    features in :attr:`columns` alone (a leaf class, as in credit.net: its parents); inputs
    agreeing on them are decided once.
    """

    def __init__(
        self,
        network: Network,
        class_variable: str,
        features: Sequence[str],
        *,
        positive_cpts: bool = False,
    ):
        self.network = network
        self.cls = class_variable
        self.features = tuple(features)
        self.positive_cpts = positive_cpts
        self._ints: dict[str, _IntFactor] = {}
        self._orders: dict[bool, list[str]] = {}
        self._plan: _DecisionPlan | None = None
        self._cost: tuple[float, float, float] | None = None
        self._table: np.ndarray | None = None

    def _relevant(self) -> list[str]:
        """The class's and features' ancestors (themselves included), in network order."""
        keep = self.network.ancestors([self.cls, *self.features])
        return [v for v in self.network.variables if v in keep]

    def _int_factor(self, v: str) -> _IntFactor:
        """``v``'s CPT scaled to integers, its feature axes first (built once)."""
        got = self._ints.get(v)
        if got is None:
            net = self.network
            col = {f: i for i, f in enumerate(self.features)}
            ints, _ = net.scaled_cpt(v)
            scope = (*net.parents[v], v)
            fixed = [i for i, u in enumerate(scope) if u in col]
            moved = np.moveaxis(ints, fixed, range(len(fixed))) if fixed else ints
            got = _IntFactor(
                scope,
                moved,
                tuple(col[scope[i]] for i in fixed),
                tuple(u for i, u in enumerate(scope) if i not in fixed),
            )
            self._ints[v] = got
        return got

    def _integer_factors(self) -> list[_IntFactor]:
        return [self._int_factor(v) for v in self._relevant()]

    @property
    def columns(self) -> tuple[int, ...]:
        """Positions (in ``features``) of the features a decision depends on: those of the
        CPTs with a class or hidden variable, then those of feature-only CPTs holding an
        exact 0. :meth:`decide_columns` takes inputs over these columns only."""
        return self._decision_plan().columns

    def _decision_plan(self) -> _DecisionPlan:
        if self._plan is None:
            net = self.network
            col = {f: i for i, f in enumerate(self.features)}
            inner: list[_IntFactor] = []
            zero_scopes: list[tuple[tuple[int, ...], np.ndarray]] = []
            for v in self._relevant():
                scope = (*net.parents[v], v)
                if all(u in col for u in scope):
                    # one positive number common to P(pos, x) and P(x), or an exact 0
                    if self.positive_cpts or net.cpts[v].all():
                        continue  # a float above 0 is a number written above 0
                    zero = (net.cpts[v] == 0) & np.equal(net.exact_cpt(v), 0).astype(bool)
                    if zero.any():
                        zero_scopes.append((tuple(col[u] for u in scope), zero))
                    continue
                inner.append(self._int_factor(v))
            first = sorted({c for f in inner for c in f.columns})
            extra = sorted({c for s, _ in zero_scopes for c in s} - set(first))
            columns = (*first, *extra)
            at = {c: i for i, c in enumerate(columns)}
            self._plan = _DecisionPlan(
                columns,
                tuple(net.card(self.features[c]) for c in columns),
                len(first),
                [
                    _IntFactor(f.scope, f.table, tuple(at[c] for c in f.columns), f.rest)
                    for f in inner
                ],
                [(tuple(at[c] for c in s), z) for s, z in zero_scopes],
            )
        return self._plan

    def joint(self, X: np.ndarray) -> np.ndarray:
        """Scaled integers ``P(C = c, x) * D`` for each row of ``X`` (feature indices in
        ``features`` order): object array of shape ``(len(X), card(C))``."""
        X = np.asarray(X, dtype=np.int64).reshape(-1, len(self.features))
        return self._joint(X, self._integer_factors(), common=True)

    def _joint(self, X: np.ndarray, factors: list[_IntFactor], *, common: bool) -> np.ndarray:
        """``P(C, x)`` over ``factors`` (their ``columns`` index the columns of ``X``) in
        batches of about :data:`EXACT_CELLS` cells; ``common``: the factors include the
        feature-only CPTs (the elimination order is kept per kind)."""
        cc = self.network.card(self.cls)
        if X.shape[0] == 0:
            return np.zeros((0, cc), dtype=object)
        cells = max((f.table.size for f in factors), default=1)
        batch = max(1, EXACT_CELLS // max(1, cells))
        parts = [
            self._joint_batch(X[i : i + batch], factors, common)
            for i in range(0, X.shape[0], batch)
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)

    def _joint_batch(self, X: np.ndarray, factors_in: list[_IntFactor], common: bool) -> np.ndarray:
        batch = "#"
        factors: list[tuple[tuple[str, ...], np.ndarray]] = []
        for f in factors_in:
            if not f.columns:
                factors.append((f.rest, f.table))
                continue
            at = tuple(X[:, c] for c in f.columns)
            factors.append(((batch, *f.rest), f.table[at]))
        if len(factors) == 1 and factors[0][0] == (batch, self.cls):
            return factors[0][1]  # a leaf class over features, and nothing hidden
        cards = {v: self.network.card(v) for v in self.network.variables}
        cards[batch] = X.shape[0]
        order = self._orders.get(common)
        if order is None:
            order = _greedy_order([s for s, _ in factors], cards, {self.cls, batch})
            self._orders[common] = order
        for v in order:
            group = [f for f in factors if v in f[0]]
            if not group:
                continue
            factors = [f for f in factors if v not in f[0]]
            scope, table = _product(group, cards)
            axis = scope.index(v)
            factors.append((scope[:axis] + scope[axis + 1 :], table.sum(axis=axis)))
        scope, table = _product(factors, cards)
        full = _align(scope, table, (batch, self.cls), cards)
        return np.broadcast_to(full, (X.shape[0], cards[self.cls])).copy()

    def decide(self, X: np.ndarray, t: Fraction, positive: int) -> ExactDecisions:
        """Exact decisions ``P(positive | x) >= t`` of the rows of ``X`` (every feature)."""
        X = np.asarray(X, dtype=np.int64).reshape(-1, len(self.features))
        return self.decide_columns(X[:, list(self.columns)], t, positive)

    def decide_columns(self, Xc: np.ndarray, t: Fraction, positive: int) -> ExactDecisions:
        """:meth:`decide` of inputs given by their :attr:`columns` only."""
        plan = self._decision_plan()
        Xc = np.asarray(Xc, dtype=np.int64).reshape(-1, len(plan.columns))
        if math.prod(plan.cards) < 1 << 62:
            return self.decide_keys(mixed_radix(Xc, plan.cards), t, positive)
        rows, inverse = np.unique(Xc, axis=0, return_inverse=True)
        return self._decide_rows(rows, t, positive).take(inverse.reshape(-1))

    @property
    def key_cards(self) -> tuple[int, ...]:
        """Cardinalities of :attr:`columns`: an input's key for :meth:`decide_keys` is its
        mixed-radix index over them (first column slowest)."""
        return self._decision_plan().cards

    def decide_keys(self, keys: np.ndarray, t: Fraction, positive: int) -> ExactDecisions:
        """:meth:`decide` of inputs given by their mixed-radix key over :attr:`columns`
        (:attr:`key_cards`, fewer than 2**62 keys).

        Inputs with the same key are decided once, and keys that agree on the columns of
        the CPTs with a class or hidden variable share one exact ``P(C, x)``.
        """
        plan = self._decision_plan()
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        distinct, inverse = unique_keys(keys, math.prod(plan.cards))
        return self._decide_rows(_unravel(distinct, plan.cards), t, positive).take(inverse)

    def _decide_rows(self, rows: np.ndarray, t: Fraction, positive: int) -> ExactDecisions:
        """Decisions of distinct inputs given over :attr:`columns`."""
        plan = self._decision_plan()
        zero = np.zeros(rows.shape[0], dtype=bool)
        for at, mask in plan.zeros:
            zero |= mask[tuple(rows[:, c] for c in at)]
        n = plan.inner_columns
        sub = rows[:, :n]
        inner: np.ndarray | None = None
        if n < rows.shape[1] and math.prod(plan.cards[:n]) < 1 << 62:
            # rows that differ only in the columns of feature-only CPTs share P(C, x)
            distinct, inner = unique_keys(mixed_radix(sub, plan.cards[:n]), 0)
            sub = _unravel(distinct, plan.cards[:n])
        joint = self._inner_joint(sub)
        den = joint.sum(axis=1)
        lhs = joint[:, positive] * t.denominator
        rhs = den * t.numerator
        possible = np.greater(den, 0).astype(bool)
        decision = np.greater_equal(lhs, rhs).astype(bool)
        tie = np.equal(lhs, rhs).astype(bool)
        if inner is not None:
            possible, decision, tie = possible[inner], decision[inner], tie[inner]
        if plan.zeros:
            possible &= ~zero
        return ExactDecisions(decision & possible, tie & possible, ~possible)

    def _inner_joint(self, sub: np.ndarray) -> np.ndarray:
        """``P(C, x)`` up to the factors common to every class state, of distinct rows over
        the first ``inner_columns`` of :attr:`columns`: object array ``(len(sub), card(C))``.

        Two ways, the cheaper by the cells their products touch: a batch axis over the
        rows (:meth:`_joint`; every row pays the whole elimination), or the table over
        every value of those features at once, by elimination that keeps them free (then
        kept for the next call): partial products are shared by the inputs that agree on
        their features, which pays when many inputs are decided (pigs' leaves under their
        hidden parents). The table is built only up to :data:`EXACT_FREE_CELLS` cells.
        """
        plan = self._decision_plan()
        if self._table is None:
            if all(v == self.cls for f in plan.inner for v in f.rest):
                # nothing hidden: each row is a product of CPT rows, nothing to share
                return self._joint(sub, plan.inner, common=False)
            free, per_input, largest = self._costs()
            # (without inner features there is one row, and the two costs are equal)
            if largest > EXACT_FREE_CELLS or free >= per_input * sub.shape[0]:
                return self._joint(sub, plan.inner, common=False)
            self._table = self._whole_table()
        return self._table[tuple(sub.T)]

    def _free_names(self) -> tuple[str, ...]:
        """Names of the inner columns' features in :meth:`_whole_table` (NUL-prefixed: no
        file names a variable so)."""
        return tuple(f"\0{c}" for c in range(self._decision_plan().inner_columns))

    def _scopes_and_cards(self) -> tuple[list[tuple[str, ...]], dict[str, int]]:
        plan = self._decision_plan()
        names = self._free_names()
        scopes = [(*(names[c] for c in f.columns), *f.rest) for f in plan.inner]
        cards = {v: self.network.card(v) for v in self.network.variables}
        cards.update(zip(names, plan.cards[: len(names)], strict=True))
        return scopes, cards

    def _costs(self) -> tuple[float, float, float]:
        """Cells the products touch building the whole table, per input on the batch
        axis, and the whole table's largest intermediate."""
        if self._cost is None:
            scopes, cards = self._scopes_and_cards()
            names = set(self._free_names())
            if names & set(self.network.variables):
                self._cost = (math.inf, 0.0, math.inf)
            else:
                free, largest = _elimination_cells(scopes, cards, {self.cls, *names})
                fixed = [tuple(v for v in s if v not in names) for s in scopes]
                per_input, _ = _elimination_cells(fixed, cards, {self.cls})
                self._cost = (free, per_input, largest)
        return self._cost

    def _whole_table(self) -> np.ndarray:
        """The inner CPTs' product summed over the hidden variables, features kept: shape
        ``(*inner column cards, card(C))``."""
        scopes, cards = self._scopes_and_cards()
        names = self._free_names()
        factors = list(zip(scopes, (f.table for f in self._decision_plan().inner), strict=True))
        for v in _greedy_order(scopes, cards, {self.cls, *names}):
            group = [f for f in factors if v in f[0]]
            if not group:
                continue
            factors = [f for f in factors if v not in f[0]]
            scope, table = _product(group, cards)
            axis = scope.index(v)
            factors.append((scope[:axis] + scope[axis + 1 :], table.sum(axis=axis)))
        scope, table = _product(factors, cards)
        target = (*names, self.cls)
        full = _align(scope, table, target, cards)
        return np.broadcast_to(full, tuple(cards[v] for v in target))


def _elimination_cells(
    scopes: Sequence[tuple[str, ...]], cards: dict[str, int], keep: set[str]
) -> tuple[float, float]:
    """Cells of every product (and of the largest) when the variables not in ``keep`` are
    summed out of factors over ``scopes`` in :func:`_greedy_order`, the final product
    included."""
    live = [set(s) for s in scopes]
    total = largest = 0.0
    for v in _greedy_order(scopes, cards, keep):
        group = [s for s in live if v in s]
        if not group:
            continue
        live = [s for s in live if v not in s]
        union = set().union(*group)
        cells = float(math.prod(cards[u] for u in union))
        total, largest = total + cells, max(largest, cells)
        live.append(union - {v})
    cells = float(math.prod(cards[u] for u in set().union(*live)))
    return total + cells * max(1, len(live) - 1), max(largest, cells)


def mixed_radix(X: np.ndarray, cards: Sequence[int]) -> np.ndarray:
    """Index of each row of ``X`` (values below ``cards``) in C order over ``cards``."""
    if X.shape[1] == 0:
        return np.zeros(X.shape[0], dtype=np.int64)
    key = X[:, 0].astype(np.int64, copy=True)
    for j in range(1, X.shape[1]):
        key *= cards[j]
        key += X[:, j]
    return key


def _unravel(keys: np.ndarray, cards: Sequence[int]) -> np.ndarray:
    """Rows of the mixed-radix ``keys`` over ``cards`` (inverse of :func:`mixed_radix`)."""
    if not cards:
        return np.zeros((keys.size, 0), dtype=np.int64)
    return np.stack(np.unravel_index(keys, tuple(cards)), axis=1)


def unique_keys(keys: np.ndarray, space: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values of ``keys`` (sorted) and each key's index among them: through a
    direct table when the keys' range ``space`` is small against their number (no sort),
    else a sort (``space`` 0: unknown)."""
    if keys.size == 0:
        return keys, np.zeros(0, dtype=np.intp)
    if 0 < space <= max(1 << 16, 4 * keys.size):
        seen = np.zeros(space, dtype=bool)
        seen[keys] = True
        distinct = np.flatnonzero(seen)
        slot = np.empty(space, dtype=np.intp)
        slot[distinct] = np.arange(distinct.size)
        return distinct, slot[keys]
    distinct, inverse = np.unique(keys, return_inverse=True)
    return distinct, inverse.reshape(-1)


def grid_columns(idx: np.ndarray, cards: Sequence[int], columns: Sequence[int]) -> np.ndarray:
    """Values of the ``columns`` of the grid ``cards`` (C order) at flat positions ``idx``:
    shape ``(len(idx), len(columns))``."""
    strides = [math.prod(cards[c + 1 :]) for c in range(len(cards))]
    out = np.empty((idx.size, len(columns)), dtype=np.int64)
    for j, c in enumerate(columns):
        np.floor_divide(idx, strides[c], out=out[:, j])
        out[:, j] %= cards[c]
    return out


@dataclass(frozen=True)
class _IntFactor:
    """A CPT scaled to integers, its feature axes first (``columns``: their feature
    positions), ``rest`` the scope's other variables."""

    scope: tuple[str, ...]
    table: np.ndarray
    columns: tuple[int, ...]
    rest: tuple[str, ...]


@dataclass(frozen=True)
class _DecisionPlan:
    """What an exact decision reads: the feature ``columns`` (positions in ``features``;
    the first ``inner_columns`` those of the ``inner`` CPTs, which mention a class or
    hidden variable) with their ``cards``; the ``inner`` CPTs with ``columns`` indexing
    these; ``zeros``: each feature-only CPT holding an exact 0, as (its columns here, where
    it is 0)."""

    columns: tuple[int, ...]
    cards: tuple[int, ...]
    inner_columns: int
    inner: list[_IntFactor]
    zeros: list[tuple[tuple[int, ...], np.ndarray]]


@dataclass(frozen=True)
class ExactDecisions:
    """Per input: decided positive, posterior exactly ``T``, probability exactly 0."""

    positive: np.ndarray
    tie: np.ndarray
    impossible: np.ndarray

    def take(self, index: np.ndarray) -> ExactDecisions:
        """The decisions of the inputs at ``index`` (a constant field is filled, not
        gathered: many inputs at one exact tie cost one pass)."""

        def pick(a: np.ndarray) -> np.ndarray:
            if a.size and (a.all() or not a.any()):
                return np.full(index.size, a[0], dtype=bool)
            return a[index]

        return ExactDecisions(pick(self.positive), pick(self.tie), pick(self.impossible))


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
    locate: Callable[[np.ndarray, Sequence[int]], np.ndarray],
    budget: ExactBudget,
) -> Refinement:
    """Make ``decision`` (same shape as ``num``) exact, in place.

    Float decisions are taken from the margin's sign where it exceeds the bound (one pass
    in cache-sized chunks, the test of :meth:`ErrorBound.undecided`); the inputs inside it
    are located (``locate(flat indices, feature positions) -> those features' values``,
    only the :attr:`ExactJoint.columns` a decision reads) and decided by ``exact``. When
    they are more than ``budget`` has left, none of them is: they are decided positive
    where the float ``P(x)`` is not 0 (within rounding of ``T``, as a tie would be) and
    counted as uncertified, and the budget is spent.
    """
    if not decision.flags.c_contiguous:
        raise ValueError("refine() needs a C-contiguous decision array (it writes in place)")
    t = float(threshold)
    flat_num, flat_den = num.reshape(-1), den.reshape(-1)
    flat_dec = decision.reshape(-1)
    beta, c = bound._beta(t)
    step = max(1, min(CHUNK, flat_num.size))
    margin, width, inside = np.empty(step), np.empty(step), np.empty(step, dtype=bool)
    undecided: list[np.ndarray] = []
    count = 0
    for s in range(0, flat_num.size, step):
        n, d = flat_num[s : s + step], flat_den[s : s + step]
        m, w, mask = margin[: n.size], width[: n.size], inside[: n.size]
        np.multiply(d, t, out=w)
        np.subtract(n, w, out=m)  # the margin num - t den, as ErrorBound.undecided has it
        np.greater(m, 0.0, out=flat_dec[s : s + step])
        np.abs(m, out=m)
        np.multiply(d, beta, out=w)
        if c:
            w += c
        np.less(m, w, out=mask)
        here = int(np.count_nonzero(mask))
        if not here:
            continue
        count += here
        if count > budget.left:
            flat_dec[s : s + step] |= mask & (d > 0)
        else:
            undecided.append(np.flatnonzero(mask) + s)
    if count > budget.left:
        for idx in undecided:
            flat_dec[idx] = flat_den[idx] > 0
        budget.left = 0
        return Refinement(uncertified=count)
    if not undecided:
        return Refinement()
    budget.left -= count
    idx = undecided[0] if len(undecided) == 1 else np.concatenate(undecided)
    got = exact.decide_columns(locate(idx, exact.columns), exact_threshold(threshold), positive)
    flat_dec[idx] = got.positive
    was_impossible = ~(flat_den[idx] > 0)
    delta = int(np.count_nonzero(got.impossible)) - int(np.count_nonzero(was_impossible))
    return Refinement(int(idx.size), int(np.count_nonzero(got.tie)), delta)
