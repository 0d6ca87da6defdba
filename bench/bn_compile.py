"""Bench: compile BN classifiers into decision diagrams, beside the reference's figures.

Per network (../shared/data/bn, skipped when absent): features, reduced and quasi-reduced
internal nodes, positives, compile seconds (median of 5, in-process, parsing excluded) for
both routes, and the reference compiler's figures. Then two classifiers past enumeration,
each compiled once in a fresh subprocess (for its peak memory) and checked on 10,000 random
inputs against the exact posterior (closed form for these structures) and 200 of them
against pgmpy's VariableElimination. Then networks with hidden variables between class and
features (:data:`HIDDEN`), each in a fresh subprocess under the issue's limits (4 GiB, 120 s):
compiled or refused, seconds, peak RSS, the chosen route's estimate, and for compiled ones
400 inputs (200 uniform, 200 sampled from the network) against pgmpy's VariableElimination;
beside them, the contraction cost of opt_einsum's greedy order against the planned one.
Last, ``predict`` throughput on alarm (batch 100k).

Argmax (multi-class) classifiers (:data:`ARGMAX`: child's Disease over its leaves, alarm's
INTUBATION over the reference order) beside the threshold classifiers of the same networks:
nodes, inputs per state, ties, both routes' seconds, and every input against pgmpy's exact
joint; ``bench/bn_compile.py argmax`` runs only these (seconds) and writes their own section.

The UAI problems of ``shared/data/bn/problems.json`` (``bench/bn_compile.py problems``,
its own section): each case and route (auto; the separator forced at the cut the planner
ranks next, for a second positive count over other shared variables; jointree forced) in a
fresh process under
4 GiB / 120 s (``--max-memory`` and ``--max-seconds``, the wall-clock limit holding while it
runs): seconds and peak RSS against the route's estimate, the largest feature block the
jointree route enumerated at once, the share of inputs it decided early, and for compiled
cases :data:`PROBLEM_CHECKS` random inputs against pgmpy's VariableElimination.

Run: ``.venv/bin/python bench/bn_compile.py``; writes its section of bench/RESULTS.md.
``.venv/bin/python bench/bn_compile.py compare MAIN``: every row above (reference rows,
past-enumeration rows, hidden-variable rows) compiled by this checkout and by the checkout
at ``MAIN`` (with its own ``.venv``), alternately, each in a fresh process; seconds side by
side and their ratio, flagged past :data:`COMPARE_LIMIT`; its own section.
``.venv/bin/python bench/bn_compile.py exact``: only the cost of exact decisions on the
reference rows, with and without the post-pass in one run; its own section.
``.venv/bin/python bench/bn_compile.py estimates``: every route estimate against the
measured peak and seconds, on problems.json and on generated problems (bench/_bn_estimates.py);
``.venv/bin/python bench/bn_compile.py speed MAIN``: the 30-feature tcc4e problems before
(``MAIN``) and after; each its own section.
"""

from __future__ import annotations

import contextlib
import json
import math
import resource
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The reference networks and synthetic generators are test fixtures (tests/).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _results import machine_line, run_summary, write_section
from bn_reference import REFERENCE_CLASSIFIERS
from bn_synthetic import chain_tan, naive_bayes

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn import compile as bn_compile
from boxwatch.offline.bn import plan as bn_plan
from boxwatch.offline.bn.classifier import ClassifierSpec, dfs_order, resolve_spec
from boxwatch.offline.bn.compile import CompileResult, compile_classifier
from boxwatch.offline.bn.exact import ErrorBound, Refinement
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.limits import format_bytes
from boxwatch.offline.bn.network import Network
from boxwatch.offline.bn.plan import (
    CompileLimitError,
    _expression,
    plan_joint,
    relevant_factors,
)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "bn"
REPEATS = 5
TARGETS = {"child": 0.05, "alarm": 0.2, "win95pts": 0.5}
BIG = {"naive Bayes, 40 binary features": ("nb", 40), "chain TAN, 30 binary features": ("tan", 30)}
# name -> (file, class, positive, number of leaves: the first of the default features, T)
HIDDEN = {
    "hepar2": ("hepar2.bif.gz", "PBC", "present", 41, 0.5),
    "munin1": ("munin1.bif.gz", "DIFFN_SEV", "MILD", 10, 0.5),
    "pigs": ("pigs.bif.gz", "p630400490", "0", 20, 0.5),
    "link": ("link.bif.gz", "N56_d_g", "1_1", 20, 0.5),
}
HIDDEN_MEMORY = 4 << 30
HIDDEN_SECONDS = 120.0
HIDDEN_CHECKS = 200  # uniform, and as many sampled from the network
# The independent float references below decide P >= T - TIE_TOLERANCE (they cannot tell an
# exact tie from a rounding error); the compiler decides exactly.
TIE_TOLERANCE = 1e-9
EXACT_REPEATS = 15
# name -> (reference classifier whose network and order are used, class of the argmax)
ARGMAX = {"child": ("child", "Disease"), "alarm": ("alarm", "INTUBATION")}
ARGMAX_HEADING = "## bn_compile argmax (bench/bn_compile.py argmax)"
PROBLEMS_HEADING = "## bn_compile problems.json (bench/bn_compile.py problems)"
PROBLEM_ROUTES = ("auto", "other cut", "jointree")
PROBLEM_CHECKS = 1000
PROBLEM_WALL = 150  # seconds before a case's process is stopped from outside


def peak_rss_gb() -> float:
    """Peak resident memory of this process in GiB: ``VmHWM`` of /proc/self/status, which a
    new program starts afresh (``ru_maxrss`` carries the forking parent's peak across exec,
    so a case run from a large bench process would report the bench's memory)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def median_seconds(network, spec, method: str) -> tuple[float, CompileResult]:
    """Median compile seconds over REPEATS runs, and the last result."""
    times: list[float] = []
    result: CompileResult | None = None
    for _ in range(REPEATS):
        start = time.perf_counter()
        result = compile_classifier(network, spec, method=method)
        times.append(time.perf_counter() - start)
    assert result is not None
    return statistics.median(times), result


@contextlib.contextmanager
def float_only() -> Iterator[None]:
    """The compiler as before the exact post-pass: the old float decision (posterior,
    ``P >= T - 1e-9``, ties counted within 1e-9), no error bound, no exact recomputation
    (the cost baseline of the ``exact`` rows)."""

    def plain(num, den, decision, bound, threshold, exact, positive, locate, budget):
        # what _decide did: posterior, P >= T - 1e-9, ties counted within 1e-9
        with np.errstate(invalid="ignore", divide="ignore"):
            post = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
        np.greater_equal(post, threshold - TIE_TOLERANCE, out=decision)
        int(np.count_nonzero(np.abs(post - threshold) <= TIE_TOLERANCE))
        return Refinement()

    names = ("refine", "joint_error_bound", "separator_error_bound")
    saved = [getattr(bn_compile, n) for n in names]
    saved_apply = bn_compile._AdditivePatch.apply
    bn_compile.refine = plain
    bn_compile.joint_error_bound = lambda *a, **k: ErrorBound(0, 0)
    bn_compile.separator_error_bound = lambda *a, **k: ErrorBound(0, 0)
    # a deliberate monkeypatch of a method (restored below); mypy refuses method assignment
    bn_compile._AdditivePatch.apply = lambda self, near, level_k: (0, 0, 0)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for n, f in zip(names, saved, strict=True):
            setattr(bn_compile, n, f)
        bn_compile._AdditivePatch.apply = saved_apply  # type: ignore[method-assign]


def exact_rows() -> list[str]:
    """Compile seconds of every reference row with and without the exact post-pass, runs
    interleaved, the order alternating (median of :data:`EXACT_REPEATS` each), and what the
    post-pass did."""
    rows = []
    totals = [0.0, 0.0, 0.0, 0.0]
    for name, classifier in REFERENCE_CLASSIFIERS.items():
        network, spec = classifier.load(SHARED)
        for method in ("joint", "decompose"):
            with_s, without_s = [], []
            for i in range(EXACT_REPEATS):
                # which one runs first alternates: on a shared machine a preempted run
                # loses a whole scheduler tick (4 ms), and the preemptions fall in a rhythm
                for exact_run in (True, False) if i % 2 == 0 else (False, True):
                    if exact_run:
                        start = time.perf_counter()
                        result = compile_classifier(network, spec, method=method)
                        with_s.append(time.perf_counter() - start)
                        continue
                    with float_only():
                        start = time.perf_counter()
                        plain = compile_classifier(network, spec, method=method)
                        without_s.append(time.perf_counter() - start)
            a, b = statistics.median(with_s), statistics.median(without_s)
            a_min, b_min = min(with_s), min(without_s)
            for i, x in enumerate((b, a, b_min, a_min)):
                totals[i] += x
            same = "yes" if plain.diagram == result.diagram else "no"
            rows.append(
                f"| {name} | {result.method} | {result.inputs:,} | {result.exact_inputs:,} | "
                f"{result.ties:,} | {'yes' if result.certified else 'NO'} | {b:.4f} / "
                f"{b_min:.4f} | {a:.4f} / {a_min:.4f} | {100 * (a - b) / b:+.0f}% / "
                f"{100 * (a_min - b_min) / b_min:+.0f}% | {same} |"
            )
            print(rows[-1], flush=True)
    b, a, b_min, a_min = totals
    rows.append(
        f"| **all rows** | | | | | | {b:.4f} / {b_min:.4f} | {a:.4f} / {a_min:.4f} | "
        f"{100 * (a - b) / b:+.0f}% / {100 * (a_min - b_min) / b_min:+.0f}% | |"
    )
    return rows


def exact_section() -> None:
    """Run :func:`exact_rows` and write its section of bench/RESULTS.md."""
    began = time.perf_counter()
    rows = exact_rows()
    text = "\n".join(
        [
            machine_line(run_summary(began)),
            "",
            "Cost of exact decisions: every reference row compiled with the exact post-pass "
            "(error bound, exact recomputation inside it) and without it (float decisions "
            "only: the compiler before issue 27), runs interleaved in one process (which of "
            "the two goes first alternates), median of "
            f"{EXACT_REPEATS} each (and the fastest), parsing excluded. 'same diagram': whether "
            "the old float decision (P >= T - 1e-9) gives the exact diagram. The machine was "
            "shared (load average in the line above): single rows of a few ms move by tens "
            "of per cent between runs.",
            "",
            "| network | route | inputs | exact path inputs | exact ties | certified | "
            "float only s (median / min) | exact s (median / min) | added (median / min) | "
            "same diagram |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
    write_section("## bn_compile exact decisions (bench/bn_compile.py exact)", text)
    print(text)


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
    peak_gb = peak_rss_gb()
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
        pg = [
            ve.query(
                ["C"], evidence={f: f"v{values[f][i]}" for f in feats}, show_progress=False
            ).get_value(C="pos")
            for i in range(200)
        ]
    ve_bad = int(
        np.count_nonzero(d.predict_positive(X[:200]) != (np.array(pg) >= 0.5 - TIE_TOLERANCE))
    )
    return {
        "seconds": seconds,
        "peak_gb": peak_gb,
        "nodes": result.nodes,
        "nodes_quasi": result.nodes_quasi,
        "positives": result.positives,
        "inputs": result.inputs,
        "ties": result.ties,
        "method": result.method,
        "closed_bad": closed,
        "ve_bad": ve_bad,
    }


def hidden_spec(name: str) -> tuple[Network, ClassifierSpec]:
    """The network of a :data:`HIDDEN` row and its classifier over its first leaves."""
    file, cls, positive, n_leaves, threshold = HIDDEN[name]
    network = load_network(SHARED / file)
    return network, ClassifierSpec(cls, positive, threshold, features=network.leaves()[:n_leaves])


def forward_sample(network: Network, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``n`` joint samples of every variable (ancestral sampling: parents first)."""
    values: dict[str, np.ndarray] = {}
    order: list[str] = []
    pending = list(network.variables)
    while pending:
        ready = [v for v in pending if all(p in order for p in network.parents[v])]
        order += ready
        pending = [v for v in pending if v not in ready]
    for v in order:
        table = network.cpts[v][
            tuple(values[p] for p in network.parents[v])
        ]  # (n, card) or (card,)
        cum = np.cumsum(
            table.reshape(n, -1) if network.parents[v] else np.tile(table, (n, 1)), axis=1
        )
        values[v] = np.minimum(
            (cum < rng.random((n, 1)) * cum[:, -1:]).sum(axis=1), network.card(v) - 1
        )
    return values


def disagreements_with_pgmpy(network: Network, result, rng: np.random.Generator) -> tuple[int, int]:
    """Disagreements on uniform and on network-sampled inputs (HIDDEN_CHECKS each)."""
    from pgmpy.inference import VariableElimination

    d = result.diagram
    cls, positive, threshold = d.class_variable, d.positive, d.threshold
    uniform = rng.integers(0, d.cardinalities, size=(HIDDEN_CHECKS, d.n_features))
    sampled = forward_sample(network, HIDDEN_CHECKS, rng)
    drawn = np.stack([sampled[f] for f in d.features], axis=1)
    ve = VariableElimination(network.to_pgmpy())
    bad = []
    for X in (uniform, drawn):
        count = 0
        for x, got in zip(X, d.predict_positive(X), strict=True):
            ev = {f: d.states[i][x[i]] for i, f in enumerate(d.features)}
            try:
                p = ve.query([cls], evidence=ev, show_progress=False).get_value(**{cls: positive})
            except (ValueError, ZeroDivisionError):
                p = float("nan")  # probability-0 evidence: the diagram decides negative
            count += int(bool(got) != (p >= threshold - TIE_TOLERANCE))
        bad.append(count)
    return bad[0], bad[1]


def hidden_case(name: str) -> dict:
    """Compile one HIDDEN row under its limits (run in a subprocess); figures and checks."""
    network, spec = hidden_spec(name)
    start = time.perf_counter()
    try:
        result = compile_classifier(
            network, spec, max_memory=HIDDEN_MEMORY, max_seconds=HIDDEN_SECONDS
        )
    except CompileLimitError as exc:
        return {
            "refused": str(exc),
            "seconds": time.perf_counter() - start,
            "peak_gb": peak_rss_gb(),
        }
    seconds = time.perf_counter() - start
    peak_gb = peak_rss_gb()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        uniform_bad, sampled_bad = disagreements_with_pgmpy(
            network, result, np.random.default_rng(0)
        )
    assert result.estimate is not None  # compile_classifier records the route's estimate
    return {
        "seconds": seconds,
        "peak_gb": peak_gb,
        "method": result.method,
        "nodes": result.nodes,
        "nodes_quasi": result.nodes_quasi,
        "positives": result.positives,
        "inputs": result.inputs,
        "ties": result.ties,
        "estimate": result.estimate.text(),
        "uniform_bad": uniform_bad,
        "sampled_bad": sampled_bad,
    }


def hidden_rows() -> list[str]:
    """One row per HIDDEN network, each compiled in its own subprocess."""
    rows = []
    for name, (_, cls, positive, n_leaves, threshold) in HIDDEN.items():
        out = subprocess.run(
            [sys.executable, __file__, "hidden", name], check=True, capture_output=True, text=True
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        label = f"{name}, {n_leaves} leaves, P({cls} = {positive}) >= {threshold}"
        if "refused" in r:
            rows.append(
                f"| {label} | refused | - | - | {r['seconds']:.2f} "
                f"(target < 5) | {r['peak_gb']:.2f} | {r['refused']} | - |"
            )
        else:
            rows.append(
                f"| {label} | {r['method']} | {r['nodes']:,} / {r['nodes_quasi']:,} | "
                f"{r['positives']:,} of {r['inputs']:,} | {r['seconds']:.2f} (target <= 120) | "
                f"{r['peak_gb']:.2f} (target <= 4) | {r['estimate']} | "
                f"{r['uniform_bad']} / {r['sampled_bad']} |"
            )
        print(rows[-1], flush=True)
    return rows


def plan_rows() -> list[str]:
    """Contraction to ``P(C, X)``: opt_einsum's greedy order against the joint route's plan."""
    import opt_einsum

    cases = {name: hidden_spec(name) for name in HIDDEN}
    network, _ = cases["munin1"]
    dfs = dfs_order(network, "DIFFN_SEV", network.leaves())[:7]
    cases["munin1, first 7 leaves of the DFS order"] = (
        network,
        ClassifierSpec("DIFFN_SEV", "MILD", 0.5, features=dfs),
    )
    rows = []
    for name, (network, spec) in cases.items():
        resolved = resolve_spec(network, spec)
        keep = [resolved.class_variable, *resolved.order]
        factors = relevant_factors(network, keep)
        _, greedy = opt_einsum.contract_path(
            _expression(factors, keep), *[t for _, t in factors], optimize="greedy"
        )
        start = time.perf_counter()
        # no memory limit: plan_joint skips planning a joint table that cannot fit (hepar2)
        planned = plan_joint(network, resolved, max_memory=math.inf).contraction
        assert planned is not None
        rows.append(
            f"| {name} | {float(greedy.opt_cost):.3g} / "
            f"{float(greedy.largest_intermediate):.3g} | "
            f"{planned.flops:.3g} / {planned.largest_cells:.3g} | "
            f"{time.perf_counter() - start:.3f} |"
        )
    return rows


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


def pgmpy_argmax_disagreements(network: Network, d) -> int:
    """Inputs (all of them) whose argmax by pgmpy's exact joint differs from the diagram's."""
    from pgmpy.inference import VariableElimination

    cls = d.class_variable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        joint = VariableElimination(network.to_pgmpy()).query(
            [cls, *d.features], joint=True, show_progress=False
        )
    table = np.moveaxis(
        joint.values,
        [joint.variables.index(v) for v in (cls, *d.features)],
        range(d.n_features + 1),
    )
    post = table / table.sum(axis=0)
    decided = np.argmax(post >= post.max(axis=0) - TIE_TOLERANCE, axis=0)
    X = np.indices(tuple(int(c) for c in d.cardinalities)).reshape(d.n_features, -1).T
    return int(np.count_nonzero(d.predict(X) != decided[tuple(X.T)]))


def argmax_rows() -> list[str]:
    """Per :data:`ARGMAX` network: the threshold reference row and the argmax row."""
    rows = []
    for name, (ref, cls) in ARGMAX.items():
        network, threshold_spec = REFERENCE_CLASSIFIERS[ref].load(SHARED)
        order = threshold_spec.order
        if cls == "Disease":
            order = None  # all leaves, default order
        specs = {
            f"P({threshold_spec.class_variable} = {threshold_spec.positive}) >= "
            f"{threshold_spec.threshold}": threshold_spec,
            f"argmax {cls} ({network.card(cls)} states)": ClassifierSpec(
                cls, features=order, order=order, decision="argmax"
            ),
        }
        for label, spec in specs.items():
            joint_s, joint = median_seconds(network, spec, "joint")
            split_s, split = median_seconds(network, spec, "decompose")
            same = "yes" if split.diagram == joint.diagram else "NO"
            d = joint.diagram
            if d.is_argmax:
                # compile_classifier fills both for an argmax diagram
                assert joint.decided is not None and joint.tie_pairs is not None
                decided = ", ".join(f"{k} {v:,}" for k, v in joint.decided.items())
                pairs = ", ".join(f"{a}/{b} {n}" for (a, b), n in joint.tie_pairs.items())
                ties = f"{joint.ties:,}" + (f" ({pairs})" if pairs else "")
                bad = str(pgmpy_argmax_disagreements(network, d))
            else:
                decided = f"positive {joint.positives:,}"
                ties, bad = f"{joint.ties:,}", "-"
            rows.append(
                f"| {name} | {label} | {d.n_features} | {joint.nodes} / {joint.nodes_quasi} | "
                f"{decided} of {joint.inputs:,} | {ties} | {joint_s:.4f} | "
                f"{split_s:.4f} ({split.method.split('/')[1]}, same: {same}) | {bad} |"
            )
            print(rows[-1], flush=True)
    return rows


def argmax_section(began: float) -> str:
    """The argmax section of RESULTS.md (threshold rows of the same networks beside)."""
    rows = argmax_rows()
    return "\n".join(
        [
            machine_line(run_summary(began)),
            "",
            "Argmax: the most probable class state, ties (within 1e-9) to the lowest state "
            "index. Seconds: median of 5, in-process, parsing excluded. The last column "
            "compares every input with pgmpy's exact joint (VariableElimination).",
            "",
            "| network | classifier | features | nodes reduced / quasi | inputs decided | ties "
            "| joint s | decompose s | disagreements with pgmpy (all inputs) |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )


def problem_case(name: str, method: str) -> dict:
    """Compile one problems.json case by one route under 4 GiB / 120 s; figures, checks."""
    from boxwatch.offline.bn.compile import JointreeStats, _compile_jointree
    from boxwatch.offline.bn.limits import Deadline, memory_guard
    from boxwatch.offline.bn.plan import plan_jointree

    problem = next(
        p for p in json.loads((SHARED / "problems.json").read_text()) if p["name"] == name
    )
    network = load_network(SHARED / problem["network"]).renormalised  # as compile reads it
    spec = resolve_spec(
        network,
        ClassifierSpec(
            problem["class"],
            problem["positive"],
            problem["threshold"],
            features=problem["features"],
        ),
    )
    start = time.perf_counter()
    stats = JointreeStats()
    out: dict = {"inputs": int(np.prod([network.card(f) for f in spec.order]))}
    result: SimpleNamespace | CompileResult  # forced routes: the figures read below
    try:
        with memory_guard(HIDDEN_MEMORY):
            if method == "jointree":  # forced past its estimate, to see how far it gets
                plan = plan_jointree(network, spec, max_memory=HIDDEN_MEMORY)
                out["estimate"] = plan.estimate.text()
                out["estimate_s"], out["estimate_b"] = plan.estimate.seconds, plan.estimate.bytes
                deadline = Deadline(HIDDEN_SECONDS, network.source, start)
                built = _compile_jointree(
                    network, spec, plan, max_memory=HIDDEN_MEMORY, deadline=deadline, stats=stats
                )
                d = built.diagram
                counts = d.counts()
                assert d.positive is not None  # problems are threshold classifiers
                result = SimpleNamespace(
                    seconds=time.perf_counter() - start,
                    method=built.method,
                    nodes=d.n_nodes,
                    positives=counts[d.positive],
                    estimate=plan.estimate,
                    diagram=d,
                )
            elif method == "other cut":  # a second split: its own shared variables
                cut_plan = _second_cut(network, spec)
                out["estimate"] = cut_plan.estimate.text()
                out["estimate_s"] = cut_plan.estimate.seconds
                out["estimate_b"] = cut_plan.estimate.bytes
                deadline = Deadline(HIDDEN_SECONDS, network.source, start)
                built = bn_compile._compile_separator(
                    network, spec, cut_plan, max_memory=HIDDEN_MEMORY, deadline=deadline
                )
                d = built.diagram
                assert d.positive is not None  # problems are threshold classifiers
                result = SimpleNamespace(
                    seconds=time.perf_counter() - start,
                    method=f"separator, cut after {cut_plan.cut.k}",
                    nodes=d.n_nodes,
                    positives=d.counts()[d.positive],
                    estimate=cut_plan.estimate,
                    diagram=d,
                    early_inputs=built.early_inputs,
                )
            else:
                result = compile_classifier(
                    network, spec, max_memory=HIDDEN_MEMORY, max_seconds=HIDDEN_SECONDS
                )
    except (CompileLimitError, ConfigError, MemoryError) as exc:
        out.update(refused=str(exc).replace("|", "/"), seconds=time.perf_counter() - start)
        out.update(peak_gb=peak_rss_gb())
        out.update(
            largest_block=stats.largest_block,
            early=stats.early_inputs if method == "jointree" else None,
        )
        out.update(messages=max(stats.messages or [0]))
        return out
    assert result.estimate is not None  # every route above records its estimate
    out.update(
        seconds=result.seconds,
        peak_gb=peak_rss_gb(),
        method=result.method,
        nodes=result.nodes,
        positives=result.positives,
        estimate=result.estimate.text(),
        estimate_s=result.estimate.seconds,
        estimate_b=result.estimate.bytes,
        largest_block=stats.largest_block,
        early=stats.early_inputs if method == "jointree" else result.early_inputs,
        messages=max(stats.messages or [0]),
    )
    d = result.diagram
    assert d.threshold is not None  # problems are threshold classifiers
    from pgmpy.inference import VariableElimination

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ve = VariableElimination(network.to_pgmpy())
        X = np.random.default_rng(0).integers(
            0, d.cardinalities, size=(PROBLEM_CHECKS, d.n_features)
        )
        bad = 0
        for x, got in zip(X, d.predict_positive(X), strict=True):
            ev = {f: d.states[i][x[i]] for i, f in enumerate(d.features)}
            try:
                p = ve.query([d.class_variable], evidence=ev, show_progress=False).get_value(
                    **{d.class_variable: d.positive}
                )
            except (ValueError, ZeroDivisionError):
                p = float("nan")
            bad += int(bool(got) != (p >= d.threshold - TIE_TOLERANCE))
    out["pgmpy_bad"] = bad
    return out


def _second_cut(network: Network, spec) -> bn_plan.SeparatorPlan:
    """The separator plan ranked next after the one the planner picks (another cut)."""
    n = len(spec.order)
    chosen = bn_plan.plan_separator(network, spec, max_memory=HIDDEN_MEMORY)
    others = [
        bn_plan._plan_cut(network, bn_plan.cut_at(network, spec, k), n, HIDDEN_MEMORY)
        for k in range(1, n)
        if k != chosen.cut.k
    ]
    return min(others, key=lambda p: bn_plan._rank(p, HIDDEN_MEMORY))


def problem_rows() -> list[str]:
    """One row per problems.json case and route, each in a fresh process."""
    rows = []
    for problem in json.loads((SHARED / "problems.json").read_text()):
        first: int | None = None  # positives by the first route (auto)
        for method in PROBLEM_ROUTES:
            try:
                text = subprocess.run(
                    [sys.executable, __file__, "problem", problem["name"], method],
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=PROBLEM_WALL,
                ).stdout
                r = json.loads(text.strip().splitlines()[-1])
            except subprocess.TimeoutExpired:
                r = {
                    "refused": f"stopped from outside after {PROBLEM_WALL} s",
                    "seconds": PROBLEM_WALL,
                    "peak_gb": float("nan"),
                }
            except subprocess.CalledProcessError as exc:
                r = {
                    "refused": (exc.stderr or "").strip().splitlines()[-1][:200],
                    "seconds": float("nan"),
                    "peak_gb": float("nan"),
                }
            est = (
                f"{r['estimate_s']:.3g} s / {format_bytes(r['estimate_b'])}"
                if "estimate_s" in r
                else "-"
            )
            block = r.get("largest_block") or "-"
            early = f"{r['early'] / r['inputs']:.1%}" if r.get("early") is not None else "-"
            if "refused" in r:
                rows.append(
                    f"| {problem['name']} | {method} | not compiled: {r['refused'][:300]} | - | "
                    f"{r['seconds']:.1f} | {r['peak_gb']:.2f} | {est} | {block} | {early} | - |"
                )
            else:
                if first is None:
                    first, same = r["positives"], "-"
                else:
                    same = "yes" if r["positives"] == first else "NO"
                rows.append(
                    f"| {problem['name']} | {method} -> {r['method']} | {r['nodes']:,} nodes, "
                    f"{r['positives']:,} of {r['inputs']:,} positive | {same} | "
                    f"{r['seconds']:.2f} | "
                    f"{r['peak_gb']:.2f} | {est} | {block} | {early} | {r['pgmpy_bad']} |"
                )
            print(rows[-1], flush=True)
    return rows


def problems_section(began: float) -> str:
    """The problems.json section of RESULTS.md."""
    rows = problem_rows()
    return "\n".join(
        [
            machine_line(run_summary(began)),
            "",
            "Each case and route in a fresh process (the machine shared with other work, "
            "load average above), --max-memory 4 GiB, --max-seconds 120 "
            f"(checked while running); pgmpy: disagreements on {PROBLEM_CHECKS} random inputs "
            "with VariableElimination. Early: share of the inputs decided before their last "
            "features were enumerated (jointree: at a cut before the last level; separator: "
            "from the prefix message alone).",
            "",
            "| problem | route | result | positives as auto's | seconds | peak RSS GB | "
            "estimate s / bytes | "
            "largest block (features) | decided early | pgmpy disagreements |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )


COMPARE_HEADING = "## bn_compile against main (bench/bn_compile.py compare MAIN)"
COMPARE_LIMIT = 1.5  # a row this much slower than the baseline's is flagged
# Runs in either checkout (only APIs both have): one row's compile, figures as JSON.
COMPARE_CODE = r"""
import json, statistics, sys, time
from pathlib import Path
root, kind, name, method = sys.argv[1:5]
sys.path.insert(0, str(Path(root) / "tests"))
from boxwatch.offline.bn.classifier import ClassifierSpec
from boxwatch.offline.bn.compile import compile_classifier
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.plan import CompileLimitError
shared = Path(root).resolve().parent / "shared" / "data" / "bn"
kw, repeats = {}, 1
if kind == "ref":
    from bn_reference import REFERENCE_CLASSIFIERS
    network, spec = REFERENCE_CLASSIFIERS[name].load(shared)
    repeats = 9
elif kind == "big":
    from bn_synthetic import chain_tan, naive_bayes
    n = int("".join(ch for ch in name if ch.isdigit()))
    network = (naive_bayes if name.startswith("nb") else chain_tan)(n, seed=0)
    spec = ClassifierSpec("C", "pos", 0.5, features=[f"x{i}" for i in range(n)])
else:
    file, cls, positive, n_leaves, threshold = json.loads(sys.argv[5])
    network = load_network(shared / file)
    spec = ClassifierSpec(cls, positive, threshold, features=network.leaves()[:n_leaves])
    kw = {"max_memory": 4 << 30, "max_seconds": 120.0}
times, out = [], {}
for _ in range(repeats):
    start = time.perf_counter()
    try:
        r = compile_classifier(network, spec, method=method, **kw)
        out = {"method": r.method, "nodes": r.nodes, "positives": r.positives}
    except CompileLimitError:
        out = {"method": "refused", "nodes": None, "positives": None}
    times.append(time.perf_counter() - start)
out["seconds"] = statistics.median(times)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")]  # fresh per program
out["peak_gb"] = int(hwm[0].split()[1]) / 1024**2
print(json.dumps(out))
"""


def compare_case(root: Path, kind: str, name: str, method: str) -> dict:
    """One row compiled by the checkout at ``root`` (its own .venv), in a fresh process."""
    extra = [json.dumps(HIDDEN[name])] if kind == "hidden" else []
    text = subprocess.run(
        [str(root / ".venv" / "bin" / "python"), "-c", COMPARE_CODE, str(root), kind, name]
        + [method, *extra],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    return json.loads(text.strip().splitlines()[-1])


def compare_section(baseline: Path, began: float) -> str:
    """Every existing row by this checkout and by ``baseline`` (main), alternately."""
    here = Path(__file__).resolve().parents[1]
    cases = [("ref", name, m) for name in REFERENCE_CLASSIFIERS for m in ("joint", "decompose")]
    cases += [("big", "nb40", "auto"), ("big", "tan30", "auto")]
    cases += [("hidden", name, "auto") for name in HIDDEN]
    rows, worst = [], 0.0
    for kind, name, method in cases:
        base = compare_case(baseline, kind, name, method)
        mine = compare_case(here, kind, name, method)
        ratio = mine["seconds"] / base["seconds"]
        worst = max(worst, ratio)
        same = (
            "yes"
            if (mine["positives"], mine["method"])
            == (
                base["positives"],
                base["method"],
            )
            else "NO"
        )
        flag = f" (over {COMPARE_LIMIT}x)" if ratio > COMPARE_LIMIT else ""
        rows.append(
            f"| {name} | {method} | {base['method']} / {mine['method']} | "
            f"{base['nodes']} / {mine['nodes']} | {base['positives']} / {mine['positives']} "
            f"({same}) | {base['seconds']:.4f} | {mine['seconds']:.4f} | {ratio:.2f}{flag} | "
            f"{base['peak_gb']:.2f} / {mine['peak_gb']:.2f} |"
        )
        print(rows[-1], flush=True)
    return "\n".join(
        [
            machine_line(run_summary(began)),
            "",
            f"Baseline: {baseline} at {_commit(baseline)}; this checkout at {_commit(here)}. "
            "Each row in a fresh process per checkout, the baseline first; reference rows "
            "median of 9, the others one run (hidden rows under 4 GiB / 120 s, parsing "
            f"excluded). Slowest ratio {worst:.2f} (limit {COMPARE_LIMIT}). The machine is "
            "shared with other work (load average above): sub-10 ms rows move by 10-40% "
            "between runs.",
            "",
            "| case | method | route main / here | nodes main / here | positives main / here "
            "(same) | main s | here s | here / main | peak RSS GB main / here |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )


def _commit(root: Path) -> str:
    """Short commit of the checkout at ``root`` (``+`` when its tree has changes)."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=root,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return head + ("+" if dirty else "")


def main() -> None:
    """Run every case (or one large case when given ``KIND N``) and write RESULTS.md."""
    if sys.argv[1:2] in (["estimates"], ["estimates-child"], ["speed"]):
        import _bn_estimates

        if sys.argv[1] == "estimates-child":
            problems = json.loads(Path(sys.argv[2]).read_text())
            forced = sys.argv[4] == "forced"
            print(json.dumps(_bn_estimates.child(problems[int(sys.argv[3])], forced)))
            return
        if sys.argv[1] == "estimates":
            text = _bn_estimates.estimates_section(time.perf_counter())
            write_section(_bn_estimates.ESTIMATES_HEADING, text)
        else:
            text = _bn_estimates.speed_section(Path(sys.argv[2]).resolve(), time.perf_counter())
            write_section(_bn_estimates.SPEED_HEADING, text)
        print(text)
        return
    if len(sys.argv) == 2 and sys.argv[1] == "problems":
        text = problems_section(time.perf_counter())
        write_section(PROBLEMS_HEADING, text)
        print(text)
        return
    if len(sys.argv) == 3 and sys.argv[1] == "compare":
        text = compare_section(Path(sys.argv[2]).resolve(), time.perf_counter())
        write_section(COMPARE_HEADING, text)
        print(text)
        return
    if len(sys.argv) == 4 and sys.argv[1] == "problem":
        print(json.dumps(problem_case(sys.argv[2], sys.argv[3])))
        return
    if sys.argv[1:] == ["argmax"]:
        text = argmax_section(time.perf_counter())
        write_section(ARGMAX_HEADING, text)
        print(text)
        return
    if sys.argv[1:] == ["exact"]:
        exact_section()
        return
    if len(sys.argv) == 3 and sys.argv[1] == "hidden":
        print(json.dumps(hidden_case(sys.argv[2])))
        return
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
    lines += [
        "",
        "| past enumeration (seed 0, T = 0.5) | route | nodes reduced / quasi | "
        "positives of inputs | ties | compile s (one run) | peak RSS GB | "
        "disagreements: 10,000 closed form / 200 pgmpy VE |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, (kind, n) in BIG.items():
        out = subprocess.run(
            [sys.executable, __file__, kind, str(n)], check=True, capture_output=True, text=True
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        lines.append(
            f"| {label} | {r['method']} | {r['nodes']:,} / {r['nodes_quasi']:,} | "
            f"{r['positives']:,} of {r['inputs']:,} | {r['ties']} | {r['seconds']:.1f} "
            f"(target <= 60) | {r['peak_gb']:.2f} (target <= 4) | {r['closed_bad']} / {r['ve_bad']} |"
        )
        print(lines[-1], flush=True)
    if SHARED.is_dir():
        lines += [
            "",
            f"Hidden variables between class and features (first leaves of the default "
            f"features; limits --max-memory {format_bytes(HIDDEN_MEMORY)}, --max-seconds "
            f"{HIDDEN_SECONDS:g}; each in a fresh process, parsing excluded):",
            "",
            "| classifier | route | nodes reduced / quasi | positives of inputs | "
            "compile or refusal s | peak RSS GB | estimate (before starting) | "
            f"disagreements with pgmpy VE: {HIDDEN_CHECKS} uniform / {HIDDEN_CHECKS} "
            "network-sampled |",
            "|---|---|---|---|---|---|---|---|",
            *hidden_rows(),
            "",
            "| contraction to P(C, X) | opt_einsum greedy: flops / largest cells | planned "
            "(best of min-fill, min-weight, greedy): flops / largest cells | planning s |",
            "|---|---|---|---|",
            *plan_rows(),
        ]
    text = "\n".join([machine_line(run_summary(began)), "", *lines])
    write_section("## bn_compile (bench/bn_compile.py)", text)
    print(text)
    if SHARED.is_dir():
        write_section(ARGMAX_HEADING, argmax_section(time.perf_counter()))


if __name__ == "__main__":
    main()
