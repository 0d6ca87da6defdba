"""The batch verdict encoder and the batch histogram update equal their one-at-a-time forms."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from boxwatch.agent.metrics import observe_many
from boxwatch.agent.outputs import json_numbers, verdict_output, verdict_outputs
from boxwatch.agent.vocab import VERDICT_REASONS

VERDICTS = st.sampled_from(["accept", "uncertainty", "reject"])
REASONS = st.sampled_from(VERDICT_REASONS)
NAMES = st.text(min_size=1, max_size=12)


@st.composite
def batches(draw):
    n = draw(st.integers(1, 6))
    layers = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    classes = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    recs = [
        SimpleNamespace(
            topic=draw(st.sampled_from(["in", "in.2", 'we"ird\\tópic'])),
            partition=draw(st.integers(0, 50)),
            offset=draw(st.integers(0, 2**40)),
        )
        for _ in range(n)
    ]
    floats = st.floats(allow_nan=True, allow_infinity=True, width=64)
    return {
        "recs": recs,
        "ids": draw(st.lists(st.text(min_size=1, max_size=20), min_size=n, max_size=n)),
        "predicted": draw(st.lists(st.sampled_from(classes), min_size=n, max_size=n)),
        "verdicts": draw(st.lists(VERDICTS, min_size=n, max_size=n)),
        "reasons": draw(st.lists(REASONS, min_size=n, max_size=n)),
        "reason_layers": draw(
            st.lists(st.none() | st.sampled_from(layers), min_size=n, max_size=n)
        ),
        "nearest": draw(st.lists(st.none() | st.sampled_from(classes), min_size=n, max_size=n)),
        "layers": {name: draw(st.lists(VERDICTS, min_size=n, max_size=n)) for name in layers},
        "scores": draw(st.lists(floats, min_size=n, max_size=n)),
        "accepted": draw(st.none() | st.lists(st.booleans(), min_size=n, max_size=n)),
        "artifact_id": draw(st.text(max_size=16)),
        "model_version": draw(st.text(max_size=10)),
        "timings": {"inference_ms": draw(st.floats(0, 1e3)), "batch_records": n},
    }


@settings(max_examples=200, deadline=None)
@given(batches())
def test_batch_encoder_writes_the_same_bytes_as_the_reference(b):
    got = verdict_outputs(
        "v",
        b["recs"],
        b["ids"],
        predicted=b["predicted"],
        verdicts=b["verdicts"],
        reasons=b["reasons"],
        reason_layers=b["reason_layers"],
        nearest=b["nearest"],
        layers=b["layers"],
        scores=b["scores"],
        accepted=b["accepted"],
        artifact_id=b["artifact_id"],
        model_version=b["model_version"],
        timings=b["timings"],
    )
    assert len(got) == len(b["ids"])
    for i, out in enumerate(got):
        score = b["scores"][i]
        body = {
            "predicted_class": b["predicted"][i],
            "verdict": b["verdicts"][i],
            "reason": b["reasons"][i],
            "layer": b["reason_layers"][i],
            "nearest_class": b["nearest"][i],
            "layers": {k: v[i] for k, v in b["layers"].items()},
            "score": score if math.isfinite(score) else None,
            "score_accepted": None if b["accepted"] is None else b["accepted"][i],
            "artifact_id": b["artifact_id"],
            "model_version": b["model_version"],
            "timings": b["timings"],
        }
        ref = verdict_output("v", b["recs"][i], b["ids"][i], body)
        assert out == ref


# Every magnitude, with most draws near the bounds where repr changes notation.
_SCORES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.builds(lambda m, e: m * 10.0**e, st.floats(-10, 10), st.integers(-7, 18)),
    st.sampled_from(
        [
            1e-4,
            9.999999999999999e-05,
            1e16,
            9999999999999998.0,
            1e-5,
            -0.0,
            0.0,
            5e-324,
            1.7976931348623157e308,
        ]
    ),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_SCORES, max_size=40))
def test_scores_are_written_as_json_dumps_writes_them(values):
    """msgspec's numbers match json.dumps byte for byte (null for NaN and infinities)."""
    want = [json.dumps(v).encode() if math.isfinite(v) else b"null" for v in values]
    assert json_numbers(values) == want


def _hist(registry):
    return Histogram("h_seconds", "h", buckets=(0.001, 0.01, 0.1, 1), registry=registry)


def test_observe_many_equals_observe_one_by_one():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.exponential(0.05, 500), [0.001, 0.01, 0.1, 1.0, 0.0, 7.5]])
    one, many = CollectorRegistry(), CollectorRegistry()
    h_one, h_many = _hist(one), _hist(many)
    for v in values:
        h_one.observe(float(v))
    observe_many(h_many, values[:100])
    observe_many(h_many, values[100:])
    observe_many(h_many, np.array([]))
    assert _series(one).keys() == _series(many).keys()
    for name, value in _series(one).items():
        if name.endswith("_sum"):  # one float addition vs many: the last bits may differ
            assert _series(many)[name] == pytest.approx(value, rel=1e-12)
        elif not name.endswith("_created"):
            assert _series(many)[name] == value, name


def _series(registry) -> dict[str, float]:
    lines = generate_latest(registry).decode().splitlines()
    return {
        ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1])
        for ln in lines
        if ln and not ln.startswith("#")
    }


def test_observe_many_without_the_internals_falls_back():
    calls = []
    fake = SimpleNamespace(observe=calls.append)
    observe_many(fake, np.array([0.5, 2.0]))
    assert calls == [0.5, 2.0]
