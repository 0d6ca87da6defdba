"""``model.device`` (issue 40): ``cpu`` is the default and changes nothing; ``cuda`` where the
installed onnxruntime or torch cannot run CUDA stops at ``--dry-run`` with one line saying
what to install (exit 2), for ONNX and ``.pt2`` models alike."""

from __future__ import annotations

import zipfile
from pathlib import Path

import onnxruntime as ort
import pytest
import yaml
from click.testing import CliRunner
from torch_models import build_config

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.taps import CUDA_PROVIDER, open_tap, parse_device
from boxwatch.cli import cli
from boxwatch.commands.console import EXIT_OK, EXIT_USAGE

pytestmark = pytest.mark.slow

ORT_HAS_CUDA = CUDA_PROVIDER in ort.get_available_providers()


def _torch_has_cuda() -> bool:
    torch = pytest.importorskip("torch")
    return bool(torch.cuda.is_available())


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args], env={}, catch_exceptions=False)


def with_model(example, tmp_path: Path, name: str, **model_keys: object) -> Path:
    """The example's config with ``model_keys`` added to its model section."""
    raw = yaml.safe_load(example.config.read_text())
    for spec in raw["data"].values():
        spec["path"] = str(example.config.parent / spec["path"])
    raw["model"]["path"] = str((example.config.parent / raw["model"]["path"]).resolve())
    raw["model"].update(model_keys)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def one_error(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == EXIT_USAGE and len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.skipif(ORT_HAS_CUDA, reason="this onnxruntime has the CUDA provider")
def test_cuda_without_onnxruntime_gpu_is_one_line(model_example, tmp_path):
    config = with_model(model_example, tmp_path, "cuda", device="cuda")
    line = one_error(run("build-artifact", config, "--dry-run"))
    assert "model.device: cuda, but this onnxruntime" in line
    assert "install onnxruntime-gpu in place of onnxruntime" in line


def test_cuda_without_a_torch_cuda_build_is_one_line(resnet_saved):
    if _torch_has_cuda():
        pytest.skip("torch sees a CUDA device here")
    assert resnet_saved.pt2 is not None
    config = build_config(
        resnet_saved, "cuda_pt2", model=resnet_saved.pt2, model_keys={"device": "cuda:0"}
    )
    line = one_error(run("build-artifact", config, "--dry-run"))
    assert "model.device: cuda:0, but torch" in line and "sees no CUDA device" in line
    assert "install a CUDA build of torch" in line


def test_a_device_that_is_not_one_is_refused_by_the_schema(model_example, tmp_path):
    config = with_model(model_example, tmp_path, "gpu", device="gpu")
    line = one_error(run("build-artifact", config, "--dry-run"))
    assert "model.device: 'gpu' is not a device (cpu, cuda or cuda:N)" in line


def test_cpu_is_the_default_and_builds_the_same_monitors(model_example, tmp_path):
    out = {}
    for name, keys in (("default", {}), ("cpu", {"device": "cpu"})):
        config = with_model(model_example, tmp_path, name, **keys)
        artifact = tmp_path / f"{name}.bwa"
        result = run(
            "build-artifact",
            config,
            "--key",
            model_example.private_key,
            "--out",
            artifact,
            "--created-at",
            "1",
            "--quiet",
        )
        assert result.exit_code == EXIT_OK, result.stderr
        with zipfile.ZipFile(artifact) as z:
            out[name] = {n: z.read(n) for n in z.namelist() if not n.startswith("manifest")}
    assert out["default"] == out["cpu"] and any(n.startswith("monitors/") for n in out["cpu"])


def test_taps_parse_and_check_the_device(model_example):
    assert parse_device("cpu") == ("cpu", 0)
    assert parse_device("cuda") == ("cuda", 0)
    assert parse_device("cuda:3") == ("cuda", 3)
    with pytest.raises(ConfigError, match="not a device"):
        parse_device("cuda:x")
    assert open_tap(model_example.model, device="cpu").device == "cpu"
    if not ORT_HAS_CUDA:
        with pytest.raises(ConfigError, match="onnxruntime-gpu"):
            open_tap(model_example.model, device="cuda:1")
