"""Compile a Bayesian-network classifier into its exact, canonical decision diagram (MDD).

Two regimes behind :func:`compile_classifier`:

* ``joint`` (fast path): one contraction, its order planned by a cost model
  (:func:`~boxwatch.offline.bn.plan.plan_contraction`), gives ``P(C, X)`` over the features
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
    variables ``Z`` of a minimum vertex separator of the moral graph between prefix and
    suffix features (:mod:`boxwatch.offline.bn.separator`); the decisions of
    each prefix over all completions are computed block by block with matrix products and
    equal rows (identical sub-classifiers) merged. The cut is the fastest of all cuts of the
    order that fits the memory limit. Memory is ``distinct sub-classifiers x completions``;
    time is still the size of the feature space.

Before any route starts, its peak memory and time are estimated from shapes alone
(:mod:`boxwatch.offline.bn.plan`); ``auto`` takes the fastest route that fits the limits,
and when none fits the compilation is refused with one line naming every estimate and limit.

Decisions are exact against the network as read (:mod:`boxwatch.offline.bn.exact`): the
classifier is ``P(C = positive | x) >= T`` with every CPT number the rational its decimal
string denotes, each CPT row divided by its sum
(:attr:`~boxwatch.offline.bn.network.Network.renormalised`, the one reading every route and
the exact decisions share), and ``T`` the decimal the user wrote. The joint and separator routes bound
the float error of each input's margin ``P(pos, x) - T P(x)`` from the operations they
performed; inputs within the bound are recomputed in exact arithmetic (a post-pass,
:func:`~boxwatch.offline.bn.exact.refine`). *Ties* are inputs whose posterior is exactly
``T`` (decided positive); ``exact_inputs`` counts the inputs that needed the exact path.
The additive route works on float log-odds: it decides the inputs within its error bound
exactly and gives the prefixes holding an exactly negative one their own sub-classifiers. Past
:data:`~boxwatch.offline.bn.exact.EXACT_LIMIT` such inputs (or
:data:`ADDITIVE_EXACT_LIMIT` cells of patched sub-classifiers) a route stops: the rest are
decided positive (within rounding of ``T``, where ``P(x)`` is not 0), counted as
``uncertified``, and the result says ``certified = False`` (docs/exactness.md).

Argmax (multi-class) classifiers decide the most probable class state; the sinks are the
class states in the network's order. The joint and separator routes compute ``P(c, x)`` for
every state ``c``; the additive route (log-odds of two states) does not apply and
``decompose`` takes the separator route. Argmax decisions are not yet on the exact path: a
state whose float posterior lies within :data:`TIE_TOLERANCE` of the largest one
*ties* with it, the decision is the lowest tied state index, and ties are counted per input
and per pair of states. Inputs of probability 0 are decided state 0 (every posterior is
undefined) and counted as impossible. The decisions are made a block of inputs at a time
(the wall-clock limit checked between blocks) and their work grows with the class states
and the ties that exist, never with the square of the states: the pair counts come from
the distinct sets of tied states (:class:`_TieSets`), and past :data:`MAX_TIE_PAIRS` pairs
they are not counted (``tie_pairs_counted`` False) while the tied inputs still are.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import opt_einsum

from boxwatch.agent.diagram import ARGMAX, THRESHOLD, DecisionDiagram, unique_rows
from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn.classifier import ClassifierSpec, ResolvedSpec, resolve_spec
from boxwatch.offline.bn.exact import (
    ExactBudget,
    ExactJoint,
    Refinement,
    U,
    exact_threshold,
    gamma,
    grid_columns,
    refine,
    unique_keys,
)
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.limits import (
    CompileTimeError,
    Deadline,
    default_max_memory,
    format_bytes,
)
from boxwatch.offline.bn.network import Network, RowSums
from boxwatch.offline.bn.plan import (
    BUILD_CHUNK_CELLS,
    ESTIMATE_ACCURACY,
    CompileLimitError,
    Contraction,
    Estimate,
    JointreePlan,
    SeparatorPlan,
    additive_estimate,
    constant_prefixes,
    context_index,
    joint_error_bound,
    jointree_floor,
    lower_tables,
    margins,
    may_fit,
    pattern_bytes,
    plan_joint,
    plan_jointree,
    plan_separator,
    refusal,
    relevant_factors,
    rows_per_step,
    separator_error_bound,
    separator_floor,
    separator_memory,
    settles,
    upper_error_bound,
    within,
)

METHODS = ("auto", "joint", "decompose", "jointree")
AUTO_QUICK_SECONDS = 1.0
ADDITIVE_EXACT_LIMIT = 1 << 22
# The additive route decides each (context, prefix part) against every completion at once
# when that is at most this many cells or the inputs in its window, else input by input.
ADDITIVE_PART_CELLS = 1 << 12
# The decisions not on the exact path yet compare float posteriors with this tolerance:
# argmax states this close to the largest tie with it, and the jointree route decides
# ``P >= T - TIE_TOLERANCE``; their results say ``certified=False``.
TIE_TOLERANCE = 1e-9
MAX_TIE_PAIRS = 1 << 20
"""Pair counts an argmax compilation derives from its distinct sets of tied states (the sum
of ``m (m - 1) / 2`` over sets of ``m`` states): past it the pairs are not counted."""
MAX_TIE_SET_BYTES = 16 << 20
"""Bytes the distinct sets of tied states may take (one bit per state each)."""
ARGMAX_BLOCK_CELLS = 1 << 22
"""Cells (states x inputs) of the argmax decisions made between two deadline checks."""
Progress = Callable[[int, int], None]


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
    positives : int or None
        Inputs decided positive (``None`` for an argmax classifier: see ``decided``).
    inputs : int
        All inputs (product of the cardinalities).
    ties : int
        Threshold: inputs whose posterior is exactly the threshold, in exact arithmetic on
        the network as read (decided positive); 0 on the additive route, which cannot tell.
        Argmax: inputs where two or more states are within ``tie_tolerance`` of the largest
        float posterior (decided the lowest state index).
    exact_inputs : int
        Threshold only: inputs whose float margin was within the route's error bound,
        decided in exact rational arithmetic (the ties among them).
    certified : bool
        Every decision is the exact one (False when ``uncertified`` inputs exist; always
        False for argmax, whose decisions use float posteriors and ``tie_tolerance``).
    uncertified : int
        Inputs within the float error bound of the threshold that were not recomputed
        (past :data:`~boxwatch.offline.bn.exact.EXACT_LIMIT`): decided positive where the
        float ``P(x)`` is not 0.
    impossible : int
        Inputs of probability 0 (posterior undefined; decided negative, or state 0 for
        argmax).
    seconds : float
        Compilation time, excluding parsing.
    posterior : ndarray or None
        Kept by the joint route only: ``P(C = positive | x)`` of shape
        ``(card_0, ..., card_{n-1})`` in diagram order; for argmax ``P(C = c | x)`` of shape
        ``(n_states, card_0, ..., card_{n-1})``.
    estimate : Estimate or None
        The chosen route's estimated peak memory and time, made before it started.
    decided : dict of str to int
        Inputs reaching each sink (terminal label), exactly.
    tie_pairs : dict of (str, str) to int
        Argmax only: for each pair of states (network order) the inputs on which both are
        within ``tie_tolerance`` of the largest posterior; pairs that never tie are left out.
        Empty when ``tie_pairs_counted`` is False.
    tie_pairs_counted : bool
        False when the tied pairs were too many to count (:data:`MAX_TIE_PAIRS`; the tied
        inputs, ``ties``, are counted all the same).
    row_sums : RowSums or None
        How far the file's CPT rows are from summing to 1; every route read them divided
        by their sums (:data:`~boxwatch.offline.bn.network.READING`).
    planning_seconds : float
        Of ``seconds``, those spent sizing the routes before one started (``estimate``
        covers the route that ran).
    early_inputs : int
        Inputs decided before their last features were enumerated: by the separator route
        from the prefix message alone (a prefix whose every completion has one decision),
        by the jointree route at a cut before the last level.
    """

    diagram: DecisionDiagram
    method: str
    nodes: int
    nodes_quasi: int
    nodes_per_level: tuple[int, ...]
    nodes_quasi_per_level: tuple[int, ...]
    edges: int
    positives: int | None
    inputs: int
    ties: int
    impossible: int
    seconds: float
    exact_inputs: int = 0
    certified: bool = True
    uncertified: int = 0
    posterior: np.ndarray | None = None
    estimate: Estimate | None = None
    decided: dict[str, int] | None = None
    tie_pairs: dict[tuple[str, str], int] | None = None
    tie_tolerance: float | None = None
    early_inputs: int = 0
    tie_pairs_counted: bool = True
    row_sums: RowSums | None = None
    planning_seconds: float = 0.0

    def posterior_of(self, X: Any) -> np.ndarray:
        """``P(C = positive | x)`` per assignment, from the kept joint table.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), or records
            As for :meth:`DecisionDiagram.predict`.

        Returns
        -------
        ndarray of shape (n_samples,), for argmax (n_samples, n_states); NaN for inputs of
        probability 0.

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
        if self.diagram.is_argmax:
            return np.moveaxis(self.posterior, 0, -1)[tuple(X.T)]
        return self.posterior[tuple(X.T)]

    def summary(self) -> dict[str, Any]:
        """JSON-able figures (what ``boxwatch compile-bn --json`` prints)."""
        d = self.diagram
        return {
            "class_variable": d.class_variable,
            "decision": d.decision,
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
            "tie_pairs": [
                {"states": list(pair), "inputs": n} for pair, n in (self.tie_pairs or {}).items()
            ],
            "tie_pairs_counted": self.tie_pairs_counted,
            "decided": dict(self.decided or {}),
            "tie_tolerance": self.tie_tolerance,
            "exact_inputs": self.exact_inputs,
            "certified": self.certified,
            "uncertified": self.uncertified,
            "impossible": self.impossible,
            "constant": d.root < d.n_terminals,
            "seconds": self.seconds,
            "planning_seconds": self.planning_seconds,
            "estimate": self.estimate.to_dict() if self.estimate else None,
            "reading": self.row_sums.to_dict() if self.row_sums else None,
        }


def compile_classifier(
    network: Network | str | Any,
    spec: ClassifierSpec | ResolvedSpec,
    *,
    method: str = "auto",
    max_memory: float | None = None,
    max_seconds: float | None = None,
    progress: Progress | None = None,
    deadline: Deadline | None = None,
) -> CompileResult:
    """Compile a threshold or argmax classifier into its canonical decision diagram.

    Every route is sized first (:mod:`boxwatch.offline.bn.plan`); one whose estimate
    exceeds a limit is not started. Routes that cannot fit are ruled out from the
    cardinalities before they are planned, and planning is held to the time limit too: a
    route whose planning runs out of time does not fit.

    Parameters
    ----------
    network : Network, path or pgmpy ``DiscreteBayesianNetwork``
    spec : ClassifierSpec or ResolvedSpec
    method : {"auto", "joint", "decompose"}
        ``auto`` takes the route with the smallest estimated time among those that fit (the
        joint route without sizing the others when it fits and is estimated to take at most
        :data:`AUTO_QUICK_SECONDS`).
    max_memory : float, optional
        Bytes any route may use; default :func:`~boxwatch.offline.bn.limits.default_max_memory`.
    max_seconds : float, optional
        Refuse routes estimated to take longer, and stop a route that runs past it (wall
        clock, planning included; checked inside every route's loops); default no limit.
    progress : callable(done, total), optional
        Called as the long loops advance (the separator route's prefixes).
    deadline : Deadline, optional
        A clock already running (the command's, started before it read the network): the
        compilation is held to its ``max_seconds`` from its ``start`` instead.

    Returns
    -------
    CompileResult

    Raises
    ------
    ConfigError
        For an invalid spec or unknown method.
    CompileLimitError
        (a ``ConfigError``) when no route fits the limits, naming the estimates and limits;
        also when an allocation fails during compilation.
    CompileTimeError
        (a ``ConfigError``) when the compilation runs past ``max_seconds``, naming the route
        and how far it got.
    """
    if method not in METHODS:
        raise ConfigError(f"method {method!r} is not one of {list(METHODS)}")
    if not isinstance(network, Network):
        network = load_network(network)
    if not isinstance(spec, ResolvedSpec):
        spec = resolve_spec(network, spec)
    row_sums = network.row_sums
    network = network.renormalised
    limit = float(default_max_memory() if max_memory is None else max_memory)
    start = time.perf_counter()
    if deadline is None:
        deadline = Deadline(max_seconds, network.source, start)
    max_seconds = deadline.max_seconds
    deadline.enter(None)
    deadline.route = "planning"
    cards = [network.card(f) for f in spec.order]
    inputs = math.prod(cards)
    options = _plan_routes(network, spec, method, limit, deadline, progress)
    planning = time.perf_counter() - start
    # the routes estimated to fit in what the limit leaves after planning; else those that
    # may, given the estimates' accuracy
    left = None if max_seconds is None else max(0.0, max_seconds - deadline.elapsed())
    planned = [o for o in options if o[1] is not _never_runs]
    fitting = [o for o in planned if within(o[0], limit, left)] or [
        o for o in planned if may_fit(o[0], limit, left)
    ]
    if not fitting:
        raise refusal(network.source, [e for e, _ in options], limit, max_seconds)
    estimate, build = min(fitting, key=lambda o: (o[0].seconds, o[0].bytes))
    deadline.check("the routes were planned, none started")
    deadline.route = estimate.route
    try:
        built = build()
    except MemoryError as exc:
        raise CompileLimitError(
            f"{network.source}: out of memory during the {estimate.route} route "
            f"(estimate {estimate.text()}; limit {format_bytes(limit)})"
        ) from exc
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
        positives=None if diagram.positive is None else counts[diagram.positive],
        inputs=inputs,
        ties=built.ties,
        impossible=built.impossible,
        seconds=seconds,
        exact_inputs=built.exact_inputs,
        certified=built.uncertified == 0 and not diagram.is_argmax and built.method != "jointree",
        uncertified=built.uncertified,
        posterior=built.posterior,
        estimate=estimate,
        decided=counts,
        tie_pairs=None if built.tie_sets is None else built.tie_sets.pairs(diagram.terminals),
        tie_tolerance=TIE_TOLERANCE if diagram.is_argmax else None,
        early_inputs=built.early_inputs,
        tie_pairs_counted=built.tie_sets is None or built.tie_sets.counted,
        row_sums=row_sums,
        planning_seconds=planning,
    )


def _never_runs() -> _Built:
    """The build of a route sized out before planning (its estimate never fits)."""
    raise AssertionError("a route estimated not to fit was started")


def _plan_routes(
    network: Network,
    spec: ResolvedSpec,
    method: str,
    limit: float,
    deadline: Deadline,
    progress: Progress | None,
) -> list[tuple[Estimate, Callable[[], _Built]]]:
    """Every route ``method`` allows, sized: (estimate, build), in order.

    A route whose lower bound from the cardinalities alone does not fit is not planned
    (its bound is its estimate). A route whose planning runs past the time limit gets an
    estimate that fits nothing and says so, and the routes after it are not planned.
    """
    max_seconds = deadline.max_seconds
    options: list[tuple[Estimate, Callable[[], _Built]]] = []
    planning = "joint"
    try:
        if method in ("auto", "joint") or len(spec.order) < 2:
            joint = plan_joint(network, spec, max_memory=limit, deadline=deadline)
            if joint.contraction is not None:
                planned = joint.contraction
                options.append(
                    (joint.estimate, lambda: _compile_joint(network, spec, planned, deadline))
                )
            else:
                options.append((joint.estimate, _never_runs))
        quick = (
            method == "auto"
            and bool(options)
            and within(options[0][0], limit, max_seconds)
            and (options[0][0].seconds <= AUTO_QUICK_SECONDS)
        )
        if method in ("auto", "jointree") and len(spec.order) >= 2 and not quick:
            planning = "jointree"
            floor = jointree_floor(network, spec)
            if may_fit(floor, limit, max_seconds):
                tree = plan_jointree(network, spec, max_memory=limit, deadline=deadline)
                options.append(
                    (
                        tree.estimate,
                        lambda: _compile_jointree(
                            network,
                            spec,
                            tree,
                            max_memory=limit,
                            progress=progress,
                            deadline=deadline,
                        ),
                    )
                )
            else:
                options.append((floor, _never_runs))
        if method in ("auto", "decompose") and len(spec.order) >= 2 and not quick:
            if _additive_applies(network, spec):
                planning = "decompose/additive"
                options.append(
                    (
                        _additive_estimate(network, spec),
                        lambda: _compile_additive(network, spec, deadline),
                    )
                )
            else:
                planning = "decompose/separator"
                floor = separator_floor(network, spec)
                if may_fit(floor, limit, max_seconds):
                    sep = plan_separator(network, spec, max_memory=limit, deadline=deadline)
                    options.append(
                        (
                            sep.estimate,
                            lambda: _compile_separator(
                                network,
                                spec,
                                sep,
                                max_memory=limit,
                                progress=progress,
                                deadline=deadline,
                            ),
                        )
                    )
                else:
                    options.append((floor, _never_runs))
    except CompileTimeError as exc:
        stopped = (
            f"planning stopped at the time limit after {deadline.elapsed():.3g} s ({exc.reached})"
        )
        options.append((Estimate(planning, math.inf, math.inf, stopped, sized=False), _never_runs))
    return options


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
    tie_sets: _TieSets | None = None
    exact_inputs: int = 0
    uncertified: int = 0
    early_inputs: int = 0


class _TieSets:
    """The distinct sets of tied states of an argmax compilation, with the inputs having each.

    A set is kept once, one bit per state, however many inputs have it; the pair counts
    are derived from the sets at the end (:meth:`pairs`). Work and memory follow the ties
    that exist, not the square of the states: past :data:`MAX_TIE_PAIRS` pairs (or
    :data:`MAX_TIE_SET_BYTES` of sets) the pairs are no longer counted (:attr:`counted`).
    """

    def __init__(self, n_states: int):
        self.n_states = n_states
        self.sets: dict[bytes, int] = {}
        self.pair_count = 0
        self.counted = True

    def add(self, near: np.ndarray, weights: np.ndarray | None) -> None:
        """Record tied inputs: ``near`` (n_states, n) marks each one's tied states, each
        input counting ``weights`` inputs (default one)."""
        if not self.counted or near.shape[1] == 0:
            return
        rows = np.ascontiguousarray(np.packbits(near, axis=0).T)
        keys = rows.view(np.dtype((np.void, rows.shape[1]))).reshape(-1)
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        totals = np.zeros(first.size, dtype=np.int64)
        np.add.at(totals, inverse.reshape(-1), 1 if weights is None else weights)
        sizes = np.count_nonzero(near[:, first], axis=0)
        for key, total, m in zip(keys[first], totals.tolist(), sizes.tolist(), strict=True):
            raw = key.tobytes()
            if raw not in self.sets:
                self.pair_count += m * (m - 1) // 2
                if (
                    self.pair_count > MAX_TIE_PAIRS
                    or (len(self.sets) + 1) * len(raw) > MAX_TIE_SET_BYTES
                ):
                    self.counted = False
                    self.sets.clear()
                    return
                self.sets[raw] = 0
            self.sets[raw] += total

    def pairs(self, terminals: Sequence[str]) -> dict[tuple[str, str], int]:
        """Inputs on which each pair of states ties, by state names in network order (empty
        when not :attr:`counted`)."""
        if not self.sets:
            return {}
        k = self.n_states
        codes: list[np.ndarray] = []
        counts: list[np.ndarray] = []
        for raw, total in self.sets.items():
            members = np.flatnonzero(np.unpackbits(np.frombuffer(raw, dtype=np.uint8))[:k])
            a, b = np.triu_indices(members.size, 1)
            codes.append(members[a].astype(np.int64) * k + members[b])
            counts.append(np.full(a.size, total, dtype=np.int64))
        unique, inverse = np.unique(np.concatenate(codes), return_inverse=True)
        sums = np.zeros(unique.size, dtype=np.int64)
        np.add.at(sums, inverse.reshape(-1), np.concatenate(counts))
        return {
            (terminals[c // k], terminals[c % k]): n
            for c, n in zip(unique.tolist(), sums.tolist(), strict=True)
        }


def spec_terminals(network: Network, spec: ResolvedSpec) -> tuple[str, ...]:
    """Sink labels of a classifier: every class state (argmax) or :func:`terminals_for`."""
    if spec.is_argmax:
        return tuple(network.states[spec.class_variable])
    return terminals_for(network, spec.class_variable, str(spec.positive))[0]


def terminals_for(
    network: Network, class_variable: str, positive: str
) -> tuple[tuple[str, ...], int]:
    """Sink labels and the positive sink id.

    A binary class keeps its two states in the network's order; a class with more states
    gets ``(f"not {positive}", positive)``.
    """
    states = network.states[class_variable]
    if len(states) == 2:
        return tuple(states), states.index(positive)
    return (f"not {positive}", positive), 1


def _dense_ids(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of an array of node ids (sorted) and each cell's index among
    them: through a table of the ids present when they are few against the cells (sink
    ids, the node ids of a chunk), else a sort."""
    if table.size == 0:
        return np.zeros(0, dtype=np.int64), table.astype(np.int64)
    top = int(table.max()) + 1
    if top <= max(1 << 16, table.size):
        present = np.zeros(top, dtype=bool)
        present[table] = True
        values = np.flatnonzero(present)
        index = np.cumsum(present) - 1
        return values, index[table]
    values, inverse = np.unique(table, return_inverse=True)
    return values.astype(np.int64), inverse.reshape(table.shape)


class _NodeStore:
    """Accumulates quasi-reduced nodes level by level; ids start after the sinks."""

    def __init__(self, n_terminals: int, cards: Sequence[int], deadline: Deadline | None = None):
        self.nt = n_terminals
        self.deadline = deadline or Deadline(None, "")
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
        level below ``last``; returns shape ``(m,)``: the ids at ``first_level``. Each
        level's rows are compared by the indices of the distinct nodes below them, small
        integers (counted rather than sorted while they are few, :func:`unique_rows`), and
        stored with those nodes' ids.
        """
        below, local = _dense_ids(table)
        return self.merge(below, local, first_level)

    def merge(self, below: np.ndarray, local: np.ndarray, first_level: int) -> np.ndarray:
        """:meth:`bottom_up` of a table given as indices ``local`` into the ids ``below``
        of the nodes under its last level."""
        for level in range(first_level + local.ndim - 2, first_level - 1, -1):
            self.deadline.check(f"merging level {level} of {len(self.cards)} into nodes")
            card = self.cards[level]
            uniq, inverse = unique_rows(local.reshape(-1, card))
            below = self.add_level(level, below[uniq])
            local = inverse.reshape(local.shape[:-1])
        return below[local]

    def diagram(self, root: int, **kw: Any) -> DecisionDiagram:
        """The canonical diagram of the stored nodes below ``root``."""
        if self.levels:
            level = np.concatenate(self.levels)
            children = np.concatenate(self.rows)
        else:
            level = np.zeros(0, dtype=np.int64)
            children = np.zeros((0, self.width), dtype=np.int64)
        return DecisionDiagram.canonical(node_level=level, node_children=children, root=root, **kw)


def _diagram_kw(network: Network, spec: ResolvedSpec) -> dict[str, Any]:
    return {
        "features": spec.order,
        "states": [network.states[f] for f in spec.order],
        "terminals": spec_terminals(network, spec),
        "class_variable": spec.class_variable,
        "positive": spec.positive,
        "threshold": spec.threshold,
        "decision": ARGMAX if spec.is_argmax else THRESHOLD,
    }


def _posterior(num: np.ndarray, den: np.ndarray) -> tuple[np.ndarray, int]:
    """Float posterior (NaN where ``P(x)`` is 0) and the count of such inputs."""
    with np.errstate(invalid="ignore", divide="ignore"):
        post = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
    return post, int(np.count_nonzero(~(den > 0)))


def _decide(
    num: np.ndarray, den: np.ndarray, threshold: float
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Float posterior, decisions (``>= T - TIE_TOLERANCE``), ties and impossible inputs of a
    block: the jointree route's decision, not on the exact path."""
    post, impossible = _posterior(num, den)
    decision = post >= threshold - TIE_TOLERANCE
    ties = int(np.count_nonzero(np.abs(post - threshold) <= TIE_TOLERANCE))
    return post, decision, ties, impossible


def _code_dtype(n_states: int) -> type:
    """Smallest unsigned integer type holding a state index (one byte up to 256 states)."""
    return np.uint8 if n_states <= 256 else np.uint16


def _decide_argmax(
    joint: np.ndarray,
    tie_sets: _TieSets,
    deadline: Deadline,
    *,
    weights: np.ndarray | None = None,
    keep_posterior: bool = False,
) -> tuple[np.ndarray | None, np.ndarray, int, int]:
    """Argmax decisions, tied and impossible inputs of a table, a block of inputs at a time.

    ``joint`` holds ``P(c, x)`` with the class state on axis 0. A state ties with the best
    one when its posterior is within :data:`TIE_TOLERANCE` of the largest; the decision is
    the lowest tied state index. Inputs of probability 0 have no tied state and get 0. Each
    input counts as ``weights`` inputs (default one); the sets of tied states go to
    ``tie_sets``. ``deadline`` is checked every :data:`ARGMAX_BLOCK_CELLS` cells.
    Returns ``(post, codes, ties, impossible)``: ``post`` the posteriors (``None`` unless
    ``keep_posterior``), ``codes`` (:func:`_code_dtype`) of ``joint``'s shape without axis 0.
    """
    zc = joint.shape[0]
    flat = joint.reshape(zc, -1)
    n = flat.shape[1]
    codes: np.ndarray = np.empty(n, dtype=_code_dtype(zc))
    post = np.empty(flat.shape) if keep_posterior else None
    ties = impossible = 0
    step = max(1, ARGMAX_BLOCK_CELLS // zc)
    for s in range(0, n, step):
        deadline.check(f"argmax decisions of {s:,} of {n:,} inputs made")
        block = flat[:, s : s + step]
        den = block.sum(axis=0)
        ok = den > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.where(ok, block / np.where(ok, den, 1.0), np.nan)
        best = np.where(ok, p, 0.0).max(axis=0)
        near = (p >= best - TIE_TOLERANCE) & ok
        codes[s : s + step] = np.argmax(near, axis=0)
        multi = np.count_nonzero(near, axis=0) >= 2
        w = None if weights is None else weights[s : s + step]
        if w is None:
            ties += int(np.count_nonzero(multi))
            impossible += int(np.count_nonzero(~ok))
        else:
            ties += int(w[multi].sum())
            impossible += int(w[~ok].sum())
        if multi.any():
            tie_sets.add(near[:, multi], None if w is None else w[multi])
        if post is not None:
            post[:, s : s + step] = p
    shape = joint.shape[1:]
    return (
        None if post is None else post.reshape(joint.shape),
        codes.reshape(shape),
        ties,
        impossible,
    )


def _positive_index(network: Network, spec: ResolvedSpec) -> int:
    """Index of the positive state among the class variable's states."""
    return network.states[spec.class_variable].index(spec.positive)


# ---------------------------------------------------------------------------- joint route
def _compile_joint(
    network: Network,
    spec: ResolvedSpec,
    contraction: Contraction,
    deadline: Deadline | None = None,
) -> _Built:
    """Fast path: the joint table over class and features, thresholded, unique rows upward."""
    cls, order = spec.class_variable, spec.order
    factors = relevant_factors(network, [cls, *order])
    joint = contraction.run(factors)
    cards = [network.card(f) for f in order]
    deadline = deadline or Deadline(None, "")
    deadline.check("the joint table was contracted")
    if spec.is_argmax:
        store = _NodeStore(network.card(cls), cards, deadline)
        tie_sets = _TieSets(network.card(cls))
        post, codes, ties, impossible = _decide_argmax(
            joint, tie_sets, deadline, keep_posterior=True
        )
        del joint
        root = int(store.bottom_up(codes.astype(np.int64)[None, ...], 0)[0])
        diagram = store.diagram(root, **_diagram_kw(network, spec))
        return _Built(
            diagram, "joint", store.count, tuple(store.per_level), ties, impossible, post, tie_sets
        )
    assert spec.threshold is not None
    pos = _positive_index(network, spec)
    num, den = np.ascontiguousarray(joint[pos]), joint.sum(axis=0)
    del joint
    post, impossible = _posterior(num, den)
    decision = np.empty(num.shape, dtype=bool)
    exact = refine(
        num,
        den,
        decision,
        joint_error_bound(network, spec, factors, contraction),
        spec.threshold,
        ExactJoint(network, cls, order),
        pos,
        lambda idx, columns: grid_columns(idx, cards, columns),
        ExactBudget(),
    )
    del num, den
    terminals, pos_sink = terminals_for(network, cls, str(spec.positive))
    sinks = np.where(decision, pos_sink, 1 - pos_sink).astype(np.int64)
    del decision
    store = _NodeStore(len(terminals), cards, deadline)
    root = int(store.bottom_up(sinks[None, ...], 0)[0])
    diagram = store.diagram(root, **_diagram_kw(network, spec))
    return _Built(
        diagram,
        "joint",
        store.count,
        tuple(store.per_level),
        exact.ties,
        impossible + exact.impossible_delta,
        post,
        exact_inputs=exact.exact_inputs,
        uncertified=exact.uncertified,
    )


def _split_level(cards: Sequence[int], contexts: int = 1) -> int:
    """Split ``k`` in 1..n-1 minimising the larger of prefixes and completions (the
    products kept as running products: linear in the features, not quadratic)."""
    suffix = [1] * (len(cards) + 1)
    for i in range(len(cards) - 1, -1, -1):
        suffix[i] = suffix[i + 1] * cards[i]
    best, best_k, prefix = None, 1, 1
    for k in range(1, len(cards)):
        prefix *= cards[k - 1]
        cost = max(prefix, suffix[k] * contexts)
        if best is None or cost < best:
            best, best_k = cost, k
    return best_k


# ---------------------------------------------------------------------------- separator route
def _class_products(u: np.ndarray, table: np.ndarray, class_free: bool) -> np.ndarray:
    """``P(c, x)`` for every class state (axis 0) and completion of the prefixes of ``u``."""
    if class_free:
        return np.stack([u[:, c, :] @ table for c in range(u.shape[1])])
    return np.stack([u[:, c, :] @ table[c] for c in range(u.shape[1])])


def _compile_separator(
    network: Network,
    spec: ResolvedSpec,
    plan: SeparatorPlan,
    *,
    max_memory: float,
    progress: Progress | None = None,
    deadline: Deadline | None = None,
) -> _Built:
    """Decomposition for any network: prefix and suffix messages over the planned cut.

    The lower message is made once; the prefix message a block of prefixes at a time
    (:meth:`~boxwatch.offline.bn.plan.SeparatorPlan.block`), never whole. Distinct
    sub-classifiers are kept as packed decision bits (argmax: one byte per completion, the
    decided state) while the prefixes are scanned, their memory checked against
    ``max_memory`` as they grow (past :data:`~boxwatch.offline.bn.plan.ESTIMATE_ACCURACY`
    times it, as the estimate is refused); they are merged into nodes a chunk at a time.
    """
    cut = plan.cut
    cls = spec.class_variable
    cards = [network.card(f) for f in spec.order]
    k, n_pre, n_suf, n_ctx = cut.k, cut.n_pre, cut.n_suf, cut.n_ctx
    zc = cut.n_class
    deadline = deadline or Deadline(None, "")
    lower = lower_tables(network, plan)
    deadline.check("the suffix message was contracted")
    argmax = spec.is_argmax
    pos = 0 if argmax else _positive_index(network, spec)
    tie_sets = _TieSets(zc)
    ties = 0
    threshold = math.nan if spec.threshold is None else spec.threshold
    if not argmax:
        bound = separator_error_bound(network, plan)
        exact = ExactJoint(network, cls, spec.order)
    # Prefixes whose sub-classifier is constant are decided from the prefix message alone
    # (constant_prefixes): only on a class-free cut, and where nothing can underflow (a
    # float 0 is then an exact 0, so the impossible inputs of a settled prefix are counted
    # exactly from the lower message's zero columns); whole blocks of them from the
    # message of their first features (plan.blocks), where no input is impossible.
    early = settles(network, spec, plan)
    if early:
        upper_bound = upper_error_bound(network, plan)
        zero_columns = [int(np.count_nonzero(~(t > 0).any(axis=0))) for t in lower]
    all_false = np.packbits(np.zeros((1, n_suf), dtype=bool), axis=1)
    all_true = np.packbits(np.ones((1, n_suf), dtype=bool), axis=1)
    settled = 0
    refined, budget = Refinement(), ExactBudget()
    if argmax:
        terminals, pos_sink = spec_terminals(network, spec), 0
    else:
        terminals, pos_sink = terminals_for(network, cls, str(spec.positive))
    key_of_prefix = np.empty(n_pre, dtype=np.int64)
    patterns: dict[bytes, int] = {}
    impossible = done = 0
    step = rows_per_step(cut, argmax)
    fixed = dict(
        separator_memory(cut, plan.up, plan.lo, plan.fixed, 0.0, argmax, plan.settled).phases
    )
    block = plan.block_prefixes
    buffer = np.empty(block * cut.shared_states)
    u_block = buffer
    for b in range(plan.n_blocks):
        deadline.check(f"{done:,} of {n_pre:,} prefixes decided")
        first = b * block
        if plan.blocks is not None and plan.blocks[b] >= 0:  # decided before its message
            sink_bits = all_true if plan.blocks[b] == 1 else all_false
            key_of_prefix[first : first + block] = patterns.setdefault(
                sink_bits.tobytes(), len(patterns)
            )
            settled += block
            done += block
            if progress is not None:
                progress(done, n_pre)
            continue
        u_block = plan.block_message(network, b, buffer)
        contexts = context_index(first + np.arange(block), cut) if n_ctx > 1 else None
        for c in range(n_ctx):
            members = np.arange(block) if contexts is None else np.flatnonzero(contexts == c)
            table = lower[c]
            if early:  # the prefixes decided from their message alone, then the others
                const = constant_prefixes(
                    u_block if contexts is None else u_block[members],
                    pos,
                    threshold,
                    upper_bound,
                    all_possible=zero_columns[c] == 0,
                )
                for value, sink_bits in ((0, all_false), (1, all_true)):
                    decided = members[const == value]
                    if decided.size:
                        key = patterns.setdefault(sink_bits.tobytes(), len(patterns))
                        key_of_prefix[first + decided] = key
                        settled += decided.size
                        if value == 0:
                            impossible += decided.size * zero_columns[c]
                done += int(np.count_nonzero(const >= 0))
                members = members[const < 0]
                del const
                if progress is not None:
                    progress(done, n_pre)
            for s in range(0, members.size, step):
                deadline.check(f"{done:,} of {n_pre:,} prefixes decided")
                u = u_block[members[s : s + step]]
                part = first + members[s : s + step]
                if argmax:
                    probs = _class_products(u, table, cut.class_free)
                    _, codes, t, imp = _decide_argmax(probs, tie_sets, deadline)
                    del probs
                    ties += t
                    impossible += imp
                    packed = np.ascontiguousarray(codes)
                else:
                    num, den = margins(u, table, pos, cut.class_free)
                    decision = np.empty(num.shape, dtype=bool)
                    impossible += int(np.count_nonzero(~(den > 0)))
                    refined.add(
                        refine(
                            num,
                            den,
                            decision,
                            bound,
                            threshold,
                            exact,
                            pos,
                            _separator_locate(part, cards, k, n_suf),
                            budget,
                        )
                    )
                    del num, den
                    packed = np.ascontiguousarray(np.packbits(decision, axis=1))
                    del decision
                keys = packed.view(np.dtype((np.void, packed.shape[1] * packed.itemsize)))
                keys = keys.reshape(-1)
                _, first_of, inverse = np.unique(keys, return_index=True, return_inverse=True)
                local = np.empty(first_of.size, dtype=np.int64)
                for q, f in enumerate(first_of):
                    local[q] = patterns.setdefault(keys[f].tobytes(), len(patterns))
                key_of_prefix[part] = local[inverse.reshape(-1)]
                del packed, keys, u
                held = fixed["prefix blocks"] + pattern_bytes(cut, len(patterns), argmax)
                if held > ESTIMATE_ACCURACY * max_memory:
                    raise CompileLimitError(
                        f"{network.source}: {len(patterns):,} distinct sub-classifiers of "
                        f"{n_suf:,} completions after {done + part.size:,} of {n_pre:,} "
                        f"prefixes need more than the limit {format_bytes(max_memory)} "
                        f"(estimate {plan.estimate.text()}); give fewer features or another "
                        "order"
                    )
                done += part.size
                if progress is not None:
                    progress(done, n_pre)
    del lower, buffer, u_block
    store = _NodeStore(len(terminals), cards, deadline)
    level_k_ids = _merge_patterns(store, list(patterns), cards, k, argmax, pos_sink, zc)
    del patterns
    prefix_table = level_k_ids[key_of_prefix].reshape(1, *cards[:k])
    del key_of_prefix, level_k_ids
    root = int(store.bottom_up(prefix_table, 0)[0])
    diagram = store.diagram(root, **_diagram_kw(network, spec))
    quasi = diagram.quasi_nodes_per_level()
    return _Built(
        diagram,
        "decompose/separator",
        sum(quasi),
        quasi,
        ties + refined.ties,
        impossible + refined.impossible_delta,
        tie_sets=tie_sets if argmax else None,
        exact_inputs=refined.exact_inputs,
        uncertified=refined.uncertified,
        early_inputs=settled * n_suf,
    )


def _merge_patterns(
    store: _NodeStore,
    keys: list[bytes],
    cards: Sequence[int],
    k: int,
    argmax: bool,
    pos_sink: int,
    n_states: int,
) -> np.ndarray:
    """Node ids at level ``k`` of the distinct sub-classifiers ``keys`` (packed decision
    bits, or argmax codes), merged into ``store`` :data:`BUILD_CHUNK_CELLS` completions at a
    time (a node two chunks share is stored twice; the canonical diagram merges them).

    Where the last three features are binary, a byte of decision bits is the function of
    those three levels: the bytes are merged as they are (eight completions a cell), the
    256 possible functions built once."""
    n_suf = math.prod(cards[k:])
    dtype = _code_dtype(n_states) if argmax else np.uint8
    ids = np.empty(len(keys), dtype=np.int64)
    rows = max(1, BUILD_CHUNK_CELLS // max(1, n_suf))
    bytewise = not argmax and len(cards) - k > 3 and tuple(cards[-3:]) == (2, 2, 2)
    if bytewise:
        functions = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1)
        if pos_sink == 0:
            functions ^= 1
        byte_ids = store.bottom_up(functions.reshape(256, 2, 2, 2), len(cards) - 3)
    for s in range(0, len(keys), rows):
        chunk: np.ndarray = np.frombuffer(b"".join(keys[s : s + rows]), dtype=dtype)
        chunk = chunk.reshape(len(keys[s : s + rows]), -1)
        if bytewise:
            values, local = _dense_ids(chunk)
            table = local.reshape(-1, *cards[k:-3])
            ids[s : s + chunk.shape[0]] = store.merge(byte_ids[values], table, k)
            continue
        if argmax:
            table = chunk.astype(np.int64)
        else:
            table = np.unpackbits(chunk, axis=1, count=n_suf)  # sink ids 0 / 1, one byte
            if pos_sink == 0:
                table ^= 1
        ids[s : s + chunk.shape[0]] = store.bottom_up(table.reshape(-1, *cards[k:]), k)
    return ids


def _separator_locate(
    part: np.ndarray, cards: Sequence[int], k: int, n_suf: int
) -> Callable[[np.ndarray, Sequence[int]], np.ndarray]:
    """Values of chosen features at flat positions in a ``(len(part), n_suf)`` block."""

    def locate(idx: np.ndarray, columns: Sequence[int]) -> np.ndarray:
        rows, cols = np.divmod(idx, n_suf)
        return _split_columns(part[rows], cols, cards, k, columns)

    return locate


def _split_columns(
    prefix: np.ndarray, completion: np.ndarray, cards: Sequence[int], k: int, columns: Sequence[int]
) -> np.ndarray:
    """Values of the features at ``columns`` of inputs given as a prefix index (grid
    ``cards[:k]``) and a completion index (grid ``cards[k:]``)."""
    out = np.empty((prefix.size, len(columns)), dtype=np.int64)
    for j, c in enumerate(columns):
        index, stride = (
            (prefix, math.prod(cards[c + 1 : k]))
            if c < k
            else (completion, math.prod(cards[c + 1 :]))
        )
        np.floor_divide(index, stride, out=out[:, j])
        out[:, j] %= cards[c]
    return out


def _split_keys(
    prefix: np.ndarray, cards: Sequence[int], k: int, columns: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Mixed-radix keys over the features at ``columns`` (first slowest), split in two
    parts that add up: one per prefix index of ``prefix`` (grid ``cards[:k]``), one per
    completion index (grid ``cards[k:]``, all of them)."""
    n_suf = math.prod(cards[k:])
    pre_key = np.zeros(prefix.size, dtype=np.int64)
    suf_key = np.zeros(n_suf, dtype=np.int64)
    completion = np.arange(n_suf)
    weight = 1
    for c in reversed(columns):
        if c < k:
            pre_key += (prefix // math.prod(cards[c + 1 : k]) % cards[c]) * weight
        else:
            suf_key += (completion // math.prod(cards[c + 1 :]) % cards[c]) * weight
        weight *= cards[c]
    return pre_key, suf_key


# ---------------------------------------------------------------------------- additive route
def _additive_applies(network: Network, spec: ResolvedSpec) -> bool:
    """Threshold decision, binary class, no hidden ancestors, strictly positive relevant CPTs."""
    cls = spec.class_variable
    if spec.is_argmax or network.card(cls) != 2:
        return False
    keep = [cls, *spec.order]
    if network.ancestors(keep) != set(keep):
        return False
    return all((network.cpts[v] > 0).all() for v in keep)


_Terms = list[list[tuple[list[int], np.ndarray]]]


def _additive_layout(
    network: Network, spec: ResolvedSpec
) -> tuple[float, _Terms, list[list[int]], int]:
    """Log-odds constant, terms per level, context per level and the split level ``k``."""
    cls, order = spec.class_variable, list(spec.order)
    n = len(order)
    cards = [network.card(f) for f in order]
    pos_of = {f: i for i, f in enumerate(order)}
    pos = _positive_index(network, spec)
    # log-odds terms: level -> list of (feature positions in scope, table over them)
    const = 0.0
    terms: _Terms = [[] for _ in range(n)]
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
    # context of level l: earlier features in the scope of a term at level >= l, i.e. the
    # positions p < l whose last term is at level >= l (one sweep, not a rescan per level)
    last: dict[int, int] = {}
    for lvl in range(n):
        for sc, _ in terms[lvl]:
            for p in sc:
                last[p] = max(last.get(p, lvl), lvl)
    ending: list[list[int]] = [[] for _ in range(n + 1)]
    for p, lvl in last.items():
        ending[lvl].append(p)
    ctx: list[list[int]] = []
    active: set[int] = set()
    for lvl in range(n + 1):
        if lvl > 0 and lvl - 1 in last and last[lvl - 1] >= lvl:
            active.add(lvl - 1)
        ctx.append(sorted(active))
        active.difference_update(ending[lvl])
    k = _split_level(cards, contexts=max(1, max(math.prod(cards[p] for p in c) for c in ctx)))
    return const, terms, ctx, k


def _additive_estimate(network: Network, spec: ResolvedSpec) -> Estimate:
    """Size of the additive route from its split: prefixes and completions per context."""
    _, _, ctx, k = _additive_layout(network, spec)
    cards = [network.card(f) for f in spec.order]
    worst_ctx = max(math.prod(cards[p] for p in c) for c in ctx[k:])
    return additive_estimate(math.prod(cards[:k]), math.prod(cards[k:]) * worst_ctx, k, len(cards))


def _compile_additive(
    network: Network, spec: ResolvedSpec, deadline: Deadline | None = None
) -> _Built:
    """Equivalence intervals over log-odds sums with per-level feature contexts."""
    deadline = deadline or Deadline(None, "")
    cls, order = spec.class_variable, list(spec.order)
    n = len(order)
    cards = [network.card(f) for f in order]
    terminals, pos_sink = terminals_for(network, cls, str(spec.positive))
    assert spec.threshold is not None  # the additive route decides thresholds only
    const, terms, ctx, k = _additive_layout(network, spec)
    tau = _logit(spec.threshold) - const
    window = _additive_window(network, spec, terms, const)
    tau_lo, tau_hi = tau - window, tau + window
    n_pre = math.prod(cards[:k])

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
        grid = (
            np.indices([cards[p] for p in c]).reshape(len(c), -1)
            if c
            else np.zeros((0, 1), np.int64)
        )
        return {p: grid[i] for i, p in enumerate(c)}

    # completion sums: sums[l] has shape (n_ctx_l, prod cards[l:]), suffix in grid order
    sums: dict[int, np.ndarray] = {n: np.zeros((1, 1))}
    for lvl in range(n - 1, k - 1, -1):
        deadline.check(f"completion sums of level {lvl} of {n}")
        cv = ctx_values(lvl)
        n_c = next(iter(cv.values())).shape[0] if cv else 1
        vals = {p: a[:, None] for p, a in cv.items()}
        vals[lvl] = np.arange(cards[lvl])[None, :]
        w = np.broadcast_to(level_weights(lvl, vals), (n_c, cards[lvl]))
        nxt = np.broadcast_to(ctx_index(lvl + 1, vals), (n_c, cards[lvl]))
        below = sums[lvl + 1]
        sums[lvl] = (w[:, :, None] + below[nxt]).reshape(n_c, -1)
    sorted_all = {lvl: np.sort(s, axis=1) for lvl, s in sums.items()}
    uniq = {lvl: [np.unique(row) for row in s] for lvl, s in sorted_all.items()}
    # lower half: nodes (level, ctx, j); id arrays per level, deepest first
    store = _NodeStore(len(terminals), cards, deadline)
    # level n: ctx 0, j = 0 -> 0 >= theta -> positive; j = 1 -> negative
    ids_below = [np.array([pos_sink, 1 - pos_sink], dtype=np.int64)]
    for lvl in range(n - 1, k - 1, -1):
        cv = ctx_values(lvl)
        ids_here = []
        for c, u in enumerate(uniq[lvl]):
            deadline.check(f"intervals of level {lvl} of {n}")
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
    theta_u = tau_lo - prefix_sum  # inputs within the window: positive unless patched
    level_k = np.empty(n_pre, dtype=np.int64)
    near: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    for c in range(len(uniq[k])):
        sel = np.nonzero(cidx == c)[0]
        j = np.searchsorted(uniq[k][c], theta_u[sel], side="left")
        level_k[sel] = ids_below[c][j]
        full = sorted_all[k][c]
        a = np.searchsorted(full, tau_lo - prefix_sum[sel], side="left")
        b = np.searchsorted(full, tau_hi - prefix_sum[sel], side="right")
        some = b > a
        if some.any():
            near.append((c, sel[some], a[some], b[some]))
    patch = _AdditivePatch(network, spec, cards, k, sums[k], theta_u, store, pos_sink)
    ties, exact_inputs, uncertified = patch.apply(near, level_k)
    root = int(store.bottom_up(level_k.reshape(1, *cards[:k]), 0)[0])
    diagram = store.diagram(root, **_diagram_kw(network, spec))
    quasi = diagram.quasi_nodes_per_level()
    return _Built(
        diagram,
        "decompose/additive",
        sum(quasi),
        quasi,
        ties,
        0,
        exact_inputs=exact_inputs,
        uncertified=uncertified,
    )


@dataclass
class _AdditivePatch:
    """Exact decisions for the additive route's inputs within its error window.

    The route cannot recompute single inputs inside its interval nodes, and decides them
    positive there; instead each prefix with a completion in the window that is exactly
    negative gets its own sub-classifier at level ``k``: float decisions for the
    completions outside the window, exact ones inside (ties and exact positives need
    none). When the prefixes with completions in the window could need more than
    :data:`ADDITIVE_EXACT_LIMIT` cells this is not done and the inputs are reported
    uncertified.
    """

    network: Network
    spec: ResolvedSpec
    cards: list[int]
    k: int
    sums_k: np.ndarray
    theta_u: np.ndarray
    store: _NodeStore
    pos_sink: int

    def apply(
        self, near: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]], level_k: np.ndarray
    ) -> tuple[int, int, int]:
        """Patch ``level_k`` in place; return (exact ties, inputs decided exactly,
        uncertified inputs)."""
        count = sum(int((b - a).sum()) for _, _, a, b in near)
        prefixes = sum(p.size for _, p, _, _ in near)
        if not count:
            return 0, 0, 0
        if count > ExactBudget().left or prefixes * self.sums_k.shape[1] > ADDITIVE_EXACT_LIMIT:
            return 0, 0, count
        # the route applies to strictly positive CPTs only (_additive_applies)
        exact = ExactJoint(
            self.network, self.spec.class_variable, self.spec.order, positive_cpts=True
        )
        assert self.spec.threshold is not None  # the additive route decides thresholds only
        t, pos = exact_threshold(self.spec.threshold), _positive_index(self.network, self.spec)
        prefix = np.concatenate([pre for _, pre, _, _ in near])
        a = np.concatenate([a for _, _, a, _ in near])
        b = np.concatenate([b for _, _, _, b in near])
        which = np.repeat(np.arange(len(near)), [pre.size for _, pre, _, _ in near])
        # a prefix's completions in the window are consecutive in its context's sorted sums
        orders = np.argsort(self.sums_k[[c for c, _, _, _ in near]], axis=1, kind="stable")
        n_suf = self.sums_k.shape[1]
        space = math.prod(exact.key_cards)
        if space * len(near) < 1 << 62:
            # an input's key over exact.columns is its prefix's part plus its completion's:
            # decide each (context, prefix part) against every completion once, and count
            # the window's inputs by range sums (many prefixes share a part)
            pre_key, suf_key = _split_keys(prefix, self.cards, self.k, exact.columns)
            parts, part_of = unique_keys(which * space + pre_key, space * len(near))
            if parts.size * n_suf <= max(count, ADDITIVE_PART_CELLS):
                keys = (parts % space)[:, None] + suf_key[orders[parts // space]]
                got = exact.decide_keys(keys.reshape(-1), t, pos)
                ties = _range_sums(got.tie.reshape(keys.shape), part_of, a, b)
                negative = _range_sums(~got.positive.reshape(keys.shape), part_of, a, b)
                if negative.any():
                    bad = np.flatnonzero(negative)
                    self._patch(
                        level_k,
                        near,
                        prefix[bad],
                        which[bad],
                        orders,
                        a[bad],
                        b[bad],
                        ~got.positive.reshape(keys.shape)[part_of[bad]],
                    )
                return int(ties.sum()), count, 0
        # one key (or row of feature values) per input in the window
        lengths = b - a
        row = np.repeat(np.arange(prefix.size), lengths)
        sorted_at = np.repeat(a - (np.cumsum(lengths) - lengths), lengths) + np.arange(row.size)
        comp = orders[which[row], sorted_at]
        X = _split_columns(prefix[row], comp, self.cards, self.k, exact.columns)
        got = exact.decide_columns(X, t, pos)
        negative_at = np.zeros((prefix.size, n_suf), dtype=bool)
        negative_at[row, sorted_at] = ~got.positive
        bad = np.flatnonzero(negative_at.any(axis=1))
        if bad.size:
            self._patch(
                level_k, near, prefix[bad], which[bad], orders, a[bad], b[bad], negative_at[bad]
            )
        return int(np.count_nonzero(got.tie)), count, 0

    def _patch(
        self,
        level_k: np.ndarray,
        near: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]],
        prefix: np.ndarray,
        which: np.ndarray,
        orders: np.ndarray,
        a: np.ndarray,
        b: np.ndarray,
        negative: np.ndarray,
    ) -> None:
        """Give each of ``prefix`` its own sub-classifier: its float decisions, except the
        completions in its window (sorted positions ``a`` to ``b`` of ``orders[which]``)
        marked in ``negative`` (one row per prefix, over sorted positions): negative."""
        contexts = np.array([c for c, _, _, _ in near])[which]
        tables = self.sums_k[contexts] >= self.theta_u[prefix][:, None]
        position = np.arange(negative.shape[1])
        inside = negative & (position >= a[:, None]) & (position < b[:, None])
        rows, at = np.nonzero(inside)
        tables[rows, orders[which[rows], at]] = False
        sinks = np.where(tables, self.pos_sink, 1 - self.pos_sink).astype(np.int64)
        level_k[prefix] = self.store.bottom_up(sinks.reshape(-1, *self.cards[self.k :]), self.k)


def _range_sums(marks: np.ndarray, row: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per ``i``: how many of ``marks[row[i], a[i]:b[i]]`` are set."""
    if not marks.any():
        return np.zeros(row.size, dtype=np.int64)
    if marks.all():
        return (b - a).astype(np.int64)
    cum = np.zeros((marks.shape[0], marks.shape[1] + 1), dtype=np.int64)
    np.cumsum(marks, axis=1, out=cum[:, 1:])
    return cum[row, b] - cum[row, a]


def _additive_window(network: Network, spec: ResolvedSpec, terms: _Terms, const: float) -> float:
    """Twice a bound on the float error of a log-odds sum against ``logit(T)``.

    Assumes ``np.log`` is faithful (within one ulp, as glibc's is); docs/exactness.md.
    Each weight ``log p - log q`` is off by at most ``2 (2u |log| + 1.01u) + u |w|``; summing
    ``m`` of them and comparing with ``logit(T)`` adds ``gamma(2m + 4)`` of the absolute sum.
    """
    cls = spec.class_variable
    logs = [
        float(np.abs(np.log(t[t > 0])).max())
        for t in (network.cpts[v] for v in [cls, *spec.order])
        if (t > 0).any()
    ]
    big_log = max(logs, default=0.0)
    m = 1 + sum(len(t) for t in terms)
    wmax = [float(np.abs(w).max()) for level in terms for _, w in level]
    total = abs(const) + sum(wmax)
    assert spec.threshold is not None  # the additive route decides thresholds only
    t = spec.threshold
    tau = abs(_logit(t))
    per_term = 4 * U * big_log + 2.02 * U + U * max(wmax, default=0.0)
    e_tau = 4 * U / (1 - t) + 4 * U / t + 2 * U * tau
    return 2.0 * (m * per_term + gamma(2 * m + 4) * (total + tau) + e_tau)


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


# ---------------------------------------------------------------------------- jointree route
KEY_DROP_BITS = 12


def _message_keys(messages: np.ndarray) -> np.ndarray:
    """Rows normalised to sum 1, as byte keys with the low :data:`KEY_DROP_BITS` mantissa
    bits dropped: proportional messages (the same sub-classifier) get the same key even
    when they were summed in different orders; all-zero rows stay zero."""
    sums = messages.sum(axis=1, keepdims=True)
    normal = np.where(sums > 0, messages / np.where(sums > 0, sums, 1.0), 0.0)
    bits = normal.view(np.uint64) & np.uint64(~((1 << KEY_DROP_BITS) - 1) & ((1 << 64) - 1))
    bits = np.ascontiguousarray(bits)
    return bits.view(np.dtype((np.void, 8 * bits.shape[1]))).reshape(-1)


@dataclass
class JointreeStats:
    """What the jointree route did: per step the messages, and the inputs decided early."""

    largest_block: int = 0
    messages: list[int] | None = None
    early_inputs: int = 0
    early_messages: int = 0


def _early(
    messages: np.ndarray,
    n_states: int,
    spec: ResolvedSpec,
    pos: int,
    positive_cpts: bool,
) -> np.ndarray:
    """Sink decided for every completion of each message, or -1 (not decided yet).

    ``messages`` has shape ``(D, n_states * H)`` with the class on the slow axis and no
    remaining CPT mentioning it, so ``P(c | x) = sum_h a_h P(c | u, h)`` with weights
    ``a_h >= 0``: it lies between the smallest and the largest ``P(c | u, h)`` over the
    separator states ``h`` of positive probability. A message is decided when that range
    clears the threshold (argmax: one state beats every other by more than the tie
    tolerance for every ``h``). Zero messages are impossible inputs (sink 0 for argmax,
    negative for a threshold). Other messages are only decided when every relevant CPT is
    positive: otherwise a completion could have probability 0, which is decided (and
    counted) as impossible.
    """
    d = messages.shape[0]
    m = messages.reshape(d, n_states, messages.shape[1] // n_states)
    total = m.sum(axis=1)
    ok = total > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        post = m / np.where(ok, total, 1.0)[:, None, :]
    out = np.full(d, -1, dtype=np.int64)
    zero = ~ok.any(axis=1)
    out[zero] = 0
    if not positive_cpts:
        return out
    if spec.is_argmax:
        for c in range(n_states):
            others = np.delete(post, c, axis=1).max(axis=1) if n_states > 1 else 0.0 * post[:, 0]
            margin = np.where(ok, post[:, c] - others, np.inf).min(axis=1)
            out[(margin > TIE_TOLERANCE) & (out < 0)] = c
        return out
    assert spec.threshold is not None
    p = post[:, pos]
    lo = np.where(ok, p, np.inf).min(axis=1)
    hi = np.where(ok, p, -np.inf).max(axis=1)
    out[(hi < spec.threshold - TIE_TOLERANCE) & ~zero] = 0
    out[(lo > spec.threshold + TIE_TOLERANCE) & ~zero] = 1
    return out


def _compile_jointree(
    network: Network,
    spec: ResolvedSpec,
    plan: JointreePlan,
    *,
    max_memory: float,
    progress: Progress | None = None,
    deadline: Deadline | None = None,
    stats: JointreeStats | None = None,
) -> _Built:
    """Messages along a chain of cuts: one block of features enumerated at a time.

    Each step contracts the distinct messages entering it with the CPTs it absorbs, the
    hidden variables between the two cuts summed out, and the block's features enumerated;
    the resulting messages are merged when proportional (identical sub-classifiers), and a
    message whose decision no completion can change (:func:`_early`) is decided on the
    spot. The diagram is then built bottom-up, block by block, from the message indices.
    ``decided`` early (``0`` negative / ``1`` positive in the threshold case) map to sinks.
    """
    deadline = deadline or Deadline(None, "")
    stats = stats if stats is not None else JointreeStats()
    stats.messages = []
    stats.largest_block = plan.largest_block
    cls, order = spec.class_variable, list(spec.order)
    n = len(order)
    cards = [network.card(f) for f in order]
    zc = network.card(cls)
    argmax = spec.is_argmax
    pos = 0 if argmax else _positive_index(network, spec)
    if argmax:
        terminals, pos_sink = spec_terminals(network, spec), 0

        def sink(decided: np.ndarray) -> np.ndarray:
            return decided
    else:
        terminals, pos_sink = terminals_for(network, cls, str(spec.positive))

        def sink(decided: np.ndarray) -> np.ndarray:
            return np.where(decided == 1, pos_sink, 1 - pos_sink)

    z0 = plan.steps[0].z_in
    messages = np.ones((1, math.prod(network.card(v) for v in z0)))
    weights = np.ones(1, dtype=np.int64)
    live = np.arange(1)
    child: list[np.ndarray] = []  # per step: (live messages, block inputs) -> next message
    lives: list[np.ndarray] = []
    decided: list[np.ndarray] = []
    ties = impossible = 0
    tie_sets = _TieSets(zc)
    held = 0.0
    for s, step in enumerate(plan.steps):
        deadline.check(f"step {s + 1} of {len(plan.steps)}, levels {step.start}..{n}")
        block = order[step.start : step.stop]
        w = math.prod(cards[step.start : step.stop])
        zin_shape = tuple(network.card(v) for v in step.z_in)
        src = messages[live]
        z_out = math.prod(network.card(v) for v in step.z_out)
        empty_key = np.zeros(0, dtype=np.dtype((np.void, 8 * z_out)))
        keys_parts: list[np.ndarray] = [empty_key]  # every message may be decided already
        msgs_parts: list[np.ndarray] = [np.zeros((0, z_out))]
        inverse_parts: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]
        step_bytes = 0.0
        for b in range(0, src.shape[0], step.batch):
            deadline.check(f"step {s + 1} of {len(plan.steps)}: {b:,} of {src.shape[0]:,} messages")
            part = src[b : b + step.batch].reshape(-1, *zin_shape)
            factors = step.step_factors(network, part, block)
            out = opt_einsum.contract(
                step.contraction.expr, *[t for _, t in factors], optimize=step.contraction.path
            )
            out = out.reshape(part.shape[0] * w, -1)
            keys = _message_keys(out)
            _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
            keys_parts.append(keys[first])
            msgs_parts.append(out[first])
            inverse_parts.append(inverse.reshape(-1) + sum(k.size for k in keys_parts[:-1]))
            del out, keys
            step_bytes += 16.0 * msgs_parts[-1].size + 8.0 * inverse_parts[-1].size
            if held + step_bytes > max_memory:
                raise CompileLimitError(
                    f"{network.source}: the messages of levels {step.start}..{step.stop} of {n} "
                    f"({sum(m.shape[0] for m in msgs_parts):,} distinct after {b + part.shape[0]:,}"
                    f" of {src.shape[0]:,} entering) need more than the limit "
                    f"{format_bytes(max_memory)} (estimate {plan.estimate.text()}); give fewer "
                    "features or another order"
                )
        all_keys = np.concatenate(keys_parts)
        _, first, inverse = np.unique(all_keys, return_index=True, return_inverse=True)
        messages = np.concatenate(msgs_parts)[first]
        del all_keys, keys_parts, msgs_parts
        idx = inverse.reshape(-1)[np.concatenate(inverse_parts)].reshape(src.shape[0], w)
        del inverse_parts, src
        held += 8.0 * idx.size + 8.0 * messages.size
        if held > max_memory:
            raise CompileLimitError(
                f"{network.source}: {messages.shape[0]:,} distinct messages after level "
                f"{step.stop} of {n} need more than the limit {format_bytes(max_memory)} "
                f"(estimate {plan.estimate.text()}); give fewer features or another order"
            )
        weights = np.bincount(
            idx.reshape(-1), weights=np.repeat(weights[live], w), minlength=messages.shape[0]
        ).astype(np.int64)
        child.append(idx)
        lives.append(live)
        stats.messages.append(int(messages.shape[0]))
        remaining = math.prod(cards[step.stop :])
        if step.stop == n:
            if argmax:
                _, codes, ties, impossible = _decide_argmax(
                    messages.T, tie_sets, deadline, weights=weights
                )
                dec = codes.astype(np.int64)
            else:
                assert spec.threshold is not None
                post, decision, _, _ = _decide(
                    messages[:, pos], messages.sum(axis=1), spec.threshold
                )
                dec = decision.astype(np.int64)
                ties = int(weights[np.abs(post - spec.threshold) <= TIE_TOLERANCE].sum())
                impossible = int(weights[~(messages.sum(axis=1) > 0)].sum())
            decided.append(dec)
            live = np.zeros(0, dtype=np.int64)
        elif step.early:
            dec = _early(messages, zc, spec, pos, plan.positive_cpts)
            done = dec >= 0
            stats.early_messages += int(done.sum())
            stats.early_inputs += int(weights[done].sum()) * remaining
            impossible += int(weights[~(messages.sum(axis=1) > 0)].sum()) * remaining
            decided.append(dec)
            live = np.nonzero(~done)[0]
        else:
            decided.append(np.full(messages.shape[0], -1, dtype=np.int64))
            live = np.arange(messages.shape[0])
        if progress is not None:
            progress(s + 1, len(plan.steps))
    # bottom-up: node ids of the messages at each cut, deepest cut first
    store = _NodeStore(len(terminals), cards, deadline)
    ids = sink(decided[-1])
    for s in range(len(plan.steps) - 1, -1, -1):
        step = plan.steps[s]
        table = ids[child[s]].reshape(-1, *cards[step.start : step.stop])
        live_ids = store.bottom_up(table, step.start) if table.shape[0] else np.zeros(0, np.int64)
        if s == 0:
            root = int(live_ids[0])
            break
        prev = decided[s - 1]
        ids = np.where(prev >= 0, sink(np.maximum(prev, 0)), -1)
        ids[lives[s]] = live_ids
    diagram = store.diagram(root, **_diagram_kw(network, spec))
    quasi = diagram.quasi_nodes_per_level()
    return _Built(
        diagram,
        "jointree",
        sum(quasi),
        quasi,
        ties,
        impossible,
        tie_sets=tie_sets if argmax else None,
        early_inputs=stats.early_inputs,
    )
