"""An argmax BN classifier through the build, the artifact, the report, inspect and the agent.

The network is constructed here (no shared data): a three-state class with four features.
The gate's outcome on every record is checked against the documented semantics read
directly (one record at a time), offline and on a live agent with a real broker.
"""

from __future__ import annotations

import json
import re
import threading

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from consumed import Record
from kafka_helpers import consume, create_topics

from boxwatch.agent.artifact import load_artifact, write_artifact
from boxwatch.agent.config import load_agent_config
from boxwatch.agent.errors import ConfigError
from boxwatch.agent.keys import generate_keypair, load_private_key, load_trusted_keys
from boxwatch.agent.members import VERIFICATION
from boxwatch.agent.service import build_agent
from boxwatch.cli import EXIT_OK, cli
from boxwatch.offline.bn.formats import write_bif
from boxwatch.offline.bn.network import Network
from boxwatch.offline.release.config import load_config
from boxwatch.offline.release.pipeline import build, prepare

STATES = {
    "Severity": ("mild", "moderate", "severe"),
    "Fever": ("none", "low", "high"),
    "Cough": ("no", "yes"),
    "Oxygen": ("normal", "low", "critical"),
    "Age": ("young", "adult", "old"),
}
RULES = {
    "class": "Severity",
    "states": {"Severity": ["mild", "moderate", "severe"]},
    "rules": [
        {"name": "critical_not_mild", "if": {"Oxygen": "critical"}, "then": {"not": "mild"}},
        {
            "name": "calm_is_mild",
            "if": {"Fever": "none", "Oxygen": "normal", "Cough": "no"},
            "then": "mild",
        },
        {"name": "high_fever", "if": {"Fever": "high"}, "then": ["moderate", "severe"]},
        {"name": "old_feverish", "if": {"Age": "old", "Fever": "high"}, "then": {"not": "mild"}},
    ],
    "monotonicity": [
        {"name": "oxygen_up", "feature": "Oxygen", "check": "increasing"},
        {"name": "age_fmo", "feature": "Age", "check": "fmo"},
    ],
}


def network() -> Network:
    """Severity -> Fever, Cough, Oxygen; Age -> Severity. Exact decimal CPTs."""
    return Network(
        name="triage",
        variables=("Age", "Severity", "Fever", "Cough", "Oxygen"),
        states=STATES,
        parents={
            "Age": (),
            "Severity": ("Age",),
            "Fever": ("Severity",),
            "Cough": ("Severity",),
            "Oxygen": ("Severity",),
        },
        cpts={
            "Age": np.array([0.3, 0.5, 0.2]),
            "Severity": np.array([[0.7, 0.2, 0.1], [0.5, 0.3, 0.2], [0.2, 0.4, 0.4]]),
            "Fever": np.array([[0.7, 0.2, 0.1], [0.3, 0.4, 0.3], [0.1, 0.3, 0.6]]),
            "Cough": np.array([[0.8, 0.2], [0.4, 0.6], [0.3, 0.7]]),
            "Oxygen": np.array([[0.9, 0.08, 0.02], [0.5, 0.4, 0.1], [0.1, 0.4, 0.5]]),
        },
    )


class Built:
    def __init__(self, base):
        base.mkdir(parents=True, exist_ok=True)
        (base / "triage.bif").write_text(write_bif(network()))
        (base / "rules.yaml").write_text(yaml.safe_dump(RULES, sort_keys=False))
        self.private, self.public = base / "k.key", base / "k.pub"
        generate_keypair(self.private, self.public, force=True)
        self.config = base / "build.yaml"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "version": 1,
                    "bn": {
                        "file": "triage.bif",
                        "class": "Severity",
                        "decision": "argmax",
                        "features": ["Age", "Fever", "Cough", "Oxygen"],
                        "rules": "rules.yaml",
                        "counterexamples": 3,
                    },
                },
                sort_keys=False,
            )
        )
        outcome = build(
            prepare(load_config(self.config)), load_private_key(self.private), created_at=0
        )
        self.summary = outcome.summary.to_dict()
        self.artifact = base / "triage.bwa"
        write_artifact(self.artifact, outcome.artifact)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return Built(tmp_path_factory.mktemp("argmax"))


def naive_gate(x, decision, rules, features, terminals):
    """The documented gate semantics, one record at a time."""
    blocked, certified = [], []
    for r in rules:
        inside = all(x[features.index(f)] in allowed for f, allowed in r["premise"].items())
        concluded = terminals[decision] in r["conclusion"]
        if inside and r["verdict"] == "holds" and concluded:
            certified.append(r["id"])
        if inside and r["verdict"] == "violated" and not concluded:
            blocked.append(r["id"])
    if blocked:
        return "blocked", blocked
    if certified:
        return "certified", certified
    return "unverified", []


def test_artifact_members_carry_the_argmax_classifier(built):
    art = load_artifact(built.artifact, load_trusted_keys([built.public]))
    meta = art.json("bn/diagram.json")
    assert meta["decision_kind"] == "argmax" and meta["positive"] is None
    assert meta["terminals"] == list(STATES["Severity"])
    rules = art.json("bn/rules.json")
    assert {r["id"]: r["conclusion"] for r in rules} == {
        "critical_not_mild": ["moderate", "severe"],
        "calm_is_mild": ["mild"],
        "high_fever": ["moderate", "severe"],
        "old_feverish": ["moderate", "severe"],
    }
    verdicts = {r["id"]: r["verdict"] for r in rules}
    assert set(verdicts.values()) == {"holds", "violated"}
    verification = art.json(VERIFICATION)
    assert verification["classifier"]["decision"] == "argmax"
    assert {m["query"]: m["verdict"] for m in verification["monotonicity"]}.keys() == {
        "oxygen_up",
        "age_fmo",
    }
    bn = built.summary["bn"]
    assert bn["decision"] == "argmax" and bn["positives"] is None
    assert sum(bn["decided"].values()) == bn["inputs"] == 3 * 3 * 2 * 3
    assert art.manifest["contents"]["bn"]["decision"] == "argmax"


def test_report_and_inspect_show_the_decision(built, tmp_path):
    out, report = tmp_path / "a.bwa", tmp_path / "report"
    result = CliRunner().invoke(
        cli,
        [
            "build-artifact",
            str(built.config),
            "--key",
            str(built.private),
            "--out",
            str(out),
            "--report",
            str(report),
            "--created-at",
            "0",
        ],
        catch_exceptions=False,
    )
    assert "argmax Severity" in result.stdout, result.stdout + result.stderr
    html = (report / "report.html").read_text()
    assert re.search(r'id="bn-decision"[^>]*>argmax<', html)
    assert "Inputs decided per state" in html and "Ties per pair of states" in html
    info = json.loads(CliRunner().invoke(cli, ["inspect", str(out), "--json"]).stdout)
    assert info["contents"]["bn"]["decision"] == "argmax"
    assert info["contents"]["bn"]["states"] == list(STATES["Severity"])
    assert result.exit_code == EXIT_OK


def agent_for(built, **extra):
    cfg = load_agent_config(
        None,
        environ={},
        overrides={
            "artifact": str(built.artifact),
            "public_keys": [str(built.public)],
            **extra,
        },
    )
    return build_agent(cfg)


def records(diagram, n, seed=0):
    rng = np.random.default_rng(seed)
    x = np.stack([rng.integers(0, len(s), n) for s in diagram.states], axis=1)
    values = [
        json.dumps(
            {
                "id": f"r{i}",
                "evidence": {f: diagram.states[j][x[i, j]] for j, f in enumerate(diagram.features)},
            }
        ).encode()
        for i in range(n)
    ]
    return x, values


def check_gate_records(built, gate, x):
    art = load_artifact(built.artifact, load_trusted_keys([built.public]))
    rules = art.json("bn/rules.json")
    meta = art.json("bn/diagram.json")
    features, terminals = meta["features"], meta["terminals"]
    # the decision by the network itself: the most probable state, ties to the lowest index
    net = network()
    seen = set()
    for i, row in enumerate(x):
        g = gate[f"r{i}"]
        ev = dict(zip(features, row, strict=True))
        joint = np.array(net.cpts["Age"][ev["Age"]] * net.cpts["Severity"][ev["Age"]])
        for f in ("Fever", "Cough", "Oxygen"):
            joint = joint * net.cpts[f][:, ev[f]]
        decision = int(np.argmax(joint >= joint.max() * (1 - 1e-12)))
        assert g["decision"] == terminals[decision]
        assert g["class_variable"] == "Severity"
        outcome, ids = naive_gate(list(row), decision, rules, features, terminals)
        assert (g["outcome"], g["rules"]) == (outcome, ids), (row, g)
        seen.add(outcome)
    assert seen == {"certified", "blocked", "unverified"}


def test_gate_records_offline_match_the_semantics(built):
    agent = agent_for(built, **{"topics.bn_inputs": "bn", "topics.gate": "g"})
    x, values = records(agent.runtime.diagram, 300)
    outs = agent.process([Record("bn", 0, i, v) for i, v in enumerate(values)])
    gate = {json.loads(o.value)["id"]: json.loads(o.value) for o in outs if o.topic == "g"}
    assert len(gate) == 300
    check_gate_records(built, gate, x)


@pytest.mark.integration
def test_gate_on_a_live_agent_with_a_real_broker(built, broker, kafka):
    topics = {
        "inputs": "a.in",
        "verdicts": "a.verdicts",
        "bn_inputs": "a.bn",
        "gate": "a.gate",
        "dead_letter": "a.dlq",
    }
    create_topics(broker.bootstrap_servers, {t: 2 for t in topics.values()})
    agent = agent_for(
        built,
        **{
            "kafka.bootstrap_servers": broker.bootstrap_servers,
            "kafka.group_id": "argmax-test",
            "metrics.address": "127.0.0.1:0",
            **{f"topics.{k}": v for k, v in topics.items()},
        },
    )
    agent.check_topics()
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        x, values = records(agent.runtime.diagram, 150, seed=1)
        producer = kafka.producer()
        for value in values:
            producer.send(topics["bn_inputs"], value)
        producer.flush()
        got = consume(kafka.consumer(topics["gate"]), len(values), timeout=60)
    finally:
        agent.stop()
        thread.join(timeout=15)
    assert not thread.is_alive()
    gate = {json.loads(r.value)["id"]: json.loads(r.value) for r in got}
    assert len(gate) == len(values)
    check_gate_records(built, gate, x)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"positive": "mild"}, "apply to decision: threshold only"),
        ({"decision": "threshold"}, "positive and threshold are required"),
        ({"decision": "vote"}, "vote"),
    ],
)
def test_bn_decision_config_errors_name_the_keys(built, tmp_path, change, message):
    raw = yaml.safe_load(built.config.read_text())
    raw["bn"].update(change)
    raw["bn"]["file"] = str(built.config.parent / "triage.bif")
    raw["bn"]["rules"] = str(built.config.parent / "rules.yaml")
    path = tmp_path / "build.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=message):
        prepare(load_config(path))
