"""Choosing and opening the configured Kafka client: the table of client libraries,
consumer, producer, topic checks.

:data:`LIBRARIES` maps each ``kafka.library`` name to its adapter, named as
``"module:attribute"`` and imported only when that library is chosen (so confluent-kafka
stays optional: importing this package never imports it); the dispatch, the error for a
library that is not installed, the config's validation and its help text come from it. A
new library is one adapter module (a :class:`~.base.ClientAdapter` as ``ADAPTER``), one row
here and its name in :data:`boxwatch.agent.vocab.KAFKA_LIBRARIES`.
"""

from __future__ import annotations

import importlib
import logging
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from boxwatch.agent.errors import ConfigError, MissingDependencyError
from boxwatch.agent.kafka.base import (
    AgentConsumer,
    AgentProducer,
    ClientAdapter,
    PartitionsCallback,
)

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 0.5  # one TCP connect attempt per bootstrap server
PROBE_INTERVAL_S = 0.5


@dataclass(frozen=True)
class ClientLibrary:
    """One Kafka client library the agent can use: a row of :data:`LIBRARIES`."""

    adapter: str
    """``"module:attribute"`` of its :class:`~.base.ClientAdapter`, imported when chosen."""
    requires: str
    """The module the library itself installs (imported to tell whether it is there)."""
    extra: str | None
    """The boxwatch extra that installs it; ``None`` for a core dependency."""
    about: str
    """What it is, in a few words, for the help text."""

    @property
    def install(self) -> str:
        """How to install it: a pip command, or that it always is."""
        return f"pip install 'boxwatch[{self.extra}]'" if self.extra else "always installed"


LIBRARIES: dict[str, ClientLibrary] = {
    "kafka-python": ClientLibrary(
        adapter="boxwatch.agent.kafka.kafka_python:ADAPTER",
        requires="kafka",
        extra=None,
        about="pure Python",
    ),
    "confluent-kafka": ClientLibrary(
        adapter="boxwatch.agent.kafka.confluent:ADAPTER",
        requires="confluent_kafka",
        extra="confluent",
        about="librdkafka, several times faster",
    ),
}
"""``kafka.library`` name -> library, in the order help texts list them; the names are
:data:`boxwatch.agent.vocab.KAFKA_LIBRARIES` (a test checks)."""


def libraries_text() -> str:
    """The libraries for the ``kafka.library`` help text: each name, what it is and how it
    is installed."""
    named = []
    for name, lib in LIBRARIES.items():
        how = f"; `{lib.install}`" if lib.extra else f", {lib.install}"
        named.append(f"`{name}` ({lib.about}{how})")
    return ", ".join(named[:-1]) + " or " + named[-1]


def library(cfg: Mapping[str, Any]) -> str:
    """The configured client library; :class:`MissingDependencyError` when an optional one
    is not installed."""
    name = cfg["kafka.library"]
    lib = LIBRARIES[name]
    if lib.extra is not None:
        try:
            importlib.import_module(lib.requires)
        except ImportError:
            raise MissingDependencyError(
                f"kafka.library is {name} but it is not installed ({lib.install})"
            ) from None
    return name


def adapter(cfg: Mapping[str, Any]) -> ClientAdapter:
    """The configured library's adapter; its module is imported on first use."""
    module, _, attribute = LIBRARIES[library(cfg)].adapter.partition(":")
    found: ClientAdapter = getattr(importlib.import_module(module), attribute)
    return found


def make_consumer(
    cfg: Mapping[str, Any],
    topics: list[str],
    *,
    on_assign: PartitionsCallback | None = None,
    on_revoke: PartitionsCallback | None = None,
) -> AgentConsumer:
    """The agent's consumer, subscribed to ``topics`` with the rebalance callbacks."""
    return adapter(cfg).consumer(cfg, topics, on_assign=on_assign, on_revoke=on_revoke)


def make_producer(cfg: Mapping[str, Any]) -> AgentProducer:
    """The agent's producer (acks=all, per-partition order kept)."""
    return adapter(cfg).producer(cfg)


def ensure_topics(cfg: Mapping[str, Any], topics: Iterable[str]) -> list[str]:
    """Check that ``topics`` exist; create the missing ones when the config says so.

    Returns the topics created. Raises :class:`ConfigError` naming the missing topics.
    """
    wanted = sorted(set(topics))
    client = adapter(cfg)
    where = cfg["kafka.bootstrap_servers"]
    missing = [t for t in wanted if t not in client.list_topics(cfg)]
    if not missing:
        return []
    if not cfg["kafka.create_topics"]:
        raise ConfigError(
            f"topics missing on {where}: {missing} (create them, or set kafka.create_topics: true)"
        )
    client.create_topics(cfg, missing, cfg["kafka.partitions"])
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
