"""The agent against real Kafka-protocol brokers: N in, N out, same values as offline."""

from __future__ import annotations

import io
import json
import re
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from kafka import TopicPartition
from kafka_helpers import AGENT_LIBRARIES, consume, create_topics
from reliability_helpers import parse_metrics

from boxwatch.agent.boxes import verdict_names
from boxwatch.agent.records import NPY_TYPE, TENSOR_TYPE
from boxwatch.agent.service import build_agent, serve

pytestmark = pytest.mark.integration

TOPICS = {
    "inputs": "t.inputs",
    "bn_inputs": "t.credit",
    "verdicts": "t.verdicts",
    "gate": "t.gate",
    "dead_letter": "t.dlq",
    "release": "t.release",
    "review": "t.review",
}
N_MODEL, N_BN = 120, 80


@pytest.fixture
def agent_config(example, agent_config_factory):
    """``agent_config(bootstrap, **settings)``: the example's config on this file's topics."""

    def make(bootstrap: str, **settings):
        return agent_config_factory(
            example,
            topics=TOPICS,
            kafka__bootstrap_servers=bootstrap,
            kafka__group_id="agent-test",
            metrics__address="127.0.0.1:0",
            batch__max_records=32,
            **settings,
        )

    return make


def npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x, allow_pickle=False)
    return buf.getvalue()


def model_inputs(example) -> tuple[np.ndarray, list[tuple[bytes, list]]]:
    data = np.load(example.data / "stream.npz")
    x = np.concatenate([data["x_known"][: N_MODEL // 2], data["x_unknown"][: N_MODEL // 2]])
    records = []
    for i, row in enumerate(x):
        rid = f"m{i}"
        if i % 3 == 0:
            records.append((json.dumps({"id": rid, "input": row.tolist()}).encode(), []))
        elif i % 3 == 1:
            records.append(
                (
                    row.astype("<f4").tobytes(),
                    [
                        ("content-type", TENSOR_TYPE.encode()),
                        ("id", rid.encode()),
                        ("dtype", b"float32"),
                    ],
                )
            )
        else:
            records.append(
                (
                    npy(row.reshape(8, 8).astype(np.float64)),
                    [("content-type", NPY_TYPE.encode()), ("id", rid.encode())],
                )
            )
    return x, records


def bn_inputs(runtime, seed=3) -> tuple[np.ndarray, list[bytes]]:
    d = runtime.diagram
    rng = np.random.default_rng(seed)
    x = np.stack([rng.integers(0, len(s), N_BN) for s in d.states], axis=1)
    records = [
        json.dumps(
            {"id": f"b{i}", "evidence": {f: d.states[j][x[i, j]] for j, f in enumerate(d.features)}}
        ).encode()
        for i in range(N_BN)
    ]
    return x, records


BAD = [
    (TOPICS["inputs"], b"{oops", [], "not_json"),
    (TOPICS["inputs"], b'{"id": "s", "input": [1, 2]}', [], "bad_shape"),
    (
        TOPICS["inputs"],
        b"\x00" * 256,
        [("content-type", TENSOR_TYPE.encode()), ("id", b"x"), ("dtype", b"complex128")],
        "bad_dtype",
    ),
    (TOPICS["bn_inputs"], b'{"id": "z", "evidence": {"Nope": "x"}}', [], "unknown_variable"),
]


def scrape(address: str) -> dict[str, float]:
    return parse_metrics(
        urllib.request.urlopen(f"http://{address}/metrics", timeout=5).read().decode()
    )


def metric_samples(scraped: dict[str, float], name: str) -> list[tuple[dict[str, str], float]]:
    """The labels and value of each sample of ``name`` in a :func:`scrape`."""
    return [
        (dict(re.findall(r'(\w+)="([^"]*)"', key)), value)
        for key, value in scraped.items()
        if key.startswith(name + "{")
    ]


def _settled_lag(address: str, timeout: float = 15.0) -> dict[str, float]:
    """The consumer-lag series once they exist and read 0 (or whatever they read at timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        lags = {
            k: v
            for k, v in scrape(address).items()
            if k.startswith("boxwatch_agent_consumer_lag_records{")
        }
        if (lags and not any(lags.values())) or time.monotonic() > deadline:
            return lags
        time.sleep(0.25)


@pytest.mark.parametrize("library", AGENT_LIBRARIES)
def test_agent_round_trip(example, agent_config, broker, kafka, library):
    create_topics(broker.bootstrap_servers, {t: 2 for t in TOPICS.values()})
    cfg = agent_config(broker.bootstrap_servers, kafka__library=library)
    agent = build_agent(cfg)
    agent.check_topics()
    http = serve(agent)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        x_model, model_recs = model_inputs(example)
        offline = example.runtime()
        x_bn, bn_recs = bn_inputs(offline)
        producer = kafka.producer()
        for value, headers in model_recs:
            producer.send(TOPICS["inputs"], value, headers=headers)
        for value in bn_recs:
            producer.send(TOPICS["bn_inputs"], value)
        for topic, value, headers, _ in BAD:
            producer.send(topic, value, headers=headers)
        producer.flush()
        out = kafka.consumer(TOPICS["verdicts"], TOPICS["gate"], TOPICS["dead_letter"])
        got = consume(out, N_MODEL + N_BN + len(BAD), timeout=60)
        lags = _settled_lag(http.address)
    finally:
        agent.stop()
        thread.join(timeout=15)
    assert not thread.is_alive(), "agent did not stop within its shutdown timeout"
    by_topic: dict[str, list] = {}
    for r in got:
        by_topic.setdefault(r.topic, []).append(r)
    verdicts = {
        json.loads(r.value)["id"]: json.loads(r.value) for r in by_topic[TOPICS["verdicts"]]
    }
    gates = {json.loads(r.value)["id"]: json.loads(r.value) for r in by_topic[TOPICS["gate"]]}
    assert sorted(verdicts) == sorted(f"m{i}" for i in range(N_MODEL))
    assert sorted(gates) == sorted(f"b{i}" for i in range(N_BN))

    # Same values as offline, computed on the whole set in one batch.
    res = offline.run_model(x_model)
    names = verdict_names(res.verdicts)
    reasons, reason_layers = res.reasons.names(), res.reasons.layers()
    for i in range(N_MODEL):
        v = verdicts[f"m{i}"]
        assert v["verdict"] == names[i]
        assert v["reason"] == reasons[i] and v["layer"] == reason_layers[i]
        nearest = res.reasons.nearest[i]
        assert v["nearest_class"] == (None if nearest < 0 else offline.classes[nearest])
        assert v["predicted_class"] == offline.classes[res.predicted[i]]
        assert v["score"] == pytest.approx(float(res.scores[i]), abs=1e-5)
        assert v["score_accepted"] == (None if res.accepted is None else bool(res.accepted[i]))
        for layer, lv in res.layer_verdicts.items():
            assert v["layers"][layer] == verdict_names(lv)[i]
        assert v["artifact_id"] == offline.artifact_id
    decisions = offline.diagram.predict(x_bn)
    gated = offline.gate.apply(x_bn, decisions)
    outcomes = set()
    for i in range(N_BN):
        g = gates[f"b{i}"]
        assert g["decision"] == offline.diagram.terminals[decisions[i]]
        assert g["outcome"] == ("certified", "blocked", "unverified")[gated.outcomes[i]]
        assert g["rules"] == gated.rule_ids[i]
        outcomes.add(g["outcome"])

    # Lag per consumed partition, caught up once everything is processed.
    assert lags and set(lags.values()) == {0.0}, lags

    # Dead letters: the original bytes and the reason.
    dlq = by_topic[TOPICS["dead_letter"]]
    assert sorted(dict(r.headers)["boxwatch-dlq-reason"].decode() for r in dlq) == sorted(
        b[3] for b in BAD
    )
    assert {r.value for r in dlq} == {b[1] for b in BAD}

    # Metrics agree with what was processed.
    m = scrape(http.address)
    http.stop()
    total_verdicts = sum(v for k, v in m.items() if k.startswith("boxwatch_agent_verdicts_total{"))
    assert total_verdicts == N_MODEL
    said = Counter((v["verdict"], v["reason"]) for v in verdicts.values())
    assert len(said) > 1, said  # the stream's unknown inputs are rejected, for some reason
    counted = {
        (labels["verdict"], labels["reason"]): value
        for labels, value in metric_samples(m, "boxwatch_agent_verdict_reasons_total")
        if value
    }
    assert counted == dict(said)
    assert m['boxwatch_agent_inputs_total{kind="model"}'] == N_MODEL + 3
    assert m['boxwatch_agent_inputs_total{kind="bn"}'] == N_BN + 1
    assert m['boxwatch_agent_invalid_records_total{reason="not_json"}'] == 1
    gate_total = sum(v for k, v in m.items() if k.startswith("boxwatch_agent_gate_outcomes_total{"))
    assert gate_total == N_BN
    assert m['boxwatch_agent_outputs_total{kind="dead_letter"}'] == len(BAD)

    # Shutdown committed everything it consumed.
    group = kafka.consumer(group_id="agent-test")
    ends = group.end_offsets(
        [TopicPartition(TOPICS[t], p) for t in ("inputs", "bn_inputs") for p in (0, 1)]
    )
    for tp, end in ends.items():
        if broker.kind == "tansu" and end > 0:
            continue  # Tansu's high watermarks are wrong (FACTS.md); offsets checked on noida
        assert group.committed(tp) == end, tp


@pytest.mark.parametrize("library", AGENT_LIBRARIES)
def test_missing_topics_stop_the_agent(agent_config, broker, library):
    from boxwatch.agent.errors import ConfigError
    from boxwatch.agent.kafka import ensure_topics

    agent = build_agent(agent_config(broker.bootstrap_servers, kafka__library=library))
    with pytest.raises(ConfigError, match="topics missing"):
        agent.check_topics()
    created = build_agent(
        agent_config(broker.bootstrap_servers, kafka__library=library, kafka__create_topics=True)
    )
    created.check_topics()
    # Created for real: a second check finds nothing missing.
    assert ensure_topics(created.cfg, [*created.input_topics(), *created.output_topics()]) == []


@pytest.mark.parametrize("library", AGENT_LIBRARIES)
def test_unknown_client_option_or_unreachable_broker_is_one_clear_error(agent_config, library):
    """A client option the library refuses, or no broker: a ConfigError, never a traceback."""
    from boxwatch.agent.errors import ConfigError
    from boxwatch.agent.kafka import make_consumer, make_producer
    from boxwatch.embedded_broker import free_loopback_port

    bad = agent_config("127.0.0.1:1", kafka__library=library, kafka__client={"no_such.option": 1})
    for make in (make_producer, lambda cfg: make_consumer(cfg, ["t"])):
        with pytest.raises(ConfigError, match="refused by .*no_such.option"):
            make(bad)
    gone = agent_config(
        f"127.0.0.1:{free_loopback_port()}", kafka__library=library, kafka__startup_timeout_s=2
    )  # nobody listens there: two seconds of retries say as much as the default 30
    with pytest.raises(ConfigError, match="127.0.0.1"):
        build_agent(gone).check_topics()


def test_agent_cli_refuses_bad_artifact_or_model(example, tmp_path):
    from click.testing import CliRunner

    from boxwatch.cli import cli

    tampered = tmp_path / "t.bwa"
    data = bytearray(example.artifact.read_bytes())
    data[len(data) // 3] ^= 0x01
    tampered.write_bytes(bytes(data))
    other_model = tmp_path / "model.onnx"
    other_model.write_bytes(example.model.read_bytes() + b"\0")
    base = ["agent", "--public-key", str(example.public_key), "--bootstrap-servers", "127.0.0.1:1"]
    for args, needle in (
        (["--artifact", str(tampered), "--model", str(example.model)], "refusing to start"),
        (["--artifact", str(example.artifact), "--model", str(other_model)], "does not match"),
        (
            ["--artifact", str(example.artifact), "--model", str(Path("/nonexistent.onnx"))],
            "no such model file",
        ),
    ):
        result = CliRunner().invoke(cli, base + args)
        assert result.exit_code in (1, 2), result.output
        assert needle in result.stderr and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_agent_cli_exits_3_when_the_chosen_library_is_not_installed(example, monkeypatch):
    import sys

    from click.testing import CliRunner

    from boxwatch.agent.kafka import LIBRARIES
    from boxwatch.cli import EXIT_MISSING_EXTRA, cli

    monkeypatch.setitem(sys.modules, LIBRARIES["confluent-kafka"].requires, None)
    args = ["agent", "--artifact", str(example.artifact), "--model", str(example.model)]
    args += ["--public-key", str(example.public_key)]
    # A bootstrap address without a port is not probed (the library would judge it), so the
    # agent goes straight on to the topics, where the client library is first needed.
    result = CliRunner(env={"BOXWATCH_KAFKA_LIBRARY": "confluent-kafka"}).invoke(
        cli, [*args, "--bootstrap-servers", "no-port"]
    )
    assert result.exit_code == EXIT_MISSING_EXTRA, result.output
    assert result.stderr.strip().splitlines() == [
        "error: kafka.library is confluent-kafka but it is not installed "
        "(pip install 'boxwatch[confluent]')"
    ]


def _quiet(consumer) -> None:
    """Poll until the consumer is parked (its partitions paused for idleness), then a little
    longer with no record."""
    deadline = time.monotonic() + 30
    while not _is_parked(consumer) and time.monotonic() < deadline:
        assert consumer.poll(32, 0.02) == []
    for _ in range(20):
        assert consumer.poll(32, 0.02) == []
    assert _is_parked(consumer)


def _is_parked(consumer) -> bool:
    """Parked: partitions paused for idleness (either client)."""
    return consumer._parked not in (None, False) and bool(consumer.raw.assignment())


def _drain(consumers, n: int, seconds: float = 30) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + seconds
    while len(got) < n and time.monotonic() < deadline:
        for c in consumers:
            got += [r.value for r in c.poll(32, 0.02)]
    for _ in range(10):  # anything more would be a duplicate
        for c in consumers:
            got += [r.value for r in c.poll(32, 0.02)]
    return got


@pytest.mark.parametrize("library", AGENT_LIBRARIES)
def test_idle_parked_consumer_still_gets_every_record(agent_config, broker, kafka, library):
    """After a quiet spell the consumer parks (its partitions are paused and resumed when
    the broker's end offsets move; bench/idle_cpu.py measures the CPU this saves). Records produced then
    all arrive, none lost or doubled: on a fresh topic (no position yet), then in quiet
    spells that alternate the partitions written to (one position known, the other not;
    both known; each after a seek that found no record)."""
    from boxwatch.agent.kafka import make_consumer

    create_topics(broker.bootstrap_servers, {TOPICS["inputs"]: 2})
    cfg = agent_config(broker.bootstrap_servers, kafka__library=library)
    consumer = make_consumer(cfg, [TOPICS["inputs"]])
    producer = kafka.producer()
    try:
        for round_ in range(4):
            _quiet(consumer)
            sent = [f"r{round_}-{i}".encode() for i in range(50)]
            for value in sent:
                producer.send(TOPICS["inputs"], value, partition=round_ % 2)
            producer.flush()
            assert sorted(_drain([consumer], 50)) == sorted(sent)
            assert not _is_parked(consumer)
    finally:
        consumer.close(5)


def _wake_then_park(consumer) -> None:
    """Drive a parked consumer (either client) through a wake-up at its next idle check and
    park it again at once, as a late fetch on a loaded machine does: the wake-up brings no
    record before the next quiet spell."""
    parked = consumer._parked
    args = () if parked is True else (parked,)  # kafka-python parks with a flag
    deadline = time.monotonic() + 10
    while not consumer._news(*args):
        assert time.monotonic() < deadline, "the records never moved the end offset"
        time.sleep(0.05)
    consumer._unpark(*args)
    consumer._park()
    assert _is_parked(consumer)


@pytest.mark.parametrize("library", AGENT_LIBRARIES)
def test_parked_consumer_woken_late_still_gets_every_record(agent_config, broker, kafka, library):
    """A consumer woken by new records that parks again before its fetch brought one still
    gets them all (its next check wakes it again), whether the broker's end offset counts
    records (noida-db: 50 for the batch of 50 here) or batches (Tansu: 1)."""
    from boxwatch.agent.kafka import make_consumer

    create_topics(broker.bootstrap_servers, {TOPICS["inputs"]: 2})
    cfg = agent_config(broker.bootstrap_servers, kafka__library=library)
    consumer = make_consumer(cfg, [TOPICS["inputs"]])
    producer = kafka.producer(linger_ms=60_000)  # held until the flush: one batch
    try:
        _quiet(consumer)
        sent = [f"late-{i}".encode() for i in range(50)]
        for value in sent:
            producer.send(TOPICS["inputs"], value, partition=0)
        producer.flush()
        _wake_then_park(consumer)
        assert sorted(_drain([consumer], 50)) == sorted(sent)
        assert not _is_parked(consumer)
    finally:
        consumer.close(5)


@pytest.mark.parametrize("library", AGENT_LIBRARIES)
def test_parked_consumer_not_woken_by_a_transaction_marker(agent_config, broker, kafka, library):
    """A committed transaction ends in a marker that the end offset counts and no record
    carries: the consumer reads the records, parks, and stays parked through several idle
    checks (its position moved past the marker), so parking still saves the CPU it is for."""
    from boxwatch.agent.kafka import make_consumer
    from boxwatch.agent.kafka.base import IDLE_FETCH_INTERVAL_S

    create_topics(broker.bootstrap_servers, {TOPICS["inputs"]: 1})
    producer = kafka.producer(transactional_id="t-marker")
    producer.init_transactions()
    producer.begin_transaction()
    sent = [f"tx-{i}".encode() for i in range(10)]
    for value in sent:
        producer.send(TOPICS["inputs"], value, partition=0)
    producer.commit_transaction()
    end = kafka.consumer().end_offsets([TopicPartition(TOPICS["inputs"], 0)])
    assert list(end.values()) == [len(sent) + 1]  # the records and the marker
    cfg = agent_config(broker.bootstrap_servers, kafka__library=library)
    consumer = make_consumer(cfg, [TOPICS["inputs"]])
    try:
        assert sorted(_drain([consumer], 10)) == sorted(sent)
        _quiet(consumer)
        parked = consumer._parked
        deadline = time.monotonic() + 6 * IDLE_FETCH_INTERVAL_S
        while time.monotonic() < deadline:
            assert consumer.poll(32, 0.02) == []
            assert consumer._parked is parked, "woken with no record to read"
    finally:
        consumer.close(5)


class _Member(threading.Thread):
    """A consumer polled in its own thread, as each agent's loop polls its own (two members
    polled in turn by one thread hold up each other's group joins)."""

    def __init__(self, consumer) -> None:
        super().__init__(daemon=True)
        self.consumer, self.got, self.stop = consumer, [], threading.Event()
        self.assignment: set = set()

    def run(self) -> None:
        while not self.stop.is_set():
            self.got += [r.value for r in self.consumer.poll(32, 0.02)]
            # read in the polling thread: librdkafka's assignment() blocks beside a poll
            self.assignment = {(tp.topic, tp.partition) for tp in self.consumer.raw.assignment()}

    def assigned(self) -> set:
        return set(self.assignment)

    def end(self) -> None:
        self.stop.set()
        self.join(10)
        assert not self.is_alive()
        self.consumer.close(5)


@pytest.mark.parametrize("library", AGENT_LIBRARIES)
def test_idle_parked_consumer_takes_part_in_a_rebalance(agent_config, broker, kafka, library):
    """A second member joins the group while the first is parked: the group rebalances
    (the two members split the partitions), and the records produced then arrive once each
    across the two."""
    from boxwatch.agent.kafka import make_consumer

    create_topics(broker.bootstrap_servers, {TOPICS["inputs"]: 2})
    cfg = agent_config(broker.bootstrap_servers, kafka__library=library)
    first_consumer = make_consumer(cfg, [TOPICS["inputs"]])
    _quiet(first_consumer)
    first = _Member(first_consumer)
    first.start()
    second = None
    try:
        second = _Member(make_consumer(cfg, [TOPICS["inputs"]]))
        second.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            a, b = first.assigned(), second.assigned()
            if a and b and not a & b:
                break
            time.sleep(0.05)
        a, b = first.assigned(), second.assigned()
        assert a and b and not a & b, (a, b)
        producer = kafka.producer()
        sent = [f"j{i}".encode() for i in range(100)]
        for i, value in enumerate(sent):
            producer.send(TOPICS["inputs"], value, partition=i % 2)
        producer.flush()
        deadline = time.monotonic() + 30
        while len(first.got) + len(second.got) < 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # anything more would be a duplicate
        assert sorted(first.got + second.got) == sorted(sent)
        assert first.got and second.got
    finally:
        first.end()
        if second is not None:
            second.end()
