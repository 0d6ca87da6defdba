"""The agent requires and creates only the topics its artifact uses (issue 29, point 4)."""

from __future__ import annotations

import pytest
from example_build import build_example
from kafka_helpers import make_admin

from boxwatch.agent.config import load_agent_config
from boxwatch.agent.errors import ConfigError
from boxwatch.agent.service import build_agent

TOPICS = {
    "inputs": "h.inputs",
    "bn_inputs": "h.credit",
    "verdicts": "h.verdicts",
    "gate": "h.gate",
    "dead_letter": "h.dlq",
    "capture": "h.capture",
    "release": "h.release",
    "review": "h.review",
}


@pytest.fixture(scope="module")
def halves(tmp_path_factory):
    """The example built three ways: both halves, model only, BN only."""
    root = tmp_path_factory.mktemp("halves")
    return {
        "both": build_example(root / "both"),
        "model": build_example(root / "model", without="bn"),
        "bn": build_example(root / "bn", without="model"),
    }


def make_agent(example, bootstrap: str = "127.0.0.1:9", **extra):
    cfg = load_agent_config(
        None,
        environ={},
        overrides={
            "artifact": str(example.artifact),
            "public_keys": [str(example.public_key)],
            "model": str(example.model),
            "kafka.bootstrap_servers": bootstrap,
            "metrics.address": "127.0.0.1:0",
            **{f"topics.{k}": v for k, v in TOPICS.items()},
            **extra,
        },
    )
    return build_agent(cfg)


@pytest.mark.parametrize(
    ("half", "inputs", "outputs"),
    [
        ("both", {"h.inputs", "h.credit"}, set(TOPICS.values()) - {"h.inputs", "h.credit"}),
        ("model", {"h.inputs"}, {"h.verdicts", "h.capture", "h.dlq"}),
        ("bn", {"h.credit"}, {"h.gate", "h.release", "h.review", "h.dlq"}),
    ],
)
def test_topics_follow_the_artifact(halves, half, inputs, outputs):
    agent = make_agent(halves[half])
    assert set(agent.input_topics()) == inputs
    assert set(agent.output_topics()) == outputs


def test_bn_only_artifact_without_bn_topic_is_refused(halves):
    agent = make_agent(halves["bn"], **{"topics.bn_inputs": ""})
    with pytest.raises(ConfigError, match="topics.bn_inputs is not set"):
        agent.check_topics()


@pytest.mark.integration
def test_model_only_agent_creates_no_gate_topic(halves, make_broker):
    broker = make_broker("noida").start()
    agent = make_agent(halves["model"], broker.bootstrap_servers, **{"kafka.create_topics": True})
    agent.check_topics()
    admin = make_admin(broker.bootstrap_servers)
    try:
        made = {t for t in admin.list_topics() if t.startswith("h.")}
    finally:
        admin.close()
    assert made == {"h.inputs", "h.verdicts", "h.capture", "h.dlq"}
