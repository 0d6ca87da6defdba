"""Bench: the closed loop (issue 41): captures -> labels -> refit -> the child's verdicts.

Per *cell* (data set, held-out classes, architecture, seed, shift; all fixed before any
figure of this bench was looked at) a model of ``bench/detection.py``'s suite (the same
cached weights) is built into a signed artifact by the real build pipeline from a config
with the required keys only (``layers: auto``, every monitor parameter at its default). A
*stream* of the shifted test data then runs through the parent's runtime (the agent's
verdict code, :meth:`MonitorRuntime.run_model`): its first half is the *capture half*
(every input not accepted is captured, as ``topics.capture`` would), its second half the
*fresh half* the parent and child are measured on. A simulated reviewer labels a random
sample of at most ``LABELS`` captures with the truth (``correct``, ``wrong: <class>``,
``unknown`` for the held-out classes); :func:`boxwatch.offline.refit.refit.refit` makes the
child from the parent, the build config and the labelled captures.

Shifts:

* ``writers``: MNIST, calibrated on the training pool's holdout (the writers of the training
  digits), streamed from t10k (other writers) unchanged;
* ``noise``: Gaussian noise of standard deviation ``NOISE`` added to every streamed input
  (images clipped to [0, 1]); validation is the unshifted first half of the test set;
* ``rotate``: every streamed image rotated by ``ROTATE`` degrees (bilinear).

Measured on the fresh half, parent against child: the correct known inputs accepted (target:
within 1 point of ``target_acceptance``), the misclassified known inputs accepted, the near
unknowns (the held-out classes) and the far unknowns (the other image set, or MNIST-1D's
noise signals) accepted (target: at most 1 point above the parent's). And the bound on
what recalibration can do: the near and far unknowns accepted when the threshold is set on
the fresh half itself to accept the target share of its correct known inputs, for the
parent's boxes and the child's: set on the very inputs it is measured on, no threshold on
those boxes reaches the target with fewer unknowns accepted.

New class: the same stream with one held-out class arriving only in its second half of time
(the other held-out class left out); :func:`boxwatch.offline.refit.capture_report.capture_report`
on its captures must flag a new kind holding at least 90% of that class's captures. The
share of the other captures (the known inputs) that ride in new-kind clusters is reported
beside it: a report that flagged everything would meet the target.

Refit time: one class refitted against the full build's monitor fitting time (target: <= 10%).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import detection  # the suite's data, splits and cached models
import numpy as np
import yaml
from _results import machine_line, run_summary, write_section

from boxwatch.agent.artifact import write_artifact
from boxwatch.agent.boxes import ACCEPT, VERDICT_NAMES
from boxwatch.agent.keys import generate_keypair, load_private_key
from boxwatch.agent.runtime import MonitorRuntime, load_runtime
from boxwatch.offline.refit.feedback import (
    CORRECT,
    NEW,
    UNKNOWN,
    WRONG,
    Captures,
    Label,
    join,
)
from boxwatch.offline.release.config import load_config
from boxwatch.offline.release.pipeline import build, prepare

LABELS = 200  # captures a reviewer labels per cell (the budget)
NOISE = 0.1  # standard deviation of the noise shift (images in [0, 1])
ROTATE = 10.0  # degrees of the rotation shift
STREAM_SEED = 41  # the streams' order and the reviewer's sample
TARGET = 0.95
T0 = 1_700_000_000
STREAM_FACTOR_MAX = 4.0  # at_target_on_stream: the threshold searched within 1/4 to 4 times
STREAM_BISECTIONS = 16

NEW_LABELS = 50  # captures of the new-class stream a reviewer labels (the labelled report)
# (data set, held-out classes, architecture, seed, shift): chosen before any figure. Rounds:
# the first five cells were run first; the next four were added after that run; the next
# four after the capture report's fringes and growth changes; the next five with the labels'
# mixed-cluster rule (MIXED_SHARE), the next five with the false-flag measure, the last five
# (seed-2 models, unseen by this work) with no rule changed, each round chosen before
# anything ran on it.
CELLS = (
    ("mnist", (0, 2), "cnn", 0, "writers"),
    ("mnist", (1, 8), "mlp", 1, "writers"),
    ("fashion", (1, 5), "cnn", 0, "noise"),
    ("fashion", (2, 4), "mlp", 1, "rotate"),
    ("mnist1d", (1, 5), "cnn1d", 0, "noise"),
    ("mnist", (4, 9), "cnn", 1, "writers"),
    ("mnist", (2, 5), "resnet", 0, "writers"),
    ("fashion", (3, 4), "cnn", 1, "noise"),
    ("mnist1d", (2, 3), "cnn1d", 1, "noise"),
    ("mnist", (1, 4, 7), "cnn", 0, "writers"),
    ("mnist", (1, 8), "cnn", 1, "writers"),
    ("fashion", (0, 1, 6), "cnn", 0, "noise"),
    ("mnist1d", (4, 9), "cnn1d", 0, "noise"),
    ("fashion", (2, 6), "resnet", 0, "rotate"),
    ("mnist1d", (3, 4), "cnn1d", 1, "noise"),
    ("fashion", (2, 6), "cnn", 1, "noise"),
    ("mnist", (4, 9), "resnet", 1, "writers"),
    ("mnist1d", (0, 1, 9), "cnn1d", 0, "noise"),
    ("mnist", (0, 2), "resnet", 1, "writers"),
    ("mnist1d", (0, 1, 9), "cnn1d", 1, "noise"),
    ("fashion", (1, 5), "resnet", 1, "noise"),
    ("mnist", (1, 4, 7), "resnet", 0, "writers"),
    ("mnist1d", (3, 4), "cnn1d", 0, "noise"),
    ("mnist", (2, 5), "cnn", 2, "writers"),
    ("fashion", (3, 4), "resnet", 2, "noise"),
    ("fashion", (0, 1, 6), "cnn", 2, "rotate"),
    ("mnist1d", (2, 3), "cnn1d", 2, "noise"),
    ("mnist", (1, 8), "resnet", 2, "writers"),
)
# CELLS[:5] round 1, CELLS[5:9] round 2, CELLS[9:13] round 3, CELLS[13:18] round 4,
# CELLS[18:23] round 5, the rest round 6
ROUNDS = (5, 9, 13, 18, 23)


@dataclass
class Stream:
    """Inputs of a stream in time order, their labels (-1: unknown) and timestamps."""

    x: np.ndarray
    y: np.ndarray  # the class index among the known classes, -1 for a held-out class
    t_ms: np.ndarray


def shifted(x: np.ndarray, shift: str, rng: np.random.Generator) -> np.ndarray:
    """``x`` under the cell's shift (``writers``: unchanged, the data already differ)."""
    if shift == "noise":
        out = x + rng.normal(0.0, NOISE * (1.0 if x.ndim == 4 else float(x.std())), x.shape)
        return (np.clip(out, 0, 1) if x.ndim == 4 else out).astype(np.float32)
    if shift == "rotate":
        from scipy.ndimage import rotate

        return np.clip(rotate(x, ROTATE, axes=(2, 3), reshape=False, order=1), 0, 1).astype(
            np.float32
        )
    return x


def write_npz(path: Path, x: np.ndarray, y: np.ndarray | None = None) -> dict[str, str]:
    """Save a data set as the build reads it; its config entry."""
    if y is None:
        np.savez(path, x=x)
    else:
        np.savez(path, x=x, y=y)
    return {"path": str(path)}


def build_parent(
    work: Path, onnx: Path, classes: list[str], shape: tuple[int, ...], sets: dict
) -> tuple[Path, Path, Path, float, float]:
    """Config with the required keys only, the signed parent; (artifact, config, public key,
    build seconds, monitor-fitting seconds)."""
    data = {name: write_npz(work / f"{name}.npz", *arrays) for name, arrays in sets.items()}
    cfg = {
        "version": 1,
        "metadata": {"name": work.name, "model_version": work.name},
        "model": {
            "path": str(onnx),
            "format": "onnx",
            "input_name": "input",
            "preprocessing": {"shape": list(shape), "dtype": "float32"},
        },
        "classes": classes,
        "data": data,
    }
    config = work / "build.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    private, public = work / "release.key", work / "release.pub"
    generate_keypair(private, public, force=True)
    start = time.perf_counter()
    outcome = build(prepare(load_config(config)), load_private_key(private), created_at=T0)
    seconds = time.perf_counter() - start
    artifact = work / "parent.bwa"
    write_artifact(artifact, outcome.artifact)
    timings = outcome.summary.to_dict().get("timings", {})
    return artifact, config, public, seconds, float(timings.get("monitors", float("nan")))


def run(runtime: MonitorRuntime, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[str], list]:
    """Emitted verdicts, predicted classes, reasons and reason layers of ``x``, batch by batch
    as the agent runs them."""
    v, p, why, where = [], [], [], []
    for s in range(0, len(x), 256):
        r = runtime.run_model(x[s : s + 256].reshape(len(x[s : s + 256]), -1))
        v.append(np.asarray(r.verdicts))
        p.append(np.asarray(r.predicted))
        assert r.reasons is not None
        why += list(r.reasons.names())
        where += r.reasons.layers()
    return np.concatenate(v), np.concatenate(p), why, where


def verdicts_of(runtime: MonitorRuntime, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The emitted verdicts and predicted classes of ``x``."""
    v, p, _why, _where = run(runtime, x)
    return v, p


def shares(runtime: MonitorRuntime, s: Stream, far: np.ndarray) -> dict[str, float]:
    """Accepted shares (%) on a stream: correct known, misclassified known, near, far."""
    v, p = verdicts_of(runtime, s.x)
    acc = v == ACCEPT
    known = s.y >= 0
    right = known & (p == s.y)
    wrong = known & (p != s.y)
    vf, _ = verdicts_of(runtime, far)
    return {
        "correct": 100 * float(acc[right].mean()),
        "misclassified": 100 * float(acc[wrong].mean()) if wrong.any() else float("nan"),
        "near": 100 * float(acc[~known].mean()),
        "far": 100 * float((vf == ACCEPT).mean()),
    }


def at_target_on_stream(runtime: MonitorRuntime, s: Stream, far: np.ndarray) -> dict[str, float]:
    """:func:`shares` with the box score's threshold set on the stream itself, so that it
    accepts ``TARGET`` of the stream's correct known inputs (a factor of the calibrated
    threshold, by bisection): the best a recalibration of the threshold alone could do.
    NaN shares where even ``STREAM_FACTOR_MAX`` times the threshold accepts fewer (what is
    left are uncertainty verdicts)."""
    boxes = runtime.boxes
    assert boxes is not None and boxes.threshold is not None
    calibrated = boxes.threshold
    _v, predicted = verdicts_of(runtime, s.x)
    right = s.x[(s.y >= 0) & (predicted == s.y)]  # the threshold moves no prediction

    def short(factor: float) -> bool:
        boxes.threshold = calibrated * factor
        return float(np.mean(verdicts_of(runtime, right)[0] == ACCEPT)) < TARGET

    lo, hi = 1.0 / STREAM_FACTOR_MAX, STREAM_FACTOR_MAX
    try:
        if short(hi):
            return {k: float("nan") for k in ("correct", "misclassified", "near", "far")}
        for _ in range(STREAM_BISECTIONS):
            mid = (lo * hi) ** 0.5
            if short(mid):
                lo = mid
            else:
                hi = mid
        boxes.threshold = calibrated * hi
        return shares(runtime, s, far)
    finally:
        boxes.threshold = calibrated


def captured(runtime: MonitorRuntime, s: Stream, prefix: str) -> Captures:
    """What ``topics.capture`` receives of stream ``s``: every input not accepted."""
    v, _p, why, where = run(runtime, s.x)
    rows = np.flatnonzero(v != ACCEPT)
    return Captures(
        ids=[f"{prefix}{i}" for i in rows],
        inputs=s.x[rows],
        timestamps_ms=s.t_ms[rows].astype(np.int64),
        verdicts=[VERDICT_NAMES[int(v[i])] for i in rows],
        reasons=[str(why[i]) for i in rows],
        layers=[where[i] for i in rows],
        nearest_classes=[None] * len(rows),
    )


def review(
    caps: Captures, truth: dict[str, int], predicted: np.ndarray, classes: list[str], n: int
) -> list[Label]:
    """A reviewer's labels of a random sample of ``n`` captures: the truth, as a label."""
    rng = np.random.default_rng(STREAM_SEED)
    pick = rng.permutation(len(caps.ids))[:n]
    out = []
    for i in sorted(pick):
        rid, y = caps.ids[i], truth[caps.ids[i]]
        if y < 0:
            out.append(Label(rid, UNKNOWN))
        elif y == predicted[i]:
            out.append(Label(rid, CORRECT))
        else:
            out.append(Label(rid, WRONG, true_class=classes[y]))
    return out


@dataclass
class CellResult:
    """One cell's figures."""

    label: str
    captures: int
    labelled: int
    affected: int
    parent: dict[str, float]
    child: dict[str, float]
    refit_s: float
    build_s: float
    fit_s: float
    guards: str
    new_share: float
    new_captures: int
    verdict_of_new: str
    new_share_labelled: float
    others_flagged: float  # % of the other captures (known inputs) in new-kind clusters
    others_flagged_labelled: float
    one_class_s: float  # a refit of the most captured class alone
    one_class_fit_s: float  # of which the clustering
    one_class_labels: int
    parent_on_stream: dict[str, float]  # at_target_on_stream
    child_on_stream: dict[str, float]


def cell_data(
    name: str, held: tuple[int, ...], shift: str, data: dict
) -> tuple[dict, Stream, Stream, np.ndarray, np.ndarray, np.ndarray]:
    """Build sets, capture half, fresh half, far unknowns, the fresh half's held-out class
    mask (``held[0]`` only) and the known classes."""
    x_pool, y_pool, x_test, y_test = data[name]
    known = np.array([c for c in range(10) if c not in held])
    remap = np.full(10, -1)
    remap[known] = np.arange(len(known))
    tr, ho = detection.split(y_pool, known)
    val_half, test_half = detection.test_halves(len(y_test))
    is_known = np.isin(y_test, known)
    rng = np.random.default_rng(STREAM_SEED)
    if shift == "writers":
        validation = (x_pool[ho], remap[y_pool[ho]])
        unknown = x_pool[~np.isin(y_pool, known)][:2000]
        rows = rng.permutation(len(y_test))
    else:
        validation = (x_test[val_half & is_known], remap[y_test[val_half & is_known]])
        unknown = x_test[val_half & ~is_known]
        rows = rng.permutation(np.flatnonzero(test_half))
    sets = {
        "train": (x_pool[tr], remap[y_pool[tr]]),
        "validation": validation,
        "unknown": (unknown,),
    }
    x_stream = shifted(x_test[rows], shift, rng)
    y_stream = remap[y_test[rows]]
    half = len(rows) // 2
    t = np.arange(len(rows), dtype=np.int64) * 10 + T0 * 1000
    first = Stream(x_stream[:half], y_stream[:half], t[:half])
    fresh = Stream(x_stream[half:], y_stream[half:], t[half:])
    far_kinds = detection.far_sets(name, data, fresh.x[fresh.y >= 0])
    far = np.concatenate(list(far_kinds.values()))
    newcomer = y_test[rows][half:] == held[0]
    return sets, first, fresh, far, newcomer, known


def run_cell(
    name: str, held: tuple[int, ...], arch: str, seed: int, shift: str, data: dict, work: Path
) -> CellResult:
    """Parent build, capture, review, refit, measure; the new-class report."""
    from boxwatch.offline.refit.capture_report import CaptureReport, capture_report
    from boxwatch.offline.refit.refit import RefitGuardError, refit

    label = f"{name} {''.join(map(str, held))} {arch} s{seed} {shift}"
    work.mkdir(parents=True, exist_ok=True)
    sets, first, fresh, far, newcomer, known = cell_data(name, held, shift, data)
    key = detection.model_key(name, "wo" + "".join(map(str, held)), arch, seed)
    x_train, y_train = sets["train"]
    onnx, _weights = detection.train(
        x_train, y_train, len(known), arch, seed, key, detection.epochs_of(name, arch)
    )
    classes = [str(c) for c in known]
    parent, config, public, build_s, fit_s = build_parent(
        work, onnx, classes, first.x.shape[1:], sets
    )
    runtime = load_runtime(parent, [str(public)], model_path=onnx)
    caps = captured(runtime, first, "c")
    truth = dict(zip([f"c{i}" for i in range(len(first.y))], first.y.tolist(), strict=True))
    _v, predicted = verdicts_of(runtime, caps.inputs)
    labels = review(caps, truth, predicted, classes, LABELS)
    labelled = join(caps, labels, classes, predicted)
    child = work / "child.bwa"
    start = time.perf_counter()
    try:
        summary = refit(
            parent,
            [str(public)],
            config,
            labelled,
            private_key=work / "release.key",
            out=child,
            created_at=T0 + 100,
        )
        guards = "passed"
    except RefitGuardError as exc:
        summary = exc.summary
        guards = "failed: " + "; ".join(g.failure() for g in summary.failed)
    refit_s = time.perf_counter() - start
    # One class: the labels of the class most labelled known captures are predicted as.
    known_rows = np.flatnonzero(labelled.y_true >= 0)
    top = int(np.bincount(labelled.y_pred[known_rows]).argmax())
    one = [labelled.labels[i] for i in known_rows if labelled.y_pred[i] == top]
    start = time.perf_counter()
    one_summary = refit(
        parent,
        [str(public)],
        config,
        join(caps, one, classes, predicted),
        private_key=work / "release.key",
        out=work / "child-one-class.bwa",
        created_at=T0 + 200,
        allow_guard_failure=True,
    )
    one_s = time.perf_counter() - start
    before = shares(runtime, fresh, far)
    child_rt = load_runtime(child, [str(public)], model_path=onnx) if child.is_file() else None
    nothing = {k: float("nan") for k in before}
    after = shares(child_rt, fresh, far) if child_rt is not None else nothing
    parent_on_stream = at_target_on_stream(runtime, fresh, far)
    child_on_stream = at_target_on_stream(child_rt, fresh, far) if child_rt is not None else nothing
    # New class: the fresh half's known inputs throughout, held[0] only in its second half.
    n = len(fresh.y)
    keep = (fresh.y >= 0) | (newcomer & (np.arange(n) >= n // 2))
    new_stream = Stream(fresh.x[keep], fresh.y[keep], fresh.t_ms[keep])
    is_new = newcomer[keep]
    new_caps = captured(runtime, new_stream, "n")
    report = capture_report(runtime, new_caps, out_dir=work / "capture-report")
    new_ids = [f"n{i}" for i in np.flatnonzero(is_new)]
    caught = [i for i in new_ids if i in set(new_caps.ids)]

    def flagged_share(r: CaptureReport, of: list[str] = caught) -> float:
        flagged = {i for c in r.new_kinds for i in c.member_ids}
        return 100 * sum(i in flagged for i in of) / max(1, len(of))

    others = sorted(set(new_caps.ids) - set(caught))

    verdicts = sorted({c.verdict for c in report.clusters if set(c.member_ids) & set(caught)})
    # The same captures with a reviewer's labels of NEW_LABELS of them (the new class: new).
    new_truth = {f"n{i}": (-1 if is_new[i] else int(y)) for i, y in enumerate(new_stream.y)}
    _v, new_pred = verdicts_of(runtime, new_caps.inputs)
    new_labels = [
        Label(lab.id, NEW, tag="newcomer") if lab.kind == UNKNOWN else lab
        for lab in review(new_caps, new_truth, new_pred, classes, NEW_LABELS)
    ]
    labelled_report = capture_report(
        runtime,
        new_caps,
        labelled=join(new_caps, new_labels, classes, new_pred),
        out_dir=work / "capture-report-labelled",
    )
    return CellResult(
        label,
        len(caps.ids),
        len(labelled.labels),
        len(summary.classes),
        before,
        after,
        refit_s,
        build_s,
        fit_s,
        guards,
        flagged_share(report),
        len(caught),
        ", ".join(verdicts) or "-",
        flagged_share(labelled_report),
        flagged_share(report, others),
        flagged_share(labelled_report, others),
        one_s,
        float(one_summary.seconds.get("fit", float("nan"))),
        len(one),
        parent_on_stream,
        child_on_stream,
    )


def table(results: list[CellResult]) -> list[str]:
    """The results table and the targets, met or not."""

    def f(v: float) -> str:
        return "-" if v != v else f"{v:.1f}"

    lines = [
        "| cell | captures (labelled) | classes refitted | correct known accepted: parent -> child "
        "| misclassified accepted | near accepted | far accepted | guards | refit s "
        "| build s (monitors s) | new class: captures, % in flagged clusters (their verdicts) "
        f"| % flagged with {NEW_LABELS} labels | other captures flagged: %, with {NEW_LABELS} "
        "labels | one class refitted: s (clustering s), labels "
        "| one class / build's monitor stage "
        f"| threshold set on the fresh half for {100 * TARGET:.0f}%: near; far, parent / child |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        p, c = r.parent, r.child
        lines.append(
            f"| {r.label} | {r.captures} ({r.labelled}) | {r.affected} "
            f"| {f(p['correct'])} -> {f(c['correct'])} "
            f"| {f(p['misclassified'])} -> {f(c['misclassified'])} "
            f"| {f(p['near'])} -> {f(c['near'])} | {f(p['far'])} -> {f(c['far'])} "
            f"| {r.guards} | {r.refit_s:.1f} | {r.build_s:.0f} ({r.fit_s:.0f}) "
            f"| {r.new_captures}, {r.new_share:.0f}% ({r.verdict_of_new}) "
            f"| {r.new_share_labelled:.0f}% "
            f"| {r.others_flagged:.0f}%, {r.others_flagged_labelled:.0f}% "
            f"| {r.one_class_s:.1f} ({r.one_class_fit_s:.2f}), "
            f"{r.one_class_labels} | {r.one_class_s / r.fit_s:.0%} "
            f"| {f(r.parent_on_stream['near'])}; {f(r.parent_on_stream['far'])} / "
            f"{f(r.child_on_stream['near'])}; {f(r.child_on_stream['far'])} |"
        )
    lines.append("")
    for r in results:
        p, c = r.parent, r.child
        new = (
            f"new class >= 90% flagged: {'met' if r.new_share >= 90 else 'not met'} "
            f"({r.new_share:.0f}%; with {NEW_LABELS} labels: {r.new_share_labelled:.0f}%)"
        )
        on = r.child_on_stream if c["correct"] == c["correct"] else r.parent_on_stream
        bound = (
            f"a threshold set on the stream ({'child' if on is r.child_on_stream else 'parent'}"
            "): near and far at most 1 point above the parent's: "
            + (
                "cannot reach the target"
                if on["near"] != on["near"]
                else "met"
                if on["near"] <= p["near"] + 1 and on["far"] <= p["far"] + 1
                else "not met"
            )
        )
        if c["correct"] != c["correct"]:
            lines.append(f"- {r.label}: no child (a guard refused it: {r.guards}); {bound}; {new}")
            continue
        ok_correct = abs(c["correct"] - 100 * TARGET) <= 1.0
        ok_unknown = c["near"] <= p["near"] + 1 and c["far"] <= p["far"] + 1
        lines.append(
            f"- {r.label}: correct known within 1 point of {100 * TARGET:.0f}%: "
            f"{'met' if ok_correct else 'not met'} ({f(c['correct'])}); near and far at most "
            f"1 point above the parent's: {'met' if ok_unknown else 'not met'}; {bound}; {new}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, nargs="*", help="indices into CELLS (default all)")
    parser.add_argument("--work", type=Path, default=None, help="keep the artifacts here")
    parser.add_argument(
        "--write",
        action="store_true",
        help="write the table to bench/RESULTS.md even for a subset (the full run always does)",
    )
    args = parser.parse_args()
    began = time.perf_counter()
    start_load = os.getloadavg()[0]
    picked = args.cells if args.cells else list(range(len(CELLS)))
    chosen = [CELLS[i] for i in picked]
    names = {c[0] for c in chosen}
    if names & set(detection.IMAGE_SETS) and (
        not detection.DATA.is_dir() or not detection.FASHION.is_dir()
    ):
        print(f"skipped: {detection.DATA} or {detection.FASHION} not found", file=sys.stderr)
        return
    if names & set(detection.IMAGE_SETS):  # each image set's far unknowns are the other's
        names |= set(detection.IMAGE_SETS)
    data = {name: detection.load(name) for name in sorted(names)}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.work or Path(tmp)
        for index, (name, held, arch, seed, shift) in zip(picked, chosen, strict=True):
            cell = f"{name}_wo{''.join(map(str, held))}_{arch}_s{seed}_{shift}"
            r = run_cell(name, held, arch, seed, shift, data, root / cell)
            r.label += f" (round {1 + sum(index >= k for k in ROUNDS)})"
            print(r, flush=True)
            results.append(r)
    text = "\n".join(
        [
            machine_line(f"{run_summary(began)}; 1-min load average at the start {start_load:.1f}"),
            "",
            "Cells, streams, the reviewer and the measures: the docstring of "
            f"bench/closed_loop.py. Labels per cell: at most {LABELS}, drawn at random from "
            "the capture half's captures. Percentages are of the fresh half (never labelled). "
            "Rounds: cells of round 1 were run first; round 2 was added after that run; the "
            "capture report changed twice after round 2 was seen (scattered captures join "
            "their cluster's fringe; a cluster grows against the other captures, and growth "
            "flags a new kind before nearness calls a shift); round 3 was added after those "
            "changes and is the one measure of them on cells nothing was tuned on. Later, "
            "with the monitor's peak term (issue 38), the growth test was changed on the "
            "bundled example's tests, not on these cells (the others' late share capped at "
            "half, p < 0.01, 1.5 times), after all three rounds had been seen. Then "
            "labels flag a cluster a new kind from 3 unknown labels that are a tenth of its "
            "labelled captures (MIXED_SHARE), chosen on two cells of rounds 2 and 1 (fashion "
            "34, mnist1d 15), and round 4 was added with it, chosen before it ran; round 5 "
            "with the share of other captures flagged (no rule changed), chosen before it "
            "ran; round 6 (models of training seed 2, which nothing in this loop was "
            "developed on; no rule changed) chosen before it ran. The "
            "refit's children did not change after any run; its speed did once (a class's "
            "training rows found from the predictions the build stores, profiled on four "
            "cells of rounds 1 and 2: the same children byte for byte).",
            "",
            *table(results),
        ]
    )
    print(text)
    if len(picked) == len(CELLS) or args.write:
        write_section("## closed loop (bench/closed_loop.py)", text)
    else:
        print("(a subset: bench/RESULTS.md left as it is; --write writes it)", file=sys.stderr)


if __name__ == "__main__":
    main()
