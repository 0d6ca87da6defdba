"""The "calibrated" combination rule against a naive reading of its definition."""

from __future__ import annotations

import numpy as np
import pytest

from boxwatch.agent.boxes import ACCEPT, REJECT, UNCERTAIN, BoxRuntime, BoxSet
from boxwatch.agent.errors import ConfigError


def random_boxes(rng, n_classes, per_class, d):
    out = []
    for _ in range(n_classes):
        lo = rng.uniform(-1, 0.5, size=(per_class, d))
        out.append((lo, lo + rng.uniform(0.1, 1.0, size=(per_class, d))))
    return BoxSet.from_boxes(out, d)


def naive_distance(boxes: BoxSet, x, y):
    lo, hi = boxes.boxes_of(y)
    if len(lo) == 0:
        return np.inf
    return min(float(np.linalg.norm(np.clip(x, a, b) - x)) for a, b in zip(lo, hi, strict=True))


def naive_inside(boxes: BoxSet, x, y):
    lo, hi = boxes.boxes_of(y)
    return any(np.all((x >= a) & (x <= b)) for a, b in zip(lo, hi, strict=True))


def test_calibrated_rule_matches_its_definition():
    rng = np.random.default_rng(7)
    layers, d, n_classes = ["a", "b"], 3, 4
    good = {layer: random_boxes(rng, n_classes, 3, d) for layer in layers}
    bad = {layer: random_boxes(rng, n_classes, 2, d) for layer in layers}
    rt = BoxRuntime(
        layers=layers,
        n_classes=n_classes,
        good=good,
        bad=bad,
        normalize="none",
        combine="calibrated",
        score_layers=layers,
        score_scales={"a": 0.5, "b": 2.0},
        threshold=0.8,
    )
    acts = {layer: rng.uniform(-1.2, 1.6, size=(400, d)).astype(np.float32) for layer in layers}
    y = rng.integers(0, n_classes, 400)
    combined, per_layer = rt.verdicts(acts, y)
    seen = set()
    for i in range(400):
        score = np.mean(
            [
                naive_distance(good[layer], acts[layer][i], y[i]) / rt.score_scales[layer]
                for layer in layers
            ]
        )
        in_bad = any(naive_inside(bad[layer], acts[layer][i], y[i]) for layer in layers)
        expected = REJECT if score > rt.threshold else UNCERTAIN if in_bad else ACCEPT
        assert combined[i] == expected, i
        seen.add(expected)
    assert seen == {ACCEPT, UNCERTAIN, REJECT}
    np.testing.assert_array_equal(rt.scores(acts, y) > rt.threshold, combined == REJECT)
    assert set(per_layer) == set(layers)


def test_calibrated_rule_needs_a_threshold():
    rng = np.random.default_rng(0)
    boxes = {"a": random_boxes(rng, 2, 1, 2)}
    rt = BoxRuntime(
        layers=["a"],
        n_classes=2,
        good=boxes,
        bad=boxes,
        normalize="none",
        combine="calibrated",
        score_layers=["a"],
    )
    with pytest.raises(ConfigError, match="calibrate the monitor first"):
        rt.verdicts({"a": np.zeros((3, 2), np.float32)}, np.zeros(3, int))


@pytest.mark.parametrize("padded_elements", [0, 1 << 30])
def test_distance_and_contains_equals_the_separate_answers(monkeypatch, padded_elements):
    monkeypatch.setattr("boxwatch.agent.boxes._PADDED_ELEMENTS", padded_elements)
    rng = np.random.default_rng(3)
    boxes = random_boxes(rng, 5, 4, 6)
    x = rng.uniform(-1.2, 1.6, size=(300, 6)).astype(np.float32)
    y = rng.integers(0, 5, 300)
    for i in range(20):  # corners of a box of the class: inside (closed boxes), distance 0
        lo, hi = boxes.boxes_of(y[i])
        x[i] = lo[0] if i % 2 else hi[0]
    dist, inside = boxes.distance_and_contains(x, y)
    np.testing.assert_array_equal(inside, boxes.contains(x, y))
    np.testing.assert_allclose(dist, boxes.distance(x, y), rtol=1e-6)
    np.testing.assert_array_equal(inside, dist == 0)
    assert inside.any() and not inside.all()
