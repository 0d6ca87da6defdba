"""Exactness of the BN compiler: against brute force, an independent elimination, and pgmpy.

The independent computations here (full enumeration of small networks; a greedy variable
elimination with ``np.einsum``) share no code with :mod:`boxwatch.offline.bn.compile`.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import opt_einsum
import pytest
from bn_reference import REFERENCE_CLASSIFIERS
from bn_synthetic import chain_tan, naive_bayes, random_dag
from determinism import outputs_under_hash_seeds
from locations import SHARED_BN

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn import compile as bn_compile
from boxwatch.offline.bn import plan as bn_plan
from boxwatch.offline.bn.classifier import ClassifierSpec, default_order, resolve_spec
from boxwatch.offline.bn.compile import compile_classifier
from boxwatch.offline.bn.elimination import HEURISTICS, elimination_path
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.network import Network
from boxwatch.offline.bn.plan import CompileLimitError

SHARED = SHARED_BN
# The float references below decide P >= T - TIE_TOLERANCE and count |P - T| <= TIE_TOLERANCE
# as ties. The compiler decides exactly (tests/offline/bn/test_bn_exact.py); on these networks every
# posterior within the window is an exact tie, so both agree.
TIE_TOLERANCE = 1e-9
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason="needs ../shared/data/bn (absent in a plain clone)"
)


# ---------------------------------------------------------------------------- independent code
def enumerate_joint(net: Network, cls: str, order: list[str]) -> np.ndarray:
    """P(C, X) by listing every configuration of every variable (small networks only)."""
    names = list(net.variables)
    grid = np.indices([net.card(v) for v in names]).reshape(len(names), -1)
    at = {v: grid[i] for i, v in enumerate(names)}
    prob = np.ones(grid.shape[1])
    for v in names:
        prob = prob * net.cpts[v][tuple(at[u] for u in (*net.parents[v], v))]
    shape = [net.card(v) for v in [cls, *order]]
    flat = np.ravel_multi_index(tuple(at[v] for v in [cls, *order]), shape)
    return np.bincount(flat, weights=prob, minlength=math.prod(shape)).reshape(shape)


def eliminate_joint(net: Network, cls: str, order: list[str]) -> np.ndarray:
    """P(C, X) by greedy min-size variable elimination with ``np.einsum``."""
    keep = [cls, *order]
    needed, stack = set(), list(keep)
    while stack:
        v = stack.pop()
        if v not in needed:
            needed.add(v)
            stack.extend(net.parents[v])
    factors = [([*net.parents[v], v], net.cpts[v]) for v in net.variables if v in needed]

    def multiply(group, out):
        local = {
            v: chr(ord("a") + i) for i, v in enumerate(sorted({u for sc, _ in group for u in sc}))
        }
        spec = ",".join("".join(local[v] for v in sc) for sc, _ in group)
        return np.einsum(f"{spec}->{''.join(local[v] for v in out)}", *[t for _, t in group])

    def cost(v, factors):
        scope = {u for sc, _ in factors if v in sc for u in sc}
        return math.prod(net.card(u) for u in scope)

    hidden = [v for v in needed if v not in keep]
    while hidden:
        v = min(sorted(hidden), key=lambda u, fs=factors: cost(u, fs))
        hidden.remove(v)
        group = [f for f in factors if v in f[0]]
        rest = [f for f in factors if v not in f[0]]
        out = sorted({u for sc, _ in group for u in sc} - {v})
        factors = [*rest, (out, multiply(group, out))]
    return multiply(factors, keep)


def decisions(joint: np.ndarray, pos: int, threshold: float) -> tuple[np.ndarray, int]:
    post = joint[pos] / joint.sum(axis=0)
    return post >= threshold - TIE_TOLERANCE, int((np.abs(post - threshold) <= TIE_TOLERANCE).sum())


def all_inputs(cards) -> np.ndarray:
    return np.array(list(itertools.product(*[range(c) for c in cards])), dtype=np.int64)


def random_spec(net: Network, seed: int) -> ClassifierSpec:
    rng = np.random.default_rng(seed)
    cls = net.variables[int(rng.integers(1, 4))]
    others = [v for v in net.variables if v != cls]
    feats = sorted(rng.choice(others, size=int(rng.integers(2, 6)), replace=False).tolist())
    order = rng.permutation(feats).tolist()
    positive = net.states[cls][int(rng.integers(net.card(cls)))]
    return ClassifierSpec(
        cls, positive, float(rng.uniform(0.15, 0.85)), features=feats, order=order
    )


# ---------------------------------------------------------------------------- core (no shared data)
@pytest.mark.parametrize("seed", range(25))
def test_joint_route_matches_full_enumeration(seed):
    net = random_dag(8, seed=seed, floor=0.001)
    spec = random_spec(net, seed)
    result = compile_classifier(net, spec, method="joint")
    d = result.diagram
    joint = enumerate_joint(net, spec.class_variable, list(spec.order))
    pos = net.states[spec.class_variable].index(spec.positive)
    expected, ties = decisions(joint, pos, spec.threshold)
    X = all_inputs(d.cardinalities)
    assert np.array_equal(d.predict_positive(X), expected.reshape(-1))
    assert result.positives == int(expected.sum())
    assert result.inputs == expected.size
    assert result.ties == ties
    np.testing.assert_allclose(result.posterior, joint[pos] / joint.sum(axis=0), rtol=1e-9)
    assert result.nodes_quasi_per_level == d.quasi_nodes_per_level()
    assert d.is_canonical()


@pytest.mark.parametrize("seed", range(25))
def test_decomposition_gives_the_same_diagram_on_random_networks(seed):
    net = random_dag(9, seed=seed, floor=0.001)
    spec = random_spec(net, seed + 1000)
    joint = compile_classifier(net, spec, method="joint")
    split = compile_classifier(net, spec, method="decompose")
    assert split.method.startswith("decompose")
    assert split.diagram == joint.diagram
    assert (split.positives, split.ties, split.nodes_quasi) == (
        joint.positives,
        joint.ties,
        joint.nodes_quasi,
    )


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("make", [naive_bayes, chain_tan])
def test_equivalence_intervals_match_the_joint_table(make, seed):
    rng = np.random.default_rng(seed)
    net = make(10, seed=seed, card=int(rng.integers(2, 4)))
    feats = [f"x{i}" for i in range(10)]
    spec = ClassifierSpec(
        "C",
        "pos",
        float(rng.uniform(0.1, 0.9)),
        features=feats,
        order=rng.permutation(feats).tolist() if seed % 2 else None,
    )
    joint = compile_classifier(net, spec, method="joint")
    split = compile_classifier(net, spec, method="decompose")
    assert split.method == "decompose/additive"
    assert split.diagram == joint.diagram
    assert split.ties == joint.ties
    expected, _ = decisions(
        enumerate_joint(net, "C", list(joint.diagram.features)), 1, spec.threshold
    )
    assert joint.positives == int(expected.sum())


def test_past_enumeration_naive_bayes_agrees_with_direct_posterior():
    n = 26  # 6.7e7 inputs: beyond the joint route's limit, so 'auto' decomposes
    net = naive_bayes(n, seed=7)
    feats = [f"x{i}" for i in range(n)]
    result = compile_classifier(net, ClassifierSpec("C", "pos", 0.3, features=feats))
    assert result.method == "decompose/additive"
    assert result.inputs == 2**n
    d = result.diagram
    X = np.random.default_rng(0).integers(0, 2, size=(5000, n))
    cols = [d.features.index(f) for f in feats]
    logp = np.log(net.cpts["C"])[None, :].repeat(len(X), 0)
    for i, f in enumerate(feats):
        logp = logp + np.log(net.cpts[f][:, X[:, cols[i]]]).T
    post = 1.0 / (1.0 + np.exp(logp[:, 0] - logp[:, 1]))
    assert np.array_equal(d.predict_positive(X), post >= 0.3 - TIE_TOLERANCE)
    assert 0 < result.positives < result.inputs


def test_multi_state_class_uses_not_positive_terminal():
    net = random_dag(7, seed=4, max_card=3, floor=0.01)
    cls = next(v for v in net.variables if net.card(v) == 3 and net.parents[v])
    spec = ClassifierSpec(
        cls, net.states[cls][2], 0.3, features=[v for v in net.variables if v != cls][:4]
    )
    result = compile_classifier(net, spec)
    assert result.diagram.terminals == (f"not {net.states[cls][2]}", net.states[cls][2])
    joint = enumerate_joint(net, cls, list(result.diagram.features))
    expected, _ = decisions(joint, 2, 0.3)
    X = all_inputs(result.diagram.cardinalities)
    assert np.array_equal(result.diagram.predict(X), expected.reshape(-1).astype(int))
    split = compile_classifier(net, spec, method="decompose")
    assert split.diagram == result.diagram


def _tiny(cpt_c: list[list[float]], cpt_b: list[list[float]]) -> Network:
    return Network(
        name="tiny",
        variables=("A", "C", "B"),
        states={"A": ("a0", "a1"), "C": ("no", "yes"), "B": ("b0", "b1")},
        parents={"A": (), "C": ("A",), "B": ("C",)},
        cpts={"A": np.array([0.5, 0.5]), "C": np.array(cpt_c), "B": np.array(cpt_b)},
    )


def test_exact_ties_are_counted_and_decided_positive():
    # P(yes | A=a0, B) = 0.5 exactly for both values of B: two exact ties at T = 0.5.
    net = _tiny([[0.5, 0.5], [0.2, 0.8]], [[0.3, 0.7], [0.3, 0.7]])
    spec = ClassifierSpec("C", "yes", 0.5, features=["A", "B"])
    for method in ("joint", "decompose"):
        result = compile_classifier(net, spec, method=method)
        assert result.ties == 2
        assert result.positives == 4
        assert result.diagram.root == result.diagram.positive_terminal


def test_impossible_inputs_are_counted_and_negative():
    # A = a1 forces C = yes and B = b0, so (a1, b1) has probability 0.
    net = _tiny([[0.6, 0.4], [0.0, 1.0]], [[0.5, 0.5], [1.0, 0.0]])
    spec = ClassifierSpec("C", "yes", 0.5, features=["A", "B"], order=["A", "B"])
    for method in ("joint", "decompose"):
        result = compile_classifier(net, spec, method=method)
        assert result.impossible == 1
        assert result.diagram.predict([[1, 1], [1, 0]]).tolist() == [0, 1]


def test_agrees_with_pgmpy_variable_elimination_on_a_random_network():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgmpy.inference import VariableElimination
    net = random_dag(10, seed=21, floor=0.001)
    spec = random_spec(net, 21)
    d = compile_classifier(net, spec).diagram
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ve = VariableElimination(net.to_pgmpy())
        X = np.random.default_rng(2).integers(0, d.cardinalities, size=(40, d.n_features))
        for x, got in zip(X, d.predict_positive(X), strict=True):
            ev = {f: d.states[i][x[i]] for i, f in enumerate(d.features)}
            q = ve.query([spec.class_variable], evidence=ev, show_progress=False)
            p = q.get_value(**{spec.class_variable: spec.positive})
            assert got == (p >= spec.threshold - TIE_TOLERANCE)


def test_spec_validation_lists_every_problem():
    net = random_dag(6, seed=1)
    with pytest.raises(ConfigError) as info:
        resolve_spec(net, ClassifierSpec("v3", "nope", 1.0, features=["v3", "zz", "v1", "v1"]))
    text = "\n".join(info.value.problems)
    for part in (
        "positive state 'nope'",
        "threshold 1.0",
        "['zz']",
        "more than once",
        "cannot also",
    ):
        assert part in text
    with pytest.raises(ConfigError, match="order must list each feature exactly once"):
        resolve_spec(net, ClassifierSpec("v3", "s0", 0.5, features=["v1", "v2"], order=["v1"]))
    with pytest.raises(ConfigError, match="class variable 'q'"):
        resolve_spec(net, ClassifierSpec("q", "s0", 0.5))
    with pytest.raises(ConfigError, match="method"):
        compile_classifier(net, ClassifierSpec("v3", "s0", 0.5, features=["v1"]), method="fast")


def test_defaults_leaves_or_all_others_and_a_deterministic_order():
    net = chain_tan(5, seed=0)
    spec = resolve_spec(net, ClassifierSpec("C", "pos", 0.5))
    assert spec.order == ("x4",)  # the only leaf
    leaf_class = naive_bayes(3, seed=0)
    # make the class a leaf: reverse the edges (features are roots)
    rev = Network(
        "rev",
        leaf_class.variables,
        leaf_class.states,
        {"C": ("x0", "x1", "x2"), "x0": (), "x1": (), "x2": ()},
        {"C": np.full((2, 2, 2, 2), 0.5), **{f: np.array([0.4, 0.6]) for f in ("x0", "x1", "x2")}},
    )
    assert set(resolve_spec(rev, ClassifierSpec("C", "pos", 0.5)).order) == {"x0", "x1", "x2"}
    tan = chain_tan(6, seed=0)
    feats = ["x5", "x3", "x0", "x1", "x4", "x2"]
    assert default_order(tan, "C", feats) == ("x0", "x1", "x2", "x3", "x4", "x5")


# ---------------------------------------------------------------------------- shared networks
def _reference(name: str) -> tuple[Network, ClassifierSpec]:
    return REFERENCE_CLASSIFIERS[name].load(SHARED)


@needs_shared
@pytest.mark.shared_data
@pytest.mark.parametrize(
    ("name", "nodes_quasi", "positives", "inputs"),
    [
        ("child", 41, 844, 1080),
        ("alarm", 180, 153_472, 279_936),
        ("win95pts", 242, 16_466, 65_536),
        ("insurance", None, 250, 768),
        ("credit", None, 54_432, 93_312),
        ("asia", None, 2, 4),
    ],
)
def test_reference_figures_and_every_input_against_elimination(
    name, nodes_quasi, positives, inputs
):
    net, spec = _reference(name)
    result = compile_classifier(net, spec)
    d = result.diagram
    if nodes_quasi is not None:
        assert result.nodes_quasi == nodes_quasi
    assert (result.positives, result.inputs) == (positives, inputs)
    assert result.nodes <= result.nodes_quasi
    joint = eliminate_joint(net, spec.class_variable, list(d.features))
    pos = net.states[spec.class_variable].index(spec.positive)
    expected, ties = decisions(joint, pos, spec.threshold)
    X = all_inputs(d.cardinalities)
    assert np.count_nonzero(d.predict_positive(X) != expected.reshape(-1)) == 0
    assert result.ties == ties
    assert (ties > 0) == (name == "credit")


@needs_shared
@pytest.mark.shared_data
def test_alarm_at_one_half_is_constant():
    net, spec = _reference("alarm")
    result = compile_classifier(
        net, ClassifierSpec(spec.class_variable, spec.positive, 0.5, order=spec.order)
    )
    assert result.nodes == 0
    assert result.diagram.root < result.diagram.n_terminals
    assert result.nodes_quasi == 11


@needs_shared
@pytest.mark.shared_data
@pytest.mark.parametrize("name", ["child", "alarm", "win95pts", "credit"])
def test_decomposition_is_identical_on_real_networks(name):
    net, spec = _reference(name)
    joint = compile_classifier(net, spec, method="joint")
    split = compile_classifier(net, spec, method="decompose")
    assert split.diagram == joint.diagram
    assert (split.positives, split.ties) == (joint.positives, joint.ties)


@pytest.mark.slow
@needs_shared
@pytest.mark.shared_data
@pytest.mark.parametrize("name", ["asia", "child", "insurance", "alarm", "win95pts", "credit"])
def test_random_inputs_against_pgmpy_variable_elimination(name):
    """2,000 random inputs (all when fewer) against pgmpy's exact joint P(C, X) from
    VariableElimination, plus 200 of them as separate evidence queries."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgmpy.inference import VariableElimination
    net, spec = _reference(name)
    d = compile_classifier(net, spec).diagram
    cls = spec.class_variable
    if d.n_inputs <= 2000:
        X = all_inputs(d.cardinalities)
    else:
        X = np.random.default_rng(0).integers(0, d.cardinalities, size=(2000, d.n_features))
    got = d.predict_positive(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ve = VariableElimination(net.to_pgmpy())
        joint = ve.query([cls, *d.features], joint=True, show_progress=False)
        table = np.moveaxis(
            joint.values,
            [joint.variables.index(v) for v in (cls, *d.features)],
            range(d.n_features + 1),
        )
        for v in (cls, *d.features):  # pgmpy keeps the network's state order; check it
            assert list(joint.state_names[v]) == list(net.states[v])
        pos = net.states[cls].index(spec.positive)
        post = table[pos][tuple(X.T)] / table.sum(axis=0)[tuple(X.T)]
        assert np.count_nonzero(got != (post >= spec.threshold - TIE_TOLERANCE)) == 0
        for x, decided in zip(X[:200], got[:200], strict=True):
            ev = {f: d.states[i][x[i]] for i, f in enumerate(d.features)}
            p = ve.query([cls], evidence=ev, show_progress=False).get_value(**{cls: spec.positive})
            assert decided == (p >= spec.threshold - TIE_TOLERANCE)


def test_posterior_is_kept_by_the_joint_route_only():
    net = random_dag(8, seed=5, floor=0.001)
    spec = random_spec(net, 5)
    joint = compile_classifier(net, spec, method="joint")
    d = joint.diagram
    X = all_inputs(d.cardinalities)
    table = enumerate_joint(net, spec.class_variable, list(d.features))
    pos = net.states[spec.class_variable].index(spec.positive)
    expected = (table[pos] / table.sum(axis=0))[tuple(X.T)]
    np.testing.assert_allclose(joint.posterior_of(X), expected, rtol=1e-9)
    records = [{f: d.states[i][x[i]] for i, f in enumerate(d.features)} for x in X[:5]]
    np.testing.assert_allclose(joint.posterior_of(records), expected[:5], rtol=1e-9)
    with pytest.raises(ValueError, match="no posterior table"):
        compile_classifier(net, spec, method="decompose").posterior_of(X)


# ---------------------------------------------------------------------------- cost model and limits
def _hidden_spec(seed: int) -> tuple[Network, ClassifierSpec]:
    """A random network whose features are separated from the class by hidden variables."""
    net = random_dag(10, seed=seed, floor=0.001)
    return net, ClassifierSpec(
        "v2", net.states["v2"][0], 0.4, features=[v for v in net.variables[-5:] if v != "v2"]
    )


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("heuristic", HEURISTICS)
def test_elimination_paths_contract_to_the_exact_joint(seed, heuristic):
    net, spec = _hidden_spec(seed)
    resolved = resolve_spec(net, spec)
    keep = [resolved.class_variable, *resolved.order]
    factors = bn_plan.relevant_factors(net, keep)
    path = elimination_path(
        [s for s, _ in factors], {v: net.card(v) for v in net.variables}, keep, heuristic
    )
    expr = bn_plan._expression(factors, keep)
    np.testing.assert_allclose(
        opt_einsum.contract(expr, *[t for _, t in factors], optimize=path),
        enumerate_joint(net, resolved.class_variable, list(resolved.order)),
        rtol=1e-9,
        atol=1e-300,
    )
    planned = bn_plan.plan_contraction(factors, keep)
    left_to_right = opt_einsum.contract_path(
        expr, *[t for _, t in factors], optimize=[(0, 1)] * (len(factors) - 1)
    )[1]
    assert planned.flops <= float(left_to_right.opt_cost)
    result = compile_classifier(net, spec, method="joint")
    assert result.estimate.route == "joint"
    assert result.summary()["estimate"]["bytes"] > 0


def test_plans_do_not_depend_on_string_hashing():
    code = (
        "from bn_synthetic import random_dag\n"
        "from boxwatch.offline.bn.classifier import ClassifierSpec, resolve_spec\n"
        "from boxwatch.offline.bn.plan import plan_joint, plan_separator\n"
        "net = random_dag(14, seed=3, floor=0.001)\n"
        "spec = resolve_spec(net, ClassifierSpec('v2', 's0', 0.4, features=list(net.variables[-6:])))\n"
        "print(plan_joint(net, spec, max_memory=1e9).contraction.path,\n"
        "      plan_separator(net, spec, max_memory=1e9).estimate)\n"
    )
    outs = outputs_under_hash_seeds(code)
    assert len(outs) == 1, outs


@pytest.mark.parametrize("seed", range(6))
def test_every_separator_cut_gives_the_joint_diagram(seed):
    net, spec = _hidden_spec(seed)
    resolved = resolve_spec(net, spec)
    joint = compile_classifier(net, resolved, method="joint")
    for k in range(1, len(resolved.order)):
        cut = bn_plan.cut_at(net, resolved, k)
        plan = bn_plan._plan_cut(net, cut, len(resolved.order), 1e12, spec=resolved)
        built = bn_compile._compile_separator(net, resolved, plan, max_memory=1e12)
        assert built.diagram == joint.diagram, k
        assert (built.ties, built.impossible) == (joint.ties, joint.impossible)


@pytest.mark.parametrize("seed", range(4))
def test_the_chosen_cut_is_the_fastest_that_fits(seed, monkeypatch):
    monkeypatch.setattr(bn_plan, "SEPARATOR_CUTS_MEASURED", 1 << 30)  # every cut that fits
    net, spec = _hidden_spec(seed)
    resolved = resolve_spec(net, spec)
    n = len(resolved.order)
    every = [
        bn_plan._plan_cut(net, bn_plan.cut_at(net, resolved, k), n, 1e12, spec=resolved).estimate
        for k in range(1, n)
    ]
    plan = bn_plan.plan_separator(net, resolved, max_memory=1e12)
    assert plan.estimate.seconds == min(e.seconds for e in every)
    tight = plan.estimate.bytes - 1  # the chosen cut no longer fits
    other = bn_plan.plan_separator(net, resolved, max_memory=tight)
    fitting = [e for e in every if e.bytes <= tight]
    if fitting:
        assert other.estimate.seconds == min(e.seconds for e in fitting)
    else:  # within the estimates' accuracy of the limit, the fastest such; or the least hungry
        assert other.estimate.bytes > tight
        near = [e for e in every if e.bytes <= bn_plan.ESTIMATE_ACCURACY * tight]
        assert other.estimate.seconds == min(e.seconds for e in near)


def test_no_route_fits_is_one_line_naming_every_estimate_and_the_limit():
    net, spec = _hidden_spec(1)
    with pytest.raises(CompileLimitError) as info:
        compile_classifier(net, spec, max_memory=1000)
    text = str(info.value)
    assert "\n" not in text
    assert "memory limit 1000 B" in text
    assert "joint: ~" in text and "decompose/separator: ~" in text
    assert isinstance(info.value, ConfigError)  # exit code 2 in the CLI
    with pytest.raises(CompileLimitError, match=r"limits .* and 1e-06 s"):
        compile_classifier(net, spec, max_seconds=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_auto_takes_the_fastest_route_within_the_limit(seed):
    net, spec = _hidden_spec(seed)
    resolved = resolve_spec(net, spec)
    joint_diagram = compile_classifier(net, spec, method="joint").diagram
    sizes = [
        bn_plan.plan_joint(net, resolved, max_memory=1e12).estimate.bytes,
        bn_plan.plan_separator(net, resolved, max_memory=1e12).estimate.bytes,
    ]
    for limit in (1e12, sum(sizes) / 2):
        options = [
            bn_plan.plan_joint(net, resolved, max_memory=limit).estimate,
            bn_plan.plan_separator(net, resolved, max_memory=limit).estimate,
        ]
        fitting = [e for e in options if e.bytes <= limit]
        result = compile_classifier(net, spec, max_memory=limit)
        assert result.method == min(fitting, key=lambda e: (e.seconds, e.bytes)).route
        assert result.estimate.bytes <= limit
        assert result.diagram == joint_diagram


def test_distinct_sub_classifiers_are_held_to_the_limit_as_they_grow():
    net, spec = _hidden_spec(2)
    resolved = resolve_spec(net, spec)
    plan = bn_plan.plan_separator(net, resolved, max_memory=1e12)
    bill = bn_plan.separator_memory(plan.cut, plan.up, plan.lo, plan.fixed, 0.0, False)
    fixed = dict(bill.phases)["prefix blocks"]  # the scan without its sub-classifiers
    with pytest.raises(CompileLimitError, match="distinct sub-classifiers"):
        # even twice the limit leaves room for the tables but not for one sub-classifier
        limit = (fixed + 1) / bn_plan.ESTIMATE_ACCURACY
        bn_compile._compile_separator(net, resolved, plan, max_memory=limit)


def test_memory_error_becomes_a_limit_error_with_the_estimate(monkeypatch):
    def exhausted(*_args, **_kw):
        raise MemoryError

    monkeypatch.setattr(bn_compile, "_compile_joint", exhausted)
    net, spec = _hidden_spec(0)
    with pytest.raises(
        CompileLimitError, match=r"out of memory during the joint route \(estimate joint: ~"
    ):
        compile_classifier(net, spec, method="joint")


def test_progress_reaches_every_prefix():
    net, spec = _hidden_spec(5)
    seen: list[tuple[int, int]] = []
    result = compile_classifier(
        net, spec, method="decompose", progress=lambda done, total: seen.append((done, total))
    )
    assert result.method == "decompose/separator"
    total = seen[-1][1]
    assert seen[-1][0] == total > 0
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


@needs_shared
@pytest.mark.shared_data
def test_hepar2_with_all_leaves_is_refused_at_once_with_the_estimate():
    net = load_network(SHARED / "hepar2.bif.gz")
    with pytest.raises(CompileLimitError) as info:
        compile_classifier(net, ClassifierSpec("PBC", "present", 0.5), max_memory=4 << 30)
    assert "3.01e+14 inputs" in str(info.value) and "memory limit 4 GiB" in str(info.value)


@needs_shared
@pytest.mark.shared_data
def test_munin1_ten_leaves_every_input_against_elimination():
    net = load_network(SHARED / "munin1.bif.gz")
    result = compile_classifier(
        net, ClassifierSpec("DIFFN_SEV", "MILD", 0.5, features=net.leaves()[:10])
    )
    d = result.diagram
    assert result.estimate is not None and result.estimate.route == result.method
    with np.errstate(invalid="ignore"):
        expected, ties = decisions(eliminate_joint(net, "DIFFN_SEV", list(d.features)), 1, 0.5)
    assert (
        np.count_nonzero(d.predict_positive(all_inputs(d.cardinalities)) != expected.reshape(-1))
        == 0
    )
    assert (result.ties, result.inputs) == (ties, 460_800)
    assert 0 < result.positives < result.inputs
