"""``layers: auto``: the build picks the monitored layers from known inputs only, says why, and
``boxwatch layers MODEL --config`` marks the same ones."""

from __future__ import annotations

import json
import re
import warnings
from html import escape
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from onnx_export import export_onnx

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.keys import generate_keypair, load_private_key
from boxwatch.agent.taps import open_tap
from boxwatch.cli import EXIT_OK, EXIT_USAGE, cli
from boxwatch.commands.console import summary_table
from boxwatch.commands.demo import write_build_config
from boxwatch.offline.release import layer_choice
from boxwatch.offline.release.config import load_config
from boxwatch.offline.release.pipeline import (
    build,
    choose_layers,
    output_layer,
    prepare,
    prepare_model,
)
from boxwatch.offline.release.report import render_report

DIGITS_LAYERS = [
    "/fc1/Gemm_output_0",
    "/act1/Relu_output_0",
    "/fc2/Gemm_output_0",
    "/act2/Relu_output_0",
    "logits",
]
DIGITS_BLOCKS = [DIGITS_LAYERS[:2], DIGITS_LAYERS[2:4], DIGITS_LAYERS[4:]]
# The torch modules the (legacy) export recorded for each tensor; the input has none.
MODULES = dict(zip(DIGITS_LAYERS, ["fc1", "act1", "fc2", "act2", "out"], strict=True))


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo's model half (digits MLP), layers omitted, a short tau list; and a key."""
    work = tmp_path_factory.mktemp("auto")
    config = write_build_config(work)
    raw = yaml.safe_load(config.read_text())
    raw.pop("bn")
    raw.pop("layers", None)
    raw["monitor"]["tau"] = [1.0, 0.2, 0.05]
    for spec in raw["data"].values():
        spec["path"] = str(work / spec["path"])
    raw["model"]["path"] = str(config.parent / raw["model"]["path"])
    generate_keypair(work / "k.key", work / "k.pub", force=True)
    return work, raw


def write(work: Path, raw: dict, name: str) -> Path:
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def summary_of(work: Path, raw: dict, name: str) -> dict:
    cfg = load_config(write(work, raw, name))
    return build(prepare(cfg), load_private_key(work / "k.key"), created_at=1).summary.to_dict()


def test_schema_takes_a_list_auto_or_nothing(demo):
    work, raw = demo
    for value in ("auto", ["logits"]):
        load_config(write(work, {**raw, "layers": value}, "ok"))
    load_config(write(work, raw, "omitted"))
    bad: object
    for bad in ("automatic", [], 3):
        with pytest.raises(ConfigError, match="layers: expected 'auto' or a non-empty list"):
            load_config(write(work, {**raw, "layers": bad}, "bad"))


def test_choice_ranks_every_candidate_deterministically(demo):
    work, raw = demo
    mi = prepare_model(load_config(write(work, raw, "rank")))
    assert mi.auto and mi.layers == []
    params = load_config(write(work, raw, "rank")).section("monitor")
    first, again = choose_layers(mi, params), choose_layers(mi, params)
    first_s, again_s = first.summary(), again.summary()
    assert msgspec.structs.replace(first_s, seconds=0) == msgspec.structs.replace(
        again_s, seconds=0
    )
    rows = first.candidates
    assert [r["layer"] for r in rows] == ["input", *DIGITS_LAYERS]
    ranked = sorted((r for r in rows if r["rank"]), key=lambda r: r["rank"])
    # Every candidate but the input and the model's output (not ranked: auto leaves it out).
    assert [r["rank"] for r in ranked] == list(range(1, len(DIGITS_LAYERS)))
    aurocs = [r["auroc"] for r in ranked]
    assert aurocs == sorted(aurocs, reverse=True) and all(0.5 < a <= 1 for a in aurocs)
    # The rule: blocks of consecutive same-shape candidates (fc1+act1, fc2+act2, logits); the
    # best of each block, the top N_CHOSEN blocks of them.
    block = {n: i for i, names in enumerate(DIGITS_BLOCKS) for n in names}
    best: dict[int, str] = {}
    for r in ranked:
        best.setdefault(block[r["layer"]], r["layer"])
    expected = {n for n in best.values()}
    assert len(expected) == 2 <= layer_choice.N_CHOSEN  # the MLP has two hidden blocks
    # Plus the model's input (not ranked: its held-out-class AUROC says nothing of it).
    assert set(first.layers) == expected | {"input"} and "logits" not in first.layers
    assert first.layers == ["input", *(n for n in DIGITS_LAYERS if n in expected)]  # graph order
    assert first.layer_pooling()["input"] == "flatten"  # a flat (tabular) input: as it is
    for r in rows:
        assert r["chosen"] == (r["layer"] in expected or r["layer"] == "input")
        assert r["pooling"] == "flatten"
        assert r.get("modules") == ([MODULES[r["layer"]]] if r["layer"] in MODULES else None)
        if r["layer"] == "input":
            assert r["rank"] is None and r["reason"].startswith("the model's input (flatten")
            continue
        if r["layer"] == "logits":
            assert r["rank"] is None and "the model's output" in r["reason"]
            continue
        assert r["reason"].startswith(f"rank {r['rank']} of {len(DIGITS_LAYERS) - 1}")


def test_ranking_gives_a_full_monitors_auroc_and_tau(demo):
    """The ranking monitors (correctly classified rows only, k-means run directly) rank as
    full one-layer monitors on every training row with KMeans.fit would (issue 39)."""
    from boxwatch.offline.monitors.estimator import BoxMonitor
    from boxwatch.offline.release.records import MonitorSection

    work, raw = demo
    cfg = load_config(write(work, raw, "full"))
    mi, params = prepare_model(cfg), cfg.section("monitor")
    choice = choose_layers(mi, params)
    (x_tr, y_tr), (x_va, y_va) = mi.data["train"], mi.data["validation"]
    assert y_tr is not None and y_va is not None
    assert len(y_tr) <= layer_choice.MAX_TRAIN_ROWS  # every row ranks: no draw to repeat
    assert len(y_va) <= layer_choice.MAX_VALIDATION_ROWS
    ranked = [r for r in choice.candidates if r["auroc"] is not None]
    names = [r["layer"] for r in ranked]
    tap = open_tap(mi.path, names, threads=1)
    (out_tr, act_tr), (out_va, act_va) = (tap.run(mi.preprocessing.apply(x)) for x in (x_tr, x_va))
    pred_tr = out_tr.argmax(axis=1)
    assert (pred_tr != y_tr).any()  # the full monitors have bad boxes to fit
    section = MonitorSection.from_raw(params)
    template = section.estimator(None, only=layer_choice.RANKING_PARAMETERS)
    for r in ranked:
        name = r["layer"]
        full = BoxMonitor(
            **{
                **template.get_params(),
                "tau": "auto",
                "taus": layer_choice.ranking_taus(template),
                "selection": "held-out-class",
                "layers": [name],
            }
        ).fit(
            {name: act_tr[name]},
            y_tr,
            pred_tr,
            validation=({name: act_va[name]}, y_va, out_va.argmax(axis=1)),
            n_classes=len(mi.classes),
        )
        tau = float(full.tau_[name][0])
        sel = full.selection_ or {}
        assert r["tau"] == tau
        assert r["auroc"] == float(sel["auroc"][name][list(sel["taus"]).index(tau)])


def test_without_validation_a_held_out_share_of_train_ranks(demo):
    work, raw = demo
    data = {"train": raw["data"]["train"], "unknown": raw["data"]["unknown"]}
    cfg = load_config(write(work, {**raw, "data": data}, "no_validation"))
    choice = choose_layers(prepare_model(cfg), cfg.section("monitor"))
    n_train = len(np.load(raw["data"]["train"]["path"])["y"])
    assert choice.set == "train (held out)"
    assert choice.n_train + choice.n_validation == n_train
    assert round(choice.n_validation / n_train, 1) == layer_choice.HELD_OUT_SHARE
    assert choice.layers and all(c["reason"] for c in choice.candidates)


@pytest.mark.slow
def test_omitted_is_auto_and_unknown_data_does_not_change_the_choice(demo, tmp_path):
    work, raw = demo
    omitted = summary_of(work, raw, "omitted")
    auto = summary_of(work, {**raw, "layers": "auto"}, "auto")
    choice = omitted["monitor"]["layer_choice"]
    assert choice["mode"] == "auto" and choice["set"] == "validation"
    assert choice["layers"] == omitted["model"]["layers"] == auto["model"]["layers"]
    assert choice["candidates"] == auto["monitor"]["layer_choice"]["candidates"]
    # Other unknown inputs (noise in place of digits 8-9, no other unknown sets) and none
    # at all: the same choice, with the same AUROCs, while the unknown figures do change.
    data = raw["data"]
    swapped = {
        **raw,
        "data": {
            "train": data["train"],
            "validation": data["validation"],
            "unknown": data["unknown_noise"],
        },
    }
    other = summary_of(work, swapped, "swapped")
    none = summary_of(
        work,
        {**raw, "data": {"train": data["train"], "validation": data["validation"]}},
        "none",
    )
    for s in (other, none):
        assert s["monitor"]["layer_choice"]["candidates"] == choice["candidates"]
        assert s["model"]["layers"] == choice["layers"]
    before = omitted["monitor"]["operating_points"][0]["acceptance"]
    assert other["monitor"]["operating_points"][0]["acceptance"] != before
    # An explicit list is monitored as given, and the summary says where it came from.
    # (and the model's input beside it, issue 39), every candidate with why (not).
    listed = summary_of(work, {**raw, "layers": ["out"]}, "listed")
    assert listed["model"]["layers"] == ["input", "out"]
    config = listed["monitor"]["layer_choice"]
    assert config["mode"] == "config" and config["layers"] == ["input", "out"]
    assert config["pooling"] == {"input": "flatten", "out": "flatten"}
    why = {c["layer"]: (c["chosen"], c["reason"]) for c in config["candidates"]}
    assert why["logits"] == (True, "listed in the build config as out")
    assert why["input"][0] and why["input"][1].startswith("the model's input (flatten, 64")
    assert why["/act1/Relu_output_0"] == (False, "not listed")
    assert "warnings" not in listed["monitor"] or not any(
        w["name"] == "input_not_monitored" for w in listed["monitor"]["warnings"]
    )
    # The console table and the report say what was chosen and why.
    table = summary_table(omitted | {"artifact": {"artifact_id": "x", "bytes": 1}}, tmp_path)
    line = next(li for li in table.splitlines() if "layers (auto)" in li)
    for name in choice["layers"]:
        assert name in line
    html = render_report(omitted)
    assert 'id="layer-choice-mode">auto<' in html
    for j, c in enumerate(choice["candidates"]):
        assert re.search(rf'id="layer-choice-{j}-layer">{re.escape(c["layer"])}<', html)
        assert f'id="layer-choice-{j}-chosen">{"yes" if c["chosen"] else "no"}<' in html
        assert f'id="layer-choice-{j}-reason">{escape(c["reason"])}<' in html
    # `boxwatch layers MODEL --config` marks exactly the layers the build chose.
    model = raw["model"]["path"]
    config = str(work / "omitted.yaml")
    res = CliRunner().invoke(cli, ["layers", model, "--config", config, "--json"])
    assert res.exit_code == EXIT_OK, res.output
    out = json.loads(res.stdout)
    assert [r["name"] for r in out["layers"] if r["auto"]["chosen"]] == choice["layers"]
    assert out["input"] == {
        "name": "input",
        "shape": [None, 64],
        "dtype": "float32",
        "kind": "vector",
    }
    text = CliRunner().invoke(cli, ["layers", model, "--config", config])
    marked = [li.split()[0] for li in text.stdout.splitlines() if "* " in li]
    assert marked == choice["layers"], text.stdout


def test_layers_cli_refuses_a_config_of_another_model(demo, tmp_path):
    work, raw = demo
    config = str(write(work, raw, "cli"))
    other = tmp_path / "other.onnx"
    other.write_bytes(Path(raw["model"]["path"]).read_bytes())
    res = CliRunner().invoke(cli, ["layers", str(other), "--config", config])
    assert res.exit_code == EXIT_USAGE and "model.path" in res.stderr
    res = CliRunner().invoke(
        cli, ["layers", raw["model"]["path"], "--config", config, "--pooling", "avg"]
    )
    assert res.exit_code == EXIT_USAGE and "model.pooling" in res.stderr
    assert "Traceback" not in res.output


def test_auto_needs_two_known_classes_checked_before_the_build(demo):
    work, raw = demo
    x = np.load(raw["data"]["validation"]["path"])
    one = work / "one_class.npz"
    np.savez(one, x=x["x"][x["y"] == 0], y=x["y"][x["y"] == 0])
    bad = {**raw, "data": {**raw["data"], "validation": {"path": str(one)}}}
    with pytest.raises(ConfigError, match="at least 2 known classes"):
        prepare(load_config(write(work, bad, "one")))
    # An explicit list does not need it.
    prepare(load_config(write(work, {**bad, "layers": ["logits"]}, "one_listed")))


def _choose_halves(path, infos, output: str, x: np.ndarray, y: np.ndarray):
    """The build's layer choice on a small model: even rows train, odd rows validate."""
    return layer_choice.choose_layers(
        lambda names: open_tap(path, names),
        infos,
        output=output,
        pooling="flatten",
        preprocess=lambda v: v,
        train=(x[::2], y[::2]),
        validation=(x[1::2], y[1::2]),
        n_classes=3,
        params={"tau": [1.0, 0.2]},
    )


@pytest.mark.slow
def test_screening_leaves_out_copies_and_wide_layers_and_picks_per_block(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    nn: Any = torch.nn

    class TinyCNN(nn.Module):
        """Flatten of the input (a copy of it) and Flatten of the pool (a copy of that)."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 2, 3, padding=1)
            self.act = torch.nn.ReLU()
            self.pool = torch.nn.MaxPool2d(2)
            self.fc = torch.nn.Linear(8 + 16, 6)
            self.relu = torch.nn.ReLU()
            self.out = torch.nn.Linear(6, 3)

        def forward(self, x):
            h = self.pool(self.act(self.conv(x))).flatten(1)
            return self.out(self.relu(self.fc(torch.cat([h, x.flatten(1)], dim=1))))

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 60)
    x = (rng.normal(size=(180, 1, 4, 4)) + y[:, None, None, None]).astype(np.float32)
    model = TinyCNN()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(60):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(
            model(torch.from_numpy(x)), torch.from_numpy(y)
        ).backward()
        opt.step()
    path = tmp_path / "tiny.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_onnx(model.eval(), torch.zeros(1, 1, 4, 4), path, opset=None)
    monkeypatch.setattr(layer_choice, "MAX_FEATURES", 20)
    infos = open_tap(path).candidates()
    choice = _choose_halves(path, infos, "logits", x, y)
    rows = {c["layer"]: c for c in choice.candidates}
    why = {name: c["reason"] for name, c in rows.items()}
    # conv and act (32 features each flattened) are pooled, not dropped (issue 39); a block
    # of pooled maps is ranked on its output (act) alone.
    assert why["/conv/Conv_output_0"].startswith("not ranked: its block of 2 same-shape")
    act = rows["/act/Relu_output_0"]
    assert act["rank"] and "32 features flattened, pooled" in act["reason"]
    flats = [name for name in why if "Flatten" in name]
    assert sorted(why[n] for n in flats) == [
        "same values as /pool/MaxPool_output_0",
        "the model's input, reshaped",
    ]
    ranked = {name: c for name, c in rows.items() if c["rank"]}
    assert why["/Concat_output_0"] == "24 features > 20"  # no spatial axes: cannot be pooled
    assert set(ranked) == {
        "/act/Relu_output_0",
        "/pool/MaxPool_output_0",
        "/fc/Gemm_output_0",
        "/relu/Relu_output_0",
    }
    # fc and its relu are one block: one of them, the better ranked, is monitored.
    pair = sorted(("/fc/Gemm_output_0", "/relu/Relu_output_0"), key=lambda n: ranked[n]["rank"])
    assert pair[0] in choice.layers and pair[1] not in choice.layers
    assert "ranks higher in its block" in ranked[pair[1]]["reason"]

    # Three blocks besides the output: each monitored, whatever its rank, where its
    # held-out-class AUROC reaches MIN_CHOSEN_AUROC; the pooled map with the pooling of the
    # best AUROC among those that fit (avg, max: 2 features; grid: 2x4x4 = 32 > 20). Logits
    # left out, not ranked. And the model's input, on a grid (1x4x4 gives 16 grid features).
    def value(name: str) -> float:
        row = rows[name]
        return max(row["pooling_auroc"].values()) if "pooling_auroc" in row else row["auroc"]

    blocks = ["/act/Relu_output_0", "/pool/MaxPool_output_0", pair[0]]
    strong = [n for n in blocks if value(n) >= layer_choice.MIN_CHOSEN_AUROC]
    assert strong and len(strong) < len(blocks), {n: value(n) for n in blocks}
    assert choice.layers == ["input", *strong]
    for name in set(blocks) - set(strong):
        assert f"held-out-class AUROC below {layer_choice.MIN_CHOSEN_AUROC}" in why[name]
    assert set(act["pooling_auroc"]) == {"avg", "max"}
    best = max(act["pooling_auroc"], key=lambda p: act["pooling_auroc"][p])
    assert act["pooling"] == best
    assert choice.layer_pooling().get("/act/Relu_output_0", best) == best
    assert act["features"] == 2
    assert choice.layer_pooling()["input"] == "grid" and choice.candidates[0]["features"] == 16
    assert not rows["logits"]["chosen"] and "output" in why["logits"]


@pytest.mark.slow
def test_torch_export_program_output_and_blocks(tmp_path):
    torch = pytest.importorskip("torch")
    nn: Any = torch.nn

    class Small(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3, padding=1)
            self.act = nn.ReLU()
            self.pool = nn.MaxPool2d(2)
            self.fc = nn.Linear(8, 6)
            self.relu = nn.ReLU()
            self.out = nn.Linear(6, 3)

        def forward(self, x):
            return self.out(self.relu(self.fc(self.pool(self.act(self.conv(x))).flatten(1))))

    torch.manual_seed(0)
    y = np.repeat(np.arange(3), 40)
    x = (np.random.default_rng(0).normal(size=(120, 1, 4, 4)) + y[:, None, None, None]).astype(
        np.float32
    )
    model = Small().eval()
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(
        model, (torch.zeros(2, 1, 4, 4),), dynamic_shapes={"x": {0: batch}}
    )
    path = tmp_path / "small.pt2"
    torch.export.save(program, str(path))
    tap = open_tap(path)
    infos = tap.candidates()
    assert output_layer(tap, infos, 3) == "out"
    choice = _choose_halves(path, infos, "out", x, y)
    rows = {c["layer"]: c for c in choice.candidates}
    assert all(rows[n]["rank"] for n in ("conv", "act", "pool", "fc", "relu"))
    assert rows["out"]["rank"] is None and "the model's output" in rows["out"]["reason"]
    # conv/act and fc/relu are blocks: at most one of each, and pool, each monitored where
    # its best-ranked layer's held-out-class AUROC reaches MIN_CHOSEN_AUROC; the output is
    # left out.
    assert "out" not in choice.layers and len(choice.layers) >= 2
    assert choice.layers[0] == "input" and choice.layer_pooling()["input"] == "grid"
    for block in ({"conv", "act"}, {"fc", "relu"}, {"pool"}):
        picked = block & set(choice.layers)
        top = min(block, key=lambda n: rows[n]["rank"])
        assert picked <= {top}
        assert bool(picked) == (rows[top]["auroc"] >= layer_choice.MIN_CHOSEN_AUROC), rows[top]
