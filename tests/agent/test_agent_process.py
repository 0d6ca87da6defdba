"""The agent's record processing without a broker: capture, routing, payload digests, and
the box-kernel setting."""

from __future__ import annotations

import functools
import hashlib
import json
import threading
import time

import numpy as np
import pytest
from consumed import Record
from prometheus_client import generate_latest

from boxwatch.agent import boxes as boxes_module
from boxwatch.agent import service
from boxwatch.agent.boxes import box_kernel
from boxwatch.agent.vocab import REASON_VERDICTS

TOPICS = {
    "inputs": "in",
    "bn_inputs": "bn",
    "verdicts": "v",
    "gate": "g",
    "dead_letter": "dlq",
    "capture": "cap",
    "release": "rel",
    "review": "rev",
}


@pytest.fixture
def make_agent(example, agent_factory):
    """``make_agent(**settings)``: an agent of the example on this file's topics."""
    return functools.partial(agent_factory, example, topics=TOPICS)


def test_capture_gets_every_rejected_or_uncertain_input(example, make_agent):
    agent = make_agent()
    data = np.load(example.data / "stream.npz")
    x = np.concatenate([data["x_known"][:40], data["x_unknown"][:40]])
    recs = [
        Record("in", 0, i, json.dumps({"id": f"r{i}", "input": row.tolist()}).encode())
        for i, row in enumerate(x)
    ]
    outs = agent.process(recs)
    verdicts = {
        json.loads(o.value)["id"]: json.loads(o.value)["verdict"] for o in outs if o.topic == "v"
    }
    captured = [o for o in outs if o.topic == "cap"]
    flagged = {rid for rid, v in verdicts.items() if v != "accept"}
    assert flagged, "the stream should hold rejected inputs"
    assert {json.loads(o.value)["id"] for o in captured} == flagged
    for o in captured:
        assert dict(o.headers)["boxwatch-verdict"].decode() == verdicts[json.loads(o.value)["id"]]
    assert len(verdicts) == len(x)


def test_verdicts_and_captured_copies_say_why(example, make_agent):
    agent = make_agent()
    data = np.load(example.data / "stream.npz")
    x = np.concatenate([data["x_known"][:40], data["x_unknown"][:40]])
    recs = [
        Record("in", 0, i, json.dumps({"id": f"r{i}", "input": row.tolist()}).encode())
        for i, row in enumerate(x)
    ]
    outs = agent.process(recs)
    records = {json.loads(o.value)["id"]: json.loads(o.value) for o in outs if o.topic == "v"}
    classes = set(agent.runtime.classes)
    for r in records.values():
        assert r["verdict"] in REASON_VERDICTS[r["reason"]]
        if r["verdict"] == "accept":
            assert r["layer"] is None and r["nearest_class"] is None
        else:
            assert r["layer"] in r["layers"]
            assert r["nearest_class"] in classes - {r["predicted_class"]}
    captured = [o for o in outs if o.topic == "cap"]
    assert captured and len(captured) == sum(r["verdict"] != "accept" for r in records.values())
    for o in captured:
        headers = {k: v.decode() for k, v in o.headers}
        r = records[json.loads(o.value)["id"]]
        assert headers["boxwatch-reason"] == r["reason"]
        assert headers["boxwatch-layer"] == r["layer"]
        assert headers["boxwatch-nearest-class"] == r["nearest_class"]


def test_gate_policy_routes_records(make_agent):
    agent = make_agent(
        gate_policy={"certified": "release", "blocked": "review", "unverified": "none"}
    )
    d = agent.runtime.diagram
    rng = np.random.default_rng(5)
    recs = []
    for i in range(200):
        evidence = {
            f: d.states[j][rng.integers(len(d.states[j]))] for j, f in enumerate(d.features)
        }
        recs.append(Record("bn", 1, i, json.dumps({"id": f"c{i}", "evidence": evidence}).encode()))
    outs = agent.process(recs)
    gate = {json.loads(o.value)["id"]: json.loads(o.value) for o in outs if o.topic == "g"}
    assert len(gate) == 200
    released = [o for o in outs if o.topic == "rel"]
    reviewed = [o for o in outs if o.topic == "rev"]
    by_value = {r.value: f"c{r.offset}" for r in recs}
    assert {by_value[o.value] for o in released} == {
        k for k, g in gate.items() if g["outcome"] == "certified"
    }
    assert {by_value[o.value] for o in reviewed} == {
        k for k, g in gate.items() if g["outcome"] == "blocked"
    }
    for o in released + reviewed:
        headers = dict(o.headers)
        g = gate[by_value[o.value]]
        assert headers["boxwatch-decision"].decode() == g["decision"]
        assert headers["boxwatch-gate"].decode() == g["outcome"]


@pytest.mark.parametrize("store", [True, False])
def test_dead_letters_keep_bytes_or_only_their_digest(make_agent, store):
    agent = make_agent(dead_letter__store_payload=store)
    secret = b'{"id": "p1", "input": "name: Jane Doe"}'
    outs = agent.process([Record("in", 2, 7, secret, headers=[("trace", b"abc")])])
    assert len(outs) == 1 and outs[0].topic == "dlq"
    headers = dict(outs[0].headers)
    assert headers["boxwatch-dlq-reason"] == b"bad_dtype"  # a string input is not numbers
    assert headers["boxwatch-source-offset"] == b"7"
    assert headers["boxwatch-payload-sha256"].decode() == hashlib.sha256(secret).hexdigest()
    if store:
        assert outs[0].value == secret and headers["trace"] == b"abc"
    else:
        assert b"Jane" not in outs[0].value and "trace" not in headers
        stub = json.loads(outs[0].value)
        assert stub["payload_sha256"] == hashlib.sha256(secret).hexdigest()
        assert stub["payload_bytes"] == len(secret)


@pytest.mark.skipif(
    boxes_module._NATIVE is None,
    reason="the native box kernel is not built (no C compiler at install time)",
)
def test_box_kernel_setting_changes_the_implementation_not_the_verdicts(example, make_agent):
    data = np.load(example.data / "stream.npz")
    x = np.concatenate([data["x_known"][:100], data["x_unknown"][:100]])
    recs = [
        Record("in", 0, i, json.dumps({"id": f"r{i}", "input": row.tolist()}).encode())
        for i, row in enumerate(x)
    ]
    bodies = {}
    try:
        for kernel in ("numpy", "native"):
            agent = make_agent(box_kernel=kernel)
            assert box_kernel() == kernel
            info = generate_latest(agent.metrics.registry).decode()
            assert f'box_kernel="{kernel}"' in info
            bodies[kernel] = [json.loads(o.value) for o in agent.process(recs) if o.topic == "v"]
    finally:
        make_agent()  # box_kernel: auto
    assert box_kernel() == "native"
    strip = [{k: v for k, v in b.items() if k not in ("timings", "score")} for b in bodies["numpy"]]
    assert strip == [
        {k: v for k, v in b.items() if k not in ("timings", "score")} for b in bodies["native"]
    ]
    assert {b["verdict"] for b in bodies["native"]} >= {"accept", "reject"}
    np.testing.assert_allclose(
        [b["score"] for b in bodies["numpy"]],
        [b["score"] for b in bodies["native"]],
        rtol=1e-5,
        atol=1e-6,
    )


# -- reloads beside the loop (issue 37) ------------------------------------------------------------
class IdleConsumer:
    """A consumer with nothing to consume that counts the loop's polls."""

    def __init__(self) -> None:
        self.polls = 0
        self._wait = threading.Event()

    def poll(self, max_records: int, wait_s: float) -> list:
        self.polls += 1
        self._wait.wait(wait_s)
        return []

    def lag(self) -> dict:
        return {}

    def close(self, timeout: float) -> None:
        return None


class IdleProducer:
    def close(self, timeout: float) -> None:
        return None


@pytest.fixture
def idle_clients(monkeypatch):
    consumer = IdleConsumer()
    monkeypatch.setattr(service, "make_consumer", lambda *a, **k: consumer)
    monkeypatch.setattr(service, "make_producer", lambda *a, **k: IdleProducer())
    return consumer


def _wait_until(check, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def _reloads(agent, result: str) -> float:
    return agent.metrics.artifact_reloads.labels(result)._value.get()


def test_a_slow_reload_runs_beside_the_loop_and_is_refused_at_its_deadline(
    make_agent, idle_clients
):
    """The loop keeps polling while a candidate loads; past reload.timeout_s the candidate
    is refused and counted, and what it returns later is dropped; the next reload runs."""
    agent = make_agent(reload__timeout_s=1)
    running = agent.runtime
    release = threading.Event()
    calls: list[str] = []

    def slow_load():
        calls.append("slow")
        release.wait(30)
        return running

    agent._reload_runtime = slow_load
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    try:
        assert _wait_until(lambda: idle_clients.polls > 0)
        agent.request_reload()
        assert _wait_until(lambda: calls == ["slow"])
        polls = idle_clients.polls
        time.sleep(0.5)
        assert idle_clients.polls > polls + 5, "the loop stopped while a candidate loaded"
        assert _wait_until(lambda: _reloads(agent, "timeout") == 1, timeout=5)
        assert agent.status.reload_failures == 1 and agent.runtime is running
        agent.request_reload()  # waits for the overrun load to end: one candidate at a time
        time.sleep(0.3)
        assert calls == ["slow"]
        agent._reload_runtime = lambda: calls.append("fast") or running
        release.set()
        assert _wait_until(lambda: _reloads(agent, "success") == 1)
        assert calls == ["slow", "fast"] and _reloads(agent, "timeout") == 1
    finally:
        release.set()
        agent.stop()
        loop.join(10)
    assert not loop.is_alive()


def test_stop_ends_the_loop_while_a_reload_hangs(make_agent, idle_clients):
    """A load that never returns does not hold the agent: stop() ends run() at once."""
    agent = make_agent(reload__timeout_s=60)
    hang = threading.Event()
    agent._reload_runtime = lambda: hang.wait(120) and agent.runtime
    loop = threading.Thread(target=agent.run, daemon=True)
    loop.start()
    try:
        agent.request_reload()
        assert _wait_until(lambda: agent._reload_job is not None)
        t0 = time.monotonic()
        agent.stop()
        loop.join(10)
        assert not loop.is_alive() and time.monotonic() - t0 < 2.0
    finally:
        hang.set()
