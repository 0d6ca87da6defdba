"""kafka-python clients for integration tests, with the settings that keep them fast.

Settings follow ../shared/FACTS.md: a consumer group joins in about half the session timeout
(Tansu adds a ~3 s initial rebalance delay; noida-db joins in ~0.4 s), so tests use
``session_timeout_ms=6000, heartbeat_interval_ms=1000``. Known broker defects are listed in
``BROKER_DEFECTS`` so a test can skip, with the reason, what a broker cannot serve.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterable
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.consumer.fetcher import ConsumerRecord

from boxwatch.agent.kafka import LIBRARIES

# The agent's client libraries (kafka.library), from its table; one not installed is skipped.
AGENT_LIBRARIES = [
    pytest.param(
        name,
        id=name,
        marks=pytest.mark.skipif(
            importlib.util.find_spec(lib.requires) is None,
            reason=f"{name} not installed ({lib.install})",
        ),
    )
    for name, lib in LIBRARIES.items()
]

CONSUMER_SETTINGS: dict[str, Any] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
    "auto_offset_reset": "earliest",
    "enable_auto_commit": False,
    "request_timeout_ms": 10000,
}
PRODUCER_SETTINGS: dict[str, Any] = {
    "acks": "all",
    "linger_ms": 5,
    "max_block_ms": 10000,
    "request_timeout_ms": 10000,
}
ADMIN_SETTINGS: dict[str, Any] = {"request_timeout_ms": 10000}

# feature -> reason, per broker kind (measured; see ../shared/FACTS.md).
BROKER_DEFECTS: dict[str, dict[str, str]] = {
    "noida": {
        "large_json_stall": "noida-db: a consumer group received nothing from 10,000 JSON "
        "records of ~6.5 KB (6 partitions)",
        "sigkill_member": "noida-db never removes a SIGKILLed group member: its partitions "
        "are not reassigned (static membership, group_instance_id, lets "
        "the restarted member take them back)",
        "acked_writes_on_kill": "noida-db saves ~0.7 s after a write: a SIGKILLed broker can "
        "lose writes it already acknowledged",
        "member_expiry": "noida-db never evicts a SIGKILLed group member (no takeover in "
        "60 s); a restart with the same group_instance_id reclaims its "
        "partitions in ~2 s",
    },
    "tansu": {
        "persistence": "Tansu is memory-only: a restart loses topics, records and offsets",
        "high_watermark": "Tansu reports high watermark = last batch base offset + 1",
        "create_partitions": "Tansu does not implement CreatePartitions",
        "read_committed": "Tansu shows aborted records to read_committed consumers",
        "describe_groups": "kafka-python's describe_groups fails against Tansu",
        "auto_create_off": "Tansu always auto-creates topics (no broker config)",
        "topic_configs": "Tansu ignores topic configs such as max.message.bytes",
        "static_membership": "a consumer with group_instance_id never gets partitions on Tansu",
    },
}


def require(kind: str, *features: str) -> None:
    """Skip the calling test when broker ``kind`` has a known defect in one of ``features``."""
    for feature in features:
        reason = BROKER_DEFECTS.get(kind, {}).get(feature)
        if reason is not None:
            pytest.skip(f"known defect: {reason}")


def make_producer(bootstrap_servers: str, **overrides: Any) -> KafkaProducer:
    """A producer with acks=all and short timeouts; ``overrides`` win over the defaults."""
    return KafkaProducer(bootstrap_servers=bootstrap_servers, **{**PRODUCER_SETTINGS, **overrides})


def make_consumer(
    bootstrap_servers: str, *topics: str, group_id: str | None = None, **overrides: Any
) -> KafkaConsumer:
    """A consumer (manual commits, earliest reset, fast group join) subscribed to ``topics``."""
    return KafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap_servers,
        group_id=group_id,
        **{**CONSUMER_SETTINGS, **overrides},
    )


def make_admin(bootstrap_servers: str, **overrides: Any) -> KafkaAdminClient:
    """An admin client with a short request timeout."""
    return KafkaAdminClient(bootstrap_servers=bootstrap_servers, **{**ADMIN_SETTINGS, **overrides})


def create_topics(bootstrap_servers: str, partitions: dict[str, int]) -> None:
    """Create each topic with its partition count (replication 1)."""
    admin = make_admin(bootstrap_servers)
    try:
        admin.create_topics([NewTopic(name, n, 1) for name, n in partitions.items()])
    finally:
        admin.close()


def consume(consumer: KafkaConsumer, n: int, timeout: float = 20.0) -> list[ConsumerRecord]:
    """Poll until ``n`` records arrived or ``timeout`` seconds passed; return what arrived."""
    records: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while len(records) < n and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=200, max_records=n - len(records)).values():
            records.extend(batch)
    return records


class KafkaClients:
    """Makes clients for one broker and closes every one of them on :meth:`close`."""

    def __init__(self, bootstrap_servers: str):
        self.bootstrap_servers = bootstrap_servers
        self._open: list[Any] = []

    def producer(self, **overrides: Any) -> KafkaProducer:
        """See :func:`make_producer`."""
        return self._track(make_producer(self.bootstrap_servers, **overrides))

    def consumer(
        self, *topics: str, group_id: str | None = None, **overrides: Any
    ) -> KafkaConsumer:
        """See :func:`make_consumer`."""
        return self._track(
            make_consumer(self.bootstrap_servers, *topics, group_id=group_id, **overrides)
        )

    def admin(self, **overrides: Any) -> KafkaAdminClient:
        """See :func:`make_admin`."""
        return self._track(make_admin(self.bootstrap_servers, **overrides))

    def close(self, clients: Iterable[Any] | None = None) -> None:
        """Close the given clients (default: all still open), swallowing close-time errors."""
        targets = list(self._open if clients is None else clients)
        for client in targets:
            try:
                if isinstance(client, KafkaProducer):
                    client.close(timeout=2)
                else:
                    client.close()
            except Exception:  # a client of a stopped broker may fail to flush: still closed
                pass
            if client in self._open:
                self._open.remove(client)

    def _track(self, client: Any) -> Any:
        self._open.append(client)
        return client
