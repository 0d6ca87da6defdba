"""Exact single-parameter sensitivity of a BN classifier's decisions (for :mod:`.repair`).

Change one CPT entry ``theta = P(V = s | parents = r)`` and co-vary the row's other entries
proportionally (Chan & Darwiche's single-parameter co-variation; the row keeps its sum
``S``): ``theta'_j = theta_j (S - t) / (S - theta)`` for ``j != s`` when ``theta`` becomes
``t``. Then every ``P(c, x)`` is a linear function of ``t``, so each input's decision changes
at finitely many points, and the set of values at which a rule holds is a union of intervals
whose ends are rationals. Everything here is exact: the CPT numbers as written, scaled to
integers (:meth:`~boxwatch.offline.bn.network.Network.scaled_cpt`), summed in Python
integers; no float enters a decision.

The decisions are those the compiler makes (:mod:`.compile`): threshold ``P(pos | x) >= T``
exactly (``P(x) = 0``: negative); argmax the most probable state, where this module asks
more than the compiler: an input counts as given one of a set of states only when the best of
them leads every other state by more than :data:`MARGIN` (twice the compiler's tie
tolerance) in posterior, so wherever it says so the compiler's decision (the lowest state
within the tolerance of the largest posterior) is one of them too; the bands of that width
around a tie with another state are left out of the sets. Inputs of probability 0 get state
0, as the compiler gives them.

The inputs are enumerated over the *key* features only: those of the CPTs that mention the
class or a hidden variable (the others are one factor common to every class state at an
input, which changes no decision unless it is 0: the features of CPTs holding an exact 0 are
keys too, and their inputs impossible). A key stands for every input that agrees with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn.classifier import ResolvedSpec
from boxwatch.offline.bn.compile import TIE_TOLERANCE, spec_terminals
from boxwatch.offline.bn.exact import exact_threshold
from boxwatch.offline.bn.network import Network
from boxwatch.offline.bn.rules import Rule

MARGIN = 2 * Fraction(repr(TIE_TOLERANCE))
"""How far (in posterior) the best allowed argmax state must lead every other state: twice
the compiler's tie tolerance, so its float comparisons cannot decide otherwise."""
MAX_KEYS = 1 << 16
"""Key inputs the repair enumerates at most (past it: give fewer features)."""
MAX_CELLS = 1 << 23
"""Cells (of Python integers) one exact table may hold."""
SPLIT_CELLS = 1 << 18
"""Past this many cells in one table an elimination slices a kept variable."""

Interval = tuple[Fraction, Fraction]
"""An open interval ``(lo, hi)``, ``lo < hi``."""


@dataclass(frozen=True)
class Parameter:
    """One CPT entry: ``P(variable = state | parents = row)`` (state indices)."""

    variable: str
    row: tuple[int, ...]
    state: int

    def text(self, network: Network) -> str:
        """``P(Disease=Lung | BirthAsphyxia=yes)``."""
        v = self.variable
        head = f"P({v}={network.states[v][self.state]}"
        par = network.parents[v]
        if not par:
            return head + ")"
        given = ", ".join(f"{p}={network.states[p][i]}" for p, i in zip(par, self.row, strict=True))
        return f"{head} | {given})"


# ---------------------------------------------------------------------------- exact tables
Factor = tuple[tuple[str, ...], np.ndarray]


def _align(scope: tuple[str, ...], table: np.ndarray, target: tuple[str, ...]) -> np.ndarray:
    """``table`` over ``scope`` (within ``target``) transposed and reshaped to broadcast."""
    order = [scope.index(v) for v in target if v in scope]
    moved = np.transpose(table, order)
    shape = [table.shape[scope.index(v)] if v in scope else 1 for v in target]
    return moved.reshape(shape)


def _product(group: Sequence[Factor], cards: dict[str, int]) -> Factor:
    """Pointwise product of factors over the union of their scopes."""
    scope = tuple(dict.fromkeys(v for s, _ in group for v in s))
    out: np.ndarray | None = None
    for s, t in group:
        a = _align(s, t, scope)
        out = a if out is None else out * a
    if out is None:
        return (), np.ones((), dtype=object)
    return scope, np.broadcast_to(out, tuple(cards[v] for v in scope))


def _plan(
    scopes: Sequence[tuple[str, ...]], keep: set[str], cards: dict[str, int]
) -> tuple[list[str], int]:
    """The elimination order of the variables not in ``keep`` (smallest merged table first)
    and the largest table it makes, the final product over ``keep`` included."""
    live = [set(s) for s in scopes]
    hidden = set().union(*live) - keep if live else set()
    order: list[str] = []
    largest = math.prod(cards[u] for u in keep)

    def merged(h: str) -> set[str]:
        return set().union(*(s for s in live if h in s))

    while hidden:
        v = min(sorted(hidden), key=lambda h: math.prod(cards[u] for u in merged(h)))
        union = merged(v)
        largest = max(largest, math.prod(cards[u] for u in union))
        live = [s for s in live if v not in s] + [union - {v}]
        hidden.remove(v)
        order.append(v)
    return order, largest


def eliminate(factors: Sequence[Factor], keep: Sequence[str], cards: dict[str, int]) -> np.ndarray:
    """``sum`` over every variable not in ``keep`` of the product of ``factors``, as a table
    over ``keep`` (in that order): exact when the tables hold Python integers.

    Variables go smallest merged table first. When that makes a table past
    :data:`SPLIT_CELLS`, the kept variable whose values, taken one at a time, shrink it most
    is sliced (each slice eliminated alone, the results stacked); a table past
    :data:`MAX_CELLS` is refused.
    """
    scopes = [s for s, _ in factors]
    order, largest = _plan(scopes, set(keep), cards)
    if largest > SPLIT_CELLS and keep:
        sizes = {
            v: _plan([tuple(u for u in s if u != v) for s in scopes], set(keep) - {v}, cards)[1]
            for v in keep
        }
        v = min(keep, key=lambda u: (sizes[u], cards[u]))
        if sizes[v] < largest:
            rest = [u for u in keep if u != v]
            parts = []
            for j in range(cards[v]):
                sliced = [
                    (tuple(u for u in s if u != v), np.take(t, j, axis=s.index(v)))
                    if v in s
                    else (s, t)
                    for s, t in factors
                ]
                parts.append(eliminate(sliced, rest, cards))
            return np.moveaxis(np.stack(parts, axis=0), 0, list(keep).index(v))
    live = list(factors)
    for v in order:
        group = [f for f in live if v in f[0]]
        live = [f for f in live if v not in f[0]]
        scope, table = _product(group, cards)
        _check_cells(scope, cards)
        axis = scope.index(v)
        live.append((scope[:axis] + scope[axis + 1 :], table.sum(axis=axis)))
    target = tuple(keep)
    _check_cells(target, cards)
    scope, table = _product(live, cards)
    full = _align(scope, np.asarray(table, dtype=object), target)
    return np.broadcast_to(full, tuple(cards[v] for v in target)).copy()


def _check_cells(scope: Sequence[str], cards: dict[str, int]) -> None:
    cells = math.prod(cards[v] for v in scope)
    if cells > MAX_CELLS:
        raise ConfigError(
            f"an exact table of {cells:,} cells (over {len(scope)} variables) is past the "
            f"repair's limit {MAX_CELLS:,}; give fewer features"
        )


# ---------------------------------------------------------------------------- the inputs
@dataclass(frozen=True)
class RuleKeys:
    """A rule over the keys: the keys inside its premise (indices), the inputs each stands
    for there, and the sinks the rule allows."""

    rule: Rule
    keys: np.ndarray
    inputs: np.ndarray
    allowed: frozenset[int]


class Space:
    """The inputs of a classifier as keys, its rules over them, and its exact tables.

    Parameters
    ----------
    network : Network
    spec : ResolvedSpec
    rules : sequence of Rule
        The rules (premise by state index, conclusion by terminal name).
    """

    def __init__(self, network: Network, spec: ResolvedSpec, rules: Sequence[Rule]):
        self.network = network
        self.spec = spec
        self.cls = spec.class_variable
        self.terminals = spec_terminals(network, spec)
        self.argmax = spec.is_argmax
        self.positive = None if self.argmax else network.states[self.cls].index(str(spec.positive))
        self.pos_sink = None if self.argmax else self.terminals.index(str(spec.positive))
        self.threshold = None if self.argmax else exact_threshold(float(spec.threshold or 0))
        features = set(spec.order)
        relevant = network.ancestors([self.cls, *spec.order])
        self.inner: list[str] = []
        zero_scopes: list[tuple[tuple[str, ...], np.ndarray]] = []
        for v in network.variables:
            if v not in relevant:
                continue
            scope = (*network.parents[v], v)
            if all(u in features for u in scope):
                zero = np.equal(network.exact_cpt(v), 0).astype(bool)
                if zero.any():
                    zero_scopes.append((scope, zero))
            else:
                self.inner.append(v)
        used = {u for v in self.inner for u in (*network.parents[v], v)}
        used |= {u for s, _ in zero_scopes for u in s}
        self.columns = tuple(f for f in spec.order if f in used)
        self.cards = tuple(network.card(f) for f in self.columns)
        self.n_keys = math.prod(self.cards)
        if self.n_keys > MAX_KEYS:
            raise ConfigError(
                f"{network.source}: the decision depends on {len(self.columns)} features with "
                f"{self.n_keys:,} joint states, more than the {MAX_KEYS:,} the repair "
                "enumerates; give fewer features (--features)"
            )
        grid = np.indices(self.cards).reshape(len(self.cards), -1).T if self.cards else None
        self.grid = grid.astype(np.int64) if grid is not None else np.zeros((1, 0), dtype=np.int64)
        at = {f: i for i, f in enumerate(self.columns)}
        self.impossible = np.zeros(self.n_keys, dtype=bool)
        for scope, zero in zero_scopes:
            self.impossible |= zero[tuple(self.grid[:, at[u]] for u in scope)]
        others = [f for f in spec.order if f not in at]
        self.inputs_per_key = math.prod(network.card(f) for f in others)
        self.rules = [self._rule_keys(r, at, others) for r in rules]

    def _rule_keys(self, rule: Rule, at: dict[str, int], others: Sequence[str]) -> RuleKeys:
        inside = np.ones(self.n_keys, dtype=bool)
        for f, allowed in rule.premise.items():
            if f in at:
                inside &= np.isin(self.grid[:, at[f]], allowed)
        per_key = math.prod(
            len(rule.premise[f]) if f in rule.premise else self.network.card(f) for f in others
        )
        keys = np.flatnonzero(inside)
        sinks = frozenset(self.terminals.index(c) for c in rule.conclusion)
        return RuleKeys(rule, keys, np.full(keys.size, per_key, dtype=np.int64), sinks)

    def key_text(self, key: int) -> str:
        """An input a key stands for: its key features' states (the rest any value)."""
        row = self.grid[key]
        return ", ".join(
            f"{f}={self.network.states[f][int(j)]}" for f, j in zip(self.columns, row, strict=True)
        )

    # ------------------------------------------------------------------ exact tables
    def _factors(self, network: Network, skip: str | None = None) -> list[Factor]:
        """The key CPTs of ``network`` scaled to integers (``skip`` left out)."""
        return [
            ((*network.parents[v], v), network.scaled_cpt(v)[0]) for v in self.inner if v != skip
        ]

    def _cards(self, network: Network) -> dict[str, int]:
        return {v: network.card(v) for v in network.variables}

    def joint(self, network: Network | None = None) -> np.ndarray:
        """Scaled ``P(c, key)`` of every key (``network``: one with this one's structure, by
        default this one): object array ``(n_keys, card(C))`` of Python integers."""
        net = self.network if network is None else network
        table = eliminate(self._factors(net), [*self.columns, self.cls], self._cards(net))
        return table.reshape(self.n_keys, net.card(self.cls))

    def float_joint(self, network: Network) -> np.ndarray:
        """``P(c, key)`` of every key in floats (one contraction of the key CPTs), each key's
        row divided by its sum (0 where ``P(x)`` is 0): for searches, never for a decision."""
        import opt_einsum

        net = network
        names = {v: i for i, v in enumerate(net.variables)}
        operands: list[object] = []
        for v in self.inner:
            operands += [net.cpts[v], [names[u] for u in (*net.parents[v], v)]]
        out = [names[u] for u in (*self.columns, self.cls)]
        table = opt_einsum.contract(*operands, out, optimize="auto").reshape(self.n_keys, -1)
        total = table.sum(axis=1, keepdims=True)
        return np.asarray(table / np.where(total > 0, total, 1.0))

    def family(self, var: str) -> np.ndarray:
        """The derivative table of ``var``'s CPT: ``G[key, c, r, s]`` with
        ``P(c, key) = sum_{r, s} G[key, c, r, s] * theta[r, s]`` (scaled integers), ``r`` the
        flat parent row, ``s`` the state: shape ``(n_keys, card(C), rows, card(var))``."""
        net = self.network
        cards = self._cards(net)
        factors = self._factors(net, skip=var)
        fam = (*net.parents[var], var)
        shared = set(self.columns) | {self.cls}
        names = []
        for u in fam:
            if u in shared:  # a key feature or the class: a copy tied to it
                alias = f"\0{u}"
                cards[alias] = cards[u]
                eye = np.empty((cards[u], cards[u]), dtype=object)
                eye[...] = 0
                np.fill_diagonal(eye, 1)
                factors.append(((u, alias), eye))
                names.append(alias)
            else:
                names.append(u)
        table = eliminate(factors, [*self.columns, self.cls, *names], cards)
        return table.reshape(self.n_keys, cards[self.cls], -1, cards[var])

    # ------------------------------------------------------------------ decisions
    def decisions(self, joint: np.ndarray) -> np.ndarray:
        """Sink of each key from its scaled ``P(c, key)``: the compiler's exact threshold
        decision, or the argmax state where it leads every other by more than
        :data:`MARGIN` (-1 where none does: near a tie)."""
        den = joint.sum(axis=1)
        zero = np.equal(den, 0).astype(bool) | self.impossible
        if not self.argmax:
            assert self.threshold is not None and self.pos_sink is not None
            t = self.threshold
            pos = np.greater_equal(joint[:, self.positive] * t.denominator, den * t.numerator)
            pos = pos.astype(bool) & ~zero
            return np.where(pos, self.pos_sink, 1 - self.pos_sink).astype(np.int64)
        best = np.argmax(joint, axis=1)
        clear = self._leads(joint, den, [best[k : k + 1] for k in range(self.n_keys)])
        return np.where(zero, 0, np.where(clear, best, -1)).astype(np.int64)

    def _leads(
        self, joint: np.ndarray, den: np.ndarray, allowed: Sequence[np.ndarray]
    ) -> np.ndarray:
        """Per key (row of ``joint``): whether its best state among ``allowed[key]`` leads
        every other state by more than :data:`MARGIN` of ``P(x)``."""
        out = np.zeros(joint.shape[0], dtype=bool)
        for k, (row, total, ok) in enumerate(
            zip(joint.tolist(), den.tolist(), allowed, strict=True)
        ):
            inside = max(row[c] for c in ok)
            outside = max((row[c] for c in range(len(row)) if c not in ok), default=None)
            out[k] = outside is None or (inside - outside) * MARGIN.denominator > (
                total * MARGIN.numerator
            )
        return out

    def satisfied(self, joint: np.ndarray, r: RuleKeys) -> np.ndarray:
        """Per key of rule ``r``: whether it gets a sink the rule allows (argmax: clearly,
        as :data:`MARGIN` asks)."""
        if not self.argmax:
            return np.isin(self.decisions(joint)[r.keys], list(r.allowed))
        sub = joint[r.keys]
        den = sub.sum(axis=1)
        zero = np.equal(den, 0).astype(bool) | self.impossible[r.keys]
        ok = np.array(sorted(r.allowed))
        lead = self._leads(sub, den, [ok] * r.keys.size)
        return np.where(zero, 0 in r.allowed, lead)

    def holds(self, joint: np.ndarray, rules: Sequence[RuleKeys] | None = None) -> bool:
        """Whether every rule (of ``rules``, default all) holds at these scaled joints."""
        return all(self.satisfied(joint, r).all() for r in (self.rules if rules is None else rules))


# ---------------------------------------------------------------------------- lines
@dataclass(frozen=True)
class Lines:
    """``Q[key, c](u) = alpha + beta * u``: a positive multiple of ``P(c, key)`` when the
    parameter (scaled by the CPT's denominator, ``u = t * scale``) is ``u`` and its row
    co-varies; ``u`` ranges over ``(0, top)``, ``u0`` is the value now."""

    parameter: Parameter
    alpha: np.ndarray
    beta: np.ndarray
    u0: int
    top: int
    scale: int


def parameter_lines(space: Space, var: str, family: np.ndarray) -> list[Lines]:
    """The lines of every parameter of ``var`` whose row can co-vary (its other entries are
    not all 0), from ``var``'s derivative table (:meth:`Space.family`)."""
    net = space.network
    ints, scale = net.scaled_cpt(var)
    n = ints.reshape(-1, net.card(var))
    par = net.parents[var]
    pcards = [net.card(p) for p in par]
    total = (family * n[None, None]).sum(axis=(2, 3))
    out = []
    for r in range(n.shape[0]):
        grs = family[:, :, r, :]
        prow = (grs * n[r][None, None]).sum(axis=2)
        rest = total - prow
        ns = int(sum(n[r].tolist()))
        row = tuple(int(i) for i in np.unravel_index(r, pcards)) if par else ()
        for s in range(n.shape[1]):
            k = ns - int(n[r, s])
            if k <= 0:
                continue
            others = prow - grs[:, :, s] * n[r, s]
            alpha = rest * k + others * ns
            beta = grs[:, :, s] * k - others
            out.append(Lines(Parameter(var, row, s), alpha, beta, int(n[r, s]), ns, scale))
    return out


# ---------------------------------------------------------------------------- interval sets
def ratio_bounds(
    a: np.ndarray, b: np.ndarray
) -> tuple[list[Fraction | None], list[Fraction | None], np.ndarray]:
    """For each row of the strict inequalities ``a[i, j] + b[i, j] u > 0`` (all ``j``): the
    open interval of ``u`` where all hold, as ``(lo, hi)`` lists (``None``: unbounded) and
    whether it is empty for a ``b = 0`` term alone.

    Exact: the largest ``-a/b`` over ``b > 0`` and the smallest over ``b < 0`` are found by
    cross-multiplying integers, one column at a time over every row at once.
    """
    rows = a.shape[0]
    pos = np.greater(b, 0).astype(bool)
    neg = np.less(b, 0).astype(bool)
    dead = ((~pos & ~neg) & ~np.greater(a, 0).astype(bool)).any(axis=1)
    lo_n = np.zeros(rows, dtype=object)
    lo_d = np.zeros(rows, dtype=object)
    hi_n = np.zeros(rows, dtype=object)
    hi_d = np.zeros(rows, dtype=object)
    has_lo = np.zeros(rows, dtype=bool)
    has_hi = np.zeros(rows, dtype=bool)
    for j in range(a.shape[1]):
        # -a/b as n/d with d > 0
        pn, pd = -a[:, j], b[:, j]
        take = pos[:, j] & (~has_lo | np.greater(pn * lo_d, lo_n * pd).astype(bool))
        lo_n = np.where(take, pn, lo_n)
        lo_d = np.where(take, pd, lo_d)
        has_lo |= pos[:, j]
        nn, nd = a[:, j], -b[:, j]
        take = neg[:, j] & (~has_hi | np.less(nn * hi_d, hi_n * nd).astype(bool))
        hi_n = np.where(take, nn, hi_n)
        hi_d = np.where(take, nd, hi_d)
        has_hi |= neg[:, j]
    lo = [
        Fraction(int(n), int(d)) if h else None for n, d, h in zip(lo_n, lo_d, has_lo, strict=True)
    ]
    hi = [
        Fraction(int(n), int(d)) if h else None for n, d, h in zip(hi_n, hi_d, has_hi, strict=True)
    ]
    return lo, hi, dead


def clip(lo: Fraction | None, hi: Fraction | None, top: int) -> Interval | None:
    """``(lo, hi)`` within ``(0, top)``, or ``None`` when nothing is left."""
    a = Fraction(0) if lo is None else max(lo, Fraction(0))
    b = Fraction(top) if hi is None else min(hi, Fraction(top))
    return (a, b) if a < b else None


def intersect(x: Sequence[Interval], y: Sequence[Interval]) -> list[Interval]:
    """Intersection of two sorted lists of disjoint open intervals."""
    out: list[Interval] = []
    i = j = 0
    while i < len(x) and j < len(y):
        lo = max(x[i][0], y[j][0])
        hi = min(x[i][1], y[j][1])
        if lo < hi:
            out.append((lo, hi))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def nearest(sets: Sequence[Interval], u0: Fraction) -> tuple[Fraction, Interval] | None:
    """The point of the closure of ``sets`` nearest ``u0`` (ties: the lower one), and the
    interval it closes."""
    best: tuple[Fraction, Interval] | None = None
    for lo, hi in sets:
        point = lo if u0 <= lo else hi if u0 >= hi else u0
        if best is None or abs(point - u0) < abs(best[0] - u0):
            best = (point, (lo, hi))
    return best


# ---------------------------------------------------------------------------- good sets
def good_sets(
    space: Space, lines: Lines, r: RuleKeys, positions: np.ndarray
) -> list[list[Interval]]:
    """Per chosen key of rule ``r`` (``positions`` in ``r.keys``): the open set of ``u`` in
    ``(0, top)`` where it gets a sink the rule allows, exactly, as sorted disjoint open
    intervals (none: no value)."""
    keys = r.keys[positions]
    alpha, beta = lines.alpha[keys], lines.beta[keys]
    impossible = space.impossible[keys]
    top = lines.top
    full = [(Fraction(0), Fraction(top))]
    if not space.argmax:
        return _threshold_sets(space, alpha, beta, impossible, r.allowed, top, full)
    return _argmax_sets(alpha, beta, impossible, r.allowed, top, full)


def _threshold_sets(
    space: Space,
    alpha: np.ndarray,
    beta: np.ndarray,
    impossible: np.ndarray,
    allowed: frozenset[int],
    top: int,
    full: list[Interval],
) -> list[list[Interval]]:
    assert space.threshold is not None and space.pos_sink is not None
    p, q = space.threshold.numerator, space.threshold.denominator
    pa, pb = alpha.sum(axis=1), beta.sum(axis=1)
    fa = alpha[:, space.positive] * q - pa * p
    fb = beta[:, space.positive] * q - pb * p
    n = alpha.shape[0]
    if allowed == {space.pos_sink, 1 - space.pos_sink}:
        return [full] * n
    if space.pos_sink in allowed:
        # positive: f > 0 (or f = 0 throughout) and P(x) > 0
        flat = np.equal(fa, 0).astype(bool) & np.equal(fb, 0).astype(bool)
        a = np.stack([np.where(flat, 1, fa), pa], axis=1)
        b = np.stack([np.where(flat, 0, fb), pb], axis=1)
        lo, hi, dead = ratio_bounds(a, b)
        dead = dead | impossible
    else:
        # negative: f < 0, or P(x) = 0 throughout
        none = np.equal(pa, 0).astype(bool) & np.equal(pb, 0).astype(bool)
        none |= impossible
        a = np.where(none, 1, -fa)[:, None]
        b = np.where(none, 0, -fb)[:, None]
        lo, hi, dead = ratio_bounds(a, b)
    out = []
    for i in range(n):
        got = None if dead[i] else clip(lo[i], hi[i], top)
        out.append([got] if got is not None else [])
    return out


def _argmax_sets(
    alpha: np.ndarray,
    beta: np.ndarray,
    impossible: np.ndarray,
    allowed: frozenset[int],
    top: int,
    full: list[Interval],
) -> list[list[Interval]]:
    n, nc = alpha.shape
    pa, pb = alpha.sum(axis=1), beta.sum(axis=1)
    zero = (np.equal(pa, 0).astype(bool) & np.equal(pb, 0).astype(bool)) | impossible
    outside = [d for d in range(nc) if d not in allowed]
    if not outside:
        return [full] * n
    per_state: list[tuple[list[Fraction | None], list[Fraction | None], np.ndarray]] = []
    for c in sorted(allowed):
        # c leads every state outside by more than MARGIN P(x): D (Q_c - Q_d) - N sum Q > 0
        a = np.stack(
            [
                (alpha[:, c] - alpha[:, d]) * MARGIN.denominator - pa * MARGIN.numerator
                for d in outside
            ],
            axis=1,
        )
        b = np.stack(
            [
                (beta[:, c] - beta[:, d]) * MARGIN.denominator - pb * MARGIN.numerator
                for d in outside
            ],
            axis=1,
        )
        per_state.append(ratio_bounds(a, b))
    out = []
    for i in range(n):
        if zero[i]:
            out.append(full if 0 in allowed else [])
            continue
        pieces = []
        for lo, hi, dead in per_state:
            if not dead[i]:
                piece = clip(lo[i], hi[i], top)
                if piece is not None:
                    pieces.append(piece)
        out.append(_merge(pieces))
    return out


def _merge(pieces: list[Interval]) -> list[Interval]:
    """The union of open intervals as sorted disjoint ones (touching ends stay apart: the
    point between them is in neither)."""
    pieces.sort()
    out: list[Interval] = []
    for lo, hi in pieces:
        if out and lo < out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out
