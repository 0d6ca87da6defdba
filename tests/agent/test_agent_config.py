"""Agent settings: precedence, range checks, all problems at once, reference kept true."""

from __future__ import annotations

from pathlib import Path

import pytest
from locations import ROOT

from boxwatch.agent.config import SETTINGS, load_agent_config, reference_markdown
from boxwatch.agent.errors import ConfigError


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    return path


def test_precedence_argument_env_file_default(tmp_path):
    path = write(
        tmp_path,
        "artifact: a.bwa\npublic_keys: [k.pub]\nbatch:\n  max_records: 64\n"
        "kafka:\n  group_id: from-file\n",
    )
    cfg = load_agent_config(path, environ={"BOXWATCH_GROUP_ID": "from-env"})
    assert (
        cfg["kafka.group_id"] == "from-env" and cfg.source["kafka.group_id"] == "$BOXWATCH_GROUP_ID"
    )
    assert cfg["batch.max_records"] == 64
    assert cfg["batch.max_wait_ms"] == 20 and cfg.source["batch.max_wait_ms"] == "default"
    cfg = load_agent_config(
        path, environ={"BOXWATCH_GROUP_ID": "from-env"}, overrides={"kafka.group_id": "from-arg"}
    )
    assert cfg["kafka.group_id"] == "from-arg"
    assert cfg["metrics.address"].startswith("127.0.0.1:"), "safe default bind address"


def test_env_only(tmp_path):
    cfg = load_agent_config(
        None,
        environ={
            "BOXWATCH_ARTIFACT": "x.bwa",
            "BOXWATCH_PUBLIC_KEYS": "a.pub,b.pub",
            "BOXWATCH_CREATE_TOPICS": "yes",
            "BOXWATCH_KAFKA_CLIENT": "{security_protocol: SSL}",
        },
    )
    assert cfg["public_keys"] == ["a.pub", "b.pub"] and cfg["kafka.create_topics"] is True
    assert cfg["kafka.client"] == {"security_protocol": "SSL"}


def test_all_problems_reported_at_once(tmp_path):
    path = write(
        tmp_path,
        "artifact: a.bwa\npublic_keys: [k.pub]\nbatch:\n  max_records: 0\n"
        "  max_wait_ms: soon\nmetrics:\n  address: nowhere\nbogus: 1\n"
        "gate_policy: {certified: publish}\n",
    )
    with pytest.raises(ConfigError) as info:
        load_agent_config(path, environ={})
    text = str(info.value)
    for needle in (
        "unknown setting 'bogus'",
        "batch.max_records",
        "batch.max_wait_ms",
        "metrics.address",
        "gate_policy",
    ):
        assert needle in text
    assert len(info.value.problems) == 5


def test_required_and_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="artifact is required"):
        load_agent_config(None, environ={})
    with pytest.raises(ConfigError, match="no such agent config file"):
        load_agent_config(tmp_path / "none.yaml", environ={})
    with pytest.raises(ConfigError, match=r"agent.yaml:2:.*invalid YAML"):
        load_agent_config(write(tmp_path, "artifact: a\n  - : [\n"), environ={})


def test_reference_doc_is_current():
    doc = (ROOT / "docs" / "agent-config.md").read_text()
    assert reference_markdown() in doc, "regenerate docs/agent-config.md from reference_markdown()"
    assert len(SETTINGS) == reference_markdown().count("\n| `")


def test_relative_paths_in_the_file_resolve_against_the_file(tmp_path, monkeypatch):
    """Issue 29: as in the build config; from the environment or a flag, against the cwd."""
    conf = tmp_path / "conf"
    conf.mkdir()
    path = write(
        conf, "artifact: a.bwa\npublic_keys: [keys/k.pub, /abs/k2.pub]\nmodel: ../m.onnx\n"
    )
    monkeypatch.chdir(tmp_path)
    cfg = load_agent_config(path, environ={})
    assert cfg["artifact"] == str(conf / "a.bwa")
    assert cfg["public_keys"] == [str(conf / "keys" / "k.pub"), "/abs/k2.pub"]
    assert cfg["model"] == str(conf / ".." / "m.onnx")
    cfg = load_agent_config(
        path, environ={"BOXWATCH_ARTIFACT": "env.bwa"}, overrides={"model": "arg.onnx"}
    )
    assert cfg["artifact"] == "env.bwa" and cfg["model"] == "arg.onnx"
