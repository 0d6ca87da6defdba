"""Verify a compiled BN classifier: if-then rules (ITR) and monotonicity (FMO, directional).

The SAT solver (on the CNF of :mod:`boxwatch.offline.bn.cnf`) gives each verdict; the decision
diagram gives what a solver cannot give cheaply and cross-checks it: the exact number of
violating inputs (model counting, linear in the diagram), their probability mass under the
BN, and compact counterexamples -- partial assignments (cubes) all of whose completions
inside the premise violate the rule, those fixing the fewest features first.

FMO follows the paper's intended meaning: for some assignment of all other features
(consistent with the given partial assignment and held fixed) raising the feature flips the
class more than once (H-L-H or L-H-L). Features with fewer than three values cannot flip
twice; the result says so. Directional queries ask whether the positive class is never
lost (``increasing``) or never gained (``decreasing``) as the feature rises.

On an argmax (multi-class) classifier the CNF has one sink literal per class state and
monotonicity is read along the class order declared in the rules file: ``increasing`` --
the predicted state's rank never falls as the feature rises; ``decreasing`` -- it never
rises; ``fmo`` -- it never rises then falls nor falls then rises (for a binary class this is
the threshold classifiers' H-L-H / L-H-L). Each query becomes a few *patterns*, one set of
allowed sinks per copy of the diagram, which both engines search for. Monotonicity is
answered by the solver on copies of the CNF and, independently, by a product search that
walks copies of the diagram in lockstep; they must agree, and the search decides alone when
the solver exceeds its time limit (CDCL proofs of monotonicity can be slow on large
additive diagrams).
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pysat.solvers import Solver

from boxwatch.agent.diagram import DecisionDiagram
from boxwatch.agent.vocab import RULE_VERDICTS
from boxwatch.offline.bn.cnf import (
    DEFAULT_SOLVER,
    DiagramEncoding,
    encode_copies,
    encode_diagram,
    strictly_increasing,
)
from boxwatch.offline.bn.limits import Deadline
from boxwatch.offline.bn.network import Network
from boxwatch.offline.bn.rules import MonotonicityQuery, Rule, Spec

HOLDS, VIOLATED = RULE_VERDICTS
JOINT_LIMIT = 10_000_000
MAX_MASS_CUBES = 4096
SAT_SECONDS = 2.0
CHECK_EVERY = 1024
"""Steps of a search (nodes expanded, cubes popped) between two deadline checks."""
_UNKNOWN = object()
# Patterns of "is the class positive?" per copy (feature rising) that violate each query.
_PATTERNS: dict[str, list[tuple[str, tuple[bool, ...]]]] = {
    "fmo": [("H-L-H", (True, False, True)), ("L-H-L", (False, True, False))],
    "increasing": [("decreases", (True, False))],
    "decreasing": [("increases", (False, True))],
}
_HOLD_REASON = {
    "fmo": "the class flips at most once as the feature rises",
    "increasing": "the positive class is never lost as the feature rises",
    "decreasing": "the positive class is never gained as the feature rises",
}
_HOLD_REASON_ARGMAX = {
    "fmo": "the predicted state never rises then falls, nor falls then rises, in the class "
    "order as the feature rises",
    "increasing": "the predicted state never moves down the class order as the feature rises",
    "decreasing": "the predicted state never moves up the class order as the feature rises",
}
# One violation pattern: a label and, per copy of the diagram (feature rising), the sinks
# that copy must reach.
Pattern = tuple[str, tuple[frozenset[int], ...]]


def violation_patterns(diagram: DecisionDiagram, query: MonotonicityQuery) -> list[Pattern]:
    """The sink patterns whose occurrence violates ``query`` on ``diagram``.

    Threshold classifiers: H-L-H / L-H-L (fmo), H-L (increasing), L-H (decreasing) with H the
    positive sink. Argmax classifiers: ranks along ``query.class_order``; ``increasing`` is
    violated by a state followed by one of lower rank, ``decreasing`` by one of higher rank,
    ``fmo`` by a peak (lower, m, lower) or a valley (higher, m, higher) around any state m.
    """
    if not diagram.is_argmax:
        pos = diagram.positive_terminal
        sets = {True: frozenset({pos}), False: frozenset(range(diagram.n_terminals)) - {pos}}
        return [(label, tuple(sets[w] for w in want)) for label, want in _PATTERNS[query.kind]]
    if query.class_order is None or sorted(query.class_order) != list(range(diagram.n_terminals)):
        raise ValueError(
            f"query {query.name!r}: an argmax classifier needs the order of all its class states"
        )
    rank = {t: r for r, t in enumerate(query.class_order)}
    names = diagram.terminals
    out: list[Pattern] = []
    for t in query.class_order:
        lower = frozenset(u for u in rank if rank[u] < rank[t])
        higher = frozenset(u for u in rank if rank[u] > rank[t])
        one = frozenset({t})
        if query.kind == "increasing" and lower:
            out.append((f"decreases from {names[t]}", (one, lower)))
        elif query.kind == "decreasing" and higher:
            out.append((f"increases from {names[t]}", (one, higher)))
        elif query.kind == "fmo":
            if lower:
                out.append((f"rises to {names[t]} then falls", (lower, one, lower)))
            if higher:
                out.append((f"falls to {names[t]} then rises", (higher, one, higher)))
    return out


_INF = np.iinfo(np.int64).max // 4


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Counterexample:
    """A cube: fixing ``fixed`` makes every completion inside the premise violate the rule.

    Attributes
    ----------
    fixed : dict of str to str
        Feature -> state name. Features not listed may take any value the premise allows.
    inputs : int
        Number of full assignments inside the premise that the cube covers.
    probability : float or None
        Their probability mass under the BN (None when no network was given).
    """

    fixed: dict[str, str]
    inputs: int
    probability: float | None = None

    @property
    def n_fixed(self) -> int:
        """How many features the cube fixes."""
        return len(self.fixed)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "fixed": dict(self.fixed),
            "n_fixed": self.n_fixed,
            "inputs": self.inputs,
            "probability": self.probability,
        }

    def __str__(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.fixed.items()) or "(any input)"


@dataclass(frozen=True)
class RuleResult:
    """Outcome of one if-then rule.

    Attributes
    ----------
    rule : str
        The rule's name.
    verdict : str
        ``"holds"`` or ``"violated"`` (the SAT solver's answer, cross-checked on the diagram).
    premise_inputs, violating_inputs : int
        Full assignments inside the premise, and those among them outside the conclusion.
    premise_probability, violating_probability : float or None
        Their probability mass under the BN, when computable.
    counterexamples : list of Counterexample
        Up to K cubes, fewest fixed features first.
    witness : dict of str to str or None
        The full violating assignment the SAT solver found.
    witness_class : str or None
        The class the classifier gives the witness.
    seconds : float
    """

    rule: str
    verdict: str
    conclusion: tuple[str, ...]
    premise_inputs: int
    violating_inputs: int
    premise_probability: float | None = None
    violating_probability: float | None = None
    counterexamples: list[Counterexample] = field(default_factory=list)
    witness: dict[str, str] | None = None
    witness_class: str | None = None
    text: str = ""
    seconds: float = 0.0

    @property
    def holds(self) -> bool:
        return self.verdict == HOLDS

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "rule": self.rule,
            "verdict": self.verdict,
            "text": self.text,
            "conclusion": list(self.conclusion),
            "premise_inputs": self.premise_inputs,
            "violating_inputs": self.violating_inputs,
            "premise_probability": self.premise_probability,
            "violating_probability": self.violating_probability,
            "counterexamples": [c.to_dict() for c in self.counterexamples],
            "witness": self.witness,
            "witness_class": self.witness_class,
            "seconds": self.seconds,
        }


@dataclass(frozen=True)
class MonotonicityWitness:
    """Evidence of a violation: other features fixed, the feature's rising values, classes."""

    fixed: dict[str, str]
    values: tuple[str, ...]
    classes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "fixed": dict(self.fixed),
            "values": list(self.values),
            "classes": list(self.classes),
        }


@dataclass(frozen=True)
class MonotonicityResult:
    """Outcome of one monotonicity query (``kind`` fmo, increasing or decreasing)."""

    query: str
    feature: str
    kind: str
    verdict: str
    reason: str
    witness: MonotonicityWitness | None = None
    seconds: float = 0.0
    engine: str = "sat, cross-checked on the diagram"

    @property
    def holds(self) -> bool:
        return self.verdict == HOLDS

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "query": self.query,
            "feature": self.feature,
            "kind": self.kind,
            "verdict": self.verdict,
            "reason": self.reason,
            "witness": self.witness.to_dict() if self.witness else None,
            "engine": self.engine,
            "seconds": self.seconds,
        }


@dataclass(frozen=True)
class VerificationReport:
    """All results of a spec, with the classifier they were checked on."""

    classifier: dict[str, Any]
    rules: list[RuleResult]
    monotonicity: list[MonotonicityResult]

    @property
    def all_hold(self) -> bool:
        return all(r.holds for r in self.rules) and all(m.holds for m in self.monotonicity)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "classifier": self.classifier,
            "all_hold": self.all_hold,
            "rules": [r.to_dict() for r in self.rules],
            "monotonicity": [m.to_dict() for m in self.monotonicity],
        }


# ---------------------------------------------------------------------------- BN mass
class FeatureMarginal:
    """Exact probability of feature regions under a BN, P(X_i in S_i for all i).

    Built from a :class:`boxwatch.offline.bn.network.Network`: the joint table over the features
    is computed once (one tensor contraction) while it has at most ``joint_limit`` entries;
    beyond it each region is one contraction of the CPTs with indicator vectors (exact
    inference with soft evidence).

    Parameters
    ----------
    network : Network
    features : sequence of str
        Feature variables, in diagram order.
    states : sequence of sequence of str
        State names per feature in diagram order (matched to the network's by name).
    """

    def __init__(
        self,
        network: Any,
        features: Sequence[str],
        states: Sequence[Sequence[str]],
        *,
        joint_limit: int = JOINT_LIMIT,
    ):
        import opt_einsum

        if isinstance(network, Network):
            network = network.renormalised  # the reading the compiler decided on
        self.features = tuple(features)
        var_id = {v: k for k, v in enumerate(network.variables)}
        self._perm = []
        for f, names in zip(self.features, states, strict=True):
            net_states = list(network.states[f])
            if sorted(net_states) != sorted(names):
                raise ValueError(
                    f"feature {f!r}: states {list(names)} differ from the network's {net_states}"
                )
            self._perm.append(np.array([net_states.index(s) for s in names]))
        operands: list[Any] = []
        for v in network.variables:
            operands.append(np.asarray(network.cpts[v], dtype=np.float64))
            operands.append([var_id[p] for p in network.parents[v]] + [var_id[v]])
        self._operands = operands
        self._feature_ids = [var_id[f] for f in self.features]
        self._cards = tuple(len(s) for s in states)
        self.joint: np.ndarray | None = None
        size = math.prod(self._cards)
        if size <= joint_limit:
            table = opt_einsum.contract(*operands, self._feature_ids, optimize="auto")
            for i, perm in enumerate(self._perm):
                table = np.take(table, perm, axis=i)
            self.joint = np.ascontiguousarray(table)
        else:
            masks = [np.ones(c) for c in self._cards]
            shapes = [op.shape if isinstance(op, np.ndarray) else None for op in operands]
            args: list[Any] = []
            for k in range(0, len(operands), 2):
                args.extend([shapes[k], operands[k + 1]])
            for fid, m in zip(self._feature_ids, masks, strict=True):
                args.extend([m.shape, [fid]])
            self._expr = opt_einsum.contract_expression(*args, [])

    def mass(self, allowed: Sequence[np.ndarray]) -> float:
        """P(feature i takes a value in ``allowed[i]`` for all i); ``allowed[i]`` are indices."""
        if self.joint is not None:
            return float(self.joint[np.ix_(*allowed)].sum())
        masks = []
        for c, a, perm in zip(self._cards, allowed, self._perm, strict=True):
            m = np.zeros(c)
            m[perm[np.asarray(a)]] = 1.0
            masks.append(m)
        cpts = self._operands[0::2]
        return float(self._expr(*cpts, *masks))

    def violating_mass(
        self, table: np.ndarray, allowed: Sequence[np.ndarray], violating: np.ndarray
    ) -> float:
        """Mass of the premise region's inputs whose sink is marked in ``violating``.

        ``table`` is the sink id of every full assignment (same shape as ``joint``).
        """
        assert self.joint is not None
        idx = np.ix_(*allowed)
        return float(self.joint[idx][violating[table[idx]]].sum())


def _output_table(
    diagram: DecisionDiagram, chunk: int = 1 << 20, deadline: Deadline | None = None
) -> np.ndarray:
    """Sink id of every full assignment, shape ``cardinalities``, in chunks of rows."""
    cards = tuple(int(c) for c in diagram.cardinalities)
    total = math.prod(cards)
    out = np.empty(total, dtype=np.int32 if diagram.n_terminals > 1 << 15 else np.int16)
    for start in range(0, total, chunk):
        if deadline is not None:
            deadline.check(f"the output table: {start:,} of {total:,} inputs")
        flat = np.arange(start, min(start + chunk, total))
        rows = (
            np.stack(np.unravel_index(flat, cards), axis=1)
            if cards
            else np.zeros((flat.size, 0), dtype=np.int64)
        )
        out[start : start + flat.size] = diagram.predict(rows)
    return out.reshape(cards)


# ---------------------------------------------------------------------------- verifier
class BNVerifier:
    """Checks rules and monotonicity queries on one compiled classifier.

    Parameters
    ----------
    diagram : DecisionDiagram
        The compiled classifier (reduced; edges may skip levels).
    network : Network, optional
        The BN it was compiled from; gives probability masses when present.
    solver : str
        PySAT solver name.
    joint_limit : int
        Largest feature space for which the joint table (and the diagram's full output
        table) are kept to compute masses; beyond it masses come from exact inference per
        cube (at most ``MAX_MASS_CUBES`` cubes, otherwise reported as None).

    sat_seconds : float
        Wall-clock seconds the SAT solver may spend per monotonicity pattern before the
        exact product search on the diagram decides alone.
    deadline : Deadline, optional
        The command's wall-clock limit: checked between queries and inside every search
        (a :class:`~boxwatch.offline.bn.limits.CompileTimeError` when it passes); the SAT
        solver is interrupted when it does.

    The verifier keeps its SAT solvers between queries (a solver is built once per CNF and
    queried under assumptions, which is what makes a query take milliseconds); use it as a
    context manager, or call :meth:`close`, to free them.

    Examples
    --------
    >>> with BNVerifier(diagram, network=network) as verifier:        # doctest: +SKIP
    ...     report = verifier.verify(load_spec("rules.yaml", schema))
    """

    def __init__(
        self,
        diagram: DecisionDiagram,
        *,
        network: Any = None,
        solver: str = DEFAULT_SOLVER,
        joint_limit: int = JOINT_LIMIT,
        sat_seconds: float = SAT_SECONDS,
        deadline: Deadline | None = None,
    ):
        t0 = time.perf_counter()
        self.deadline = deadline
        self._steps = 0
        self.diagram = diagram
        self.solver = solver
        self.encoding: DiagramEncoding = encode_diagram(diagram)
        self.encode_seconds = time.perf_counter() - t0
        self.sat_seconds = sat_seconds
        self._solvers: list[Solver] = []
        self._itr_solver: Solver | None = None
        self._copies: dict[
            tuple[int, int, tuple[int, ...]], tuple[list[DiagramEncoding], Solver]
        ] = {}
        d = diagram
        self._nt = d.n_terminals
        self._n = d.n_features
        self._cards = [int(c) for c in d.cardinalities]
        self._lv = np.concatenate(
            [np.full(self._nt, self._n, dtype=np.int64), d.node_level.astype(np.int64)]
        )
        self._by_level = [np.nonzero(d.node_level == lvl)[0] + self._nt for lvl in range(self._n)]
        width = max(1, d.node_children.shape[1])
        self._children = np.full((self._nt + d.n_nodes, width), -1, dtype=np.int64)
        self._children[self._nt :, : d.node_children.shape[1]] = d.node_children
        self._child_lists = [
            list(map(int, row[: self._cards[lvl]]))
            for row, lvl in zip(self._children[self._nt :], d.node_level, strict=True)
        ]
        self._lv_list = [int(v) for v in self._lv]
        self._kid_rows: list[list[int]] = [[] for _ in range(self._nt)] + self._child_lists
        self._exact_int = d.n_inputs < 2**62
        self.marginal: FeatureMarginal | None = None
        self._table: np.ndarray | None = None
        if network is not None:
            self.marginal = FeatureMarginal(network, d.features, d.states, joint_limit=joint_limit)
            if self.marginal.joint is not None:
                self._table = _output_table(d, deadline=deadline)

    # ------------------------------------------------------------------ public queries
    def verify(
        self,
        spec: Spec,
        *,
        counterexamples: int = 10,
        progress: Callable[[int, int], None] | None = None,
    ) -> VerificationReport:
        """Check every rule and monotonicity query of a parsed spec; ``progress(done,
        total)`` is called after each."""
        d = self.diagram
        info = {
            "class_variable": d.class_variable,
            "decision": d.decision,
            "positive": d.positive,
            "threshold": d.threshold,
            "features": list(d.features),
            "terminals": list(d.terminals),
            "nodes": d.n_nodes,
            "inputs": d.n_inputs,
            "cnf_variables": self.encoding.n_vars,
            "cnf_clauses": len(self.encoding.clauses),
            "solver": self.solver,
        }
        total = len(spec.rules) + len(spec.queries)
        rules: list[RuleResult] = []
        for r in spec.rules:
            self._check(f"{len(rules):,} of {total:,} rules and queries checked")
            rules.append(self.check_rule(r, counterexamples=counterexamples))
            if progress is not None:
                progress(len(rules), total)
        mono: list[MonotonicityResult] = []
        for q in spec.queries:
            self._check(f"{len(rules) + len(mono):,} of {total:,} rules and queries checked")
            mono.append(self.check_monotonicity(q))
            if progress is not None:
                progress(len(rules) + len(mono), total)
        return VerificationReport(info, rules, mono)

    def _check(self, reached: str) -> None:
        """Hold the verification to its deadline (if any)."""
        if self.deadline is not None:
            self.deadline.check(reached)

    def _step(self, reached: str) -> None:
        """One step of a search: the deadline is checked every :data:`CHECK_EVERY`."""
        self._steps += 1
        if self._steps % CHECK_EVERY == 0:
            self._check(reached)

    def _seconds_for_sat(self, limit: float | None) -> float | None:
        """What a SAT call may take: ``limit``, and no more than the deadline leaves."""
        d = self.deadline
        if d is None or d.max_seconds is None:
            return limit
        left = max(0.0, d.max_seconds - d.elapsed()) + 0.01
        return left if limit is None else min(limit, left)

    def check_rule(self, rule: Rule, *, counterexamples: int = 10) -> RuleResult:
        """Check one if-then rule: SAT verdict, exact count, mass and compact cubes.

        Raises
        ------
        RuntimeError
            If the SAT verdict and the diagram disagree (an encoding fault, never expected).
        """
        t0 = time.perf_counter()
        d = self.diagram
        allowed = self._allowed(rule.premise)
        allowed_classes = set(rule.conclusion)
        violating = np.array([t not in allowed_classes for t in d.terminals])
        enc = self.encoding
        assumptions = enc.restrict({i: a for i, a in enumerate(allowed) if a.size < self._cards[i]})
        assumptions += [-enc.sink_literal(t) for t in range(self._nt) if not violating[t]]
        if self._itr_solver is None:
            self._itr_solver = self._new_solver(enc.clauses)
        sat = self._solve(self._itr_solver, assumptions, None)
        model = self._itr_solver.get_model() if sat else None
        if sat is None:
            self._check(f"rule {rule.name!r}: the SAT solver was interrupted")
            raise RuntimeError(f"rule {rule.name!r}: the SAT solver returned no answer")
        count, allv, dist = self._count(allowed, violating)
        premise_inputs = math.prod(int(a.size) for a in allowed)
        violators = int(count[d.root]) * self._free_above(allowed, d.root)
        witness = witness_class = None
        if model is not None:
            x = enc.decode(model)
            sink = int(d.predict(x[None, :])[0])
            inside = all(x[i] in allowed[i] for i in range(self._n))
            if not inside or not violating[sink]:
                raise RuntimeError(f"rule {rule.name!r}: the SAT witness is not a violation")
            witness = self._names(dict(enumerate(x)))
            witness_class = d.terminals[sink]
        if bool(sat) != (violators > 0):
            raise RuntimeError(
                f"rule {rule.name!r}: SAT says {'violated' if sat else 'holds'}"
                f" but the diagram counts {violators} violating inputs"
            )
        cubes: list[Counterexample] = []
        p_premise = p_viol = None
        if self.marginal is not None:
            p_premise = self.marginal.mass(allowed)
            if violators == 0:
                p_viol = 0.0
            elif self._table is not None:
                p_viol = self.marginal.violating_mass(self._table, allowed, violating)
            else:
                p_viol = self._mass_by_cubes(allowed, allv, count)
        if violators and counterexamples > 0:
            cubes = self._counterexamples(allowed, violating, count, allv, dist, counterexamples)
        return RuleResult(
            rule.name,
            VIOLATED if sat else HOLDS,
            tuple(rule.conclusion),
            premise_inputs,
            violators,
            p_premise,
            p_viol,
            cubes,
            witness,
            witness_class,
            rule.text,
            time.perf_counter() - t0,
        )

    def check_monotonicity(self, query: MonotonicityQuery) -> MonotonicityResult:
        """Check one FMO or directional query; the witness is checked on the diagram.

        Two exact engines answer: the SAT solver on two or three copies of the CNF (features
        other than the queried one shared), within a time limit, and a product search
        over the diagram (copies walked in lockstep). When the solver answers within
        ``sat_seconds``, the two must agree (else ``RuntimeError``); when it runs out of time
        -- monotonicity proofs are hard for CDCL on large additive diagrams -- the product
        search's exact answer stands and ``engine`` says so.
        """
        t0 = time.perf_counter()
        d = self.diagram
        i = d.features.index(query.feature)
        order = tuple(query.order)
        card = len(order)
        if query.kind == "fmo" and card < 3:
            return MonotonicityResult(
                query.name,
                query.feature,
                query.kind,
                HOLDS,
                f"cannot flip twice: {query.feature} has only {card} values",
                None,
                time.perf_counter() - t0,
                "none needed",
            )
        patterns = violation_patterns(d, query)
        hold_reason = (_HOLD_REASON_ARGMAX if d.is_argmax else _HOLD_REASON)[query.kind]
        allowed = self._allowed(query.given)
        by_diagram = self._product_search(i, order, allowed, patterns)
        by_sat = self._sat_monotone(i, order, allowed, patterns)
        if by_sat is _UNKNOWN:
            engine = f"diagram (SAT gave up after {self.sat_seconds:g} s)"
            found = by_diagram
        else:
            engine = "sat, cross-checked on the diagram"
            if (by_sat is None) != (by_diagram is None):
                raise RuntimeError(f"query {query.name!r}: SAT and the diagram disagree")
            found = by_sat
        elapsed = time.perf_counter() - t0
        if found is None:
            return MonotonicityResult(
                query.name,
                query.feature,
                query.kind,
                HOLDS,
                hold_reason,
                None,
                elapsed,
                engine,
            )
        xs = np.stack(found)
        sinks = d.predict(xs)
        others = np.arange(self._n) != i
        ranks = [order.index(int(x[i])) for x in xs]
        labels = [
            label
            for label, want in patterns
            if all(int(t) in w for t, w in zip(sinks, want, strict=True))
        ]
        inside = all(x[j] in allowed[j] for x in xs for j in range(self._n))
        if (
            not labels
            or not inside
            or ranks != sorted(set(ranks))
            or (xs[:, others] != xs[0, others]).any()
        ):
            raise RuntimeError(f"query {query.name!r}: the witness does not check out")
        fixed = self._names({j: v for j, v in enumerate(xs[0]) if j != i})
        values = tuple(d.states[i][int(x[i])] for x in xs)
        classes = tuple(d.terminals[int(t)] for t in sinks)
        return MonotonicityResult(
            query.name,
            query.feature,
            query.kind,
            VIOLATED,
            f"{labels[0]}: {query.feature} {' < '.join(values)} gives {' / '.join(classes)}",
            MonotonicityWitness(fixed, values, classes),
            elapsed,
            engine,
        )

    def _sat_monotone(
        self,
        i: int,
        order: tuple[int, ...],
        allowed: Sequence[np.ndarray],
        patterns: Sequence[Pattern],
    ) -> Any:
        """Feature values of the copies in a SAT witness, None (UNSAT) or ``_UNKNOWN``.

        A copy confined to a set of sinks gets the negations of the other sinks' literals as
        assumptions (exactly one sink of each copy is reached).
        """
        n_copies = len(patterns[0][1])
        copies, solver = self._copies_for(i, order, n_copies)
        base = copies[0].restrict(
            {j: a for j, a in enumerate(allowed) if j != i and a.size < self._cards[j]}
        )
        unknown = False
        for _, want in patterns:
            lits = [
                -c.sink_literal(t)
                for c, w in zip(copies, want, strict=True)
                for t in range(self._nt)
                if t not in w
            ]
            ok = self._solve(solver, base + lits, self.sat_seconds)
            if ok is None:
                self._check("a monotonicity pattern: the SAT solver was interrupted")
                unknown = True
            elif ok:
                model = solver.get_model()
                return [c.decode(model) for c in copies]
        return _UNKNOWN if unknown else None

    def _solve(self, solver: Solver, assumptions: list[int], seconds: float | None) -> Any:
        """``solver`` on ``assumptions``, interrupted after ``seconds`` (or when the
        deadline passes): True, False, or None when interrupted."""
        limit = self._seconds_for_sat(seconds)
        if limit is None:
            return solver.solve(assumptions=assumptions)
        timer = threading.Timer(limit, solver.interrupt)
        timer.start()
        try:
            return solver.solve_limited(assumptions=assumptions, expect_interrupt=True)
        finally:
            timer.cancel()
            solver.clear_interrupt()

    def _product_search(
        self,
        i: int,
        order: tuple[int, ...],
        allowed: Sequence[np.ndarray],
        patterns: Sequence[Pattern],
    ) -> list | None:
        """Exact search for a witness by walking copies of the diagram in lockstep.

        Above level ``i`` the copies share one node; at a node testing ``i`` they split on
        values of increasing rank; below, each level's value is shared and a copy whose
        node skips that level stays put. States that cannot reach a wanted pattern of sinks
        are remembered, so each (tuple of nodes) is expanded at most once.
        """
        d, nt = self.diagram, self._nt
        lv, kids = self._lv_list, self._kid_rows
        sets = [list(map(int, a)) for a in allowed]
        wants = [want for _, want in patterns]
        n_copies = len(wants[0])
        rank_tuples = list(itertools.combinations(range(len(order)), n_copies))
        dead: set[tuple[int, ...]] = set()

        def below(state: tuple[int, ...]) -> list[tuple[int, int]] | None:
            self._step("the product search of a monotonicity query")
            live = [w for w in wants if all(s >= nt or s in w[k] for k, s in enumerate(state))]
            if not live:
                return None
            if all(s < nt for s in state):
                return []
            if state in dead:
                return None
            lvl = min(lv[s] for s in state)
            for j in sets[lvl]:
                nxt = tuple(kids[s][j] if lv[s] == lvl else s for s in state)
                path = below(nxt)
                if path is not None:
                    return [(lvl, j), *path]
            dead.add(state)
            return None

        def above(node: int) -> tuple[list[tuple[int, int]], tuple[int, ...]] | None:
            self._step("the product search of a monotonicity query")
            if node < nt or lv[node] > i or (node,) in dead:
                return None  # the copies never split: they reach the same sink
            lvl = lv[node]
            if lvl == i:
                for ranks in rank_tuples:
                    path = below(tuple(kids[node][order[r]] for r in ranks))
                    if path is not None:
                        return path, ranks
            else:
                for j in sets[lvl]:
                    hit = above(kids[node][j])
                    if hit is not None:
                        return [(lvl, j), *hit[0]], hit[1]
            dead.add((node,))
            return None

        hit = above(d.root)
        if hit is None:
            return None
        path, ranks = hit
        base = np.array([s[0] for s in sets], dtype=np.int64)
        for lvl, j in path:
            base[lvl] = j
        out = []
        for r in ranks:
            x = base.copy()
            x[i] = order[r]
            out.append(x)
        return out

    # ------------------------------------------------------------------ diagram algorithms
    def _allowed(self, constraint: Mapping[str, Sequence[int]]) -> list[np.ndarray]:
        """Allowed value indices per level (all values for unconstrained features)."""
        out = [np.arange(c) for c in self._cards]
        for name, values in constraint.items():
            out[self.diagram.features.index(name)] = np.array(sorted(values), dtype=np.int64)
        return out

    def _free_above(self, allowed: Sequence[np.ndarray], node: int) -> int:
        """Inputs of the levels above ``node``'s level, which the root path skips."""
        return math.prod(int(a.size) for a in allowed[: int(self._lv[node])])

    def _count(
        self, allowed: Sequence[np.ndarray], violating: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Bottom-up pass over the diagram restricted to the premise.

        Returns, per node id: the number of violating completions of the levels from the
        node's level down (exact), whether every completion violates, and the fewest
        features a cube must fix below the node to make every completion violate.
        """
        n, nt = self._n, self._nt
        sizes = [int(a.size) for a in allowed]
        dtype = np.int64 if self._exact_int else object
        count = self.diagram.completions(violating, allowed, dtype=dtype)
        total = self._children.shape[0]
        allv = np.zeros(total, dtype=bool)
        allv[:nt] = violating
        dist = np.full(total, _INF, dtype=np.int64)
        dist[:nt] = np.where(violating, 0, _INF)
        for lvl in range(n - 1, -1, -1):
            ks = self._by_level[lvl]
            if not ks.size:
                continue
            ch = self._children[ks][:, allowed[lvl]]
            allv[ks] = allv[ch].all(axis=1)
            step = 0 if sizes[lvl] == 1 else 1
            reach = np.where(count[ch] > 0, dist[ch] + step, _INF)
            dist[ks] = np.where(allv[ks], 0, reach.min(axis=1))
        return count, allv, dist

    def _counterexamples(
        self,
        allowed: Sequence[np.ndarray],
        violating: np.ndarray,
        count: np.ndarray,
        allv: np.ndarray,
        dist: np.ndarray,
        k: int,
    ) -> list[Counterexample]:
        """Up to ``k`` compact cubes, fewest fixed features first.

        Prefixes of diagram paths are enumerated best-first (A* with the exact remaining
        cost ``dist``) until a node where every completion violates; each prefix is then
        generalised greedily by dropping fixed features while every completion inside the
        premise still violates.
        """
        d = self.diagram
        sets = [set(map(int, a)) for a in allowed]
        heap: list[tuple[int, int, int, tuple[tuple[int, int], ...]]] = []
        tie = 0
        if count[d.root] > 0:
            heap.append((int(dist[d.root]), tie, d.root, ()))
        found: list[dict[int, int]] = []
        seen: set[tuple[tuple[int, int], ...]] = set()
        while heap and len(found) < k:
            self._step("the search for compact counterexamples")
            _, _, node, fixed = heapq.heappop(heap)
            if allv[node]:
                cube = self._generalise(dict(fixed), sets, allv, count)
                key = tuple(sorted(cube.items()))
                if key not in seen:
                    seen.add(key)
                    found.append(cube)
                continue
            lvl = int(self._lv[node])
            row = self._child_lists[node - self._nt]
            step = 0 if len(sets[lvl]) == 1 else 1
            for j in allowed[lvl]:
                child = row[int(j)]
                if count[child] > 0:
                    tie += 1
                    g = len(fixed) + step
                    new = fixed + ((lvl, int(j)),) if step else fixed
                    heapq.heappush(heap, (g + int(dist[child]), tie, child, new))
        found.sort(key=len)
        out = []
        for cube in found[:k]:
            region = [np.array([cube[i]]) if i in cube else allowed[i] for i in range(self._n)]
            inputs = math.prod(int(a.size) for a in region)
            prob = self.marginal.mass(region) if self.marginal is not None else None
            out.append(Counterexample(self._names(cube), inputs, prob))
        return out

    def _generalise(
        self, cube: dict[int, int], sets: Sequence[set[int]], allv: np.ndarray, count: np.ndarray
    ) -> dict[int, int]:
        """Drop fixed features (top level first) while every completion still violates."""
        for lvl in sorted(cube):
            trial = {i: v for i, v in cube.items() if i != lvl}
            if self._all_violate(trial, sets, allv, count):
                cube = trial
        return cube

    def _all_violate(
        self, cube: Mapping[int, int], sets: Sequence[set[int]], allv: np.ndarray, count: np.ndarray
    ) -> bool:
        """Does every input inside the premise and the cube violate? (Depth-first, pruned.)

        A node that violates on every premise completion violates on the cube's too; a node
        with no violating premise completion has a non-violating one inside the cube.
        """
        memo: dict[int, bool] = {}
        nt = self._nt

        def visit(node: int) -> bool:
            self._step("generalising a counterexample")
            if allv[node]:
                return True
            if count[node] == 0 or node < nt:
                return False
            if node in memo:
                return memo[node]
            lvl = int(self._lv[node])
            row = self._child_lists[node - nt]
            values = (cube[lvl],) if lvl in cube else sets[lvl]
            result = all(visit(row[j]) for j in values)
            memo[node] = result
            return result

        return visit(self.diagram.root)

    def _mass_by_cubes(
        self, allowed: Sequence[np.ndarray], allv: np.ndarray, count: np.ndarray
    ) -> float | None:
        """Violating mass as a sum over disjoint cubes (paths grouped by child), if few."""
        assert self.marginal is not None
        cubes: list[list[np.ndarray]] = []
        stack = [(self.diagram.root, list(allowed))]
        while stack:
            self._step("the violating mass by cubes")
            node, region = stack.pop()
            if allv[node]:
                cubes.append(region)
                if len(cubes) > MAX_MASS_CUBES:
                    return None
                continue
            lvl = int(self._lv[node])
            row = self._child_lists[node - self._nt]
            groups: dict[int, list[int]] = {}
            for j in allowed[lvl]:
                if count[row[int(j)]] > 0:
                    groups.setdefault(row[int(j)], []).append(int(j))
            for child, values in groups.items():
                sub = list(region)
                sub[lvl] = np.array(values)
                stack.append((child, sub))
        return float(sum(self.marginal.mass(c) for c in cubes))

    def _copies_for(
        self, i: int, order: tuple[int, ...], n_copies: int
    ) -> tuple[list[DiagramEncoding], Solver]:
        """Copies of the CNF sharing all features but ``i``, ordered, with their solver."""
        key = (i, n_copies, order)
        if key not in self._copies:
            copies, clauses = encode_copies(self.diagram, n_copies, i)
            for a, b in zip(copies, copies[1:], strict=False):
                clauses = clauses + strictly_increasing(a, b, i, order)
            self._copies[key] = (copies, self._new_solver(clauses))
        return self._copies[key]

    def _new_solver(self, clauses: list[list[int]]) -> Solver:
        solver = Solver(name=self.solver, bootstrap_with=clauses)
        self._solvers.append(solver)
        return solver

    def close(self) -> None:
        """Free the SAT solvers (idempotent); the verifier rebuilds them if used again."""
        for solver in getattr(self, "_solvers", ()):
            solver.delete()
        if hasattr(self, "_solvers"):
            self._solvers.clear()
            self._copies.clear()
            self._itr_solver = None

    def __enter__(self) -> BNVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def _names(self, values: Mapping[int, Any]) -> dict[str, str]:
        d = self.diagram
        return {d.features[i]: d.states[i][int(v)] for i, v in sorted(values.items())}
