"""The model's input as the build monitors it (issue 39): its kind from its shape or
``model.input_kind``, pooled by kind or by the config's per-layer pooling (under ``layers:
auto`` too), kept beside an explicit layer list unless ``model.monitor_input: false``, and
the ``input_not_monitored`` warning."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from torch_models import build_config

from boxwatch.agent.artifact import write_artifact
from boxwatch.agent.boxes import ACCEPT
from boxwatch.agent.errors import ConfigError
from boxwatch.agent.keys import generate_keypair, load_private_key
from boxwatch.agent.runtime import load_runtime
from boxwatch.agent.taps import infer_input_kind
from boxwatch.offline.release import emitted, layer_choice
from boxwatch.offline.release.config import load_config
from boxwatch.offline.release.pipeline import build, choose_layers, prepare, prepare_model

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("keys")
    generate_keypair(folder / "k.key", folder / "k.pub", force=True)
    return folder / "k.key", folder / "k.pub"


def built(config: Path, keys: tuple[Path, Path]) -> tuple[dict, Path]:
    """The summary of ``config``'s build and the artifact it wrote beside the config."""
    outcome = build(prepare(load_config(config)), load_private_key(keys[0]), created_at=1)
    artifact = config.with_suffix(".bwa")
    write_artifact(artifact, outcome.artifact)
    return outcome.summary.to_dict(), artifact


def input_row(summary: dict) -> dict:
    return next(
        c for c in summary["monitor"]["layer_choice"]["candidates"] if c["layer"] == "input"
    )


def test_the_kind_follows_the_shape_and_sets_the_pooling():
    assert infer_input_kind((None, 3, 32, 32)) == "image"
    assert infer_input_kind((None, 1, 40)) == "signal"
    assert infer_input_kind((None, 64)) == "vector"
    plan = layer_choice.input_plan
    assert (plan((None, 1, 28, 28)).pooling, plan((None, 1, 28, 28)).features) == ("grid", 49)
    # An image pooled by its kind is watched on the coarse grid too; nothing else is.
    assert plan((None, 1, 28, 28)).coarse == 25 and plan((None, 3, 32, 32)).coarse == 75
    assert plan((None, 1, 40)).coarse == 0 and plan((None, 64)).coarse == 0
    assert plan((None, 1, 28, 28), pooling={"input": "grid"}).coarse == 0
    assert plan((None, 1, 5, 5)).coarse == 0  # no coarser than the grid itself
    assert plan((None, 1, 28, 28), monitor=False).coarse == 0
    assert (plan((None, 1, 40)).pooling, plan((None, 1, 40)).features) == ("flatten", 40)
    # A signal past the feature cap: a coarse grid along its length (7 cells per channel).
    long = plan((None, 4, 1000))
    assert (long.kind, long.pooling, long.features, long.monitored) == ("signal", "grid", 28, True)
    # The config's kind, then its per-layer pooling, win over the shape's.
    assert plan((None, 1, 40), kind="vector").pooling == "flatten"
    assert plan((None, 1, 28, 28), pooling={"input": "flatten"}).features == 784
    assert not plan((None, 1, 40), monitor=False).monitored
    with pytest.raises(ConfigError, match="input_kind: image needs an input of shape"):
        plan((None, 1, 40), kind="image")


def test_a_signal_is_monitored_whole_and_runs_through_the_agent(signal_saved, keys):
    """Issue 39's 1-D model: all 40 values of a [1, 40] signal, not 7 grid cells."""
    summary, artifact = built(build_config(signal_saved, "auto"), keys)
    assert summary["model"]["input_kind"] == "signal" and "input" in summary["model"]["layers"]
    row = input_row(summary)
    assert (row["pooling"], row["features"], row["chosen"]) == ("flatten", 40, True)
    assert "signal input" in row["reason"]
    runtime = load_runtime(artifact, [str(keys[1])], model_path=signal_saved.onnx)
    x = np.load(signal_saved.folder / "validation.npz")["x"]
    result = runtime.run_model(x)
    assert result.layer_verdicts["input"].shape == (len(x),)
    assert np.mean(result.verdicts == ACCEPT) > 0.8


def test_the_configs_input_pooling_is_honoured_under_auto(signal_saved):
    config = build_config(signal_saved, "pooled", model_keys={"pooling": {"input": "grid"}})
    cfg = load_config(config)
    choice = choose_layers(prepare_model(cfg), cfg.section("monitor"))
    assert choice.layer_pooling()["input"] == "grid"
    assert next(c for c in choice.candidates if c["layer"] == "input")["features"] == 7
    wrong = build_config(signal_saved, "image", model_keys={"input_kind": "image"})
    with pytest.raises(ConfigError, match="input_kind: image"):
        prepare(load_config(wrong))


def test_an_explicit_list_keeps_the_input(signal_saved, keys):
    summary, _ = built(build_config(signal_saved, "listed", layers=["fc"]), keys)
    assert summary["model"]["layers"] == ["input", "fc"]
    choice = summary["monitor"]["layer_choice"]
    assert choice["mode"] == "config" and choice["pooling"] == {"input": "flatten", "fc": "flatten"}
    assert input_row(summary)["chosen"] and input_row(summary)["features"] == 40
    names = [w["name"] for w in summary["monitor"].get("warnings", [])]
    assert "input_not_monitored" not in names
    with pytest.raises(ConfigError, match="monitor_input: false, but layers lists 'input'"):
        prepare(
            load_config(
                build_config(
                    signal_saved,
                    "both",
                    layers=["input", "fc"],
                    model_keys={"monitor_input": False},
                )
            )
        )


def test_a_build_without_the_input_warns_measured_on_its_unknown_sets(signal_saved, keys):
    """The logits alone let through a quarter of the spiky signals the input catches."""
    unwatched = {"layers": ["fc"], "model_keys": {"monitor_input": False}}
    summary, _ = built(build_config(signal_saved, "unwatched", **unwatched), keys)
    assert summary["model"]["layers"] == ["fc"] and not input_row(summary)["chosen"]
    warning = next(w for w in summary["monitor"]["warnings"] if w["name"] == "input_not_monitored")
    assert "model.monitor_input is false" in warning["message"]
    assert "unknown_spiky" in warning["message"] and "unknown_noise" not in warning["message"]
    # Without unknown sets nothing measures it: the warning says so, and a policy can fail on it.
    data = {s: {"path": str(signal_saved.folder / f"{s}.npz")} for s in ("train", "validation")}
    policy = {"fail_on": ["input_not_monitored"]}
    config = build_config(signal_saved, "blind", data=data, policy=policy, **unwatched)
    blind, _ = built(config, keys)
    message = next(w["message"] for w in blind["monitor"]["warnings"])
    assert "no unknown set measures" in message
    assert blind["policy"]["failed"] == [f"input_not_monitored: {message}"]


def test_the_warning_compares_each_set_with_the_input_alone():
    assert emitted.input_not_monitored("why", {"far": (0.05, 0.02)}) is None
    warning = emitted.input_not_monitored("why", {"near": (0.4, 0.38), "far": (0.6, 0.02)})
    assert warning is not None and warning.name == "input_not_monitored"
    assert warning.message == "why: far 60.0% accepted, 2.0% by a monitor of the input alone"
