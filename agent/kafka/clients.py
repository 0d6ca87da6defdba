"""Choosing and opening the configured Kafka client: consumer, producer, topic checks."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.kafka.base import AgentConsumer, AgentProducer, PartitionsCallback

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 0.5  # one TCP connect attempt per bootstrap server
PROBE_INTERVAL_S = 0.5


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


def _address(server: str) -> tuple[str, int] | None:
    host, sep, port = server.strip().rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "localhost", int(port)


def _any_reachable(servers: list[str]) -> bool:
    for server in servers:
        addr = _address(server)
        if addr is None:
            return True  # not ours to judge: the client library reports a malformed address
        try:
            with socket.create_connection(addr, timeout=PROBE_TIMEOUT_S):
                return True
        except OSError:
            continue
    return False


def wait_for_broker(
    cfg: Mapping[str, Any],
    *,
    stopped: Callable[[], bool] = lambda: False,
    say: Callable[[str], None] | None = None,
) -> None:
    """Return once a bootstrap server accepts a TCP connection; retry for
    ``kafka.startup_timeout_s``, then raise :class:`ConfigError`.

    A plain TCP connect (no Kafka request) answers within a second whichever client library
    is configured; the first failure is said at once (``say``, default: a warning log line)
    with how long the agent keeps trying, so nobody waits half a minute in silence.
    """
    servers = [s for s in cfg["kafka.bootstrap_servers"].split(",") if s.strip()]
    window = cfg["kafka.startup_timeout_s"]
    deadline = time.monotonic() + window
    said = False
    while not _any_reachable(servers):
        if not said:
            (say or log.warning)(
                f"Kafka at {cfg['kafka.bootstrap_servers']} is not reachable yet; retrying "
                f"for up to {window} s (kafka.startup_timeout_s)"
            )
            said = True
        if time.monotonic() >= deadline or stopped():
            raise ConfigError(
                f"cannot reach Kafka at {cfg['kafka.bootstrap_servers']}: no bootstrap server "
                f"accepted a connection within {window} s (kafka.startup_timeout_s)"
            )
        time.sleep(PROBE_INTERVAL_S)
