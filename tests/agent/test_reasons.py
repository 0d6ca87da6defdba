"""Why each verdict was given (``BoxRuntime.explain``): every reason where it should be, the
layer it points at and the nearest other class, failing closed on non-finite values; each
with the native kernel and numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from boxwatch.agent import boxes as boxes_module
from boxwatch.agent import vocab
from boxwatch.agent.boxes import (
    ACCEPT,
    KERNELS,
    NOT_FINITE,
    OUT_OF_RANGE,
    REJECT,
    UNCERTAIN,
    BoxRuntime,
    BoxSet,
    ErrorModel,
    Reasons,
    set_box_kernel,
    verdict_names,
)
from boxwatch.agent.mahalanobis import RelativeMahalanobis

LAYERS = ["a", "b"]
# Layer "a": class 0 at [0, 1]^2, class 1 at [4, 5] x [0, 1], class 2 at [0, 1] x [4, 5].
# Layer "b": class 0 and class 1 at [0, 1]^2; class 2 has no box there.
BOXES_A = [((0, 0), (1, 1)), ((4, 0), (5, 1)), ((0, 4), (1, 5))]
BOXES_B = [((0, 0), (1, 1)), ((0, 0), (1, 1)), None]
STRONG = [20.0, 0.0, 0.0]  # confident, low energy
WEAK = [0.0, 0.0, 0.0]  # unsure and high energy
CLOSE_CALL = [20.0, 19.9, 0.0]  # low energy, but only ~52% confident


@pytest.fixture(autouse=True, params=KERNELS)
def kernel(request: pytest.FixtureRequest):
    """Every test with the native kernel and with numpy."""
    if request.param == "native" and boxes_module._NATIVE is None:
        pytest.skip("the native box kernel is not built (it needs a C compiler at install time)")
    previous = set_box_kernel(request.param)
    yield request.param
    set_box_kernel(previous)


def _boxes(spec: list[Any]) -> BoxSet:
    per_class = [
        (np.zeros((0, 2)), np.zeros((0, 2)))
        if box is None
        else (np.array([box[0]], np.float32), np.array([box[1]], np.float32))
        for box in spec
    ]
    return BoxSet.from_boxes(per_class, 2)


def make_runtime(**changes: Any) -> BoxRuntime:
    """A calibrated, fused, quadratic monitor with an energy term and a confidence floor.

    Distances in "a" weigh a tenth (scale 10), its contrast term double (scale 0.5), so
    an input inside another class's box of "a" is rejected by the contrast term.
    """
    empty = _boxes([None] * 3)
    settings: dict[str, Any] = dict(
        layers=LAYERS,
        n_classes=3,
        good={"a": _boxes(BOXES_A), "b": _boxes(BOXES_B)},
        bad={"a": empty, "b": empty},
        normalize="none",
        combine="calibrated",
        score_layers=LAYERS,
        score_scales={"a": 10.0, "b": 1.0},
        threshold=0.5,
        score="fused",
        contrast_layers=["a"],
        contrast_scales={"a": 0.5},
        contrast_classes=1,
        uncertainty="confidence",
        confidence_floor=0.9,
        score_mean="quadratic",
        energy_center=-5.0,
        energy_scale=0.5,
    )
    settings.update(changes)
    return BoxRuntime(**settings)


def far_from_means(scale: float, center: float = 0.0) -> dict[str, RelativeMahalanobis]:
    """A relative Mahalanobis term on layer "a": the squared distance to (-10, -10) for every
    class (identity precision, no background), above ``center``, over ``scale``."""
    corner = np.full((3, 2), -10.0)
    return {
        "a": RelativeMahalanobis(
            np.zeros(2), np.eye(2), corner, np.einsum("kj,kj->k", corner, corner), center, scale
        )
    }


def explain(rt: BoxRuntime, rows: list[tuple[Any, Any, int, list[float]]]):
    """``rt.explain`` of inputs given as (a, b, predicted class, logits)."""
    acts = {
        "a": np.array([r[0] for r in rows], np.float32),
        "b": np.array([r[1] for r in rows], np.float32),
    }
    y = np.array([r[2] for r in rows])
    logits = np.array([r[3] for r in rows])
    return rt.explain(acts, y, logits=logits)


def named(reasons: Reasons) -> list[tuple[str, str | None, int]]:
    return list(
        zip(reasons.names().tolist(), reasons.layers(), reasons.nearest.tolist(), strict=True)
    )


def test_each_reason_of_the_calibrated_rule_where_expected():
    rt = make_runtime()
    combined, _per, _scores, why = explain(
        rt,
        [
            ((0.5, 0.5), (0.5, 0.5), 0, STRONG),  # inside every box, confident
            ((0.5, 0.5), (9.0, 0.5), 0, STRONG),  # far off in "b"
            ((4.5, 0.5), (0.5, 0.5), 0, STRONG),  # inside class 1's box of "a"
            ((0.5, 0.5), (0.5, 0.5), 0, WEAK),  # inside every box, weak logits
            ((0.5, 0.5), (0.8, 0.5), 0, CLOSE_CALL),  # familiar, the model torn
        ],
    )
    assert verdict_names(combined).tolist() == [
        "accept",
        "reject",
        "reject",
        "reject",
        "uncertainty",
    ]
    assert named(why) == [
        ("familiar", None, -1),
        ("outside_boxes", "b", 1),
        ("between_classes", "a", 1),
        ("energy", "a", 1),  # the energy names the farthest layer (all 0 here: the first)
        ("low_confidence", "a", 1),
    ]


def test_a_relative_mahalanobis_term_rejects_inside_every_box_and_names_its_layer():
    """Inside every box and confident, but far from the term's class mean: only the term
    (squared distance 220.5 over 40) makes the score, one of its six terms (two distances,
    a contrast term, the energy twice); without it the input is familiar."""
    rows = [((0.5, 0.5), (0.5, 0.5), 0, STRONG)]
    combined, _per, scores, why = explain(make_runtime(mahalanobis=far_from_means(40.0)), rows)
    assert verdict_names(combined).tolist() == ["reject"]
    assert scores[0] == pytest.approx(np.sqrt((220.5 / 40) ** 2 / 6))
    assert named(why) == [("mahalanobis", "a", 1)]
    combined, _per, _scores, why = explain(make_runtime(), rows)
    assert named(why) == [("familiar", None, -1)]


def test_relative_mahalanobis_terms_count_only_with_the_fused_quadratic_score():
    rows = [((0.5, 0.5), (0.5, 0.5), 0, STRONG)]
    for changes in ({"score_mean": "arithmetic"}, {"score": "distance", "contrast_layers": []}):
        rt = make_runtime(mahalanobis=far_from_means(40.0), **changes)
        assert rt.mahalanobis_layers() == []
        combined, _per, _scores, why = explain(rt, rows)
        assert named(why) == [("familiar", None, -1)], changes


@pytest.mark.parametrize("contrast", [["a"], ["a", "b"]])
def test_a_class_without_boxes_is_outside_not_not_finite(contrast):
    """Its distance is infinite; its contrast term in "b" (infinite / infinite) is NaN and
    decides nothing."""
    rt = make_runtime(contrast_layers=contrast)
    combined, _per, scores, why = explain(rt, [((0.5, 4.5), (0.5, 0.5), 2, [0.0, 0.0, 20.0])])
    assert combined.tolist() == [REJECT] and np.isinf(scores[0])
    assert named(why)[0][:2] == ("outside_boxes", "b")


def test_the_energy_term_weighs_as_often_as_the_score_counts_it():
    """Energy term 1.0 (counted twice: 2.0 of the sum of squares) beats a distance term of
    1.2 (1.44), though it is smaller."""
    equal = 4.5 - np.log(3)  # energy -(equal + log 3) = -4.5: term (-4.5 + 5) / 0.5 = 1
    rt = make_runtime()
    assert why_of(rt, [((0.5, 0.5), (2.2, 0.5), 0, [equal] * 3)]) == [("energy", "b", 1)]


def test_the_nearest_class_is_the_nearest_box_among_the_contrast_classes():
    point = [((0.5, 3.0), (0.5, 0.5), 0, STRONG)]  # 1.0 from class 2's box, 4.0 from class 1's
    rt = make_runtime(contrast_classes=0, threshold=0.2)  # every other class: nearest box
    assert why_of(rt, point) == [("between_classes", "a", 2)]
    # One class per class (the default): the class whose boxes the contrast measured.
    assert why_of(make_runtime(threshold=0.2), point) == [("between_classes", "a", 1)]


def test_the_nearest_class_comes_from_the_contrast_layer_with_the_largest_term():
    """Class 0's nearest class is 1 in "a" and 2 in "b" (class 2's box in "b" lies at
    [0, 1] x [3, 4], class 1's far off)."""
    good_b = _boxes([((0, 0), (1, 1)), ((9, 9), (10, 10)), ((0, 3), (1, 4))])
    rt = make_runtime(
        good={"a": _boxes(BOXES_A), "b": good_b},
        contrast_layers=["a", "b"],
        contrast_scales={"a": 0.5, "b": 0.25},
        threshold=0.3,
    )
    rows = [
        ((0.5, 0.5), (0.5, 2.0), 0, STRONG),  # halfway to class 2's box in "b"
        ((2.5, 0.5), (0.5, 0.5), 0, STRONG),  # halfway to class 1's box in "a"
    ]
    assert why_of(rt, rows) == [("between_classes", "b", 2), ("between_classes", "a", 1)]


def why_of(rt: BoxRuntime, rows: list[tuple[Any, Any, int, list[float]]]):
    return named(explain(rt, rows)[3])


def test_without_contrast_terms_the_nearest_class_is_the_runner_up_of_the_logits():
    rt = make_runtime(score="distance", contrast_layers=[], score_mean="quadratic")
    assert rt.has_energy_term() is False
    rows = [((0.5, 0.5), (9.0, 0.5), 0, [20.0, 1.0, 3.0]), ((0.5, 0.5), (9.0, 0.5), 1, [0, 9, 8])]
    assert why_of(rt, rows) == [("outside_boxes", "b", 2), ("outside_boxes", "b", 2)]


def test_the_arithmetic_mean_weighs_each_kind_by_its_own_count():
    # Distance terms "a" 0.05 and "b" 0.5 (mean 0.275), one contrast term (0.5 / 3) / 0.5 =
    # 0.33: the contrast's share 0.33 beats "b"'s 0.25, though "b"'s term is larger.
    rt = make_runtime(score_mean="arithmetic", energy_center=None, energy_scale=None)
    rt.threshold = 0.1
    point = [((1.5, 0.5), (1.5, 0.5), 0, STRONG)]
    assert why_of(rt, point) == [("between_classes", "a", 1)]
    rt.contrast_scales = {"a": 100.0}  # the contrast term weighs nothing now
    assert why_of(rt, point) == [("outside_boxes", "b", 1)]


@pytest.mark.parametrize(
    "broken",
    [
        ("a", np.nan),
        ("b", np.inf),
        ("logits", np.nan),
        ("logits", -np.inf),
    ],
)
def test_non_finite_values_are_rejected_as_not_finite(broken):
    where, value = broken
    rows = [((0.5, 0.5), (0.5, 0.5), 0, list(STRONG)) for _ in range(3)]
    a, b, y, logits = rows[1]
    if where == "logits":
        logits[1] = value
    else:
        a, b = ((value, 0.5), b) if where == "a" else (a, (0.5, value))
    rows[1] = (a, b, y, logits)
    # Also a monitor whose verdicts never read the logits (no floor, no energy term).
    for rt in (make_runtime(), make_runtime(confidence_floor=None, energy_scale=None)):
        combined, per, _scores, why = explain(rt, rows)
        assert combined.tolist() == [ACCEPT, REJECT, ACCEPT]
        assert all(v.tolist() == [ACCEPT, REJECT, ACCEPT] for v in per.values())
        assert named(why) == [("familiar", None, -1), ("not_finite", None, -1)] + [
            ("familiar", None, -1)
        ]


def test_a_non_finite_layer_outside_the_score_is_found_too():
    rt = make_runtime(score_layers=["a"], contrast_layers=["a"])
    combined, _per, _scores, why = explain(rt, [((0.5, 0.5), (np.nan, 0.5), 0, STRONG)])
    assert combined.tolist() == [REJECT] and why.names().tolist() == ["not_finite"]


def test_bad_boxes_give_their_reason_and_layer():
    bad_b = _boxes([((0, 0), (1, 1)), None, None])
    rt = make_runtime(uncertainty="bad-box", bad={"a": _boxes([None] * 3), "b": bad_b})
    combined, _per, _scores, why = explain(rt, [((0.5, 0.5), (0.5, 0.5), 0, STRONG)])
    assert combined.tolist() == [UNCERTAIN] and named(why) == [("bad_box", "b", 1)]


@pytest.mark.parametrize("rule", ["any", "majority", "all"])
def test_rules_over_layer_verdicts_name_the_first_layer_that_made_the_verdict(rule):
    bad_a = _boxes([((0, 0), (1, 1)), None, None])
    rt = make_runtime(combine=rule, bad={"a": bad_a, "b": _boxes([None] * 3)})
    rows = [
        ((0.5, 0.5), (0.5, 0.5), 1, [0.0, 20.0, 0.0]),  # class 1: "a" rejects, "b" accepts
        ((0.5, 0.5), (0.5, 0.5), 0, STRONG),  # class 0: inside a bad box of "a"
        ((9.0, 9.0), (9.0, 9.0), 0, STRONG),  # outside everything
    ]
    combined, _per, _scores, why = explain(rt, rows)
    first = {"any": "reject", "majority": "uncertainty", "all": "uncertainty"}[rule]
    assert verdict_names(combined).tolist() == [first, "uncertainty", "reject"]
    assert [(r, layer) for r, layer, _ in named(why)] == [
        ("outside_boxes", "a"),
        ("bad_box", "a"),
        ("outside_boxes", "a"),
    ]


def test_explain_gives_the_verdicts_and_scores_of_assess_and_reasons_that_fit_them():
    rng = np.random.default_rng(7)
    n = 400
    y = rng.integers(0, 3, n)
    # Half the inputs near their class's boxes (class 2 has none in "b"), half anywhere.
    near = {
        "a": np.array([BOXES_A[c][0] for c in y]) + rng.uniform(-0.2, 1.2, (n, 2)),
        "b": rng.uniform(-0.2, 1.2, (n, 2)),
    }
    anywhere = rng.uniform(-1, 6, size=(n, 2))
    acts = {k: np.where(np.arange(n)[:, None] < n // 2, v, anywhere) for k, v in near.items()}
    logits = rng.normal(0, 8, size=(n, 3))
    logits[np.arange(n), y] += 12  # mostly predicting y
    seen: set[str] = set()
    for changes in (
        {},
        {"contrast_classes": 0},
        {"score": "distance", "contrast_layers": []},
        {"score_mean": "arithmetic", "energy_center": None, "energy_scale": None},
        {"uncertainty": "bad-box"},
        {"combine": "any"},
        {"combine": "all"},
        {"mahalanobis": far_from_means(40.0, center=300.0)},
    ):
        bad = {"a": _boxes([((0, 0), (0.5, 0.5)), None, None]), "b": _boxes([None] * 3)}
        rt = make_runtime(bad=bad, **changes)
        want = rt.assess(acts, y, logits=logits)
        combined, per, scores, why = rt.explain(acts, y, logits=logits)
        np.testing.assert_array_equal(combined, want[0])
        for layer in LAYERS:
            np.testing.assert_array_equal(per[layer], want[1][layer])
        np.testing.assert_array_equal(scores, want[2])
        verdicts = verdict_names(combined).tolist()
        reasons = why.names().tolist()
        assert all(v in vocab.REASON_VERDICTS[r] for v, r in zip(verdicts, reasons, strict=True)), (
            changes
        )
        flagged = combined != ACCEPT
        assert (why.layer[flagged] >= 0).all() and (why.layer[~flagged] == -1).all()
        assert (why.nearest[flagged] != y[flagged]).all() and (why.nearest[~flagged] == -1).all()
        assert flagged.any() and (~flagged).any(), changes
        seen |= set(reasons)
    assert seen == set(vocab.VERDICT_REASONS) - {"not_finite", "out_of_range"}


def test_override_keeps_the_layer_unless_nothing_finite_is_left():
    rt = make_runtime()
    _c, _p, _s, why = explain(rt, [((0.5, 0.5), (9.0, 0.5), 0, STRONG)] * 3)
    out = why.override(np.array([True, False, False]), OUT_OF_RANGE)
    gone = out.override(np.array([False, True, False]), NOT_FINITE)
    assert named(gone) == [
        ("out_of_range", "b", 1),
        ("not_finite", None, -1),
        ("outside_boxes", "b", 1),
    ]
    assert why.override(np.zeros(3, bool), NOT_FINITE) is why


def _error_model(shift: bool) -> ErrorModel:
    """An error model over the five error features (a term per class with ``shift``), its
    means float32 and its scales a strided view, as a caller may hand them."""
    return ErrorModel(
        mean=np.array([-0.5, -2.0, 3.0, 0.4, 0.3], np.float32),
        scale=np.array([0.7, 0.0, 1.5, 0.0, 2.0, 0.0, 0.6, 0.0, 0.2, 0.0])[::2],
        coef=np.array([-1.1, 0.4, -0.6, 1.3, 0.9]),
        intercept=-0.3,
        threshold=0.6,
        class_shift=np.array([0.2, -0.4, 0.7]) if shift else None,
    )


def test_native_kernel_gives_numpys_bits_for_scores_errors_and_reasons(kernel):
    """The native kernel's steps after the box tests (the output picks, the fused score, the
    relative Mahalanobis term, the error model, the reasons) give the numpy path's values
    bit for bit on every setting, with non-finite, tied and signed-zero outputs, a batch
    that is not a multiple of the vector width, and an input of a class without a box."""
    if boxes_module._NATIVE is None:
        pytest.skip("the native box kernel is not built (it needs a C compiler at install time)")
    rng = np.random.default_rng(12)
    n = 301
    y = rng.integers(0, 3, n)
    acts = {
        "a": np.array([BOXES_A[c][0] for c in y]) + rng.uniform(-0.6, 1.6, (n, 2)),
        "b": rng.uniform(-0.6, 1.6, (n, 2)),
    }
    acts["a"][:5] = np.nan
    acts["b"][5:8, 1] = np.inf
    logits = rng.normal(0, 4, size=(n, 3))
    logits[np.arange(n), y] += 5
    logits[10:20] = np.round(logits[10:20])  # ties, at the top too
    logits[20, :2] = logits[20].max() + 1
    logits[21], logits[22, 0], logits[23, 1] = 0.0, np.nan, -np.inf
    logits[24] = -0.0
    probabilities = np.exp(logits - np.nanmax(logits, axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    for changes in (
        {},
        {"peak_factor": 1.5},
        {"uncertainty": "error-model", "error_model": _error_model(shift=False)},
        {"uncertainty": "error-model", "error_model": _error_model(shift=True), "peak_factor": 2},
        {"mahalanobis": far_from_means(40.0, center=300.0), "peak_factor": 1.2},
        {"contrast_classes": 0},
        {"contrast_layers": [], "contrast_scales": {}},
        {"energy_center": None, "energy_scale": None},
        {
            "output": "probabilities",
            "uncertainty": "error-model",
            "error_model": _error_model(shift=True),
            "energy_center": None,
            "energy_scale": None,
        },
    ):
        rt = make_runtime(**changes)
        z = probabilities if rt.output == "probabilities" else logits
        got = {}
        for name in ("native", "numpy"):
            previous = set_box_kernel(name)
            try:
                combined, per, scores, why = rt.explain(acts, y, logits=z)
                error = rt.error_score(acts, y, z)
            finally:
                set_box_kernel(previous)
            got[name] = [combined, *per.values(), scores, why.codes, why.layer, why.nearest, error]
        for native, numpy in zip(got["native"], got["numpy"], strict=True):
            assert native.dtype == numpy.dtype, changes
            np.testing.assert_array_equal(native, numpy, err_msg=str(changes))
        assert (got["native"][0] != ACCEPT).any() and (got["native"][0] == ACCEPT).any(), changes
