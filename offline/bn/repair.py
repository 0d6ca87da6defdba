"""Repair a BN classifier's violated rules: the smallest change of the network's parameters
that makes them hold, written as new network files and re-verified exactly.

**Measure of change.** One CPT entry ``theta = P(V = s | parents = r)`` is moved to ``t`` and
the row's other entries co-vary proportionally (they keep their ratios and the row its sum):
Chan & Darwiche's single-parameter co-variation. A change is measured by the largest absolute
change of one CPT entry, ``|t - theta|`` (the co-varied entries move less), then by the
number of inputs whose decision flips (the tie-breaker); a repair of two entries by the larger
of their changes.

**Targets.** For each violated rule, the smallest change that makes it hold while every rule
that held still holds (the other violated rules may stay violated: the output says); with two
or more violated rules, also the smallest change that makes every rule hold.

**Single parameters first**, exactly (:mod:`.sensitivity`): for every parameter of a CPT that
mentions the class or a hidden variable (a CPT over features alone scales every class state
alike at an input and changes no decision), the exact set of values at which the target's
rules hold, and its point nearest the current value. When no parameter has one, that is the
answer, with each parameter's reason (an input no value repairs, inputs that need values
with nothing in common, or the values that repair the rule break another). The proposal's
value is the shortest decimal strictly inside the set, within 1% of the smallest change (or
1e-6) beyond it: it is never on the set's edge.

**Then pairs** of parameters (different rows) when no single one works, among the parameters
that come closest, until the time budget is spent: a float grid search for the smallest
change, its result checked exactly before it is proposed (its minimality is the grid's, not
proved).

**Every proposal** is written as a network file in the input's format, read back, compiled
and verified with the same exact machinery as ``verify-bn``; the result says whether the
target's rules all hold there (``reverified``), every rule's verdict, and the inputs whose
decision differs from the original network's (counted on the two decision diagrams).
Proposals are never applied: a repaired network is a new input to a new, signed build.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from boxwatch.agent.diagram import DecisionDiagram
from boxwatch.offline.bn.classifier import ResolvedSpec
from boxwatch.offline.bn.compile import compile_classifier
from boxwatch.offline.bn.formats import format_of, load_network, write_network
from boxwatch.offline.bn.formats.writing import cpt_texts
from boxwatch.offline.bn.network import Network, exact_value
from boxwatch.offline.bn.rules import Spec
from boxwatch.offline.bn.sensitivity import (
    MARGIN,
    Interval,
    Lines,
    Parameter,
    RuleKeys,
    Space,
    good_sets,
    intersect,
    nearest,
    parameter_lines,
)
from boxwatch.offline.bn.verify import BNVerifier, VerificationReport

DEFAULT_PROPOSALS = 3
DEFAULT_SECONDS = 60.0
MEASURE = (
    "largest absolute change of one CPT entry, the row's other entries co-varied "
    "proportionally (Chan & Darwiche); ties broken by the inputs whose decision flips"
)
SLACK = Fraction(1, 100)
"""A proposal lies at most this share of the smallest change beyond it (or :data:`MIN_SLACK`)."""
MIN_SLACK = Fraction(1, 10**6)
PAIR_PARAMETERS = 12
"""Parameters (those that come closest alone) whose pairs the pair search tries."""
PAIR_GRID = 24
"""Points per axis of the pair search's grid, per refinement."""
ALL_RULES = "all rules"
Progress = Callable[[str, int, int], None]
"""Told how far a step got: ``progress(step, done, total)``."""
Rows = dict[tuple[str, tuple[int, ...]], tuple[str, ...]]
"""CPT rows to write: ``(variable, parent row)`` -> the row's numbers as written."""


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Change:
    """One CPT entry of a proposal: its label, variable, parent row and state, its old and
    new value (exact), and its row as written before and after."""

    parameter: str
    variable: str
    row: dict[str, str]
    state: str
    old: Fraction
    new: Fraction
    row_old: tuple[str, ...]
    row_new: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (numbers as decimal strings)."""
        return {
            "parameter": self.parameter,
            "variable": self.variable,
            "row": dict(self.row),
            "state": self.state,
            "old": fraction_text(self.old),
            "new": fraction_text(self.new),
            "row_old": list(self.row_old),
            "row_new": list(self.row_new),
        }


@dataclass(frozen=True)
class Proposal:
    """A repaired network: its changes, their size, and what its re-verification found."""

    target: str
    changes: tuple[Change, ...]
    change: Fraction
    minimum: Fraction | None
    flips: int
    file: str
    reverified: bool
    verdicts: dict[str, str]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "target": self.target,
            "changes": [c.to_dict() for c in self.changes],
            "change": fraction_text(self.change),
            "minimum": None if self.minimum is None else fraction_text(self.minimum),
            "flips": self.flips,
            "file": self.file,
            "reverified": self.reverified,
            "verdicts": dict(self.verdicts),
            "seconds": round(self.seconds, 4),
        }


UNMOVABLE, CONFLICT, TOGETHER, BREAKS = "unmovable", "conflict", "together", "breaks"
"""Why a parameter cannot repair a target: a violating input that no value repairs; two
inputs of the rule that need values on either side of each other; the values that repair one
violated rule leave none for another; the values that repair it all break a rule that held."""


@dataclass(frozen=True)
class Infeasible:
    """Why one parameter alone cannot repair a target: exact, from its feasible set."""

    parameter: str
    rule: str
    kind: str
    why: str

    def to_dict(self) -> dict[str, str]:
        """JSON-able form."""
        return {"parameter": self.parameter, "rule": self.rule, "kind": self.kind, "why": self.why}


@dataclass
class TargetResult:
    """The repairs of one target: the rules that must hold, the proposals (best first),
    and when no single parameter works, each parameter's reason."""

    name: str
    rules: tuple[str, ...]
    violated: tuple[str, ...]
    proposals: list[Proposal] = field(default_factory=list)
    single: bool = False
    proof: list[Infeasible] = field(default_factory=list)
    parameters: int = 0
    complete: bool = True
    pairs_tried: int = 0
    pairs_total: int = 0
    seconds_first: float | None = None
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        """``single parameter``, ``pair``, ``none`` (no single parameter, proved; no pair
        found) or ``none found`` (the search stopped before it had seen every parameter)."""
        if self.single:
            return "single parameter"
        if self.proposals:
            return "pair"
        return "none" if self.complete else "none found"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "target": self.name,
            "rules": list(self.rules),
            "violated": list(self.violated),
            "verdict": self.verdict,
            "single_parameter_repair": self.single,
            "single_parameter_search_complete": self.complete,
            "parameters": self.parameters,
            "proposals": [p.to_dict() for p in self.proposals],
            "no_single_parameter_repair": [i.to_dict() for i in self.proof]
            if not self.single and self.complete
            else [],
            "pairs_tried": self.pairs_tried,
            "pairs_total": self.pairs_total,
            "seconds_first": None if self.seconds_first is None else round(self.seconds_first, 4),
            "seconds": round(self.seconds, 4),
        }


@dataclass
class RepairReport:
    """Everything ``repair-bn`` found: the verdicts before, one result per target."""

    network: str
    classifier: dict[str, Any]
    verdicts: dict[str, str]
    targets: list[TargetResult]
    setup_seconds: float = 0.0
    seconds: float = 0.0
    measure: str = MEASURE

    @property
    def all_hold(self) -> bool:
        """No rule was violated (nothing to repair)."""
        return all(v == "holds" for v in self.verdicts.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "network": self.network,
            "classifier": self.classifier,
            "measure": self.measure,
            "verdicts": dict(self.verdicts),
            "targets": [t.to_dict() for t in self.targets],
            "setup_seconds": round(self.setup_seconds, 4),
            "seconds": round(self.seconds, 4),
        }


# ---------------------------------------------------------------------------- numbers
def decimal_text(q: Fraction) -> str:
    """A terminating decimal as its shortest plain string (``Fraction(1, 8)``: ``0.125``)."""
    den = q.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den != 1:
        raise ValueError(f"{q} is not a terminating decimal")
    k = max(twos, fives)
    digits = q.numerator * 10**k // q.denominator
    sign = "-" if digits < 0 else ""
    digits = abs(digits)
    if k == 0:
        return f"{sign}{digits}"
    whole, frac = divmod(digits, 10**k)
    return f"{sign}{whole}.{frac:0{k}d}".rstrip("0").rstrip(".")


def fraction_text(q: Fraction) -> str:
    """A rational as a decimal string when it terminates, else ``p/q`` (exact either way)."""
    try:
        return decimal_text(q)
    except ValueError:
        return f"{q.numerator}/{q.denominator}"


def short_decimal(lo: Fraction, hi: Fraction, toward: Fraction) -> Fraction:
    """The decimal with the fewest digits strictly inside ``(lo, hi)``, nearest ``toward``
    among those."""
    k = 0
    while True:
        m = 10**k
        first = math.floor(lo * m) + 1
        last = math.ceil(hi * m) - 1
        if first <= last:
            j = min(max(round(toward * m), first), last)
            return Fraction(j, m)
        k += 1


def _digits(text: str) -> int:
    """Decimal places of a number's text (0 for one with an exponent or none)."""
    _, dot, frac = text.partition(".")
    return len(frac) if dot and frac.isdigit() else 0


# ---------------------------------------------------------------------------- proposals
def covaried_row(texts: Sequence[str], state: int, new: Fraction) -> tuple[str, ...] | None:
    """The row with entry ``state`` set to ``new`` and the others co-varied proportionally
    (the row keeps its sum), each as a decimal string: exact for two entries; with more, the
    others rounded to ``max(12, the row's decimal places + 4)`` places and the largest
    given what keeps the sum. ``None`` when that leaves an entry below 0."""
    old = [exact_value(t) for t in texts]
    total = sum(old, Fraction(0))
    rest = total - old[state]
    places = max(12, *(_digits(t) + 4 for t in texts), _digits(decimal_text(new)))
    m = 10**places
    out: list[Fraction] = []
    for j, q in enumerate(old):
        if j == state:
            out.append(new)
        else:
            out.append(Fraction(round(q * (total - new) / rest * m), m))
    others = [j for j in range(len(old)) if j != state]
    big = max(others, key=lambda j: (old[j], -j))
    out[big] = total - sum((q for j, q in enumerate(out) if j != big), Fraction(0))
    if any(q < 0 for q in out):
        return None
    try:
        return tuple(decimal_text(q) for q in out)
    except ValueError:
        return None


def as_read(network: Network, row: Sequence[str]) -> tuple[str, ...]:
    """A row's numbers as ``network``'s reader will read them back: as written when it keeps
    the file's decimals, else (UAI) each as its float's shortest decimal."""
    if network.texts is not None:
        return tuple(row)
    return tuple(repr(float(exact_value(x))) for x in row)


def network_with(network: Network, rows: Rows) -> Network:
    """A copy of ``network`` with the given CPT rows (``(variable, parent row)`` -> the row's
    numbers as written) replaced; every other number as it was written."""
    cpts = dict(network.cpts)
    texts = {v: cpt_texts(network, v) for v in {v for v, _ in rows}}
    merged = dict(network.texts or {})
    for (v, row), values in rows.items():
        table = texts[v].copy()
        table[row] = list(values)
        texts[v] = table
        floats = cpts[v].copy()
        floats[row] = [float(exact_value(t)) for t in values]
        cpts[v] = floats
    merged.update(texts)
    return replace(network, cpts=cpts, texts=merged, source=network.source)


def differing_inputs(a: DecisionDiagram, b: DecisionDiagram) -> int:
    """Inputs on which two diagrams over the same features (same order) decide differently."""
    if a.features != b.features or a.states != b.states:
        raise ValueError("the diagrams test different features or states")
    cards = [int(c) for c in a.cardinalities]
    n = len(cards)
    below = [math.prod(cards[i:]) for i in range(n + 1)]
    memo: dict[tuple[int, int, int], int] = {}

    def child(d: DecisionDiagram, node: int, level: int, value: int) -> int:
        if node < d.n_terminals or int(d.node_level[node - d.n_terminals]) != level:
            return node
        return int(d.node_children[node - d.n_terminals, value])

    def count(x: int, y: int, level: int) -> int:
        if x < a.n_terminals and y < b.n_terminals:
            return 0 if a.terminals[x] == b.terminals[y] else below[level]
        key = (x, y, level)
        got = memo.get(key)
        if got is None:
            got = sum(
                count(child(a, x, level, v), child(b, y, level, v), level + 1)
                for v in range(cards[level])
            )
            memo[key] = got
        return got

    return count(a.root, b.root, 0)


# ---------------------------------------------------------------------------- the search
@dataclass(frozen=True)
class _Candidate:
    """A parameter whose feasible set for a target is not empty: the set, its point nearest
    the current value, and the smallest change (in probability)."""

    parameter: Parameter
    sets: tuple[Interval, ...]
    point: Fraction
    interval: Interval
    u0: int
    top: int
    scale: int

    @property
    def minimum(self) -> Fraction:
        return abs(self.point - self.u0) / self.scale


@dataclass(frozen=True)
class _RuleSet:
    """Where one rule holds as one parameter moves; why nowhere (its kind and text); the
    most violating inputs one value repairs."""

    sets: list[Interval]
    kind: str
    why: str
    cover: int


def _best_cover(sets: Sequence[Sequence[Interval]], weights: np.ndarray) -> int:
    """The largest total weight of the open-interval sets one point lies in (a sweep)."""
    events = [
        (end, opens, int(w))
        for s, w in zip(sets, weights, strict=True)
        for lo, hi in s
        for end, opens in ((lo, 1), (hi, 0))
    ]
    events.sort(key=lambda e: (e[0], e[1]))  # open intervals: close before open at a point
    run = best = 0
    for _, opens, w in events:
        run += w if opens else -w
        best = max(best, run)
    return best


@dataclass
class _Target:
    """What one target asks: its rules (violated first) and what the analysis found."""

    name: str
    rules: list[RuleKeys]
    violated: list[RuleKeys]
    candidates: list[_Candidate] = field(default_factory=list)
    proof: list[Infeasible] = field(default_factory=list)
    near: list[tuple[int, Parameter]] = field(default_factory=list)


class Repairer:
    """The repair of one classifier's rules: analysis, proposals, re-verification.

    Parameters
    ----------
    network : Network
    spec : ResolvedSpec
    rules : Spec
        Rules (and monotonicity queries, re-verified on each proposal but not repaired).
    source : path, optional
        The network's file: proposals are written in its format (default BIF).
    out_dir : path
        Where proposals are written (created when missing), then read back to re-verify.
    proposals : int
        Proposals per target.
    max_seconds : float
        Budget of the search: the pair search (and, past it, the single-parameter analysis)
        stops when it is spent; the result says so.
    max_memory : float, optional
        Bytes each compilation may use.
    progress : callable(step, done, total), optional
        Told how far the analysis (over the CPTs) and the pair search got.
    """

    def __init__(
        self,
        network: Network,
        spec: ResolvedSpec,
        rules: Spec,
        *,
        source: str | Path | None = None,
        out_dir: str | Path,
        proposals: int = DEFAULT_PROPOSALS,
        max_seconds: float = DEFAULT_SECONDS,
        max_memory: float | None = None,
        progress: Progress | None = None,
    ):
        self.network = network
        self.spec = spec
        self.spec_rules = rules
        self.source = Path(source) if source is not None else None
        self.out_dir = Path(out_dir)
        self.n_proposals = proposals
        self.max_seconds = max_seconds
        self.max_memory = max_memory
        self.progress = progress or (lambda _step, _done, _total: None)
        self._corners: dict[tuple[Parameter, Parameter], list[np.ndarray]] = {}

    # ------------------------------------------------------------------ entry point
    def run(self, original: VerificationReport | None = None) -> RepairReport:
        """Verify, analyse every parameter, propose, re-verify; see the module docstring."""
        start = time.perf_counter()
        self._start = start
        compiled = compile_classifier(self.network, self.spec, max_memory=self.max_memory)
        self.diagram = compiled.diagram
        if original is None:
            with BNVerifier(self.diagram, network=self.network) as verifier:
                original = verifier.verify(self.spec_rules, counterexamples=0)
        verdicts = {r.rule: r.verdict for r in original.rules}
        # The analysis decides on the network as the compiler reads it (each CPT row divided
        # by its sum, network.READING); proposals are written from the file's own numbers.
        space = Space(self.network.renormalised, self.spec, self.spec_rules.rules)
        self.space = space
        self.joint = space.joint()
        self.sinks = space.decisions(self.joint)
        self.violating = {
            r.rule.name: np.flatnonzero(~space.satisfied(self.joint, r)) for r in space.rules
        }
        self._cross_check()
        held = [r for r in space.rules if verdicts[r.rule.name] == "holds"]
        bad = [r for r in space.rules if verdicts[r.rule.name] != "holds"]
        targets = [_Target(r.rule.name, [r, *held], [r]) for r in bad]
        if len(bad) > 1:
            targets.append(_Target(ALL_RULES, [*bad, *held], bad))
        report = RepairReport(
            str(self.source or self.network.source),
            {
                "class_variable": self.spec.class_variable,
                "decision": self.spec.decision,
                "positive": self.spec.positive,
                "threshold": self.spec.threshold,
                "features": list(self.spec.order),
                "key_features": list(space.columns),
            },
            verdicts,
            [],
        )
        if not targets:
            report.seconds = time.perf_counter() - start
            return report
        count, complete = self._analyse(targets)
        self.setup_seconds = report.setup_seconds = time.perf_counter() - start
        for t in targets:
            report.targets.append(self._propose(t, count, complete))
        report.seconds = time.perf_counter() - start
        return report

    def _left(self) -> float:
        """Seconds of the budget left."""
        return self.max_seconds - (time.perf_counter() - self._start)

    def _cross_check(self) -> None:
        """The exact key decisions must be the compiled diagram's (where they are decided)."""
        space = self.space
        d = self.diagram
        X = np.zeros((space.n_keys, len(self.spec.order)), dtype=np.int64)
        at = {f: i for i, f in enumerate(self.spec.order)}
        for j, f in enumerate(space.columns):
            X[:, at[f]] = space.grid[:, j]
        got = d.predict(X)
        decided = self.sinks >= 0
        wrong = int(np.count_nonzero(got[decided] != self.sinks[decided]))
        if wrong:
            raise RuntimeError(
                f"the repair's exact decisions differ from the compiled diagram on {wrong} "
                "inputs (a reading fault, never expected)"
            )

    # ------------------------------------------------------------------ analysis
    def _analyse(self, targets: list[_Target]) -> tuple[int, bool]:
        """Every parameter's feasible set for every target; returns the parameters examined
        and whether all were (the budget may stop it)."""
        space = self.space
        count = 0
        for i, var in enumerate(space.inner):
            self.progress("analysing parameters", i, len(space.inner))
            if self._left() <= 0:
                return count, False
            family = space.family(var)
            for lines in parameter_lines(space, var, family):
                count += 1
                self._evaluate(lines, targets)
        self.progress("analysing parameters", len(space.inner), len(space.inner))
        return count, True

    def _evaluate(self, lines: Lines, targets: list[_Target]) -> None:
        """One parameter against every target: a candidate, or the reason it is none."""
        space = self.space
        name = lines.parameter.text(space.network)
        cache: dict[str, _RuleSet] = {}

        def rule_set(r: RuleKeys) -> _RuleSet:
            got = cache.get(r.rule.name)
            if got is None:
                got = self._rule_set(lines, r)
                cache[r.rule.name] = got
            return got

        for t in targets:
            running: list[Interval] = [(Fraction(0), Fraction(lines.top))]
            why = kind = ""
            failed: RuleKeys | None = None
            for r in t.violated:
                got = rule_set(r)
                running = intersect(running, got.sets)
                if not running:
                    kind, why = (
                        (got.kind, got.why)
                        if got.why
                        else (
                            TOGETHER,
                            "the values that repair it leave none for the other violated rules",
                        )
                    )
                    failed = r
                    break
            if failed is None:
                for r in t.rules[len(t.violated) :]:
                    running = intersect(running, rule_set(r).sets)
                    if not running:
                        kind = BREAKS
                        why = f"every value that repairs it breaks {r.rule.name}, which holds"
                        failed = r
                        break
            if failed is not None:
                rule = failed.rule.name if kind != BREAKS else t.violated[0].rule.name
                t.proof.append(Infeasible(name, rule, kind, why))
                t.near.append((sum(rule_set(r).cover for r in t.violated), lines.parameter))
                continue
            found = nearest(running, Fraction(lines.u0))
            assert found is not None
            t.candidates.append(
                _Candidate(
                    lines.parameter,
                    tuple(running),
                    found[0],
                    found[1],
                    lines.u0,
                    lines.top,
                    lines.scale,
                )
            )

    def _rule_set(self, lines: Lines, r: RuleKeys) -> _RuleSet:
        """Where rule ``r`` holds as the parameter moves (open intervals of ``u``); when
        nowhere, why. The violating keys go first: how many of their inputs one value can
        repair at once is the parameter's score for the pair search."""
        space = self.space
        viol = self.violating[r.rule.name]
        rest = np.setdiff1d(np.arange(r.keys.size), viol, assume_unique=True)
        running: list[Interval] = [(Fraction(0), Fraction(lines.top))]
        want = " or ".join(space.terminals[i] for i in sorted(r.allowed))
        cover = 0
        for batch in (viol, rest):
            if batch.size == 0:
                continue
            sets = good_sets(space, lines, r, batch)
            if batch is viol:
                cover = _best_cover(sets, r.inputs[viol])
            for pos, s in zip(batch, sets, strict=True):
                if not s:
                    key = space.key_text(int(r.keys[pos]))
                    return _RuleSet([], UNMOVABLE, f"no value gives {key} the class {want}", cover)
            # one interval per key mostly: the largest start and the smallest end at once
            single = [(pos, s[0]) for pos, s in zip(batch, sets, strict=True) if len(s) == 1]
            if single:
                lo_pos, (lo, _) = max(single, key=lambda ps: ps[1][0])
                hi_pos, (_, hi) = min(single, key=lambda ps: ps[1][1])
                got = intersect(running, [(lo, hi)] if lo < hi else [])
                if not got:
                    why = self._conflict(r, want, lines, lo_pos, hi_pos)
                    return _RuleSet([], CONFLICT, why, cover)
                running = got
            for pos, s in zip(batch, sets, strict=True):
                if len(s) > 1:
                    running = intersect(running, s)
                    if not running:
                        key = space.key_text(int(r.keys[pos]))
                        return _RuleSet(
                            [],
                            CONFLICT,
                            f"{key} needs the class {want} at values that other inputs of "
                            "the rule exclude",
                            cover,
                        )
        return _RuleSet(running, "", "", cover)

    def _conflict(self, r: RuleKeys, want: str, lines: Lines, a: int, b: int) -> str:
        """Why two inputs of a rule leave no value (or one input and the range's end)."""
        space = self.space
        scale = Fraction(lines.scale)
        parts = []
        for pos, side in ((a, "above"), (b, "below")):
            sets = good_sets(space, lines, r, np.array([pos]))[0]
            lo, hi = sets[0]
            end = lo if side == "above" else hi
            parts.append(
                f"{space.key_text(int(r.keys[pos]))} needs it {side} {float(end / scale):.6g}"
            )
        return f"the class {want} for all its inputs: " + " but ".join(parts)

    # ------------------------------------------------------------------ proposals
    def _propose(self, t: _Target, count: int, complete: bool) -> TargetResult:
        """The target's proposals (single parameters, else pairs), written and re-verified."""
        start = time.perf_counter()
        res = TargetResult(
            t.name,
            tuple(r.rule.name for r in t.rules),
            tuple(r.rule.name for r in t.violated),
            parameters=count,
            complete=complete,
        )
        ranked = sorted(t.candidates, key=lambda c: (c.minimum, c.parameter.variable))
        made: list[Proposal] = []
        seen: set[tuple[tuple[str, tuple[int, ...]], tuple[str, ...]]] = set()
        for cand in ranked:
            if len(made) >= self.n_proposals:
                break
            built = self._single(cand, t)
            if built is None:
                continue
            rows, change = built
            key = next(iter(rows.items()))
            if key in seen:  # the other entry of a two-state row: the same repair
                continue
            seen.add(key)
            made.append(self._verify(t, rows, [cand.parameter], change, cand.minimum, start))
            if res.seconds_first is None:
                res.seconds_first = self.setup_seconds + time.perf_counter() - start
        made.sort(key=lambda p: (p.change, p.flips))
        res.proposals = made
        res.single = bool(made)
        if not res.single:
            res.proof = list(t.proof)
            pairs = self._pairs(t, res)
            for (rows, params), change in pairs[: self.n_proposals]:
                res.proposals.append(self._verify(t, rows, params, change, None, start))
                if res.seconds_first is None:
                    res.seconds_first = self.setup_seconds + time.perf_counter() - start
        res.seconds = self.setup_seconds + time.perf_counter() - start
        return res

    def _single(self, cand: _Candidate, t: _Target) -> tuple[Rows, Fraction] | None:
        """The proposal rows of a candidate: a short decimal just inside its set, checked
        exactly on the rows as they will be written (further inside when that fails)."""
        p = cand.parameter
        scale = Fraction(cand.scale)
        lo, hi = (cand.interval[0] / scale, cand.interval[1] / scale)
        t0 = Fraction(cand.u0) / scale
        bound = cand.point / scale
        gap = abs(bound - t0)
        slack = min((hi - lo) / 2, max(gap * SLACK, MIN_SLACK))
        texts = cpt_texts(self.network, p.variable)
        flat_row = p.row
        row_texts = [str(x) for x in texts[flat_row].tolist()]
        tries = []
        for factor in (1, 4, 16):
            s = min(slack * factor, (hi - lo) / 2)
            if bound == lo:
                tries.append(short_decimal(lo, lo + s, lo))
            else:
                tries.append(short_decimal(hi - s, hi, hi))
        tries.append(short_decimal(lo + (hi - lo) / 4, hi - (hi - lo) / 4, (lo + hi) / 2))
        for value in dict.fromkeys(tries):
            row = covaried_row(row_texts, p.state, value)
            if row is None:
                continue
            rows = {(p.variable, flat_row): as_read(self.network, row)}
            if self._check(rows, t):
                return rows, self._change(rows)
        return None

    def _change(self, rows: Rows) -> Fraction:
        """The largest absolute change of one CPT entry, as written."""
        return max(
            abs(exact_value(new) - exact_value(str(old)))
            for (v, row), values in rows.items()
            for new, old in zip(values, cpt_texts(self.network, v)[row].tolist(), strict=True)
        )

    def _check(self, rows: Rows, t: _Target) -> bool:
        """Whether the target's rules hold exactly with ``rows`` written."""
        net = network_with(self.network, rows)
        return self.space.holds(self.space.joint(net), t.rules)

    def _verify(
        self,
        t: _Target,
        rows: Rows,
        params: Sequence[Parameter],
        change: Fraction,
        minimum: Fraction | None,
        start: float,
    ) -> Proposal:
        """Write the proposal, read it back, compile and verify it as ``verify-bn`` does."""
        net = network_with(self.network, rows)
        path = self._path(t.name)
        write_network(net, path)
        back = load_network(path, max_memory=self.max_memory)
        compiled = compile_classifier(back, self.spec, max_memory=self.max_memory)
        with BNVerifier(compiled.diagram, network=back) as verifier:
            report = verifier.verify(self.spec_rules, counterexamples=0)
        verdicts = {r.rule: r.verdict for r in report.rules}
        verdicts.update({f"{m.query} ({m.kind})": m.verdict for m in report.monotonicity})
        required = {r.rule.name for r in t.rules}
        ok = all(verdicts[name] == "holds" for name in required)
        changes = []
        for p in params:
            v = p.variable
            par = self.network.parents[v]
            old_row = tuple(str(x) for x in cpt_texts(self.network, v)[p.row].tolist())
            values = rows[(v, p.row)]
            changes.append(
                Change(
                    p.text(self.network),
                    v,
                    {q: self.network.states[q][i] for q, i in zip(par, p.row, strict=True)},
                    self.network.states[v][p.state],
                    exact_value(old_row[p.state]),
                    exact_value(values[p.state]),
                    old_row,
                    tuple(values),
                )
            )
        return Proposal(
            t.name,
            tuple(changes),
            change,
            minimum,
            differing_inputs(self.diagram, compiled.diagram),
            str(path),
            ok,
            verdicts,
            time.perf_counter() - start,
        )

    def _path(self, target: str) -> Path:
        """``<stem>.<target>.<n><suffix>`` in the input's format (BIF for a network without
        a file), numbered past the files already written."""
        source = self.source or Path(f"{self.network.name or 'network'}.bif")
        fmt = format_of(source)
        name = source.name
        suffix = next(s for s in fmt.suffixes if name.lower().endswith(s))
        stem = name[: len(name) - len(suffix)]
        tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", "all" if target == ALL_RULES else target)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        n = 1
        while (self.out_dir / f"{stem}.{tag}.{n}{name[len(name) - len(suffix) :]}").exists():
            n += 1
        return self.out_dir / f"{stem}.{tag}.{n}{name[len(name) - len(suffix) :]}"

    # ------------------------------------------------------------------ pairs
    def _pairs(
        self, t: _Target, res: TargetResult
    ) -> list[tuple[tuple[Rows, list[Parameter]], Fraction]]:
        """Two-parameter repairs, smallest change first: the pairs (different rows) of the
        :data:`PAIR_PARAMETERS` parameters that repair the most violating inputs alone,
        best-scored first, each searched on a float grid and its result checked exactly;
        stops when the budget is spent (``res.pairs_tried`` of ``res.pairs_total``)."""
        chosen: list[Parameter] = []
        rows_seen: set[tuple[str, tuple[int, ...]]] = set()
        for _score, p in sorted(t.near, key=lambda sp: -sp[0]):
            if (p.variable, p.row) not in rows_seen:
                rows_seen.add((p.variable, p.row))
                chosen.append(p)
            if len(chosen) == PAIR_PARAMETERS:
                break
        pairs = [(a, b) for i, a in enumerate(chosen) for b in chosen[i + 1 :]]
        res.pairs_total = len(pairs)
        if not pairs:
            return []
        grid = _PairGrid(self.space, t.rules)
        found = []
        for a, b in pairs:
            self.progress(f"pairs for {t.name}", res.pairs_tried, len(pairs))
            if self._left() <= 0:
                break
            res.pairs_tried += 1
            got = self._pair(a, b, t, grid)
            if got is not None:
                found.append(got)
        found.sort(key=lambda f: f[1])
        return found

    def _pair(
        self, a: Parameter, b: Parameter, t: _Target, grid: _PairGrid
    ) -> tuple[tuple[Rows, list[Parameter]], Fraction] | None:
        """The smallest change of ``a`` and ``b`` together that the grid finds, as rows
        checked exactly (``None``: none found)."""
        texts = [
            [str(x) for x in cpt_texts(self.network, p.variable)[p.row].tolist()] for p in (a, b)
        ]
        now = [exact_value(tx[p.state]) for tx, p in zip(texts, (a, b), strict=True)]
        tops = [sum((exact_value(x) for x in tx), Fraction(0)) for tx in texts]
        corners = self._corners.get((a, b))
        if corners is None:
            corners = []
            for x, y in ((0, 0), (1, 0), (0, 1), (1, 1)):
                rows = {}
                for p, tx, top, at in zip((a, b), texts, tops, (x, y), strict=True):
                    rows[(p.variable, p.row)] = _exact_row(tx, p.state, top * at)
                corners.append(self.space.float_joint(network_with(self.network, rows)))
            self._corners[(a, b)] = corners
        corners = [c[grid.keys] for c in corners]
        point = grid.search(corners, [float(q) for q in now], [float(q) for q in tops])
        if point is None:
            return None
        delta = max(abs(Fraction(v) - q) for v, q in zip(point, now, strict=True))
        for share in (Fraction(1, 100), Fraction(1, 10**4), Fraction(0)):
            rows = {}
            for p, tx, v in zip((a, b), texts, point, strict=True):
                w = Fraction(v)
                value = short_decimal(w - delta * share, w + delta * share, w) if share else w
                row = covaried_row(tx, p.state, _terminating(value))
                if row is None:
                    break
                rows[(p.variable, p.row)] = as_read(self.network, row)
            else:
                if self._check(rows, t):
                    return (rows, [a, b]), self._change(rows)
        return None


def _terminating(q: Fraction) -> Fraction:
    """``q`` if it is a terminating decimal, else its 17-place rounding."""
    try:
        decimal_text(q)
        return q
    except ValueError:
        return Fraction(round(q * 10**17), 10**17)


def _exact_row(texts: Sequence[str], state: int, new: Fraction) -> tuple[str, ...]:
    """The row with ``state`` at ``new`` and the others co-varied exactly, as ``p/q`` texts
    (for exact evaluation in memory only: no file format reads them)."""
    old = [exact_value(x) for x in texts]
    total = sum(old, Fraction(0))
    rest = total - old[state]
    out = [new if j == state else q * (total - new) / rest for j, q in enumerate(old)]
    return tuple(f"{q.numerator}/{q.denominator}" for q in out)


class _PairGrid:
    """The float side of the pair search: the target's keys and what each allows, and the
    grid search for a point where all hold with a margin (so that the exact check that
    follows agrees)."""

    MARGIN = 2 * float(MARGIN)

    def __init__(self, space: Space, rules: Sequence[RuleKeys]):
        self.space = space
        allowed = np.ones((space.n_keys, len(space.terminals)), dtype=bool)
        used = np.zeros(space.n_keys, dtype=bool)
        for r in rules:
            mask = np.zeros(len(space.terminals), dtype=bool)
            mask[list(r.allowed)] = True
            allowed[r.keys] &= mask
            used[r.keys] = True
        self.keys = np.flatnonzero(used)
        self.allowed = allowed[self.keys]

    def _ok(self, p: np.ndarray) -> np.ndarray:
        """Which grid points (axis 0 of ``p``: points, keys, states) satisfy every key."""
        total = p.sum(axis=2)
        space = self.space
        if not space.argmax:
            assert space.threshold is not None and space.pos_sink is not None
            t = float(space.threshold)
            margin = p[:, :, space.positive] - t * total
            pos = margin > self.MARGIN * total
            neg = (margin < -self.MARGIN * total) | (total <= 0)
            ok_pos = pos & self.allowed[None, :, space.pos_sink]
            ok_neg = neg & self.allowed[None, :, 1 - space.pos_sink]
            return (ok_pos | ok_neg).all(axis=1)
        inside = np.where(self.allowed[None], p, -np.inf).max(axis=2)
        outside = np.where(self.allowed[None], -np.inf, p).max(axis=2)
        clear = inside - outside > self.MARGIN * total
        return (clear | ((total <= 0) & self.allowed[None, :, 0])).all(axis=1)

    def search(
        self, corners: Sequence[np.ndarray], now: Sequence[float], tops: Sequence[float]
    ) -> tuple[float, float] | None:
        """The grid point nearest ``now`` (largest coordinate change) where every key holds,
        refined on finer grids around it; ``corners``: the posteriors at ``(0, 0)``,
        ``(top, 0)``, ``(0, top)``, ``(top, top)``."""
        p00, p10, p01, p11 = corners
        best: tuple[float, float] | None = None
        boxes = [(0.0, tops[0], 0.0, tops[1])]
        for _ in range(6):
            x0, x1, y0, y1 = boxes[-1]
            xs = x0 + (x1 - x0) * (np.arange(PAIR_GRID) + 0.5) / PAIR_GRID
            ys = y0 + (y1 - y0) * (np.arange(PAIR_GRID) + 0.5) / PAIR_GRID
            X, Y = (g.reshape(-1) for g in np.meshgrid(xs, ys, indexing="ij"))
            u, v = X / tops[0], Y / tops[1]
            w = [(1 - u) * (1 - v), u * (1 - v), (1 - u) * v, u * v]
            p = sum(
                wi[:, None, None] * c[None] for wi, c in zip(w, (p00, p10, p01, p11), strict=True)
            )
            ok = self._ok(np.asarray(p))
            if not ok.any():
                break
            dist = np.maximum(np.abs(X - now[0]), np.abs(Y - now[1]))
            dist[~ok] = np.inf
            i = int(np.argmin(dist))
            if best is None or dist[i] < max(abs(best[0] - now[0]), abs(best[1] - now[1])):
                best = (float(X[i]), float(Y[i]))
            d = max(abs(best[0] - now[0]), abs(best[1] - now[1]))
            boxes.append(
                (
                    max(0.0, now[0] - d),
                    min(tops[0], now[0] + d),
                    max(0.0, now[1] - d),
                    min(tops[1], now[1] + d),
                )
            )
        return best


def repair(
    network: Network,
    spec: ResolvedSpec,
    rules: Spec,
    *,
    out_dir: str | Path,
    source: str | Path | None = None,
    proposals: int = DEFAULT_PROPOSALS,
    max_seconds: float = DEFAULT_SECONDS,
    max_memory: float | None = None,
    original: VerificationReport | None = None,
    progress: Progress | None = None,
) -> RepairReport:
    """Repair proposals for the violated rules of ``rules`` (see :class:`Repairer`);
    ``original``: the network's verification, if already made."""
    return Repairer(
        network,
        spec,
        rules,
        source=source,
        out_dir=out_dir,
        proposals=proposals,
        max_seconds=max_seconds,
        max_memory=max_memory,
        progress=progress,
    ).run(original)
