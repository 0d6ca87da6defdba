"""The baseline table: each score against a naive reference on small data, every entry
described, a feature baseline's layer choice, and the release build's baselines following
the table."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logsumexp, softmax

from boxwatch.offline.monitors.baselines import (
    BASELINES,
    KNN,
    NEEDS,
    Mahalanobis,
    OnFeatures,
    OnLogits,
    OnPenultimate,
    ReAct,
    fit_on_best_layer,
    held_out_class_auroc,
)
from boxwatch.offline.monitors.evaluation import auroc
from boxwatch.offline.release import emitted


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _features(
    rng: np.random.Generator, n: int, d: int = 6, n_classes: int = 3
) -> tuple[np.ndarray, np.ndarray]:
    """Clustered non-negative features (like ReLU outputs) and their classes."""
    y = np.arange(n) % n_classes
    centres = rng.normal(scale=2.0, size=(n_classes, d))
    return np.abs(centres[y] + rng.normal(size=(n, d))).astype(np.float32), y


def _on_logits(name: str) -> OnLogits:
    baseline = BASELINES[name]
    assert isinstance(baseline, OnLogits)
    return baseline


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True)


def test_msp_is_minus_the_top_softmax_probability(rng):
    logits = rng.normal(scale=5.0, size=(40, 4)).astype(np.float32)
    expected = -softmax(logits.astype(np.float64), axis=1).max(axis=1)
    np.testing.assert_allclose(_on_logits("msp").score(logits), expected, rtol=0, atol=1e-12)


def test_energy_is_minus_logsumexp(rng):
    logits = rng.normal(scale=5.0, size=(40, 4)).astype(np.float32)
    expected = -logsumexp(logits.astype(np.float64), axis=1)
    np.testing.assert_allclose(_on_logits("energy").score(logits), expected, rtol=0, atol=1e-12)


def test_knn_is_minus_the_kth_largest_cosine_similarity(rng):
    train, y = _features(rng, 30)
    query, _ = _features(rng, 7)
    k = 5
    sims = _unit(query) @ _unit(train).T
    expected = -np.sort(sims, axis=1)[:, ::-1][:, k - 1]  # brute force: sort every distance
    np.testing.assert_allclose(KNN(train, y, k=k).score(query), expected, atol=1e-6)


def test_knn_without_a_class_searches_the_other_classes_only(rng):
    train, y = _features(rng, 30)
    query, yq = _features(rng, 9)
    k = 4
    expected = [
        -np.sort(_unit(q[None]) @ _unit(train[y != c]).T, axis=1)[0, ::-1][k - 1]
        for q, c in zip(query, yq, strict=True)
    ]
    got = KNN(train, y, k=k).score_without(query, yq)
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_knn_scores_more_than_2000_queries_in_chunks(rng):
    train, y = _features(rng, 60)
    query, _ = _features(rng, 2100)
    knn = KNN(train, y, k=3)
    np.testing.assert_array_equal(knn.score(query)[2000:], knn.score(query[2000:]))


def test_knn_refuses_more_neighbours_than_training_rows(rng):
    train, y = _features(rng, 10)
    with pytest.raises(ValueError, match="k=50 should be >= 1 and <= n_samples=10"):
        KNN(train, y)


def _naive_mahalanobis(train: np.ndarray, y: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Per-class squared distances through an explicitly inverted shared covariance."""
    x = train.astype(np.float64)
    classes = range(int(y.max()) + 1)
    means = [x[y == c].mean(axis=0) for c in classes]
    cov = sum(np.outer(r - means[c], r - means[c]) for r, c in zip(x, y, strict=True)) / len(x)
    precision = np.linalg.inv(cov + 1e-6 * np.eye(x.shape[1]))
    return np.array([[(v - m) @ precision @ (v - m) for m in means] for v in q.astype(np.float64)])


def test_mahalanobis_is_the_distance_to_the_nearest_class_mean(rng):
    train, y = _features(rng, 45)
    query, _ = _features(rng, 8)
    expected = _naive_mahalanobis(train, y, query).min(axis=1)
    np.testing.assert_allclose(Mahalanobis(train, y).score(query), expected, rtol=1e-9)


def test_mahalanobis_without_a_class_takes_the_nearest_other_mean(rng):
    train, y = _features(rng, 45)
    query, yq = _features(rng, 8)
    d = _naive_mahalanobis(train, y, query)
    expected = [min(np.delete(row, c)) for row, c in zip(d, yq, strict=True)]
    got = Mahalanobis(train, y).score_without(query, yq)
    np.testing.assert_allclose(got, expected, rtol=1e-9)


def test_mahalanobis_refuses_a_class_without_training_rows(rng):
    train, _ = _features(rng, 6)
    with pytest.raises(ValueError, match=r"classes \[1\] of 0..2 have no training row"):
        Mahalanobis(train, np.array([0, 2, 0, 2, 0, 2]))


def test_react_is_the_energy_of_logits_from_clipped_features(rng):
    train, _ = _features(rng, 50)
    query, _ = _features(rng, 6)
    weight, bias = rng.normal(size=(6, 3)), rng.normal(size=3)
    clip = np.percentile(train.astype(np.float64), 90)
    logits = np.minimum(query.astype(np.float64), clip) @ weight + bias
    expected = -logsumexp(logits, axis=1)
    np.testing.assert_allclose(ReAct(train, weight, bias).score(query), expected, rtol=1e-6)


def test_react_refuses_an_output_layer_of_the_wrong_shape(rng):
    train, _ = _features(rng, 10)
    with pytest.raises(ValueError, match="do not map 6 features"):
        ReAct(train, np.zeros((5, 3)), np.zeros(3))


def test_held_out_class_auroc_compares_the_score_with_and_without_the_own_class(rng):
    train, y = _features(rng, 60)
    query, yq = _features(rng, 12)
    knn = KNN(train, y, k=3)
    expected = auroc(knn.score(query), knn.score_without(query, yq))
    assert held_out_class_auroc(knn, query, yq) == expected
    assert expected > 0.5  # well-separated classes: the own class is the nearest


def test_every_entry_has_a_label_a_one_line_description_and_known_needs():
    for name, baseline in BASELINES.items():
        assert baseline.label and baseline.description, name
        assert "\n" not in baseline.description, name
        assert baseline.needs in NEEDS, name
        assert isinstance(baseline, OnLogits | OnFeatures | OnPenultimate), name


def test_every_score_is_higher_for_the_less_usual_input(rng):
    """One convention: a typical input (confident logits, a training feature, strong
    penultimate features) scores lower than an unusual one (flat logits, far or weak features)."""
    train, y = _features(rng, 60)
    for name, baseline in BASELINES.items():
        if isinstance(baseline, OnLogits):
            s = baseline.score(np.array([[9.0, 0.0, 0.0], [0.1, 0.0, 0.0]]))
        elif isinstance(baseline, OnFeatures):
            s = baseline.fit(train, y).score(np.concatenate([train[:1], -train[:1] - 5]))
        else:
            react = baseline.fit(train, np.eye(6)[:, :3], np.zeros(3))
            s = react.score(np.stack([np.full(6, 9.0), np.zeros(6)]))
        assert s[0] < s[1], name


def test_fit_on_best_layer_picks_the_layer_that_separates_the_classes(rng):
    signal, y = _features(rng, 90)
    query, yq = _features(rng, 30)
    noise = {"noise": rng.random((90, 6)), "signal": signal}
    layer, scorer = fit_on_best_layer(
        BASELINES["knn"], noise, y, {"noise": rng.random((30, 6)), "signal": query}, yq
    )
    assert layer == "signal"
    np.testing.assert_array_equal(scorer.score(query), KNN(signal, y).score(query))
    with pytest.raises(ValueError, match="same layers"):
        fit_on_best_layer(BASELINES["knn"], noise, y, {"signal": query}, yq)


def test_the_build_computes_the_tables_entries_on_logits_and_features():
    expected = [n for n, b in BASELINES.items() if isinstance(b, OnLogits | OnFeatures)]
    assert list(emitted.BASELINES) == expected
    assert [m.name for m in emitted.logit_methods()] == [
        n for n, b in BASELINES.items() if isinstance(b, OnLogits)
    ]
