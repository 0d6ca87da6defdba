"""Estimates that measure: the separator route's memory bill against what it allocates, the
share of prefixes decided early against the share it decides, the refusal rule; and the one
reading of rows that do not sum to 1 (row sums, the verifier's masses)."""

from __future__ import annotations

import itertools
import tracemalloc
from fractions import Fraction

import numpy as np
import opt_einsum
import pytest
from bn_synthetic import qmr

from boxwatch.offline.bn import compile as bn_compile
from boxwatch.offline.bn import plan as bn_plan
from boxwatch.offline.bn.classifier import ClassifierSpec, resolve_spec
from boxwatch.offline.bn.compile import compile_classifier
from boxwatch.offline.bn.network import ROW_WARN_TOLERANCE, Network
from boxwatch.offline.bn.plan import CompileLimitError
from boxwatch.offline.bn.verify import FeatureMarginal

FEATURES = [f"f{i}" for i in range(22)]


def _qmr_spec(threshold: float = 0.5):
    """A QMR-like network (class, 9 hidden roots, 22 feature leaves: 4M inputs)."""
    net = qmr(9, 22, seed=4)
    return net, resolve_spec(net, ClassifierSpec("C", "pos", threshold, features=FEATURES))


def _traced_peak(run) -> int:
    """Bytes ``run()`` holds at most (tracemalloc sees numpy's buffers too)."""
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("k", [6, 11, 16])
def test_the_separator_estimate_is_within_its_accuracy_of_what_the_route_allocates(k):
    net, spec = _qmr_spec()
    plan = bn_plan._plan_cut(net, bn_plan.cut_at(net, spec, k), len(spec.order), 1e12, spec=spec)
    peak = _traced_peak(lambda: bn_compile._compile_separator(net, spec, plan, max_memory=1e12))
    assert peak > 8 << 20  # large enough for the arrays to be what counts
    ratio = plan.estimate.bytes / peak
    assert 1 / bn_plan.ESTIMATE_ACCURACY <= ratio <= bn_plan.ESTIMATE_ACCURACY, (k, ratio)


def test_a_contraction_holds_at_most_its_planned_peak():
    rng = np.random.default_rng(0)
    names = "abcdefghij"
    factors = []
    for _ in range(12):
        scope = tuple(sorted(rng.choice(list(names), size=3, replace=False).tolist()))
        factors.append((scope, rng.random((8, 8, 8))))
    out = list("abcdef")
    plan = bn_plan.plan_contraction(factors, out)
    peak = _traced_peak(lambda: plan.run(factors))
    assert plan.peak_cells >= 8**6  # the output is counted
    assert 0.5 <= 8 * plan.peak_cells / peak <= 1.5


def test_the_sampled_share_decided_early_is_the_share_the_route_decides():
    net, spec = _qmr_spec(0.3)
    plan = bn_plan.plan_separator(net, spec, max_memory=1e12)
    assert plan.cut.class_free and plan.settled > 0.1
    built = bn_compile._compile_separator(net, spec, plan, max_memory=1e12)
    share = built.early_inputs / (plan.cut.n_pre * plan.cut.n_suf)
    assert abs(plan.settled - share) < 0.1
    # the time estimate counts only the prefixes not decided early
    blind = bn_plan._separator_estimate(
        plan.cut, plan.up, plan.lo, len(spec.order), fixed=plan.fixed, settled=0.0
    )[0]
    assert plan.estimate.seconds < blind.seconds


def test_a_route_is_refused_only_past_the_accuracy_of_its_estimate():
    net, spec = _qmr_spec()
    n = len(spec.order)
    least = min(
        bn_plan._plan_cut(net, bn_plan.cut_at(net, spec, k), n, 1e12, spec=spec).estimate.bytes
        for k in range(1, n)
    )
    # no cut fits, but the best is within the estimates' accuracy of the limit: it runs
    result = compile_classifier(net, spec, method="decompose", max_memory=least / 1.5)
    assert result.method == "decompose/separator" and result.estimate.bytes > least / 1.5
    assert result.diagram == compile_classifier(net, spec, method="joint").diagram
    limit = least / (bn_plan.ESTIMATE_ACCURACY * 1.1)
    with pytest.raises(CompileLimitError, match="no route fits") as info:
        compile_classifier(net, spec, method="decompose", max_memory=limit)
    assert f"{bn_plan.ESTIMATE_ACCURACY:g}x in memory" in str(info.value)


# ---------------------------------------------------------------------------- the reading
def _off_network() -> Network:
    """C -> H -> F, H -> B (B barren); rows of H and B off 1, B's unequally."""
    states = {"C": ("n", "p"), "H": ("h0", "h1"), "F": ("f0", "f1"), "B": ("b0", "b1")}
    parents = {"C": (), "H": ("C",), "F": ("H",), "B": ("H",)}
    cpts = {
        "C": np.array([0.4, 0.6]),
        "H": np.array([[0.3, 0.7], [0.2, 0.8003]]),
        "F": np.array([[0.9, 0.1], [0.25, 0.75]]),
        "B": np.array([[0.5, 0.5004], [0.1, 0.8999]]),
    }
    return Network("off", ("C", "H", "F", "B"), states, parents, cpts)


def test_row_sums_are_exact_and_warn_past_the_tolerance():
    net = _off_network()
    sums = net.row_sums
    assert (sums.rows, sums.variable) == (3, "B")
    assert sums.largest == pytest.approx(4e-4, rel=1e-9)
    assert sums.largest > ROW_WARN_TOLERANCE and "'B'" in (sums.warning() or "")
    read = net.renormalised
    assert read.row_sums.rows == 0
    for v in net.variables:
        np.testing.assert_allclose(read.cpts[v].sum(axis=-1), 1.0, rtol=0, atol=1e-15)
    # one rounding from the exact quotient, as a number read from a file
    ints, scale = read.scaled_cpt("H")
    assert read.exact_cpt("H")[1, 1] == Fraction(int(ints[1, 1]), scale) == Fraction(8003, 10003)
    assert float(read.exact_cpt("H")[1, 1]) == read.cpts["H"][1, 1]
    exact = net.renormalised.renormalised
    assert exact is net.renormalised  # nothing left to divide


def test_the_verifier_masses_are_those_of_the_renormalised_network():
    net = _off_network()
    marginal = FeatureMarginal(net, ["F"], [net.states["F"]])
    read = net.renormalised
    for f in range(2):
        want = sum(
            read.cpts["C"][c] * read.cpts["H"][c, h] * read.cpts["F"][h, f] * read.cpts["B"][h, b]
            for c, h, b in itertools.product(range(2), repeat=3)
        )
        assert marginal.mass([np.array([f])]) == pytest.approx(want, rel=1e-12)
    assert marginal.mass([np.array([0, 1])]) == pytest.approx(1.0, rel=1e-12)


def test_sampled_factors_give_one_batch_axis():
    rng = np.random.default_rng(1)
    table = rng.random((2, 3, 4))
    rows = {"a": np.array([0, 1, 1]), "c": np.array([3, 0, 2])}
    ((scope, got),) = bn_plan.sampled([(("a", "b", "c"), table)], rows)
    assert scope == (bn_plan.BATCH, "b")
    np.testing.assert_array_equal(got, table[[0, 1, 1], :, [3, 0, 2]])
    expr = "ab,b->a"
    assert opt_einsum.contract(expr, got, np.ones(3)).shape == (3,)
