"""Choosing and opening the configured Kafka client: consumer, producer, topic checks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.kafka.base import AgentConsumer, AgentProducer, PartitionsCallback


def library(cfg: Mapping[str, Any]) -> str:
    """The configured client library; a clear error when it is not installed."""
    name = cfg["kafka.library"]
    if name == "confluent-kafka":
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            raise ConfigError(
                "kafka.library is confluent-kafka but it is not installed "
                "(pip install 'boxwatch[confluent]')"
            ) from None
    return name


def make_consumer(
    cfg: Mapping[str, Any],
    topics: list[str],
    *,
    on_assign: PartitionsCallback | None = None,
    on_revoke: PartitionsCallback | None = None,
) -> AgentConsumer:
    """The agent's consumer, subscribed to ``topics`` with the rebalance callbacks."""
    if library(cfg) == "confluent-kafka":
        from boxwatch.agent.kafka.confluent import ConfluentConsumer

        return ConfluentConsumer(cfg, topics, on_assign=on_assign, on_revoke=on_revoke)
    from boxwatch.agent.kafka.kafka_python import KafkaPythonConsumer

    return KafkaPythonConsumer(cfg, topics, on_assign=on_assign, on_revoke=on_revoke)


def make_producer(cfg: Mapping[str, Any]) -> AgentProducer:
    """The agent's producer (acks=all, per-partition order kept)."""
    if library(cfg) == "confluent-kafka":
        from boxwatch.agent.kafka.confluent import ConfluentProducer

        return ConfluentProducer(cfg)
    from boxwatch.agent.kafka.kafka_python import KafkaPythonProducer

    return KafkaPythonProducer(cfg)


def ensure_topics(cfg: Mapping[str, Any], topics: Iterable[str]) -> list[str]:
    """Check that ``topics`` exist; create the missing ones when the config says so.

    Returns the topics created. Raises :class:`ConfigError` naming the missing topics.
    """
    wanted = sorted(set(topics))
    if library(cfg) == "confluent-kafka":
        from boxwatch.agent.kafka.confluent import create_topics, list_topics
    else:
        from boxwatch.agent.kafka.kafka_python import create_topics, list_topics
    where = cfg["kafka.bootstrap_servers"]
    missing = [t for t in wanted if t not in list_topics(cfg)]
    if not missing:
        return []
    if not cfg["kafka.create_topics"]:
        raise ConfigError(
            f"topics missing on {where}: {missing} (create them, or set kafka.create_topics: true)"
        )
    create_topics(cfg, missing, cfg["kafka.partitions"])
    return missing
