"""The build's memory (issue 40): its estimate against the measured peak, with the store.

Cells: the bundled example, and synthetic builds of ``classes x features x training rows``.
A synthetic build is an ONNX MLP (input of :data:`D_IN` values, a hidden ReLU layer of
``features`` units, ``classes`` logits) over Gaussian class clouds: class c's inputs are
``N(mu_c, I)`` with ``mu_c ~ N(0, 3^2 I)``; the first layer's weights ``N(0, 1/D_IN)``; the
logits read the hidden layer out by each class's mean hidden vector (a nearest-mean
classifier, so most inputs are classified right). Validation: a quarter as many rows as
training; unknown: ``N(0, 3^2 I)`` inputs, a tenth as many. Monitored: the model's input and
the hidden layer, the monitor's defaults (15 tau candidates, held-out-class selection).

Each build runs as ``boxwatch build-artifact CONFIG --key K --out A`` in a child process;
its anonymous resident memory (``RssAnon``: what ``--max-memory`` binds, without the
store's file-backed pages) is sampled every 10 ms, its max RSS (the store's mapped pages
included) read when it ends, and the estimate is the line the build prints before it
extracts anything. ``--compare CMD`` runs the same builds with another command in place of
``python -m boxwatch`` (another checkout's, e.g. the code before the store) for the peak
before and after.

Run: ``.venv/bin/python bench/build_memory.py [--cells 10x256x20000,...] [--compare CMD]``.
Writes its table to bench/RESULTS.md under "## build_memory".
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine_line, run_summary, write_section

from boxwatch.agent.keys import generate_keypair
from boxwatch.commands.demo import write_build_config

HEADING = "## build_memory (bench/build_memory.py)"
D_IN = 32
DEFAULT_CELLS = "example,10x256x20000,100x512x20000,300x256x30000"
POLL_S = 0.01
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


@dataclass(frozen=True)
class Measured:
    """One build in a child process: its peak anonymous memory, max RSS, the estimate it
    printed (bytes; 0 where it printed none), its store's size and its wall time."""

    peak_anon: int
    max_rss: int
    estimate: int
    store: int
    seconds: float
    code: int


def mlp(folder: Path, classes: int, features: int, rows: int, seed: int = 0) -> Path:
    """The synthetic model and data sets of one cell in ``folder``; returns its config."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0, 3, size=(classes, D_IN)).astype(np.float32)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, classes, size=n)
        return (means[y] + rng.normal(size=(n, D_IN))).astype(np.float32), y.astype(np.int64)

    w1 = rng.normal(0, 1 / np.sqrt(D_IN), size=(features, D_IN)).astype(np.float32)
    b1 = np.zeros(features, np.float32)
    x_tr, y_tr = draw(rows)
    hidden = np.maximum(x_tr @ w1.T + b1, 0)
    centre = np.stack([hidden[y_tr == c].mean(axis=0) for c in range(classes)])
    w2 = centre.astype(np.float32)
    b2 = (-0.5 * (centre**2).sum(axis=1)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["input", "w1", "b1"], ["pre"], transB=1),
            helper.make_node("Relu", ["pre"], ["hidden"]),
            helper.make_node("Gemm", ["hidden", "w2", "b2"], ["logits"], transB=1),
        ],
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [None, D_IN])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, classes])],
        [
            numpy_helper.from_array(a, n)
            for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, folder / "model.onnx")
    np.savez(folder / "train.npz", x=x_tr, y=y_tr)
    x_va, y_va = draw(rows // 4)
    np.savez(folder / "validation.npz", x=x_va, y=y_va)
    far = rng.normal(0, 3, size=(rows // 10, D_IN)).astype(np.float32)
    np.savez(folder / "unknown.npz", x=far)
    config = {
        "version": 1,
        "model": {"path": "model.onnx", "preprocessing": {"shape": [D_IN]}},
        "classes": [str(c) for c in range(classes)],
        "layers": ["hidden"],
        "data": {s: {"path": f"{s}.npz"} for s in ("train", "validation", "unknown")},
        "monitor": {"random_state": 0},
    }
    path = folder / "build.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def example(folder: Path) -> Path:
    """The bundled example's config (model and BN), as ``boxwatch demo`` writes it."""
    return write_build_config(folder)


def _bytes(text: str) -> int:
    number, unit = text.split()
    return int(float(number) * _UNITS[unit])


def measure(command: list[str], config: Path, key: Path, out: Path) -> Measured:
    """Run one build; sample its anonymous memory until it ends."""
    args = [*command, "build-artifact", str(config), "--key", str(key), "--out", str(out)]
    began = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err)
        peak = 0
        while child.poll() is None:
            try:
                with open(f"/proc/{child.pid}/status") as fh:
                    for line in fh:
                        if line.startswith("RssAnon:"):
                            peak = max(peak, int(line.split()[1]) * 1024)
            except OSError:
                pass
            time.sleep(POLL_S)
        seconds = time.perf_counter() - began
        err.seek(0)
        text = err.read()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    found = re.search(r"memory: about (\S+ \S+) at peak", text)
    store = re.search(r"activation store (\S+ \S+)", text)
    if child.returncode != 0:
        print(text[-2000:], file=sys.stderr)
    return Measured(
        peak_anon=peak,
        max_rss=before,
        estimate=_bytes(found.group(1)) if found else 0,
        store=_bytes(store.group(1)) if store else 0,
        seconds=seconds,
        code=child.returncode,
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f}" if n else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", default=DEFAULT_CELLS)
    parser.add_argument("--compare", default=None, help="another command for 'before'")
    args = parser.parse_args()
    began = time.perf_counter()
    ours = [sys.executable, "-m", "boxwatch"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="build-memory-") as tmp:
        root = Path(tmp)
        key, pub = root / "k.key", root / "k.pub"
        generate_keypair(key, pub, force=True)
        for cell in args.cells.split(","):
            folder = root / cell
            folder.mkdir()
            if cell == "example":
                config = example(folder)
            else:
                k, f, n = (int(v) for v in cell.split("x"))
                config = mlp(folder, k, f, n)
            # A fresh child each time: ru_maxrss of RUSAGE_CHILDREN is the largest so far.
            after = _isolated(ours, config, key, folder / "after.bwa")
            before = (
                _isolated(shlex.split(args.compare), config, key, folder / "before.bwa")
                if args.compare
                else None
            )
            rows.append((cell, after, before))
            print(cell, after, before, flush=True)
    lines = [
        "| cell (classes x features x rows) | store MiB | estimate MiB | peak anon MiB "
        "| estimate / peak | max RSS MiB | s | before: peak anon / max RSS MiB, s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell, a, b in rows:
        ratio = f"{a.estimate / a.peak_anon:.2f}" if a.estimate and a.peak_anon else "-"
        was = f"{_mib(b.peak_anon)} / {_mib(b.max_rss)}, {b.seconds:.0f}" if b else "-"
        lines.append(
            f"| {cell} | {_mib(a.store)} | {_mib(a.estimate)} | {_mib(a.peak_anon)} | {ratio} "
            f"| {_mib(a.max_rss)} | {a.seconds:.0f} | {was} |"
        )
    text = "\n".join(
        [
            machine_line(run_summary(began)),
            "",
            "Synthetic cells: an ONNX MLP over Gaussian class clouds (the module's docstring); "
            "peak anon = the child's largest sampled RssAnon (what --max-memory binds), max "
            "RSS includes the store's mapped file pages. 'before' is --compare's command "
            f"({args.compare or 'not run'}).",
            "",
            *lines,
        ]
    )
    print(text)
    write_section(HEADING, text)


def _isolated(command: list[str], config: Path, key: Path, out: Path) -> Measured:
    """:func:`measure` in a process of its own, so that each max RSS is the build's own."""
    code = (
        f"import sys, json; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); import build_memory as b; "
        f"m = b.measure({command!r}, b.Path({str(config)!r}), b.Path({str(key)!r}), b.Path({str(out)!r})); "
        "print(json.dumps(m.__dict__))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return Measured(**json.loads(done.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    main()
