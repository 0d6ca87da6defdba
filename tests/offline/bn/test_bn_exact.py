"""Exact decisions against the numbers as written, each CPT row divided by its sum: ties,
near-ties, deterministic rows, underflow, rows that do not sum to 1, and the float error bound
against rational brute force.

The reference here is independent of the compiler and of the readers' exact values: every
network is given as decimal strings, written out as BIF for the compiler, and enumerated in
``fractions.Fraction`` straight from the same strings.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from boxwatch.offline.bn.classifier import ClassifierSpec, resolve_spec
from boxwatch.offline.bn.compile import compile_classifier
from boxwatch.offline.bn.exact import (
    ExactJoint,
    exact_threshold,
    grid_columns,
    mixed_radix,
    unique_keys,
)
from boxwatch.offline.bn.formats import load_network, parse_bif, parse_net, parse_xmlbif, write_bif
from boxwatch.offline.bn.plan import (
    joint_error_bound,
    plan_joint,
    plan_separator,
    relevant_factors,
    separator_error_bound,
)

# A network: {name: (states, parents, rows)}; rows[i] lists the decimal strings of parent
# configuration i (row-major over the parents, first parent slowest).
Spec = dict[str, tuple[list[str], list[str], list[list[str]]]]


def to_bif(net: Spec) -> str:
    out = ["network test {", "}"]
    for v, (states, _, _) in net.items():
        out += [f"variable {v} {{", f"  type discrete [ {len(states)} ] {{ {', '.join(states)} }};"]
        out.append("}")
    for v, (_, parents, rows) in net.items():
        if not parents:
            out += [f"probability ( {v} ) {{", f"  table {', '.join(rows[0])};", "}"]
            continue
        out.append(f"probability ( {v} | {', '.join(parents)} ) {{")
        keys = itertools.product(*[net[p][0] for p in parents])
        for key, row in zip(keys, rows, strict=True):
            out.append(f"  ({', '.join(key)}) {', '.join(row)};")
        out.append("}")
    return "\n".join(out) + "\n"


def brute_force(
    net: Spec, cls: str, features: list[str], reading: str = "renormalised"
) -> dict[tuple[int, ...], list[Fraction]]:
    """P(C = c, x) for every input x (state indices in ``features`` order), in Fractions,
    over every variable of the network.

    ``reading``: ``"renormalised"`` (the compiler's: each row divided by its sum),
    ``"literal"`` (the numbers as written, barren variables kept) or ``"literal, barren
    dropped"`` (as written, the variables that are no ancestor of the class or a feature left
    out: what a compiler that prunes does to a literal reading).
    """
    names = list(net)
    if reading == "literal, barren dropped":
        keep, stack = set(), [cls, *features]
        while stack:
            v = stack.pop()
            if v not in keep:
                keep.add(v)
                stack.extend(net[v][1])
        names = [v for v in names if v in keep]
    cards = [len(net[v][0]) for v in names]
    out: dict[tuple[int, ...], list[Fraction]] = {}
    for config in itertools.product(*[range(c) for c in cards]):
        at = dict(zip(names, config, strict=True))
        p = Fraction(1)
        for v in names:
            _, parents, rows = net[v]
            row = 0
            for u in parents:
                row = row * len(net[u][0]) + at[u]
            p *= Fraction(rows[row][at[v]])
            if reading == "renormalised":
                p /= sum(Fraction(q) for q in rows[row])
        x = tuple(at[f] for f in features)
        out.setdefault(x, [Fraction(0)] * len(net[cls][0]))[at[cls]] += p
    return out


def expected_decisions(joint, pos: int, threshold: str) -> dict[tuple[int, ...], bool]:
    t = Fraction(threshold)
    return {x: sum(p) > 0 and p[pos] >= t * sum(p) for x, p in joint.items()}


def check_every_route(net: Spec, cls: str, positive: str, threshold: str, features: list[str]):
    """Compile with every route; each diagram must decide every input as the rationals do."""
    network = parse_bif(to_bif(net))
    pos = net[cls][0].index(positive)
    joint = brute_force(net, cls, features)
    want = expected_decisions(joint, pos, threshold)
    t = Fraction(threshold)
    ties = sum(1 for p in joint.values() if sum(p) > 0 and p[pos] == t * sum(p))
    results = []
    for method in ("joint", "decompose"):
        spec = ClassifierSpec(cls, positive, float(threshold), features=features, order=features)
        result = compile_classifier(network, spec, method=method)
        X = np.array(sorted(want), dtype=np.int64)
        got = result.diagram.predict_positive(X)
        wrong = [tuple(x) for x, g in zip(X.tolist(), got, strict=True) if g != want[tuple(x)]]
        assert wrong == [], (result.method, wrong)
        assert result.ties == ties, result.method
        assert result.certified
        assert result.impossible == sum(1 for p in joint.values() if sum(p) == 0)
        results.append(result)
    return results


# ---------------------------------------------------------------------------- ties and near-ties
def _near_tie_network(prior: str, hidden: bool = True) -> Spec:
    """C -> H -> F (H hidden) and C -> G. F carries no evidence (P(H | C) equal rows); G's
    first state has equal likelihoods. So P(pos | f, g0) is the prior exactly. Without
    ``hidden``: naive Bayes C -> F, C -> G (the additive route)."""
    net: Spec = {"C": (["neg", "pos"], [], [[_decimal(1 - Fraction(prior)), prior]])}
    if hidden:
        net["H"] = (["h0", "h1", "h2"], ["C"], [["0.1", "0.3", "0.6"], ["0.1", "0.3", "0.6"]])
        net["F"] = (["f0", "f1"], ["H"], [["0.7", "0.3"], ["0.05", "0.95"], ["0.33", "0.67"]])
    else:
        net["F"] = (["f0", "f1"], ["C"], [["0.37", "0.63"], ["0.37", "0.63"]])
    net["G"] = (["g0", "g1", "g2"], ["C"], [["0.2", "0.6", "0.2"], ["0.2", "0.3", "0.5"]])
    return net


def _decimal(q: Fraction) -> str:
    """A terminating fraction as a plain decimal string."""
    digits = 0
    while (q * 10**digits).denominator != 1:
        digits += 1
    return f"{q.numerator * 10**digits // q.denominator}e-{digits}" if digits else str(q)


@pytest.mark.parametrize(
    ("prior", "threshold", "positive_at_tie"),
    [
        ("0.98", "0.98", True),  # exactly T
        ("0.3", "0.3", True),
        ("0.500000000000001", "0.5", True),  # 1e-15 above
        ("0.499999999999999", "0.5", False),  # 1e-15 below: positive under the old 1e-9 rule
        ("0.299999999999999", "0.3", False),
        ("0.700000000001", "0.7", True),  # 1e-12 above
        ("0.699999999999", "0.7", False),  # 1e-12 below
    ],
)
@pytest.mark.parametrize("hidden", [True, False])
def test_ties_and_near_ties_are_decided_as_the_rationals_say(
    prior, threshold, positive_at_tie, hidden
):
    net = _near_tie_network(prior, hidden)
    results = check_every_route(net, "C", "pos", threshold, ["F", "G"])
    routes = {"joint", "decompose/separator" if hidden else "decompose/additive"}
    assert {r.method for r in results} == routes
    network = parse_bif(to_bif(net))
    spec = resolve_spec(network, ClassifierSpec("C", "pos", float(threshold), features=["F", "G"]))
    for result in results:
        d = result.diagram
        at_tie = d.predict_positive(np.array([[0, 0], [1, 0]]))
        assert at_tie.tolist() == [positive_at_tie] * 2, result.method
        assert result.ties == (2 if prior == threshold else 0)
        assert result.exact_inputs >= result.ties
    assert spec.threshold == float(threshold)


def test_a_tie_whose_float_posterior_misses_t_is_still_a_tie():
    # 0.98 * 0.3 / (0.98 * 0.3 + 0.02 * 0.3) rounds away from 0.98 for some rows; whatever
    # the float says, the posterior of every input is exactly 49/50.
    net: Spec = {
        "C": (["neg", "pos"], [], [["0.02", "0.98"]]),
        "A": (["a0", "a1", "a2"], ["C"], [["0.1", "0.2", "0.7"], ["0.1", "0.2", "0.7"]]),
        "B": (["b0", "b1"], ["A"], [["0.3", "0.7"], ["0.9", "0.1"], ["0.13", "0.87"]]),
        "D": (["d0", "d1"], ["A"], [["0.11", "0.89"], ["0.57", "0.43"], ["0.29", "0.71"]]),
    }
    for result in check_every_route(net, "C", "pos", "0.98", ["B", "D"]):
        assert result.ties == result.inputs == result.positives == 4
        assert result.diagram.root == result.diagram.positive_terminal


def test_deterministic_rows_impossible_inputs_and_ties():
    # A = a1 forces C = pos and B = b0 (deterministic rows): (a1, b1) is impossible;
    # P(pos | a0, b) = 1/2 exactly for both b (a tie at T = 0.5).
    net: Spec = {
        "A": (["a0", "a1"], [], [["0.4", "0.6"]]),
        "C": (["neg", "pos"], ["A"], [["0.5", "0.5"], ["0", "1"]]),
        "B": (["b0", "b1"], ["C", "A"], [["0.25", "0.75"]] * 2 + [["0.25", "0.75"], ["1", "0"]]),
        "E": (["e0", "e1"], ["C"], [["1", "0"], ["0", "1"]]),
    }
    for result in check_every_route(net, "C", "pos", "0.5", ["A", "B"]):
        assert result.impossible == 1
        assert result.ties == 2
    # E copies C: every possible input decides by E alone
    check_every_route(net, "C", "pos", "0.999", ["A", "E"])


def test_numbers_too_small_for_a_float_are_still_used_as_written():
    # 1e-400 and 2e-400 read as 0.0: the float route sees P(f0) = 0 (impossible), the file
    # says P(pos | f0) = 1/3. Products of 1e-200 underflow as well.
    net: Spec = {
        "C": (["neg", "pos"], [], [["0.5", "0.5"]]),
        "F": (["f0", "f1"], ["C"], [["2e-400", "1"], ["1e-400", "1"]]),
        "H": (["h0", "h1"], ["C"], [["1e-200", "1"], ["3e-200", "1"]]),
        "G": (["g0", "g1"], ["H"], [["1e-200", "1"], ["1", "1e-200"]]),
    }
    for threshold in ("0.3", "0.34"):
        for result in check_every_route(net, "C", "pos", threshold, ["F", "G"]):
            assert result.exact_inputs > 0


def test_rows_are_read_divided_by_their_sums():
    # P(H | C = pos) sums to 0.9996 (inside the readers' tolerance): read divided by its sum,
    # so F tells nothing and P(pos | x) = 1/2 exactly (as written it would be 0.4998 / 0.9998)
    net: Spec = {
        "C": (["neg", "pos"], [], [["0.5", "0.5"]]),
        "H": (["h0", "h1"], ["C"], [["0.5", "0.5"], ["0.4998", "0.4998"]]),
        "F": (["f0", "f1"], ["H"], [["0.5", "0.5"], ["0.5", "0.5"]]),
        "G": (["g0", "g1"], ["C"], [["0.5", "0.5"], ["0.5", "0.5"]]),
    }
    for result in check_every_route(net, "C", "pos", "0.5", ["F", "G"]):
        assert (result.positives, result.ties) == (4, 4)
        assert result.row_sums is not None and result.row_sums.rows == 1
    for result in check_every_route(net, "C", "pos", "0.4999", ["F", "G"]):
        assert result.positives == 4
    for result in check_every_route(net, "C", "pos", "0.50001", ["F", "G"]):
        assert result.positives == 0


def _between(a: Fraction, b: Fraction) -> str:
    """A short decimal strictly between ``a`` and ``b`` that reads back as itself."""
    lo, hi = min(a, b), max(a, b)
    for digits in range(1, 17):
        text = f"{float((lo + hi) / 2):.{digits}g}"
        if lo < Fraction(text) < hi and Fraction(repr(float(text))) == Fraction(text):
            return text
    raise AssertionError(f"no short decimal between {float(lo)} and {float(hi)}")


def _deviating_network() -> Spec:
    """C -> H -> F, C -> G, H -> B with B barren (no feature, no class below it); rows of H,
    F, G and B off 1 by up to 9e-4, B's differently per state of H, so dropping B is exact
    only once its rows are divided by their sums."""
    return {
        "C": (["neg", "pos"], [], [["0.3", "0.7"]]),
        "H": (["h0", "h1", "h2"], ["C"], [["0.2", "0.3", "0.5"], ["0.6", "0.3", "0.1009"]]),
        "F": (["f0", "f1"], ["H"], [["0.7", "0.3"], ["0.2", "0.7991"], ["0.5", "0.5009"]]),
        "G": (["g0", "g1"], ["C"], [["0.4", "0.6007"], ["0.55", "0.45"]]),
        "B": (["b0", "b1"], ["H"], [["0.5", "0.5009"], ["0.9", "0.0991"], ["0.3", "0.7"]]),
    }


@pytest.mark.parametrize("other", ["literal", "literal, barren dropped"])
def test_every_route_decides_the_renormalised_reading_where_the_others_differ(other):
    # each threshold lies between the posterior of some input under the renormalised reading
    # and under another reading: a compiler mixing readings gets that input wrong
    net = _deviating_network()
    feats = ["F", "G"]
    ours = brute_force(net, "C", feats)
    theirs = brute_force(net, "C", feats, reading=other)
    flipped = 0
    for x in sorted(ours):
        a, b = ours[x][1] / sum(ours[x]), theirs[x][1] / sum(theirs[x])
        assert a != b
        threshold = _between(a, b)
        t = Fraction(threshold)
        # the two readings decide x differently at this threshold...
        assert (a >= t) != (b >= t)
        flipped += 1
        # ...and every route decides every input as the renormalised rationals do
        check_every_route(net, "C", "pos", threshold, feats)
    assert flipped == len(ours) == 4


# ---------------------------------------------------------------------------- random networks
def random_decimal_network(seed: int, n: int = 7, digits: int = 4) -> Spec:
    """A random DAG whose CPT rows are ``digits``-digit decimals, some rows off 1 by
    ``10**-digits``, some deterministic."""
    rng = np.random.default_rng(seed)
    net: Spec = {}
    names = [f"V{i}" for i in range(n)]
    scale = 10**digits
    for i, v in enumerate(names):
        card = int(rng.integers(2, 4))
        parents = [names[j] for j in range(max(0, i - 3), i) if rng.random() < 0.6]
        n_rows = int(np.prod([len(net[p][0]) for p in parents])) if parents else 1
        rows = []
        for _ in range(n_rows):
            kind = rng.random()
            if kind < 0.1:
                row = ["0"] * card
                row[int(rng.integers(card))] = "1"
            else:
                ints = rng.multinomial(scale - card, np.ones(card) / card) + 1
                if kind > 0.9 and digits >= 4:
                    ints[0] += int(rng.integers(-1, 2))  # off 1 by 1e-4: within tolerance
                row = [f"{int(k) / scale:.{digits}f}" for k in ints]
            rows.append(row)
        net[v] = ([f"s{j}" for j in range(card)], parents, rows)
    return net


@pytest.mark.parametrize("seed", range(12))
def test_random_decimal_networks_every_route_against_rationals(seed):
    net = random_decimal_network(seed)
    names = list(net)
    rng = np.random.default_rng(seed + 100)
    cls = names[int(rng.integers(1, 4))]
    feats = [v for v in names if v != cls]
    feats = sorted(rng.choice(feats, size=3, replace=False).tolist())
    pos = net[cls][0][int(rng.integers(len(net[cls][0])))]
    # a threshold equal to one input's exact posterior, written as a decimal when possible
    joint = brute_force(net, cls, feats)
    posts = sorted(p[net[cls][0].index(pos)] / sum(p) for p in joint.values() if sum(p) > 0)
    short = [q for q in posts if 0 < q < 1 and (q.denominator & (q.denominator - 1)) == 0]
    threshold = repr(float(short[0])) if short else "0.5"
    check_every_route(net, cls, pos, threshold, feats)


def _float_margins_joint(network, spec):
    plan = plan_joint(network, spec, max_memory=1 << 30)
    factors = relevant_factors(network, [spec.class_variable, *spec.order])
    joint = plan.contraction.run(factors)
    pos = network.states[spec.class_variable].index(spec.positive)
    bound = joint_error_bound(network, spec, factors, plan.contraction)
    return joint[pos], joint.sum(axis=0), bound


def _float_margins_separator(network, spec):
    """num and den of every input as the separator route computes them (its own pieces:
    the lower tables, the prefix message block by block, the products)."""
    from boxwatch.offline.bn.plan import context_index, lower_tables, margins

    plan = plan_separator(network, spec, max_memory=1 << 30)
    cut = plan.cut
    cards = [network.card(f) for f in spec.order]
    pos = network.states[spec.class_variable].index(spec.positive)
    lower = lower_tables(network, plan)
    nums, dens = [], []
    for b in range(plan.n_blocks):
        u = plan.up.run(plan.block(network, b)).reshape(plan.block_prefixes, cut.n_class, -1)
        prefixes = b * plan.block_prefixes + np.arange(plan.block_prefixes)
        ctx = context_index(prefixes, cut)
        for i in range(plan.block_prefixes):
            num, den = margins(u[i : i + 1], lower[ctx[i]], pos, cut.class_free)
            nums.append(num[0])
            dens.append(den[0])
    return (
        np.stack(nums).reshape(cards),
        np.stack(dens).reshape(cards),
        separator_error_bound(network, plan),
    )


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("route", ["joint", "separator"])
def test_the_error_bound_is_never_exceeded(seed, route):
    """|float margin - exact margin| <= the bound, for every input, against rationals."""
    net = random_decimal_network(seed, n=8, digits=4)
    names = list(net)
    cls, feats = names[2], [v for v in names if v not in (names[2],)][-4:]
    network = parse_bif(to_bif(net)).renormalised
    joint = brute_force(net, cls, feats)
    for positive in net[cls][0]:
        for threshold in ("0.3", "0.5", "0.77"):
            spec = resolve_spec(
                network,
                ClassifierSpec(cls, positive, float(threshold), features=feats, order=feats),
            )
            if route == "joint":
                num, den, bound = _float_margins_joint(network, spec)
            else:
                num, den, bound = _float_margins_separator(network, spec)
            t = float(threshold)
            pos = net[cls][0].index(positive)
            half = bound.window(num, den, t) / 2
            margin = num - t * den
            # the fast test the routes use covers the window
            inside = (np.abs(margin) <= 2 * half) & (den > 0)
            assert not (inside & ~bound.undecided(num, den, t)).any()
            for x, p in joint.items():
                exact = p[pos] - Fraction(threshold) * sum(p)
                err = abs(Fraction(float(margin[x])) - exact)
                assert err <= Fraction(float(half[x])), (x, float(err), float(half[x]))
                assert (abs(Fraction(float(num[x])) - p[pos])) <= Fraction(float(half[x]))


def test_exact_joint_matches_brute_force_up_to_one_scale():
    net = random_decimal_network(3, n=8)
    names = list(net)
    cls, feats = names[3], [names[0], names[5], names[7]]
    network = parse_bif(to_bif(net)).renormalised
    want = brute_force(net, cls, feats)
    X = np.array(sorted(want), dtype=np.int64)
    got = ExactJoint(network, cls, feats).joint(X)
    ratios = {
        Fraction(int(g), 1) / w
        for row, x in zip(got, X.tolist(), strict=True)
        for g, w in zip(row, want[tuple(x)], strict=True)
        if w
    }
    assert len(ratios) == 1
    assert all(
        (int(g) == 0) == (w == 0)
        for row, x in zip(got, X.tolist(), strict=True)
        for g, w in zip(row, want[tuple(x)], strict=True)
    )


# ---------------------------------------------------------------------------- readers
def test_readers_keep_the_numbers_as_written(tmp_path):
    net = _near_tie_network("0.98")
    bif = parse_bif(to_bif(net))
    assert bif.exact_cpt("C").tolist() == [Fraction(1, 50), Fraction(49, 50)]
    assert bif.texts is not None and bif.texts["F"].tolist()[2] == ["0.33", "0.67"]
    hugin = parse_net(
        'net { }\nnode C { states = ("neg" "pos"); }\nnode G { states = ("a" "b"); }\n'
        "potential (C) { data = (0.020 0.98); }\n"
        "potential (G | C) { data = ((0.1 0.9) (0.333333333333333333333 0.666666666666666666667)); }\n"
    )
    assert hugin.exact_cpt("C").tolist() == [Fraction(1, 50), Fraction(49, 50)]
    assert hugin.exact_cpt("G")[1, 0] == Fraction("0.333333333333333333333")
    assert hugin.exact_cpt("G")[1, 0] != Fraction(float(hugin.cpts["G"][1, 0]))
    xml = parse_xmlbif(
        "<BIF VERSION='0.3'><NETWORK><NAME>n</NAME>"
        "<VARIABLE TYPE='nature'><NAME>C</NAME><OUTCOME>a</OUTCOME><OUTCOME>b</OUTCOME></VARIABLE>"
        "<DEFINITION><FOR>C</FOR><TABLE>0.3 0.70</TABLE></DEFINITION></NETWORK></BIF>"
    )
    assert xml.exact_cpt("C").tolist() == [Fraction(3, 10), Fraction(7, 10)]
    # a 'default' row and a table in child-slowest order land where the floats do
    text = (
        "variable A { type discrete [ 2 ] { a0, a1 }; }\n"
        "variable B { type discrete [ 3 ] { b0, b1, b2 }; }\n"
        "probability ( A ) { table 0.25, 0.75; }\n"
        "probability ( B | A ) { (a1) 0.1, 0.2, 0.7; default 0.3, 0.3, 0.4; }\n"
    )
    net2 = parse_bif(text)
    for v in ("A", "B"):
        assert np.array_equal(
            np.array([float(q) for q in net2.exact_cpt(v).reshape(-1)]), net2.cpts[v].reshape(-1)
        )
    # a network built from floats (and its BIF dump) takes each float's shortest decimal
    again = parse_bif(write_bif(net2))
    for v in ("A", "B"):
        assert again.exact_cpt(v).tolist() == net2.exact_cpt(v).tolist()
    path = tmp_path / "n.bif"
    path.write_text(to_bif(net))
    assert load_network(path).exact_cpt("H")[0, 2] == Fraction(3, 5)


def test_scaled_integer_cpts_are_the_numbers_as_written():
    text = (
        "variable A { type discrete [ 3 ] { a0, a1, a2 }; }\n"
        "variable B { type discrete [ 2 ] { b0, b1 }; }\n"
        "probability ( A ) { table 0.25, .5, 0.250; }\n"
        "probability ( B | A ) { (a0) 1e-3, 0.999; (a1) 1, 0; (a2) 0.333333333333333333333, "
        "0.666666666666666666667; }\n"
    )
    for network in (parse_bif(text), parse_bif(write_bif(parse_bif(text)))):
        for v in ("A", "B"):
            ints, scale = network.scaled_cpt(v)
            assert ints.shape == network.cpts[v].shape
            want = network.exact_cpt(v).reshape(-1).tolist()
            assert [Fraction(int(i), scale) for i in ints.reshape(-1).tolist()] == want
    # plain decimals: digits over a power of ten, one scale for the whole CPT
    assert parse_bif(text).scaled_cpt("A")[1] == 1000


def test_threshold_is_the_decimal_written():
    assert exact_threshold(0.98) == Fraction(49, 50)
    assert exact_threshold(0.1) == Fraction(1, 10)


def test_the_additive_route_says_so_when_it_cannot_certify(monkeypatch):
    from boxwatch.offline.bn import compile as bn_compile

    net = _near_tie_network("0.98", hidden=False)
    network = parse_bif(to_bif(net))
    spec = ClassifierSpec("C", "pos", 0.98, features=["F", "G"])
    monkeypatch.setattr(bn_compile, "ADDITIVE_EXACT_LIMIT", 0)
    result = compile_classifier(network, spec, method="decompose")
    assert result.method == "decompose/additive"
    assert (result.certified, result.uncertified, result.exact_inputs) == (False, 2, 0)
    assert result.summary()["certified"] is False


@pytest.mark.parametrize("hidden", [True, False])
def test_past_the_exact_limit_every_route_says_it_is_not_certified(monkeypatch, hidden):
    from boxwatch.offline.bn import exact

    monkeypatch.setattr(exact, "EXACT_LIMIT", 1)
    network = parse_bif(to_bif(_near_tie_network("0.98", hidden)))
    spec = ClassifierSpec("C", "pos", 0.98, features=["F", "G"])
    for method in ("joint", "decompose"):
        result = compile_classifier(network, spec, method=method)
        assert (result.certified, result.uncertified, result.exact_inputs) == (False, 2, 0)
        # the two inputs at T: decided positive, as a tie would be
        assert result.diagram.predict_positive(np.array([[0, 0], [1, 0]])).all()


# ---------------------------------------------------------------------------- the cheap exact path
def _decisions_by_rationals(net: Spec, cls: str, positive: str, threshold: str, feats: list[str]):
    joint = brute_force(net, cls, feats)
    pos, t = net[cls][0].index(positive), Fraction(threshold)
    X = np.array(sorted(joint), dtype=np.int64)
    rows = [joint[tuple(x)] for x in X.tolist()]
    possible = np.array([sum(p) > 0 for p in rows])
    positive_ = np.array([sum(p) > 0 and p[pos] >= t * sum(p) for p in rows])
    tie = np.array([sum(p) > 0 and p[pos] == t * sum(p) for p in rows])
    return X, positive_, tie, ~possible


def _zero_network() -> Spec:
    """A feature-only CPT (B | A) with an exact 0 and a number too small for a float
    (1e-400 reads as 0.0); G carries no evidence, so every possible input is a tie at 0.5."""
    return {
        "C": (["neg", "pos"], [], [["0.5", "0.5"]]),
        "A": (["a0", "a1"], [], [["0.3", "0.7"]]),
        "B": (["b0", "b1"], ["A"], [["1e-400", "1"], ["0", "1"]]),
        "G": (["g0", "g1"], ["C"], [["0.2", "0.8"], ["0.2", "0.8"]]),
    }


@pytest.mark.parametrize("free_cells", [1 << 19, 0])
@pytest.mark.parametrize("seed", range(8))
def test_exact_decisions_of_every_input_match_the_rationals(monkeypatch, seed, free_cells):
    """ExactJoint.decide, and the same inputs given by their decision key only, on every
    input: positive, tie and impossible as the rationals say; by the whole table over the
    features where it is cheaper, and (0 cells) always on a batch axis."""
    from boxwatch.offline.bn import exact as exact_module

    monkeypatch.setattr(exact_module, "EXACT_FREE_CELLS", free_cells)
    net = random_decimal_network(seed, n=7)
    names = list(net)
    rng = np.random.default_rng(seed + 7)
    cls = names[int(rng.integers(1, 4))]
    feats = sorted(rng.choice([v for v in names if v != cls], size=4, replace=False).tolist())
    positive = net[cls][0][0]
    for threshold in ("0.5", "0.3"):
        X, want_pos, want_tie, want_imp = _decisions_by_rationals(
            net, cls, positive, threshold, feats
        )
        exact = ExactJoint(parse_bif(to_bif(net)).renormalised, cls, feats)
        got = exact.decide(X, Fraction(threshold), 0)
        assert got.positive.tolist() == want_pos.tolist()
        assert got.tie.tolist() == want_tie.tolist()
        assert got.impossible.tolist() == want_imp.tolist()
        if free_cells == 0:
            assert exact._table is None
        keys = mixed_radix(X[:, list(exact.columns)], exact.key_cards)
        by_key = exact.decide_keys(keys, Fraction(threshold), 0)
        assert by_key.positive.tolist() == want_pos.tolist()
        assert by_key.impossible.tolist() == want_imp.tolist()


def test_a_feature_only_cpt_with_an_exact_zero_is_read_where_it_matters():
    net = _zero_network()
    exact = ExactJoint(parse_bif(to_bif(net)), "C", ["A", "B", "G"])
    # G (with the class) and B's CPT over A and B (an exact 0); A's CPT is positive
    assert set(exact.columns) == {0, 1, 2}
    X, want_pos, want_tie, want_imp = _decisions_by_rationals(net, "C", "pos", "0.5", list("ABG"))
    got = exact.decide(X, Fraction("0.5"), 1)
    assert want_imp.tolist() == [x[0] == 1 and x[1] == 0 for x in X.tolist()]
    assert (got.positive.tolist(), got.tie.tolist(), got.impossible.tolist()) == (
        want_pos.tolist(),
        want_tie.tolist(),
        want_imp.tolist(),
    )
    for result in check_every_route(net, "C", "pos", "0.5", ["A", "B", "G"]):
        assert result.impossible == 2
    # without G's CPT in the way, the columns are those of B's CPT only
    assert ExactJoint(parse_bif(to_bif(net)), "C", ["A", "B"]).columns == (0, 1)


def _mixed_window_network() -> Spec:
    """Naive Bayes where f0 is an exact tie at 0.5 and f1 about 2.5e-16 below it (both
    inside the additive route's window), f2 clearly positive: ties and exactly negative
    inputs side by side (every row sums to exactly 1)."""
    return {
        "C": (["neg", "pos"], [], [["0.5", "0.5"]]),
        "F": (
            ["f0", "f1", "f2"],
            ["C"],
            [
                ["0.5", "0.4999999999999995", "0.0000000000000005"],
                ["0.5", "0.499999999999999", "0.000000000000001"],
            ],
        ),
        "G": (["g0", "g1", "g2"], ["C"], [["0.2", "0.3", "0.5"], ["0.2", "0.3", "0.5"]]),
        "H": (["h0", "h1"], ["C"], [["0.4", "0.6"], ["0.4", "0.6"]]),
    }


def _tan_window_network() -> Spec:
    """TAN (F's parents C and A; H's C and G). A = a0 makes F carry no evidence, a1 and a2
    opposite evidence: with A and F on either side of the additive route's split, its
    window spans contexts whose completions sort differently. G and H carry none: the
    inputs at a0, or at f1, are exact ties, except (a1, f1), 1e-15 below 0.5."""
    return {
        "C": (["neg", "pos"], [], [["0.5", "0.5"]]),
        "A": (["a0", "a1", "a2"], ["C"], [["0.2", "0.3", "0.5"], ["0.2", "0.3", "0.5"]]),
        "F": (
            ["f0", "f1", "f2"],
            ["C", "A"],
            [["0.5", "0.25", "0.25"], ["0.2", "0.3", "0.5"], ["0.5", "0.3", "0.2"]]
            + [["0.5", "0.25", "0.25"], ["0.5", "0.299999999999999", "0.200000000000001"]]
            + [["0.2", "0.3", "0.5"]],
        ),
        "G": (["g0", "g1", "g2"], ["C"], [["0.2", "0.3", "0.5"], ["0.2", "0.3", "0.5"]]),
        "H": (["h0", "h1"], ["C", "G"], [["0.4", "0.6"], ["0.7", "0.3"], ["0.1", "0.9"]] * 2),
    }


@pytest.mark.parametrize("part_cells", [1 << 12, 0])
def test_the_additive_route_decides_its_window_by_parts_or_input_by_input(monkeypatch, part_cells):
    from boxwatch.offline.bn import compile as bn_compile

    # 0 cells: every window is decided input by input (the fallback)
    monkeypatch.setattr(bn_compile, "ADDITIVE_PART_CELLS", part_cells)
    cases = [(_mixed_window_network(), order, (6, 12, 12)) for order in ("FGH", "GHF", "HFG")]
    cases += [
        (_tan_window_network(), order, (24, 30, None)) for order in ("AFGH", "AGHF", "GHFA", "HAFG")
    ]
    for net, order, (ties, exact_inputs, positives) in cases:
        results = check_every_route(net, "C", "pos", "0.5", list(order))
        additive = [r for r in results if r.method == "decompose/additive"]
        assert len(additive) == 1, order
        assert (additive[0].ties, additive[0].exact_inputs) == (ties, exact_inputs), order
        assert positives is None or additive[0].positives == positives
    for prior in ("0.499999999999999", "0.500000000000001"):
        check_every_route(_near_tie_network(prior, hidden=False), "C", "pos", "0.5", ["F", "G"])


def test_keys_and_columns_of_flat_positions():
    from boxwatch.offline.bn.compile import _range_sums, _split_columns, _split_keys

    rng = np.random.default_rng(3)
    cards = [3, 2, 4, 2, 3]
    n = int(np.prod(cards))
    idx = rng.integers(0, n, 500)
    full = np.stack(np.unravel_index(idx, cards), axis=1)
    for columns in ([0, 2, 4], [4, 1], [3], []):
        assert grid_columns(idx, cards, columns).tolist() == full[:, columns].tolist()
        for k in (1, 2, 4):
            pre, suf = np.divmod(idx, int(np.prod(cards[k:])))
            assert _split_columns(pre, suf, cards, k, columns).tolist() == full[:, columns].tolist()
            pre_key, suf_key = _split_keys(pre, cards, k, columns)
            want = mixed_radix(full[:, columns], [cards[c] for c in columns])
            assert (pre_key + suf_key[suf]).tolist() == want.tolist()
    # distinct keys: the direct table and the sort agree
    for space in (7, 1 << 20):
        keys = rng.integers(0, space, 300)
        for hint in (space, 0):
            distinct, inverse = unique_keys(keys, hint)
            assert distinct.tolist() == np.unique(keys).tolist()
            assert distinct[inverse].tolist() == keys.tolist()
    # range sums of marks
    marks = rng.random((4, 9)) < 0.4
    row = rng.integers(0, 4, 50)
    a = rng.integers(0, 9, 50)
    b = np.minimum(a + rng.integers(0, 5, 50), 9)
    want_sums = [int(marks[r, s:e].sum()) for r, s, e in zip(row, a, b, strict=True)]
    for m in (marks, np.ones_like(marks), np.zeros_like(marks)):
        want_sums = [int(m[r, s:e].sum()) for r, s, e in zip(row, a, b, strict=True)]
        assert _range_sums(m, row, a, b).tolist() == want_sums
