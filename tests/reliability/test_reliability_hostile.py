"""No single record may stop, stall or fool the agent (issue 14), with each client library.

A live agent (a real subprocess on a real noida-db broker) gets 60+ kinds of hostile record
-- random bytes, truncated and deeply nested JSON, wrong dtypes and shapes, NaN and
infinities, header edge cases (null values, names that are not UTF-8, thousands of
headers, a 1 MB header or key), dead letters larger than any producer may send -- among
valid records, some of them unusual but legal. Every bad record gets exactly one dead
letter with its reason; every valid one exactly one verdict or gate record, identical to
what the artifact decides offline; the agent never exits, SIGTERM stops it within 10 s, and
its metrics equal what reached the topics.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import numpy as np
import pytest
from hostile_records import (
    Hostile,
    bad_model_records,
    bn_records,
    tensor_record,
    valid_model_records,
)
from kafka import KafkaProducer
from kafka_helpers import AGENT_LIBRARIES, create_topics
from reliability_helpers import (
    TOPICS,
    OutputCollector,
    stream_rows,
)

from boxwatch.agent.metrics import INVALID_REASONS

confluent_kafka = pytest.importorskip(
    "confluent_kafka",
    reason="null header values are sent with confluent-kafka (pip install confluent-kafka)",
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N_VALID_MODEL, N_VALID_BN = 240, 60


def _send_all(bootstrap: str, records: list[Hostile]) -> dict[tuple[str, int, int], Hostile]:
    """Send ``records`` in order; return each one by (topic, partition, offset).

    What kafka-python's producer refuses (null header values, no key and no value) goes
    through confluent-kafka; everything else (non-UTF-8 names included) through kafka-python.
    """
    kp = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=5,
        max_request_size=16_000_000,
        request_timeout_ms=10_000,
    )
    cp = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "message.max.bytes": 16_000_000,
            "linger.ms": 5,
        }
    )
    where: dict[tuple[str, int, int], Hostile] = {}
    errors: list[str] = []

    def delivered(err, msg, rec):
        if err is not None:
            errors.append(f"{rec.kind}: {err}")
        else:
            where[(msg.topic(), msg.partition(), msg.offset())] = rec

    futures = []
    try:
        for rec in records:
            topic = TOPICS[rec.topic]
            if rec.needs_confluent:
                cp.produce(
                    topic,
                    rec.value,
                    rec.key,
                    headers=rec.headers,
                    on_delivery=lambda err, msg, rec=rec: delivered(err, msg, rec),
                )
                cp.poll(0)
            else:
                futures.append(
                    (rec, kp.send(topic, value=rec.value, key=rec.key, headers=rec.headers))
                )
        kp.flush(timeout=60)
        assert cp.flush(60) == 0, "confluent-kafka producer did not flush"
        for rec, fut in futures:
            meta = fut.get(timeout=10)
            where[(meta.topic, meta.partition, meta.offset)] = rec
    finally:
        kp.close(timeout=5)
    assert not errors, errors
    assert len(where) == len(records)
    return where


def _offline(example, valid: list[Hostile]):
    """What the artifact decides for the valid records, by id."""
    rt = example.runtime()
    model = [r for r in valid if r.rows is not None]
    res = rt.run_model(np.stack([r.rows for r in model]))
    verdicts = {}
    for i, rec in enumerate(model):
        rid = _record_id(rec)
        verdicts[rid] = {
            "verdict": ["accept", "uncertainty", "reject"][int(res.verdicts[i])],
            "predicted_class": rt.classes[int(res.predicted[i])],
            "score": float(res.scores[i]),
        }
    d, gate = rt.diagram, rt.gate
    bn = [r for r in valid if r.evidence is not None]
    x = np.array([[d.states[j].index(r.evidence[f]) for j, f in enumerate(d.features)] for r in bn])
    decisions = d.predict(x)
    gated = gate.apply(x, decisions)
    outcomes = {0: "certified", 1: "blocked", 2: "unverified"}
    gates = {
        _record_id(r): (d.terminals[int(decisions[i])], outcomes[int(gated.outcomes[i])])
        for i, r in enumerate(bn)
    }
    return verdicts, gates


def _total(metrics: dict[str, float], name: str, label: str) -> float:
    """Sum of the series of ``name`` carrying ``label`` (e.g. ``verdict="accept"``)."""
    return sum(
        v
        for k, v in metrics.items()
        if k.startswith(name + "{") and label in k[len(name) :].strip("{}").split(",")
    )


def _record_id(rec: Hostile) -> str:
    if rec.value and rec.value[:1] == b"{":
        return str(json.loads(rec.value)["id"])
    return dict(rec.headers)["id"].decode()


@pytest.mark.parametrize("library", AGENT_LIBRARIES)
def test_hostile_records_never_stop_stall_or_fool_the_agent(
    example, make_broker, agent_process_factory, library
):
    broker = make_broker("noida").start()
    create_topics(broker.bootstrap_servers, {t: 2 for t in TOPICS.values()})
    rt = example.runtime()
    rng = np.random.default_rng(14)
    size = rt.preprocessing.size
    records = (
        bad_model_records(size, rng)
        + valid_model_records(stream_rows(example, N_VALID_MODEL, seed=14), size)
        + bn_records(rt.diagram.features, rt.diagram.states, rng, N_VALID_BN)
    )
    bad = [r for r in records if r.reason is not None]
    valid = [r for r in records if r.reason is None]
    assert len({r.kind for r in bad}) >= 40
    assert {r.reason for r in bad} <= set(INVALID_REASONS)
    records = [records[i] for i in rng.permutation(len(records))]

    agent = agent_process_factory(
        broker.bootstrap_servers, kafka__library=library, batch__max_records=32
    )
    collector = OutputCollector(
        broker.bootstrap_servers,
        [TOPICS["verdicts"], TOPICS["gate"], TOPICS["dead_letter"]],
        keep=[TOPICS["dead_letter"]],
        json_topics=[TOPICS["verdicts"], TOPICS["gate"]],
    )
    try:
        collector.start()
        agent.start().wait_ready()
        pid = agent.pid
        where = _send_all(broker.bootstrap_servers, records)
        assert collector.wait_for(lambda c: c.count >= len(records), timeout=120), (
            f"{collector.count} of {len(records)} outputs:\n{agent.log_tail()}"
        )
        collector.wait_for(lambda c: False, timeout=3)  # nothing more may follow
        metrics = agent.scrape()
        assert agent.alive and agent.pid == pid and agent.starts == 1, agent.log_tail()
        assert agent.stop(timeout=10) == 0, agent.log_tail()
    finally:
        agent.kill()
        collector.stop()

    # Every bad record: exactly one dead letter, with its reason and its bytes (or digest).
    letters = collector.records[TOPICS["dead_letter"]]
    by_source = Counter()
    wrong = []
    for key, headers, value in letters:
        source = (
            headers["boxwatch-source-topic"].decode(),
            int(headers["boxwatch-source-partition"]),
            int(headers["boxwatch-source-offset"]),
        )
        by_source[source] += 1
        rec = where[source]
        reason = headers["boxwatch-dlq-reason"].decode()
        if reason != rec.reason:
            wrong.append((rec.kind, reason, rec.reason, headers["boxwatch-dlq-detail"][:80]))
        digest = hashlib.sha256(rec.value or b"").hexdigest()
        assert headers["boxwatch-payload-sha256"].decode() == digest, rec.kind
        if "boxwatch-payload-omitted" in headers:
            stub = json.loads(value)
            assert stub["payload_sha256"] == digest
            assert stub["payload_bytes"] == len(rec.value or b"")
            assert stub["reason"] == rec.reason and stub["source"]["offset"] == source[2]
            assert len(value) + len(key or b"") < 100_000, rec.kind
        else:
            assert value == rec.value and key == rec.key, rec.kind
    assert not wrong, f"dead letters with another reason: {wrong}"
    bad_sources = {s for s, r in where.items() if r.reason is not None}
    assert set(by_source) == bad_sources, (
        f"no dead letter for {sorted(where[s].kind for s in bad_sources - set(by_source))}"
    )
    assert max(by_source.values()) == 1, "a bad record got more than one dead letter"
    omitted = sorted(
        where[
            (
                h["boxwatch-source-topic"].decode(),
                int(h["boxwatch-source-partition"]),
                int(h["boxwatch-source-offset"]),
            )
        ].kind
        for _, h, _ in letters
        if "boxwatch-payload-omitted" in h
    )
    # Too large to send: always stubs. No key and no value: kafka-python cannot produce that.
    assert set(omitted) - {"null_value", "bn_null_value"} == {
        "dead_letter_too_large",
        "header_too_large",
        "key_near_limit",
    }

    # Every valid record: exactly one verdict or gate record, as the artifact decides offline.
    verdict_ids = collector.ids[TOPICS["verdicts"]]
    gate_ids = collector.ids[TOPICS["gate"]]
    offline_verdicts, offline_gates = _offline(example, valid)
    assert set(verdict_ids) == set(offline_verdicts) and max(verdict_ids.values()) == 1
    assert set(gate_ids) == set(offline_gates) and max(gate_ids.values()) == 1
    for body in collector.values[TOPICS["verdicts"]]:
        want = offline_verdicts[body["id"]]
        assert (body["verdict"], body["predicted_class"]) == (
            want["verdict"],
            want["predicted_class"],
        ), body["id"]
        if np.isfinite(want["score"]):
            assert body["score"] == pytest.approx(want["score"], rel=1e-5, abs=1e-6)
        else:
            assert body["score"] is None, body["id"]
    for rec in valid:
        if rec.verdict is not None:
            assert offline_verdicts[_record_id(rec)]["verdict"] == rec.verdict, rec.kind
    for body in collector.values[TOPICS["gate"]]:
        assert (body["decision"], body["outcome"]) == offline_gates[body["id"]]

    # Metrics equal what reached the topics.
    reasons = Counter(h["boxwatch-dlq-reason"].decode() for _, h, _ in letters)
    for reason in INVALID_REASONS:
        assert metrics[f'boxwatch_agent_invalid_records_total{{reason="{reason}"}}'] == reasons.get(
            reason, 0
        ), reason
    verdicts = Counter(b["verdict"] for b in collector.values[TOPICS["verdicts"]])
    for v in ("accept", "uncertainty", "reject"):
        got = _total(metrics, "boxwatch_agent_verdicts_total", f'verdict="{v}"')
        assert got == verdicts.get(v, 0), v
    outcomes = Counter(b["outcome"] for b in collector.values[TOPICS["gate"]])
    for o in ("certified", "blocked", "unverified"):
        got = _total(metrics, "boxwatch_agent_gate_outcomes_total", f'outcome="{o}"')
        assert got == outcomes.get(o, 0), o
    assert metrics['boxwatch_agent_outputs_total{kind="dead_letter"}'] == len(letters)
    assert metrics['boxwatch_agent_outputs_payload_omitted_total{kind="dead_letter"}'] == len(
        omitted
    )
    assert metrics['boxwatch_agent_outputs_dropped_total{kind="dead_letter"}'] == 0
    print(
        f"\nhostile ({library}): {len(bad)} bad records of {len({r.kind for r in bad})} kinds, "
        f"{len(valid)} valid; {len(omitted)} dead letters as stubs; one process (pid {pid})"
    )


@pytest.mark.parametrize("library", AGENT_LIBRARIES)
def test_records_larger_than_any_output_go_through_as_stubs(
    example, make_broker, agent_process_factory, library
):
    """2 MB and 10 MB records and a 1.5 MiB key (Tansu takes them; noida-db refuses records
    over ~1 MB): the producer refuses their dead letters, which go as stubs after a bounded
    number of tries (``max_output_bytes`` set high, so nothing is stubbed before sending)."""
    broker = make_broker("tansu").start()
    create_topics(broker.bootstrap_servers, {t: 1 for t in TOPICS.values()})
    rows = stream_rows(example, 20, seed=15)
    size = rows.shape[1]
    valid = valid_model_records(rows, size)[:20]
    big_key = Hostile(
        "valid_key_1_5mib",
        "inputs",
        *tensor_record("k-big", rows[0]),
        key=b"k" * (3 << 19),
        rows=rows[0],
    )
    bad = [
        Hostile("not_json_2mb", "inputs", b"{" + b" " * 2_000_000, [], None, "not_json"),
        Hostile("too_large_10mb", "inputs", b"x" * 10_000_000, [], None, "too_large"),
        Hostile("key_1_5mib", "inputs", b"{oops", [], b"k" * (3 << 19), "not_json"),
    ]
    records = [*valid[:10], *bad, big_key, *valid[10:]]
    agent = agent_process_factory(
        broker.bootstrap_servers,
        kafka__library=library,
        max_record_bytes=4_000_000,
        max_output_bytes=64_000_000,
    )
    collector = OutputCollector(
        broker.bootstrap_servers,
        [TOPICS["verdicts"], TOPICS["dead_letter"]],
        keep=[TOPICS["dead_letter"]],
        json_topics=[TOPICS["verdicts"]],
    )
    try:
        collector.start()
        agent.start().wait_ready()
        where = _send_all(broker.bootstrap_servers, records)
        assert collector.wait_for(lambda c: c.count >= len(records), timeout=120), (
            f"{collector.count} of {len(records)} outputs:\n{agent.log_tail()}"
        )
        metrics = agent.scrape()
        assert agent.alive and agent.starts == 1
        assert agent.stop(timeout=10) == 0, agent.log_tail()
    finally:
        agent.kill()
        collector.stop()
    letters = collector.records[TOPICS["dead_letter"]]
    got = {
        where[
            (
                h["boxwatch-source-topic"].decode(),
                int(h["boxwatch-source-partition"]),
                int(h["boxwatch-source-offset"]),
            )
        ].kind: (k, h, json.loads(v))
        for k, h, v in letters
    }
    assert sorted(got) == sorted(r.kind for r in bad)
    for rec in bad:
        key, headers, stub = got[rec.kind]
        assert headers["boxwatch-dlq-reason"].decode() == rec.reason
        assert stub["payload_omitted"] and stub["payload_bytes"] == len(rec.value)
        assert stub["payload_sha256"] == hashlib.sha256(rec.value).hexdigest()
    key, headers, _ = got["key_1_5mib"]
    assert key is None and int(headers["boxwatch-key-bytes"]) == 3 << 19
    assert headers["boxwatch-key-sha256"].decode() == hashlib.sha256(b"k" * (3 << 19)).hexdigest()
    assert set(collector.ids[TOPICS["verdicts"]]) == {_record_id(r) for r in [*valid, big_key]}
    assert metrics['boxwatch_agent_outputs_payload_omitted_total{kind="dead_letter"}'] == 3
    assert metrics['boxwatch_agent_outputs_dropped_total{kind="dead_letter"}'] == 0
    assert metrics["boxwatch_agent_produce_errors_total"] >= 1


@pytest.mark.parametrize("library", AGENT_LIBRARIES)
def test_sigterm_stops_the_agent_within_10_s_while_the_broker_is_frozen(
    example, make_broker, agent_process_factory, library
):
    """SIGTERM while outputs cannot be delivered (the broker SIGSTOPped mid-stream) still
    stops the agent, exit 0, within 10 s: no send or flush may hold it longer."""
    import time

    broker = make_broker("noida").start()
    create_topics(broker.bootstrap_servers, {t: 1 for t in TOPICS.values()})
    rows = stream_rows(example, 20_000, seed=16)
    agent = agent_process_factory(
        broker.bootstrap_servers, kafka__library=library, batch__max_records=1
    )
    try:
        agent.start().wait_ready()
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=5)
        for i, row in enumerate(rows):
            producer.send(
                TOPICS["inputs"],
                *tensor_record(f"s{i}", row)[:1],
                headers=tensor_record(f"s{i}", row)[1],
            )
        producer.flush(timeout=10)
        producer.close(timeout=2)
        broker.pause()  # one record a batch: the agent is mid-stream, in a send or a flush
        time.sleep(4)
        t0 = time.monotonic()
        code = agent.stop(timeout=10)
        took = time.monotonic() - t0
        broker.resume()
    finally:
        agent.kill()
    print(f"\nSIGTERM to exit: {took:.1f} s")
    assert code == 0 and took < 10, f"exit {code} after {took:.1f} s:\n{agent.log_tail()}"
