"""Multi-class (argmax) BN classifiers: compile, CNF, rules, monotonicity, diagram members.

Every figure is checked against a computation that shares no code with the compiler or the
verifier: full enumeration of small networks in exact rational arithmetic (so ties between
states are exact, not within a tolerance), truth tables of the compiled diagram, and pgmpy's
variable elimination on the shared networks.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
from bn_synthetic import random_dag
from bn_tables import DATA, all_assignments, brute_rule, diagram_from_table, table_of
from deadlines import Countdown
from pysat.solvers import Solver

from boxwatch.agent.diagram import DecisionDiagram
from boxwatch.agent.errors import ArtifactError, ConfigError
from boxwatch.offline.bn import compile as bn_compile
from boxwatch.offline.bn import plan as bn_plan
from boxwatch.offline.bn.classifier import ClassifierSpec, resolve_spec
from boxwatch.offline.bn.cnf import encode_diagram
from boxwatch.offline.bn.compile import MAX_TIE_PAIRS, compile_classifier
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.limits import CompileTimeError
from boxwatch.offline.bn.network import Network
from boxwatch.offline.bn.rules import ClassifierSchema, MonotonicityQuery, Rule, parse_spec
from boxwatch.offline.bn.verify import BNVerifier


# ---------------------------------------------------------------------------- independent code
def exact_joint(net: Network, cls: str, order: list[str]) -> dict[tuple[int, ...], list]:
    """P(c, x) for every feature assignment x, by listing every configuration, as Fractions.

    CPT entries are read as the decimal they print as (``Fraction(repr(p))``), so networks
    written with exactly tied entries give exactly tied posteriors.
    """
    names = list(net.variables)
    out: dict[tuple[int, ...], list] = {}
    for full in itertools.product(*(range(net.card(v)) for v in names)):
        at = dict(zip(names, full, strict=True))
        p = Fraction(1)
        for v in names:
            p *= Fraction(repr(float(net.cpts[v][tuple(at[u] for u in (*net.parents[v], v))])))
        x = tuple(at[f] for f in order)
        row = out.setdefault(x, [Fraction(0)] * net.card(cls))
        row[at[cls]] += p
    return out


def exact_argmax(joint: dict[tuple[int, ...], list]):
    """Decision (lowest index among the exact maxima), tied inputs, pair ties, impossible."""
    decided: dict[tuple[int, ...], int] = {}
    pairs: dict[tuple[int, int], int] = {}
    ties = impossible = 0
    for x, row in joint.items():
        if sum(row) == 0:
            impossible += 1
            decided[x] = 0
            continue
        best = max(row)
        top = [c for c, p in enumerate(row) if p == best]
        decided[x] = top[0]
        if len(top) > 1:
            ties += 1
            for a, b in itertools.combinations(top, 2):
                pairs[(a, b)] = pairs.get((a, b), 0) + 1
    return decided, ties, pairs, impossible


def rank_sequences(table, feature, order, allowed):
    """For every fixed assignment of the other features: the class ranks as ``feature`` rises."""
    region = [list(a) for a in allowed]
    region[feature] = list(order)
    sub = np.moveaxis(table[np.ix_(*[np.asarray(a) for a in region])], feature, -1)
    return sub.reshape(-1, len(order))


def brute_argmax_monotone(table, feature, order, allowed, class_order, kind) -> bool:
    """Does the query hold? ``class_order`` lists sink ids lowest first."""
    rank = {t: r for r, t in enumerate(class_order)}
    for seq in rank_sequences(table, feature, order, allowed):
        r = [rank[int(t)] for t in seq]
        for a, b in itertools.combinations(range(len(r)), 2):
            if kind == "increasing" and r[b] < r[a]:
                return False
            if kind == "decreasing" and r[b] > r[a]:
                return False
        if kind == "fmo":
            for a, b, c in itertools.combinations(range(len(r)), 3):
                if (r[a] < r[b] > r[c]) or (r[a] > r[b] < r[c]):
                    return False
    return True


def argmax_diagram(table: np.ndarray, n_terminals: int) -> DecisionDiagram:
    """An argmax diagram of a truth table (sinks ``k0, k1, ...``)."""
    d = diagram_from_table(table, terminals=[f"k{t}" for t in range(n_terminals)], positive="k0")
    return replace(d, positive=None, threshold=None, decision="argmax")


# ---------------------------------------------------------------------------- constructed networks
def three_class_network(*, impossible: bool = False) -> Network:
    """Class C (low, mid, high) with features X (4 states) and Y (3 states), children of C.

    X = x0 and Y = y2 have the same probability under every class, so (x0, y2) is a three-way
    tie; mid and high share Y's row for y1, so with X = x0 they tie on y1 as well; the others
    are decided by exact but distinct products. With ``impossible``, Y = y0 has probability 0
    under every class but high, and X = x3 probability 0 under high: (x3, y0) is impossible.
    """
    y = [[0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.25, 0.5, 0.25]]
    x = [[0.2, 0.3, 0.4, 0.1], [0.2, 0.5, 0.2, 0.1], [0.2, 0.1, 0.2, 0.5]]
    if impossible:
        y = [[0.0, 0.75, 0.25], [0.0, 0.75, 0.25], [0.5, 0.25, 0.25]]
        x = [[0.2, 0.3, 0.4, 0.1], [0.2, 0.5, 0.2, 0.1], [0.2, 0.1, 0.7, 0.0]]
    return Network(
        name="three",
        variables=("C", "X", "Y"),
        states={
            "C": ("low", "mid", "high"),
            "X": ("x0", "x1", "x2", "x3"),
            "Y": ("y0", "y1", "y2"),
        },
        parents={"C": (), "X": ("C",), "Y": ("C",)},
        cpts={
            "C": np.array([0.25, 0.25, 0.5]),
            "X": np.array(x),
            "Y": np.array(y),
        },
    )


ARGMAX = {"decision": "argmax"}


@pytest.mark.parametrize("impossible", [False, True])
def test_exact_ties_between_states_go_to_the_lowest_index_and_are_counted_per_pair(impossible):
    net = three_class_network(impossible=impossible)
    spec = ClassifierSpec("C", features=["X", "Y"], order=["X", "Y"], **ARGMAX)
    decided, ties, pairs, n_impossible = exact_argmax(exact_joint(net, "C", ["X", "Y"]))
    assert ties >= 2 and any(len({a, b}) == 2 for a, b in pairs)  # the test can fail
    for method in ("joint", "decompose"):
        result = compile_classifier(net, spec, method=method)
        d = result.diagram
        assert d.terminals == ("low", "mid", "high") and d.is_argmax
        assert d.positive is None and d.threshold is None
        X = all_assignments(d.cardinalities)
        assert [decided[tuple(x)] for x in X] == d.predict(X).tolist(), method
        assert result.ties == ties
        names = d.terminals
        assert result.tie_pairs == {(names[a], names[b]): n for (a, b), n in pairs.items()}
        assert result.impossible == n_impossible == (1 if impossible else 0)
        assert result.positives is None
        counts = {names[t]: sum(v == t for v in decided.values()) for t in range(3)}
        assert result.decided == counts
        summary = result.summary()
        assert summary["decision"] == "argmax" and summary["decided"] == counts
        assert {tuple(p["states"]) for p in summary["tie_pairs"]} == set(result.tie_pairs)


@pytest.mark.parametrize("seed", range(8))
def test_argmax_matches_exact_enumeration_on_random_networks(seed):
    net = random_dag(7, seed=seed, max_card=4, floor=0.01)
    cls = max(net.variables, key=lambda v: (net.card(v), -net.variables.index(v)))
    assert net.card(cls) >= 3
    rng = np.random.default_rng(seed)
    others = [v for v in net.variables if v != cls]
    feats = rng.permutation(others)[: int(rng.integers(2, 5))].tolist()
    spec = ClassifierSpec(cls, features=feats, order=feats, decision="argmax")
    decided, ties, pairs, _ = exact_argmax(exact_joint(net, cls, feats))
    joint = compile_classifier(net, spec, method="joint")
    split = compile_classifier(net, spec, method="decompose")
    assert split.method == "decompose/separator"
    assert split.diagram == joint.diagram
    X = all_assignments(joint.diagram.cardinalities)
    assert [decided[tuple(x)] for x in X] == joint.diagram.predict(X).tolist()
    assert joint.ties == split.ties == ties
    post = joint.posterior_of(X)
    assert post.shape == (len(X), net.card(cls))
    assert np.allclose(post.sum(axis=1), 1.0)


def many_states(k: int, ties: str, seed: int = 0) -> Network:
    """Class C of ``k`` states with features X (3 states) and Y (2), tied as ``ties`` says.

    ``none``: distinct random numbers (no ties); ``pairs``: states ``2j`` and ``2j + 1``
    share their prior and their row of X, so the winning pair ties on every input; ``all``:
    one prior and one row for every state, so all ``k`` tie on every input.
    """
    rng = np.random.default_rng(seed)
    if ties == "none":
        prior, x, y = rng.random(k) + 0.5, rng.random((k, 3)) + 0.1, rng.random((k, 2)) + 0.1
    elif ties == "pairs":
        prior = np.repeat(rng.random(k // 2) + 0.5, 2)
        x = np.repeat(rng.random((k // 2, 3)) + 0.1, 2, axis=0)
        y = np.repeat(rng.random((k // 2, 2)) + 0.1, 2, axis=0)
    else:
        prior, x, y = np.ones(k), np.ones((k, 3)), np.ones((k, 2))
    states = tuple(f"s{j}" for j in range(k))
    return Network(
        name="many",
        variables=("C", "X", "Y"),
        states={"C": states, "X": ("x0", "x1", "x2"), "Y": ("y0", "y1")},
        parents={"C": (), "X": ("C",), "Y": ("C",)},
        cpts={
            "C": prior / prior.sum(),
            "X": x / x.sum(axis=1, keepdims=True),
            "Y": y / y.sum(axis=1, keepdims=True),
        },
    )


def _compile(net: Network, method: str):
    spec = ClassifierSpec("C", features=["X", "Y"], order=["X", "Y"], decision="argmax")
    return compile_classifier(net, spec, method=method)


@pytest.mark.parametrize("ties", ["none", "pairs", "all"])
@pytest.mark.parametrize("method", ["joint", "decompose", "jointree"])
def test_argmax_ties_are_counted_exactly_up_to_the_pair_limit(ties, method):
    """With 1,000 and 8,000 class states the pair counts stay exact while the tied pairs are
    within MAX_TIE_PAIRS; past it they are not counted, the ties still are. (The time, which
    grows with the ties and not with the states squared, is measured by bench/hostile_bn.py,
    not here: a timed unit test fails on a loaded machine.)"""
    small = _compile(many_states(1_000, ties), method)
    large = _compile(many_states(8_000, ties), method)
    for k, result in ((1_000, small), (8_000, large)):
        names = result.diagram.terminals
        if ties == "none":
            assert result.ties == 0 and result.tie_pairs == {} and result.tie_pairs_counted
        elif ties == "pairs":
            assert result.ties == 6 and result.tie_pairs_counted
            assert sum(result.tie_pairs.values()) == 6
            for a, b in result.tie_pairs:
                assert names.index(b) == names.index(a) + 1 and names.index(a) % 2 == 0
        else:
            assert result.ties == 6 and result.decided == {"s0": 6, **dict.fromkeys(names[1:], 0)}
            if k * (k - 1) // 2 <= MAX_TIE_PAIRS:
                assert result.tie_pairs_counted and len(result.tie_pairs) == k * (k - 1) // 2
                assert set(result.tie_pairs.values()) == {6}
            else:
                assert not result.tie_pairs_counted and result.tie_pairs == {}
                assert result.summary()["tie_pairs_counted"] is False


def test_argmax_decisions_stop_at_the_deadline_inside_a_table(monkeypatch):
    """The wall-clock limit is checked while the decisions are made, block by block."""
    monkeypatch.setattr(bn_compile, "ARGMAX_BLOCK_CELLS", 4_000)
    net = many_states(4_000, "pairs")
    spec = resolve_spec(net, ClassifierSpec("C", features=["X", "Y"], decision="argmax"))
    plan = bn_plan.plan_joint(net, spec, max_memory=1e12)
    with pytest.raises(CompileTimeError, match=r"argmax decisions of 3 of 6 inputs made"):
        bn_compile._compile_joint(net, spec, plan.contraction, Countdown(5))


def test_argmax_on_a_binary_class_is_not_the_additive_route():
    net = random_dag(6, seed=3, max_card=2, floor=0.05)
    cls = net.variables[2]
    spec = ClassifierSpec(cls, decision="argmax", features=[v for v in net.variables if v != cls])
    result = compile_classifier(net, spec, method="decompose")
    assert result.method == "decompose/separator"
    assert result.diagram == compile_classifier(net, spec, method="joint").diagram


def test_spec_validation_for_argmax_lists_every_problem():
    net = three_class_network()
    with pytest.raises(ConfigError) as info:
        compile_classifier(net, ClassifierSpec("C", "low", 0.5, decision="argmax"))
    assert "takes no positive or threshold" in str(info.value)
    with pytest.raises(ConfigError, match="decision 'vote'"):
        compile_classifier(net, ClassifierSpec("C", decision="vote"))
    with pytest.raises(ConfigError, match="positive state None"):
        compile_classifier(net, ClassifierSpec("C", threshold=0.5))


# ---------------------------------------------------------------------------- diagram members
def test_argmax_diagram_round_trips_and_old_threshold_meta_still_loads():
    net = three_class_network()
    d = compile_classifier(net, ClassifierSpec("C", decision="argmax")).diagram
    members = d.to_members()
    meta = members["bn/diagram.json"]
    assert meta["decision_kind"] == "argmax" and meta["positive"] is None
    back = DecisionDiagram.from_members(meta, members["bn/diagram.npz"])
    assert back == d and back.is_argmax
    with pytest.raises(ArtifactError, match="argmax"):
        DecisionDiagram.from_members({**meta, "positive": "low"}, members["bn/diagram.npz"])
    with pytest.raises(ArtifactError, match="decision_kind"):
        DecisionDiagram.from_members({**meta, "decision_kind": "vote"}, members["bn/diagram.npz"])
    with pytest.raises(ValueError, match="no positive state"):
        d.predict_positive([[0, 0]])
    t = compile_classifier(net, ClassifierSpec("C", "high", 0.5)).diagram
    old = {k: v for k, v in t.to_members()["bn/diagram.json"].items() if k != "decision_kind"}
    assert DecisionDiagram.from_members(old, t.to_members()["bn/diagram.npz"]) == t


# ---------------------------------------------------------------------------- CNF
@pytest.mark.parametrize("seed", range(4))
def test_cnf_has_one_sink_literal_per_state_counting_its_inputs(seed):
    rng = np.random.default_rng(seed)
    cards = [3, 2, 3]
    table = rng.integers(0, 4, size=cards)
    d = argmax_diagram(table, 4)
    enc = encode_diagram(d)
    for t in range(4):
        with Solver(name="minisat22", bootstrap_with=enc.clauses) as s:
            models = list(s.enum_models(assumptions=[enc.sink_literal(t)]))
        xs = {tuple(enc.decode(m)) for m in models}
        assert xs == {tuple(x) for x in np.argwhere(table == t)}
        assert len(models) == d.count(t)


# ---------------------------------------------------------------------------- rules
def schema_of(d: DecisionDiagram) -> ClassifierSchema:
    return ClassifierSchema.from_diagram(d)


def test_then_accepts_a_state_a_set_and_not_a_state():
    d = argmax_diagram(np.array([[0, 1, 2], [3, 3, 0]]), 4)
    spec = parse_spec(
        {
            "rules": [
                {"name": "one", "if": {"f0": "s0"}, "then": "k2"},
                {"name": "set", "if": {}, "then": ["k3", "k0"]},
                {"name": "not", "if": {"f1": "s1"}, "then": {"not": "k1"}},
                {"name": "not_set", "then": {"not": ["k1", "k2"]}},
                {"name": "class_not", "then": {"C": {"not": "k0"}}},
                {"name": "index", "then": "in [1, 2]"},
            ]
        },
        schema_of(d),
    )
    got = {r.name: r.conclusion for r in spec.rules}
    assert got == {
        "one": ("k2",),
        "set": ("k0", "k3"),
        "not": ("k0", "k2", "k3"),
        "not_set": ("k0", "k3"),
        "class_not": ("k1", "k2", "k3"),
        "index": ("k1", "k2"),
    }
    assert spec.rules[2].text == "if f1 = s1 then not k1"


def test_bad_argmax_rules_are_reported_at_once():
    d = argmax_diagram(np.array([[0, 1, 2], [2, 2, 0]]), 3)
    with pytest.raises(ConfigError) as info:
        parse_spec(
            {
                "rules": [
                    {"name": "a", "then": {"not": "nope"}},
                    {"name": "b", "then": {"not": ["k0", "k1", "k2"]}},
                    {"name": "c", "then": {"maybe": "k0"}},
                ],
                "monotonicity": [{"name": "m", "feature": "f1", "check": "increasing"}],
            },
            schema_of(d),
        )
    text = "\n".join(info.value.problems)
    assert "rule 'a'" in text and "'nope'" in text
    assert "rule 'b'" in text and "allows no class state" in text
    assert "rule 'c'" in text and "{not: state}" in text
    assert "declare the order of its states" in text


@pytest.mark.parametrize("seed", range(10))
def test_rule_verdicts_and_counts_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    cards = [int(c) for c in rng.integers(2, 5, size=int(rng.integers(2, 5)))]
    nt = int(rng.integers(3, 6))
    table = rng.integers(0, nt, size=cards)
    if seed % 2:  # structure: a few large constant regions
        table = (np.indices(cards).sum(axis=0) // 2) % nt
    d = argmax_diagram(table, nt)
    assert np.array_equal(table_of(d), table)
    with BNVerifier(d) as verifier:
        for k in range(12):
            allowed = [
                sorted(rng.choice(c, size=int(rng.integers(1, c + 1)), replace=False).tolist())
                for c in cards
            ]
            premise = {d.features[i]: tuple(a) for i, a in enumerate(allowed) if len(a) < cards[i]}
            conclusion = tuple(
                sorted(
                    d.terminals[t]
                    for t in rng.choice(nt, size=int(rng.integers(1, nt)), replace=False)
                )
            )
            res = verifier.check_rule(Rule(f"r{k}", premise, conclusion), counterexamples=4)
            bad = [t for t in range(nt) if d.terminals[t] not in conclusion]
            n_premise, n_viol = brute_rule(table, allowed, bad)
            assert (res.premise_inputs, res.violating_inputs) == (n_premise, n_viol)
            assert res.holds == (n_viol == 0)
            for cube in res.counterexamples:
                fixed = {
                    d.features.index(f): d.states[d.features.index(f)].index(s)
                    for f, s in cube.fixed.items()
                }
                region = [[fixed[i]] if i in fixed else a for i, a in enumerate(allowed)]
                sub = table[np.ix_(*[np.asarray(a) for a in region])]
                assert np.isin(sub, bad).all() and sub.size == cube.inputs
            if res.witness is not None:
                assert res.witness_class not in conclusion


@pytest.mark.parametrize("seed", range(12))
def test_argmax_monotonicity_against_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    cards = [int(c) for c in rng.integers(2, 5, size=int(rng.integers(2, 5)))]
    nt = 3
    if seed % 3 == 0:  # monotone in feature 0 by construction, often
        table = np.minimum(np.indices(cards)[0] + (np.indices(cards)[-1] > 1), nt - 1)
    else:
        table = rng.integers(0, nt, size=cards)
    d = argmax_diagram(table, nt)
    seen = set()
    with BNVerifier(d) as verifier:
        for feature in range(len(cards)):
            for kind in ("increasing", "decreasing", "fmo"):
                order = tuple(rng.permutation(cards[feature]).tolist())
                class_order = tuple(rng.permutation(nt).tolist())
                allowed = [list(range(c)) for c in cards]
                given = {}
                other = [j for j in range(len(cards)) if j != feature]
                if other and rng.random() < 0.5:
                    j = int(rng.choice(other))
                    allowed[j] = [int(rng.integers(cards[j]))]
                    given[d.features[j]] = tuple(allowed[j])
                q = MonotonicityQuery(
                    "q", d.features[feature], order, given, kind, class_order=class_order
                )
                res = verifier.check_monotonicity(q)
                want = brute_argmax_monotone(table, feature, order, allowed, class_order, kind)
                assert res.holds == want, (feature, kind, order, class_order)
                seen.add(res.holds)
                if not res.holds:
                    w = res.witness
                    xs = [
                        [
                            d.states[j].index(w.fixed[d.features[j]])
                            if j != feature
                            else d.states[j].index(v)
                            for j in range(len(cards))
                        ]
                        for v in w.values
                    ]
                    classes = [d.terminals[t] for t in d.predict(np.array(xs))]
                    assert tuple(classes) == w.classes
    assert (True in seen) if seed % 3 == 0 else (False in seen)  # both verdicts occur


def test_argmax_monotonicity_from_a_rules_file_uses_the_declared_class_order():
    # Class rank follows feature f0 upwards: increasing holds, decreasing is violated.
    table = np.array([[0, 0], [1, 1], [2, 2]])
    d = argmax_diagram(table, 3)
    spec = parse_spec(
        {
            "states": {"C": ["k0", "k1", "k2"]},
            "monotonicity": [
                {"name": "up", "feature": "f0", "check": "increasing"},
                {"name": "down", "feature": "f0", "check": "decreasing"},
                {"name": "fmo", "feature": "f0"},
            ],
        },
        schema_of(d),
    )
    assert spec.queries[0].class_order == (0, 1, 2)
    assert spec.queries[0].to_dict(schema_of(d))["class_order"] == ["k0", "k1", "k2"]
    with BNVerifier(d) as verifier:
        report = verifier.verify(spec)
    verdicts = {m.query: m.holds for m in report.monotonicity}
    assert verdicts == {"up": True, "down": False, "fmo": True}
    down = report.monotonicity[1]
    assert down.witness.classes in {("k0", "k1"), ("k1", "k2"), ("k0", "k2")}
    reversed_spec = parse_spec(
        {
            "states": {"C": ["k2", "k1", "k0"]},
            "monotonicity": [{"name": "up", "feature": "f0", "check": "increasing"}],
        },
        schema_of(d),
    )
    with BNVerifier(d) as verifier:
        assert not verifier.check_monotonicity(reversed_spec.queries[0]).holds


# ---------------------------------------------------------------------------- shared networks
def pgmpy_argmax(net: Network, cls: str, features: tuple[str, ...], X: np.ndarray):
    """Decisions and the posterior table by pgmpy's exact variable elimination (joint query)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgmpy.inference import VariableElimination

        ve = VariableElimination(net.to_pgmpy())
        joint = ve.query([cls, *features], joint=True, show_progress=False)
    for v in (cls, *features):
        assert list(joint.state_names[v]) == list(net.states[v])
    table = np.moveaxis(
        joint.values, [joint.variables.index(v) for v in (cls, *features)], range(len(features) + 1)
    )
    p = table[(slice(None), *X.T)]  # (n_states, n_inputs)
    post = p / p.sum(axis=0)
    best = post.max(axis=0)
    decided = np.argmax(post >= best - 1e-9, axis=0)
    return decided, post, ve


def _shared(name: str) -> Network:
    path = DATA / f"{name}.bif.gz"
    if not path.is_file():
        pytest.skip(f"{path} is absent (../shared data not available)")
    return load_network(path)


@pytest.mark.shared_data
def test_child_disease_all_leaves_against_pgmpy_on_every_input():
    net = _shared("child")
    spec = ClassifierSpec("Disease", decision="argmax")
    result = compile_classifier(net, spec)
    d = result.diagram
    assert d.terminals == net.states["Disease"] and len(d.terminals) == 6
    X = all_assignments(d.cardinalities)
    decided, post, ve = pgmpy_argmax(net, "Disease", d.features, X)
    assert np.array_equal(d.predict(X), decided)
    # the margin to the runner-up: no decision of child hangs on rounding
    top2 = np.sort(post, axis=0)[-2:]
    assert (top2[1] - top2[0]).min() > 1e-6
    assert result.ties == 0
    assert sum(result.decided.values()) == len(X)
    split = compile_classifier(net, spec, method="decompose")
    assert split.diagram == d
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for x in X[:: max(1, len(X) // 60)]:
            ev = {f: d.states[i][x[i]] for i, f in enumerate(d.features)}
            q = ve.query(["Disease"], evidence=ev, show_progress=False)
            probs = [q.get_value(Disease=s) for s in net.states["Disease"]]
            assert d.predict(x[None, :])[0] == int(np.argmax(probs))


@pytest.mark.shared_data
def test_child_disease_rules_against_brute_force():
    net = _shared("child")
    from boxwatch.examples import example_path
    from boxwatch.offline.bn.rules import load_spec

    d = compile_classifier(net, ClassifierSpec("Disease", decision="argmax")).diagram
    spec = load_spec(example_path("child", "disease-rules.yaml"), schema_of(d))
    table = table_of(d)
    with BNVerifier(d, network=net) as verifier:
        report = verifier.verify(spec, counterexamples=3)
    joint = verifier.marginal.joint
    assert {r.holds for r in report.rules} == {True, False}
    for rule, res in zip(spec.rules, report.rules, strict=True):
        allowed = [
            list(rule.premise.get(f, range(len(s))))
            for f, s in zip(d.features, d.states, strict=True)
        ]
        bad = [t for t, name in enumerate(d.terminals) if name not in rule.conclusion]
        n_premise, n_viol = brute_rule(table, allowed, bad)
        assert (res.premise_inputs, res.violating_inputs) == (n_premise, n_viol)
        region = np.ix_(*[np.asarray(a) for a in allowed])
        mass = float(joint[region][np.isin(table[region], bad)].sum())
        assert res.violating_probability == pytest.approx(mass, abs=1e-12)
    for q, m in zip(spec.queries, report.monotonicity, strict=True):
        i = d.features.index(q.feature)
        allowed = [
            list(q.given.get(f, range(len(s)))) for f, s in zip(d.features, d.states, strict=True)
        ]
        want = brute_argmax_monotone(table, i, q.order, allowed, q.class_order, q.kind)
        assert m.holds == want, q.name


@pytest.mark.slow
@pytest.mark.shared_data
def test_alarm_three_state_class_against_pgmpy_on_every_input():
    net = _shared("alarm")
    features = ("VENTTUBE", "PRESS", "VENTLUNG", "MINVOL", "EXPCO2", "SAO2", "VENTALV")
    spec = ClassifierSpec("INTUBATION", features=features, decision="argmax")
    result = compile_classifier(net, spec)
    d = result.diagram
    assert len(d.terminals) == 3
    X = all_assignments(d.cardinalities)
    decided, _, _ = pgmpy_argmax(net, "INTUBATION", d.features, X)
    assert np.array_equal(d.predict(X), decided)
    assert len(set(decided.tolist())) >= 2
    assert compile_classifier(net, spec, method="decompose").diagram == d
    assert math.prod(int(c) for c in d.cardinalities) == len(X)
