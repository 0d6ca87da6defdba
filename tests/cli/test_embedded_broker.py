"""Embedded brokers: start/stop, produce/consume with a group, topics, restarts and failures."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest
from kafka import TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaTimeoutError, RequestTimedOutError, TopicAlreadyExistsError
from kafka.structs import OffsetAndMetadata
from kafka_helpers import consume, create_topics, make_admin, make_consumer, make_producer

from boxwatch.embedded_broker import (
    KINDS,
    BrokerError,
    EmbeddedBroker,
    available_kinds,
    port_is_open,
)

pytestmark = pytest.mark.integration


def test_available_kinds_are_known_and_runnable():
    kinds = available_kinds()
    assert set(kinds) <= set(KINDS)
    assert kinds == tuple(k for k in KINDS if k in kinds)


def test_unknown_kind_and_non_loopback_host_are_refused():
    with pytest.raises(BrokerError, match="unknown broker kind 'kafka'"):
        EmbeddedBroker("kafka")
    with pytest.raises(BrokerError, match="loopback only"):
        EmbeddedBroker("noida", host="0.0.0.0")


def test_start_answers_kafka_and_stop_closes_port_and_removes_temp_files(broker, kafka):
    assert broker.running and broker.pid is not None
    host, port = broker.bootstrap_servers.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) == broker.port
    assert isinstance(kafka.admin().list_topics(), list)
    log_path = broker.log_path
    assert log_path.exists()
    kafka.close()

    started = time.monotonic()
    broker.stop(timeout=3.0)
    assert time.monotonic() - started < 3.0 + 5.0
    assert not broker.running and broker.returncode is not None
    assert not port_is_open("127.0.0.1", broker.port)
    assert not log_path.exists()
    broker.stop()  # idempotent


def test_produce_with_headers_and_consume_in_a_group_with_commits(broker, kafka):
    n = 300
    create_topics(broker.bootstrap_servers, {"inputs": 3})
    producer = kafka.producer()
    for i in range(n):
        producer.send(
            "inputs",
            key=f"k{i}".encode(),
            value=f"v{i}".encode(),
            headers=[("content-type", b"text/plain"), ("seq", str(i).encode())],
        )
    producer.flush(timeout=10)

    consumer = kafka.consumer("inputs", group_id="g-commit")
    records = consume(consumer, n)
    assert sorted(r.value for r in records) == sorted(f"v{i}".encode() for i in range(n))
    for r in records:
        headers = dict(r.headers)
        assert headers["content-type"] == b"text/plain"
        assert r.value == f"v{int(headers['seq'])}".encode()
        assert r.key == f"k{int(headers['seq'])}".encode()
    consumer.commit()

    per_partition = {p: 0 for p in range(3)}
    for r in records:
        per_partition[r.partition] += 1
    assert sum(per_partition.values()) == n and min(per_partition.values()) > 0
    # committed offsets read back by another client of the group (OffsetFetch, no join)
    reader = kafka.consumer(group_id="g-commit")
    for p, count in per_partition.items():
        assert reader.committed(TopicPartition("inputs", p)) == count


def test_admin_creates_topics_with_partitions(broker, kafka):
    admin = kafka.admin()
    admin.create_topics([NewTopic("four", 4, 1)])
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topics([NewTopic("four", 4, 1)])
    assert "four" in admin.list_topics()
    consumer = kafka.consumer()
    assert consumer.partitions_for_topic("four") == {0, 1, 2, 3}
    producer = kafka.producer()
    for p in range(4):
        assert producer.send("four", value=b"x", partition=p).get(timeout=10).partition == p


@pytest.mark.parametrize("kind", KINDS)
def test_restart_keeps_noida_data_and_offsets_and_empties_tansu(make_broker, kind):
    broker = make_broker(kind).start()
    create_topics(broker.bootstrap_servers, {"kept": 1})
    producer = make_producer(broker.bootstrap_servers)
    for i in range(50):
        producer.send("kept", value=str(i).encode())
    producer.flush(timeout=10)
    producer.close(timeout=2)
    tp = TopicPartition("kept", 0)
    consumer = make_consumer(broker.bootstrap_servers, group_id="g-restart")
    consumer.commit({tp: OffsetAndMetadata(30, "", -1)})
    consumer.close()
    data_dir, port = broker.data_dir, broker.port

    broker.restart()
    assert broker.port == port and broker.running

    reader = make_consumer(broker.bootstrap_servers, group_id="g-restart")
    try:
        if broker.persistent:
            assert data_dir.exists()
            assert reader.committed(tp) == 30
            reader.assign([tp])
            assert [int(r.value) for r in consume(reader, 20)] == list(range(30, 50))
        else:
            assert "kept" not in reader.topics()
            assert reader.committed(tp) is None
    finally:
        reader.close()


@pytest.mark.parametrize("kind", KINDS)
def test_stop_kills_a_broker_that_ignores_sigterm(make_broker, kind):
    broker = make_broker(kind).start()
    os.kill(broker.pid, signal.SIGSTOP)  # a hung broker: SIGTERM stays pending, SIGKILL works
    started = time.monotonic()
    broker.stop(timeout=1.0)
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 1.0 + 5.0
    assert broker.returncode == -signal.SIGKILL
    assert not port_is_open("127.0.0.1", broker.port)


@pytest.mark.parametrize("kind", KINDS)
def test_start_on_a_busy_port_fails_clearly(make_broker, kind):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        broker = make_broker(kind, port=port)
        with pytest.raises(BrokerError, match=f"port 127.0.0.1:{port} is already in use"):
            broker.start(timeout=5)
        assert not broker.running


def test_broker_exit_at_start_reports_its_log_tail(make_broker, tmp_path):
    (tmp_path / "kafka.json").write_text("{not json")
    broker = make_broker("noida", data_dir=tmp_path)
    with pytest.raises(BrokerError, match=r"exited with status \d+; its log ends") as info:
        broker.start(timeout=5)
    assert "snapshot" in str(info.value)
    assert "GLIBC" not in str(info.value)
    assert not broker.running and tmp_path.exists()


def test_pause_makes_writes_fail_until_resume(broker, kafka):
    create_topics(broker.bootstrap_servers, {"paused": 1})
    producer = kafka.producer(
        enable_idempotence=False, request_timeout_ms=1000, delivery_timeout_ms=1500, retries=0
    )
    producer.send("paused", b"before").get(timeout=10)
    broker.pause()
    with pytest.raises((KafkaTimeoutError, RequestTimedOutError)):
        producer.send("paused", b"during").get(timeout=5)
    broker.resume()
    assert producer.send("paused", b"after").get(timeout=10).topic == "paused"


def test_noida_auto_creation_off_holds_writes_to_a_deleted_topic(make_broker):
    broker = make_broker("noida").start()
    create_topics(broker.bootstrap_servers, {"verdicts": 1})
    admin = make_admin(broker.bootstrap_servers)
    producer = make_producer(broker.bootstrap_servers)
    reader = make_consumer(broker.bootstrap_servers)
    try:
        admin.delete_topics(["verdicts"])
        broker.set_auto_create_topics(False)
        held = producer.send("verdicts", b"held")
        with pytest.raises(KafkaTimeoutError):
            held.get(timeout=2)  # no metadata for the topic: the record waits, undelivered
        assert "verdicts" not in admin.list_topics()
        broker.set_auto_create_topics(True)
        assert producer.send("verdicts", b"after").get(timeout=10).offset == 1
        assert held.get(timeout=10).offset == 0  # delivered once the topic could exist again
        reader.assign([TopicPartition("verdicts", 0)])
        assert [r.value for r in consume(reader, 2)] == [b"held", b"after"]
    finally:
        reader.close()
        producer.close(timeout=2)
        admin.close()


def test_tansu_refuses_to_turn_auto_creation_off(make_broker):
    broker = make_broker("tansu").start()
    with pytest.raises(BrokerError, match="always auto-creates"):
        broker.set_auto_create_topics(False)
