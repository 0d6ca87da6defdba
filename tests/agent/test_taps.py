"""Layer taps: ONNX and torch.export paths agree, names are checked, pooling, CLI ``layers``."""

from __future__ import annotations

import json
import warnings
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from locations import ROOT
from onnx import numpy_helper
from onnx_export import export_onnx

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.taps import (
    COARSE_INPUT_LAYER,
    LayerInfo,
    OnnxTap,
    TorchTap,
    coarse_info,
    coarse_view,
    list_layers,
    offers_coarse,
    open_tap,
    pool,
    resolve_threads,
)
from boxwatch.commands.layers import layers as layers_cmd

DIGITS_MODEL = ROOT / "examples" / "digits" / "model.onnx"

torch = pytest.importorskip("torch")
nn = torch.nn
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*torch.jit.load.*:DeprecationWarning",
    "ignore:.*LeafSpec.*:FutureWarning",
    "ignore:.*legacy TorchScript-based ONNX export.*:DeprecationWarning",
)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.act = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 4 * 4, 6)
        self.relu = nn.ReLU()
        self.out = nn.Linear(6, 3)

    def forward(self, x):
        h = self.pool(self.act(self.conv(x)))
        return self.out(self.relu(self.fc(h.flatten(1))))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The same seeded model as ONNX (legacy exporter, one file) and as a torch.export program."""
    torch.manual_seed(0)
    model = SmallCNN().eval()
    folder = tmp_path_factory.mktemp("models")
    example = torch.zeros(2, 1, 8, 8)
    onnx_path, pt2, scripted = folder / "cnn.onnx", folder / "cnn.pt2", folder / "cnn.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # legacy exporter / TorchScript notices
        export_onnx(model, example, onnx_path)
        batch = torch.export.Dim("batch", min=1)
        program = torch.export.export(model, (example,), dynamic_shapes={"x": {0: batch}})
        torch.export.save(program, str(pt2))
        torch.jit.save(torch.jit.script(model), str(scripted))
    return model, onnx_path, pt2, scripted


@pytest.mark.slow  # exports the model three ways (~5-8 s, shared by the tests using `exported`)
def test_onnx_and_torch_paths_give_the_same_activations(exported):
    model, onnx_path, pt2, _ = exported
    x = np.random.default_rng(0).normal(size=(5, 1, 8, 8)).astype(np.float32)
    pooling = {"pool": "avg", "relu": "flatten"}
    tt = TorchTap(pt2, ["pool", "relu"], pooling=pooling)
    ot = OnnxTap(
        onnx_path,
        ["/pool/MaxPool_output_0", "/relu/Relu_output_0"],
        pooling={"/pool/MaxPool_output_0": "avg", "/relu/Relu_output_0": "flatten"},
    )
    lt, at = tt.run(x)
    lo, ao = ot.run(x)
    np.testing.assert_allclose(lt, lo, atol=1e-5)
    np.testing.assert_allclose(at["pool"], ao["/pool/MaxPool_output_0"], atol=1e-5)
    np.testing.assert_allclose(at["relu"], ao["/relu/Relu_output_0"], atol=1e-5)
    assert at["pool"].shape == (5, 4) and at["relu"].shape == (5, 6)
    # The program runs its generated code, not torch.fx's interpreter (~4x slower).
    assert not any(getattr(m, "_run_with_interpreter", False) for m in tt.module.modules())
    # And both equal the eager model's own intermediate values.
    with torch.no_grad():
        h = model.pool(model.act(model.conv(torch.from_numpy(x))))
    np.testing.assert_allclose(ao["/pool/MaxPool_output_0"], h.mean(dim=(2, 3)).numpy(), atol=1e-5)
    flat = OnnxTap(onnx_path, ["/pool/MaxPool_output_0"]).run(x)[1]["/pool/MaxPool_output_0"]
    np.testing.assert_allclose(flat, h.flatten(1).numpy(), atol=1e-5)


def test_onnx_tap_on_digits_model_matches_its_weights():
    x = np.random.default_rng(1).random((7, 64)).astype(np.float32)
    tap = OnnxTap(DIGITS_MODEL, ["/act1/Relu_output_0", "act2"], threads=1)
    logits, acts = tap.run(x)
    plain = ort.InferenceSession(str(DIGITS_MODEL), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(logits, plain.run(None, {"input": x})[0], atol=1e-6)
    weights = {
        t.name: numpy_helper.to_array(t) for t in onnx.load(str(DIGITS_MODEL)).graph.initializer
    }
    w1, b1 = weights["fc1.weight"], weights["fc1.bias"]
    np.testing.assert_allclose(acts["/act1/Relu_output_0"], np.maximum(x @ w1.T + b1, 0), atol=1e-5)
    assert acts["act2"].shape == (7, 32)  # the torch module (legacy node /act2/Relu)
    np.testing.assert_array_equal(
        acts["act2"],
        OnnxTap(DIGITS_MODEL, ["/act2/Relu_output_0"]).run(x)[1]["/act2/Relu_output_0"],
    )
    with pytest.raises(
        ConfigError,
        match="'/act2/Relu' is an ONNX node name, no longer accepted; name its output 'act2' instead",
    ):
        OnnxTap(DIGITS_MODEL, ["/act2/Relu"])


@pytest.mark.slow
def test_unknown_layers_fail_with_the_valid_names(exported):
    _, onnx_path, pt2, _ = exported
    with pytest.raises(ConfigError) as err:
        OnnxTap(onnx_path, ["nope", "/relu/Relu_output_0", "also-nope"])
    assert len(err.value.problems) == 2 and "/relu/Relu_output_0" in str(err.value)
    with pytest.raises(ConfigError, match="valid layers: .*'fc'"):
        TorchTap(pt2, ["fc9"])


@pytest.mark.slow
def test_listing_layers_with_shapes(exported):
    _, onnx_path, pt2, scripted = exported
    onnx_layers = {info.name: info for info in list_layers(onnx_path)}
    assert onnx_layers["/pool/MaxPool_output_0"].shape == (None, 4, 4, 4)
    assert onnx_layers["/pool/MaxPool_output_0"].n_features("avg") == 4
    assert onnx_layers["/pool/MaxPool_output_0"].n_features("flatten") == 64
    torch_layers = {info.name: info for info in list_layers(pt2)}
    assert torch_layers["pool"].shape == (None, 4, 4, 4)
    assert torch_layers["fc"].shape == (None, 6)
    assert {"conv", "act", "pool", "fc", "relu", "out"} <= set(torch_layers)
    assert {info.name for info in list_layers(scripted)} >= {"conv", "fc"}
    # Issue 29: the module's class, not unflatten's InterpreterModule.
    assert torch_layers["conv"].kind == "Conv2d" and torch_layers["fc"].kind == "Linear"
    assert torch_layers["pool"].kind == "MaxPool2d"
    assert all(info.calls == 1 for info in torch_layers.values())


class Twice(nn.Module):
    """``fc1`` (and ``act``) called twice per forward pass."""

    def __init__(self):
        super().__init__()
        self.fc1, self.act, self.out = nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.act(self.fc1(self.act(self.fc1(x)))))


@pytest.mark.slow
def test_repeated_module_calls_are_listed_and_the_last_call_is_tapped(tmp_path):
    torch.manual_seed(0)
    model = Twice().eval()
    pt2 = tmp_path / "twice.pt2"
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(model, (torch.zeros(2, 4),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, str(pt2))
    infos = {info.name: info for info in list_layers(pt2)}
    assert (infos["fc1"].kind, infos["fc1"].calls) == ("Linear", 2)
    assert (infos["out"].kind, infos["out"].calls) == ("Linear", 1)
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    tap = TorchTap(pt2, ["fc1"])
    _, acts = tap.run(x)
    with torch.no_grad():
        first = model.fc1(torch.from_numpy(x))
        second = model.fc1(model.act(first))
    np.testing.assert_allclose(acts["fc1"], second.numpy(), rtol=1e-5, atol=1e-6)
    result = CliRunner().invoke(layers_cmd, [str(pt2)])
    assert result.exit_code == 0, result.output
    assert "InterpreterModule" not in result.output
    assert "fc1 (2x)" in result.stderr and "last call" in result.stderr
    rows = json.loads(CliRunner().invoke(layers_cmd, [str(pt2), "--json"]).stdout)["layers"]
    assert {r["name"]: r["calls"] for r in rows}["fc1"] == 2


@pytest.mark.slow
def test_model_input_of_each_format(exported):
    _, onnx_path, pt2, scripted = exported
    assert open_tap(onnx_path).input.as_dict() == {
        "name": "input",
        "shape": [None, 1, 8, 8],
        "dtype": "float32",
    }
    assert open_tap(pt2).input.as_dict() == {
        "name": "x",
        "shape": [None, 1, 8, 8],
        "dtype": "float32",
    }
    assert open_tap(scripted).input.as_dict() == {"name": None, "shape": [], "dtype": None}
    res = CliRunner().invoke(layers_cmd, [str(scripted)])
    assert res.exit_code == 0 and res.stdout.startswith(
        "input: not declared, shape not declared, dtype not declared, kind not declared"
    )


@pytest.mark.slow
def test_torchscript_refuses_hooks_clearly(exported):
    *_, scripted = exported
    with pytest.raises(ConfigError, match="torch.export"):
        TorchTap(scripted, ["fc"])
    logits, acts = TorchTap(scripted).run(np.zeros((2, 1, 8, 8), np.float32))
    assert logits.shape == (2, 3) and acts == {}


def test_options_are_checked(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="pooling"):
        OnnxTap(DIGITS_MODEL, ["logits"], pooling="median")
    with pytest.raises(ConfigError, match="not tapped"):
        OnnxTap(DIGITS_MODEL, ["logits"], pooling={"other": "avg"})
    with pytest.raises(ConfigError, match="unknown model format"):
        open_tap(tmp_path / "model.h5")
    with pytest.raises(ConfigError, match="no such model"):
        open_tap(tmp_path / "missing.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="not a readable ONNX"):
        OnnxTap(bad)
    monkeypatch.setenv("BOXWATCH_ORT_THREADS", "3")
    assert resolve_threads(None) == 3 and resolve_threads(2) == 2
    monkeypatch.setenv("BOXWATCH_ORT_THREADS", "many")
    with pytest.raises(ConfigError, match="BOXWATCH_ORT_THREADS"):
        resolve_threads(None)


def test_pool_reduces_conv_maps():
    x = np.arange(2 * 3 * 2 * 2, dtype=np.float32).reshape(2, 3, 2, 2)
    assert pool(x, "flatten").shape == (2, 12)
    np.testing.assert_array_equal(pool(x, "avg"), x.mean(axis=(2, 3)))
    np.testing.assert_array_equal(pool(x, "max"), x.max(axis=(2, 3)))
    np.testing.assert_array_equal(pool(x[:, :, 0, 0], "avg"), x[:, :, 0, 0])


def test_cli_layers():
    runner = CliRunner()
    res = runner.invoke(layers_cmd, [str(DIGITS_MODEL)])
    assert res.exit_code == 0, res.output
    assert "/act1/Relu_output_0" in res.stdout and "(?, 64)" in res.stdout
    assert res.stdout.splitlines()[0] == "input: input, shape (?, 64), dtype float32, kind vector"
    res = runner.invoke(layers_cmd, [str(DIGITS_MODEL), "--json"])
    data = json.loads(res.stdout)
    assert data["input"] == {
        "name": "input",
        "shape": [None, 64],
        "dtype": "float32",
        "kind": "vector",
    }
    assert [row["features"] for row in data["layers"] if row["name"] == "logits"] == [8]
    # Registered as a lazy verb of the main command, which decides the exit codes.
    from boxwatch.cli import cli

    res = runner.invoke(cli, ["layers", "/nonexistent/model.onnx"])
    assert res.exit_code == 2 and "no such model" in res.stderr

    res = runner.invoke(cli, ["layers", str(DIGITS_MODEL), "--pooling", "avg"])
    assert res.exit_code == 0 and "logits" in res.stdout


def test_grid_pooling_averages_cells_per_channel():
    """``grid``: block means over at most 7 cells per spatial axis, channels kept apart."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3, 28, 14)).astype(np.float32)
    out = pool(x, "grid")
    want = x.reshape(2, 3, 7, 4, 7, 2).mean(axis=(3, 5)).reshape(2, -1)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    # Uneven sizes: cells of 1 or 2 rows still cover every pixel once (the total is kept).
    y = rng.normal(size=(1, 1, 10, 5)).astype(np.float32)
    cells = pool(y, "grid").reshape(7, 5)
    assert cells.shape == (7, 5)
    edges = np.linspace(0, 10, 8).round().astype(int)
    sizes = np.diff(edges)
    np.testing.assert_allclose((cells * sizes[:, None]).sum(axis=0), y[0, 0].sum(axis=0), rtol=1e-5)
    assert pool(x[:, :, 0, 0], "grid").shape == (2, 3)  # no spatial axes: unchanged


@pytest.mark.slow
def test_the_model_input_is_a_layer_in_both_taps(exported):
    """``input`` taps what the model receives, in ONNX and torch alike, and is listed first."""
    _, onnx_path, pt2, _ = exported
    x = np.random.default_rng(4).normal(size=(3, 1, 8, 8)).astype(np.float32)
    for tap in (
        OnnxTap(onnx_path, ["input", "/fc/Gemm_output_0"], pooling={"input": "grid"}),
        TorchTap(pt2, ["input", "fc"], pooling={"input": "grid"}),
    ):
        logits, acts = tap.run(x)
        assert logits.shape == (3, 3)
        # 8 pixels in 7 cells: one cell of 2 rows (and columns), six of 1.
        edges = np.linspace(0, 8, 8).round().astype(int)
        rows = np.add.reduceat(x, edges[:-1], axis=2) / np.diff(edges)[None, None, :, None]
        want = np.add.reduceat(rows, edges[:-1], axis=3) / np.diff(edges)[None, None, None, :]
        np.testing.assert_allclose(acts["input"], want.reshape(3, -1), rtol=1e-5)
        first = tap.candidates()[0]
        assert first.name == "input" and first.kind == "Input"
        assert first.shape == (None, 1, 8, 8) and first.n_features("grid") == 49
    flat = OnnxTap(onnx_path, ["input"]).run(x)[1]["input"]
    np.testing.assert_array_equal(flat, x.reshape(3, -1))


def test_the_coarse_view_averages_at_most_five_cells_per_axis():
    """``input_coarse``: block means over at most 5 cells per spatial axis, channels apart,
    every pixel counted once; an axis of 5 or fewer is kept as it is."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 3, 25, 10)).astype(np.float32)
    want = x.reshape(2, 3, 5, 5, 5, 2).mean(axis=(3, 5))
    np.testing.assert_allclose(coarse_view(x), want, rtol=1e-5, atol=1e-6)
    small = rng.normal(size=(1, 1, 4, 3)).astype(np.float32)
    np.testing.assert_array_equal(coarse_view(small), small)
    info = coarse_info(LayerInfo("input", (None, 3, 28, 28), "Input"))
    assert info is not None and info.name == COARSE_INPUT_LAYER and info.n_features() == 75
    assert coarse_info(LayerInfo("input", (None, 1, 40), "Input")) is None  # a signal
    assert coarse_info(LayerInfo("input", (None, 1, 5, 4), "Input")) is None  # no coarser


@pytest.mark.slow
def test_the_coarse_input_is_a_layer_in_both_taps(exported):
    """An image model offers its input twice, second on the coarse grid: ONNX and torch
    agree, and the view is the input's, whatever else is tapped."""
    _, onnx_path, pt2, _ = exported
    x = np.random.default_rng(6).normal(size=(3, 1, 8, 8)).astype(np.float32)
    want = coarse_view(x).reshape(3, -1)
    for tap in (
        OnnxTap(onnx_path, [COARSE_INPUT_LAYER, "/fc/Gemm_output_0"]),
        TorchTap(pt2, ["fc", COARSE_INPUT_LAYER]),
    ):
        _, acts = tap.run(x)
        np.testing.assert_allclose(acts[COARSE_INPUT_LAYER], want, rtol=1e-6)
        assert offers_coarse(tap.candidates())
        second = tap.candidates()[1]
        assert (second.name, second.kind, second.shape) == (
            COARSE_INPUT_LAYER,
            "Input",
            (None, 1, 5, 5),
        )
    # 8 pixels in 5 cells: sizes 2, 1, 2, 1, 2 (rounded edges 0, 2, 3, 5, 6, 8).
    np.testing.assert_allclose(want[:, 0], x[:, 0, :2, :2].mean(axis=(1, 2)), rtol=1e-6)


@pytest.mark.slow
def test_a_torch_module_named_like_the_coarse_input_is_refused(tmp_path):
    """A module called ``input_coarse`` would be tapped in place of the input's view."""

    class Named(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.input_coarse = nn.Linear(4, 2)

        def forward(self, x):
            return self.input_coarse(x)

    program = torch.export.export(Named().eval(), (torch.zeros(2, 4),))
    path = tmp_path / "named.pt2"
    torch.export.save(program, str(path))
    with pytest.raises(ConfigError, match="a module is named 'input_coarse'"):
        TorchTap(path, [])


# ---------------------------------------------------------------------------- hostile models
def _onnx_file(tmp_path, name: str, nodes, inputs, outputs, initializers=()) -> str:
    """An ONNX model file written without checks (onnxruntime is the one that refuses it)."""
    graph = onnx.helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


def _vi(name: str, shape):
    return onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)


def test_onnx_models_onnxruntime_refuses_are_one_config_error_line(tmp_path):
    """A cyclic graph, or a matrix product of mismatched shapes: onnxruntime refuses to open
    them; that is bad input (exit 2 naming the file), not an internal error."""
    cyclic = _onnx_file(
        tmp_path,
        "cyclic",
        [
            onnx.helper.make_node("Add", ["x", "b"], ["a"], name="add"),
            onnx.helper.make_node("Relu", ["a"], ["b"], name="relu"),
        ],
        [_vi("x", [None, 4])],
        [_vi("b", [None, 4])],
    )
    weight = numpy_helper.from_array(np.ones((3, 2), np.float32), "w")
    mismatched = _onnx_file(
        tmp_path,
        "mismatched",
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [_vi("x", [None, 4])],
        [_vi("y", [None, 2])],
        [weight],
    )
    for path in (cyclic, mismatched):
        with pytest.raises(ConfigError) as info:
            OnnxTap(path)
        text = str(info.value)
        assert text.startswith(path) and "onnxruntime" in text and "\n" not in text, text
        assert len(text) < 600


def _torch_zip(tmp_path, name: str, members) -> str:
    """A ZIP shaped like a torch file: ``members`` (name, bytes, compress_type)."""
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as archive:
        for member, data, kind in members:
            archive.writestr(member, data, compress_type=kind)
    return str(path)


@pytest.mark.parametrize("suffix", [".pt2", ".pt"])
@pytest.mark.parametrize(
    "members",
    [
        [("archive/data.pkl", b"junk", zipfile.ZIP_STORED)],
        [("archive/data/0", b"\0" * (64 << 20), zipfile.ZIP_DEFLATED)],
        [(f"archive/data/{i}", b"\0" * (4 << 20), zipfile.ZIP_DEFLATED) for i in range(8)],
    ],
    ids=["junk", "one-bomb", "many-bombs"],
)
def test_malformed_torch_files_are_refused_in_one_line_before_torch_reads_them(
    tmp_path, capfd, monkeypatch, suffix, members
):
    """No traceback from torch's logger on stderr; a member declaring far more bytes than
    the file holds (a zip bomb: torch inflates members whole) is refused from the ZIP's index,
    before torch opens the file."""
    path = _torch_zip(tmp_path, f"model{suffix}", members)
    bomb = any(kind == zipfile.ZIP_DEFLATED for _, _, kind in members)
    if bomb:

        def never(*_args, **_kwargs):
            raise AssertionError("torch read a file its ZIP index already refused")

        monkeypatch.setattr(torch.jit, "load", never)
        monkeypatch.setattr(torch.export, "load", never)
    with pytest.raises(ConfigError) as info:
        TorchTap(path)
    text = str(info.value)
    assert text.startswith(path) and "\n" not in text and len(text) < 600, text
    if bomb:
        assert "declare" in text
    err = capfd.readouterr().err
    assert "Traceback" not in err and "torch/export" not in err, err[-2000:]


def test_real_torch_files_pass_the_zip_check(exported):
    _, _, pt2, scripted = exported
    for path in (pt2, scripted):
        TorchTap(path)


def test_a_torch_module_path_taps_the_same_values_in_onnx_and_pt2(resnet_saved):
    """torch's default ONNX exporter records each node's modules: the ONNX tap takes the
    module path for the tensor it names (BatchNorm folded into its conv, a ReLU called twice
    by its last call, a block by its output), as the .pt2 tap takes it for the module."""
    modules = ["stem.1", "layer1.0.relu", "layer1.0", "layer1", "pool", "fc"]
    x = np.random.default_rng(5).normal(size=(4, 1, 12, 12)).astype(np.float32)
    onnx_tap = OnnxTap(resnet_saved.onnx, modules)
    torch_tap = TorchTap(resnet_saved.pt2, modules)
    (lo, ao), (lt, at) = onnx_tap.run(x), torch_tap.run(x)
    np.testing.assert_allclose(lo, lt, rtol=1e-4, atol=1e-5)
    for name in modules:
        np.testing.assert_allclose(ao[name], at[name], rtol=1e-4, atol=1e-5, err_msg=name)
    rows = {info.name: info for info in onnx_tap.candidates()}
    twice = next(info for info in rows.values() if "layer1.0.relu" in info.modules)
    assert twice.calls == 2 and twice.modules == ("layer1.0.relu", "layer1.0")
    # torch's generated code cannot run a submodule called twice (``relu@1``): the program
    # keeps the interpreter, and the values above are right.
    assert any(getattr(m, "_run_with_interpreter", False) for m in torch_tap.module.modules())
    # Every name a tap lists opens, and nothing else: the .pt2 modules run in forward order.
    torch_rows = [info.name for info in torch_tap.candidates()]
    assert (
        torch_rows.index("layer1.0.conv1")
        < torch_rows.index("layer1.0")
        < torch_rows.index("layer1")
    )
    for tap in (onnx_tap, torch_tap):
        names = [n for info in tap.candidates() for n in (info.name, *info.modules)]
        type(tap)(tap.path, list(dict.fromkeys(names)))


def test_an_onnx_tensor_named_like_the_coarse_input_keeps_its_name(tmp_path):
    """A graph tensor called ``input_coarse`` is that tensor; the image gets no coarse view."""
    path = _onnx_file(
        tmp_path,
        "named",
        [
            onnx.helper.make_node("Relu", ["x"], ["input_coarse"], name="relu"),
            onnx.helper.make_node("Flatten", ["input_coarse"], ["y"], name="flat"),
        ],
        [_vi("x", [None, 1, 8, 8])],
        [_vi("y", [None, 64])],
    )
    tap = OnnxTap(path, [COARSE_INPUT_LAYER])
    assert [i.kind for i in tap.candidates() if i.name == COARSE_INPUT_LAYER] == ["Relu"]
    assert not offers_coarse(tap.candidates())  # the build then watches the input on one grid
    x = np.random.default_rng(7).normal(size=(2, 1, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(
        tap.run(x)[1][COARSE_INPUT_LAYER], np.maximum(x, 0).reshape(2, -1)
    )
