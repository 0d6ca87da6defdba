"""One exit-code authority (``boxwatch.cli``): internal errors, missing files, no other exits."""

from __future__ import annotations

import ast
import importlib

import pytest
from click.testing import CliRunner
from locations import ROOT

from boxwatch.agent import artifact as art
from boxwatch.agent.errors import MissingDependencyError
from boxwatch.agent.keys import generate_keypair, load_private_key
from boxwatch.cli import EXIT_INTERNAL, EXIT_MISSING_EXTRA, EXIT_USAGE, LAZY_COMMANDS, cli, outcome
from boxwatch.commands.console import EXIT_CODES
from boxwatch.examples import example_path


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture()
def keys(tmp_path):
    priv, pub = tmp_path / "k.key", tmp_path / "k.pub"
    generate_keypair(priv, pub)
    return priv, pub


@pytest.fixture()
def model_artifact(tmp_path, keys):
    """A signed artifact that monitors a model (so the agent asks for the model file)."""
    path = tmp_path / "m.bwa"
    data = art.build_artifact_bytes(
        {"model/spec.json": {"classes": ["0", "1"]}},
        private_key=load_private_key(keys[0]),
        created_at=0,
        model={
            "digest": "sha256:" + "ab" * 32,
            "files": [{"name": "model.onnx", "sha256": "ab" * 32, "size": 3}],
        },
        contents={"classes": ["0", "1"]},
    )
    art.write_artifact(path, data)
    return path


# verb -> (module and attribute each run of the verb calls, arguments that reach it)
VERBS = {
    "keygen": ("boxwatch.agent.keys", "generate_keypair", ["--private", "a", "--public", "b"]),
    "verify-artifact": (
        "boxwatch.agent.keys",
        "load_trusted_keys",
        ["x.bwa", "--public-key", "k.pub"],
    ),
    "inspect": ("boxwatch.agent.artifact", "load_artifact", ["x.bwa"]),
    "layers": ("boxwatch.commands.layers", "open_tap", ["model.onnx"]),
    "compile-bn": (
        "boxwatch.commands.compile_bn",
        "load_network",
        ["n.bif", "--class", "C", "--positive", "p", "--threshold", "0.5"],
    ),
    "verify-bn": (
        "boxwatch.commands.verify_bn",
        "load_network",
        ["n.bif", "--class", "C", "--positive", "p", "--threshold", "0.5", "--rules", "r.yaml"],
    ),
    "repair-bn": (
        "boxwatch.commands.repair_bn",
        "load_network",
        ["n.bif", "--class", "C", "--positive", "p", "--threshold", "0.5", "--rules", "r.yaml"],
    ),
    "build-artifact": ("boxwatch.commands.build", "load_config", ["build.yaml"]),
    "agent": ("boxwatch.commands.agent", "load_agent_config", ["--artifact", "x.bwa"]),
    "demo": ("boxwatch.commands.demo", "build_example", ["--workdir", "demo"]),
    "export-captures": (
        "boxwatch.commands.export_captures",
        "export_topic",
        ["--brokers", "127.0.0.1:1", "--topic", "captures", "--out", "exported"],
    ),
    "capture-report": (
        "boxwatch.commands.capture_report",
        "load_runtime",
        ["x.bwa", "--model", "m.onnx", "--public-key", "k.pub", "--captures-topic", "c"]
        + ["--brokers", "127.0.0.1:1", "--out", "report"],
    ),
    "refit": (
        "boxwatch.commands.refit",
        "load_config",
        ["x.bwa", "--config", "b.yaml", "--public-key", "k.pub", "--key", "k.key"]
        + ["--captures-topic", "c", "--labels-topic", "l", "--brokers", "127.0.0.1:1"]
        + ["--out", "child.bwa"],
    ),
}


def test_every_verb_is_covered():
    assert set(VERBS) == set(cli.list_commands(None))  # type: ignore[arg-type]  # click ignores ctx here


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_an_unexpected_exception_is_an_internal_error(verb, monkeypatch, tmp_path):
    module, attr, args = VERBS[verb]

    def boom(*_a, **_k):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(importlib.import_module(module), attr, boom)
    monkeypatch.chdir(tmp_path)
    result = run(verb, *args)
    assert result.exit_code == EXIT_INTERNAL, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == "error: RuntimeError: boom second line -- internal error, please report"
    assert "Traceback" not in result.output


def test_a_missing_optional_dependency_exits_3():
    error = MissingDependencyError("kafka.library is x but it is not installed")
    assert outcome(error) == (EXIT_MISSING_EXTRA, (f"error: {error}",))


def test_the_internal_error_code_is_documented():
    assert EXIT_INTERNAL not in (1, 2) and EXIT_INTERNAL in EXIT_CODES
    assert f"{EXIT_INTERNAL} internal error" in " ".join(run("--help").output.split())
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"`{EXIT_INTERNAL}` internal error" in readme


def report_args(key: object, model: object) -> list[str]:
    """capture-report's options past the artifact: ``key``, ``model``, a topic, a folder."""
    return ["--model", str(model), "--public-key", str(key), "--captures-topic", "c"] + [
        "--brokers",
        "127.0.0.1:1",
        "--out",
        "report",
    ]


def test_missing_artifact_key_and_model_files_exit_2_in_every_verb(tmp_path, keys, model_artifact):
    priv, pub = keys
    gone = str(tmp_path / "missing")
    model = example_path("digits", "model.onnx")
    kafka = ["--bootstrap-servers", "127.0.0.1:1"]
    cases = {
        "verify-artifact, artifact": ["verify-artifact", gone, "--public-key", str(pub)],
        "verify-artifact, key": ["verify-artifact", str(model_artifact), "--public-key", gone],
        "inspect, artifact": ["inspect", gone],
        "inspect, key": ["inspect", str(model_artifact), "--public-key", gone],
        "agent, artifact": ["agent", "--artifact", gone, "--public-key", str(pub), *kafka],
        "agent, key": ["agent", "--artifact", str(model_artifact), "--public-key", gone, *kafka],
        "agent, model": [
            "agent",
            "--artifact",
            str(model_artifact),
            "--public-key",
            str(pub),
            "--model",
            gone,
            *kafka,
        ],
        "layers, model": ["layers", gone],
        "capture-report, artifact": ["capture-report", gone, *report_args(pub, model)],
        "capture-report, key": ["capture-report", str(model_artifact), *report_args(gone, model)],
        "capture-report, model": ["capture-report", str(model_artifact), *report_args(pub, gone)],
    }
    codes = {name: run(*args) for name, args in cases.items()}
    assert {name: r.exit_code for name, r in codes.items()} == dict.fromkeys(cases, EXIT_USAGE)
    for name, r in codes.items():
        assert "missing" in r.stderr and "Traceback" not in r.output, name


@pytest.mark.slow
def test_missing_key_and_model_files_in_build_artifact(tmp_path, keys):
    import yaml

    from boxwatch.commands.demo import write_build_config

    config = write_build_config(tmp_path / "ex")
    gone = str(tmp_path / "missing")
    nokey = run("build-artifact", str(config), "--key", gone, "--out", str(tmp_path / "a.bwa"))
    assert nokey.exit_code == EXIT_USAGE and "key file not found" in nokey.stderr
    raw = yaml.safe_load(config.read_text())
    raw["model"]["path"] = gone
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    nomodel = run("build-artifact", str(config), "--dry-run")
    assert nomodel.exit_code == EXIT_USAGE and "no such file" in nomodel.stderr


def test_no_exit_outside_the_cli():
    """Verbs and libraries raise; only click, driven by ``boxwatch.cli``, ends the process."""
    offenders = []
    for folder in ("agent", "offline", "boxwatch", "examples"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr == "exit":
                    if isinstance(node.value, ast.Name) and node.value.id == "sys":
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                if isinstance(node, ast.Name) and node.id == "SystemExit":
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_lazy_verbs_are_listed():
    assert set(LAZY_COMMANDS) <= set(VERBS)
