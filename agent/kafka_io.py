"""Kafka clients for the agent: at-least-once consumer, acks=all producer, topic checks.

The client options of the config (``kafka.client``: SASL, SSL...) pass through unchanged to
every kafka-python client that knows them (so a consumer-only option such as
``group_instance_id``, for static group membership, reaches only the consumer); the agent's
own reliability settings override them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from boxwatch.agent.errors import ConfigError

log = logging.getLogger(__name__)

# Errors after which a delivery or commit is retried rather than fatal.
RETRYABLE = (KafkaError, TimeoutError, ConnectionError, OSError)


def client_options(cfg: Mapping[str, Any], client: type) -> dict[str, Any]:
    """The ``kafka.client`` options meant for ``client`` (a kafka-python client class).

    An option no kafka-python client knows is passed on, so the client refuses it loudly.
    """
    known = (KafkaConsumer.DEFAULT_CONFIG, KafkaProducer.DEFAULT_CONFIG,
             KafkaAdminClient.DEFAULT_CONFIG)
    return {k: v for k, v in cfg["kafka.client"].items()
            if k in client.DEFAULT_CONFIG or not any(k in d for d in known)}


def consumer_options(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Options of the agent's consumer: manual commits, bounded batches, quick rebalance."""
    return {
        **client_options(cfg, KafkaConsumer),
        "bootstrap_servers": cfg["kafka.bootstrap_servers"].split(","),
        "group_id": cfg["kafka.group_id"],
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_poll_records": cfg["batch.max_records"],
        # The broker may hold a fetch this long waiting for data; keep it within the batch
        # wait, or an idle-ish stream pays up to kafka-python's 500 ms default per record.
        "fetch_max_wait_ms": min(cfg["batch.max_wait_ms"], 500),
        "session_timeout_ms": 10_000,
        "heartbeat_interval_ms": 1_000,
        "client_id": "boxwatch-agent",
    }


def producer_options(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Options of the agent's producer: acks=all, ordered retries, bounded blocking."""
    return {
        **client_options(cfg, KafkaProducer),
        "bootstrap_servers": cfg["kafka.bootstrap_servers"].split(","),
        "acks": "all",
        "linger_ms": 2,
        "max_in_flight_requests_per_connection": 1,
        # kafka-python 3's idempotent producer never delivers again after a batch times out
        # during a broker outage (seen on both test brokers); one in-flight request keeps
        # per-partition order without it, and redelivery is at-least-once anyway.
        "enable_idempotence": False,
        "retries": 5,
        "request_timeout_ms": 10_000,
        "delivery_timeout_ms": 30_000,
        "max_block_ms": 10_000,
        "client_id": "boxwatch-agent",
    }


def admin_client(cfg: Mapping[str, Any]) -> KafkaAdminClient:
    return KafkaAdminClient(
        **client_options(cfg, KafkaAdminClient),
        bootstrap_servers=cfg["kafka.bootstrap_servers"].split(","),
        client_id="boxwatch-agent-admin",
        request_timeout_ms=10_000,
    )


def ensure_topics(cfg: Mapping[str, Any], topics: Iterable[str]) -> list[str]:
    """Check that ``topics`` exist; create the missing ones when the config says so.

    Returns the topics created. Raises :class:`ConfigError` naming the missing topics.
    """
    wanted = sorted(set(topics))
    try:
        admin = admin_client(cfg)
    except KafkaError as exc:
        raise ConfigError(
            f"cannot reach Kafka at {cfg['kafka.bootstrap_servers']} ({type(exc).__name__})"
        ) from None
    try:
        existing = set(admin.list_topics())
        missing = [t for t in wanted if t not in existing]
        if not missing:
            return []
        if not cfg["kafka.create_topics"]:
            raise ConfigError(
                f"topics missing on {cfg['kafka.bootstrap_servers']}: {missing} (create them, "
                "or set kafka.create_topics: true)"
            )
        new = [NewTopic(t, cfg["kafka.partitions"], 1) for t in missing]
        try:
            admin.create_topics(new)
        except TopicAlreadyExistsError:
            pass
        log.info("created topics %s", missing)
        return missing
    except KafkaError as exc:
        raise ConfigError(f"topic check failed on {cfg['kafka.bootstrap_servers']}: {exc}") from None
    finally:
        admin.close()


def make_consumer(cfg: Mapping[str, Any], topics: list[str], listener: Any = None) -> KafkaConsumer:
    """The agent's consumer, subscribed once (with the rebalance ``listener``)."""
    consumer = KafkaConsumer(**consumer_options(cfg))
    consumer.subscribe(topics, listener=listener)
    return consumer


def make_producer(cfg: Mapping[str, Any]) -> KafkaProducer:
    return KafkaProducer(**producer_options(cfg))
