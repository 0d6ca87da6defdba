"""Inputs at the wrong scale (issue 29, point 12): the artifact records the preprocessed
training range; the agent counts inputs outside it in a metric and on the status page.

It must flag at most 1% of the validation inputs, and every input when [0, 1] floats are sent
to a model whose preprocessing divides by 255.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from boxwatch.agent.http import render_status_page
from boxwatch.agent.kafka import Record
from boxwatch.agent.preprocessing import (
    RANGE_MIN_INPUTS,
    RANGE_WARN_SHARE,
    InputRange,
    Preprocessing,
    RangeWindow,
)
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


def _records(agent, x: np.ndarray) -> list[Record]:
    return [
        Record(
            agent.cfg["topics.inputs"],
            0,
            i,
            0,
            None,
            json.dumps({"id": f"r{i}", "input": row.tolist()}).encode(),
            [],
        )
        for i, row in enumerate(x)
    ]


def _send(agent, x: np.ndarray) -> list:
    """``x`` through the agent in batches of 100, delivered as the loop would count them;
    every output."""
    every = []
    for start in range(0, len(x), 100):
        tally = BatchTally()
        outputs = agent.process(_records(agent, x[start : start + 100]), tally)
        agent._count_delivered(tally, outputs)
        every += outputs
    return every


def _page(agent) -> str:
    return render_status_page(
        {
            **agent.status.snapshot(),
            "artifact_id": "a",
            "model_version": "m",
            "ready": True,
            "monitors_model": True,
            "has_bn": False,
            "input_range_checked": True,
        }
    )


def test_the_agent_counts_them_in_a_metric_and_on_the_status_page(model_example, agent_factory):
    """Changed for issue 39 (point 7a): the page warns on the share of the recent window,
    once it holds RANGE_MIN_INPUTS inputs (it was 20 inputs over the lifetime share)."""
    agent = agent_factory(model_example)
    outputs = _send(agent, _x(model_example, "validation")[:RANGE_MIN_INPUTS] / 16.0)
    value = agent.metrics.registry.get_sample_value("boxwatch_agent_inputs_out_of_range_total")
    assert value == RANGE_MIN_INPUTS
    verdicts = [json.loads(o.value) for o in outputs if o.kind == "verdict"]
    assert len(verdicts) == RANGE_MIN_INPUTS
    assert {v["reason"] for v in verdicts} == {"out_of_range"}
    by_reason = sum(
        agent.metrics.registry.get_sample_value(
            "boxwatch_agent_verdict_reasons_total", {"verdict": v, "reason": "out_of_range"}
        )
        for v in ("accept", "uncertainty", "reject")
    )
    assert by_reason == RANGE_MIN_INPUTS
    page = _page(agent)
    assert 'id="out-of-range" class="warn"' in page and "wrong scale" in page
    assert f"1.000 of the last {RANGE_MIN_INPUTS}" in page
    assert f'id="reason-out_of_range">{RANGE_MIN_INPUTS}<' in page
    assert 'id="reason-familiar">0<' in page
    assert "BN gate" not in page


def test_honest_unknowns_at_a_normal_share_raise_no_warning(model_example, agent_factory, caplog):
    """Issue 39, point 7a: 3% of a stream outside the range (unknown inputs) is not the wrong
    scale; the warning comes when most of the last inputs are, and names their share."""
    agent = agent_factory(model_example)
    known = _x(model_example, "validation")
    rows = known[np.arange(1000) % len(known)]
    mixed = rows.copy()
    mixed[::33] *= 16.0  # ~3% far outside the training range
    with caplog.at_level(logging.WARNING, logger="boxwatch.agent.service"):
        _send(agent, mixed)
        snap = agent.status.snapshot()
        assert 0.02 <= snap["out_of_range_recent_share"] <= 0.05, snap
        assert not snap["out_of_range_warning"] and "wrong scale" not in _page(agent)
        assert not [r for r in caplog.records if "training range" in r.getMessage()]
        _send(agent, rows[:400] / 16.0)  # then the wrong scale: 400 of the last 1,000
    warned = [r.getMessage() for r in caplog.records if "training range" in r.getMessage()]
    # Once, as the share passed 20% (then at most once a minute), naming it.
    assert len(warned) == 1 and "of the last 1000 inputs" in warned[0], warned
    assert 20.0 < float(warned[0].split("%")[0]) <= 43.0, warned
    assert agent.status.snapshot()["out_of_range_warning"] and "wrong scale" in _page(agent)


def test_the_window_keeps_the_last_inputs_in_whole_batches():
    window = RangeWindow(size=300)
    for _ in range(3):
        window.add(100, 100)  # all outside
    assert (window.inputs, window.share) == (300, 1.0)
    window.add(0, 100)  # the oldest batch leaves: 200 of the last 300
    assert window.inputs == 300 and window.share == pytest.approx(2 / 3)
    window.add(0, 250)  # both batches outside leave: the last two hold 350 >= 300
    assert (window.inputs, window.share) == (350, 0.0)


def test_the_warning_needs_a_share_over_the_threshold_of_enough_inputs():
    few = RangeWindow()
    few.add(RANGE_MIN_INPUTS - 1, RANGE_MIN_INPUTS - 1)
    assert not few.alarming
    at = RangeWindow()
    at.add(int(RANGE_WARN_SHARE * 1000), 1000)  # exactly the threshold: not over it
    assert not at.alarming
    at.add(300, 300)
    assert at.alarming
