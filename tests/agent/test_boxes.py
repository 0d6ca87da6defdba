"""Box runtime (agent side): the paper's Examples 1, 5 and 6, vectorised vs naive checks,
verdict combination and the artifact round trip; each with the native kernel and numpy."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from boxwatch.agent import boxes as boxes_module
from boxwatch.agent.artifact import build_artifact_bytes, load_artifact
from boxwatch.agent.boxes import (
    ACCEPT,
    KERNELS,
    REJECT,
    UNCERTAIN,
    BoxRuntime,
    BoxSet,
    combine_verdicts,
    layer_verdicts,
    normalize_features,
    set_box_kernel,
    verdict_names,
)
from boxwatch.agent.errors import ArtifactError, ConfigError
from boxwatch.agent.keys import key_id
from boxwatch.offline.monitors.taukmeans import cluster_boxes

# Example 5 (Table 1, class 1 at layer 2): the clusters the example gives.
C1 = np.array([(0.078, 0.062), (0.222, 0.162)])
C2 = np.array([(0.69, 0.61), (0.79, 0.71)])
C3 = np.array([(0.289, 0.281), (0.389, 0.381)])


def _box(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return cluster_boxes(points, np.zeros(len(points), dtype=np.int64))


def example_runtime() -> BoxRuntime:
    """Class index 0 = the paper's class 1 (good C1, C2; bad C3); class index 1 has no boxes."""
    empty = (np.zeros((0, 2)), np.zeros((0, 2)))
    good = BoxSet.from_boxes(
        [(np.vstack([_box(C1)[0], _box(C2)[0]]), np.vstack([_box(C1)[1], _box(C2)[1]])), empty], 2
    )
    bad = BoxSet.from_boxes([_box(C3), empty], 2)
    return BoxRuntime(
        layers=["layer2"],
        n_classes=2,
        good={"layer2": good},
        bad={"layer2": bad},
        normalize="none",
        score_layers=["layer2"],
    )


@pytest.fixture(autouse=True, params=KERNELS)
def kernel(request: pytest.FixtureRequest):
    """Run every test here with the native kernel and with numpy (same answers expected)."""
    if request.param == "native" and boxes_module._NATIVE is None:
        pytest.skip("the native box kernel is not built (it needs a C compiler at install time)")
    previous = set_box_kernel(request.param)
    yield request.param
    set_box_kernel(previous)


def test_example1_tight_box():
    x = np.array([(0.1, 0.5), (0.1, 1.0), (0.2, 0.8), (0.6, 0.2), (1.0, 0.3)])
    lo, hi = _box(x)
    np.testing.assert_array_equal(lo, [[0.1, 0.2]])
    np.testing.assert_array_equal(hi, [[1.0, 1.0]])


def test_example5_boxes():
    labels = np.array([0, 0, 1, 1])
    lo, hi = cluster_boxes(np.vstack([C1, C2]), labels)
    np.testing.assert_array_equal(lo, [[0.078, 0.062], [0.69, 0.61]])
    np.testing.assert_array_equal(hi, [[0.222, 0.162], [0.79, 0.71]])
    lo3, hi3 = _box(C3)
    np.testing.assert_array_equal(
        np.stack([lo3[0], hi3[0]], axis=1), [[0.289, 0.389], [0.281, 0.381]]
    )


def test_example6_verdicts():
    rt = example_runtime()
    acts = {"layer2": np.array([(0.14, 0.13), (0.58, 0.56)])}
    combined, per_layer = rt.verdicts(acts, np.array([0, 0]))
    assert verdict_names(combined).tolist() == ["accept", "reject"]
    np.testing.assert_array_equal(per_layer["layer2"], combined)
    # A point inside the bad box only is rejected; one inside nothing of class 1 too.
    more = {"layer2": np.array([(0.3, 0.3), (0.1, 0.1)])}
    assert rt.verdicts(more, np.array([0, 1]))[0].tolist() == [REJECT, REJECT]


def test_uncertainty_when_good_and_bad_overlap():
    good = BoxSet.from_boxes([(np.array([[0.0, 0.0]]), np.array([[1.0, 1.0]]))], 2)
    bad = BoxSet.from_boxes([(np.array([[0.5, 0.5]]), np.array([[2.0, 2.0]]))], 2)
    x = np.array([[0.25, 0.25], [0.75, 0.75], [1.5, 1.5], [1.0, 0.5]])
    v = layer_verdicts(good, bad, x, np.zeros(4, dtype=int))
    assert v.tolist() == [ACCEPT, UNCERTAIN, REJECT, UNCERTAIN]


@pytest.mark.parametrize("rule", ["any", "calibrated-bad-box", "calibrated-confidence"])
def test_assess_tests_bad_boxes_where_they_decide(rule):
    """assess tests bad boxes only inside a good box of the layer, except under the bad-box
    rule, which reads them for every input: its per-layer verdicts stay Algorithm 3's, and
    an input inside a bad box only (outside every good box, within the score threshold) is
    still `uncertainty` under the bad-box rule."""
    good = BoxSet.from_boxes([(np.array([[0.0, 0.0]]), np.array([[1.0, 1.0]]))], 2)
    bad = BoxSet.from_boxes([(np.array([[0.5, 0.5]]), np.array([[2.0, 2.0]]))], 2)
    x = np.array([[0.25, 0.25], [0.75, 0.75], [1.5, 1.5], [3.0, 3.0]])
    y = np.zeros(4, dtype=int)
    rt = BoxRuntime(
        layers=["a"],
        n_classes=1,
        good={"a": good},
        bad={"a": bad},
        normalize="none",
        score_layers=["a"],
        combine="any" if rule == "any" else "calibrated",
        threshold=1.0,
        uncertainty="bad-box" if rule == "calibrated-bad-box" else "confidence",
    )
    combined, per, _ = rt.assess({"a": x}, y)
    np.testing.assert_array_equal(per["a"], layer_verdicts(good, bad, x, y))
    assert per["a"].tolist() == [ACCEPT, UNCERTAIN, REJECT, REJECT]
    if rule == "calibrated-bad-box":
        assert combined.tolist() == [ACCEPT, UNCERTAIN, UNCERTAIN, REJECT]
    elif rule == "calibrated-confidence":
        assert combined.tolist() == [ACCEPT, ACCEPT, ACCEPT, REJECT]


def _random_boxset(
    rng: np.random.Generator, n_classes: int, d: int, *, empty_class: int | None = None
) -> BoxSet:
    per_class = []
    for cls in range(n_classes):
        k = 0 if cls == empty_class else int(rng.integers(1, 6))
        centre = rng.normal(size=(k, d)).astype(np.float32)
        half = np.abs(rng.normal(scale=0.8, size=(k, d))).astype(np.float32)
        half[rng.random((k, d)) < 0.1] = 0.0  # some zero-width sides
        per_class.append((centre - half, centre + half))
    return BoxSet.from_boxes(per_class, d)


def _naive_contains(bs: BoxSet, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    out = []
    for xi, yi in zip(x, y, strict=True):
        lo, hi = bs.boxes_of(int(yi))
        out.append(
            any(all(lo[k, j] <= xi[j] <= hi[k, j] for j in range(len(xi))) for k in range(len(lo)))
        )
    return np.array(out, dtype=bool)


def _naive_distance(bs: BoxSet, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    out = []
    for xi, yi in zip(x, y, strict=True):
        lo, hi = bs.boxes_of(int(yi))
        best = np.inf
        for k in range(len(lo)):
            gap = [max(lo[k, j] - xi[j], 0.0, xi[j] - hi[k, j]) for j in range(len(xi))]
            best = min(best, float(np.sqrt(np.sum(np.square(gap, dtype=np.float64)))))
        out.append(best)
    return np.array(out)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_membership_and_distance_equal_naive_loop(seed):
    rng = np.random.default_rng(seed)
    d, n_classes = 5, 4
    bs = _random_boxset(rng, n_classes, d, empty_class=3)
    x = rng.normal(scale=0.9, size=(400, d)).astype(np.float32)
    # Points exactly on box corners and faces must count as inside (closed boxes).
    y = rng.integers(0, n_classes, size=len(x))
    for i in range(0, 60, 2):
        lo, hi = bs.boxes_of(int(y[i]))
        if len(lo):
            x[i] = lo[0] if i % 4 == 0 else np.where(rng.random(d) < 0.5, lo[0], hi[0])
    got = bs.contains(x, y)
    np.testing.assert_array_equal(got, _naive_contains(bs, x, y))
    np.testing.assert_array_equal(bs.contains(x[:9], y[:9]), got[:9])  # small-batch path
    np.testing.assert_allclose(
        bs.distance(x[:9], y[:9]), _naive_distance(bs, x[:9], y[:9]), rtol=1e-5, atol=1e-6
    )
    assert 0 < got.sum() < len(got)
    dist = bs.distance(x, y)
    np.testing.assert_allclose(dist, _naive_distance(bs, x, y), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(dist == 0, got)
    assert np.all(np.isinf(dist[y == 3]))


def test_both_membership_paths_and_chunking_agree(monkeypatch):
    rng = np.random.default_rng(5)
    bs = _random_boxset(rng, 3, 8)
    x = rng.normal(size=(3000, 8)).astype(np.float32)
    y = rng.integers(0, 3, size=len(x))
    monkeypatch.setattr("boxwatch.agent.boxes._ROWWISE_MIN_DISTANCE", 512)
    whole = bs.contains(x, y)  # ~1,000 inputs per class: per-dimension passes
    dist = bs.distance(x, y)
    np.testing.assert_array_equal(whole[:300], _naive_contains(bs, x[:300], y[:300]))
    np.testing.assert_allclose(
        dist[:300], _naive_distance(bs, x[:300], y[:300]), rtol=1e-5, atol=1e-6
    )
    # Several chunks and early-exit blocks on the per-dimension path ...
    monkeypatch.setattr("boxwatch.agent.boxes._ROWS_PER_CHUNK", 1400)
    monkeypatch.setattr("boxwatch.agent.boxes._ROWWISE_MIN", 100)
    monkeypatch.setattr("boxwatch.agent.boxes._ROWWISE_MIN_DISTANCE", 100)
    monkeypatch.setattr("boxwatch.agent.boxes._BLOCK", 3)
    np.testing.assert_array_equal(bs.contains(x, y), whole)
    np.testing.assert_allclose(bs.distance(x, y), dist, rtol=1e-5)
    # ... the padded path for small batches ...
    monkeypatch.setattr("boxwatch.agent.boxes._PADDED_ELEMENTS", 10**12)
    np.testing.assert_array_equal(bs.contains(x, y), whole)
    np.testing.assert_allclose(bs.distance(x, y), dist, rtol=1e-5)
    monkeypatch.setattr("boxwatch.agent.boxes._PADDED_ELEMENTS", 0)
    # ... and the broadcast path for small groups give the same answers.
    monkeypatch.setattr("boxwatch.agent.boxes._ROWWISE_MIN", 10**9)
    monkeypatch.setattr("boxwatch.agent.boxes._ROWWISE_MIN_DISTANCE", 10**9)
    monkeypatch.setattr("boxwatch.agent.boxes._BROADCAST_ELEMENTS", 100)
    np.testing.assert_array_equal(bs.contains(x, y), whole)
    np.testing.assert_allclose(bs.distance(x, y), dist, rtol=1e-5)


def test_boxset_rejects_bad_input():
    with pytest.raises(ValueError, match="lo <= hi"):
        BoxSet(np.array([[1.0]]), np.array([[0.0]]), np.array([0, 1]))
    bs = BoxSet.from_boxes([(np.zeros((1, 2)), np.ones((1, 2)))], 2)
    with pytest.raises(ValueError, match="expected"):
        bs.contains(np.zeros((3, 3)), np.zeros(3, dtype=int))
    with pytest.raises(ValueError, match="classes"):
        bs.contains(np.zeros((1, 2)), np.array([4]))


def test_combine_rules():
    per = np.array(
        [
            [ACCEPT, ACCEPT, REJECT, UNCERTAIN, REJECT],
            [ACCEPT, REJECT, REJECT, ACCEPT, REJECT],
            [ACCEPT, ACCEPT, ACCEPT, ACCEPT, REJECT],
        ]
    )
    assert combine_verdicts(per, "any").tolist() == [ACCEPT, REJECT, REJECT, UNCERTAIN, REJECT]
    assert combine_verdicts(per, "majority").tolist() == [
        ACCEPT,
        UNCERTAIN,
        REJECT,
        UNCERTAIN,
        REJECT,
    ]
    assert combine_verdicts(per, "all").tolist() == [
        ACCEPT,
        UNCERTAIN,
        UNCERTAIN,
        UNCERTAIN,
        REJECT,
    ]
    with pytest.raises(ConfigError, match="combine"):
        combine_verdicts(per, "vote")


def test_l2_normalisation():
    x = np.array([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(normalize_features(x, "l2"), [[0.6, 0.8], [0.0, 0.0]])
    with pytest.raises(ConfigError):
        normalize_features(x, "zscore")


def _row_formulas(z: np.ndarray, kind: str) -> dict[str, np.ndarray]:
    """The model-output figures as plain per-row reductions (what ModelOutputs speeds up)."""
    z = np.asarray(z, np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        top = z.max(axis=1)
        total = np.exp(z - top[:, None]).sum(axis=1)
        two = np.partition(z, -2, axis=1)[:, -2:]
        return {
            "confidence": top if kind == "probabilities" else 1.0 / total,
            "energy": -(top + np.log(total)),
            "top_two_gap": np.where(np.isfinite(z).all(axis=1), two[:, 1] - two[:, 0], np.nan),
        }


def _awkward_outputs(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Model outputs with NaN, infinities, signed zeros and tied top values."""
    z = rng.normal(scale=3, size=(n, k))
    odd = rng.random(z.shape) < 0.05
    z[odd] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0], size=int(odd.sum()))
    z[::7] = np.round(z[::7] / 4)
    return z


@pytest.mark.parametrize("kind", ["logits", "probabilities"])
def test_model_outputs_equal_the_row_formulas(kind):
    """Maxima and "all finite" are read down the transposed rows: the same values as each
    row's own reduction."""
    z = _awkward_outputs(np.random.default_rng(5), 300, 7)
    read = boxes_module.ModelOutputs(z, kind)
    for name, want in _row_formulas(z, kind).items():
        np.testing.assert_array_equal(getattr(read, name), want)


@pytest.mark.parametrize(
    "k", [boxes_module._PARTITION_CLASSES, boxes_module._PARTITION_CLASSES + 1, 1000]
)
def test_top_two_gap_of_many_classes_equals_the_partition(k):
    """Past ``_PARTITION_CLASSES`` the gap masks each row's top in a copy: the same values
    as partitioning the row, tied tops and non-finite rows included, the outputs unchanged."""
    rng = np.random.default_rng(k)
    z = rng.normal(scale=3, size=(300, k))
    z[::7] = np.round(z[::7] / 4)  # tied values, at the top too
    z[5, 0], z[6, 1], z[8, 2] = np.nan, np.inf, -np.inf
    z[9, :2] = z[9].max() + 1  # two equal tops: a gap of 0
    before = z.copy()
    got = boxes_module.ModelOutputs(z).top_two_gap
    np.testing.assert_array_equal(got, _row_formulas(z, "logits")["top_two_gap"])
    np.testing.assert_array_equal(z, before)
    assert got[9] == 0 and np.isnan(got[[5, 6, 8]]).all() and np.isfinite(got[10:]).all()


def test_error_features_equal_their_formulas():
    rng = np.random.default_rng(6)
    z = _awkward_outputs(rng, 200, 5)
    scores = rng.random(200) * 4
    scores[::11], scores[::13] = np.nan, np.inf
    contrast = [rng.random(200), np.where(rng.random(200) < 0.2, np.nan, rng.random(200))]
    conf, gap = (_row_formulas(z, "logits")[k] for k in ("confidence", "top_two_gap"))
    with np.errstate(invalid="ignore", divide="ignore"):
        want = np.stack(
            [
                np.log(np.maximum(conf, 1e-300)),
                np.log(np.maximum(1.0 - conf, 1e-12)),
                gap,
                np.log1p(np.minimum(np.where(np.isnan(scores), np.inf, scores), 1e6)),
                np.mean([np.where(np.isfinite(v), v, 1.0) for v in contrast], axis=0),
            ],
            axis=1,
        )
    got = boxes_module.error_features(z, "logits", scores, contrast)
    np.testing.assert_array_equal(got, want)
    assert got.flags.c_contiguous


@pytest.mark.parametrize("n", [1, 2, 257])
@pytest.mark.parametrize("mean", ["quadratic", "arithmetic"])
def test_combined_score_is_the_mean_of_its_terms(n, mean):
    """combine_scores sums the scaled terms as np.mean does, bit for bit, for any batch."""
    rng = np.random.default_rng(n)
    rt = BoxRuntime(
        layers=["a", "b"],
        n_classes=1,
        good={},
        bad={},
        score_layers=["a", "b"],
        score_scales={"a": 3.0, "b": 0.7},
        score="fused",
        contrast_layers=["a"],
        contrast_scales={"a": 0.3},
        score_mean=mean,
        energy_center=-1.0 if mean == "quadratic" else None,
        energy_scale=2.0 if mean == "quadratic" else None,
    )
    dist = {k: rng.random(n) * 5 for k in "ab"}
    dist["b"][0] = np.inf
    contrast, energy = {"a": rng.random(n)}, rng.normal(size=n)
    dist_rows = [dist["a"] / 3.0, dist["b"] / 0.7]
    con_rows = [contrast["a"] / 0.3]
    with np.errstate(invalid="ignore", over="ignore"):
        if mean == "quadratic":
            term = np.maximum(energy + 1.0, 0.0) / 2.0
            want = np.sqrt(np.mean(np.square([*dist_rows, *con_rows, term, term]), axis=0))
        else:
            want = np.mean(dist_rows, axis=0) + np.mean(con_rows, axis=0)
    want[~np.isfinite(want)] = np.inf
    np.testing.assert_array_equal(rt.combine_scores(dist, contrast, energy), want)


def test_round_trip_through_signed_artifact():
    rng = np.random.default_rng(3)
    rt = BoxRuntime(
        layers=["a", "b"],
        n_classes=4,
        good={"a": _random_boxset(rng, 4, 6), "b": _random_boxset(rng, 4, 3, empty_class=2)},
        bad={"a": _random_boxset(rng, 4, 6, empty_class=0), "b": _random_boxset(rng, 4, 3)},
        normalize="l2",
        combine="majority",
        score_layers=["a"],
        score_scales={"a": 0.5},
        threshold=1.25,
        meta={"tau": {"a": [0.1] * 4}},
    )
    key = Ed25519PrivateKey.generate()
    data = build_artifact_bytes(rt.to_members(), private_key=key, created_at=0)
    art = load_artifact(data, {key_id(key.public_key()): key.public_key()})
    back = BoxRuntime.from_members(art.json, art.arrays)
    acts = {"a": rng.normal(size=(200, 6)), "b": rng.normal(size=(200, 3))}
    y = rng.integers(0, 4, size=200)
    for got, want in zip(back.verdicts(acts, y), rt.verdicts(acts, y), strict=True):
        if isinstance(want, dict):
            for layer in want:
                np.testing.assert_array_equal(got[layer], want[layer])
        else:
            np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(back.scores(acts, y), rt.scores(acts, y))
    assert (back.threshold, back.combine, back.normalize, back.score_scales) == (
        1.25,
        "majority",
        "l2",
        {"a": 0.5},
    )
    # Same content -> byte-identical artifact.
    assert build_artifact_bytes(back.to_members(), private_key=key, created_at=0) == data


def test_from_members_rejects_malformed():
    members = example_runtime().to_members()
    spec = dict(members["monitors/boxes.json"], format="other")
    with pytest.raises(ArtifactError, match="not a boxwatch.boxes"):
        BoxRuntime.from_members({"monitors/boxes.json": spec}, members)
    arrays = dict(members["monitors/boxes.npz"])
    del arrays["L0.good.lo"]
    with pytest.raises(ArtifactError, match="malformed"):
        BoxRuntime.from_members(members, {"monitors/boxes.npz": arrays})


def test_decide_needs_threshold():
    rt = example_runtime()
    with pytest.raises(ConfigError, match="calibrate"):
        rt.decide(np.zeros(2))
