"""The default feature order: depth-first, or the frontier order where its cuts are cheaper."""

from __future__ import annotations

import pytest
from bn_synthetic import chain_tan, qmr
from deadlines import Countdown
from determinism import outputs_under_hash_seeds

from boxwatch.offline.bn import classifier as classifier_module
from boxwatch.offline.bn import compile as bn_compile
from boxwatch.offline.bn import plan as bn_plan
from boxwatch.offline.bn.classifier import (
    ClassifierSpec,
    cut_cost,
    default_order,
    dfs_order,
    frontier_order,
    resolve_spec,
)
from boxwatch.offline.bn.compile import compile_classifier
from boxwatch.offline.bn.limits import CompileTimeError
from boxwatch.offline.bn.network import Network

FEATURES = [f"f{i}" for i in range(12)]


def test_frontier_order_is_taken_where_depth_first_strands_shared_roots():
    net = qmr(8, 12, seed=2)
    dfs, frontier = dfs_order(net, "C", FEATURES), frontier_order(net, "C", FEATURES)
    assert cut_cost(net, "C", frontier) < cut_cost(net, "C", dfs)  # 56 against 304 states
    assert default_order(net, "C", FEATURES) == frontier
    assert resolve_spec(net, ClassifierSpec("C", "pos", 0.5, features=FEATURES)).order == frontier
    # the class's children come first: after them no CPT past the cut mentions the class
    assert set(frontier[:2]) == {"f0", "f1"}


@pytest.mark.parametrize(("seed", "n_roots", "n_features"), [(0, 6, 10), (6, 6, 10), (6, 8, 12)])
def test_depth_first_order_is_kept_unless_the_frontier_order_is_cheaper(seed, n_roots, n_features):
    net = qmr(n_roots, n_features, seed=seed)
    feats = FEATURES[:n_features]
    dfs, frontier = dfs_order(net, "C", feats), frontier_order(net, "C", feats)
    assert frontier != dfs
    assert cut_cost(net, "C", frontier) >= cut_cost(net, "C", dfs)  # a tie or worse
    assert default_order(net, "C", feats) == dfs


def test_without_hidden_variables_the_depth_first_order_stands():
    tan = chain_tan(6, seed=0)
    feats = ["x5", "x3", "x0", "x1", "x4", "x2"]
    assert default_order(tan, "C", feats) == dfs_order(tan, "C", feats)
    assert default_order(tan, "C", feats) == ("x0", "x1", "x2", "x3", "x4", "x5")


@pytest.mark.parametrize("seed", [1, 2, 5])
def test_both_orders_give_the_same_classifier_by_every_route(seed):
    net = qmr(8, 12, seed=seed)
    t = float(net.cpts["C"][1])  # the prior: some inputs above it, some below
    spec = ClassifierSpec("C", "pos", t, features=FEATURES)
    results = {}
    for name, order in (
        ("dfs", dfs_order(net, "C", FEATURES)),
        ("frontier", frontier_order(net, "C", FEATURES)),
    ):
        ordered = ClassifierSpec("C", "pos", t, features=FEATURES, order=order)
        by_route = {m: compile_classifier(net, ordered, method=m) for m in ("joint", "decompose")}
        assert by_route["joint"].diagram == by_route["decompose"].diagram
        results[name] = by_route["joint"]
    assert results["dfs"].positives == results["frontier"].positives
    assert 0 < results["dfs"].positives < results["dfs"].inputs
    assert compile_classifier(net, spec).positives == results["dfs"].positives


@pytest.mark.slow
def test_the_default_order_does_not_depend_on_string_hashing():
    code = (
        "from bn_synthetic import qmr\n"
        "from boxwatch.offline.bn.classifier import default_order, frontier_order\n"
        "feats = [f'f{i}' for i in range(12)]\n"
        "for seed in range(8):\n"
        "    net = qmr(8, 12, seed=seed)\n"
        "    print(default_order(net, 'C', feats), frontier_order(net, 'C', feats))\n"
    )
    outs = outputs_under_hash_seeds(code)
    assert len(outs) == 1, outs


def _qmr_with_zeros(seed: int) -> Network:
    """``qmr(8, 12)`` with some CPT rows of later features deterministic (0 and 1): ``f7 = 1``
    is impossible (so are half the inputs), and some completions of a prefix are."""
    net = qmr(8, 12, seed=seed)
    cpts = dict(net.cpts)
    never = cpts["f7"].copy()
    never[...] = [1.0, 0.0]
    cpts["f7"] = never
    for f in ("f9", "f11"):
        table = cpts[f].copy()
        table[(0,) * (table.ndim - 1)] = [1.0, 0.0]
        cpts[f] = table
    return Network(net.name, net.variables, net.states, net.parents, cpts, net.source)


@pytest.mark.parametrize(
    ("make", "seed"), [(qmr, 1), (qmr, 2), (qmr, 5), (_qmr_with_zeros, 2), (_qmr_with_zeros, 4)]
)
@pytest.mark.parametrize("shift", [-0.2, 0.0, 0.2])
def test_prefixes_settled_from_the_prefix_message_give_the_joint_diagram(make, seed, shift):
    net = qmr(8, 12, seed=seed) if make is qmr else make(seed)
    t = min(0.95, max(0.05, float(net.cpts["C"][1]) + shift))
    spec = resolve_spec(net, ClassifierSpec("C", "pos", t, features=FEATURES))
    joint = compile_classifier(net, spec, method="joint")
    settled = 0
    for k in range(2, len(spec.order)):  # past the class's children: the lower side is class-free
        cut = bn_plan.cut_at(net, spec, k)
        assert all("C" not in scope for scope, _ in cut.lower)
        plan = bn_plan._plan_cut(net, cut, 12, 1e12, spec=spec)
        built = bn_compile._compile_separator(net, spec, plan, max_memory=1e12)
        assert built.diagram == joint.diagram, k
        assert (built.ties, built.impossible) == (joint.ties, joint.impossible), k
        settled += built.early_inputs
    assert settled > 0  # the shortcut was taken
    if make is _qmr_with_zeros:
        assert joint.impossible > 0


def test_no_prefix_is_settled_while_the_lower_side_mentions_the_class():
    net = qmr(8, 12, seed=2)
    order = ["f3", "f0", *[f for f in FEATURES if f not in ("f0", "f3")]]  # f1 after the cut
    spec = resolve_spec(net, ClassifierSpec("C", "pos", 0.5, features=FEATURES, order=order))
    cut = bn_plan.cut_at(net, spec, 2)
    assert any("C" in scope for scope, _ in cut.lower)
    plan = bn_plan._plan_cut(net, cut, 12, 1e12, spec=spec)
    built = bn_compile._compile_separator(net, spec, plan, max_memory=1e12)
    assert built.early_inputs == 0
    assert built.diagram == compile_classifier(net, spec, method="joint").diagram


def test_past_the_inputs_no_route_can_finish_the_frontier_order_is_not_searched(monkeypatch):
    """2**70 inputs: the depth-first order, without the quadratic search (which took minutes
    on thousands of features sharing a hidden root)."""
    net = qmr(8, 70, seed=2)
    feats = [f"f{i}" for i in range(70)]

    def never(*_args, **_kwargs):
        raise AssertionError("the frontier order was searched")

    monkeypatch.setattr(classifier_module, "frontier_order", never)
    assert default_order(net, "C", feats) == dfs_order(net, "C", feats)


def test_choosing_the_order_stops_at_the_deadline():
    net = qmr(8, 12, seed=2)
    spec = ClassifierSpec("C", "pos", 0.5, features=FEATURES)
    with pytest.raises(CompileTimeError, match="the frontier order"):
        resolve_spec(net, spec, deadline=Countdown(2))
