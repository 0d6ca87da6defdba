"""A residual CNN with BatchNorm as torch saves it by default (issue 39): its conv maps are
monitored pooled under ``layers: auto``, its layers go by their torch module paths in the
listing, the config and the summary, and its ``.pt2`` input is checked at ``--dry-run``."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from torch_models import build_config

from boxwatch.agent.artifact import write_artifact
from boxwatch.agent.boxes import ACCEPT
from boxwatch.agent.errors import ConfigError
from boxwatch.agent.keys import generate_keypair, load_private_key
from boxwatch.agent.runtime import load_runtime
from boxwatch.agent.taps import COARSE_INPUT_LAYER
from boxwatch.cli import EXIT_OK, EXIT_USAGE, cli
from boxwatch.offline.release import layer_choice
from boxwatch.offline.release.config import load_config
from boxwatch.offline.release.pipeline import build, prepare
from boxwatch.offline.release.report import render_report

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


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_conv_maps_over_the_cap_are_pooled_and_monitored(resnet_saved, keys, fmt):
    """Every conv map is 8x12x12 = 1,152 features flattened, over the 1,024 cap: under auto
    one is monitored pooled (not dropped), and every candidate says why (not)."""
    model = resnet_saved.onnx if fmt == "onnx" else resnet_saved.pt2
    assert model is not None
    config = build_config(resnet_saved, f"auto_{fmt}", model=model)
    summary, artifact = built(config, keys)
    rows = summary["monitor"]["layer_choice"]["candidates"]
    maps = [r for r in rows if r["chosen"] and r["kind"] != "Input"]
    assert maps and all(r["pooling"] in layer_choice.MAP_POOLINGS for r in maps)
    assert all("1,152 features flattened, pooled" in r["reason"] for r in maps)
    assert all(set(r["pooling_auroc"]) == {"avg", "max", "grid"} for r in maps)
    assert all(r["reason"] for r in rows)
    assert any(r["reason"].startswith("not ranked: its block of") for r in rows)
    assert summary["model"]["input_kind"] == "image"
    assert summary["monitor"]["layer_choice"]["pooling"]["input"] == "grid"
    # The 12x12 input is watched on the 5x5 grid too, as its own layer (25 features).
    coarse = next(r for r in rows if r["layer"] == COARSE_INPUT_LAYER)
    assert coarse["chosen"] and coarse["features"] == 25 and "coarser grid" in coarse["reason"]
    assert summary["monitor"]["layer_choice"]["pooling"][COARSE_INPUT_LAYER] == "flatten"
    runtime = load_runtime(artifact, [str(keys[1])], model_path=model)
    x = np.load(resnet_saved.folder / "validation.npz")["x"]
    result = runtime.run_model(x)
    assert result.layer_verdicts[COARSE_INPUT_LAYER].shape == (len(x),)
    assert np.mean(result.verdicts == ACCEPT) > 0.8
    noise = np.load(resnet_saved.folder / "unknown_noise.npz")["x"]
    assert np.mean(runtime.run_model(noise).verdicts == ACCEPT) < 0.1


def test_the_listing_names_layers_by_module_and_is_what_the_config_takes(resnet_saved, keys):
    listing = CliRunner().invoke(cli, ["layers", str(resnet_saved.onnx), "--json"])
    assert listing.exit_code == EXIT_OK, listing.output
    rows = json.loads(listing.stdout)["layers"]
    by_module = {m: r["name"] for r in rows for m in r["modules"]}
    # The dynamo exporter's graph names (getitem_9, relu_4) and the modules that make them.
    assert by_module["layer1.1.relu"] == by_module["layer1"] != "layer1.1.relu"
    assert by_module["stem.1"] != "stem.1"  # the BatchNorm, folded into its conv
    text = CliRunner().invoke(cli, ["layers", str(resnet_saved.onnx)]).stdout
    assert "module" in text.splitlines()[1] and "layer1.1.relu, layer1.1, layer1" in text
    # The config takes a module path; the summary says which tensor it is.
    config = build_config(resnet_saved, "by_module", layers=["layer1.0.relu"])
    summary, artifact = built(config, keys)
    # The input of a listed config is watched as under auto: an image on both grids.
    assert summary["model"]["layers"] == ["input", COARSE_INPUT_LAYER, "layer1.0.relu"]
    row = next(
        c
        for c in summary["monitor"]["layer_choice"]["candidates"]
        if c["chosen"] and c["kind"] != "Input"
    )
    assert row["layer"] == by_module["layer1.0.relu"] and "layer1.0.relu" in row["modules"]
    assert row["reason"] == "listed in the build config as layer1.0.relu"
    j = summary["monitor"]["layer_choice"]["candidates"].index(row)
    html = render_report(summary)
    assert f'id="layer-choice-{j}-modules">layer1.0.relu, layer1.0<' in html
    assert f'id="layer-choice-{j}-pooling">flatten<' in html
    runtime = load_runtime(artifact, [str(keys[1])], model_path=resnet_saved.onnx)
    x = np.load(resnet_saved.folder / "validation.npz")["x"][:5]
    assert set(runtime.run_model(x).layer_verdicts) == {
        "input",
        COARSE_INPUT_LAYER,
        "layer1.0.relu",
    }
    # A name the listing does not show is refused, and the error lists what it shows; a node
    # name (accepted by older releases) is refused naming the layer to write instead.
    listed = {r["name"] for r in rows} | set(by_module)
    bad = build_config(resnet_saved, "by_typo", layers=["layer1.0.rleu"])
    with pytest.raises(ConfigError) as err:
        prepare(load_config(bad))
    valid = str(err.value).split("valid layers: ", 1)[1]
    assert set(ast.literal_eval(valid)) == listed
    node = next(
        n
        for n in onnx.load(str(resnet_saved.onnx)).graph.node
        if n.name not in listed and n.output[0] in {r["name"] for r in rows}
    )
    bad = build_config(resnet_saved, "by_node", layers=[node.name])
    with pytest.raises(ConfigError) as err:
        prepare(load_config(bad))
    instead = str(err.value).split("name its output ", 1)[1].split("'")[1]
    assert "is an ONNX node name, no longer accepted" in str(err.value)
    assert instead in listed
    assert instead == node.output[0] or by_module[instead] == node.output[0]


def test_a_pt2_input_is_checked_at_dry_run(resnet_saved, tmp_path):
    """A .pt2 program's input name, shape and dtype are checked like an ONNX model's."""
    runner = CliRunner()

    def dry_run(name: str, **model_keys: object) -> tuple[int, str]:
        config = build_config(resnet_saved, name, model=resnet_saved.pt2, model_keys=model_keys)
        res = runner.invoke(cli, ["build-artifact", str(config), "--dry-run"])
        return res.exit_code, res.stderr

    assert dry_run("pt2_ok", input_name="x")[0] == EXIT_OK
    code, err = dry_run("pt2_name", input_name="input")
    assert code == EXIT_USAGE and len(err.strip().splitlines()) == 1, err
    assert "model.input_name: 'input' is not an input of the model (its input is 'x')" in err
    code, err = dry_run("pt2_shape", preprocessing={"shape": [12, 12, 1]})
    assert code == EXIT_USAGE and "does not fit the model's input shape ['?', 1, 12, 12]" in err
    # A model that takes float64 (boxwatch feeds float32): an ONNX graph, checked the same way.
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])],
        "doubles",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, [None, 3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.DOUBLE, [None, 3])],
    )
    doubles = tmp_path / "doubles.onnx"
    onnx.save(onnx.helper.make_model(graph), str(doubles))
    np.savez(tmp_path / "train.npz", x=np.eye(3), y=np.arange(3))
    config = tmp_path / "doubles.yaml"
    config.write_text(
        json.dumps(
            {
                "version": 1,
                "model": {"path": str(doubles), "preprocessing": {"shape": [3]}},
                "classes": ["a", "b", "c"],
                "layers": ["y"],
                "data": {"train": {"path": str(tmp_path / "train.npz")}},
            }
        )
    )
    res = runner.invoke(cli, ["build-artifact", str(config), "--dry-run"])
    assert res.exit_code == EXIT_USAGE and "its input 'x' takes float64" in res.stderr


def test_a_graph_tensor_named_like_the_coarse_view_is_not_monitored_as_it(resnet_saved, tmp_path):
    """An ONNX image model with its own ``input_coarse`` tensor: an explicit list keeps the
    input on its grid and does not tap that tensor in the coarse view's place."""
    from onnx import TensorProto, helper, numpy_helper
    from torch_models import SavedModel

    masks = np.zeros((144, 3), np.float32)
    for label in range(3):
        r, c = divmod(label, 2)
        quadrant = np.zeros((12, 12), np.float32)
        quadrant[6 * r : 6 * r + 6, 6 * c : 6 * c + 6] = 1.0
        masks[:, label] = quadrant.reshape(-1)
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["input_coarse"]),
            helper.make_node("Flatten", ["input_coarse"], ["flat"]),
            helper.make_node("MatMul", ["flat", "w"], ["logits"]),
        ],
        "quadrants",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 1, 12, 12])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 3])],
        [numpy_helper.from_array(masks, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "quadrants.onnx"
    onnx.save(model, str(path))
    saved = SavedModel(path, None, resnet_saved.folder, resnet_saved.shape)
    config = build_config(saved, "named_coarse", layers=["flat"], model_keys={"input_name": "x"})
    inputs = prepare(load_config(config)).model
    assert inputs is not None and inputs.layers == ["input", "flat"]
    # The plan asked for the coarse view; the graph's own tensor of that name made it drop.
    assert layer_choice.input_plan((None, 1, 12, 12)).coarse == 25
