"""Cost model of the BN compiler: contraction plans and the memory and time of each route.

Nothing here allocates the tables it sizes: every figure comes from shapes alone, so a
route that cannot fit is refused before it starts. The rates are calibrated on a 2-core
machine (``bench/bn_compile.py`` prints estimate beside measurement); estimates are meant
to be right within a small factor, which is what choosing and refusing need.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import opt_einsum

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn.classifier import ResolvedSpec
from boxwatch.offline.bn.elimination import HEURISTICS, elimination_path
from boxwatch.offline.bn.exact import ErrorBound, absolute_error, contraction_roundings
from boxwatch.offline.bn.limits import Deadline, format_bytes, format_seconds
from boxwatch.offline.bn.network import Network
from boxwatch.offline.bn.separator import prefix_side

Factor = tuple[tuple[str, ...], np.ndarray]

BLAS_CELL_RATE = 5e9
BLAS_COPY_RATE = 1.5e8
EINSUM_CELL_RATE = 8e8
STEP_SECONDS = 1.5e-5
JOINT_SECONDS_PER_INPUT = 1.8e-7
JOINT_BYTES_PER_INPUT = 44
"""What the joint route keeps per input once its table is contracted: the two margins'
operands, the posterior, the decision, the sink ids and the first level's keys."""
ADDITIVE_SECONDS_PER_ITEM = 6e-6
ADDITIVE_BYTES_PER_ITEM = 400

ESTIMATE_ACCURACY = 2.0
"""How far a route's memory estimate may be from its measured peak, either way
(``bench/bn_compile.py estimates`` measures it): a route is refused only when its estimate
exceeds the limit by more than this factor (:func:`may_fit`)."""
TIME_ACCURACY = 3.0
"""The same for the time estimate (seconds on a machine of two shared cores). On the bench
the time was 0.5-7.7x the estimate: too low more often than too high, which a run's
deadline catches; refusing only past 3x refuses nothing that would have finished."""

# The separator route (calibrated on a 2-core machine: bench/bn_compile.py estimates).
SEPARATOR_BLOCK_CELLS = 1 << 23
"""Completions decided in one step (their margins and decisions held at once)."""
UP_BLOCK_CELLS = 1 << 22
"""Cells of one block of the prefix message (the message is never made whole)."""
BUILD_CHUNK_CELLS = 1 << 22
"""Completions of distinct sub-classifiers merged into nodes at once."""
STEP_BYTES_PER_CELL = 20
"""Bytes a step holds per completion: margin and normalising sum (8 each), decision,
packed bits and their sorting."""
PATTERN_BYTES = 100
"""Bookkeeping of one distinct sub-classifier besides its bits (a bytes object, a dict slot)."""
SETTLE_BYTES_PER_STATE = 32
"""The early test of a block's prefix messages: four float tables over the hidden states."""
BUILD_BYTES_PER_CELL = 14
"""Bytes per completion while a chunk of sub-classifiers is merged into nodes (the
unpacked decisions, the keys and node ids of their first levels)."""
PREFIX_BUILD_BYTES = 64
"""Bytes per prefix while the prefixes' node ids are merged level by level (their node ids,
keys and sort, and the nodes of the first levels above the cut)."""
PREFIX_COUNT_BYTES = 24
"""The same where the first level's keys are few enough to be counted, not sorted."""
MATMUL_RATE = 1.5e10
"""Multiply-adds per second of the matrix products (float64 BLAS, one core)."""
SEPARATOR_SECONDS_PER_INPUT = 6e-9
"""Deciding one completion of a prefix not decided early (error window, bits, keys)."""
SEPARATOR_SECONDS_PER_PREFIX = 3e-7
SETTLE_SECONDS_PER_STATE = 2e-9
"""The early test of a prefix message, per shared state."""
BUILD_SECONDS_PER_CELL = 1.5e-8
"""Merging one completion of a distinct sub-classifier into nodes (an eighth of it where
the last three features are binary: a byte of decisions is merged at once)."""
SETTLE_SAMPLES = 1024
"""Prefixes drawn to measure the share decided early (:func:`sample_prefixes`)."""
SAMPLE_LOWER_CELLS = 1 << 23
"""Largest lower message made while planning, to count the sample's sub-classifiers..."""
SAMPLE_LOWER_SECONDS = 1.0
"""...and the longest its contraction may be estimated to take."""
DISTINCT_MARGIN = 4.0
"""Chao1 on a sample of a thousand prefixes sees few of the rare sub-classifiers: on the
bench's problems the distinct count was 1.5-15x its figure (tcc4e-var_12-30: 4,785 against
530), which matters where it decides whether the prefixes' first merge is counted or
sorted; the estimate counts this many times it (at most the prefixes not decided early)."""
SAMPLE_STEP_CELLS = 1 << 20
"""Completions of sampled prefixes decided at once while planning."""
SEPARATOR_CUTS_MEASURED = 5
"""Cuts that fit whose contractions are planned and early share measured (the fastest
floors first)."""


def as_float(n: float) -> float:
    """``n`` as a float; ``inf`` for integers beyond the float range (2 ** 2000 inputs)."""
    try:
        return float(n)
    except OverflowError:
        return math.inf


class CompileLimitError(ConfigError):
    """No route fits the memory or time limit; the message names the estimates and limits."""


@dataclass(frozen=True)
class Contraction:
    """A planned ``sum``-product of factors: opt_einsum expression and path, and its cost.

    ``seconds`` is estimated step by step: where opt_einsum hands the step to BLAS
    (``tensordot``), the cells of its operands and result at :data:`BLAS_COPY_RATE` (the
    copies into matrix order) and of their union at :data:`BLAS_CELL_RATE`; else the union's
    cells at :data:`EINSUM_CELL_RATE` per operand; plus :data:`STEP_SECONDS` a step.
    """

    expr: str
    path: list[tuple[int, ...]]
    flops: float
    largest_cells: float
    seconds: float
    roundings: int
    """Roundings any one term meets along the path (:func:`~.exact.contraction_roundings`)."""
    peak_cells: float = 0.0
    """Cells alive at once while it runs, its output included (:func:`peak_cells`)."""

    def run(self, factors: Sequence[Factor]) -> np.ndarray:
        """Contract ``factors`` (the ones this plan was made for) along the planned path."""
        return opt_einsum.contract(self.expr, *[t for _, t in factors], optimize=self.path)


def _expression(factors: Sequence[Factor], out: Sequence[str]) -> str:
    names: dict[str, str] = {}
    for scope, _ in factors:
        for v in scope:
            names.setdefault(v, opt_einsum.get_symbol(len(names)))
    subs = ",".join("".join(names[v] for v in scope) for scope, _ in factors)
    return f"{subs}->{''.join(names[v] for v in out)}"


def plan_contraction(
    factors: Sequence[Factor],
    out: Sequence[str],
    *,
    max_cells: float | None = None,
    deadline: Deadline | None = None,
) -> Contraction:
    """The best of three deterministic orders: min-fill and min-weight elimination
    (:mod:`boxwatch.offline.bn.elimination`) and opt_einsum's pairwise greedy.

    Among the candidate paths whose largest intermediate has at most ``max_cells`` cells,
    the one with the least estimated time; when none fits, the one with the smallest
    intermediate. Flops and cells are opt_einsum's figures for the path. ``deadline`` is
    checked while the paths are searched.
    """
    expr = _expression(factors, out)
    shapes = [t.shape for _, t in factors]
    cards = {v: n for scope, t in factors for v, n in zip(scope, t.shape, strict=True)}
    scopes = [scope for scope, _ in factors]
    paths: list[Any] = [
        elimination_path(scopes, cards, out, h, deadline=deadline) for h in HEURISTICS
    ]
    candidates: list[Contraction] = []
    for optimize in (*paths, "greedy"):
        if deadline is not None:
            deadline.check(f"sizing the paths of a contraction of {len(factors):,} factors")
        path, info = opt_einsum.contract_path(expr, *shapes, shapes=True, optimize=optimize)
        candidates.append(
            Contraction(
                expr,
                list(path),
                float(info.opt_cost),
                float(info.largest_intermediate),
                _seconds(info),
                contraction_roundings(info),
                peak_cells(info, shapes),
            )
        )
    fits = [c for c in candidates if max_cells is None or c.largest_cells <= max_cells]
    if fits:
        return min(fits, key=lambda c: (c.seconds, c.largest_cells))
    return min(candidates, key=lambda c: (c.largest_cells, c.seconds))


def peak_cells(info: Any, shapes: Sequence[tuple[int, ...]]) -> float:
    """Cells a planned opt_einsum contraction holds at once (its ``PathInfo``), following
    what opt_einsum allocates step by step: each step's result beside the intermediates
    still to be used, and for a BLAS step (``tensordot``) a copy of both operands in matrix
    order. The input tables are the network's and are not counted; the output is."""
    size = info.size_dict
    operands: list[tuple[float, bool]] = [(float(math.prod(s)), False) for s in shapes]
    live = peak = 0.0
    for inds, _, expr, _, blas in info.contraction_list:
        out = expr.split("->")[1]
        taken = [operands[i] for i in inds]
        for i in sorted(inds, reverse=True):
            operands.pop(i)
        result = float(math.prod(size[c] for c in out))
        copies = sum(c for c, _ in taken) if blas else 0.0
        peak = max(peak, live + copies + result)
        live += result - sum(c for c, inner in taken if inner)
        operands.append((result, True))
    return peak


def _seconds(info: Any) -> float:
    """Estimated seconds of a planned contraction (see :class:`Contraction`)."""
    size = info.size_dict
    total = 0.0
    for entry in info.contraction_list:
        inputs, out = entry[2].split("->")
        operands = inputs.split(",")
        cells = math.prod(size[ch] for ch in set("".join(operands)))
        if entry[4]:  # tensordot: its operands copied into matrix order, then the product
            moved = sum(math.prod(size[ch] for ch in x) for x in [*operands, out])
            total += STEP_SECONDS + moved / BLAS_COPY_RATE + cells / BLAS_CELL_RATE
        else:
            total += STEP_SECONDS + cells * len(operands) / EINSUM_CELL_RATE
    return total


@dataclass(frozen=True)
class Estimate:
    """What one route is expected to need: peak bytes, seconds, and how it was sized."""

    route: str
    bytes: float
    seconds: float
    detail: str
    sized: bool = True
    """False for a route whose planning ran out of time (its figures are unknown)."""

    def text(self) -> str:
        """``joint: ~1.2 GiB, ~3 s (largest intermediate 4.9e+05 cells)``."""
        if not self.sized:
            return f"{self.route}: {self.detail}"
        return (
            f"{self.route}: ~{format_bytes(self.bytes)}, ~{format_seconds(self.seconds)} "
            f"({self.detail})"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``estimate`` in ``compile-bn --json``)."""
        return {
            "route": self.route,
            "bytes": self.bytes,
            "seconds": self.seconds,
            "detail": self.detail,
        }


def relevant_factors(network: Network, keep: Sequence[str]) -> list[Factor]:
    """CPTs of ``keep`` and their ancestors (the rest are barren and sum to one)."""
    rel = network.ancestors(keep)
    return [((*network.parents[v], v), network.cpts[v]) for v in network.variables if v in rel]


def unit_factors(network: Network, names: Sequence[str]) -> list[Factor]:
    """All-ones factors that keep ``names`` in an output even where no CPT mentions them."""
    return [((v,), np.ones(network.card(v))) for v in names]


# ---------------------------------------------------------------------------- joint route
@dataclass(frozen=True)
class JointPlan:
    """The joint table ``P(C, X)``: its contraction and the route's estimate."""

    contraction: Contraction | None
    estimate: Estimate


def plan_joint(
    network: Network,
    spec: ResolvedSpec,
    *,
    max_memory: float,
    deadline: Deadline | None = None,
) -> JointPlan:
    """Plan the contraction to ``P(C, X)`` and size the joint route.

    The joint table alone is sized first, from the cardinalities: when it cannot fit
    ``max_memory`` the contraction is not planned at all (planning one over hundreds of
    factors takes minutes) and the plan has no contraction, only the table's estimate.
    ``deadline`` is checked while the contraction is planned.
    """
    keep = [spec.class_variable, *spec.order]
    inputs = math.prod(network.card(f) for f in spec.order)
    table = network.card(spec.class_variable) * inputs
    floor = 8 * table + JOINT_BYTES_PER_INPUT * inputs
    if floor > ESTIMATE_ACCURACY * max_memory:
        detail = f"{as_float(inputs):.3g} inputs, the joint table alone (contraction not planned)"
        seconds = JOINT_SECONDS_PER_INPUT * as_float(inputs)
        return JointPlan(None, Estimate("joint", as_float(floor), seconds, detail))
    c = plan_contraction(
        relevant_factors(network, keep), keep, max_cells=max_memory / 16, deadline=deadline
    )
    table = network.card(spec.class_variable) * inputs
    # the contraction (its output, the table, included); the table beside the margins'
    # operands; then what is kept per input once the table is gone
    nbytes = max(8 * c.peak_cells, 8 * table + 16 * inputs, JOINT_BYTES_PER_INPUT * inputs)
    if spec.is_argmax:  # the posterior of every state is kept, and a tie mask beside it
        nbytes += 9 * table
    seconds = c.seconds + JOINT_SECONDS_PER_INPUT * inputs
    detail = (
        f"{inputs:.3g} inputs, contraction {c.flops:.2g} flops, largest intermediate "
        f"{c.largest_cells:.2g} cells"
    )
    return JointPlan(c, Estimate("joint", nbytes, seconds, detail))


def joint_error_bound(
    network: Network, spec: ResolvedSpec, factors: Sequence[Factor], contraction: Contraction
) -> ErrorBound:
    """Error bound of the joint route's ``P(pos, x)`` and ``P(x) = sum_c P(c, x)``.

    Each term meets one conversion per CPT, the contraction's roundings, and for ``P(x)``
    the ``card(C) - 1`` additions over the class (docs/exactness.md).
    """
    cc = network.card(spec.class_variable)
    k = len(factors) + contraction.roundings
    a = absolute_error(network, factors, contraction.flops, {spec.class_variable, *spec.order})
    return ErrorBound(k, k + cc - 1, a, cc * a * 1.01)


# ---------------------------------------------------------------------------- separator route
@dataclass(frozen=True)
class Cut:
    """The features split after level ``k``: which CPTs go to which side, what they share.

    ``upper`` CPTs lie on the prefix's side of the separator; ``lower`` ones reach beyond it
    (every CPT mentioning a suffix feature is one). ``z`` is the class followed
    by the hidden variables both sides mention; ``ctx`` the prefix features the lower side
    mentions (the completions' context). ``class_free``: no lower CPT mentions the class,
    so the lower message has no class axis (one table serves every class state) and a
    prefix whose every completion has one decision can be decided from its prefix message.
    """

    k: int
    prefix: tuple[str, ...]
    suffix: tuple[str, ...]
    upper: tuple[Factor, ...]
    lower: tuple[Factor, ...]
    z: tuple[str, ...]
    ctx: tuple[str, ...]
    n_pre: int
    n_suf: int
    n_ctx: int
    shared_states: int
    prefix_cards: tuple[int, ...] = ()
    n_class: int = 1
    class_free: bool = False
    suffix_cards: tuple[int, ...] = ()

    @property
    def hidden_states(self) -> int:
        """States of the shared hidden variables (``z`` without the class)."""
        return self.shared_states // self.n_class

    @property
    def z_lower(self) -> tuple[str, ...]:
        """The shared variables of the lower message: ``z``, without the class when
        :attr:`class_free`."""
        return self.z[1:] if self.class_free else self.z

    @property
    def lower_states(self) -> int:
        """States of :attr:`z_lower`."""
        return self.hidden_states if self.class_free else self.shared_states

    @property
    def up_out(self) -> list[str]:
        return [*self.prefix, *self.z]

    @property
    def lo_out(self) -> list[str]:
        return [*self.ctx, *self.suffix, *self.z_lower]

    def up_factors(self, network: Network) -> list[Factor]:
        return [*self.upper, *unit_factors(network, [*self.z, *self.prefix])]

    def lo_factors(self, network: Network) -> list[Factor]:
        return [*self.lower, *unit_factors(network, [*self.z_lower, *self.ctx])]

    def block_factors(self, values: Mapping[str, int], network: Network) -> list[Factor]:
        """The upper CPTs with the prefix features of ``values`` given (their axes indexed
        away: views, no copies), and unit factors keeping ``z`` and the other prefix
        features in the output."""
        rest = [f for f in self.prefix if f not in values]
        return [*fix(self.upper, values), *unit_factors(network, [*self.z, *rest])]


def fix(factors: Sequence[Factor], values: Mapping[str, int]) -> list[Factor]:
    """``factors`` with the variables of ``values`` given: each axis of one indexed away
    (a view); a factor left without axes is kept as a 0-d table."""
    out: list[Factor] = []
    for scope, table in factors:
        if not any(v in values for v in scope):
            out.append((scope, table))
            continue
        index = tuple(values[v] if v in values else slice(None) for v in scope)
        out.append((tuple(v for v in scope if v not in values), table[index]))
    return out


def sampled(factors: Sequence[Factor], rows: Mapping[str, np.ndarray]) -> list[Factor]:
    """``factors`` with the variables of ``rows`` given row by row: one batch axis
    (:data:`BATCH`, first) over the rows replaces their axes."""
    out: list[Factor] = []
    for scope, table in factors:
        given = [i for i, v in enumerate(scope) if v in rows]
        if not given:
            out.append((scope, table))
            continue
        moved = np.moveaxis(table, given, list(range(len(given))))
        picked = moved[tuple(rows[scope[i]] for i in given)]
        out.append(((BATCH, *(v for v in scope if v not in rows)), picked))
    return out


def cut_at(network: Network, spec: ResolvedSpec, k: int) -> Cut:
    """The separator cut of ``spec.order`` after its first ``k`` features.

    The CPTs are split along a minimum vertex separator of the moral graph
    (:func:`~boxwatch.offline.bn.separator.prefix_side`): those with a variable beyond it go
    below, the rest above.
    """
    cls, order = spec.class_variable, list(spec.order)
    prefix, suffix = tuple(order[:k]), tuple(order[k:])
    factors = relevant_factors(network, [cls, *order])
    side, cut = prefix_side(network, [s for s, _ in factors], cls, prefix, suffix)
    near = side | cut | {cls}
    lower = tuple(f for f in factors if not near.issuperset(f[0]))
    upper = tuple(f for f in factors if near.issuperset(f[0]))
    vars_up = {v for scope, _ in upper for v in scope}
    vars_lo = {v for scope, _ in lower for v in scope}
    feats = set(order)
    shared = [v for v in network.variables if v in vars_up and v in vars_lo and v not in feats]
    z = (cls, *(v for v in shared if v != cls))
    ctx = tuple(f for f in prefix if f in vars_lo)
    return Cut(
        k,
        prefix,
        suffix,
        upper,
        lower,
        z,
        ctx,
        math.prod(network.card(f) for f in prefix),
        math.prod(network.card(f) for f in suffix),
        math.prod(network.card(f) for f in ctx),
        math.prod(network.card(v) for v in z),
        tuple(network.card(f) for f in prefix),
        network.card(cls),
        cls not in vars_lo,
        tuple(network.card(f) for f in suffix),
    )


@dataclass(frozen=True)
class MemoryBill:
    """Peak bytes of each phase of a route, counted from shapes: the arrays each phase
    holds at once (``bench/bn_compile.py estimates`` measures them against the peak RSS)."""

    phases: tuple[tuple[str, float], ...]

    @property
    def peak(self) -> float:
        return max((b for _, b in self.phases), default=0.0)

    @property
    def where(self) -> str:
        """The phase holding the peak."""
        return max(self.phases, key=lambda p: p[1])[0] if self.phases else "-"


@dataclass(frozen=True)
class SeparatorPlan:
    """The chosen cut, its two contractions, and the route's estimate.

    The prefix message is made a block of prefixes at a time: ``up`` contracts the upper
    CPTs with the first ``fixed`` prefix features given (:meth:`block`), each block holding
    :attr:`block_prefixes` consecutive prefixes. ``settled`` is the share of prefixes
    expected to be decided from their prefix message alone (or their block's,
    :attr:`blocks`), measured on :data:`SETTLE_SAMPLES` prefixes drawn at random (0 where
    no prefix can be).
    """

    cut: Cut
    up: Contraction
    lo: Contraction
    estimate: Estimate
    fixed: int = 0
    settled: float = 0.0
    memory: MemoryBill | None = None
    blocks: np.ndarray | None = field(default=None, compare=False, repr=False)
    """Per block: its prefixes all decided (0 / 1) before its message is made, or -1
    (:func:`decided_blocks`); None when that test does not apply."""

    @property
    def n_blocks(self) -> int:
        return math.prod(self.cut.prefix_cards[: self.fixed])

    @property
    def block_prefixes(self) -> int:
        return self.cut.n_pre // self.n_blocks

    def block(self, network: Network, b: int) -> list[Factor]:
        """The factors of block ``b`` (prefixes ``b * block_prefixes`` onwards)."""
        values: dict[str, int] = {}
        for f in reversed(self.cut.prefix[: self.fixed]):
            b, values[f] = divmod(b, network.card(f))
        return self.cut.block_factors(values, network)

    def block_message(self, network: Network, b: int, out: np.ndarray | None = None) -> np.ndarray:
        """The prefix message of block ``b``: shape ``(block_prefixes, card(C), hidden
        states)``, written into ``out`` when given (one buffer serves every block)."""
        cut = self.cut
        if out is None:
            out = np.empty(math.prod(network.card(v) for v in [*cut.prefix[self.fixed :], *cut.z]))
        shape = [network.card(v) for v in [*cut.prefix[self.fixed :], *cut.z]]
        factors = self.block(network, b)
        opt_einsum.contract(
            self.up.expr, *[t for _, t in factors], optimize=self.up.path, out=out.reshape(shape)
        )
        return out.reshape(self.block_prefixes, cut.n_class, -1)


def separator_error_bound(network: Network, plan: SeparatorPlan) -> ErrorBound:
    """Error bound of the separator route's ``P(pos, u, v)`` and ``P(u, v)``.

    One conversion per CPT, both contractions' roundings, and the final product summed over
    the shared states (without the class for ``P(pos, .)``; for ``P(.)`` the class and the
    hidden states, at most ``shared_states`` terms, whether the class is summed first or
    in the product). Underflow is weighed over every block's operations.
    """
    cut = plan.cut
    zc = cut.n_class
    shared = cut.hidden_states
    k = len(cut.upper) + len(cut.lower) + plan.up.roundings + plan.lo.roundings
    factors = [*cut.upper, *cut.lower]
    flops = plan.n_blocks * plan.up.flops + plan.lo.flops + 2.0 * cut.shared_states
    kept = {*cut.prefix, *cut.suffix, cut.z[0]}
    a = absolute_error(network, factors, flops, kept)
    return ErrorBound(k + shared, k + cut.shared_states, a, zc * a * 1.01)


def upper_error_bound(network: Network, plan: SeparatorPlan) -> ErrorBound:
    """Error bound of the margin ``u(pos, z) - t sum_c u(c, z)`` of the prefix message alone.

    Where the lower side does not mention the class, an input's margin is
    ``sum_z l(z, x) (u(pos, z) - t sum_c u(c, z))``: a prefix whose per-state margins all
    have one sign decides every completion at once. ``u(pos, .)`` meets the CPTs'
    conversions and the upper contraction's roundings; the sum over the class
    ``card(C) - 1`` more.
    """
    cut = plan.cut
    zc = cut.n_class
    k = len(cut.upper) + plan.up.roundings
    a = absolute_error(network, cut.upper, plan.n_blocks * plan.up.flops, {*cut.prefix, *cut.z})
    return ErrorBound(k, k + zc - 1, a, zc * a * 1.01)


def constant_prefixes(
    u: np.ndarray, pos: int, threshold: float, bound: ErrorBound, *, all_possible: bool
) -> np.ndarray:
    """Per prefix message (rows of ``u``, shape ``(n, card(C), hidden states)``): 0 when
    every completion is negative, 1 when every one is positive, -1 when the completions
    have to be computed.

    With a lower side free of the class, an input's exact margin ``P(pos, x) - T P(x)`` is
    ``sum_z l(z, x) g(z)`` with ``g(z) = u(pos, z) - T sum_c u(c, z)`` and ``l >= 0``. Where
    every ``g(z)`` is certainly negative (its float's sign outside ``bound``'s window) the
    margin is negative wherever ``P(x) > 0``, and an input with ``P(x) = 0`` is decided
    negative anyway. Where every ``g(z)`` is certainly positive the margin is positive
    wherever ``P(x) > 0``, and ``all_possible`` (no completion column of the lower message
    all zero) makes that every completion. No input so decided is a tie.
    """
    u_all = u.sum(axis=1)
    g = u[:, pos, :] - threshold * u_all
    # bound.undecided's window, |g| < beta u_all + c: g is certainly below 0 where
    # g + window < 0 and certainly above where g - window > 0
    beta, c = bound._beta(threshold)
    window = u_all
    window *= beta
    if c:
        window += c
    out = np.full(u.shape[0], -1, dtype=np.int8)
    out[(g + window).max(axis=1, initial=-np.inf) < 0] = 0
    if all_possible:
        out[(g - window).min(axis=1, initial=np.inf) > 0] = 1
    return out


def _block_fixed(cut: Cut) -> int:
    """Prefix features given per block of the prefix message: the fewest that bring a
    block's message to :data:`UP_BLOCK_CELLS` cells."""
    cells = as_float(cut.n_pre) * cut.shared_states
    for j in range(cut.k + 1):
        if cells <= UP_BLOCK_CELLS or j == cut.k:
            return j
        cells /= cut.prefix_cards[j]
    return cut.k


def rows_per_step(cut: Cut, argmax: bool) -> int:
    """Prefixes whose completions are decided in one step (:data:`SEPARATOR_BLOCK_CELLS`)."""
    return max(1, SEPARATOR_BLOCK_CELLS // (max(1, cut.n_suf) * (cut.n_class if argmax else 1)))


def pattern_bytes(cut: Cut, count: float, argmax: bool) -> float:
    """Bytes of ``count`` distinct sub-classifiers as the separator route keeps them: a bit
    per completion (argmax: the decided state's code), and :data:`PATTERN_BYTES` each."""
    n_suf = as_float(cut.n_suf)
    per = n_suf * (1 if cut.n_class <= 256 else 2) if argmax else n_suf / 8
    return count * (per + PATTERN_BYTES)


def separator_memory(
    cut: Cut,
    up: Contraction,
    lo: Contraction,
    fixed: int,
    distinct: float,
    argmax: bool,
    settled: float = 0.0,
) -> MemoryBill:
    """What the separator route holds at once in each phase (8 bytes a float cell):

    * *lower message*: its contraction's peak (:attr:`Contraction.peak_cells`, the output
      included), then the output and its transposed copy (one table per context, and per
      class state unless the cut is class-free);
    * *prefix blocks*: the lower tables, the sub-classifier index of every prefix (8 bytes
      each), ``distinct`` packed sub-classifiers (a bit per completion and
      :data:`PATTERN_BYTES` of bookkeeping each), and either a block's contraction or the
      block's message with the early test of its prefixes (:data:`SETTLE_BYTES_PER_STATE`
      a hidden state) or one step of decisions (:func:`rows_per_step` prefixes, at most
      the ``1 - settled`` share of a block not decided early: their messages, margins,
      decisions and packed keys, :data:`STEP_BYTES_PER_CELL` a cell);
    * *diagram*: the packed sub-classifiers merged into nodes :data:`BUILD_CHUNK_CELLS`
      completions at a time (:data:`BUILD_BYTES_PER_CELL` a cell), and the prefixes' node
      ids merged level by level (:data:`PREFIX_BUILD_BYTES` a prefix, or
      :data:`PREFIX_COUNT_BYTES` where the keys of the first level are counted).
    """
    n_pre, n_suf = as_float(cut.n_pre), as_float(cut.n_suf)
    lo_out = as_float(cut.n_ctx) * n_suf * cut.lower_states
    lower_held = 8.0 * lo_out
    lower = 8.0 * (lo.peak_cells + lo_out)
    block = n_pre / math.prod(cut.prefix_cards[:fixed])
    held = lower_held + 8.0 * n_pre
    packed = pattern_bytes(cut, distinct, argmax)
    rows = min(block * (1.0 - settled), rows_per_step(cut, argmax))
    width = cut.n_class if argmax else 1
    step = STEP_BYTES_PER_CELL * rows * n_suf * width + 8.0 * rows * (
        cut.shared_states + cut.hidden_states
    )
    message = 8.0 * block * cut.shared_states
    early = SETTLE_BYTES_PER_STATE * block * cut.hidden_states if settled else 0.0
    scan = held + packed + max(8.0 * up.peak_cells + message, message + max(step, early))
    chunk = min(distinct * n_suf, max(BUILD_CHUNK_CELLS, n_suf))
    build = 8.0 * n_pre + packed + BUILD_BYTES_PER_CELL * chunk
    # the first level above the cut compares rows of level-cut node indices: counted when
    # their keys are few (unique_rows), else sorted
    card = cut.prefix_cards[-1] if cut.prefix_cards else 1
    counted = (distinct + 2) ** card <= max(1 << 16, n_pre / card / 4)
    prefixes = packed + (PREFIX_COUNT_BYTES if counted else PREFIX_BUILD_BYTES) * n_pre
    return MemoryBill(
        (
            ("lower message", lower),
            ("prefix blocks", scan),
            ("sub-classifier nodes", build),
            ("prefix nodes", prefixes),
        )
    )


def separator_seconds(
    cut: Cut,
    up: Contraction,
    lo: Contraction,
    fixed: int,
    settled: float,
    distinct: float,
    argmax: bool,
    skipped: float = 0.0,
) -> float:
    """Estimated seconds: both contractions (the upper one once per block not decided
    before its message is made: all but ``skipped`` of them), the prefix messages' early
    test, and for the prefixes not decided early (``1 - settled``) the matrix products over
    the shared states and the decisions of every completion; then ``distinct``
    sub-classifiers merged into nodes, and the prefixes."""
    n_blocks = math.prod(cut.prefix_cards[:fixed]) * (1.0 - skipped)
    n_pre = as_float(cut.n_pre)
    live = n_pre * (1.0 - settled)
    inputs = live * as_float(cut.n_suf)
    if argmax:
        products = cut.n_class * cut.hidden_states
    elif cut.class_free:
        products = 2 * cut.hidden_states
    else:
        products = (1 + cut.n_class) * cut.hidden_states
    return (
        lo.seconds
        + n_blocks * up.seconds
        + n_pre * SEPARATOR_SECONDS_PER_PREFIX
        + n_pre * (1.0 - skipped) * cut.shared_states * SETTLE_SECONDS_PER_STATE
        + 2.0 * inputs * products / MATMUL_RATE
        + SEPARATOR_SECONDS_PER_INPUT * inputs * (cut.n_class if argmax else 1)
        + BUILD_SECONDS_PER_CELL * distinct * as_float(cut.n_suf) / (8 if _bytewise(cut) else 1)
    )


def _bytewise(cut: Cut) -> bool:
    """Whether the route merges the cut's sub-classifiers a byte of decisions at a time
    (more than three suffix features, the last three binary)."""
    return len(cut.suffix_cards) > 3 and cut.suffix_cards[-3:] == (2, 2, 2)


def _separator_floor(cut: Cut, argmax: bool = False) -> tuple[float, float, float]:
    """A cut sized before its contractions are planned, with contractions that cost
    nothing beyond writing their outputs and one distinct sub-classifier: a lower bound on
    its bytes (every prefix decided early), its seconds were no prefix decided early (what
    ranks the cuts), and a lower bound on its seconds (every prefix decided early)."""
    fixed = _block_fixed(cut)
    block = as_float(cut.n_pre) / math.prod(cut.prefix_cards[:fixed]) * cut.shared_states
    lo_cells = as_float(cut.n_ctx) * as_float(cut.n_suf) * cut.lower_states
    # contractions that only write their outputs
    up = Contraction("", [], 0.0, block, block / EINSUM_CELL_RATE, 0, block)
    lo = Contraction("", [], 0.0, lo_cells, lo_cells / EINSUM_CELL_RATE, 0, lo_cells)
    nbytes = separator_memory(cut, up, lo, fixed, 1.0, argmax, settled=1.0).peak
    return (
        nbytes,
        separator_seconds(cut, up, lo, fixed, 0.0, 1.0, argmax),
        separator_seconds(cut, up, lo, fixed, 1.0, 1.0, argmax),
    )


def _separator_estimate(
    cut: Cut,
    up: Contraction,
    lo: Contraction,
    n: int,
    *,
    fixed: int = 0,
    settled: float = 0.0,
    argmax: bool = False,
    sample: float = 0.0,
    skipped: float = 0.0,
    distinct: float | None = None,
) -> tuple[Estimate, MemoryBill]:
    """The estimate of a planned cut. The distinct sub-classifiers are
    :data:`DISTINCT_MARGIN` times ``distinct`` (as estimated on a sample), and at most the
    prefixes not decided early (their number where not measured); ``sample``: the bytes the
    measurement took while it was planned."""
    most = max(2.0, min(as_float(cut.n_pre) * (1.0 - settled) + 2, 2.0 ** min(cut.n_suf, 1000)))
    distinct = most if distinct is None else max(1.0, min(DISTINCT_MARGIN * distinct, most))
    bill = separator_memory(cut, up, lo, fixed, distinct, argmax, settled)
    if sample:
        bill = MemoryBill((("early-decision sample (planning)", sample), *bill.phases))
    seconds = separator_seconds(cut, up, lo, fixed, settled, distinct, argmax, skipped)
    early = f", {settled:.0%} of prefixes decided early (sampled)" if settled else ""
    detail = (
        f"{as_float(cut.n_pre * cut.n_suf):.3g} inputs, cut after level {cut.k} of {n}, "
        f"{cut.shared_states:,} shared states{early}; peak in the {bill.where}"
    )
    return Estimate("decompose/separator", bill.peak, seconds, detail), bill


def separator_floor(network: Network, spec: ResolvedSpec) -> Estimate:
    """A lower bound on the separator route's estimate over every cut, from the
    cardinalities alone (no cut is searched): each cut's index of prefixes and lower
    table hold at least its prefixes and completions, and every input is decided."""
    cards = [network.card(f) for f in spec.order]
    inputs = math.prod(cards)
    suffix = [1] * (len(cards) + 1)
    for i in range(len(cards) - 1, -1, -1):
        suffix[i] = suffix[i + 1] * cards[i]
    prefix, least = 1, None
    for k in range(1, len(cards)):
        prefix *= cards[k - 1]
        least = prefix + suffix[k] if least is None else min(least, prefix + suffix[k])
    nbytes = 8 * (least or 0)
    return Estimate(
        "decompose/separator",
        as_float(nbytes),
        SEPARATOR_SECONDS_PER_PREFIX * as_float(least or 0),
        f"{as_float(inputs):.3g} inputs, the tables of the best cut alone (cuts not searched)",
    )


def plan_separator(
    network: Network,
    spec: ResolvedSpec,
    *,
    max_memory: float,
    deadline: Deadline | None = None,
) -> SeparatorPlan:
    """Search the cuts of ``spec.order`` for the fastest one that fits ``max_memory``.

    Every cut is sized from its shapes (:func:`_separator_floor`); those whose floor fits
    (:func:`fits`, else within :data:`ESTIMATE_ACCURACY` of the limit) are visited fastest
    floor first, each getting its contractions planned and, where prefixes can be decided
    early, the share that will be measured on a sample (:func:`sample_prefixes`), until
    :data:`SEPARATOR_CUTS_MEASURED` cuts that fit have been or no unvisited floor can beat
    the fastest. When none fits, the one needing the least memory is returned (its
    estimate says by how much it misses). ``deadline`` is checked at every cut.
    """
    n = len(spec.order)
    argmax = spec.is_argmax

    def sized(k: int) -> Cut:
        if deadline is not None:
            deadline.check(f"cut {k} of {n - 1} sized")
        return cut_at(network, spec, k)

    floors = [(cut, *_separator_floor(cut, argmax)) for cut in map(sized, range(1, n))]
    ranked = sorted(floors, key=lambda f: (f[2], f[0].k))
    could_fit = [f for f in ranked if f[1] <= max_memory] or [
        f for f in ranked if f[1] <= ESTIMATE_ACCURACY * max_memory
    ]
    candidates = could_fit or [min(ranked, key=lambda f: (f[1], f[0].k))]
    best: SeparatorPlan | None = None
    measured = 0
    for cut, _, _, least_seconds in candidates:
        if (
            best is not None
            and _fits(best, max_memory)
            and (least_seconds >= best.estimate.seconds or measured >= SEPARATOR_CUTS_MEASURED)
        ):
            break
        if deadline is not None:
            deadline.check(f"cut {cut.k} of {n - 1} planned")
        plan = _plan_cut(network, cut, n, max_memory, deadline, spec=spec)
        measured += _fits(plan, max_memory)
        if best is None or _rank(plan, max_memory) < _rank(best, max_memory):
            best = plan
    assert best is not None
    return best


def _fits(plan: SeparatorPlan, max_memory: float) -> bool:
    return plan.estimate.bytes <= max_memory


def _rank(plan: SeparatorPlan, max_memory: float) -> tuple[int, float, int]:
    """Fitting plans first, by time; then those within the estimate's accuracy of the
    limit, by time; the others by memory."""
    e = plan.estimate
    if e.bytes <= max_memory:
        return (0, e.seconds, plan.cut.k)
    if e.bytes <= ESTIMATE_ACCURACY * max_memory:
        return (1, e.seconds, plan.cut.k)
    return (2, e.bytes, plan.cut.k)


def _plan_cut(
    network: Network,
    cut: Cut,
    n: int,
    max_memory: float,
    deadline: Deadline | None = None,
    *,
    spec: ResolvedSpec | None = None,
) -> SeparatorPlan:
    """Both contractions of ``cut`` planned (the upper one for one block of prefixes), the
    share of prefixes decided early measured when ``spec`` is given, and the estimate."""
    cells = max_memory / 16
    fixed = _block_fixed(cut)
    values = dict.fromkeys(cut.prefix[:fixed], 0)
    up_out = [*cut.prefix[fixed:], *cut.z]
    up = plan_contraction(
        cut.block_factors(values, network), up_out, max_cells=cells, deadline=deadline
    )
    lo = plan_contraction(cut.lo_factors(network), cut.lo_out, max_cells=cells, deadline=deadline)
    argmax = spec is not None and spec.is_argmax
    blocks = None if spec is None else decided_blocks(network, spec, fixed, deadline=deadline)
    plan = SeparatorPlan(
        cut, up, lo, Estimate("decompose/separator", 0.0, 0.0, ""), fixed, blocks=blocks
    )
    measured = PrefixSample(0.0, None, 0.0)
    if spec is not None and not argmax:
        measured = sample_prefixes(network, spec, plan, deadline=deadline)
    skipped = 0.0 if blocks is None else float(np.count_nonzero(blocks >= 0)) / blocks.size
    estimate, bill = _separator_estimate(
        cut,
        up,
        lo,
        n,
        fixed=fixed,
        settled=measured.settled,
        argmax=argmax,
        sample=measured.nbytes,
        skipped=skipped,
        distinct=measured.distinct,
    )
    return SeparatorPlan(cut, up, lo, estimate, fixed, measured.settled, bill, blocks)


def decided_blocks(
    network: Network, spec: ResolvedSpec, fixed: int, *, deadline: Deadline | None = None
) -> np.ndarray | None:
    """Per block of prefixes (the first ``fixed`` features given): 0 / 1 when every input
    extending the block's partial prefix is certainly negative / positive, from its message
    at the cut after those ``fixed`` features (:func:`constant_prefixes` there), else -1.

    None where that test does not apply: an argmax decision, no feature given, the cut
    after them not class-free, more blocks than :data:`UP_BLOCK_CELLS` cells of messages,
    underflow possible, or a relevant CPT holding a 0 (then a decided block's inputs of
    probability 0 would have to be counted)."""
    if spec.is_argmax or fixed == 0:
        return None
    if not all(
        (t > 0).all() for _, t in relevant_factors(network, [spec.class_variable, *spec.order])
    ):
        return None
    outer = cut_at(network, spec, fixed)
    if not outer.class_free or outer.n_pre * outer.shared_states > UP_BLOCK_CELLS:
        return None
    factors = outer.up_factors(network)
    up = plan_contraction(factors, outer.up_out, deadline=deadline)
    head = SeparatorPlan(outer, up, up, Estimate("decompose/separator", 0.0, 0.0, ""))
    if not settles(network, spec, head):
        return None
    u = up.run(factors).reshape(outer.n_pre, outer.n_class, -1)
    assert spec.threshold is not None
    pos = network.states[spec.class_variable].index(spec.positive)
    return constant_prefixes(
        u, pos, spec.threshold, upper_error_bound(network, head), all_possible=True
    )


def settles(network: Network, spec: ResolvedSpec, plan: SeparatorPlan) -> bool:
    """Whether the route may decide prefixes from their prefix message alone: a threshold
    decision, a class-free cut, and no underflow (a float 0 is then an exact 0)."""
    if spec.is_argmax or not plan.cut.class_free:
        return False
    bound = separator_error_bound(network, plan)
    return bound.abs_num == 0 and bound.abs_den == 0


def lower_tables(network: Network, plan: SeparatorPlan) -> list[np.ndarray]:
    """The lower message per context, transposed for the matrix products: a class-free cut
    gets one ``(hidden states, completions)`` table serving every class state, any other
    cut one ``(class states, hidden states, completions)`` table."""
    cut = plan.cut
    lo = plan.lo.run(cut.lo_factors(network))
    if cut.class_free:
        lo = lo.reshape(cut.n_ctx, cut.n_suf, -1)
        return [np.ascontiguousarray(lo[c].T) for c in range(cut.n_ctx)]
    lo = lo.reshape(cut.n_ctx, cut.n_suf, cut.n_class, -1)
    return [np.ascontiguousarray(lo[c].transpose(1, 2, 0)) for c in range(cut.n_ctx)]


def margins(
    u: np.ndarray, table: np.ndarray, pos: int, class_free: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``P(pos, x)`` and ``P(x)`` of every completion of the prefixes whose messages are
    ``u`` (shape ``(n, class states, hidden states)``), against one context's lower table
    (:func:`lower_tables`); a class-free cut sums the class out of ``u`` first (two
    products over the hidden states instead of one per class state and one over both)."""
    if class_free:
        return u[:, pos, :] @ table, u.sum(axis=1) @ table
    return u[:, pos, :] @ table[pos], u.reshape(u.shape[0], -1) @ table.reshape(-1, table.shape[-1])


def context_index(prefixes: np.ndarray, cut: Cut) -> np.ndarray:
    """Each prefix's context (mixed radix over ``cut.ctx``), from its index in the grid of
    the prefix features."""
    out = np.zeros(prefixes.size, dtype=np.int64)
    for f in cut.ctx:
        i = cut.prefix.index(f)
        card = cut.prefix_cards[i]
        out *= card
        out += prefixes // math.prod(cut.prefix_cards[i + 1 :]) % card
    return out


@dataclass(frozen=True)
class PrefixSample:
    """What :func:`sample_prefixes` measured on prefixes drawn at random."""

    settled: float
    """Share decided from their prefix message (or their block's) alone."""
    distinct: float | None
    """Distinct sub-classifiers expected over every prefix (Chao1 on the sample's), None
    where the lower message was not made while planning."""
    nbytes: float
    """What the measurement held: the sampled CPT rows, their contraction, the lower
    message."""


def sample_prefixes(
    network: Network,
    spec: ResolvedSpec,
    plan: SeparatorPlan,
    *,
    samples: int | None = None,
    deadline: Deadline | None = None,
) -> PrefixSample:
    """Measure the route on ``samples`` prefixes drawn uniformly (a fixed seed: plans are
    deterministic): the share decided from their prefix message alone
    (:func:`constant_prefixes`; 0 where :func:`settles` says none can be), and where the
    lower message has at most :data:`SAMPLE_LOWER_CELLS` cells (and is estimated to take at
    most :data:`SAMPLE_LOWER_SECONDS`) their sub-classifiers (float
    decisions of every completion), whose distinct count over all prefixes is estimated by
    Chao1 (``d + f1^2 / (2 f2)`` from the patterns seen once and twice)."""
    cut = plan.cut
    early = settles(network, spec, plan)
    lower_cells = as_float(cut.n_ctx) * as_float(cut.n_suf) * cut.lower_states
    if plan.lo.seconds > SAMPLE_LOWER_SECONDS:
        lower_cells = math.inf  # not made while planning
    if spec.is_argmax or (not early and lower_cells > SAMPLE_LOWER_CELLS):
        return PrefixSample(0.0, None, 0.0)
    m = int(min(samples or SETTLE_SAMPLES, cut.n_pre))
    rng = np.random.default_rng(0)
    rows = {f: rng.integers(0, network.card(f), size=m) for f in cut.prefix}
    factors = [*sampled(cut.upper, rows), *unit_factors(network, list(cut.z))]
    factors.append(((BATCH,), np.ones(m)))
    c = plan_contraction(factors, [BATCH, *cut.z], deadline=deadline)
    held = 8.0 * (sum(t.size for s, t in factors if BATCH in s) + c.peak_cells)
    u = c.run(factors).reshape(m, cut.n_class, -1)
    assert spec.threshold is not None
    pos = network.states[spec.class_variable].index(spec.positive)
    decided = np.zeros(m, dtype=bool)
    if early:
        const = constant_prefixes(
            u, pos, spec.threshold, upper_error_bound(network, plan), all_possible=True
        )
        decided = const >= 0
    if plan.blocks is not None:  # a prefix of a decided block is decided with it
        block = np.zeros(m, dtype=np.int64)
        for f in cut.prefix[: plan.fixed]:
            block = block * network.card(f) + rows[f]
        decided |= plan.blocks[block] >= 0
    settled = float(np.count_nonzero(decided)) / m if early else 0.0
    if lower_cells > SAMPLE_LOWER_CELLS:
        return PrefixSample(settled, None, held)
    lower = lower_tables(network, plan)
    step = max(1, SAMPLE_STEP_CELLS // max(1, cut.n_suf))
    held += 16.0 * lower_cells + 24.0 * min(m, step) * cut.n_suf
    index = np.zeros(m, dtype=np.int64)
    for f in cut.prefix:
        index = index * network.card(f) + rows[f]
    contexts = context_index(index, cut)
    keys = [b"decided"] * m  # decided early: one of two constant sub-classifiers
    for c in np.unique(contexts[~decided]).tolist():
        live = np.flatnonzero(~decided & (contexts == c))
        for s in range(0, live.size, step):
            part = live[s : s + step]
            num, den = margins(u[part], lower[c], pos, cut.class_free)
            bits = np.packbits(num > spec.threshold * den, axis=1)
            for i, row in zip(part.tolist(), bits, strict=True):
                keys[i] = row.tobytes()
    counts = np.array(list(Counter(keys).values()))
    d, f1, f2 = counts.size, int(np.count_nonzero(counts == 1)), int(np.count_nonzero(counts == 2))
    chao = d + (f1 * f1 / (2.0 * f2) if f2 else f1 * (f1 - 1) / 2.0)
    return PrefixSample(settled, chao, held)


# ---------------------------------------------------------------------------- additive route
def additive_estimate(n_pre: int, completions: int, k: int, n: int) -> Estimate:
    """Equivalence intervals: prefixes enumerated, completion sums sorted per context."""
    items = as_float(n_pre + completions)
    return Estimate(
        "decompose/additive",
        ADDITIVE_BYTES_PER_ITEM * items,
        ADDITIVE_SECONDS_PER_ITEM * items,
        f"split after level {k} of {n}: {as_float(n_pre):.3g} prefixes, "
        f"{as_float(completions):.3g} completions",
    )


# ---------------------------------------------------------------------------- choice
def within(est: Estimate, max_memory: float, max_seconds: float | None) -> bool:
    """Whether ``est`` fits both limits."""
    return est.bytes <= max_memory and (max_seconds is None or est.seconds <= max_seconds)


def may_fit(est: Estimate, max_memory: float, max_seconds: float | None) -> bool:
    """Whether ``est`` may fit both limits given its accuracy: a route is refused only
    when its estimate exceeds a limit by more than :data:`ESTIMATE_ACCURACY` (bytes) or
    :data:`TIME_ACCURACY` (seconds); while it runs, the limits themselves hold
    (:func:`~boxwatch.offline.bn.limits.memory_guard`, the deadline)."""
    return est.bytes <= ESTIMATE_ACCURACY * max_memory and (
        max_seconds is None or est.seconds <= TIME_ACCURACY * max_seconds
    )


def refusal(
    source: str, estimates: Sequence[Estimate], max_memory: float, max_seconds: float | None
) -> CompileLimitError:
    """One line: every route's estimate against the limits."""
    limits = (
        f"memory limit {format_bytes(max_memory)}"
        if max_seconds is None
        else f"limits {format_bytes(max_memory)} and {format_seconds(max_seconds)}"
    )
    routes = "; ".join(e.text() for e in estimates)
    return CompileLimitError(
        f"{source}: no route fits the {limits} (refused: every estimate exceeds a limit by "
        f"more than its accuracy, {ESTIMATE_ACCURACY:g}x in memory, {TIME_ACCURACY:g}x in "
        f"time): {routes}; give fewer features, another order, or raise --max-memory / "
        "--max-seconds"
    )


# ---------------------------------------------------------------------------- jointree route
JOINTREE_MAX_BLOCK = 12
JOINTREE_CHUNK_CELLS = 1 << 22
JOINTREE_SECONDS_PER_MESSAGE = 4e-7
JOINTREE_BYTES_PER_CELL = 40
BATCH = "\x00batch"


def alias(feature: str) -> str:
    """Name of the output axis that enumerates ``feature``'s states in a jointree step."""
    return f"{feature}\x00w"


@dataclass(frozen=True)
class JointreeStep:
    """One step of the chain: the features ``order[start:stop]`` enumerated together.

    ``factors`` are the CPTs absorbed in this step (those on the prefix side of the cut
    after ``stop`` but not of the cut after ``start``); ``z_in`` and ``z_out`` the variables
    of the messages before and after it (the class first, then hidden variables and prefix
    features the remaining CPTs still mention); ``early`` whether no remaining CPT mentions
    the class, so bounds over ``z_out`` can decide a partial input.
    """

    start: int
    stop: int
    factors: tuple[Factor, ...]
    z_in: tuple[str, ...]
    z_out: tuple[str, ...]
    early: bool
    contraction: Contraction
    batch: int

    def step_factors(
        self, network: Network, messages: np.ndarray, features: Sequence[str]
    ) -> list[Factor]:
        """The batch of messages, the absorbed CPTs and one identity per enumerated feature."""
        eyes = [((f, alias(f)), np.eye(network.card(f))) for f in features]
        return [((BATCH, *self.z_in), messages), *self.factors, *eyes]


@dataclass(frozen=True)
class JointreePlan:
    """The chain of steps and the route's estimate."""

    steps: tuple[JointreeStep, ...]
    estimate: Estimate
    largest_block: int
    positive_cpts: bool


def _chain_uppers(
    network: Network,
    spec: ResolvedSpec,
    factors: Sequence[Factor],
    deadline: Deadline | None = None,
) -> list[set[int]]:
    """For each cut ``k`` (0..n) the factor indices on the prefix's side, growing with ``k``.

    Each cut is a minimum vertex separator of the moral graph between the first ``k``
    features and the rest (:func:`~boxwatch.offline.bn.separator.prefix_side`); every cut's
    side also takes the previous cut's CPTs so that each step only adds CPTs.
    """
    cls, order = spec.class_variable, list(spec.order)
    n = len(order)
    scopes = [s for s, _ in factors]
    uppers: list[set[int]] = [set()]
    for k in range(1, n):
        if deadline is not None:
            deadline.check(f"the separator of cut {k} of {n - 1} searched")
        side, cut = prefix_side(network, scopes, cls, order[:k], order[k:])
        near = side | cut | {cls}
        mine = {i for i, s in enumerate(scopes) if near.issuperset(s)}
        uppers.append(mine | uppers[-1])
    uppers.append(set(range(len(factors))))
    return uppers


def _shared(
    network: Network,
    cls: str,
    factors: Sequence[Factor],
    upper: set[int],
    prefix: Sequence[str],
    suffix: Sequence[str],
) -> tuple[str, ...]:
    """Class first, then the variables both sides of a cut mention (the prefix features
    count as the upper side's: they are observed there), suffix features never."""
    up = {v for i in upper for v in factors[i][0]} | set(prefix)
    far = set(suffix)
    lo = {v for i, (s, _) in enumerate(factors) if i not in upper for v in s}
    shared = [v for v in network.variables if v in up and v in lo and v != cls and v not in far]
    return (cls, *shared)


def jointree_floor(network: Network, spec: ResolvedSpec) -> Estimate:
    """A lower bound on the jointree route's estimate from the cardinalities alone (no cut
    is searched): its last block enumerates every input, 8 bytes each."""
    inputs = math.prod(network.card(f) for f in spec.order)
    return Estimate(
        "jointree",
        8 * as_float(inputs),
        JOINTREE_SECONDS_PER_MESSAGE * as_float(inputs),
        f"{as_float(inputs):.3g} inputs, the last block's messages alone (chain not planned)",
    )


def plan_jointree(
    network: Network,
    spec: ResolvedSpec,
    *,
    max_memory: float,
    max_block: int = JOINTREE_MAX_BLOCK,
    deadline: Deadline | None = None,
) -> JointreePlan:
    """Cut the order into blocks (each at most :data:`JOINTREE_MAX_BLOCK` features) and size
    the chain of messages.

    The blocks minimise a cost proxy by dynamic programming over the cut positions: the
    messages entering a block times the block's inputs times the states of both
    separators. The messages are sized by their upper bound, the prefixes (merging and
    early decisions only lower it; how far cannot be known from shapes), so the estimate
    is an upper bound and ``auto`` takes this route only where that bound is best. A block
    is cut where the separator is small; a cut with a large separator is skipped by making
    the block around it longer (``max_block`` features at most: 1 gives one step per
    feature). The distinct messages are counted while it runs. ``deadline`` is checked at
    every cut.
    """
    cls, order = spec.class_variable, list(spec.order)
    n = len(order)
    cards = [network.card(f) for f in order]
    factors = relevant_factors(network, [cls, *order])
    uppers = _chain_uppers(network, spec, factors, deadline)
    z = []
    for k in range(n + 1):
        if deadline is not None:
            deadline.check(f"the variables shared at cut {k} of {n} listed")
        z.append(_shared(network, cls, factors, uppers[k], order[:k], order[k:]))
    states = [math.prod(network.card(v) for v in zk) for zk in z]
    early = [
        k > 0 and all(cls not in s for i, (s, _) in enumerate(factors) if i not in uppers[k])
        for k in range(n + 1)
    ]

    def distinct(k: int) -> float:
        return float(math.prod(cards[:k]))

    def union_states(i: int, j: int) -> int:
        return math.prod(network.card(v) for v in set(z[i]) | set(z[j]))

    best: list[tuple[float, int]] = [(0.0, 0)] + [(math.inf, 0)] * n
    for j in range(1, n + 1):
        if deadline is not None:
            deadline.check(f"the blocks ending at cut {j} of {n} weighed")
        for i in range(max(0, j - max_block), j):
            if best[i][0] == math.inf:
                continue
            w = math.prod(cards[i:j])
            cells = distinct(i) * w * states[j]
            if JOINTREE_BYTES_PER_CELL * min(cells, JOINTREE_CHUNK_CELLS) > max_memory:
                continue
            cost = best[i][0] + distinct(i) * w * union_states(i, j) + cells
            if cost < best[j][0]:
                best[j] = (cost, i)
    cuts = [n]
    while cuts[-1] > 0 and best[cuts[-1]][0] < math.inf:
        cuts.append(best[cuts[-1]][1])
    if cuts[-1] != 0:  # nothing fits: one block per feature, the estimate says by how much
        cuts = list(range(n, -1, -1))
    cuts.reverse()
    steps = []
    seconds = 0.0
    nbytes = 0.0
    for i, j in zip(cuts[:-1], cuts[1:], strict=True):
        absorbed = tuple(factors[x] for x in sorted(uppers[j] - uppers[i]))
        w = math.prod(cards[i:j])
        per_row = max(1, w * max(states[j], union_states(i, j)))
        batch = int(max(1, min(distinct(i), JOINTREE_CHUNK_CELLS // per_row)))
        dummy = [((BATCH, *z[i]), np.empty((batch, *(network.card(v) for v in z[i]))))]
        eyes = [((f, alias(f)), np.empty((network.card(f),) * 2)) for f in order[i:j]]
        out = [BATCH, *(alias(f) for f in order[i:j]), *z[j]]
        c = plan_contraction(
            [*dummy, *absorbed, *eyes], out, max_cells=max_memory / 16, deadline=deadline
        )
        rounds = distinct(i) / batch
        seconds += rounds * c.seconds + JOINTREE_SECONDS_PER_MESSAGE * distinct(i) * w
        nbytes = max(
            nbytes,
            16 * c.largest_cells
            + JOINTREE_BYTES_PER_CELL * min(distinct(i) * w, distinct(j)) * states[j]
            + 8 * distinct(i) * w,
        )
        steps.append(JointreeStep(i, j, absorbed, z[i], z[j], early[j], c, batch))
    largest = max(j - i for i, j in zip(cuts[:-1], cuts[1:], strict=True))
    positive = all((t > 0).all() for _, t in factors)
    detail = (
        f"{math.prod(cards):.3g} inputs in {len(steps)} blocks of at most {largest} features, "
        f"largest separator {max(states[k] for k in cuts):,} states"
    )
    return JointreePlan(
        tuple(steps), Estimate("jointree", nbytes, seconds, detail), largest, positive
    )
