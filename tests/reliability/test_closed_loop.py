"""The closed loop end to end (issue 41 point 5), through the real agent on a real broker.

A shifted stream (the example's held-out known digits with pixel noise) runs through the
agent, which copies what it does not accept to the capture topic; ``boxwatch
export-captures`` archives the topic; a simulated reviewer labels the captures with the
truth by the verdicts' ids; ``boxwatch refit`` makes the child; SIGHUP swaps it in; a fresh
sample of the same stream then gets the child's verdicts. A new class (digits the model
never saw, arriving after the known ones) is flagged by ``boxwatch capture-report``.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from dataclasses import replace

import numpy as np
import pytest
from kafka_helpers import create_topics
from reliability_helpers import (
    MODEL_TOPICS,
    PYTHON,
    ROOT,
    TOPICS,
    OutputCollector,
    StreamProducer,
    artifact_id,
    create_model_topics,
    tensor_record,
)
from sklearn.datasets import load_digits
from test_reliability_artifact import wait_reload

from boxwatch.agent.artifact import load_artifact
from boxwatch.agent.boxes import ACCEPT, VERDICT_NAMES
from boxwatch.agent.keys import load_trusted_keys
from boxwatch.agent.members import REFIT
from boxwatch.offline.refit.feedback import read_captures

CAPTURE = "r.capture"
NOISE = 3.0  # pixel noise (pixels are 0..16): the parent accepts about 70% of correct inputs
T0 = 1_700_000_000  # the example's creation time


def noisy(x: np.ndarray, seed: int) -> np.ndarray:
    """``x`` with Gaussian pixel noise, a fresh draw per seed (the same stream, resampled)."""
    out = x + np.random.default_rng(seed).normal(0.0, NOISE, x.shape)
    return np.clip(out, 0, 16).astype(np.float32)


def send(bootstrap: str, collector: OutputCollector, prefix: str, rows: np.ndarray) -> None:
    """Stream ``rows`` as ``PREFIXi`` and wait for every verdict sent so far."""
    records = [
        (f"{prefix}{i}".encode(), *tensor_record(f"{prefix}{i}", row)) for i, row in enumerate(rows)
    ]
    want = collector.count + len(rows)
    producer = StreamProducer(bootstrap, TOPICS["inputs"], records)
    producer.start()
    producer.join(60)
    assert producer.error is None
    assert collector.wait_for(lambda c: c.count >= want, timeout=60)


def boxwatch(*args: str) -> subprocess.CompletedProcess:
    """``python -m boxwatch ARGS`` from the repository root."""
    return subprocess.run(
        [PYTHON, "-m", "boxwatch", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def verdicts_by_id(collector: OutputCollector, prefix: str) -> dict[int, dict]:
    """The verdict records of the ids ``PREFIXi``, by ``i``."""
    return {
        int(v["id"][len(prefix) :]): v
        for v in collector.values[TOPICS["verdicts"]]
        if v["id"].startswith(prefix)
    }


@pytest.mark.slow
@pytest.mark.integration
def test_shift_is_captured_labelled_refitted_and_reloaded(
    example, make_broker, agent_process_factory, tmp_path
):
    broker = make_broker("noida").start()
    bootstrap = broker.bootstrap_servers
    create_model_topics(bootstrap)
    create_topics(bootstrap, {CAPTURE: 1})
    live = tmp_path / "live.bwa"
    shutil.copyfile(example.artifact, live)
    agent = agent_process_factory(
        bootstrap, replace(example, artifact=live), topics={**MODEL_TOPICS, "capture": CAPTURE}
    )
    stream = np.load(example.data / "stream.npz")
    x, y = stream["x_known"], stream["y_known"]
    classes = [str(c) for c in range(8)]
    collector = OutputCollector.of_verdicts(bootstrap)
    reviews, child = tmp_path / "reviews", tmp_path / "child.bwa"
    try:
        collector.start()
        agent.start().wait_ready()
        send(bootstrap, collector, "a", noisy(x, 1))
        before = verdicts_by_id(collector, "a")
        exported = boxwatch(
            "export-captures", "--brokers", bootstrap, "--topic", CAPTURE, "--out", str(reviews)
        )
        assert exported.returncode == 0, exported.stderr
        # The reviewer: the truth of each captured input, by the id its verdict carries.
        captured = [i for i, v in before.items() if v["verdict"] != "accept"]
        assert 40 <= len(captured) <= 200, len(captured)
        # Every input the agent did not accept is in the export, whole.
        archived = read_captures(reviews, (64,))
        assert sorted(archived.ids) == sorted(f"a{i}" for i in captured)
        assert not archived.problems
        lines = []
        for i in captured:
            truth = classes[int(y[i])]
            label = "correct" if before[i]["predicted_class"] == truth else f"wrong: {truth}"
            lines.append(json.dumps({"id": f"a{i}", "label": label}))
        (tmp_path / "labels.jsonl").write_text("\n".join(lines) + "\n")
        refit = boxwatch(
            "refit",
            str(live),
            "--config",
            str(example.config),
            "--public-key",
            str(example.public_key),
            "--key",
            str(example.private_key),
            "--captures",
            str(reviews),
            "--labels",
            str(tmp_path / "labels.jsonl"),
            "--out",
            str(child),
            "--created-at",
            str(T0 + 100),
            "--quiet",
            # The reviewer takes the trade if a guard fails: on the bundled example the child
            # may give up a few points of the unknown sets for the stream's correct inputs
            # (checked below: the failed guards are recorded in the child).
            "--allow-guard-failure",
        )
        assert refit.returncode == 0, refit.stderr
        assert "validation" in refit.stdout and "captures" in refit.stdout, refit.stdout
        tmp = live.with_suffix(".tmp")
        shutil.copyfile(child, tmp)
        tmp.replace(live)
        agent.signal(signal.SIGHUP)
        wait_reload(agent, "success", 1)
        send(bootstrap, collector, "b", noisy(x, 2))
        after = verdicts_by_id(collector, "b")
        assert agent.stop() == 0, agent.log_tail()
    finally:
        agent.kill()
        collector.stop()
    parent_id = artifact_id(example.artifact, example.public_key)
    child_id = artifact_id(child, example.public_key)
    assert {v["artifact_id"] for v in before.values()} == {parent_id}
    assert {v["artifact_id"] for v in after.values()} == {child_id}
    record = json.loads(
        load_artifact(child, load_trusted_keys([str(example.public_key)])).members[REFIT]
    )
    assert record["parent"]["artifact_id"] == parent_id
    assert record["classes"], record
    failed = {g["name"] for g in record["guards"] if not g["passed"]}
    assert set(record["overridden"]) == failed, record["guards"]
    assert all(name.startswith("unknown_acceptance") for name in failed), failed

    def accepted_correct(vs: dict[int, dict]) -> float:
        right = [v for i, v in vs.items() if v["predicted_class"] == classes[int(y[i])]]
        return sum(v["verdict"] == "accept" for v in right) / len(right)

    # The same stream, a fresh draw of its noise: the child accepts far more of its correct
    # inputs than the parent did (the parent: about 70%).
    assert accepted_correct(after) >= accepted_correct(before) + 0.1, (
        accepted_correct(before),
        accepted_correct(after),
    )


@pytest.mark.slow
@pytest.mark.integration
def test_a_new_class_is_flagged_by_the_capture_report(
    model_example, make_broker, agent_process_factory, tmp_path
):
    """Known digits stream, then digits 8 (a class the model never saw) join them; a
    reviewer labels 30 of the later captures: the report on the agent's capture topic flags
    new-kind clusters holding >= 90% of the 8s' captures, and few known digits."""
    broker = make_broker("noida").start()
    bootstrap = broker.bootstrap_servers
    create_model_topics(bootstrap)
    create_topics(bootstrap, {CAPTURE: 1})
    agent = agent_process_factory(
        bootstrap, model_example, topics={**MODEL_TOPICS, "capture": CAPTURE}
    )
    stream = np.load(model_example.data / "stream.npz")
    digits = load_digits()
    eights = digits.data[digits.target == 8].astype(np.float32)
    collector = OutputCollector.of_verdicts(bootstrap)
    try:
        collector.start()
        agent.start().wait_ready()
        send(bootstrap, collector, "k", stream["x_known"])
        send(bootstrap, collector, "n", np.concatenate([stream["x_known"], eights]))
        assert agent.stop() == 0, agent.log_tail()
    finally:
        agent.kill()
        collector.stop()
    # The reviewer labels 30 of the second phase's captures: the 8s as a new kind.
    n_known = len(stream["x_known"])
    later = verdicts_by_id(collector, "n")
    captured = sorted(i for i, v in later.items() if v["verdict"] != VERDICT_NAMES[ACCEPT])
    sample = np.random.default_rng(0).permutation(captured)[:30]
    truth = np.r_[stream["y_known"], np.full(len(eights), -1)]
    labels = tmp_path / "labels.jsonl"
    with labels.open("w") as fh:
        for i in sorted(int(i) for i in sample):
            if truth[i] < 0:
                label = "new:eight"
            elif later[i]["predicted_class"] == str(truth[i]):
                label = "correct"
            else:
                label = f"wrong: {truth[i]}"
            fh.write(json.dumps({"id": f"n{i}", "label": label}) + "\n")
    report_dir = tmp_path / "report"
    done = boxwatch(
        "capture-report",
        str(model_example.artifact),
        "--model",
        str(model_example.model),
        "--public-key",
        str(model_example.public_key),
        "--brokers",
        bootstrap,
        "--captures-topic",
        CAPTURE,
        "--labels",
        str(labels),
        "--out",
        str(report_dir),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((report_dir / "capture_report.json").read_text())
    new_ids = {f"n{i}" for i in captured if i >= n_known}
    flagged = {i for c in report["clusters"] if c["verdict"] == "new kind" for i in c["member_ids"]}
    assert len(new_ids) >= 50
    assert len(new_ids & flagged) >= 0.9 * len(new_ids), (len(new_ids & flagged), len(new_ids))
    known_flagged = {i for i in flagged if i.startswith("n") and int(i[1:]) < n_known}
    assert len(known_flagged) <= 0.2 * len(flagged), len(known_flagged)
    assert "new kind" in done.stdout
    assert (report_dir / "capture_report.html").is_file()
