"""The default feature order: depth-first, or the frontier order where its cuts are cheaper."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from bn_synthetic import chain_tan, qmr

from boxwatch.offline.bn.classifier import (
    ClassifierSpec,
    cut_cost,
    default_order,
    dfs_order,
    frontier_order,
    resolve_spec,
)
from boxwatch.offline.bn.compile import compile_classifier

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


def test_the_default_order_does_not_depend_on_string_hashing():
    code = (
        "from bn_synthetic import qmr\n"
        "from boxwatch.offline.bn.classifier import default_order, frontier_order\n"
        "feats = [f'f{i}' for i in range(12)]\n"
        "for seed in range(8):\n"
        "    net = qmr(8, 12, seed=seed)\n"
        "    print(default_order(net, 'C', feats), frontier_order(net, 'C', feats))\n"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(Path(__file__).parent)},
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outs) == 1, outs
