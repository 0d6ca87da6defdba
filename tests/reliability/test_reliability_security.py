"""Security basics: no pickle on the agent's path, loopback metrics by default, private keys
never written to logs (keygen, build-artifact and agent run with debug logging).
"""

from __future__ import annotations

import ast
import base64
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from kafka_helpers import create_topics
from reliability_helpers import PYTHON, ROOT, AgentProcess, OutputCollector, StreamProducer

from boxwatch.agent.config import load_agent_config
from boxwatch.agent.keys import load_private_key
from boxwatch.examples import example_path

# Modules that decode untrusted bytes or serialise objects as code.
UNSAFE_MODULES = {
    "pickle",
    "_pickle",
    "cPickle",
    "dill",
    "cloudpickle",
    "joblib",
    "shelve",
    "marshal",
    "jsonpickle",
}
AGENT_PATH = [
    *sorted((ROOT / "agent").glob("*.py")),
    ROOT / "boxwatch" / "cli.py",
    ROOT / "boxwatch" / "__main__.py",
]
DEBUG = (
    "import logging, sys; logging.basicConfig(level=logging.DEBUG); "
    "from boxwatch.cli import main; sys.exit(main())"
)


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, ast.unparse(node.func)


def unsafe_patterns(source: str, name: str) -> list[str]:
    """Pickle-like imports, allow_pickle other than False, np.load without
    allow_pickle=False, and torch.load (TorchScript goes through torch.jit.load)."""
    tree = ast.parse(source, filename=name)
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        found += [
            f"{name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in UNSAFE_MODULES
        ]
    for call, func in _calls(tree):
        kw = {k.arg: k.value for k in call.keywords}
        if "allow_pickle" in kw and not (
            isinstance(kw["allow_pickle"], ast.Constant) and kw["allow_pickle"].value is False
        ):
            found.append(f"{name}:{call.lineno} {func}(allow_pickle=...)")
        elif (
            func.split(".")[0] in ("np", "numpy")
            and func.endswith(".load")
            and ("allow_pickle" not in kw)
        ):
            found.append(f"{name}:{call.lineno} {func} without allow_pickle=False")
        if func == "torch.load":
            found.append(f"{name}:{call.lineno} torch.load")
    return found


def test_nothing_on_the_agent_path_unpickles():
    offenders = [hit for path in AGENT_PATH for hit in unsafe_patterns(path.read_text(), path.name)]
    assert offenders == []


def test_the_checker_sees_each_unsafe_pattern():
    """The check above can fail: it flags every pattern it looks for."""
    bad = (
        "import pickle\nfrom joblib import load\nimport numpy as np\nimport torch\n"
        "np.load(f)\nnp.load(f, allow_pickle=True)\ntorch.load(f)\n"
        "np.load(f, allow_pickle=False)\n"
    )
    hits = unsafe_patterns(bad, "bad.py")
    assert [h.split(" ", 1)[0] for h in hits] == [
        "bad.py:1",
        "bad.py:2",
        "bad.py:5",
        "bad.py:6",
        "bad.py:7",
    ], hits


def test_metrics_bind_loopback_by_default():
    cfg = load_agent_config(None, environ={}, overrides={"artifact": "a", "public_keys": ["k"]})
    assert cfg["metrics.address"].startswith("127.0.0.1:")
    env = load_agent_config(
        None,
        environ={"BOXWATCH_METRICS_ADDRESS": "0.0.0.0:9108"},
        overrides={"artifact": "a", "public_keys": ["k"]},
    )
    assert env["metrics.address"] == "0.0.0.0:9108"


def _secrets(private_path: Path) -> list[str]:
    """Forms in which the private key could leak: PEM lines, raw bytes as hex and base64."""
    pem = private_path.read_text()
    body = [ln for ln in pem.splitlines() if ln and not ln.startswith("-----")]
    raw = load_private_key(private_path).private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return [
        *body,
        "".join(body),
        raw.hex(),
        base64.b64encode(raw).decode(),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
    ]


def _run_debug(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-c", DEBUG, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.mark.slow
@pytest.mark.integration
def test_private_keys_never_reach_logs(make_broker, tmp_path):
    """keygen, build-artifact and agent at debug level (and common key mix-ups): no secret."""
    key, pub = tmp_path / "ci.key", tmp_path / "ci.pub"
    outputs = []
    r = _run_debug("keygen", "--private", str(key), "--public", str(pub), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    outputs.append(r.stdout + r.stderr)
    credit = example_path("credit", "credit.net").parent
    build = tmp_path / "bn.yaml"
    build.write_text(
        json.dumps(
            {
                "version": 1,
                "metadata": {"name": "bn only", "model_version": "bn-1"},
                "bn": {
                    "file": str(credit / "credit.net"),
                    "class": "CreditWorthiness",
                    "positive": "Positive",
                    "threshold": 0.5,
                    "rules": str(credit / "rules.yaml"),
                },
                "policy": {"fail_on": []},
            }
        )
    )
    artifact = tmp_path / "bn.bwa"
    r = _run_debug(
        "build-artifact", str(build), "--key", str(key), "--out", str(artifact), cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    outputs.append(r.stdout + r.stderr)
    # Mix-ups that read the private key file where something else is expected.
    for args in (
        ["verify-artifact", str(artifact), "--public-key", str(key)],
        ["verify-artifact", str(key), "--public-key", str(pub)],
        ["inspect", str(key)],
        [
            "agent",
            "--artifact",
            str(artifact),
            "--public-key",
            str(key),
            "--bootstrap-servers",
            "127.0.0.1:1",
        ],
        [
            "agent",
            "--artifact",
            str(key),
            "--public-key",
            str(pub),
            "--bootstrap-servers",
            "127.0.0.1:1",
        ],
    ):
        r = _run_debug(*args, cwd=tmp_path)
        assert r.returncode != 0 and "Traceback" not in r.stderr, (args, r.stderr)
        outputs.append(r.stdout + r.stderr)

    broker = make_broker("tansu").start()
    topics = {
        "bn_inputs": "s.credit",
        "gate": "s.gate",
        "dead_letter": "s.dlq",
        "verdicts": "s.verdicts",
        "inputs": "",
    }
    create_topics(broker.bootstrap_servers, {t: 1 for t in topics.values() if t})
    cfg = tmp_path / "agent.yaml"
    from boxwatch.embedded_broker import free_loopback_port

    cfg.write_text(
        json.dumps(
            {
                "artifact": str(artifact),
                "public_keys": [str(pub)],
                "kafka": {"bootstrap_servers": broker.bootstrap_servers, "group_id": "sec"},
                "topics": topics,
                "metrics": {"address": f"127.0.0.1:{free_loopback_port()}"},
            }
        )
    )
    agent = AgentProcess(cfg, tmp_path / "agent.log", verbose=True)
    collector = OutputCollector(broker.bootstrap_servers, [topics["gate"], topics["dead_letter"]])
    try:
        collector.start()
        agent.start().wait_ready()
        recs = [
            (b"k", b'{"id": "x", "evidence": {}}', []),
            (b"k", key.read_bytes(), []),
        ]  # a private key sent as a record: a dead letter
        p = StreamProducer(broker.bootstrap_servers, topics["bn_inputs"], recs)
        p.start()
        p.join(30)
        assert collector.wait_for(lambda c: c.count >= 2, timeout=60)
        agent.signal(signal.SIGINT)
        deadline = time.monotonic() + 20
        while agent.alive and time.monotonic() < deadline:
            time.sleep(0.2)
        assert agent.stop() == 0
    finally:
        agent.kill()
        collector.stop()
    outputs.append(agent.log_text())
    # -v logs kafka-python at INFO (WARNING otherwise) and everything else at DEBUG.
    assert "INFO kafka." in agent.log_text(), "the agent did not run with -v"
    assert "dead letter" in agent.log_text()
    leaks = [(i, s[:12]) for i, text in enumerate(outputs) for s in _secrets(key) if s in text]
    assert leaks == [], f"private key material in logs/outputs: {leaks}"
