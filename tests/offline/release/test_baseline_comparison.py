"""Issue 38: the build compares every baseline with the emitted verdicts at a matched point.

Each baseline's threshold accepts as many correctly classified known inputs of the point's
set as the emitted verdicts do (``accept`` only); the shares of misclassified and unknown
inputs it accepts there, its AUROC and its ranking of the model's mistakes are counted on
small hand-made sets, and the score histogram keeps every series apart.
"""

from __future__ import annotations

import numpy as np
import pytest

from boxwatch.agent.boxes import ACCEPT, REJECT, UNCERTAIN
from boxwatch.agent.runtime import ModelResult
from boxwatch.offline.monitors.evaluation import aurc, auroc
from boxwatch.offline.release import emitted
from boxwatch.offline.release.emitted import BOX_METHOD, Method, SetVerdicts


def _set(
    name: str,
    verdicts: list[int] | np.ndarray,
    *,
    y: np.ndarray | None = None,
    predicted: np.ndarray | None = None,
    logits: np.ndarray | None = None,
    scores: np.ndarray | None = None,
    acts: dict[str, np.ndarray] | None = None,
) -> SetVerdicts:
    """One data set as the comparison reads it (labels None: an unknown set)."""
    v = np.asarray(verdicts, dtype=np.int8)
    n = len(v)
    result = ModelResult(
        predicted=np.zeros(n, np.int64) if predicted is None else predicted,
        verdicts=v,
        layer_verdicts={},
        scores=np.arange(n, dtype=np.float64) if scores is None else scores,
        inference_seconds=0.0,
        monitor_seconds=0.0,
    )
    return SetVerdicts(name, y, result, np.zeros((n, 2)) if logits is None else logits, acts or {})


def _fixed(scores: dict[str, np.ndarray]) -> Method:
    """A baseline whose scores are given per set."""
    return Method("msp", lambda data: scores[data.name])


@pytest.fixture
def hand_made():
    """Six correct test inputs (four accepted: one uncertainty, one reject do not count),
    four misclassified ones and an unknown set, with a baseline's scores on each."""
    y = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    verdicts = [ACCEPT, ACCEPT, UNCERTAIN, ACCEPT, REJECT, ACCEPT]
    verdicts += [ACCEPT, UNCERTAIN, REJECT, REJECT]
    error_score = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.05, 0.7, 0.8, 0.9])
    test = _set(
        "test",
        verdicts,
        y=y,
        logits=np.stack([error_score, np.zeros(10)], axis=1),
        scores=np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], dtype=np.float64),
    )
    far = _set("far", [UNCERTAIN, REJECT, ACCEPT, REJECT], scores=np.array([10.0, 11, 12, 13]))
    baseline = {
        "test": np.array([1.0, 2, 3, 4, 5, 6, 0.5, 3.5, 4.0, 7]),
        "far": np.array([3.0, 5, 9, 10]),
    }
    compared = emitted.comparison("test", test, [far], [_fixed(baseline)], lambda d: d.logits[:, 0])
    return compared, baseline, error_score


def test_the_baseline_accepts_as_many_correct_inputs_as_the_emitted_verdicts(hand_made):
    compared, _baseline, _error = hand_made
    box, msp = compared.rows
    assert compared.point == "test" and compared.set == "test"
    assert (compared.n_correct, compared.n_misclassified) == (6, 4)
    assert box.method == BOX_METHOD and msp.method == "msp"
    assert compared.accepted_share == box.correct_known == 4 / 6
    assert msp.threshold == 4.0  # the 4th lowest correct score: 1, 2, 3, 4 accepted
    assert msp.correct_known == 4 / 6


def test_misclassified_and_unknown_accepted_are_counted_at_that_threshold(hand_made):
    compared, _baseline, _error = hand_made
    box, msp = compared.rows
    assert box.misclassified_known == 1 / 4  # accept, uncertainty, reject, reject
    assert msp.misclassified_known == 3 / 4  # 0.5, 3.5 and 4.0 <= 4; not 7
    assert box.unknown == {"far": 1 / 4}
    assert msp.unknown == {"far": 1 / 4}  # 3 <= 4


def test_rankings_use_each_methods_score_and_the_monitors_error_score(hand_made):
    compared, baseline, error_score = hand_made
    box, msp = compared.rows
    right = np.arange(10) < 6
    assert box.auroc == {"far": 1.0}  # box scores 0-9 against 10-13
    assert msp.auroc == {"far": pytest.approx(auroc(baseline["test"], baseline["far"]))}
    assert box.error_auroc == pytest.approx(auroc(error_score[right], error_score[~right]))
    assert box.aurc == pytest.approx(aurc(error_score, ~right))
    assert msp.error_auroc == pytest.approx(
        auroc(baseline["test"][right], baseline["test"][~right])
    )
    assert msp.aurc == pytest.approx(aurc(baseline["test"], ~right))


def test_on_continuous_scores_every_baseline_matches_within_one_input():
    rng = np.random.default_rng(3)
    n, n_classes = 400, 4
    logits = rng.normal(scale=3.0, size=(n, n_classes))
    predicted = logits.argmax(1)
    y = np.where(rng.random(n) < 0.85, predicted, (predicted + 1) % n_classes)
    verdicts = rng.choice([ACCEPT, UNCERTAIN, REJECT], size=n, p=[0.85, 0.05, 0.1])
    feats = rng.normal(size=(n, 8)) + y[:, None]
    data = _set("test", verdicts, y=y, predicted=predicted, logits=logits, acts={"fc": feats})
    train_y = np.arange(300) % n_classes
    train = ({"fc": rng.normal(size=(300, 8)) + train_y[:, None]}, train_y)
    features, skipped = emitted.feature_methods(train, ({"fc": feats}, y), random_state=0)
    assert skipped == {} and [m.name for m in features] == ["knn", "mahalanobis"]
    compared = emitted.comparison(
        "test", data, [], [*emitted.logit_methods(), *features], lambda d: -d.logits.max(1)
    )
    right = predicted == y
    accepted = int(np.sum(verdicts[right] == ACCEPT))
    assert [r.method for r in compared.rows] == [BOX_METHOD, "msp", "energy", "knn", "mahalanobis"]
    for row in compared.rows:
        assert row.correct_known is not None
        assert abs(row.correct_known * right.sum() - accepted) <= 1, row.method
    assert [r.layer for r in compared.rows[3:]] == ["fc", "fc"]


def test_feature_baselines_too_big_for_the_training_set_are_said_not_computed():
    rng = np.random.default_rng(0)
    y = np.arange(40) % 2
    acts = {"fc": rng.normal(size=(40, 4)) + y[:, None]}
    methods, skipped = emitted.feature_methods((acts, y), (acts, y))
    assert [m.name for m in methods] == ["mahalanobis"]
    assert "k=50" in skipped["knn"]
    wide = {"wide": np.zeros((40, emitted.MAX_BASELINE_FEATURES + 1))}
    methods, skipped = emitted.feature_methods((wide, y), (wide, y))
    assert methods == [] and set(skipped) == {"knn", "mahalanobis"}


def test_the_score_histogram_keeps_each_series_apart():
    y = np.array([0, 0, 0, 1])
    data = _set("validation", [ACCEPT] * 4, y=y, scores=np.array([0.0, 1.0, np.nan, 2.0]))
    far = _set("far", [REJECT] * 3, scores=np.array([5.0, 6.0, np.inf]))
    hist = emitted.score_histogram(data, [far])
    assert hist.set == "validation"
    assert sum(hist.correct_known) == 3 and sum(hist.misclassified_known) == 1
    assert list(hist.unknown) == ["far"] and sum(hist.unknown["far"]) == 3
    assert hist.correct_known[-1] == 1 and hist.unknown["far"][-1] >= 1  # NaN, inf: last bin
    assert len(hist.edges) == emitted.HISTOGRAM_BINS + 1
