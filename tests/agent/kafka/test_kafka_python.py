"""kafka-python behind the agent (``agent/kafka/kafka_python.py``): the producer's direct
path for keyed outputs writes exactly what ``KafkaProducer.send`` writes, on real brokers,
and stays off where ``send`` has more to decide."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.partitioner.default import DefaultPartitioner
from kafka.serializer import Serializer
from kafka_helpers import consume, create_topics

from boxwatch.agent.kafka.kafka_python import KafkaPythonProducer, direct_appender
from boxwatch.agent.outputs import Output

pytestmark = pytest.mark.integration

N = 300


class Counted:
    """Wraps a direct appender and counts the outputs it took (not handed back to send)."""

    def __init__(self, direct: Callable[..., Any]) -> None:
        self.direct = direct
        self.taken = 0

    def __call__(self, *args: Any) -> Any:
        future = self.direct(*args)
        self.taken += future is not None
        return future


def outputs(topic: str) -> list[Output]:
    """Keyed verdict-like outputs of many sizes, and a few with headers or no key (what
    ``send`` alone handles: dead letters, copies)."""
    out = [
        Output("verdict", topic, f"id-{i}".encode(), b"v" * (i % 97) + str(i).encode(), [])
        for i in range(N)
    ]
    out += [
        Output("dead_letter", topic, f"dl-{i}".encode(), b"x", [("boxwatch-dlq-reason", b"r")])
        for i in range(5)
    ]
    out += [Output("capture", topic, None, f"nokey-{i}".encode(), []) for i in range(5)]
    return out


def test_direct_path_writes_what_send_writes(broker, kafka):
    """The same outputs through ``deliver`` (direct path) and through ``send``: the same
    partition, value and headers for every key, on both brokers."""
    bootstrap = broker.bootstrap_servers
    create_topics(bootstrap, {"direct": 6, "sent": 6})
    cfg = {
        "kafka.client": {},
        "kafka.bootstrap_servers": bootstrap,
    }
    producer = KafkaPythonProducer(cfg)
    try:
        assert producer.direct is not None, "this kafka-python should take the direct path"
        counted = producer.direct = Counted(producer.direct)
        direct, sent = outputs("direct"), outputs("sent")
        # Twice: the first list finds no metadata for the topic yet, so send decides
        # (and fetches it); the second takes the direct path.
        assert producer.deliver(direct[: N // 2], timeout_s=20) == []
        assert producer.deliver(direct[N // 2 :], timeout_s=20) == []
        assert counted.taken >= N // 2
        for out in sent:
            producer.raw.send(out.topic, value=out.value, key=out.key, headers=out.headers)
        producer.raw.flush(timeout=20)
    finally:
        producer.close(5)
    consumer = kafka.consumer("direct", "sent")
    got = consume(consumer, 2 * len(direct), timeout=30)
    assert len(got) == 2 * len(direct)
    by_topic: dict[str, dict[bytes, tuple[int, bytes, list]]] = {"direct": {}, "sent": {}}
    for r in got:
        if r.key is not None:
            by_topic[r.topic][r.key] = (r.partition, r.value, list(r.headers))
    assert by_topic["direct"] == by_topic["sent"]
    assert len(by_topic["direct"]) == N + 5
    assert len({p for p, _, _ in by_topic["direct"].values()}) == 6
    unkeyed = sorted(r.value for r in got if r.key is None and r.topic == "direct")
    assert unkeyed == sorted(o.value for o in direct if o.key is None)


class Encode(Serializer):
    def serialize(self, topic: str, value: Any) -> bytes:
        return str(value).encode()


@pytest.mark.parametrize(
    "settings",
    [
        {"key_serializer": Encode()},
        {"value_serializer": Encode()},
        {"partitioner": type("Custom", (DefaultPartitioner,), {})()},
    ],
    ids=["key_serializer", "value_serializer", "partitioner"],
)
def test_direct_path_is_off_where_send_decides_more(broker, settings):
    raw = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, **settings)
    try:
        assert direct_appender(raw) is None
    finally:
        raw.close(timeout=5)
