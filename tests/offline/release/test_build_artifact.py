"""``boxwatch build-artifact`` end to end: outputs, every error class, policy, determinism."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from example_build import build_example

from boxwatch.agent.artifact import load_artifact
from boxwatch.agent.keys import generate_keypair, load_trusted_keys
from boxwatch.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return build_example(tmp_path_factory.mktemp("build"))


def run(*args: str, env=None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def build(config, key, out, *extra: str, env=None):
    """``build-artifact CONFIG --key KEY --out OUT [extra]``."""
    return run("build-artifact", str(config), "--key", str(key), "--out", str(out), *extra, env=env)


def edited(example, tmp_path, change) -> str:
    raw = yaml.safe_load(example.config.read_text())
    for key in raw["data"]:
        raw["data"][key]["path"] = str(example.data / f"{key}.npz")
    change(raw)
    path = tmp_path / "build.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def test_build_report_and_inspect(example, tmp_path):
    out, report = tmp_path / "a.bwa", tmp_path / "report"
    result = build(
        example.config,
        example.private_key,
        out,
        "--report",
        str(report),
        "--created-at",
        "1700000000",
    )
    assert result.exit_code == EXIT_OK, result.stderr
    art = load_artifact(out, load_trusted_keys([example.public_key]))
    summary = json.loads((report / "summary.json").read_text())
    assert summary["artifact"]["artifact_id"] == art.artifact_id
    assert art.artifact_id in result.stdout and "policy" in result.stdout
    assert "rule6" in result.stdout
    html = (report / "report.html").read_text()
    cal = summary["monitor"]["calibration"]["threshold"]
    m = re.search(r'id="calibration-threshold"[^>]*>([^<]+)<', html)
    assert m and float(m.group(1)) == pytest.approx(cal, rel=1e-3)
    assert summary["model"]["digest"] == art.manifest["model"]["digest"]
    # The default: tau without unknown inputs, the fused score, every unknown set reported.
    mon = summary["monitor"]
    assert mon["tau_selection"] == "held-out-class" and mon["score"] == "fused"
    assert [p["set"] for p in mon["operating_points"]] == [
        "unknown",
        "unknown_digits",
        "unknown_noise",
    ]
    assert mon["operating_points"][0]["acceptance"] == pytest.approx(
        mon["calibration"]["unknown_acceptance"]
    )
    spec = art.json("monitors/boxes.json")
    assert (
        spec["version"] == 9
        and spec["peak_factor"] == 1.5
        and spec["energy_scale"] > 0
        and spec["score"] == "fused"
        and spec["contrast_layers"]
    )
    # A relative Mahalanobis term on every monitored layer but the model's input.
    assert [t["layer"] for t in spec["mahalanobis"]] == [
        layer for layer in mon["layers"] if not layer.startswith("input")
    ] and len(spec["mahalanobis"]) == 2
    m = re.search(r'id="operating-point-2-acceptance"[^>]*>([^<]+)<', html)
    assert m and float(m.group(1)) == pytest.approx(
        mon["operating_points"][2]["acceptance"], abs=1e-3
    )
    info = json.loads(run("inspect", str(out), "--json").stdout)
    contents = info["contents"]
    assert contents["classes"] == [str(d) for d in range(8)]
    # The demo leaves `layers` out: auto monitors the input and the layers it chose.
    assert contents["layers"] == mon["layers"] and contents["layers"][0] == "input"
    assert len(mon["layers"]) == 3
    assert contents["bn"]["class"] == "CreditWorthiness"
    assert {r["id"]: r["verdict"] for r in contents["rules"]} == {
        r["id"]: r["verdict"] for r in summary["bn"]["rules"]
    }
    assert info["model"]["digest"] == summary["model"]["digest"]
    assert (
        info["config"]["values"]["metadata"]["model_version"] == "digits-mlp-1"
        if "config" in info
        else True
    )


def test_same_inputs_give_identical_bytes(example, tmp_path):
    outs = []
    for name in ("one.bwa", "two.bwa"):
        result = build(
            example.config,
            example.private_key,
            tmp_path / name,
            env={"SOURCE_DATE_EPOCH": "1234567890"},
        )
        assert result.exit_code == EXIT_OK, result.stderr
        outs.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1]
    assert load_artifact(outs[0], None).created_at == 1234567890


def test_policy_failure_exits_1_but_builds(example, tmp_path):
    config = edited(example, tmp_path, lambda r: r.update(policy={"fail_on": ["rule_violated"]}))
    out = tmp_path / "p.bwa"
    result = build(config, example.private_key, out)
    assert result.exit_code == EXIT_FAILED
    assert "FAIL: rule_violated: rule6" in result.stdout
    assert out.is_file()


def test_all_input_errors_listed_at_once(example, tmp_path):
    def break_everything(raw):
        raw["model"]["preprocessing"]["shape"] = [8, 9]
        raw["layers"] = ["/act1/Relu_output_0", "/no/such/layer"]
        raw["data"]["validation"]["path"] = str(tmp_path / "missing.npz")
        raw["bn"]["class"] = "NoSuchVariable"
        raw["bn"]["rules"] = str(tmp_path / "missing-rules.yaml")

    np.savez(tmp_path / "bad_labels.npz", x=np.zeros((5, 64), np.float32), y=np.arange(5) + 6)
    config = edited(example, tmp_path, break_everything)
    result = build(config, example.private_key, tmp_path / "x.bwa")
    assert result.exit_code == EXIT_USAGE
    text = result.stderr
    for needle in ("missing.npz", "/no/such/layer", "NoSuchVariable"):
        assert needle in text, needle
    assert "Traceback" not in text
    assert not (tmp_path / "x.bwa").exists()

    config = edited(
        example,
        tmp_path,
        lambda r: r["data"].update(train={"path": str(tmp_path / "bad_labels.npz")}),
    )
    result = run("build-artifact", config, "--dry-run")
    assert result.exit_code == EXIT_USAGE and "outside the 8 classes" in result.stderr

    config = edited(example, tmp_path, lambda r: r["model"]["preprocessing"].update(shape=[65]))
    result = run("build-artifact", config, "--dry-run")
    assert result.exit_code == EXIT_USAGE and "needs 65" in result.stderr


def test_schema_errors_and_missing_key(example, tmp_path):
    config = edited(example, tmp_path, lambda r: r.update(bogus=1, monitor={"tau": 7}))
    result = run("build-artifact", config, "--dry-run")
    assert result.exit_code == EXIT_USAGE
    assert "unknown key" in result.stderr and "monitor.tau" in result.stderr
    ok = run("build-artifact", str(example.config), "--dry-run")
    assert ok.exit_code == EXIT_OK and "valid" in ok.stderr
    nokey = run("build-artifact", str(example.config), "--out", str(tmp_path / "k.bwa"), env={})
    assert nokey.exit_code == EXIT_USAGE and "no signing key" in nokey.stderr
    pub_as_key = build(example.config, example.public_key, tmp_path / "k.bwa")
    assert pub_as_key.exit_code == EXIT_USAGE and "private key" in pub_as_key.stderr


def test_key_from_environment(example, tmp_path):
    priv, pub = tmp_path / "env.key", tmp_path / "env.pub"
    generate_keypair(priv, pub)
    out = tmp_path / "e.bwa"
    result = run(
        "build-artifact",
        str(example.config),
        "--out",
        str(out),
        env={"BOXWATCH_SIGNING_KEY_FILE": str(priv)},
    )
    assert result.exit_code == EXIT_OK, result.stderr
    load_artifact(out, load_trusted_keys([pub]))
    assert priv.read_text().splitlines()[1] not in result.output
