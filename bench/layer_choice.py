"""Bench: which layers ``layers: auto`` picks on the detection suite's models, against other rules.

Per cell (data set, held-out pair, architecture, seed) of ``bench/detection.py``, with its
cached ONNX model and its data split: the build's layer choice
(:func:`boxwatch.offline.release.layer_choice.choose_layers`, known inputs only: the 80%
train part and the 20% holdout) ranks every candidate tap (``model.pooling: flatten``, the
build's default); then box monitors with the fused score (tau by held-out class, calibrated
on the correct holdout inputs at 95%) are fitted on up to 4,000 training inputs for the
layers of each rule, and scored on up to 3,000 known test inputs and the cell's near and
far unknowns. Reported per rule, mean over cells: the score's AUROC, correctly classified
known test inputs against near and against far unknowns (threshold-free, so rules compare
even where the calibrated verdicts miss the target), and the shares accepted.

Rules: ``auto`` (what the build monitors), ``auto+pen`` (plus the penultimate layer, the
last rankable one before the logits), ``top2+pen`` (top 2 by held-out-class AUROC plus the
penultimate layer), ``nout_top2`` (top 2, logits left out), ``pen`` (the penultimate layer
alone), ``bench`` (detection.py's hand-picked taps, conv2 flattened here).

Run: ``.venv/bin/python bench/layer_choice.py [--cache DIR] [CELL ...]`` with CELL as
``mnist:25:cnn:0``; the default cells are the 10 the rule was developed on and the 10
held out. The models come from ``bench/detection.py``'s cache (run it first, or point
``--cache`` at a folder holding ``suite_*.onnx``). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
import detection as suite
from monitors import CACHE

from boxwatch.agent.boxes import ACCEPT
from boxwatch.agent.taps import open_tap
from boxwatch.offline.monitors.estimator import BoxMonitor
from boxwatch.offline.monitors.evaluation import auroc
from boxwatch.offline.release import layer_choice

DEVELOPMENT = (
    "mnist:25:mlp:0 mnist:25:cnn:0 fashion:24:mlp:0 fashion:24:cnn:0 mnist:18:mlp:1 "
    "mnist:23:cnn:1 fashion:15:mlp:1 fashion:26:cnn:1 mnist:02:cnn:0 fashion:34:mlp:0"
).split()
HELD_OUT = (
    "mnist:02:mlp:1 mnist:18:cnn:0 mnist:23:mlp:0 mnist:25:cnn:1 fashion:15:cnn:0 "
    "fashion:26:mlp:0 fashion:34:cnn:1 fashion:24:mlp:1 mnist:18:cnn:1 fashion:15:cnn:1"
).split()
MAX_TRAIN, MAX_KNOWN = 4000, 3000


def rows_of(n: int, cap: int, seed: int = 0) -> np.ndarray:
    return np.arange(n) if n <= cap else np.sort(np.random.RandomState(seed).permutation(n)[:cap])


def run_cell(cell: str, data: dict, cache: Path) -> dict[str, dict[str, float]]:
    name, pair, arch, seed = cell.split(":")
    x_pool, y_pool, x_test, y_test = data[name]
    far_x = data["fashion" if name == "mnist" else "mnist"][2]
    far_x = far_x[np.random.default_rng(suite.SPLIT_SEED).permutation(len(far_x))[: suite.N_FAR]]
    known = np.array([c for c in range(10) if str(c) not in pair])
    remap = np.full(10, -1)
    remap[known] = np.arange(8)
    tr, ho = suite.split(y_pool, known)
    path = cache / f"suite_{name}_wo{pair}_{arch}_s{seed}.onnx"
    if not path.is_file():
        raise SystemExit(f"{path}: no such model; run bench/detection.py first or give --cache")
    infos = open_tap(path).candidates()
    start = time.perf_counter()
    with threadpool_limits(limits=1):
        choice = layer_choice.choose_layers(
            lambda names: open_tap(path, names, threads=1),
            infos,
            output="logits",
            pooling="flatten",
            preprocess=lambda v: v,
            train=(x_pool[tr], remap[y_pool[tr]]),
            validation=(x_pool[ho], remap[y_pool[ho]]),
            n_classes=8,
            params={},
        )
    seconds = time.perf_counter() - start
    ranked = sorted((c for c in choice.candidates if c["rank"]), key=lambda c: c["rank"])
    order = [c["layer"] for c in ranked]
    pen = [i.name for i in infos if i.name in order and i.name != "logits"][-1]
    rules = {
        "auto": list(choice.layers),
        "auto+pen": list(dict.fromkeys([*choice.layers, pen])),
        "top2+pen": list(dict.fromkeys([*order[:2], pen])),
        "nout_top2": [n for n in order if n != "logits"][:2],
        "pen": [pen],
        "bench": [t for t in suite.TAPS[arch].values() if t in order],
    }
    need = sorted({n for names in rules.values() for n in names})
    tap = open_tap(path, need, threads=1)
    in_test = np.isin(y_test, known)
    k_rows = np.flatnonzero(in_test)[rows_of(int(in_test.sum()), MAX_KNOWN)]
    t_rows = rows_of(len(tr), MAX_TRAIN)
    sets = {
        "train": x_pool[tr][t_rows],
        "holdout": x_pool[ho],
        "known": x_test[k_rows],
        "near": x_test[~in_test],
        "far": far_x,
    }
    acts, pred = {}, {}
    for s, x in sets.items():
        out = [tap.run(x[i : i + 1000]) for i in range(0, len(x), 1000)]
        pred[s] = np.concatenate([o[0] for o in out]).argmax(1)
        acts[s] = {n: np.concatenate([o[1][n] for o in out]) for n in need}
    y_tr, y_ho = remap[y_pool[tr]][t_rows], remap[y_pool[ho]]
    correct = pred["known"] == remap[y_test[k_rows]]
    out_rules: dict[str, dict[str, float]] = {}
    for rule, names in rules.items():
        with threadpool_limits(limits=1):
            mon = BoxMonitor(names, combine="calibrated", score="fused").fit(
                {n: acts["train"][n] for n in names},
                y_tr,
                pred["train"],
                n_classes=8,
                validation=({n: acts["holdout"][n] for n in names}, y_ho, pred["holdout"]),
            )
            ok = pred["holdout"] == y_ho
            mon.calibrate({n: acts["holdout"][n][ok] for n in names}, pred["holdout"][ok])
        sub = {s: {n: acts[s][n] for n in names} for s in ("known", "near", "far")}
        score = {s: mon.outlier_score(sub[s], pred[s]) for s in sub}
        accept = {s: mon.predict(sub[s], pred[s]).combined == ACCEPT for s in sub}
        out_rules[rule] = {
            "auroc_near": auroc(score["known"][correct], score["near"]),
            "auroc_far": auroc(score["known"][correct], score["far"]),
            "known": float(accept["known"][correct].mean()),
            "near": float(accept["near"].mean()),
            "far": float(accept["far"].mean()),
            "layers": len(names),
        }
    short = [n.split("/")[-2] if "/" in n else n for n in choice.layers]
    print(f"{cell}: auto picks {'+'.join(short)} (choice {seconds:.1f} s)", file=sys.stderr)
    return out_rules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="*", help="cells as data:pair:arch:seed")
    parser.add_argument("--cache", type=Path, default=CACHE, help="folder of suite_*.onnx")
    args = parser.parse_args()
    groups = (
        {"given": args.cells} if args.cells else {"development": DEVELOPMENT, "held out": HELD_OUT}
    )
    data = {name: suite.load(name) for name in ("mnist", "fashion")}
    load = os.getloadavg()[0]
    print(f"load average at start {load:.2f} (shared machine)")
    for group, cells in groups.items():
        results = [run_cell(cell, data, args.cache) for cell in cells]
        print(f"\n{group} ({len(cells)} cells)\n")
        print("| rule | AUROC near | AUROC far | known acc. | near acc. | far acc. | layers |")
        print("|---|---|---|---|---|---|---|")
        for rule in results[0]:
            mean = {k: np.mean([r[rule][k] for r in results]) for k in results[0][rule]}
            print(
                f"| {rule} | {mean['auroc_near']:.3f} | {mean['auroc_far']:.3f} | "
                f"{mean['known']:.1%} | {mean['near']:.1%} | {mean['far']:.1%} | "
                f"{mean['layers']:.1f} |"
            )


if __name__ == "__main__":
    main()
