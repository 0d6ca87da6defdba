"""Issue 22: the build's summary tells the verdicts the agent will emit.

Builds of the bundled demo data: with no ``monitor`` section the emitted verdicts accept at
least 90% of correctly classified held-out known digits; the summary's split (and the
manifest's ``contents["verdict_split"]``) equals what ``load_runtime(...).run_model`` emits
on the built artifact; each warning fires on a constructed case and none on the demo.
"""

from __future__ import annotations

import json
import re

import msgspec
import numpy as np
import pytest
import yaml
from example_build import build_example

from boxwatch.agent.artifact import load_artifact, write_artifact
from boxwatch.agent.boxes import ACCEPT
from boxwatch.agent.keys import load_private_key
from boxwatch.agent.runtime import load_runtime
from boxwatch.examples import example_path
from boxwatch.offline.monitors.baselines import msp
from boxwatch.offline.release import emitted
from boxwatch.offline.release.config import load_config
from boxwatch.offline.release.pipeline import build, prepare
from boxwatch.offline.release.records import MonitorFit, VerdictShares
from boxwatch.offline.release.report import render_report

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return build_example(tmp_path_factory.mktemp("emitted"))


def built(example, tmp_path, change, name="b"):
    """Build the example config after ``change(raw)``; returns (outcome, artifact path)."""
    raw = yaml.safe_load(example.config.read_text())
    for key in raw["data"]:
        raw["data"][key]["path"] = str(example.data / f"{key}.npz")
    raw.pop("bn", None)  # the monitor half only (quicker)
    change(raw)
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    outcome = build(
        prepare(load_config(config)),
        load_private_key(example.private_key),
        created_at=1_700_000_000,
    )
    path = tmp_path / f"{name}.bwa"
    write_artifact(path, outcome.artifact)
    return outcome, path


def shares(v):
    return {
        "accept": float(np.mean(v == 0)),
        "uncertainty": float(np.mean(v == 1)),
        "reject": float(np.mean(v == 2)),
        "n": len(v),
    }


def test_no_monitor_section_accepts_90_percent_and_summary_equals_run_model(example, tmp_path):
    def defaults(raw):
        raw.pop("monitor")
        raw["policy"] = {"max_unknown_acceptance": 0.2}

    outcome, path = built(example, tmp_path, defaults)
    mon = outcome.summary.to_dict()["monitor"]
    assert mon["calibration"]["target_acceptance"] == 0.95
    runtime = load_runtime(path, [str(example.public_key)], model_path=example.model)
    assert runtime.boxes.combine == "calibrated"
    data = example.data
    val = np.load(data / "validation.npz")
    res = runtime.run_model(val["x"])
    right = res.predicted == val["y"]
    expected = {
        "correct_known": shares(res.verdicts[right]),
        "misclassified_known": shares(res.verdicts[~right]),
    }
    for name in ("unknown", "unknown_digits", "unknown_noise"):
        expected[f"unknown:{name}"] = shares(
            runtime.run_model(np.load(data / f"{name}.npz")["x"]).verdicts
        )
    assert mon["verdicts"]["split"] == expected
    contents = load_artifact(path, None).contents
    assert contents["verdict_split"] == expected
    assert expected["correct_known"]["accept"] >= 0.95 - 1e-12
    # Held-out known digits never seen by the build (the demo's stream): >= 90% accepted.
    stream = np.load(data / "stream.npz")
    held = runtime.run_model(stream["x_known"])
    ok = held.predicted == stream["y_known"]
    assert np.mean(held.verdicts[ok] == ACCEPT) >= 0.90
    # The policies read the same figures.
    assert mon["operating_points"][0]["acceptance"] == expected["unknown:unknown"]["accept"]
    over = [n for n, v in expected.items() if n.startswith("unknown:") and v["accept"] > 0.2]
    assert over and outcome.policy_failures == [
        "max_unknown_acceptance: "
        + ", ".join(f"{n[8:]} {expected[n]['accept']:.4g}" for n in over)
        + " > 0.2"
    ]
    assert mon["warnings"] == []


def test_policy_and_warnings_on_constructed_builds(example, tmp_path):
    # combine: any (the old default) rejects most known inputs: low_known_acceptance.
    def strict(raw):
        raw["monitor"]["combine"] = "any"
        raw["policy"] = {"fail_on": ["low_known_acceptance"]}

    outcome, _path = built(example, tmp_path, strict, "any")
    names = [w.name for w in outcome.summary.monitor.warnings]
    assert "low_known_acceptance" in names
    split = outcome.summary.monitor.verdicts.split
    assert split["correct_known"].accept < 0.5
    failed = outcome.policy_failures
    assert any(f.startswith("low_known_acceptance:") for f in failed)
    # Few training inputs per class: few_training_inputs.
    outcome, _path = built(
        example, tmp_path, lambda raw: raw["data"]["train"].update(limit=60), "few"
    )
    assert "few_training_inputs" in [w.name for w in outcome.summary.monitor.warnings]


def test_test_set_is_reported_and_never_fitted(example, tmp_path):
    stream = np.load(example.data / "stream.npz")
    np.savez(tmp_path / "test.npz", x=stream["x_known"], y=stream["y_known"])

    def with_test(raw):
        raw["data"]["test"] = {"path": str(tmp_path / "test.npz")}

    demo_monitor = yaml.safe_load(example_path("demo", "build.yaml").read_text())["monitor"]

    def demo(raw):  # the demo's own monitor section (its tau candidates)
        raw["monitor"] = dict(demo_monitor)

    plain, plain_path = built(example, tmp_path, demo, "plain")
    assert plain.summary.monitor.warnings == []  # no warning fires on the demo
    tested, tested_path = built(
        example, tmp_path, lambda raw: (demo(raw), with_test(raw)), "tested"
    )
    a, b = load_artifact(plain_path, None), load_artifact(tested_path, None)
    for member in ("monitors/boxes.json", "monitors/boxes.npz"):
        assert a.members[member] == b.members[member]
    mon = tested.summary.to_dict()["monitor"]
    assert "test:correct_known" in mon["verdicts"]["split"]
    assert "test:correct_known" not in b.contents["verdict_split"]
    errors = mon["model_errors"]["test"]
    assert errors["n"] == len(stream["y_known"])
    runtime = load_runtime(tested_path, [str(example.public_key)], model_path=example.model)
    res = runtime.run_model(stream["x_known"])
    wrong = res.predicted != stream["y_known"]
    assert errors["verdicts"] == shares(res.verdicts[wrong])
    # The report shows the split, the model errors, the baselines and what columns mean.
    page = render_report(tested.summary)
    values = dict(re.findall(r'id="([^"]+)" class="num" data-value="([^"]*)"', page))
    for j, (name, v) in enumerate(mon["verdicts"]["split"].items()):
        assert f'id="split-{j}-set">{name}<' in page
        for key in ("n", "accept", "uncertainty", "reject"):
            assert json.loads(values[f"split-{j}-{key}"]) == v[key]
    assert json.loads(values["errors-test-accept"]) == errors["verdicts"]["accept"]
    # The baselines are matched on the test set: each accepts as many correct test inputs as
    # the emitted verdicts (within one input), and its misclassified share is at its threshold.
    compared = mon["baselines"]
    right = ~wrong
    n_accepted = int(np.sum(res.verdicts[right] == ACCEPT))
    assert compared["point"] == "test" and compared["set"] == "test"
    assert compared["n_correct"] == int(right.sum())
    rows = {r["method"]: r for r in compared["rows"]}
    assert list(rows) == [emitted.BOX_METHOD, *emitted.BASELINES]
    box = rows[emitted.BOX_METHOD]
    assert box["misclassified_known"] == np.mean(res.verdicts[wrong] == ACCEPT)
    for row in compared["rows"]:
        assert abs(row["correct_known"] * right.sum() - n_accepted) <= 1, row["method"]
    logits = runtime.tap.run(runtime.preprocessing.apply(stream["x_known"]))[0]
    s = msp(logits)
    t = rows["msp"]["threshold"]
    assert rows["msp"]["correct_known"] == np.mean(s[right] <= t)
    assert rows["msp"]["misclassified_known"] == np.mean(s[wrong] <= t)
    assert set(rows["knn"]["unknown"]) == {"unknown", "unknown_digits", "unknown_noise"}
    assert compared["not_computed"].keys() == {"react"}
    assert json.loads(values["baselines-accepted-share"]) == compared["accepted_share"]
    assert 'id="baselines-point">test<' in page
    for j, r in enumerate(compared["rows"]):
        assert json.loads(values[f"baseline-{j}-misclassified"]) == r["misclassified_known"]
        assert json.loads(values[f"baseline-{j}-aurc"]) == r["aurc"]
        for name, share in r["unknown"].items():
            assert json.loads(values[f"baseline-{j}-{name}"]) == share
    # The score histogram: the test set's correct and misclassified inputs, each unknown set.
    hist = mon["histogram"]
    assert hist["set"] == "test"
    assert sum(hist["correct_known"]) == right.sum()
    assert sum(hist["misclassified_known"]) == wrong.sum()
    caption = page[page.index('id="fig-operating-point"') :].split("</figcaption>")[0]
    for series in ("correct known (test)", "misclassified known (test)", *hist["unknown"]):
        assert f"<em>{series}</em>" in caption, series
    # Without data.test the comparison stays on the calibration set, and says so.
    assert plain.summary.monitor.baselines.point == "validation"
    assert 'id="baselines-point">validation<' in render_report(plain.summary)
    assert 'id="warnings-none"' in page
    definitions = page[page.index('id="definitions"') :]
    for term in ("TP", "FP", "TN", "FN", "MP", "MN", "precision", "recall", "AUROC"):
        assert f"<dt>{term}" in definitions, term


def _monitor_summary(**over):
    """A fitted monitor's summary: two layers, two classes, three candidate taus."""
    base = {
        "layers": ["a", "b"],
        "taus": [1.0, 0.5, 0.1],
        "tau_selection": "held-out-class",
        "tau": {"a": [0.5, 0.5], "b": [0.5, 0.5]},
        "score": "fused",
        "contrast_layers": ["a"],
        "calibration_set": "validation",
        "boxes": {"a": {"good": [2, 3], "bad": [0, 0]}, "b": {"good": [4, 2], "bad": [0, 0]}},
        "calibration": {
            "threshold": 1.0,
            "target_acceptance": 0.95,
            "known_acceptance": 0.95,
            "unknown_acceptance": None,
            "n_known": 100,
            "n_unknown": 0,
        },
    }
    return msgspec.convert({**base, **over}, MonitorFit)


GOOD_SPLIT = {"correct_known": VerdictShares(accept=0.95, uncertainty=0.0, reject=0.05, n=100)}


@pytest.mark.parametrize(
    ("name", "summary", "split", "counts"),
    [
        (
            "low_known_acceptance",
            _monitor_summary(),
            {"correct_known": VerdictShares(accept=0.91, uncertainty=0.04, reject=0.05, n=100)},
            [50, 50],
        ),
        (
            "tau_at_edge",
            _monitor_summary(tau={"a": [0.1, 0.1], "b": [1.0, 1.0]}),
            GOOD_SPLIT,
            [50, 50],
        ),
        (
            "tau_at_edge",
            _monitor_summary(
                tau={"a": [0.1, 0.1], "b": [0.1, 0.1]},
                tau_auroc={"a": [0.80, 0.90, 0.95], "b": [0.8, 0.9, 0.92]},
            ),
            GOOD_SPLIT,
            [50, 50],
        ),
        (
            "tau_at_edge",
            _monitor_summary(tau_selection="f1", tau={"a": [0.1, 1.0], "b": [0.1, 0.5]}),
            GOOD_SPLIT,
            [50, 50],
        ),
        ("empty_contrast", _monitor_summary(contrast_layers=[]), GOOD_SPLIT, [50, 50]),
        ("few_training_inputs", _monitor_summary(), GOOD_SPLIT, [50, 9]),
    ],
)
def test_each_warning_fires_on_its_case_only(name, summary, split, counts):
    got = emitted.warnings(summary, split, 0.95, counts)
    assert [w.name for w in got] == [name]
    assert emitted.warnings(_monitor_summary(), GOOD_SPLIT, 0.95, [50, 50]) == []


def test_finest_tau_taken_by_the_tolerance_tie_break_is_not_at_the_edge():
    """Held-out-class selection takes the finest tau within its tolerance of the best
    AUROC: that pick alone is no sign that the candidate list is too narrow."""
    summary = _monitor_summary(
        tau={"a": [0.1, 0.1], "b": [0.1, 0.1]},
        tau_auroc={"a": [0.80, 0.951, 0.953], "b": [0.8, 0.97, 0.97]},
    )
    assert emitted.warnings(summary, GOOD_SPLIT, 0.95, [50, 50]) == []
