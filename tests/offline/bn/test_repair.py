"""repair-bn's engine: single-parameter repairs checked minimal against a brute scan of the
parameter (every decision by enumerating every assignment, in fractions), proofs that no
single parameter works checked the same way, pairs, and re-verification on the shared
networks."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
import yaml
from locations import ROOT, SHARED_BN

from boxwatch.offline.bn.classifier import ClassifierSpec, resolve_spec
from boxwatch.offline.bn.compile import compile_classifier, spec_terminals
from boxwatch.offline.bn.exact import exact_threshold
from boxwatch.offline.bn.formats import load_network, parse_bif
from boxwatch.offline.bn.network import Network, exact_value
from boxwatch.offline.bn.repair import (
    ALL_RULES,
    covaried_row,
    decimal_text,
    differing_inputs,
    repair,
    short_decimal,
)
from boxwatch.offline.bn.rules import ClassifierSchema, Spec, parse_spec
from boxwatch.offline.bn.verify import BNVerifier

# C -> H (hidden) -> A, and B | C, H: P(C = yes | A, B) over (A, B), rows by A:
# low 0.092 0.391, mid 0.161 0.529, high 0.236 0.634 (B off, on)
SMALL = """network small { }
variable C { type discrete [ 2 ] { no, yes }; }
variable H { type discrete [ 3 ] { h0, h1, h2 }; }
variable A { type discrete [ 3 ] { low, mid, high }; }
variable B { type discrete [ 2 ] { off, on }; }
probability ( C ) { table 0.7, 0.3; }
probability ( H | C ) { (no) 0.6, 0.3, 0.1; (yes) 0.2, 0.3, 0.5; }
probability ( A | H ) { (h0) 0.7, 0.2, 0.1; (h1) 0.3, 0.4, 0.3; (h2) 0.1, 0.3, 0.6; }
probability ( B | C, H ) { (no, h0) 0.8, 0.2; (no, h1) 0.6, 0.4; (no, h2) 0.5, 0.5;
  (yes, h0) 0.4, 0.6; (yes, h1) 0.3, 0.7; (yes, h2) 0.2, 0.8; }
"""
# one violated rule (low/on is 0.391 < 0.5), two that hold
SMALL_RULES = """rules:
  - {name: low_on_yes, if: {A: low, B: "on"}, then: "yes"}
  - {name: high_on_yes, if: {A: high, B: "on"}, then: "yes"}
  - {name: off_no, if: {B: "off"}, then: "no"}
"""
# mid/off and high/off are "no" (0.161, 0.236): no single parameter makes high/off "yes"
# while low/off and low/on stay "no" and mid/on "yes"; a pair does
SMALL_PAIR_RULES = """rules:
  - {name: low_off_no, if: {A: low, B: "off"}, then: "no"}
  - {name: mid_on_yes, if: {A: mid, B: "on"}, then: "yes"}
  - {name: mid_off_yes, if: {A: mid, B: "off"}, then: "yes"}
  - {name: high_off_yes, if: {A: high, B: "off"}, then: "yes"}
  - {name: low_on_no, if: {A: low, B: "on"}, then: "no"}
"""
# naive Bayes: the four rules together ask A's levels to order both ways (an XOR), which
# no parameters at all can give
NB = """network nb { }
variable C { type discrete [ 2 ] { no, yes }; }
variable A { type discrete [ 3 ] { low, mid, high }; }
variable B { type discrete [ 2 ] { off, on }; }
probability ( C ) { table 0.6, 0.4; }
probability ( A | C ) { (no) 0.5, 0.3, 0.2; (yes) 0.2, 0.3, 0.5; }
probability ( B | C ) { (no) 0.7, 0.3; (yes) 0.3, 0.7; }
"""
NB_XOR = """rules:
  - {name: low_on_yes, if: {A: low, B: "on"}, then: "yes"}
  - {name: high_on_no, if: {A: high, B: "on"}, then: "no"}
  - {name: low_off_no, if: {A: low, B: "off"}, then: "no"}
  - {name: high_off_yes, if: {A: high, B: "off"}, then: "yes"}
"""
# three classes; (x1, y0) is "a" (0.562 against b 0.375): x1_not_a is violated
TRI = """network tri { }
variable C { type discrete [ 3 ] { a, b, c }; }
variable H { type discrete [ 2 ] { h0, h1 }; }
variable X { type discrete [ 3 ] { x0, x1, x2 }; }
variable Y { type discrete [ 2 ] { y0, y1 }; }
probability ( C ) { table 0.5, 0.3, 0.2; }
probability ( H | C ) { (a) 0.8, 0.2; (b) 0.4, 0.6; (c) 0.1, 0.9; }
probability ( X | C ) { (a) 0.6, 0.3, 0.1; (b) 0.2, 0.5, 0.3; (c) 0.1, 0.2, 0.7; }
probability ( Y | H ) { (h0) 0.7, 0.3; (h1) 0.2, 0.8; }
"""
TRI_RULES = """rules:
  - {name: x2_y1_c, if: {X: x2, Y: y1}, then: c}
  - {name: x1_not_a, if: {X: x1}, then: {not: a}}
  - {name: x0_a, if: {X: x0}, then: a}
"""


# ---------------------------------------------------------------------------- brute force
def brute_sinks(net: Network, spec, rows=None) -> dict[tuple[int, ...], int]:
    """The sink of every input, from ``P(c, x)`` summed over every assignment of every
    variable in fractions (``rows``: ``(variable, parent row) -> exact row`` replaced)."""
    cpt = {v: net.exact_cpt(v).copy() for v in net.variables}
    for (v, row), values in (rows or {}).items():
        cpt[v][row] = values
    cls = spec.class_variable
    joint: dict[tuple[int, ...], list[Fraction]] = {}
    for assign in itertools.product(*(range(net.card(v)) for v in net.variables)):
        a = dict(zip(net.variables, assign, strict=True))
        p = Fraction(1)
        for v in net.variables:
            p *= cpt[v][(*(a[q] for q in net.parents[v]), a[v])]
        key = tuple(a[f] for f in spec.order)
        joint.setdefault(key, [Fraction(0)] * net.card(cls))[a[cls]] += p
    terminals = spec_terminals(net, spec)
    out = {}
    for key, p in joint.items():
        if spec.is_argmax:
            out[key] = p.index(max(p))
            continue
        t = exact_threshold(spec.threshold)
        pos = net.states[cls].index(spec.positive)
        yes = sum(p) > 0 and p[pos] >= t * sum(p)
        sink = terminals.index(spec.positive)
        out[key] = sink if yes else 1 - sink
    return out


def brute_holds(net: Network, spec, rules, rows=None) -> bool:
    """Every rule holds on every input (brute force)."""
    sinks = brute_sinks(net, spec, rows)
    terminals = spec_terminals(net, spec)
    for rule in rules:
        allowed = {terminals.index(c) for c in rule.conclusion}
        for key, sink in sinks.items():
            inside = all(key[spec.order.index(f)] in values for f, values in rule.premise.items())
            if inside and sink not in allowed:
                return False
    return True


def covaried(net: Network, var: str, row: tuple[int, ...], state: int, t: Fraction):
    """The exact row with entry ``state`` at ``t`` and the others scaled to keep the sum."""
    old = list(net.exact_cpt(var)[row])
    total = sum(old)
    return [t if j == state else q * (total - t) / (total - old[state]) for j, q in enumerate(old)]


def parameter_of(net: Network, change) -> tuple[str, tuple[int, ...], int]:
    """A proposal's changed entry as (variable, parent row, state) indices."""
    v = change.variable
    row = tuple(net.states[p].index(change.row[p]) for p in net.parents[v])
    return v, row, net.states[v].index(change.state)


def grid(top: Fraction, n: int = 200) -> list[Fraction]:
    """``n - 1`` exact rationals spread inside ``(0, top)``."""
    return [top * Fraction(i, n) for i in range(1, n)]


@pytest.fixture
def case(tmp_path):
    """``case(bif, rules, **spec)``: network, resolved spec, rules and its repair report."""

    def make(bif: str, rules: str, proposals: int = 3, **wanted):
        net = parse_bif(bif)
        spec = resolve_spec(net, ClassifierSpec(**wanted))
        diagram = compile_classifier(net, spec).diagram
        schema = ClassifierSchema.from_diagram(diagram, net.variables)
        parsed = parse_spec(yaml.safe_load(rules), schema)
        out = tmp_path / "out"
        report = repair(net, spec, parsed, out_dir=out, proposals=proposals, max_seconds=60)
        return net, spec, parsed, report

    return make


def target(report, name):
    return next(t for t in report.targets if t.name == name)


def required_rules(parsed: Spec, t) -> list:
    return [r for r in parsed.rules if r.name in t.rules]


# ---------------------------------------------------------------------------- minimality
def check_minimal(net, spec, rules, proposal) -> None:
    """The proposal repairs (brute force), and no value of its parameter closer to the
    current one than its minimum does: every point of a grid, and the point 1e-6 short of
    the minimum; the point 1e-6 past it does."""
    (change,) = proposal.changes
    var, row, state = parameter_of(net, change)
    new_row = [exact_value(x) for x in change.row_new]
    assert sum(new_row) == sum(net.exact_cpt(var)[row])
    assert brute_holds(net, spec, rules, {(var, row): new_row})
    m, t0, t1 = proposal.minimum, change.old, change.new
    assert m <= abs(t1 - t0) <= m + max(m / 100, Fraction(1, 10**6))
    assert proposal.change == abs(t1 - t0)
    top = sum(net.exact_cpt(var)[row])
    side = 1 if t1 > t0 else -1
    eps = Fraction(1, 10**6)
    for t in [*grid(top), t0 + side * (m - eps)]:
        if abs(t - t0) < m and 0 < t < top:
            rows = {(var, row): covaried(net, var, row, state, t)}
            assert not brute_holds(net, spec, rules, rows), f"{change.parameter} at {t}"
    rows = {(var, row): covaried(net, var, row, state, t0 + side * (m + eps))}
    assert brute_holds(net, spec, rules, rows)


def test_threshold_single_parameter_repairs_are_minimal(case):
    net, spec, parsed, report = case(
        SMALL, SMALL_RULES, proposals=5, class_variable="C", positive="yes", threshold=0.5
    )
    assert report.verdicts == {"low_on_yes": "violated", "high_on_yes": "holds", "off_no": "holds"}
    (t,) = report.targets
    assert t.verdict == "single parameter" and len(t.proposals) == 5
    assert [p.change for p in t.proposals] == sorted(p.change for p in t.proposals)
    for p in t.proposals:
        assert p.reverified and set(p.verdicts.values()) == {"holds"}
        check_minimal(net, spec, required_rules(parsed, t), p)


def test_argmax_single_parameter_repairs_are_minimal(case):
    net, spec, parsed, report = case(TRI, TRI_RULES, class_variable="C", decision="argmax")
    assert report.verdicts["x1_not_a"] == "violated"
    (t,) = report.targets
    assert t.single and t.proposals
    for p in t.proposals:
        assert p.reverified
        check_minimal(net, spec, required_rules(parsed, t), p)


# ---------------------------------------------------------------------------- proofs, pairs
def test_no_single_parameter_repair_is_proved_and_the_proof_holds(case):
    net, spec, parsed, report = case(NB, NB_XOR, class_variable="C", positive="yes", threshold=0.5)
    everything = target(report, ALL_RULES)
    assert everything.verdict == "none" and not everything.proposals
    assert everything.complete and everything.pairs_tried == everything.pairs_total > 0
    # every parameter of every CPT is in the proof (two-state rows: both entries)
    assert len(everything.proof) == everything.parameters == 12
    assert {i.kind for i in everything.proof} <= {"unmovable", "conflict", "together", "breaks"}
    for var in net.variables:
        for row in np.ndindex(*net.cpts[var].shape[:-1]):
            for state in range(net.card(var)):
                top = sum(net.exact_cpt(var)[row])
                for t in grid(top, 100):
                    rows = {(var, row): covaried(net, var, row, state, t)}
                    assert not brute_holds(net, spec, parsed.rules, rows)
    # the rules one at a time are each repairable
    assert all(t.single for t in report.targets if t.name != ALL_RULES)


def test_a_pair_repairs_what_no_single_parameter_can(case):
    net, spec, parsed, report = case(
        SMALL, SMALL_PAIR_RULES, proposals=1, class_variable="C", positive="yes", threshold=0.5
    )
    t = target(report, "high_off_yes")
    assert not t.single and t.complete and t.proof
    assert t.verdict == "pair" and t.pairs_tried >= 1
    (p,) = t.proposals
    assert p.reverified and p.minimum is None and len(p.changes) == 2
    rows = {}
    for c in p.changes:
        var, row, _ = parameter_of(net, c)
        rows[(var, row)] = [exact_value(x) for x in c.row_new]
    assert brute_holds(net, spec, required_rules(parsed, t), rows)
    assert p.change == max(abs(c.new - c.old) for c in p.changes)


# ---------------------------------------------------------------------------- helpers
def test_proposal_numbers_are_short_decimals_inside_and_rows_keep_their_sum():
    # open at both ends: 0.6 itself is out
    assert short_decimal(Fraction(59936, 100000), Fraction(6, 10), Fraction(59936, 100000)) == (
        Fraction(5994, 10000)
    )
    assert short_decimal(Fraction(1, 3), Fraction(1, 2), Fraction(1, 3)) == Fraction(4, 10)
    assert decimal_text(Fraction(1, 8)) == "0.125" and decimal_text(Fraction(3)) == "3"
    with pytest.raises(ValueError):
        decimal_text(Fraction(1, 3))
    assert covaried_row(["0.3", "0.7"], 0, Fraction(1, 4)) == ("0.25", "0.75")
    row = covaried_row(["0.2", "0.3", "0.5"], 0, Fraction(1, 10))
    assert row is not None and sum(exact_value(x) for x in row) == 1
    # the others keep their ratio (to the rounding of 12 places)
    assert abs(exact_value(row[1]) / exact_value(row[2]) - Fraction(3, 5)) < Fraction(1, 10**10)


def test_differing_inputs_counts_what_the_two_diagrams_decide_differently():
    net = parse_bif(SMALL)
    spec = resolve_spec(net, ClassifierSpec("C", "yes", 0.5))
    other = resolve_spec(net, ClassifierSpec("C", "yes", 0.3))
    a = compile_classifier(net, spec).diagram
    b = compile_classifier(net, other).diagram
    first, second = brute_sinks(net, spec), brute_sinks(net, other)
    brute = sum(first[x] != second[x] for x in first)
    assert differing_inputs(a, b) == brute == 1  # low/on: 0.391
    assert differing_inputs(a, a) == 0


def test_proposals_are_written_in_the_input_format(tmp_path):
    net = load_network(ROOT / "examples" / "credit" / "credit.net")
    spec = resolve_spec(net, ClassifierSpec("CreditWorthiness", "Positive", 0.5))
    diagram = compile_classifier(net, spec).diagram
    rules = parse_spec(
        yaml.safe_load((ROOT / "examples" / "credit" / "rules.yaml").read_text()),
        ClassifierSchema.from_diagram(diagram, net.variables),
    )
    report = repair(
        net, spec, rules, out_dir=tmp_path, source=ROOT / "examples" / "credit" / "credit.net"
    )
    (t,) = report.targets  # Table 3: rule6 is violated on the synthetic network
    assert t.name == "rule6" and t.single
    for p in t.proposals:
        assert p.file.endswith(".net") and p.reverified
        back = load_network(p.file)
        assert back.variables == net.variables
        changed = [v for v in net.variables if (back.exact_cpt(v) != net.exact_cpt(v)).any()]
        assert changed == [c.variable for c in p.changes]


# ---------------------------------------------------------------------------- shared networks
def shared(name: str):
    path = SHARED_BN / name
    if not path.is_file():
        pytest.skip(f"{path} is absent (../shared data not available)")
    return path


def repaired(path, rules_path, tmp_path, **wanted):
    net = load_network(path)
    spec = resolve_spec(net, ClassifierSpec(**wanted))
    diagram = compile_classifier(net, spec).diagram
    rules = parse_spec(
        yaml.safe_load(rules_path.read_text()),
        ClassifierSchema.from_diagram(diagram, net.variables),
    )
    report = repair(net, spec, rules, out_dir=tmp_path, source=path, proposals=1)
    return net, spec, rules, report


@pytest.mark.shared_data
def test_the_papers_credit_network_needs_no_repair(tmp_path):
    _, _, _, report = repaired(
        shared("credit.net"),
        ROOT / "examples" / "credit" / "rules.yaml",
        tmp_path,
        class_variable="CreditWorthiness",
        positive="Positive",
        threshold=0.5,
    )
    assert report.all_hold and report.targets == [] and not list(tmp_path.iterdir())


@pytest.mark.shared_data
def test_child_lung_proposals_reverify_and_the_rest_is_proved(tmp_path):
    net, spec, rules, report = repaired(
        shared("child.bif.gz"),
        ROOT / "examples" / "child" / "lung-rules.yaml",
        tmp_path,
        class_variable="Disease",
        positive="Lung",
        threshold=0.2,
    )
    violated = [n for n, v in report.verdicts.items() if v == "violated"]
    assert len(violated) == 4
    by = {t.name: t for t in report.targets}
    assert set(by) == {*violated, ALL_RULES}
    assert by["lvh_not_lung"].single and by["plethoric_not_lung"].single
    for t in report.targets:
        assert t.complete
        for p in t.proposals:
            assert p.reverified and p.file.endswith(".bif.gz")
            # re-verified independently: the written file, compiled and verified
            back = load_network(p.file)
            d = compile_classifier(back, spec).diagram
            with BNVerifier(d, network=back) as verifier:
                got = verifier.verify(Spec([r for r in rules.rules if r.name in t.rules]))
            assert got.all_hold
        if not t.single:
            assert len(t.proof) == t.parameters


@pytest.mark.shared_data
def test_child_argmax_proposals_reverify(tmp_path):
    _, _, _, report = repaired(
        shared("child.bif.gz"),
        ROOT / "examples" / "child" / "disease-rules.yaml",
        tmp_path,
        class_variable="Disease",
        decision="argmax",
    )
    assert report.targets and all(t.single for t in report.targets)
    assert all(p.reverified for t in report.targets for p in t.proposals)
