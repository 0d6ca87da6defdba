"""The fused score's relative Mahalanobis terms: the low-rank fit against the brute-force
difference of two Mahalanobis distances, where the monitor fits them, the score they make,
their artifact round trip, hostile arrays, and failing closed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from boxwatch.agent import boxes as boxes_module
from boxwatch.agent.boxes import ACCEPT, REJECT, BoxRuntime
from boxwatch.agent.errors import ArtifactError
from boxwatch.agent.mahalanobis import RelativeMahalanobis
from boxwatch.agent.members import BOXES_PREFIX
from boxwatch.offline.monitors import estimator as estimator_module
from boxwatch.offline.monitors import mahalanobis as fitting
from boxwatch.offline.monitors.baselines import Mahalanobis
from boxwatch.offline.monitors.estimator import BoxMonitor
from boxwatch.offline.monitors.evaluation import acceptance_threshold
from boxwatch.offline.monitors.mahalanobis import fit_relative_mahalanobis

SPEC = f"{BOXES_PREFIX}.json"
ARRAYS = f"{BOXES_PREFIX}.npz"


def brute_force(x: np.ndarray, y: np.ndarray, query: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """The definition: the Mahalanobis baseline's squared distance to the predicted class's
    mean less its distance with all training rows as one class."""
    per_class = Mahalanobis(x, y).per_class(query)
    background = Mahalanobis(x, np.zeros(len(x), np.int64)).per_class(query)[:, 0]
    return per_class[np.arange(len(query)), pred] - background


def classes(seed: int, n: int, d: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian classes with correlated features of different scales."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    mix = rng.normal(size=(d, d)) * rng.uniform(0.2, 3.0, size=d)
    means = rng.normal(scale=3.0, size=(k, d))
    return (means[y] + rng.normal(size=(n, d)) @ mix).astype(np.float32), y


def test_the_low_rank_term_is_the_difference_of_two_mahalanobis_distances(monkeypatch):
    x, y = classes(0, 900, 12, 5)
    x[:, 3] = 2.5  # a constant (dead) feature: no class differs there, so the term ignores it
    rows = np.random.default_rng(1).permutation(len(x))[:700]
    monkeypatch.setattr(fitting, "ROW_BLOCK", 64)  # read in many blocks: the same fit
    term = fit_relative_mahalanobis(x, y, 5, rows)
    assert term.directions.shape == (12, 4)  # rank n_classes - 1
    query, pred = classes(2, 300, 12, 5)
    query[:, 3] = np.linspace(-50, 50, len(query))  # far off on the dead feature
    want = brute_force(x[rows].astype(np.float64), y[rows], query, pred)
    got = term.distance(query, pred)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert np.ptp(want) > 10  # the term varies: the comparison means something
    whole = fit_relative_mahalanobis(x[np.sort(rows)], y[np.sort(rows)], 5)
    np.testing.assert_allclose(whole.distance(query, pred), got, rtol=1e-9, atol=1e-9)


def test_past_the_direction_cap_the_term_keeps_the_directions_of_largest_weight(monkeypatch):
    """With at most 2 directions for 5 classes (rank 4), the term is the full one less the
    two smallest eigen-directions' part of ``P - P_0``."""
    x, y = classes(6, 900, 12, 5)
    monkeypatch.setattr(fitting, "MAX_DIRECTIONS", 2)
    term = fit_relative_mahalanobis(x, y, 5)
    assert term.directions.shape == (12, 2)
    x64 = x.astype(np.float64)
    precision = Mahalanobis(x64, y).precision_
    background = Mahalanobis(x64, np.zeros(len(x), np.int64)).precision_
    weights, vectors = np.linalg.eigh(precision - background)  # ascending
    query, pred = classes(7, 200, 12, 5)
    centred = query - x64.mean(axis=0)
    dropped = np.sum(weights[-4:-2] * (centred @ vectors[:, -4:-2]) ** 2, axis=1)
    want = brute_force(x64, y, query, pred) - dropped
    np.testing.assert_allclose(
        term.distance(query, pred), want, rtol=1e-4, atol=1e-4 * np.abs(want).max()
    )
    assert dropped.mean() > 1e-3 * np.abs(want).mean()  # the cap changed the term


def test_a_class_without_training_rows_is_measured_from_the_overall_mean():
    x, y = classes(3, 600, 6, 3)
    term = fit_relative_mahalanobis(x, y, 4)  # class 3 has no row
    query, _ = classes(4, 50, 6, 3)
    centred = query - term.mean
    want = np.sum((centred @ term.directions) ** 2, axis=1)
    np.testing.assert_allclose(term.distance(query, np.full(50, 3)), want, rtol=1e-5)
    assert np.all(want >= 0)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda x, y: (np.where(np.arange(len(x))[:, None] == 5, np.nan, x), y), "NaN"),
        (lambda x, y: (x, np.where(np.arange(len(y)) == 7, 9, y)), r"\[0, 3\)"),
        (lambda x, y: (x[:0], y[:0]), "no training rows"),
    ],
)
def test_bad_training_data_is_refused(change, match):
    x, y = classes(5, 100, 4, 3)
    with pytest.raises(ValueError, match=match):
        fit_relative_mahalanobis(*change(x, y), 3)


def data(seed: int, n: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """Activations of an input layer and two deeper ones, labels, predictions (a tenth
    wrong) and logits whose argmax is the prediction."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    centres = np.random.default_rng(100).normal(scale=4.0, size=(3, 6))
    acts = {
        "input": centres[y] + rng.normal(size=(n, 6)),
        "a": centres[y] + rng.normal(size=(n, 6)),
        "b": np.abs(centres[y][:, :3] + rng.normal(size=(n, 3))),
    }
    pred = np.where(rng.random(n) < 0.9, y, rng.integers(0, 3, n))
    logits = rng.normal(size=(n, 3))
    logits[np.arange(n), pred] = logits.max(axis=1) + rng.exponential(1.0, n)
    return acts, y, pred, logits


def fitted(**params: Any) -> tuple[BoxMonitor, tuple]:
    acts, y, pred, logits = data(10, 900)
    validation = data(11, 900)
    mon = BoxMonitor(**params).fit(acts, y, pred, logits=logits, validation=validation)
    return mon, validation


def test_the_monitor_fits_a_term_per_score_layer_but_the_input_and_scores_with_it():
    mon, (vacts, vy, vpred, vlogits) = fitted()
    rt = mon.runtime_
    assert rt.mahalanobis_layers() == ["a", "b"]  # never the model's input
    train, ytr, _pred, _logits = data(10, 900)
    right = vy == vpred
    terms = []
    for layer in ("a", "b"):
        raw = brute_force(train[layer], ytr, vacts[layer], vpred)
        center = float(np.median(raw[right]))
        scale = float(acceptance_threshold(raw[right], mon.target_acceptance)) - center
        term = rt.mahalanobis[layer]
        assert term.center == pytest.approx(center, rel=1e-4, abs=1e-4)
        assert term.scale == pytest.approx(scale, rel=1e-4)
        assert mon.calibration_.scales[f"mahalanobis:{layer}"] == term.scale
        terms.append(np.maximum(raw - center, 0) / scale)
    dist = rt.layer_scores(vacts, vpred)
    con = rt.contrast_layer_scores(vacts, vpred)
    energy = -np.log(np.exp(vlogits).sum(axis=1))
    all_terms = [dist[k] / rt.score_scales[k] for k in rt.score_layers]
    all_terms += [con[k] / rt.contrast_scales[k] for k in rt.contrast_layers]
    all_terms += terms
    all_terms += [np.maximum(energy - rt.energy_center, 0) / rt.energy_scale] * 2
    rms = np.sqrt(np.mean(np.square(all_terms), axis=0))
    peak = np.max([dist[k] / rt.score_scales[k] for k in rt.score_layers], axis=0) / 1.5
    want = np.maximum(rms, peak)
    want[~np.isfinite(want)] = np.inf
    got = mon.outlier_score(vacts, vpred, logits=vlogits)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    # The terms move the score: without them it is another one.
    rt.mahalanobis = {}
    assert np.mean(mon.outlier_score(vacts, vpred, logits=vlogits) != got) > 0.5


def test_which_layers_take_a_term(monkeypatch):
    monkeypatch.setattr(estimator_module, "MAHALANOBIS_MAX_FEATURES", 3)
    narrow, _ = fitted()
    assert narrow.runtime_.mahalanobis_layers() == ["b"]  # "a" has 6 features
    monkeypatch.undo()
    for params in (
        {"mahalanobis_term": False},
        {"score_mean": "arithmetic"},
        {"score": "distance"},
        {"score_layers": ["input"]},
    ):
        mon, _ = fitted(**params)
        assert mon.runtime_.mahalanobis_layers() == [], params
        assert mon.to_members()[SPEC]["version"] < 9, params


def test_the_terms_travel_in_format_9_and_give_the_same_verdicts_and_reasons():
    mon, (vacts, _vy, vpred, vlogits) = fitted()
    members = mon.to_members()
    spec = members[SPEC]
    assert spec["version"] == 9
    assert [t["layer"] for t in spec["mahalanobis"]] == ["a", "b"]
    back = BoxRuntime.from_members(members, members)
    want = mon.runtime_.explain(vacts, vpred, logits=vlogits)
    got = back.explain(vacts, vpred, logits=vlogits)
    for w, g in zip(want[:3], got[:3], strict=True):
        if isinstance(w, dict):
            assert all(np.array_equal(w[k], g[k]) for k in w)
        else:
            np.testing.assert_array_equal(w, g)
    np.testing.assert_array_equal(want[3].codes, got[3].codes)
    np.testing.assert_array_equal(want[3].layer, got[3].layer)
    assert "mahalanobis" in set(got[3].names().tolist())  # the term decides some rejects here


def tampered(members: dict[str, Any], spec: dict | None = None, arrays: dict | None = None):
    return {
        **members,
        SPEC: {**members[SPEC], **(spec or {})},
        ARRAYS: {**members[ARRAYS], **(arrays or {})},
    }


def test_a_bad_term_in_the_artifact_is_refused_with_what_is_wrong():
    mon, _ = fitted()
    members = mon.to_members()
    spec, arrays = members[SPEC], members[ARRAYS]
    entries = spec["mahalanobis"]
    linear = np.array(arrays["M0.linear"])
    nan = linear.copy()
    nan[1, 2] = np.nan
    cases: list[tuple[dict, dict, str]] = [
        ({}, {"M0.linear": nan}, "linear holds a NaN"),
        ({}, {"M0.offset": np.zeros(2)}, "arrays disagree"),
        ({}, {"M1.directions": np.zeros((5, 2))}, "arrays disagree"),
        ({}, {"M0.linear": np.zeros((4, 6)), "M0.offset": np.zeros(4)}, "4 classes"),
        ({"mahalanobis": [{**entries[0], "layer": "nope"}]}, {}, "score layer"),
        ({"mahalanobis": [entries[0], entries[0]]}, {}, "score layer once"),
        ({"mahalanobis": [{**entries[0], "scale": 0.0}]}, {}, "positive scale"),
        ({"mahalanobis": [{**entries[0], "scale": True}]}, {}, "positive scale"),
        ({"mahalanobis": [{**entries[0], "center": "x"}]}, {}, "positive scale"),
        ({"mahalanobis": "all"}, {}, "non-empty list"),
        ({"mahalanobis": []}, {}, "non-empty list"),
        ({"score_mean": "arithmetic"}, {}, "quadratic"),
    ]
    for spec_change, array_change, match in cases:
        with pytest.raises(ArtifactError, match=match):
            bad = tampered(members, spec_change, array_change)
            BoxRuntime.from_members(bad, bad)
    missing = {k: v for k, v in arrays.items() if k != "M1.mean"}
    with pytest.raises(ArtifactError, match="M1.mean"):
        BoxRuntime.from_members({**members, ARRAYS: missing}, {**members, ARRAYS: missing})


def test_an_older_reader_refuses_a_monitor_with_terms(monkeypatch):
    mon, _ = fitted()
    members = mon.to_members()
    monkeypatch.setattr(boxes_module, "FORMAT_VERSIONS", (1, 2, 3, 4, 5, 6, 7, 8))
    with pytest.raises(ArtifactError, match="version"):
        BoxRuntime.from_members(members, members)


def test_a_non_finite_feature_of_a_term_layer_fails_closed():
    mon, (vacts, _vy, vpred, vlogits) = fitted()
    acts = {k: np.array(v, dtype=np.float64) for k, v in vacts.items()}
    acts["b"][:3, 1] = [np.nan, np.inf, -np.inf]
    combined, per, scores, why = mon.runtime_.explain(acts, vpred, logits=vlogits)
    assert (combined[:3] == REJECT).all() and np.isinf(scores[:3]).all()
    assert why.names()[:3].tolist() == ["not_finite"] * 3
    assert (combined[3:] == ACCEPT).any()


def test_the_term_is_checked_when_built():
    ok = dict(mean=np.zeros(2), directions=np.eye(2), linear=np.zeros((3, 2)), offset=np.zeros(3))
    RelativeMahalanobis(**ok)
    for change, match in (
        ({"directions": np.eye(3)}, "disagree"),
        ({"offset": np.zeros(2)}, "disagree"),
        ({"mean": np.array([0.0, np.inf])}, "mean holds"),
        ({"center": 0.0, "scale": -1.0}, "positive scale"),
        ({"center": None, "scale": 1.0}, "positive scale"),
    ):
        with pytest.raises(ValueError, match=match):
            RelativeMahalanobis(**{**ok, **change})
    term = RelativeMahalanobis(**ok)
    with pytest.raises(ValueError, match="not calibrated"):
        term.term(np.zeros(2))
    with pytest.raises(ValueError, match="3 features"):
        term.distance(np.zeros((4, 3)), np.zeros(4, np.int64))
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        term.distance(np.zeros((4, 2)), np.array([0, 1, 2, 3]))


@pytest.mark.parametrize("k", [5, 70])
def test_distance_is_the_formula_with_one_product_or_a_row_per_class(k):
    """Up to FUSED_CLASSES classes one product gives both terms, past it the linear term is a
    dot product with the predicted class's row: either way ``||(x - mu0) F||^2 - 2 (x - mu0)
    . L[y] + offset[y]``, and a wrong feature count or class is a ValueError naming it."""
    rng = np.random.default_rng(k)
    d = 6
    term = RelativeMahalanobis(
        rng.normal(size=d), rng.normal(size=(d, 3)), rng.normal(size=(k, d)), rng.normal(size=k)
    )
    assert term.fused == (k <= 64)
    x, y = rng.normal(size=(40, d)), rng.integers(0, k, 40)
    centred = x.astype(np.float32).astype(np.float64) - term.mean
    want = (
        np.square(centred @ term.directions).sum(axis=1)
        - 2.0 * np.einsum("ij,ij->i", centred, term.linear[y])
        + term.offset[y]
    )
    np.testing.assert_allclose(term.distance(x, y), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="5 features per input, expected 6"):
        term.distance(x[:, :5], y)
    with pytest.raises(ValueError, match=f"predicted classes must be 40 values in \\[0, {k}\\)"):
        term.distance(x, np.full(40, k))
