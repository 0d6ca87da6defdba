"""The fused box score (issue 15): contrast term, other-class boxes, held-out-class tau
selection without unknown inputs, artifact round trip, and non-finite inputs rejected."""

from __future__ import annotations

import numpy as np
import pytest

from boxwatch.agent import boxes as boxes_module
from boxwatch.agent.boxes import (
    REJECT,
    BoxRuntime,
    BoxSet,
    complement_boxes,
    contrast_scores,
    set_box_kernel,
)
from boxwatch.agent.errors import ArtifactError, ConfigError
from boxwatch.offline.monitors.estimator import SELECTION_TOLERANCE, BoxMonitor


def _random_boxset(rng: np.random.Generator, n_classes: int, d: int) -> BoxSet:
    per_class = []
    for _ in range(n_classes):
        k = int(rng.integers(1, 5))
        centre = rng.normal(size=(k, d)).astype(np.float32) + rng.normal(scale=3, size=d).astype(
            np.float32
        )
        half = np.abs(rng.normal(scale=0.5, size=(k, d))).astype(np.float32)
        per_class.append((centre - half, centre + half))
    return BoxSet.from_boxes(per_class, d)


def _naive_distance(lo: np.ndarray, hi: np.ndarray, x: np.ndarray) -> float:
    if len(lo) == 0:
        return float("inf")
    gap = np.clip(x, lo, hi) - x
    return float(np.sqrt((gap.astype(np.float64) ** 2).sum(axis=1).min()))


def _clusters(seed: int, n: int = 120, d: int = 4, n_classes: int = 3):
    """Well separated classes, each two blobs; predictions equal the labels."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=6, size=(n_classes, 2, d))
    y = rng.integers(0, n_classes, size=n)
    x = centres[y, rng.integers(0, 2, size=n)] + rng.normal(scale=0.5, size=(n, d))
    return {"a": x, "b": np.abs(x[:, :2])}, y, y.copy()


def test_contrast_is_zero_inside_half_between_and_nan_when_undefined():
    got = contrast_scores(
        np.array([0.0, 1.0, 3.0, np.inf, np.nan, 2.0, 0.0]),
        np.array([5.0, 1.0, 1.0, np.inf, 1.0, np.inf, 0.0]),
    )
    np.testing.assert_array_equal(got[:3], [0.0, 0.5, 0.75])
    assert np.isnan(got[3]) and np.isnan(got[4])
    assert got[5] == 0.0 and got[6] == 0.0


@pytest.mark.parametrize("n_neighbours", [0, 1, 2])
def test_complement_boxes_hold_the_nearest_other_classes(n_neighbours):
    rng = np.random.default_rng(n_neighbours)
    boxes = _random_boxset(rng, 5, 3)
    comp = complement_boxes(boxes, n_neighbours)
    centre = (boxes.lo.astype(np.float64) + boxes.hi) / 2
    for c in range(5):
        own = centre[boxes.offsets[c] : boxes.offsets[c + 1]]
        gaps = {
            k: ((centre[boxes.offsets[k] : boxes.offsets[k + 1]][:, None] - own[None]) ** 2)
            .sum(2)
            .min()
            for k in range(5)
            if k != c
        }
        wanted = sorted(gaps, key=lambda k: (gaps[k], k))[: n_neighbours or None]
        want = {
            (tuple(lo), tuple(hi))
            for k in wanted
            for lo, hi in zip(*boxes.boxes_of(k), strict=True)
        }
        got = {(tuple(lo), tuple(hi)) for lo, hi in zip(*comp.boxes_of(c), strict=True)}
        assert got == want
    x = rng.normal(scale=3, size=(60, 3)).astype(np.float32)
    y = rng.integers(0, 5, size=60)
    want = [_naive_distance(*comp.boxes_of(int(c)), xi) for xi, c in zip(x, y, strict=True)]
    np.testing.assert_allclose(comp.distance(x, y), want, rtol=1e-5)


def _fused_runtime(seed: int = 0, contrast_classes: int = 0) -> BoxRuntime:
    rng = np.random.default_rng(seed)
    good = {"a": _random_boxset(rng, 4, 5), "b": _random_boxset(rng, 4, 2)}
    bad = {"a": _random_boxset(rng, 4, 5), "b": _random_boxset(rng, 4, 2)}
    return BoxRuntime(
        layers=["a", "b"],
        n_classes=4,
        good=good,
        bad=bad,
        normalize="none",
        combine="calibrated",
        score_layers=["a", "b"],
        score_scales={"a": 2.0, "b": 0.5},
        threshold=1.0,
        score="fused",
        contrast_layers=["a"],
        contrast_scales={"a": 0.25},
        contrast_classes=contrast_classes,
    )


def test_fused_score_is_distance_mean_plus_scaled_contrast():
    rt = _fused_runtime(1)
    rng = np.random.default_rng(2)
    acts = {"a": rng.normal(scale=3, size=(80, 5)), "b": rng.normal(scale=3, size=(80, 2))}
    y = rng.integers(0, 4, size=80)
    want = []
    for i, c in enumerate(y):
        d = {
            k: _naive_distance(*rt.good[k].boxes_of(int(c)), acts[k][i].astype(np.float32))
            for k in "ab"
        }
        others = [
            _naive_distance(*rt.good["a"].boxes_of(k), acts["a"][i].astype(np.float32))
            for k in range(4)
            if k != c
        ]
        contrast = 0.0 if d["a"] == 0 else d["a"] / (d["a"] + min(others))
        want.append((d["a"] / 2.0 + d["b"] / 0.5) / 2 + contrast / 0.25)
    np.testing.assert_allclose(rt.scores(acts, y), want, rtol=1e-5)
    combined, _per, scores = rt.assess(acts, y)
    np.testing.assert_array_equal(scores, rt.scores(acts, y))
    np.testing.assert_array_equal(combined == REJECT, scores > rt.threshold)


def test_non_finite_activations_are_rejected_by_the_fused_score():
    rt = _fused_runtime(3)
    acts = {"a": np.zeros((4, 5)), "b": np.zeros((4, 2))}
    acts["a"][0, 1], acts["b"][1, 0], acts["a"][2, 0] = np.nan, np.inf, -np.inf
    y = np.zeros(4, dtype=np.int64)
    scores = rt.scores(acts, y)
    assert np.all(np.isinf(scores[:3])) and np.isfinite(scores[3])
    combined, _per, _scores = rt.assess(acts, y)
    assert np.all(combined[:3] == REJECT)
    assert not np.any(rt.decide(scores[:3]))


def test_fused_runtime_round_trips_and_older_members_still_load():
    rt = _fused_runtime(4, contrast_classes=2)
    members = rt.to_members()
    spec = members["monitors/boxes.json"]
    assert spec["version"] == 2 and spec["score"] == "fused" and spec["contrast_classes"] == 2
    back = BoxRuntime.from_members(members, members)
    assert (back.score, back.contrast_layers, back.contrast_scales, back.contrast_classes) == (
        "fused",
        ["a"],
        {"a": 0.25},
        2,
    )
    rng = np.random.default_rng(5)
    acts = {"a": rng.normal(scale=3, size=(50, 5)), "b": rng.normal(scale=3, size=(50, 2))}
    y = rng.integers(0, 4, size=50)
    np.testing.assert_array_equal(back.scores(acts, y), rt.scores(acts, y))
    # A version-1 member (written before the fused score) loads as the distance score.
    old = {
        k: v
        for k, v in spec.items()
        if k not in ("score", "contrast_layers", "contrast_scales", "contrast_classes")
    }
    old["version"] = 1
    legacy = BoxRuntime.from_members({"monitors/boxes.json": old}, members)
    assert legacy.score == "distance" and legacy.contrast_layers == []
    rt.score, rt.contrast_layers = "distance", []
    assert rt.to_members()["monitors/boxes.json"]["version"] == 1
    bad = dict(spec, contrast_layers=["zz"])
    with pytest.raises(ArtifactError, match="contrast layers"):
        BoxRuntime.from_members({"monitors/boxes.json": bad}, members)
    with pytest.raises(ArtifactError, match="version"):
        BoxRuntime.from_members({"monitors/boxes.json": dict(spec, version=5)}, members)


@pytest.mark.skipif(boxes_module._NATIVE is None, reason="the native box kernel is not built")
def test_native_and_numpy_fused_scores_are_identical(monkeypatch):
    """Bit-identical to numpy's per-dimension path (the one the kernel mirrors)."""
    rt = _fused_runtime(6, contrast_classes=2)
    rng = np.random.default_rng(7)
    acts = {"a": rng.normal(scale=3, size=(3000, 5)), "b": rng.normal(scale=3, size=(3000, 2))}
    y = rng.integers(0, 4, size=3000)
    before = set_box_kernel("native")
    try:
        native = rt.scores(acts, y)
        set_box_kernel("numpy")
        monkeypatch.setattr(boxes_module, "_PADDED_ELEMENTS", 0)
        monkeypatch.setattr(boxes_module, "_ROWWISE_MIN_DISTANCE", 0)
        numpy_path = rt.scores(acts, y)
    finally:
        set_box_kernel(before)
    np.testing.assert_array_equal(native, numpy_path)


@pytest.mark.skipif(boxes_module._NATIVE is None, reason="the native box kernel is not built")
@pytest.mark.parametrize("contrast_classes", [0, 1, 2])
def test_one_pass_kernel_equals_numpy_and_decides_like_scores(monkeypatch, contrast_classes):
    """The native one-pass fused distances (own class, nearest other class, membership) are
    bit-identical to the numpy path, NaN rows and a class without boxes included, and
    BoxRuntime.assess (which uses them) emits the scores and verdicts of the separate path."""
    rt = _fused_runtime(3, contrast_classes=contrast_classes)
    empty = BoxSet.from_boxes(
        [rt.good["a"].boxes_of(c) for c in range(3)]
        + [(np.zeros((0, 5), np.float32), np.zeros((0, 5), np.float32))],
        5,
    )
    rt.good["a"] = empty
    rng = np.random.default_rng(11)
    acts = {"a": rng.normal(scale=3, size=(2000, 5)), "b": rng.normal(scale=3, size=(2000, 2))}
    acts["a"][:40] = rt.good["a"].lo[0]  # inside a box
    acts["a"][40:45, 2] = np.nan
    y = rng.integers(0, 4, size=2000)
    other = rt.other_boxes("a")
    x = acts["a"].astype(np.float32)
    before = set_box_kernel("native")
    try:
        native = rt.good["a"].fused_distances(x, y, other)
        native_assess = rt.assess(acts, y)
        set_box_kernel("numpy")
        monkeypatch.setattr(boxes_module, "_PADDED_ELEMENTS", 0)
        monkeypatch.setattr(boxes_module, "_ROWWISE_MIN_DISTANCE", 0)
        numpy_path = rt.good["a"].fused_distances(x, y, other)
        numpy_scores = rt.scores(acts, y)
        numpy_verdicts = rt.verdicts(acts, y)[0]
    finally:
        set_box_kernel(before)
    for got, want in zip(native, numpy_path, strict=True):
        np.testing.assert_array_equal(got, want)
    assert not np.isfinite(native[0][40:45]).any() and np.isinf(native[2][40:45]).all()
    assert np.isinf(native[0][y == 3]).all()
    np.testing.assert_array_equal(native_assess[2], numpy_scores)
    np.testing.assert_array_equal(native_assess[0], numpy_verdicts)
    assert (native_assess[0][40:45] == REJECT).all()


def test_held_out_class_selection_needs_no_unknown_inputs():
    acts, y, pred = _clusters(0, n=300)
    vacts, vy, vpred = _clusters(0, n=150)  # same centres, fresh points
    taus = (1.0, 0.5, 0.1, 0.01)
    mon = BoxMonitor(tau="auto", taus=taus, max_clusters=8).fit(
        acts, y, pred, validation=(vacts, vy, vpred)
    )
    assert mon.selection_["method"] == "held-out-class"
    for layer in ("a", "b"):
        table = mon.selection_["auroc"][layer]
        assert table.shape == (len(taus),)
        chosen = taus.index(float(mon.tau_[layer][0]))
        assert np.all(mon.tau_[layer] == mon.tau_[layer][0])
        if table.max() >= 0.9:
            assert table[chosen] >= table.max() - SELECTION_TOLERANCE
            assert np.all(table[chosen + 1 :] < table.max() - SELECTION_TOLERANCE)
    # Unknown rows (label -1) in the validation data change nothing.
    rng = np.random.default_rng(1)
    with_unknown = (
        {k: np.vstack([v, rng.normal(scale=20, size=(40, v.shape[1]))]) for k, v in vacts.items()},
        np.concatenate([vy, np.full(40, -1)]),
        np.concatenate([vpred, rng.integers(0, 3, 40)]),
    )
    mon2 = BoxMonitor(tau="auto", taus=taus, max_clusters=8).fit(
        acts, y, pred, validation=with_unknown
    )
    for layer in ("a", "b"):
        np.testing.assert_array_equal(mon2.tau_[layer], mon.tau_[layer])
        np.testing.assert_array_equal(
            mon2.selection_["auroc"][layer], mon.selection_["auroc"][layer]
        )
    assert mon2.contrast_layers_ == mon.contrast_layers_
    # Two classes: each stand-in has exactly one other class to land in.
    a2, y2, p2 = _clusters(3, n=200, n_classes=2)
    v2 = _clusters(3, n=100, n_classes=2)
    two = BoxMonitor(tau="auto", taus=taus, max_clusters=8).fit(a2, y2, p2, validation=v2)
    assert all(np.all(np.isfinite(v)) for v in two.selection_["auroc"].values())
    with pytest.raises(ConfigError, match="at least 2 known classes"):
        BoxMonitor(tau="auto", taus=taus).fit(
            acts, y, pred, validation=(vacts, np.zeros_like(vy), vpred)
        )


def test_fused_monitor_calibrates_and_the_agent_scores_alike():
    acts, y, pred = _clusters(2, n=300)
    vacts, vy, vpred = _clusters(2, n=200)
    mon = BoxMonitor(tau=0.1, max_clusters=8, contrast_layers=["a"]).fit(acts, y, pred)
    assert mon.runtime_.score == "fused" and mon.contrast_layers_ == ["a"]
    cal = mon.calibrate(vacts, vpred, target_acceptance=0.9)
    assert set(mon.runtime_.contrast_scales) == {"a"} and "contrast:a" in cal.scales
    sk = mon.outlier_score(vacts, vpred)
    assert np.mean(sk <= cal.threshold) >= 0.9
    rt = BoxRuntime.from_members(mon.to_members(), mon.to_members())
    np.testing.assert_array_equal(rt.scores(vacts, vpred), sk)
    # An input moved halfway towards another class scores higher than where it started.
    mid = {k: (v[:20] + v[20:40]) / 2 for k, v in vacts.items()}
    moved = vy[:20] != vy[20:40]
    assert np.all(mon.outlier_score(mid, vpred[:20])[moved] > sk[:20][moved])
    distance = BoxMonitor(tau=0.1, max_clusters=8, score="distance").fit(acts, y, pred)
    assert distance.contrast_layers_ == [] and distance.runtime_.score == "distance"
    with pytest.raises(ConfigError) as err:
        BoxMonitor(score="odd", selection="guess", contrast_layers=["zz"]).fit(acts, y, pred)
    assert "score='odd'" in str(err.value) and "selection='guess'" in str(err.value)
    assert "contrast layer 'zz'" in str(err.value)


def test_large_batches_go_through_in_row_blocks_with_the_same_results(monkeypatch):
    """verdicts and distance_terms take a batch ROW_BLOCK rows at a time (bounded memory on
    a calibration set of 40,000 wide rows): the same verdicts, distances, contrast terms and
    calibration as in one pass, energy and error model included."""
    acts, y, pred = _clusters(3, n=300)
    vacts, vy, vpred = _clusters(4, n=250)
    rng = np.random.default_rng(5)

    def logits_of(p):
        return (3.0 * np.eye(3)[p] + rng.normal(size=(len(p), 3))).astype(np.float32)

    logits, vlogits = logits_of(pred), logits_of(vpred)
    vy = np.where(rng.random(len(vy)) < 0.2, (vy + 1) % 3, vy)  # some model mistakes
    validation = (vacts, vy, vpred, vlogits)

    def run():
        mon = BoxMonitor(tau=0.1, max_clusters=8, contrast_layers=["a"]).fit(
            acts, y, pred, logits=logits, validation=validation
        )
        rt = mon.runtime_
        return (
            rt.verdicts(vacts, vpred, logits=vlogits),
            rt.distance_terms(vacts, vpred),
            (rt.threshold, rt.score_scales, rt.contrast_scales, rt.energy_scale),
        )

    whole = run()
    monkeypatch.setattr(boxes_module, "ROW_BLOCK", 7)
    blocked = run()
    (wv, wper), (wd, wc), wcal = whole
    (bv, bper), (bd, bc), bcal = blocked
    np.testing.assert_array_equal(wv, bv)
    assert wper.keys() == bper.keys() and wd.keys() == bd.keys() and wc.keys() == bc.keys()
    for a, b in [*((wper[k], bper[k]) for k in wper), *((wd[k], bd[k]) for k in wd)]:
        np.testing.assert_array_equal(a, b)
    for k in wc:
        np.testing.assert_array_equal(wc[k], bc[k])
    assert wcal == bcal
    assert len(vpred) > 30 * 7  # many blocks, the last one partial
