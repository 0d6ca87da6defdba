"""The jointree route: identical diagrams to the other routes, early decisions, limits, and
exactness against pgmpy on the problems of ``shared/data/bn/problems.json``."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from bn_reference import REFERENCE_CLASSIFIERS
from bn_synthetic import random_dag
from locations import SHARED_BN

from boxwatch.offline.bn import plan as bn_plan
from boxwatch.offline.bn.classifier import ClassifierSpec, resolve_spec
from boxwatch.offline.bn.compile import (
    TIE_TOLERANCE,
    JointreeStats,
    _compile_jointree,
    compile_classifier,
)
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.network import Network
from boxwatch.offline.bn.plan import CompileLimitError

SHARED = SHARED_BN
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason="needs ../shared/data/bn (absent in a plain clone)"
)


def _spec(net: Network, seed: int, *, argmax: bool = False) -> ClassifierSpec:
    rng = np.random.default_rng(seed)
    cls = net.variables[int(rng.integers(1, 4))]
    others = [v for v in net.variables if v != cls]
    feats = rng.choice(others, size=int(rng.integers(3, 7)), replace=False).tolist()
    if argmax:
        return ClassifierSpec(cls, features=feats, order=feats, decision="argmax")
    positive = net.states[cls][int(rng.integers(net.card(cls)))]
    return ClassifierSpec(
        cls, positive, float(rng.uniform(0.15, 0.85)), features=feats, order=feats
    )


def _jointree(net: Network, spec: ClassifierSpec, max_block: int, stats=None):
    resolved = resolve_spec(net, spec)
    plan = bn_plan.plan_jointree(net, resolved, max_memory=1e12, max_block=max_block)
    assert plan.largest_block <= max_block
    return _compile_jointree(net, resolved, plan, max_memory=1e12, stats=stats), plan


def _same(a, b) -> None:
    """Two compilations of one classifier: the same diagram and the same counts."""
    assert a.diagram == b.diagram
    assert (a.ties, a.impossible, a.nodes_quasi) == (b.ties, b.impossible, b.nodes_quasi)
    assert a.decided == b.decided and a.tie_pairs == b.tie_pairs


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("floor", [0.001, 0.0])
def test_every_block_size_gives_the_joint_diagram(seed, floor):
    net = random_dag(10, seed=seed, floor=floor)
    spec = _spec(net, seed)
    joint = compile_classifier(net, spec, method="joint")
    tree = compile_classifier(net, spec, method="jointree")
    assert tree.method == "jointree"
    _same(tree, joint)
    for max_block in (1, 2):
        built, plan = _jointree(net, spec, max_block)
        assert len(plan.steps) >= len(spec.order) // max_block
        assert built.diagram == joint.diagram
        assert (built.ties, built.impossible) == (joint.ties, joint.impossible)


@pytest.mark.parametrize("seed", range(12))
def test_argmax_gives_the_joint_diagram_ties_and_pairs(seed):
    net = random_dag(10, seed=seed + 50, floor=0.001 if seed % 2 else 0.0)
    spec = _spec(net, seed, argmax=True)
    joint = compile_classifier(net, spec, method="joint")
    _same(compile_classifier(net, spec, method="jointree"), joint)
    built, _ = _jointree(net, spec, 1)
    assert built.diagram == joint.diagram
    assert (built.ties, built.impossible) == (joint.ties, joint.impossible)


def _hidden_chain(seed: int, n_hidden_features: int = 6) -> Network:
    """C -> F0, F1, F2 (features) and C -> H -> X0..Xn (features behind a hidden variable)."""
    rng = np.random.default_rng(seed)
    direct = ["F0", "F1", "F2"]
    behind = [f"X{i}" for i in range(n_hidden_features)]
    variables = ("C", "H", *direct, *behind)
    states: dict[str, tuple[str, ...]] = {v: ("a", "b") for v in variables}
    states["H"] = ("h0", "h1", "h2")
    parents = {"C": (), "H": ("C",), **{f: ("C",) for f in direct}, **{f: ("H",) for f in behind}}
    cpts = {
        "C": np.array([0.4, 0.6]),
        "H": rng.dirichlet(np.ones(3), size=2) * 0.97 + 0.01,
        **{f: np.array([[0.9, 0.1], [0.15, 0.85]]) for f in direct},
        **{f: rng.dirichlet(np.ones(2), size=3) * 0.9 + 0.05 for f in behind},
    }
    return Network("chain", variables, states, parents, cpts)


@pytest.mark.parametrize("seed", range(6))
def test_partial_inputs_are_decided_early_and_the_diagram_does_not_change(seed):
    net = _hidden_chain(seed)
    spec = ClassifierSpec("C", "a", 0.5, order=["F0", "F1", "F2", *(f"X{i}" for i in range(6))])
    joint = compile_classifier(net, spec, method="joint")
    stats = JointreeStats()
    built, plan = _jointree(net, spec, 1, stats)
    assert not plan.steps[0].early and all(step.early for step in plan.steps[3:])
    assert built.diagram == joint.diagram
    assert (built.ties, built.impossible) == (joint.ties, joint.impossible)
    # once F0..F2 agree, no state of H can turn the posterior round
    assert 0 < stats.early_inputs <= joint.inputs
    assert stats.largest_block == 1


def test_distinct_messages_are_held_to_the_memory_limit():
    net = random_dag(12, seed=3, floor=0.001)
    spec = resolve_spec(net, ClassifierSpec("v2", net.states["v2"][0], 0.4))
    plan = bn_plan.plan_jointree(net, spec, max_memory=1e12, max_block=1)
    with pytest.raises(CompileLimitError, match="messages of levels"):
        _compile_jointree(net, spec, plan, max_memory=64)


def test_auto_takes_the_route_with_the_best_estimate_jointree_included():
    net = _hidden_chain(0, 10)
    spec = resolve_spec(net, ClassifierSpec("C", "a", 0.5))
    joint = compile_classifier(net, spec, method="joint")
    limit = 1.01 * bn_plan.plan_jointree(net, spec, max_memory=1e12).estimate.bytes
    estimates = [
        bn_plan.plan_jointree(net, spec, max_memory=limit).estimate,
        bn_plan.plan_separator(net, spec, max_memory=limit).estimate,
    ]
    fitting = [e for e in estimates if e.bytes <= limit]
    quick = bn_plan.plan_joint(net, spec, max_memory=limit).estimate
    if quick.bytes <= limit:  # auto takes a joint table that fits and is quick unsized
        fitting = [quick]
    result = compile_classifier(net, spec, max_memory=limit)
    assert result.method == min(fitting, key=lambda e: (e.seconds, e.bytes)).route
    assert result.diagram == joint.diagram
    forced = compile_classifier(net, spec, method="jointree", max_memory=limit)
    assert forced.method == "jointree" and forced.diagram == joint.diagram


@needs_shared
@pytest.mark.shared_data
@pytest.mark.parametrize("name", sorted(REFERENCE_CLASSIFIERS))
def test_identical_on_every_shared_network_of_the_suite(name):
    ref = REFERENCE_CLASSIFIERS[name]
    net, spec = ref.load(SHARED)
    if len(net.leaves()) > 40 and spec.features is None and ref.order is None:
        pytest.skip("past enumeration for the joint route")
    joint = compile_classifier(net, spec, method="joint", max_memory=4 << 30)
    _same(compile_classifier(net, spec, method="jointree", max_memory=4 << 30), joint)


def _problems() -> list[dict]:
    return json.loads((SHARED / "problems.json").read_text()) if SHARED.is_dir() else []


@pytest.mark.slow
@needs_shared
@pytest.mark.shared_data
def test_cpcs54_problem_against_a_second_route_and_pgmpy():
    """The problems.json case small enough for a test: the positive count of the joint
    route and 1,000 random inputs against pgmpy's exact joint ``P(C, X)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgmpy.inference import VariableElimination
    problem = next(p for p in _problems() if p["network"] == "cpcs54.uai.gz")
    net = load_network(SHARED / problem["network"])
    spec = ClassifierSpec(
        problem["class"], problem["positive"], problem["threshold"], features=problem["features"]
    )
    tree = compile_classifier(net, spec, method="jointree")
    joint = compile_classifier(net, spec, method="joint")
    _same(tree, joint)
    assert tree.positives == joint.positives
    d = tree.diagram
    X = np.random.default_rng(0).integers(0, d.cardinalities, size=(1000, d.n_features))
    cls = spec.class_variable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ve = VariableElimination(net.to_pgmpy())
        q = ve.query([cls, *d.features], joint=True, show_progress=False)
    table = np.moveaxis(
        q.values, [q.variables.index(v) for v in (cls, *d.features)], range(d.n_features + 1)
    )
    pos = net.states[cls].index(spec.positive)
    post = table[pos][tuple(X.T)] / table.sum(axis=0)[tuple(X.T)]
    expected = post >= spec.threshold - TIE_TOLERANCE
    assert np.count_nonzero(d.predict_positive(X) != expected) == 0
