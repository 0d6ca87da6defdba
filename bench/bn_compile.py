"""Bench: compile BN classifiers into decision diagrams, beside the reference's figures.

Per network (../shared/data/bn, skipped when absent): features, reduced and quasi-reduced
internal nodes, positives, compile seconds (median of 5, in-process, parsing excluded) for
both routes, and the reference compiler's figures. Then two classifiers past enumeration,
each compiled once in a fresh subprocess (for its peak memory) and checked on 10,000 random
inputs against the exact posterior (closed form for these structures) and 200 of them
against pgmpy's VariableElimination. Last, ``predict`` throughput on alarm (batch 100k).

Run: ``.venv/bin/python bench/bn_compile.py``; writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine_line, write_section

from boxwatch.offline.bn_classifier import ClassifierSpec
from boxwatch.offline.bn_compile import TIE_TOLERANCE, compile_classifier
from boxwatch.offline.bn_reference import REFERENCE_CLASSIFIERS
from boxwatch.offline.bn_synthetic import chain_tan, naive_bayes

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "bn"
REPEATS = 5
TARGETS = {"child": 0.05, "alarm": 0.2, "win95pts": 0.5}
BIG = {"naive Bayes, 40 binary features": ("nb", 40), "chain TAN, 30 binary features": ("tan", 30)}


def median_seconds(network, spec, method: str) -> tuple[float, object]:
    """Median compile seconds over REPEATS runs, and the last result."""
    times, result = [], None
    for _ in range(REPEATS):
        start = time.perf_counter()
        result = compile_classifier(network, spec, method=method)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def network_rows() -> list[str]:
    """One table row per shared network: both routes beside the reference."""
    rows = []
    for name, classifier in REFERENCE_CLASSIFIERS.items():
        network, spec = classifier.load(SHARED)
        ref = classifier.reference
        joint_s, joint = median_seconds(network, spec, "joint")
        split_s, split = median_seconds(network, spec, "decompose")
        same = "yes" if split.diagram == joint.diagram else "NO"
        ref_text = f"{ref[0]} / {ref[1]:,} / {ref[2]} s" if ref else "-"
        target = f" (target <= {TARGETS[name]})" if name in TARGETS else ""
        speedup = f"{ref[2] / joint_s:,.0f}x" if ref else "-"
        rows.append(
            f"| {name} | {len(joint.diagram.features)} | {joint.nodes} / {joint.nodes_quasi} | "
            f"{joint.positives:,} of {joint.inputs:,} | {joint.ties:,} | "
            f"{joint_s:.4f}{target} | {split_s:.4f} ({split.method.split('/')[1]}, same: {same}) | "
            f"{ref_text} | {speedup} |"
        )
        print(rows[-1], flush=True)
    return rows


def big_case(kind: str, n: int) -> dict:
    """Compile one large classifier (run in a subprocess) and check it; returns figures."""
    network = naive_bayes(n, seed=0) if kind == "nb" else chain_tan(n, seed=0)
    feats = [f"x{i}" for i in range(n)]
    spec = ClassifierSpec("C", "pos", 0.5, features=feats)
    start = time.perf_counter()
    result = compile_classifier(network, spec)
    seconds = time.perf_counter() - start
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    d = result.diagram
    X = np.random.default_rng(1).integers(0, 2, size=(10_000, n))
    cols = [d.features.index(f) for f in feats]
    values = {f: X[:, c] for f, c in zip(feats, cols, strict=True)}
    logp = np.tile(np.log(network.cpts["C"]), (len(X), 1))
    for f in feats:
        idx = tuple(values[p] for p in network.parents[f] if p != "C")
        table = np.log(network.cpts[f])
        logp += np.stack([table[(c, *idx, values[f])] for c in range(2)], axis=1)
    post = 1.0 / (1.0 + np.exp(logp[:, 0] - logp[:, 1]))
    closed = int(np.count_nonzero(d.predict_positive(X) != (post >= 0.5 - TIE_TOLERANCE)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgmpy.inference import VariableElimination

        ve = VariableElimination(network.to_pgmpy())
        pg = [ve.query(["C"], evidence={f: f"v{values[f][i]}" for f in feats},
                       show_progress=False).get_value(C="pos") for i in range(200)]
    ve_bad = int(np.count_nonzero(d.predict_positive(X[:200]) != (np.array(pg) >= 0.5 - TIE_TOLERANCE)))
    return {"seconds": seconds, "peak_gb": peak_gb, "nodes": result.nodes,
            "nodes_quasi": result.nodes_quasi, "positives": result.positives,
            "inputs": result.inputs, "ties": result.ties, "method": result.method,
            "closed_bad": closed, "ve_bad": ve_bad}


def predict_rate() -> str:
    """Assignments per second of ``predict`` on alarm, batch 100,000."""
    network, spec = REFERENCE_CLASSIFIERS["alarm"].load(SHARED)
    d = compile_classifier(network, spec).diagram
    X = np.random.default_rng(0).integers(0, d.cardinalities, size=(100_000, d.n_features))
    d.predict(X)
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        d.predict(X)
        times.append(time.perf_counter() - start)
    return f"{100_000 / statistics.median(times):,.0f}"


def main() -> None:
    """Run every case (or one large case when given ``KIND N``) and write RESULTS.md."""
    if len(sys.argv) == 3:
        print(json.dumps(big_case(sys.argv[1], int(sys.argv[2]))))
        return
    began = time.perf_counter()
    lines = []
    if SHARED.is_dir():
        lines += [
            "| network | features | nodes reduced / quasi | positives | ties | joint s "
            "(median of 5) | decompose s | reference quasi / positives / s | speed-up |",
            "|---|---|---|---|---|---|---|---|---|",
            *network_rows(),
            "",
            f"- predict on alarm (batch 100,000, median of 5): {predict_rate()} assignments/s "
            "(target >= 1,000,000)",
        ]
    else:
        lines.append("- ../shared/data/bn absent: reference networks skipped")
    lines += ["", "| past enumeration (seed 0, T = 0.5) | route | nodes reduced / quasi | "
              "positives of inputs | ties | compile s (one run) | peak RSS GB | "
              "disagreements: 10,000 closed form / 200 pgmpy VE |", "|---|---|---|---|---|---|---|---|"]
    for label, (kind, n) in BIG.items():
        out = subprocess.run([sys.executable, __file__, kind, str(n)], check=True,
                             capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        lines.append(
            f"| {label} | {r['method']} | {r['nodes']:,} / {r['nodes_quasi']:,} | "
            f"{r['positives']:,} of {r['inputs']:,} | {r['ties']} | {r['seconds']:.1f} "
            f"(target <= 60) | {r['peak_gb']:.2f} (target <= 4) | {r['closed_bad']} / {r['ve_bad']} |"
        )
        print(lines[-1], flush=True)
    text = "\n".join([machine_line(f"total run {time.perf_counter() - began:.0f} s"), "", *lines])
    write_section("## bn_compile (bench/bn_compile.py)", text)
    print(text)


if __name__ == "__main__":
    main()
