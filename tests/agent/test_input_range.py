"""Inputs at the wrong scale (issue 29, point 12): the artifact records the preprocessed
training range; the agent counts inputs outside it in a metric and on the status page.

It must flag at most 1% of the validation inputs, and every input when [0, 1] floats are sent
to a model whose preprocessing divides by 255.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from boxwatch.agent.http import render_status_page
from boxwatch.agent.kafka import Record
from boxwatch.agent.preprocessing import InputRange, Preprocessing
from boxwatch.agent.service import BatchTally

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runtime(model_example):
    return model_example.runtime()


def _x(example, name: str) -> np.ndarray:
    return np.load(example.data / f"{name}.npz")["x"].reshape(-1, 64).astype(np.float64)


def test_the_build_records_the_preprocessed_training_range(model_example, runtime):
    spec = runtime.artifact.json("model/spec.json")
    pre = Preprocessing.from_dict(spec["preprocessing"])
    train = pre.apply(_x(model_example, "train")).reshape(-1, 64)
    assert spec["input_range"]["min"] == train.min(axis=0).tolist()
    assert spec["input_range"]["max"] == train.max(axis=0).tolist()
    assert runtime.input_range is not None


def test_at_most_one_percent_of_validation_inputs_are_flagged(model_example, runtime):
    val = _x(model_example, "validation")
    res = runtime.run_model(val)
    assert res.out_of_range is not None
    assert res.out_of_range.mean() <= 0.01, res.out_of_range.mean()


def test_inputs_already_scaled_are_all_flagged(model_example, runtime):
    """The example's preprocessing divides by 16; inputs sent already in [0, 1] are all flagged."""
    val = _x(model_example, "validation") / 16.0
    res = runtime.run_model(val)
    assert res.out_of_range.all()
    assert set(res.reasons.names().tolist()) == {"out_of_range"}
    far = _x(model_example, "validation") * 16.0  # the other way: raw values scaled twice
    assert runtime.run_model(far).out_of_range.all()


def test_out_of_range_is_the_reason_whatever_the_verdict_and_not_finite_wins(
    model_example, runtime
):
    """The reason of an input outside the training range is ``out_of_range`` (the verdict is
    the monitor's own, unchanged); an input that overflows the model is ``not_finite``."""
    val = _x(model_example, "validation")[:200]
    x = np.concatenate([val, val[:50] / 16.0, np.full((1, 64), 1e300)])
    res = runtime.run_model(x)
    plain = runtime.run_model(x[:-1])
    np.testing.assert_array_equal(res.verdicts[:-1], plain.verdicts)
    names = res.reasons.names()
    assert (names[res.out_of_range[:-1].nonzero()[0]] == "out_of_range").all()
    assert "out_of_range" not in names[:200][~res.out_of_range[:200]].tolist()
    assert names[-1] == "not_finite" and res.out_of_range[-1]
    layers = res.reasons.layers()
    flagged = [i for i in range(len(x) - 1) if res.verdicts[i] != 0]
    assert flagged and all(layers[i] is not None for i in flagged)


def test_unit_floats_to_a_model_dividing_by_255(model_example):
    """Raw 0-255 training pixels, preprocessing x/255; inputs sent as [0, 1] floats."""
    pre = Preprocessing(shape=(64,), scale=1 / 255)
    raw_train = _x(model_example, "train") * (255 / 16)
    raw_val = _x(model_example, "validation") * (255 / 16)
    rng = InputRange.fit(pre.apply(raw_train))
    assert rng.outside(pre.apply(raw_val)).mean() <= 0.01
    assert rng.outside(pre.apply(raw_val / 255)).all()
    again = InputRange.from_dict(rng.to_dict(), 64)
    np.testing.assert_array_equal(again.outside(pre.apply(raw_val / 255)), True)


def test_the_agent_counts_them_in_a_metric_and_on_the_status_page(model_example, agent_factory):
    agent = agent_factory(model_example)
    cfg = agent.cfg
    val = _x(model_example, "validation")[:20] / 16.0
    records = [
        Record(
            cfg["topics.inputs"],
            0,
            i,
            0,
            None,
            json.dumps({"id": f"r{i}", "input": row.tolist()}).encode(),
            [],
        )
        for i, row in enumerate(val)
    ]
    tally = BatchTally()
    outputs = agent.process(records, tally)
    agent._count_delivered(tally, outputs)
    value = agent.metrics.registry.get_sample_value("boxwatch_agent_inputs_out_of_range_total")
    assert value == 20
    verdicts = [json.loads(o.value) for o in outputs if o.kind == "verdict"]
    assert len(verdicts) == 20 and {v["reason"] for v in verdicts} == {"out_of_range"}
    by_reason = sum(
        agent.metrics.registry.get_sample_value(
            "boxwatch_agent_verdict_reasons_total", {"verdict": v, "reason": "out_of_range"}
        )
        for v in ("accept", "uncertainty", "reject")
    )
    assert by_reason == 20
    info = {
        **agent.status.snapshot(),
        "artifact_id": "a",
        "model_version": "m",
        "ready": True,
        "monitors_model": True,
        "has_bn": False,
        "input_range_checked": True,
    }
    page = render_status_page(info)
    assert 'id="out-of-range"' in page and "wrong scale" in page
    assert 'id="reason-out_of_range">20<' in page and 'id="reason-familiar">0<' in page
    assert "BN gate" not in page
