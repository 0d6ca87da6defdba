"""The batch verdict encoder and the batch histogram update equal their one-at-a-time forms."""

from __future__ import annotations

import json
import math
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from boxwatch.agent.boxes import Reasons
from boxwatch.agent.metrics import observe_many
from boxwatch.agent.outputs import VerdictEncoder, _combinations, json_numbers, verdict_output
from boxwatch.agent.vocab import VERDICT_REASONS, VERDICTS

NAMES = st.text(min_size=1, max_size=12)


@st.composite
def batches(draw):
    """A batch as the model path codes it: class, verdict, reason, layer and nearest-class
    codes (a class code may lie one past the names: written as its number)."""
    n = draw(st.integers(1, 6))
    layers = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    reason_layers = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    classes = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))

    def codes(low: int, high: int) -> np.ndarray:
        return np.array(draw(st.lists(st.integers(low, high), min_size=n, max_size=n)))

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
        "classes": classes,
        "predicted": codes(0, len(classes)),
        "verdicts": codes(0, 2).astype(np.int8),
        "layers": {name: codes(0, 2).astype(np.int8) for name in layers},
        "reasons": Reasons(
            codes(0, len(VERDICT_REASONS) - 1).astype(np.int8),
            codes(-1, len(reason_layers) - 1).astype(np.int16),
            codes(-1, len(classes)),
            tuple(reason_layers),
        ),
        "scores": draw(st.lists(floats, min_size=n, max_size=n)),
        "accepted": draw(st.none() | st.lists(st.booleans(), min_size=n, max_size=n)),
        "artifact_id": draw(st.text(max_size=16)),
        "model_version": draw(st.text(max_size=10)),
        "timings": {"inference_ms": draw(st.floats(0, 1e3)), "batch_records": n},
    }


def _class(b: dict, c: int) -> str | None:
    return None if c < 0 else b["classes"][c] if c < len(b["classes"]) else str(c)


def _encode(encoder: VerdictEncoder, b: dict) -> list:
    heads = encoder.heads(b["predicted"], b["verdicts"], b["layers"], b["reasons"])
    return encoder.outputs(
        b["recs"],
        b["ids"],
        heads,
        scores=b["scores"],
        accepted=b["accepted"],
        timings=b["timings"],
    )


def _reference(b: dict, i: int):
    """Record ``i`` of the batch as ``verdict_output`` writes it (one json.dumps)."""
    r, score = b["reasons"], b["scores"][i]
    layer = int(r.layer[i])
    body = {
        "predicted_class": _class(b, int(b["predicted"][i])),
        "verdict": VERDICTS[b["verdicts"][i]],
        "reason": VERDICT_REASONS[r.codes[i]],
        "layer": None if layer < 0 else r.layer_names[layer],
        "nearest_class": _class(b, int(r.nearest[i])),
        "layers": {k: VERDICTS[v[i]] for k, v in b["layers"].items()},
        "score": score if math.isfinite(score) else None,
        "score_accepted": None if b["accepted"] is None else b["accepted"][i],
        "artifact_id": b["artifact_id"],
        "model_version": b["model_version"],
        "timings": b["timings"],
    }
    return verdict_output("v", b["recs"][i], b["ids"][i], body)


def _encoder(b: dict) -> VerdictEncoder:
    return VerdictEncoder(
        "v", b["classes"], artifact_id=b["artifact_id"], model_version=b["model_version"]
    )


@settings(max_examples=200, deadline=None)
@given(batches())
def test_batch_encoder_writes_the_same_bytes_as_the_reference(b):
    got = _encode(_encoder(b), b)
    assert got == [_reference(b, i) for i in range(len(b["ids"]))]


@settings(max_examples=50, deadline=None)
@given(batches(), st.randoms(use_true_random=False))
def test_heads_encoded_by_an_earlier_batch_give_the_same_bytes(b, rnd):
    """The encoder keeps each head it encoded: a later batch reusing them (in another
    order) gets the bytes a fresh encoder writes."""
    encoder, r = _encoder(b), b["reasons"]
    _encode(encoder, b)
    order = list(range(len(b["ids"])))
    rnd.shuffle(order)
    again = {
        **b,
        "recs": [b["recs"][i] for i in order],
        "ids": [b["ids"][i] for i in order],
        "predicted": b["predicted"][order],
        "verdicts": b["verdicts"][order],
        "layers": {k: v[order] for k, v in b["layers"].items()},
        "reasons": Reasons(r.codes[order], r.layer[order], r.nearest[order], r.layer_names),
        "scores": [b["scores"][i] for i in order],
        "accepted": None if b["accepted"] is None else [b["accepted"][i] for i in order],
    }
    assert _encode(encoder, again) == _encode(_encoder(again), again)


def test_heads_count_each_distinct_combination():
    rng = np.random.default_rng(0)
    n = 500
    b = {
        "classes": ["a", "b", "c"],
        "predicted": rng.integers(0, 3, n),
        "verdicts": rng.integers(0, 3, n).astype(np.int8),
        "layers": {"l1": rng.integers(0, 3, n).astype(np.int8)},
        "reasons": Reasons(
            rng.integers(0, len(VERDICT_REASONS), n).astype(np.int8),
            rng.integers(-1, 1, n).astype(np.int16),
            rng.integers(-1, 3, n),
            ("l1",),
        ),
    }
    heads = _encoder({**b, "artifact_id": "x", "model_version": "1"}).heads(
        b["predicted"], b["verdicts"], b["layers"], b["reasons"]
    )
    want = Counter(
        zip(
            b["predicted"].tolist(),
            b["verdicts"].tolist(),
            b["reasons"].codes.tolist(),
            b["reasons"].layer.tolist(),
            b["reasons"].nearest.tolist(),
            b["layers"]["l1"].tolist(),
            strict=True,
        )
    )
    assert sorted(heads.counts) == sorted(want.values())
    assert sum(heads.counts) == n and len(set(heads.heads)) == len(heads.heads)
    by_label: Counter = Counter()
    for (by_class, by_reason, by_layer), count in zip(heads.labels, heads.counts, strict=True):
        by_label.update({by_class: count, by_reason: count, **dict.fromkeys(by_layer, count)})
    names = {
        "predicted": [b["classes"][c] for c in b["predicted"].tolist()],
        "verdicts": [VERDICTS[v] for v in b["verdicts"].tolist()],
        "reasons": [VERDICT_REASONS[r] for r in b["reasons"].codes.tolist()],
        "l1": [VERDICTS[v] for v in b["layers"]["l1"].tolist()],
    }
    assert by_label == Counter(
        [
            *zip(names["verdicts"], names["predicted"], strict=True),
            *zip(names["verdicts"], names["reasons"], strict=True),
            *(("l1", v, c) for v, c in zip(names["l1"], names["predicted"], strict=True)),
        ]
    )
    for i in range(n):
        h = heads.heads[heads.of[i]]
        assert (h.predicted, h.verdict) == (
            b["classes"][b["predicted"][i]],
            VERDICTS[b["verdicts"][i]],
        )


def test_combinations_past_the_int64_range_match_unique_rows():
    """Codes whose radices multiply past 2**62 are packed column by column, renumbered on
    the way: the same groups as ``np.unique`` of the rows."""
    rng = np.random.default_rng(1)
    codes = np.column_stack(
        [rng.integers(-1, 2, 300), *(rng.choice([-1, 10**6], 300) for _ in range(8))]
    ).astype(np.int64)
    first, of = _combinations(codes)
    rows, want = np.unique(codes, axis=0, return_inverse=True)
    assert len(first) == len(rows)
    assert (codes[first][of] == codes).all()
    assert len(set(zip(of.tolist(), want.reshape(-1).tolist(), strict=True))) == len(rows)


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
