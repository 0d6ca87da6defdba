"""Bench: the box monitor at production size (issue 40): fit time, peak memory, artifact
size and scoring rate from 10 to 1,000 classes, 128 to 2,048 features, 10^4 to 10^6 rows,
how they grow, and the monitor's cost beside a ResNet-18-size model call.

Synthetic activations, one generator for every cell (classes C, features d, rows n; numpy's
``default_rng([SEED, C, d, n])``, drawn in blocks of 8,192 rows):

* class centres ``mu_c ~ N(0, I_d)`` (float32), c = 0 .. C-1;
* row i has class ``y_i = i mod C`` (rows shuffled) and activation
  ``x_i = max(0, mu_{y_i} + e_i)``, ``e_i ~ N(0, I_d)``: one Gaussian cloud per class after
  a ReLU (the penultimate layer of a classifier);
* logits from a linear read-out plus noise: ``z_i = x_i M^T / sqrt(d) + s u_i`` with
  ``M = (mu_0 .. mu_{C-1})``, ``u_i ~ N(0, I_C)`` and ``s = 0.35 sqrt(d / (2 ln C))``
  (the noise grows with the margin, about sqrt(d), and shrinks with the number of
  competing classes, so that 3-18% of the predictions ``argmax z_i`` are wrong in every
  cell); the label is ``y_i``.

The first ``SCORED`` rows are scored, the others fit a ``BoxMonitor`` with its defaults
(tau from the coverage search, 20% of the rows held out to calibrate, the logits given),
memory-mapped from .npy files the bench writes first, once with ``n_jobs=1`` and once with
``n_jobs=-1`` (every core; ``--n-jobs`` sets the list, the first value for the growth
series and the scoring). Each cell runs in a fresh process; its peak RSS is that process's
``VmHWM`` (which counts the mapped pages it holds) plus the peaks of its joblib workers (an
upper bound: they need not peak together; each holds its own Python, numpy and
scikit-learn). Per cell:
fit seconds, peak RSS against the issue's targets, box count and artifact size (the box
members' canonical JSON and .npz bytes), and the scoring rate: ``BoxRuntime.explain``
(verdicts, scores, reasons: what the agent runs) at batch 256 on one thread, the best of 3
passes over the scored rows, the runtime loaded from the members as the agent loads it.

Growth: the exponent of a least-squares line through log(fit seconds) against log(rows),
classes fixed (the ``rows`` series), and against log(classes), rows per class fixed (the
``classes`` series); the scoring cost per input against classes in that series too.

Cost: a ResNet-18-size network (``torch.nn``: 4 stages of 2 basic blocks, 64-512 channels,
global average pooling, a 1,000-class head; torchvision is not installed), randomly
initialised, on 64-px 3-channel inputs. Its inputs are 1,000 class prototypes (one random
image each) plus noise; its head is set to the unit mean penultimate features of each
class's images (scaled by 10), so it predicts classes; exported to ONNX and run through the
agent's ``OnnxTap`` (logits and the penultimate 512 features in one call, one thread). A
monitor is fitted on ``COST_PER_CLASS`` images per class; the model call and the monitor
(``BoxRuntime.explain`` of the penultimate layer, with the logits) are timed on the same
batches of 256, median of 5, in one run.

``--before PYTHON`` runs cells (``--before-cells``, default those of 1,000 classes) a second
time with another checkout's interpreter (its own ``boxwatch``), on the same data, stopped
past ``--before-limit`` seconds or ``--before-memory`` GB of RSS; the table shows both.

Run: ``.venv/bin/python bench/scale.py [--quick] [--cells a,b] [--n-jobs 1,-1] [--before
PYTHON]`` (the full run takes about half an hour on 2 cores). Writes its table to
bench/RESULTS.md under "## scale".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _results import machine_line, run_summary, write_section

SEED = 0
SCORED = 4096
BATCH = 256
BLOCK_ROWS = 8192
NOISE = 0.35
HEADING = "## scale (bench/scale.py)"
COST_PER_CLASS = 6
COST_CLASSES = 1000
COST_SIZE = 64


@dataclass(frozen=True)
class Cell:
    """One problem: classes x features x training rows (the scored rows come on top)."""

    classes: int
    features: int
    rows: int

    @property
    def name(self) -> str:
        return f"{self.classes}x{self.features}x{self.rows}"

    @property
    def activations_gb(self) -> float:
        return self.rows * self.features * 4 / 1e9

    def rss_target_gb(self) -> float | None:
        """The issue's peak-RSS target for this cell, None where it sets none."""
        if (self.classes, self.features, self.rows) == (1000, 512, 50_000):
            return 1.0
        if (self.classes, self.features, self.rows) == (1000, 2048, 200_000):
            return 2 * self.activations_gb + 1
        return None

    def fit_target_s(self) -> float | None:
        if (self.classes, self.features, self.rows) == (1000, 512, 50_000):
            return 60.0
        if (self.classes, self.features, self.rows) == (1000, 2048, 200_000):
            return 600.0
        return None


def parse_cell(text: str) -> Cell:
    """``CxDxN`` (N may be written 5e4)."""
    c, d, n = text.lower().split("x")
    return Cell(int(c), int(d), int(float(n)))


CELLS = [
    Cell(10, 128, 10_000),
    Cell(100, 512, 100_000),
    Cell(1000, 512, 50_000),
    Cell(1000, 2048, 200_000),
    Cell(10, 128, 1_000_000),
]
ROWS_SERIES = [Cell(100, 256, n) for n in (20_000, 40_000, 80_000, 160_000)]
CLASSES_SERIES = [Cell(c, 256, 100 * c) for c in (125, 250, 500, 1000)]
QUICK_CELLS = [Cell(10, 128, 10_000), Cell(300, 256, 15_000)]
QUICK_ROWS = [Cell(50, 128, n) for n in (5_000, 10_000, 20_000)]
QUICK_CLASSES = [Cell(c, 128, 50 * c) for c in (50, 100, 200)]


def generate(cell: Cell, folder: Path) -> Path:
    """Write the cell's rows (scored rows first) as .npy files in ``folder`` (the generator
    of the module docstring); returns the folder. Files already there are kept."""
    out = folder / cell.name
    if (out / "done").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    c, d, total = cell.classes, cell.features, cell.rows + SCORED
    rng = np.random.default_rng([SEED, c, d, cell.rows])
    centres = rng.standard_normal((c, d), dtype=np.float32)
    readout = centres.T / np.float32(math.sqrt(d))
    noise = np.float32(NOISE * math.sqrt(d / (2 * math.log(c))))
    y = rng.permutation(np.arange(total) % c)
    x = np.lib.format.open_memmap(out / "x.npy", "w+", np.float32, (total, d))
    z = np.lib.format.open_memmap(out / "logits.npy", "w+", np.float32, (total, c))
    for s in range(0, total, BLOCK_ROWS):
        e = min(s + BLOCK_ROWS, total)
        block = centres[y[s:e]] + rng.standard_normal((e - s, d), dtype=np.float32)
        np.maximum(block, 0, out=block)
        x[s:e] = block
        z[s:e] = block @ readout + noise * rng.standard_normal((e - s, c), dtype=np.float32)
        x.flush()
        z.flush()
    pred = np.empty(total, np.int64)
    for s in range(0, total, BLOCK_ROWS):
        pred[s : s + BLOCK_ROWS] = np.asarray(z[s : s + BLOCK_ROWS]).argmax(axis=1)
    del x, z
    np.save(out / "y.npy", y.astype(np.int64))
    np.save(out / "pred.npy", pred)
    (out / "done").write_text("")
    return out


def peak_rss_gb(pid: int | str = "self") -> float:
    """Peak resident memory of process ``pid`` in GB (``VmHWM``: a new program starts
    afresh); 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return 0.0


def workers_peak_gb() -> float:
    """The summed peaks of this process's child processes (joblib's workers, which stay
    until the process ends): with ``n_jobs`` above 1 they hold the jobs' rows."""
    me, total = str(os.getpid()), 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if stat.rsplit(")", 1)[1].split()[1] == me:
                total += peak_rss_gb(entry.name)
    return total


def run_cell(folder: Path, n_jobs: int | None) -> dict:
    """Fit and score one cell from ``folder`` (run in its own process); figures as a dict."""
    from threadpoolctl import threadpool_limits

    from boxwatch.agent.arrays import dumps_npz
    from boxwatch.agent.artifact import canonical_json
    from boxwatch.agent.boxes import BoxRuntime
    from boxwatch.offline.monitors import BoxMonitor

    x = np.load(folder / "x.npy", mmap_mode="r")
    z = np.load(folder / "logits.npy", mmap_mode="r")
    y, pred = np.load(folder / "y.npy"), np.load(folder / "pred.npy")
    params: dict[str, Any] = {} if n_jobs is None else {"n_jobs": n_jobs}
    start = time.perf_counter()
    monitor = BoxMonitor(**params).fit(
        {"penultimate": x[SCORED:]}, y[SCORED:], pred[SCORED:], logits=z[SCORED:]
    )
    fit_s = time.perf_counter() - start
    peak = peak_rss_gb() + workers_peak_gb()
    members = monitor.to_members()
    json_member, npz_member = members.values()
    size = len(canonical_json(json_member)) + len(dumps_npz(npz_member))
    runtime = BoxRuntime.from_members(members, members)
    acts, logits, scored_pred = (
        {"penultimate": np.asarray(x[:SCORED])},
        np.asarray(z[:SCORED]),
        pred[:SCORED],
    )
    with threadpool_limits(limits=1):
        start = time.perf_counter()
        runtime.explain(
            {"penultimate": acts["penultimate"][:BATCH]}, scored_pred[:BATCH], logits=logits[:BATCH]
        )
        first_s = time.perf_counter() - start
        best = math.inf
        for _ in range(3):
            start = time.perf_counter()
            for s in range(0, SCORED, BATCH):
                runtime.explain(
                    {"penultimate": acts["penultimate"][s : s + BATCH]},
                    scored_pred[s : s + BATCH],
                    logits=logits[s : s + BATCH],
                )
            best = min(best, time.perf_counter() - start)
    return {
        "fit_s": fit_s,
        "peak_gb": peak,
        "boxes": int(sum(b.counts().sum() for b in runtime.good.values())),
        "artifact_mb": size / 1e6,
        "rate": SCORED / best,
        "first_batch_s": first_s,
        "errors": float(np.mean(y[SCORED:] != pred[SCORED:])),
    }


def child(
    cell: Cell, folder: Path, n_jobs: int | None, python: str, limit_s: float, limit_gb: float
) -> dict:
    """Run one cell in a fresh ``python`` process, stopped past ``limit_s`` seconds or
    ``limit_gb`` GB of RSS: its figures, or ``{"stopped": why}``."""
    cmd = [python, __file__, "--child", str(folder)]
    if n_jobs is not None:
        cmd += ["--n-jobs", str(n_jobs)]
    env = {**os.environ, "PYTHONPATH": ""}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stopped: list[str] = []
    done = threading.Event()

    def watch() -> None:
        start = time.monotonic()
        while not done.wait(1.0):
            rss = _rss_gb(proc.pid)
            if rss > limit_gb:
                stopped.append(
                    f"stopped at {rss:.1f} GB RSS after {time.monotonic() - start:.0f} s"
                )
            elif time.monotonic() - start > limit_s:
                stopped.append(f"stopped after {limit_s:.0f} s")
            if stopped:
                proc.kill()
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    done.set()
    watcher.join()
    if stopped:
        return {"stopped": stopped[0]}
    if proc.returncode != 0:
        return {
            "stopped": f"failed ({err.strip().splitlines()[-1] if err.strip() else proc.returncode})"
        }
    return json.loads(out.strip().splitlines()[-1])


def _rss_gb(pid: int) -> float:
    """Resident memory of process ``pid`` and its children in GB (0 once it has exited)."""
    total = 0.0
    pids = [pid]
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids += [int(k) for k in kids]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024 / 1e9
        except OSError:
            pass
    return total


def exponent(sizes: list[float], seconds: list[float]) -> float:
    """Slope of log(seconds) against log(sizes), least squares."""
    return float(np.polyfit(np.log(sizes), np.log(seconds), 1)[0])


def resnet18(n_classes: int):
    """A ResNet-18-size network (basic blocks [2, 2, 2, 2], 64-512 channels) in torch.nn."""
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU()
            self.down = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + self.down(x))

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, 64, 7, 2, 3, bias=False),
                nn.BatchNorm2d(64),
                nn.ReLU(),
                nn.MaxPool2d(3, 2, 1),
            )
            widths = [(64, 64, 1), (64, 128, 2), (128, 256, 2), (256, 512, 2)]
            self.stages = nn.Sequential(
                *[nn.Sequential(Block(a, b, s), Block(b, b, 1)) for a, b, s in widths]
            )
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.flat = nn.Flatten()
            self.fc = nn.Linear(512, n_classes)

        def features(self, x):
            return self.flat(self.pool(self.stages(self.stem(x))))

        def forward(self, x):
            return self.fc(self.features(x))

    return ResNet18()


def cost(folder: Path, quick: bool) -> dict:
    """The ResNet-18-size model call against the monitor's cost, per batch of 256."""
    import torch
    from onnx_export import export_onnx
    from threadpoolctl import threadpool_limits

    from boxwatch.agent.taps import OnnxTap
    from boxwatch.offline.monitors import BoxMonitor

    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    rng = np.random.default_rng([SEED, 18])
    per_class = 3 if quick else COST_PER_CLASS
    shape = (3, COST_SIZE, COST_SIZE)
    protos = rng.standard_normal((COST_CLASSES, *shape), dtype=np.float32)

    def images(labels: np.ndarray) -> np.ndarray:
        return protos[labels] + 0.5 * rng.standard_normal((len(labels), *shape), dtype=np.float32)

    model = resnet18(COST_CLASSES).eval()
    y = np.repeat(np.arange(COST_CLASSES), per_class)
    train = images(y)
    with torch.no_grad():
        feats = np.concatenate(
            [
                model.features(torch.from_numpy(train[s : s + 500])).numpy()
                for s in range(0, len(train), 500)
            ]
        )
        means = np.stack([feats[y == c].mean(axis=0) for c in range(COST_CLASSES)])
        model.fc.weight.copy_(
            torch.from_numpy(10 * means / np.linalg.norm(means, axis=1, keepdims=True))
        )
        model.fc.bias.zero_()
        logits = model.fc(torch.from_numpy(feats)).numpy()
    pred = logits.argmax(axis=1)
    path = export_onnx(model, torch.from_numpy(train[:2]), folder / "resnet18.onnx")
    tap = OnnxTap(path, ["flat"], threads=1)
    monitor = BoxMonitor().fit({"flat": feats}, y, pred, logits=logits)
    runtime = monitor.runtime_
    labels = rng.integers(0, COST_CLASSES, size=BATCH)
    batch = images(labels)
    model_s, monitor_s = [], []
    with threadpool_limits(limits=1):
        for _ in range(3 if quick else 5):
            start = time.perf_counter()
            out, acts = tap.run(batch)
            model_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            runtime.explain(acts, out.argmax(axis=1), logits=out)
            monitor_s.append(time.perf_counter() - start)
    return {
        "model_ms": float(np.median(model_s)) * 1e3,
        "monitor_ms": float(np.median(monitor_s)) * 1e3,
        "accuracy": float(np.mean(pred == y)),
        "boxes": int(runtime.good["flat"].counts().sum()),
        "batch_agree": float(np.mean(out.argmax(axis=1) == labels)),
    }


def fit_text(res: dict) -> str:
    """A run's fit seconds, or why it stopped."""
    return res["stopped"] if "stopped" in res else f"{res['fit_s']:.1f}"


def rss_text(res: dict) -> str:
    return "-" if "stopped" in res else f"{res['peak_gb']:.2f}"


def cell_row(cell: Cell, runs: list[dict], before: dict | None, with_before: bool) -> str:
    """One table row: the fit and peak of each ``--n-jobs`` run, the first run's figures,
    and (``with_before``) the other checkout's run or dashes."""
    first = runs[0]
    fits = " | ".join(f"{fit_text(r)} | {rss_text(r)}" for r in runs)
    if "stopped" in first:
        tail = "- | - | - | -"
    else:
        tail = (
            f"{first['errors']:.1%} | {first['boxes']:,} | {first['artifact_mb']:.1f} | "
            f"{first['rate']:,.0f}"
        )
    prior = " | - | - | - | -" if with_before else ""
    if before is not None:
        prior = f" | {fit_text(before)} | {rss_text(before)} | " + (
            "- | -" if "stopped" in before else f"{before['boxes']:,} | {before['rate']:,.0f}"
        )
    return (
        f"| {cell.classes:,} x {cell.features:,} x {cell.rows:,} | {cell.activations_gb:.3f} | "
        f"{fits} | {tail}{prior} |"
    )


def target_lines(cells: list[Cell], runs: dict[Cell, list[dict]], jobs: list[int]) -> list[str]:
    """The issue's fit and memory targets, met or not, per cell that has them."""
    out = []
    for cell in cells:
        fit_max, rss_max = cell.fit_target_s(), cell.rss_target_gb()
        if fit_max is None or rss_max is None:
            continue
        parts = []
        for j, r in zip(jobs, runs[cell], strict=True):
            if "stopped" in r:
                parts.append(f"n_jobs {j}: {r['stopped']}")
                continue
            met = r["fit_s"] <= fit_max and r["peak_gb"] <= rss_max
            parts.append(
                f"n_jobs {j}: {r['fit_s']:.0f} s, {r['peak_gb']:.2f} GB ({'met' if met else 'not met'})"
            )
        out.append(
            f"- {cell.classes:,} x {cell.features:,} x {cell.rows:,}: fit <= {fit_max:.0f} s and "
            f"peak RSS <= {rss_max:.2f} GB: " + "; ".join(parts)
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small cells and series (minutes)")
    parser.add_argument(
        "--cells",
        type=lambda s: [parse_cell(c) for c in s.split(",")],
        help="cells CxDxN, comma-separated (default: the issue's five; series still run)",
    )
    parser.add_argument("--no-series", action="store_true", help="skip the growth series")
    parser.add_argument("--no-cost", action="store_true", help="skip the ResNet-18 cost cell")
    parser.add_argument(
        "--n-jobs",
        type=lambda s: [int(j) for j in s.split(",")],
        default=None,
        help="BoxMonitor n_jobs of the cells' runs, comma-separated (default 1,-1; the first "
        "also for the series and the scoring)",
    )
    parser.add_argument("--before", help="another checkout's Python: run the cells with it too")
    parser.add_argument(
        "--before-label", help="what the --before checkout is, for the table (default: its path)"
    )
    parser.add_argument(
        "--before-cells",
        type=lambda s: [parse_cell(c) for c in s.split(",")],
        help="the cells --before runs (default: those of 1,000 classes)",
    )
    parser.add_argument(
        "--before-limit",
        type=float,
        default=1800.0,
        help="seconds before a --before run is stopped",
    )
    parser.add_argument(
        "--before-memory",
        type=float,
        default=12.0,
        help="GB of RSS at which a --before run is stopped",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where the generated data go (default: a temporary folder, removed)",
    )
    parser.add_argument(
        "--write", action="store_true", help="write bench/RESULTS.md even for --quick or --cells"
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(run_cell(args.child, args.n_jobs[0] if args.n_jobs else None)))
        return
    args.n_jobs = args.n_jobs or [1, -1]
    began = time.perf_counter()
    load_start = os.getloadavg()
    cells = args.cells or (QUICK_CELLS if args.quick else CELLS)
    rows_series = [] if args.no_series else (QUICK_ROWS if args.quick else ROWS_SERIES)
    classes_series = [] if args.no_series else (QUICK_CLASSES if args.quick else CLASSES_SERIES)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="boxwatch-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[Cell, dict] = {}
    runs: dict[Cell, list[dict]] = {}
    before: dict[Cell, dict] = {}
    try:
        for cell in dict.fromkeys([*cells, *rows_series, *classes_series]):
            folder = generate(cell, work)
            jobs = args.n_jobs if cell in cells else args.n_jobs[:1]
            runs[cell] = [child(cell, folder, j, sys.executable, math.inf, math.inf) for j in jobs]
            results[cell] = runs[cell][0]
            line = f"{cell.name}: {runs[cell]}"
            again = args.before_cells or [c for c in cells if c.classes >= 1000]
            if args.before and cell in cells and cell in again:
                before[cell] = child(
                    cell, folder, None, args.before, args.before_limit, args.before_memory
                )
                line += f"; before: {before[cell]}"
            print(line, flush=True)
            if args.workdir is None and cell not in (*rows_series, *classes_series):
                shutil.rmtree(folder)
        spent = None if args.no_cost else cost(work, args.quick)
        if spent:
            print(f"cost: {spent}", flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    lines = [
        machine_line(
            f"{run_summary(began)}; 1-min load average at the start {load_start[0]:.1f}; "
            f"n_jobs {','.join(map(str, args.n_jobs))}" + ("; --quick" if args.quick else "")
        ),
        "",
        "Generator, measures and cells: the docstring of bench/scale.py. Fit: `BoxMonitor` defaults "
        "(coverage tau, 20% held out to calibrate, logits given) on memory-mapped activations, one "
        "process per cell; peak RSS: the fitting process's plus its joblib workers' peaks; "
        "scoring: `BoxRuntime.explain` at batch 256, one thread, the runtime loaded from the "
        "artifact members."
        + (f" Before: {args.before_label or args.before}, on the same data." if before else ""),
        "",
        "| classes x features x rows | activations (GB) | "
        + "".join(f"fit, n_jobs {j} (s) | peak RSS, n_jobs {j} (GB) | " for j in args.n_jobs)
        + "model errors | boxes | artifact (MB) | scoring (inputs/s) |"
        + (
            " before: fit (s) | before: peak RSS (GB) | before: boxes | before: scoring (inputs/s) |"
            if before
            else ""
        ),
        "|---|---|"
        + "---|---|" * len(args.n_jobs)
        + "---|---|---|---|"
        + ("---|---|---|---|" if before else ""),
    ]
    lines += [cell_row(c, runs[c], before.get(c), bool(before)) for c in cells]
    lines.append("")
    lines += target_lines(cells, runs, args.n_jobs)
    for title, series, size in (
        ("rows, classes fixed", rows_series, lambda c: c.rows),
        ("classes, rows per class fixed", classes_series, lambda c: c.classes),
    ):
        ok = [c for c in series if "stopped" not in results[c]]
        if len(ok) < 2:
            continue
        fit = exponent([size(c) for c in ok], [results[c]["fit_s"] for c in ok])
        points = ", ".join(f"{c.name} {results[c]['fit_s']:.1f} s" for c in ok)
        lines.append(f"- fit time against {title}: exponent {fit:.2f} (target <= 1.1; {points})")
        if size(ok[0]) == ok[0].classes:
            per_input = [1 / results[c]["rate"] for c in ok]
            score = exponent([c.classes for c in ok], per_input)
            lines.append(
                f"- scoring cost per input against classes: exponent {score:.2f} (sub-linear: < 1; "
                + ", ".join(f"{c.classes} classes {results[c]['rate']:,.0f}/s" for c in ok)
                + ")"
            )
    if spent:
        lines += [
            f"- cost: ResNet-18-size model (random init, 64-px inputs, 1,000 classes; accuracy on its "
            f"{COST_PER_CLASS if not args.quick else 3} fitting images per class {spent['accuracy']:.0%}) "
            f"through OnnxTap, batch 256, one thread: model call {spent['model_ms']:.1f} ms, monitor "
            f"(BoxRuntime.explain of the 512 penultimate features, {spent['boxes']:,} boxes) "
            f"{spent['monitor_ms']:.2f} ms = {spent['monitor_ms'] / spent['model_ms']:.2%} of the model call "
            "(target <= 10%)",
        ]
    text = "\n".join(lines)
    print(text)
    if args.write or not (args.quick or args.cells):
        write_section(HEADING, text)


if __name__ == "__main__":
    main()
