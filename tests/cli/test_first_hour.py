"""The first hour with your own model (issue 29): same exit code for the same mistake in
every verb, late errors caught by ``--dry-run``, every problem of a round listed at once."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from boxwatch.cli import cli
from boxwatch.commands.console import EXIT_OK, EXIT_USAGE

pytestmark = pytest.mark.slow


def run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args], env={}, catch_exceptions=False)


def _cases(e):
    """(verb, arguments) with one missing file each: artifact, key or model."""
    gone = e.artifact.parent / "gone"
    bn_classifier = [gone / "n.net", "--class", "C", "--positive", "y", "--threshold", "0.5"]
    return {
        "verify-artifact/artifact": [
            "verify-artifact",
            gone / "a.bwa",
            "--public-key",
            e.public_key,
        ],
        "verify-artifact/key": ["verify-artifact", e.artifact, "--public-key", gone / "k.pub"],
        "inspect/artifact": ["inspect", gone / "a.bwa"],
        "inspect/key": ["inspect", e.artifact, "--public-key", gone / "k.pub"],
        "agent/artifact": [
            "agent",
            "--artifact",
            gone / "a.bwa",
            "--public-key",
            e.public_key,
            "--model",
            e.model,
        ],
        "agent/key": [
            "agent",
            "--artifact",
            e.artifact,
            "--public-key",
            gone / "k.pub",
            "--model",
            e.model,
        ],
        "agent/model": [
            "agent",
            "--artifact",
            e.artifact,
            "--public-key",
            e.public_key,
            "--model",
            gone / "m.onnx",
        ],
        "layers/model": ["layers", gone / "m.onnx"],
        "build-artifact/key": [
            "build-artifact",
            e.config,
            "--key",
            gone / "k.key",
            "--out",
            e.artifact.parent / "o.bwa",
        ],
        "build-artifact/config": [
            "build-artifact",
            gone / "b.yaml",
            "--key",
            e.private_key,
            "--out",
            e.artifact.parent / "o.bwa",
        ],
        "compile-bn/model": ["compile-bn", *bn_classifier],
        "verify-bn/model": ["verify-bn", *bn_classifier, "--rules", gone / "r.yaml"],
    }


CASES = [
    "verify-artifact/artifact",
    "verify-artifact/key",
    "inspect/artifact",
    "inspect/key",
    "agent/artifact",
    "agent/key",
    "agent/model",
    "layers/model",
    "build-artifact/key",
    "build-artifact/config",
    "compile-bn/model",
    "verify-bn/model",
]


@pytest.mark.parametrize("case", CASES)
def test_a_missing_file_is_exit_2_in_every_verb(model_example, case):
    result = run(*_cases(model_example)[case])
    assert result.exit_code == EXIT_USAGE, (case, result.output)
    assert "gone" in result.stderr and "Traceback" not in result.output


def test_build_model_file_missing_is_exit_2(model_example, tmp_path):
    raw = yaml.safe_load(model_example.config.read_text())
    raw["model"]["path"] = str(tmp_path / "gone.onnx")
    config = tmp_path / "b.yaml"
    config.write_text(yaml.safe_dump(raw))
    result = run("build-artifact", config, "--dry-run")
    assert result.exit_code == EXIT_USAGE and "gone.onnx: no such file" in result.stderr


def test_dry_run_catches_a_missing_out_folder(model_example, tmp_path):
    out = tmp_path / "no" / "such" / "a.bwa"
    result = run("build-artifact", model_example.config, "--dry-run", "--out", out)
    assert result.exit_code == EXIT_USAGE
    assert "folder" in result.stderr and str(out.parent) in result.stderr
    ok = run("build-artifact", model_example.config, "--dry-run", "--out", tmp_path / "a.bwa")
    assert ok.exit_code == EXIT_OK, ok.stderr


def test_one_round_lists_schema_key_and_out_problems(model_example, tmp_path):
    raw = yaml.safe_load(model_example.config.read_text())
    raw["bogus"] = 1
    config = tmp_path / "b.yaml"
    config.write_text(yaml.safe_dump(raw))
    result = run(
        "build-artifact", config, "--key", tmp_path / "gone.key", "--out", tmp_path / "x" / "a.bwa"
    )
    assert result.exit_code == EXIT_USAGE
    assert "3 problem(s)" in result.stderr, result.stderr
    for needle in ("unknown key", "gone.key", "folder"):
        assert needle in result.stderr, needle


def test_input_round_lists_data_key_and_out_problems(model_example, tmp_path):
    raw = yaml.safe_load(model_example.config.read_text())
    for key in raw["data"]:
        raw["data"][key]["path"] = str(model_example.data / f"{key}.npz")
    raw["data"]["train"]["path"] = str(tmp_path / "missing.npz")
    raw["layers"] = ["/no/such/layer"]
    config = tmp_path / "b.yaml"
    config.write_text(yaml.safe_dump(raw))
    result = run(
        "build-artifact",
        config,
        "--dry-run",
        "--key",
        tmp_path / "gone.key",
        "--out",
        tmp_path / "x" / "a.bwa",
    )
    assert result.exit_code == EXIT_USAGE
    for needle in ("missing.npz", "/no/such/layer", "gone.key", "folder"):
        assert needle in result.stderr, needle


def test_broker_down_at_start_says_so_in_at_most_three_lines(model_example):
    """Issue 29, point 5: no library log lines without -v; the retry window is named."""
    import subprocess
    import sys

    from boxwatch.embedded_broker import free_loopback_port

    port = free_loopback_port()
    proc = subprocess.run(
        [sys.executable, "-m", "boxwatch", "agent", "--artifact", str(model_example.artifact)]
        + ["--public-key", str(model_example.public_key), "--model", str(model_example.model)]
        + ["--bootstrap-servers", f"127.0.0.1:{port}", "--metrics-address", "127.0.0.1:0"],
        env={**__import__("os").environ, "BOXWATCH_KAFKA_STARTUP_TIMEOUT_S": "2"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert 1 <= len(lines) <= 3, proc.stderr
    assert "not reachable yet" in lines[0] and "2 s" in lines[0]
    assert lines[-1].startswith("error: cannot reach Kafka") and f":{port}" in lines[-1]
    assert not any(" kafka." in line for line in lines), "library log lines leaked"


def test_demo_counts_beyond_the_example_are_sent_in_turn_and_said():
    """Issue 29, point 9: ``demo --known N`` above the held-out digits is not capped silently."""
    import numpy as np

    from boxwatch.commands.demo import take_inputs

    x = np.arange(12.0).reshape(6, 2)
    rows, note = take_inputs(x, 4, "known digits")
    assert note is None and rows.tolist() == x[:4].tolist()
    rows, note = take_inputs(x, 14, "known digits (--known)")
    assert (
        len(rows) == 14 and rows[6:12].tolist() == x.tolist() and rows[13].tolist() == x[1].tolist()
    )
    assert note is not None and "14 known digits (--known)" in note and "holds 6" in note
