"""Poison records: 10,000+ generated bad records interleaved with good ones.

Every bad record lands in the dead-letter topic with its original bytes and a reason from
the fixed set; every good one gets its verdict or gate record; the agent process (a real
subprocess) never restarts and its peak RSS stays under 1 GB.
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from kafka_helpers import create_topics
from reliability_helpers import (
    TOPICS,
    OutputCollector,
    StreamProducer,
    stream_rows,
    tensor_record,
)

from boxwatch.agent.metrics import INVALID_REASONS
from boxwatch.agent.records import JSON_TYPE, NPY_TYPE, TENSOR_TYPE

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N_BAD = 10_500
N_GOOD_MODEL, N_GOOD_BN = 3_000, 600
MAX_BYTES = 16_384
GiB = 1 << 30
CT = "content-type"


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _tensor_headers(rid: str, dtype: str = "float32") -> list[tuple[str, bytes]]:
    return [(CT, TENSOR_TYPE.encode()), ("id", rid.encode()), ("dtype", dtype.encode())]


def bad_model_record(kind: str, rid: str, rng: np.random.Generator, size: int):
    """(value, headers, accepted reasons) of one bad model input of ``kind``."""
    row = rng.normal(size=size)
    good_json = json.dumps({"id": rid, "input": row.tolist()}).encode()
    if kind == "random_bytes":
        raw = rng.bytes(int(rng.integers(1, 600)))
        return raw, [], {"bad_content_type", "not_json", "bad_schema"}
    if kind == "random_bytes_json":
        return (
            rng.bytes(int(rng.integers(1, 600))),
            [(CT, JSON_TYPE.encode())],
            {"not_json", "bad_schema"},
        )
    if kind == "truncated_json":
        return (
            good_json[: int(rng.integers(1, len(good_json) - 1))],
            [],
            {"not_json", "bad_content_type"},
        )
    if kind == "invalid_json":
        choices = [
            b"{'id': 'x', 'input': [1]}",
            b'{"id": "x", "input": [1,],}',
            b"{id: 1}",
            b'{"id": "x" "input": []}',
            b'{"id": "\xff\xfe"}',
            b"{" * 5000,
        ]
        return choices[int(rng.integers(len(choices)))], [], {"not_json"}
    if kind == "wrong_shape_json":
        n = int(rng.choice([0, 1, size - 1, size + 1, 3 * size]))
        return (
            json.dumps({"id": rid, "input": rng.normal(size=n).tolist()}).encode(),
            [],
            {"bad_shape"},
        )
    if kind == "ragged_json":
        return json.dumps({"id": rid, "input": [[1.0, 2.0], [3.0]]}).encode(), [], {"bad_shape"}
    if kind == "wrong_shape_tensor":
        n = int(rng.choice([1, size - 1, size + 3]))
        return rng.normal(size=n).astype("<f4").tobytes(), _tensor_headers(rid), {"bad_shape"}
    if kind == "odd_bytes_tensor":
        return rng.bytes(size * 4 + 3), _tensor_headers(rid), {"bad_shape"}
    if kind == "shape_header_mismatch":
        return (
            row.astype("<f4").tobytes(),
            _tensor_headers(rid) + [("shape", b"3,5")],
            {"bad_shape"},
        )
    if kind == "wrong_dtype_header":
        dtype = str(rng.choice(["complex64", "float8", "", "object", "<f4", "FLOAT128"]))
        return row.astype("<f4").tobytes(), _tensor_headers(rid, dtype), {"bad_dtype"}
    if kind == "npy_bad_dtype":
        arr = (
            np.array([str(v) for v in row[:4]]) if rng.random() < 0.5 else row.astype(np.complex64)
        )
        return _npy(arr), [(CT, NPY_TYPE.encode()), ("id", rid.encode())], {"bad_dtype"}
    if kind == "npy_garbage":
        return rng.bytes(200), [(CT, NPY_TYPE.encode()), ("id", rid.encode())], {"bad_schema"}
    if kind == "nan_json":
        return good_json.replace(b"[", b"[NaN, ", 1), [], {"not_finite"}
    if kind == "inf_tensor":
        bad = row.astype("<f4")
        bad[int(rng.integers(size))] = rng.choice([np.nan, np.inf, -np.inf])
        return bad.tobytes(), _tensor_headers(rid), {"not_finite"}
    if kind == "oversized":
        n = int(rng.integers(MAX_BYTES + 1, 4 * MAX_BYTES))
        return b"{" + b" " * (n - 2) + b"}", [], {"too_large"}
    if kind == "missing_id_json":
        bad_id = [None, True, [], {}, ""][int(rng.integers(5))]
        obj = {"input": row.tolist()} if bad_id is None else {"id": bad_id, "input": row.tolist()}
        return json.dumps(obj).encode(), [], {"missing_id"}
    if kind == "missing_id_tensor":
        return (
            row.astype("<f4").tobytes(),
            [(CT, TENSOR_TYPE.encode()), ("dtype", b"float32")],
            {"missing_id"},
        )
    if kind == "duplicate_id_json":
        body = b'{"id": "%s", "id": "%s-b", "input": %s}' % (
            rid.encode(),
            rid.encode(),
            json.dumps(row.tolist()).encode(),
        )
        return body, [], {"duplicate_id"}
    if kind == "duplicate_id_header":
        return (
            row.astype("<f4").tobytes(),
            _tensor_headers(rid) + [("id", b"other")],
            {"duplicate_id"},
        )
    if kind == "wrong_content_type":
        return good_json, [(CT, b"text/csv")], {"bad_content_type"}
    if kind == "null_value":
        return None, [], {"bad_schema"}
    raise AssertionError(kind)


MODEL_KINDS = (
    "random_bytes",
    "random_bytes_json",
    "truncated_json",
    "invalid_json",
    "wrong_shape_json",
    "ragged_json",
    "wrong_shape_tensor",
    "odd_bytes_tensor",
    "shape_header_mismatch",
    "wrong_dtype_header",
    "npy_bad_dtype",
    "npy_garbage",
    "nan_json",
    "inf_tensor",
    "oversized",
    "missing_id_json",
    "missing_id_tensor",
    "duplicate_id_json",
    "duplicate_id_header",
    "wrong_content_type",
    "null_value",
)
BN_KINDS = (
    "bn_unknown_variable",
    "bn_unknown_state",
    "bn_missing_evidence",
    "bn_not_object",
    "bn_duplicate_id",
    "bn_random_bytes",
    "bn_missing_id",
)


def bad_bn_record(kind: str, rid: str, rng: np.random.Generator, features, states):
    ev = {f: str(s[int(rng.integers(len(s)))]) for f, s in zip(features, states, strict=True)}
    if kind == "bn_unknown_variable":
        ev[f"Nope{int(rng.integers(100))}"] = "x"
        return json.dumps({"id": rid, "evidence": ev}).encode(), {"unknown_variable"}
    if kind == "bn_unknown_state":
        ev[features[int(rng.integers(len(features)))]] = "not-a-state"
        return json.dumps({"id": rid, "evidence": ev}).encode(), {"unknown_state"}
    if kind == "bn_missing_evidence":
        ev.pop(features[int(rng.integers(len(features)))])
        return json.dumps({"id": rid, "evidence": ev}).encode(), {"missing_evidence"}
    if kind == "bn_not_object":
        return json.dumps({"id": rid, "evidence": list(ev.items())}).encode(), {"bad_schema"}
    if kind == "bn_duplicate_id":
        return (
            b'{"id": "a", "id": "b", "evidence": %s}' % json.dumps(ev).encode(),
            {"duplicate_id"},
        )
    if kind == "bn_random_bytes":
        return rng.bytes(int(rng.integers(1, 300))), {"not_json", "bad_schema"}
    if kind == "bn_missing_id":
        return json.dumps({"evidence": ev}).encode(), {"missing_id"}
    raise AssertionError(kind)


def test_poison_records_go_to_the_dead_letter_topic(example, make_broker, agent_process_factory):
    broker = make_broker("noida").start()
    create_topics(
        broker.bootstrap_servers,
        {
            TOPICS["inputs"]: 2,
            TOPICS["bn_inputs"]: 2,
            TOPICS["verdicts"]: 2,
            TOPICS["gate"]: 2,
            TOPICS["dead_letter"]: 2,
        },
    )
    rt = example.runtime()
    size, d = rt.preprocessing.size, rt.diagram
    rng = np.random.default_rng(8)
    records: list[tuple[bytes, bytes | None, list]] = []
    topic_of: list[str] = []
    expected: dict[str, set[str]] = {}
    for i in range(N_BAD):
        key = f"bad{i}"
        if i % 5 == 4:
            kind = BN_KINDS[int(rng.integers(len(BN_KINDS)))]
            value, reasons = bad_bn_record(kind, key, rng, d.features, d.states)
            records.append((key.encode(), value, []))
            topic_of.append(TOPICS["bn_inputs"])
        else:
            kind = MODEL_KINDS[int(rng.integers(len(MODEL_KINDS)))]
            value, headers, reasons = bad_model_record(kind, key, rng, size)
            records.append((key.encode(), value, headers))
            topic_of.append(TOPICS["inputs"])
        expected[key] = reasons
    good_model = stream_rows(example, N_GOOD_MODEL, seed=3)
    for i, row in enumerate(good_model):
        rid = f"good{i}"
        if i % 6 == 0:
            records.append(
                (rid.encode(), json.dumps({"id": rid, "input": row.tolist()}).encode(), [])
            )
        else:
            records.append((rid.encode(), *tensor_record(rid, row)))
        topic_of.append(TOPICS["inputs"])
    for i in range(N_GOOD_BN):
        rid = f"bn{i}"
        ev = {f: s[int(rng.integers(len(s)))] for f, s in zip(d.features, d.states, strict=True)}
        records.append((rid.encode(), json.dumps({"id": rid, "evidence": ev}).encode(), []))
        topic_of.append(TOPICS["bn_inputs"])
    order = rng.permutation(len(records))
    records = [records[j] for j in order]
    topic_of = [topic_of[j] for j in order]

    agent = agent_process_factory(broker.bootstrap_servers, max_record_bytes=MAX_BYTES)
    collector = OutputCollector(
        broker.bootstrap_servers,
        [TOPICS["verdicts"], TOPICS["gate"], TOPICS["dead_letter"]],
        keep=[TOPICS["dead_letter"]],
        json_topics=[TOPICS["verdicts"], TOPICS["gate"]],
    )
    producer = StreamProducer(
        broker.bootstrap_servers,
        TOPICS["inputs"],
        records,
        topic_of=topic_of.__getitem__,
        chunk=500,
    )
    n_out = len(records)
    try:
        collector.start()
        agent.start().wait_ready()
        pid = agent.pid
        producer.start()
        producer.join(timeout=180)
        assert producer.error is None and producer.sent == len(records), producer.error
        assert collector.wait_for(lambda c: c.count >= n_out, timeout=180), (
            f"{collector.count} of {n_out} outputs"
        )
        assert agent.alive and agent.pid == pid and agent.starts == 1
        peak = agent.peak_rss_bytes()
        metrics = agent.scrape()
        assert agent.stop() == 0, agent.log_tail()
    finally:
        producer.stop_event.set()
        agent.kill()
        collector.stop()

    dlq = collector.records[TOPICS["dead_letter"]]
    by_key = {}
    for key, headers, value in dlq:
        by_key.setdefault(key.decode(), []).append((headers, value))
    assert set(by_key) == set(expected), "dead letters differ from the bad records sent"
    originals = {k.decode(): v for k, v, _ in records}
    wrong = []
    for key, entries in by_key.items():
        headers, value = entries[0]
        reason = headers["boxwatch-dlq-reason"].decode()
        assert reason in INVALID_REASONS
        if reason not in expected[key]:
            wrong.append((key, reason, expected[key], headers["boxwatch-dlq-detail"][:80]))
        assert headers["boxwatch-dlq-detail"] and "boxwatch-source-offset" in headers
        assert value == originals[key]
    assert not wrong, f"{len(wrong)} dead letters with an unexpected reason, e.g. {wrong[:5]}"
    verdict_ids = collector.ids[TOPICS["verdicts"]]
    gate_ids = collector.ids[TOPICS["gate"]]
    assert set(verdict_ids) == {f"good{i}" for i in range(N_GOOD_MODEL)}
    assert set(gate_ids) == {f"bn{i}" for i in range(N_GOOD_BN)}
    invalid = sum(
        v for k, v in metrics.items() if k.startswith("boxwatch_agent_invalid_records_total{")
    )
    assert invalid == N_BAD
    reasons = sorted(
        {h["boxwatch-dlq-reason"].decode() for h, _ in (e[0] for e in by_key.values())}
    )
    print(
        f"\npoison: {N_BAD} bad + {N_GOOD_MODEL + N_GOOD_BN} good records; reasons {reasons}; "
        f"peak RSS {peak / 2**20:.0f} MiB; one process (pid {pid})"
    )
    assert peak < GiB
