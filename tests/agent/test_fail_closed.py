"""A NaN or infinite activation or score never means accept (fail closed)."""

from __future__ import annotations

import numpy as np
import pytest

from boxwatch.agent.boxes import ACCEPT, REJECT, BoxRuntime, BoxSet


@pytest.fixture(scope="module")
def runtime(example):
    return example.runtime()


def _wide_open_runtime(combine: str) -> BoxRuntime:
    """One layer whose good box holds every finite point: only non-finite values can fail."""
    big = np.float32(1e38)
    good = BoxSet.from_boxes([(np.full((1, 2), -big), np.full((1, 2), big))] * 2, 2)
    empty = BoxSet.from_boxes([(np.zeros((0, 2)), np.zeros((0, 2)))] * 2, 2)
    return BoxRuntime(
        layers=["a"],
        n_classes=2,
        good={"a": good},
        bad={"a": empty},
        normalize="none",
        combine=combine,
        score_layers=["a"],
        threshold=0.5,
    )


@pytest.mark.parametrize("combine", ["any", "majority", "all", "calibrated"])
def test_non_finite_activations_are_rejected_by_every_rule(combine):
    rt = _wide_open_runtime(combine)
    acts = np.array(
        [[0.0, 1.0], [np.nan, 0.0], [np.inf, 0.0], [-np.inf, 1.0], [2.0, 2.0]], dtype=np.float32
    )
    combined, per_layer, scores = rt.assess({"a": acts}, np.zeros(5, dtype=int))
    assert combined.tolist() == [ACCEPT, REJECT, REJECT, REJECT, ACCEPT]
    assert per_layer["a"].tolist() == [ACCEPT, REJECT, REJECT, REJECT, ACCEPT]


def test_decide_never_accepts_a_non_finite_score():
    rt = _wide_open_runtime("calibrated")
    scores = np.array([0.0, 0.5, 0.6, np.nan, np.inf, -np.inf])
    assert rt.decide(scores).tolist() == [True, True, False, False, False, False]


@pytest.mark.parametrize("value", [1e300, -1e300, 1e39, 3.4e38])
def test_finite_inputs_that_overflow_the_model_are_rejected(runtime, value):
    x = np.full((3, runtime.preprocessing.size), value)
    res = runtime.run_model(x)
    assert res.verdicts.tolist() == [REJECT] * 3
    assert all(v.tolist() == [REJECT] * 3 for v in res.layer_verdicts.values())
    # 3.4e38 stays finite in float32 and in the model: rejected on its score, and outside
    # the training range; the others overflow (not_finite, nothing left to point at).
    want = "out_of_range" if value == 3.4e38 else "not_finite"
    assert res.reasons.names().tolist() == [want] * 3
    if want == "not_finite":
        assert res.reasons.layers() == [None] * 3 and res.reasons.nearest.tolist() == [-1] * 3
    if runtime.boxes.threshold is not None:
        assert not res.accepted.any()


def test_the_guard_leaves_finite_batches_alone(runtime):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, runtime.preprocessing.size))
    res = runtime.run_model(x)
    logits, acts = runtime.tap.run(runtime.preprocessing.apply(x))
    combined, per_layer, _ = runtime.boxes.assess(
        acts, np.asarray(logits).argmax(axis=1), logits=logits
    )
    np.testing.assert_array_equal(res.verdicts, combined)
    if runtime.boxes.threshold is None:
        assert res.accepted is None
    else:
        np.testing.assert_array_equal(res.accepted, runtime.boxes.decide(res.scores))
    mixed = runtime.run_model(np.concatenate([x[:4], np.full((1, x.shape[1]), 1e300)]))
    np.testing.assert_array_equal(mixed.verdicts[:4], combined[:4])
    assert mixed.verdicts[4] == REJECT
