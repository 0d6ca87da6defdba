"""ITR, FMO and directional queries, cross-checked by brute force over every assignment."""

from __future__ import annotations

import itertools
import time
from functools import cache

import numpy as np
import pytest
from bn_tables import (
    brute_monotone,
    brute_rule,
    cube_all_violate,
    diagram_from_table,
    random_table,
    table_of,
)

from boxwatch.offline.bn import verify as verify_module
from boxwatch.offline.bn.limits import CompileTimeError, Deadline
from boxwatch.offline.bn.network import Network
from boxwatch.offline.bn.rules import MonotonicityQuery, Rule, Spec
from boxwatch.offline.bn.verify import BNVerifier


# ---------------------------------------------------------------------------- helpers
def random_rule(rng, diagram, table, *, name="r", holding=False):
    """A random premise box; when ``holding``, shrunk around a point until the class is constant."""
    cards = [int(c) for c in diagram.cardinalities]
    allowed = []
    for c in cards:
        if rng.random() < 0.4:
            allowed.append(list(range(c)))
        else:
            k = int(rng.integers(1, c + 1))
            allowed.append(sorted(rng.choice(c, size=k, replace=False).tolist()))
    if holding:
        x = [int(rng.choice(a)) for a in allowed]
        for i in rng.permutation(len(cards)):
            sub = table[np.ix_(*[np.asarray(a) for a in allowed])]
            if (sub == sub.flat[0]).all():
                break
            allowed[i] = [x[i]]
        conclusion = (diagram.terminals[int(table[tuple(x)])],)
    else:
        conclusion = (diagram.terminals[int(rng.integers(diagram.n_terminals))],)
    premise = {diagram.features[i]: tuple(a) for i, a in enumerate(allowed) if len(a) < cards[i]}
    return Rule(name, premise, conclusion), allowed


def check_rule_against_brute_force(verifier, table, rule, allowed, k=5):
    d = verifier.diagram
    res = verifier.check_rule(rule, counterexamples=k)
    bad = [t for t, label in enumerate(d.terminals) if label not in rule.conclusion]
    n_premise, n_viol = brute_rule(table, allowed, bad)
    assert res.premise_inputs == n_premise
    assert res.violating_inputs == n_viol
    assert res.holds == (n_viol == 0)
    if n_viol:
        assert 1 <= len(res.counterexamples) <= k
        sizes = [c.n_fixed for c in res.counterexamples]
        assert sizes == sorted(sizes)
        index = {f: i for i, f in enumerate(d.features)}
        for c in res.counterexamples:
            cube = {index[f]: d.states[index[f]].index(s) for f, s in c.fixed.items()}
            assert cube_all_violate(table, allowed, cube, bad), (rule, c)
            region = [[cube[i]] if i in cube else a for i, a in enumerate(allowed)]
            assert c.inputs == int(np.prod([len(a) for a in region]))
        x = [d.states[i].index(res.witness[f]) for i, f in enumerate(d.features)]
        assert int(table[tuple(x)]) in bad and res.witness_class == d.terminals[table[tuple(x)]]
    else:
        assert res.counterexamples == [] and res.witness is None
    return res


def random_network(rng, cards, n_hidden=2):
    """A random BN: a class C, hidden parents, features with random parents among earlier nodes."""
    names = ["C"] + [f"h{k}" for k in range(n_hidden)] + [f"f{i}" for i in range(len(cards))]
    card = {
        "C": 2,
        **{f"h{k}": 2 for k in range(n_hidden)},
        **{f"f{i}": c for i, c in enumerate(cards)},
    }
    states = {v: tuple(f"{v}_{j}" for j in range(card[v])) for v in names}
    parents, cpts = {}, {}
    for pos, v in enumerate(names):
        earlier = names[:pos]
        k = min(len(earlier), int(rng.integers(0, 3)))
        ps = tuple(rng.choice(earlier, size=k, replace=False).tolist()) if k else ()
        if v.startswith("f") and "C" not in ps:
            ps = ("C", *ps[:1])
        parents[v] = ps
        shape = [card[p] for p in ps] + [card[v]]
        cpts[v] = rng.dirichlet(np.ones(card[v]) * 0.7, size=int(np.prod(shape[:-1]))).reshape(
            shape
        )
    return Network("random", tuple(names), states, parents, cpts, "<test>")


def brute_joint(net):
    """P(all variables) by multiplying CPT entries for every full assignment."""
    names = list(net.variables)
    cards = [net.card(v) for v in names]
    joint = np.ones(cards)
    for x in itertools.product(*[range(c) for c in cards]):
        val = dict(zip(names, x, strict=True))
        p = 1.0
        for v in names:
            p *= net.cpts[v][tuple(val[u] for u in net.parents[v]) + (val[v],)]
        joint[x] = p
    return joint


def classifier_from_network(net):
    """Table and diagram of ``P(C = C_1 | features) >= T`` (T: the median posterior)."""
    joint = brute_joint(net)
    names = list(net.variables)
    feats = [v for v in names if v.startswith("f")]
    axes = tuple(k for k, v in enumerate(names) if v not in feats and v != "C")
    pc = joint.sum(axis=axes)  # (C, *features)
    pf = pc.sum(axis=0)
    post = pc[1] / pf
    table = (post >= np.median(post)).astype(np.int64)
    diagram = diagram_from_table(
        table,
        terminals=net.states["C"],
        positive=net.states["C"][1],
        features=feats,
        states=[net.states[f] for f in feats],
    )
    return table, diagram, pf


# ---------------------------------------------------------------------------- ITR
@pytest.mark.parametrize("seed", range(8))
def test_rules_agree_with_brute_force_on_random_tables(seed):
    rng = np.random.default_rng(seed)
    cards = [int(c) for c in rng.integers(2, 5, size=int(rng.integers(3, 6)))]
    kind = "random" if seed % 3 == 0 else "additive"
    n_terminals = 3 if seed % 4 == 1 else 2
    table = random_table(rng, cards, kind=kind, n_terminals=n_terminals)
    diagram = diagram_from_table(table, terminals=("a", "b", "c")[:n_terminals], positive="b")
    verifier = BNVerifier(diagram)
    holds = 0
    for r in range(30):
        rule, allowed = random_rule(rng, diagram, table, name=f"r{r}", holding=r % 2 == 0)
        holds += check_rule_against_brute_force(verifier, table, rule, allowed).holds
    assert holds >= 10


def _expired() -> Deadline:
    deadline = Deadline(0.5, "net.bif", start=time.perf_counter() - 3600)
    deadline.enter("verifying the rules", "give fewer rules or queries")
    return deadline


def test_verification_stops_at_the_deadline_between_queries():
    table = np.array([[0, 1, 2], [2, 2, 2]])
    diagram = diagram_from_table(table, terminals=("a", "b", "c"), positive="b")
    spec = Spec([Rule("r", {}, ("b", "c"))], [], {})
    with BNVerifier(diagram, deadline=_expired()) as verifier:
        with pytest.raises(CompileTimeError, match=r"while verifying the rules \(0 of 1 rules"):
            verifier.verify(spec)


def test_searches_stop_at_the_deadline_inside_them(monkeypatch):
    """The counterexample search checks the clock every CHECK_EVERY steps, not only between
    queries."""
    monkeypatch.setattr(verify_module, "CHECK_EVERY", 1)
    rng = np.random.default_rng(0)
    table = random_table(rng, [3, 3, 3, 3], kind="random", n_terminals=2)
    diagram = diagram_from_table(table, terminals=("a", "b"), positive="b")
    with BNVerifier(diagram, deadline=_expired()) as verifier:
        with pytest.raises(CompileTimeError, match="counterexamples"):
            verifier.check_rule(Rule("r", {}, ("a",)))


def test_rule_with_two_allowed_classes_and_empty_premise():
    table = np.array([[0, 1, 2], [2, 2, 2]])
    diagram = diagram_from_table(table, terminals=("a", "b", "c"), positive="b")
    verifier = BNVerifier(diagram)
    res = verifier.check_rule(Rule("r", {}, ("b", "c")))
    assert (res.verdict, res.violating_inputs, res.premise_inputs) == ("violated", 1, 6)
    assert [c.fixed for c in res.counterexamples] == [{"f0": "s0", "f1": "s0"}]
    assert verifier.check_rule(Rule("r", {"f0": (1,)}, ("c",))).holds


def test_counterexamples_are_compact_not_paths():
    # Class negative iff x2 == 0, whatever x0 and x1 (the diagram tests only x2) -- plus one
    # positive corner so x0 matters somewhere. The cube must fix x2 alone.
    table = np.ones((3, 3, 2), dtype=np.int64)
    table[:, :, 0] = 0
    table[2, 2, :] = 1
    diagram = diagram_from_table(table)
    res = BNVerifier(diagram).check_rule(Rule("r", {}, ("pos",)), counterexamples=3)
    assert res.violating_inputs == 8
    assert res.counterexamples[0].fixed in (
        {"f0": "s0", "f2": "s0"},
        {"f0": "s1", "f2": "s0"},
        {"f1": "s0", "f2": "s0"},
        {"f1": "s1", "f2": "s0"},
    )
    assert all(c.n_fixed == 2 for c in res.counterexamples)


def test_probability_masses_are_exact_under_the_network():
    rng = np.random.default_rng(11)
    net = random_network(rng, [3, 2, 3, 2])
    table, diagram, pf = classifier_from_network(net)
    assert 0 < table.sum() < table.size
    exact = BNVerifier(diagram, network=net)
    by_cubes = BNVerifier(diagram, network=net, joint_limit=0)
    assert exact.marginal.joint is not None and by_cubes.marginal.joint is None
    for r in range(20):
        rule, allowed = random_rule(rng, diagram, table, name=f"r{r}", holding=r % 3 == 0)
        bad = [t for t, lab in enumerate(diagram.terminals) if lab not in rule.conclusion]
        sub = np.ix_(*[np.asarray(a) for a in allowed])
        want_viol = float(pf[sub][np.isin(table[sub], bad)].sum())
        for verifier in (exact, by_cubes):
            res = check_rule_against_brute_force(verifier, table, rule, allowed)
            assert res.premise_probability == pytest.approx(float(pf[sub].sum()), abs=1e-12)
            assert res.violating_probability == pytest.approx(want_viol, abs=1e-12)
            index = {f: i for i, f in enumerate(diagram.features)}
            for c in res.counterexamples:
                region = [np.asarray(a) for a in allowed]
                for f, s in c.fixed.items():
                    region[index[f]] = np.array([diagram.states[index[f]].index(s)])
                assert c.probability == pytest.approx(float(pf[np.ix_(*region)].sum()), abs=1e-12)


# ---------------------------------------------------------------------------- FMO
def _random_context(rng, diagram, i: int) -> tuple[list[list[int]], dict[str, tuple[int, ...]]]:
    """Each feature but ``i`` fixed to a random state with probability 1/2: the state
    indices each feature may take, and the fixed ones as a query's ``given``."""
    cards = [int(c) for c in diagram.cardinalities]
    allowed = [list(range(c)) for c in cards]
    given = {}
    for j in range(len(cards)):
        if j != i and rng.random() < 0.5:
            allowed[j] = [int(rng.integers(cards[j]))]
            given[diagram.features[j]] = tuple(allowed[j])
    return allowed, given


@pytest.mark.parametrize("seed", range(6))
def test_monotonicity_agrees_with_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    cards = [int(c) for c in rng.integers(2, 5, size=4)]
    table = random_table(rng, cards, kind="random" if seed % 2 else "additive")
    diagram = diagram_from_table(table)
    verifier = BNVerifier(diagram)
    verdicts = set()
    for q in range(24):
        i = int(rng.integers(len(cards)))
        order = tuple(rng.permutation(cards[i]).tolist()) if q % 3 else tuple(range(cards[i]))
        allowed, given = _random_context(rng, diagram, i)
        kind = ("fmo", "increasing", "decreasing")[q % 3]
        res = verifier.check_monotonicity(
            MonotonicityQuery(f"q{q}", diagram.features[i], order, given, kind)
        )
        want = brute_monotone(table, i, order, allowed, diagram.positive_terminal, kind)
        assert res.holds == want, (res, order, given)
        verdicts.add(res.verdict)
        if not res.holds:
            w = res.witness
            assert set(w.fixed) == set(diagram.features) - {diagram.features[i]}
            for f, vals in given.items():
                assert diagram.states[diagram.features.index(f)].index(w.fixed[f]) in vals
            ranks = [order.index(diagram.states[i].index(v)) for v in w.values]
            assert ranks == sorted(set(ranks))
            xs = []
            for v in w.values:
                x = [
                    diagram.states[j].index(w.fixed[f]) if j != i else diagram.states[i].index(v)
                    for j, f in enumerate(diagram.features)
                ]
                xs.append(x)
            assert tuple(diagram.terminals[t] for t in diagram.predict(np.array(xs))) == w.classes
    assert verdicts == {"holds", "violated"} or seed % 2 == 0


def test_binary_feature_cannot_flip_twice_but_directional_is_checked():
    table = np.array([[[0, 1], [1, 0]], [[1, 0], [0, 1]]])
    diagram = diagram_from_table(table)
    verifier = BNVerifier(diagram)
    res = verifier.check_monotonicity(MonotonicityQuery("q", "f0", (0, 1), {}, "fmo"))
    assert res.holds and "cannot flip twice" in res.reason
    inc = verifier.check_monotonicity(MonotonicityQuery("q", "f0", (0, 1), {}, "increasing"))
    assert not inc.holds and inc.witness.classes == ("pos", "neg")


def test_fmo_holds_fixed_features_fixed_unlike_the_reference():
    # Class = (x0 >= 1) xor (x1 == 1)... per fixed x1 the class flips once along x0, so FMO
    # holds; with x1 free across copies (the reference's bug) H-L-H would appear.
    x0 = np.arange(3)[:, None]
    x1 = np.arange(2)[None, :]
    table = ((x0 >= 1) ^ (x1 == 1)).astype(np.int64)
    diagram = diagram_from_table(table)
    res = BNVerifier(diagram).check_monotonicity(MonotonicityQuery("q", "f0", (0, 1, 2), {}))
    assert res.holds
    untied = [table[0, 1], table[1, 1], table[2, 0]]  # x1 changes between the copies
    assert untied == [1, 0, 1]


# ---------------------------------------------------------------------------- real networks
@cache
def compiled(name):
    """Diagram and network of a reference classifier (skips without ../shared)."""
    from bn_tables import compile_reference

    return compile_reference(name)


def _cross_check_network(name, n_rules, n_fmo, seed=0):
    diagram, network = compiled(name)
    table = table_of(diagram)
    verifier = BNVerifier(diagram, network=network)
    rng = np.random.default_rng(seed)
    holds = 0
    for r in range(n_rules):
        rule, allowed = random_rule(rng, diagram, table, name=f"r{r}", holding=r % 2 == 0)
        holds += check_rule_against_brute_force(verifier, table, rule, allowed, k=10).holds
    assert holds >= n_rules // 3
    cards = [int(c) for c in diagram.cardinalities]
    for q in range(n_fmo):
        i = int(rng.integers(len(cards)))
        allowed = [list(range(c)) for c in cards]
        given = {}
        for j in rng.permutation(len(cards))[: int(rng.integers(0, len(cards)))]:
            if j != i:
                allowed[j] = [int(rng.integers(cards[j]))]
                given[diagram.features[j]] = tuple(allowed[j])
        kind = ("fmo", "fmo", "increasing", "decreasing")[q % 4]
        res = verifier.check_monotonicity(
            MonotonicityQuery(f"q{q}", diagram.features[i], tuple(range(cards[i])), given, kind)
        )
        want = brute_monotone(table, i, range(cards[i]), allowed, diagram.positive_terminal, kind)
        assert res.holds == want, (name, res)


@pytest.mark.shared_data
@pytest.mark.parametrize("name", ["asia", "child"])
def test_reference_networks_small(name):
    _cross_check_network(name, 60, 20)


@pytest.mark.slow
@pytest.mark.shared_data
@pytest.mark.parametrize("name", ["asia", "child", "alarm", "win95pts"])
def test_reference_networks_200_rules_50_fmo(name):
    _cross_check_network(name, 200, 50, seed=1)


@pytest.mark.shared_data
@pytest.mark.parametrize("feature", ["RUQO2", "Age"])
def test_child_monotone_features_the_reference_reports_violated(feature):
    diagram, network = compiled("child")
    table = table_of(diagram)
    verifier = BNVerifier(diagram, network=network)
    i = diagram.features.index(feature)
    cards = [int(c) for c in diagram.cardinalities]
    assert cards[i] >= 3
    rng = np.random.default_rng(7)
    for q in range(15):
        allowed, given = _random_context(rng, diagram, i)
        res = verifier.check_monotonicity(
            MonotonicityQuery(f"q{q}", feature, tuple(range(cards[i])), given)
        )
        assert res.holds
        assert brute_monotone(table, i, range(cards[i]), allowed, diagram.positive_terminal, "fmo")
    # Untied copies (the reference's encoding) mix contexts: positive somewhere at one value,
    # negative somewhere at a higher one, positive somewhere at a higher one still.
    seqs = np.moveaxis(table == diagram.positive_terminal, i, -1).reshape(-1, cards[i])
    some_pos, some_neg = seqs.any(axis=0), (~seqs).any(axis=0)
    untied_flip = any(
        (some_pos[a] and some_neg[b] and some_pos[c])
        or (some_neg[a] and some_pos[b] and some_neg[c])
        for a, b, c in itertools.combinations(range(cards[i]), 3)
    )
    assert untied_flip


def test_product_search_alone_decides_when_sat_has_no_time():
    rng = np.random.default_rng(5)
    cards = [3, 4, 3, 2]
    table = random_table(rng, cards, kind="random")
    diagram = diagram_from_table(table)
    with BNVerifier(diagram, sat_seconds=0.0) as verifier:
        engines = set()
        for q in range(30):
            i = int(rng.integers(3))
            kind = ("fmo", "increasing", "decreasing")[q % 3]
            allowed = [list(range(c)) for c in cards]
            given = {}
            if q % 2:
                j = (i + 1) % len(cards)
                allowed[j] = [int(rng.integers(cards[j]))]
                given[diagram.features[j]] = tuple(allowed[j])
            res = verifier.check_monotonicity(
                MonotonicityQuery(f"q{q}", diagram.features[i], tuple(range(cards[i])), given, kind)
            )
            engines.add(res.engine.split()[0])
            assert res.holds == brute_monotone(
                table, i, range(cards[i]), allowed, diagram.positive_terminal, kind
            )
        assert engines <= {"sat,", "diagram"}
    assert verifier._solvers == []
