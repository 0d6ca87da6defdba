"""Cost model of the BN compiler: contraction plans and the memory and time of each route.

Nothing here allocates the tables it sizes: every figure comes from shapes alone, so a
route that cannot fit is refused before it starts. The rates are calibrated on a 2-core
machine (``bench/bn_compile.py`` prints estimate beside measurement); estimates are meant
to be right within a small factor, which is what choosing and refusing need.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
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

BLAS_CELL_RATE = 1e9
EINSUM_CELL_RATE = 1e8
STEP_SECONDS = 2e-4
JOINT_SECONDS_PER_INPUT = 1.8e-7
JOINT_BYTES_PER_INPUT = 32
SEPARATOR_SECONDS_PER_INPUT = 2.5e-8
SEPARATOR_SECONDS_PER_PREFIX = 1e-6
MATMUL_RATE = 5e10
SEPARATOR_BLOCK_CELLS = 1 << 23
SEPARATOR_BLOCK_BYTES = 40
SEPARATOR_DISTINCT_GUESS = 1 << 16
ADDITIVE_SECONDS_PER_ITEM = 6e-6
ADDITIVE_BYTES_PER_ITEM = 400


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

    ``seconds`` is estimated step by step: cells of each step's operands' union at
    :data:`BLAS_CELL_RATE` where opt_einsum hands the step to BLAS (``tensordot``), else at
    :data:`EINSUM_CELL_RATE` per operand, plus :data:`STEP_SECONDS`.
    """

    expr: str
    path: list[tuple[int, ...]]
    flops: float
    largest_cells: float
    seconds: float
    roundings: int
    """Roundings any one term meets along the path (:func:`~.exact.contraction_roundings`)."""

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
            )
        )
    fits = [c for c in candidates if max_cells is None or c.largest_cells <= max_cells]
    if fits:
        return min(fits, key=lambda c: (c.seconds, c.largest_cells))
    return min(candidates, key=lambda c: (c.largest_cells, c.seconds))


def _seconds(info: Any) -> float:
    """Estimated seconds of a planned contraction (see :class:`Contraction`)."""
    total = 0.0
    for entry in info.contraction_list:
        inputs = entry[2].split("->")[0].split(",")
        cells = math.prod(info.size_dict[ch] for ch in set("".join(inputs)))
        blas = bool(entry[4])
        total += STEP_SECONDS + (
            cells / BLAS_CELL_RATE if blas else cells * len(inputs) / EINSUM_CELL_RATE
        )
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
    if floor > max_memory:
        detail = f"{as_float(inputs):.3g} inputs, the joint table alone (contraction not planned)"
        seconds = JOINT_SECONDS_PER_INPUT * as_float(inputs)
        return JointPlan(None, Estimate("joint", as_float(floor), seconds, detail))
    c = plan_contraction(
        relevant_factors(network, keep), keep, max_cells=max_memory / 16, deadline=deadline
    )
    table = network.card(spec.class_variable) * inputs
    nbytes = 8 * (2 * c.largest_cells + table) + JOINT_BYTES_PER_INPUT * inputs
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
    mentions (the completions' context).
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

    @property
    def up_out(self) -> list[str]:
        return [*self.prefix, *self.z]

    @property
    def lo_out(self) -> list[str]:
        return [*self.ctx, *self.suffix, *self.z]

    def up_factors(self, network: Network) -> list[Factor]:
        return [*self.upper, *unit_factors(network, [*self.z, *self.prefix])]

    def lo_factors(self, network: Network) -> list[Factor]:
        return [*self.lower, *unit_factors(network, [*self.z, *self.ctx])]


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
    )


@dataclass(frozen=True)
class SeparatorPlan:
    """The chosen cut, its two contractions, and the route's estimate."""

    cut: Cut
    up: Contraction
    lo: Contraction
    estimate: Estimate


def separator_error_bound(network: Network, plan: SeparatorPlan) -> ErrorBound:
    """Error bound of the separator route's ``P(pos, u, v)`` and ``P(u, v)``.

    One conversion per CPT, both contractions' roundings, and the final product summed over
    the shared states (without the class for ``P(pos, .)``, with it for ``P(.)``).
    """
    cut = plan.cut
    zc = network.card(cut.z[0])
    shared = cut.shared_states // zc
    k = len(cut.upper) + len(cut.lower) + plan.up.roundings + plan.lo.roundings
    factors = [*cut.upper, *cut.lower]
    flops = plan.up.flops + plan.lo.flops + 2.0 * cut.shared_states
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
    zc = network.card(cut.z[0])
    k = len(cut.upper) + plan.up.roundings
    a = absolute_error(network, cut.upper, plan.up.flops, {*cut.prefix, *cut.z})
    return ErrorBound(k, k + zc - 1, a, zc * a * 1.01)


def _separator_floor(cut: Cut) -> tuple[float, float]:
    """Bytes and seconds of a cut before its contractions are planned (a lower bound)."""
    inputs = cut.n_pre * cut.n_suf
    tables = 8 * (cut.n_ctx * cut.n_suf + cut.n_pre) * cut.shared_states
    block = SEPARATOR_BLOCK_BYTES * min(inputs, max(SEPARATOR_BLOCK_CELLS, cut.n_suf))
    seconds = (
        2 * inputs * cut.shared_states / MATMUL_RATE
        + SEPARATOR_SECONDS_PER_INPUT * inputs
        + SEPARATOR_SECONDS_PER_PREFIX * cut.n_pre
    )
    return tables + block, seconds


def distinct_table_bytes(cut: Cut, count: int) -> float:
    """Bytes of ``count`` distinct sub-classifiers once unpacked and merged into nodes: one
    byte a cell for the decisions, and the first levels' keys, node ids and their
    successors (12 bytes a cell measured on binary features; 16 allowed)."""
    return 16.0 * count * cut.n_suf


def _separator_estimate(cut: Cut, up: Contraction, lo: Contraction, n: int) -> Estimate:
    """Tables, contractions and the distinct sub-classifiers, assuming at most
    :data:`SEPARATOR_DISTINCT_GUESS` of them (their count is checked while it runs)."""
    floor_bytes, floor_seconds = _separator_floor(cut)
    nbytes = (
        floor_bytes
        + 16 * max(up.largest_cells, lo.largest_cells)
        + distinct_table_bytes(cut, min(cut.n_pre, SEPARATOR_DISTINCT_GUESS))
    )
    seconds = floor_seconds + up.seconds + lo.seconds
    detail = (
        f"{as_float(cut.n_pre * cut.n_suf):.3g} inputs, cut after level {cut.k} of {n}, "
        f"{cut.shared_states:,} shared states"
    )
    return Estimate("decompose/separator", nbytes, seconds, detail)


def separator_floor(network: Network, spec: ResolvedSpec) -> Estimate:
    """A lower bound on the separator route's estimate over every cut, from the
    cardinalities alone (no cut is searched): each cut's tables hold at least its prefixes
    and completions per class state, and every input is decided."""
    cards = [network.card(f) for f in spec.order]
    inputs = math.prod(cards)
    suffix = [1] * (len(cards) + 1)
    for i in range(len(cards) - 1, -1, -1):
        suffix[i] = suffix[i + 1] * cards[i]
    prefix, least = 1, None
    for k in range(1, len(cards)):
        prefix *= cards[k - 1]
        least = prefix + suffix[k] if least is None else min(least, prefix + suffix[k])
    tables = 8 * network.card(spec.class_variable) * (least or 0)
    nbytes = tables + SEPARATOR_BLOCK_BYTES * min(inputs, SEPARATOR_BLOCK_CELLS)
    return Estimate(
        "decompose/separator",
        as_float(nbytes),
        SEPARATOR_SECONDS_PER_INPUT * as_float(inputs),
        f"{as_float(inputs):.3g} inputs, the tables of the best cut alone (cuts not searched)",
    )


def plan_separator(
    network: Network,
    spec: ResolvedSpec,
    *,
    max_memory: float,
    deadline: Deadline | None = None,
) -> SeparatorPlan:
    """Search every cut of ``spec.order`` for the fastest one that fits ``max_memory``.

    Cuts are sized before planning (lower bounds on memory and time); those that could fit
    are visited by that time, each getting its two contractions planned, until no unvisited
    cut can beat the fastest fitting one. When none fits, the one needing the least memory
    is returned (its estimate says by how much it misses). ``deadline`` is checked at every
    cut.
    """
    n = len(spec.order)

    def sized(k: int) -> Cut:
        if deadline is not None:
            deadline.check(f"cut {k} of {n - 1} sized")
        return cut_at(network, spec, k)

    cuts = sorted((sized(k) for k in range(1, n)), key=lambda c: (_separator_floor(c)[1], c.k))
    could_fit = [c for c in cuts if _separator_floor(c)[0] <= max_memory]
    cuts = could_fit or [min(cuts, key=lambda c: (_separator_floor(c)[0], c.k))]
    best: SeparatorPlan | None = None
    for cut in cuts:
        if (
            best is not None
            and best.estimate.bytes <= max_memory
            and (_separator_floor(cut)[1] >= best.estimate.seconds)
        ):
            break
        if deadline is not None:
            deadline.check(f"cut {cut.k} of {n - 1} planned")
        plan = _plan_cut(network, cut, n, max_memory, deadline)
        if best is None or _rank(plan, max_memory) < _rank(best, max_memory):
            best = plan
    assert best is not None
    return best


def _rank(plan: SeparatorPlan, max_memory: float) -> tuple[bool, float, int]:
    """Fitting plans first, by time; the others by memory."""
    e = plan.estimate
    fits = e.bytes <= max_memory
    return (not fits, e.seconds if fits else e.bytes, plan.cut.k)


def _plan_cut(
    network: Network, cut: Cut, n: int, max_memory: float, deadline: Deadline | None = None
) -> SeparatorPlan:
    """Both contractions of ``cut`` planned, and the estimate they give."""
    cells = max_memory / 16
    up = plan_contraction(cut.up_factors(network), cut.up_out, max_cells=cells, deadline=deadline)
    lo = plan_contraction(cut.lo_factors(network), cut.lo_out, max_cells=cells, deadline=deadline)
    return SeparatorPlan(cut, up, lo, _separator_estimate(cut, up, lo, n))


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
        f"{source}: no route fits the {limits}: {routes}; give fewer "
        "features, another order, or raise --max-memory / --max-seconds"
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
