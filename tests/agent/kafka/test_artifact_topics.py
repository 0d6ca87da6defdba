"""The agent requires and creates only the topics its artifact uses (issue 29, point 4)."""

from __future__ import annotations

import pytest
from kafka_helpers import make_admin

from boxwatch.agent.errors import ConfigError

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
# The example built three ways: both halves, model only, BN only.
WITHOUT = {"both": None, "model": "bn", "bn": "model"}


@pytest.fixture
def make_agent(agent_factory):
    """``make_agent(source, bootstrap="127.0.0.1:9", **settings)``: an agent on this file's
    topics (nothing listens on port 9: only tests that start a broker reach one)."""

    def make(source, bootstrap: str = "127.0.0.1:9", **settings):
        return agent_factory(
            source,
            topics=TOPICS,
            kafka__bootstrap_servers=bootstrap,
            metrics__address="127.0.0.1:0",
            **settings,
        )

    return make


@pytest.mark.parametrize(
    ("half", "inputs", "outputs"),
    [
        ("both", {"h.inputs", "h.credit"}, set(TOPICS.values()) - {"h.inputs", "h.credit"}),
        ("model", {"h.inputs"}, {"h.verdicts", "h.capture", "h.dlq"}),
        ("bn", {"h.credit"}, {"h.gate", "h.release", "h.review", "h.dlq"}),
    ],
)
def test_topics_follow_the_artifact(example_factory, make_agent, half, inputs, outputs):
    agent = make_agent(example_factory(without=WITHOUT[half]))
    assert set(agent.input_topics()) == inputs
    assert set(agent.output_topics()) == outputs


def test_bn_only_artifact_without_bn_topic_is_refused(example_factory, make_agent):
    agent = make_agent(example_factory(without="model"), topics__bn_inputs="")
    with pytest.raises(ConfigError, match="topics.bn_inputs is not set"):
        agent.check_topics()


@pytest.mark.integration
def test_model_only_agent_creates_no_gate_topic(example_factory, make_agent, make_broker):
    broker = make_broker("noida").start()
    agent = make_agent(
        example_factory(without="bn"), broker.bootstrap_servers, kafka__create_topics=True
    )
    agent.check_topics()
    admin = make_admin(broker.bootstrap_servers)
    try:
        made = {t for t in admin.list_topics() if t.startswith("h.")}
    finally:
        admin.close()
    assert made == {"h.inputs", "h.verdicts", "h.capture", "h.dlq"}
