"""The separator route's split: a minimum vertex cut of the moral graph, checked by brute force."""

from __future__ import annotations

import itertools
import math

import pytest
from bn_synthetic import random_dag
from locations import SHARED_BN

from boxwatch.offline.bn import compile as bn_compile
from boxwatch.offline.bn import plan as bn_plan
from boxwatch.offline.bn.classifier import ClassifierSpec, resolve_spec
from boxwatch.offline.bn.compile import compile_classifier
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.network import Network
from boxwatch.offline.bn.separator import prefix_side

SHARED = SHARED_BN


def _spec(seed: int, n: int = 11, features: int = 6, max_card: int = 3):
    net = random_dag(n, seed=seed, floor=0.001, max_card=max_card)
    feats = [v for v in net.variables[-features:] if v != "v1"]
    return net, resolve_spec(net, ClassifierSpec("v1", net.states["v1"][0], 0.4, features=feats))


def _separates(scopes, cls, prefix, suffix, cut) -> bool:
    """Whether removing ``cut`` (and the class) leaves no path from prefix to suffix."""
    adjacent: dict[str, set[str]] = {}
    for scope in scopes:
        for a in scope:
            adjacent.setdefault(a, set()).update(scope)
    seen, stack = set(), [f for f in prefix if f not in cut]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        stack.extend(w for w in adjacent[v] if w != cls and w not in cut)
    return not seen.intersection(suffix)


def _weight(net: Network, cut, prefix, suffix) -> float:
    completions = math.log(math.prod(net.card(f) for f in suffix))
    return sum(math.log(net.card(v)) + (completions if v in prefix else 0.0) for v in cut)


@pytest.mark.parametrize("seed", range(16))
def test_the_cut_is_a_minimum_weight_separator(seed):
    net, spec = _spec(seed, n=12, features=5, max_card=6)
    cls, order = spec.class_variable, list(spec.order)
    scopes = [s for s, _ in bn_plan.relevant_factors(net, [cls, *order])]
    names = sorted({v for s in scopes for v in s} - {cls})
    for k in range(1, len(order)):
        prefix, suffix = order[:k], order[k:]
        side, cut = prefix_side(net, scopes, cls, prefix, suffix)
        assert _separates(scopes, cls, prefix, suffix, cut), k
        assert not cut.intersection(suffix) and not side.intersection(suffix)
        # every CPT lies on one side: within side | cut, or away from side
        for scope in scopes:
            rest = set(scope) - {cls}
            assert rest <= side | cut or not rest.intersection(side), (k, scope)
        candidates = [v for v in names if v not in suffix]
        best = min(
            _weight(net, c, prefix, suffix)
            for r in range(len(candidates) + 1)
            for c in itertools.combinations(candidates, r)
            if _separates(scopes, cls, prefix, suffix, set(c))
        )
        assert _weight(net, cut, prefix, suffix) == pytest.approx(best, abs=1e-4), k


@pytest.mark.parametrize("seed", range(8))
def test_each_cut_of_a_larger_network_decides_as_the_joint_table(seed):
    net, spec = _spec(seed, n=13, features=7)
    joint = compile_classifier(net, spec, method="joint")
    for k in range(1, len(spec.order)):
        cut = bn_plan.cut_at(net, spec, k)
        plan = bn_plan._plan_cut(net, cut, len(spec.order), 1e12)
        built = bn_compile._compile_separator(net, spec, plan, max_memory=1e12)
        assert built.diagram == joint.diagram, k
        assert built.ties == joint.ties, k


@pytest.mark.shared_data
def test_hepar2_cuts_share_fewer_states_than_splitting_at_the_suffix_cpts():
    if not (SHARED / "hepar2.bif.gz").is_file():
        pytest.skip("../shared/data/bn/hepar2.bif.gz is absent")
    net = load_network(SHARED / "hepar2.bif.gz")
    spec = resolve_spec(net, ClassifierSpec("PBC", "present", 0.5))
    order = list(spec.order)
    factors = bn_plan.relevant_factors(net, ["PBC", *order])
    for k in range(1, len(order)):
        suffix = set(order[k:])
        lower = {v for scope, _ in factors if suffix.intersection(scope) for v in scope}
        upper = {v for scope, _ in factors if not suffix.intersection(scope) for v in scope}
        naive = math.prod(net.card(v) for v in (lower & upper) - set(order))
        cut = bn_plan.cut_at(net, spec, k)
        assert cut.shared_states <= naive, k
        if k == 24:  # the old split's best cut: 96 shared states
            assert naive >= 96 and cut.shared_states * 4 <= naive
