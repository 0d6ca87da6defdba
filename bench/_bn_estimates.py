"""The ``estimates`` and ``speed`` modes of bench/bn_compile.py: estimates against what runs.

``estimates``: every problem of ``shared/data/bn/problems.json`` and :data:`GENERATED`
classifier problems drawn on the UAI networks there (:func:`generated_problems`, seed
:data:`GENERATOR_SEED`, fixed before anything was measured), each compiled by ``auto`` in a
fresh process under ``--max-memory`` :data:`LIMIT` and ``--max-seconds`` :data:`SECONDS`
(the process also capped by ``RLIMIT_AS`` at :data:`HARD_CAP`; one compile at a time).
Measured: the peak RSS above the RSS when the compilation started (``VmHWM`` reset through
``/proc/self/clear_refs``, so loading the network does not count), CPU and wall seconds.
A refused problem is compiled again with the separator route forced (planned under the
limit, run past its estimate, the limits still holding): a refusal is wrong when that run
finishes. Every compiled diagram is checked on :data:`CHECKS` inputs (half uniform, half
drawn from the network) against the decision of the renormalised network (a float
posterior from one contraction of the whole network per input, and within :data:`NEAR` of T
the project's exact rational decision, :class:`~boxwatch.offline.bn.exact.ExactJoint`), on
:data:`PGMPY_CHECKS` of them against pgmpy's VariableElimination (float; inputs within 1e-9
of T are counted apart), and against the exact positive counts of problems.json.

``speed MAIN``: the 30-feature tcc4e problems compiled by the checkout at ``MAIN`` (its own
.venv) and by this one, alternately, each in a fresh process under the same limits; a
problem ``MAIN`` refuses is forced there: its separator route at the cut it estimates
fastest, run past its estimate with 7 GiB guarded (RLIMIT_AS 8 GiB; the issue measured
these at 8.9-97.5 s and up to 8.5 GB).
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time
import warnings
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from boxwatch.offline.bn import compile as bn_compile
from boxwatch.offline.bn import plan as bn_plan
from boxwatch.offline.bn.classifier import ClassifierSpec, resolve_spec
from boxwatch.offline.bn.exact import ExactJoint
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.limits import Deadline, memory_guard
from boxwatch.offline.bn.network import Network

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "bn"
ESTIMATES_HEADING = "## bn_compile estimates (bench/bn_compile.py estimates)"
SPEED_HEADING = (
    "## bn_compile speed of the 30-feature tcc4e problems (bench/bn_compile.py speed MAIN)"
)
LIMIT = 4 << 30
SECONDS = 120.0
HARD_CAP = 8 << 30
"""Address space a child may map (RLIMIT_AS): no run can take the shared machine down."""
WALL = 300
"""Seconds before a child is stopped from outside."""
GENERATOR_SEED = 20261205
GENERATED = 33
UAI = ("tcc4e-binary.uai.gz", "emdec6g-binary.uai.gz", "cpcs54.uai.gz")
CHECKS = 200
PGMPY_CHECKS = 40
TIE_TOLERANCE = 1e-9
NEAR = 1e-6
"""Inputs whose reference float posterior is this close to T are decided in rationals."""


# ---------------------------------------------------------------------------- problems
def generated_problems() -> list[dict[str, Any]]:
    """:data:`GENERATED` classifier problems on the UAI networks, in turn, from
    :data:`GENERATOR_SEED`: a class drawn among the variables with children, 27-30 features
    drawn among the leaves (among all other variables where the leaves are too few), the
    positive state the class's second, and T the median posterior of 256 uniform inputs
    (rounded to 3 significant digits), so that neither decision is rare."""
    rng = np.random.default_rng(GENERATOR_SEED)
    networks = {f: load_network(SHARED / f).renormalised for f in UAI}
    out = []
    for i in range(GENERATED):
        file = UAI[i % len(UAI)]
        net = networks[file]
        leaves = set(net.leaves())
        inner = [v for v in net.variables if v not in leaves]
        cls = inner[int(rng.integers(len(inner)))]
        n = int(rng.integers(27, 31))
        pool = [v for v in net.variables if v in leaves and v != cls]
        if len(pool) < n:
            pool = [v for v in net.variables if v != cls]
        feats = sorted(rng.choice(pool, size=n, replace=False).tolist(), key=net.variables.index)
        posts = _posteriors(net, cls, feats, rng.integers(0, 2, size=(256, n)))
        median = float(np.median(posts[np.isfinite(posts)]))
        threshold = float(f"{min(0.999, max(0.001, median)):.3g}")
        name = f"{file.split('-')[0].split('.')[0]}-{cls}-{n}-g{i}"
        out.append(
            {
                "name": name,
                "network": file,
                "class": cls,
                "positive": net.states[cls][1],
                "threshold": threshold,
                "features": feats,
            }
        )
    return out


def _posteriors(
    net: Network, cls: str, feats: list[str], X: np.ndarray, positive: str | None = None
) -> np.ndarray:
    """Float ``P(cls = positive | x)`` (default: its second state) of the rows of ``X``:
    one contraction of the relevant CPTs with a batch axis over the rows."""
    rows = {f: X[:, j] for j, f in enumerate(feats)}
    factors = bn_plan.sampled(bn_plan.relevant_factors(net, [cls, *feats]), rows)
    factors.append(((bn_plan.BATCH,), np.ones(X.shape[0])))
    factors += bn_plan.unit_factors(net, [cls])
    joint = bn_plan.plan_contraction(factors, [bn_plan.BATCH, cls]).run(factors)
    pos = 1 if positive is None else net.states[cls].index(positive)
    with np.errstate(invalid="ignore", divide="ignore"):
        return joint[:, pos] / joint.sum(axis=1)


def all_problems() -> list[dict[str, Any]]:
    """problems.json, then the generated problems."""
    listed = json.loads((SHARED / "problems.json").read_text())
    return [*listed, *generated_problems()]


def _load(problem: dict[str, Any]) -> tuple[Network, Any]:
    net = load_network(SHARED / problem["network"])
    spec = resolve_spec(
        net,
        ClassifierSpec(
            problem["class"],
            problem["positive"],
            problem["threshold"],
            features=problem["features"],
        ),
    )
    return net, spec


# ---------------------------------------------------------------------------- one child
def _status(field: str) -> float:
    """A /proc/self/status size in GiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1]) / 1024**2
    return math.nan


def child(problem: dict[str, Any], forced: bool) -> dict[str, Any]:
    """Compile one problem (auto, or the separator forced past its estimate) under the
    limits, in this fresh process; peak RSS above the start, seconds, checks."""
    resource.setrlimit(resource.RLIMIT_AS, (HARD_CAP, HARD_CAP))
    net, spec = _load(problem)
    out: dict[str, Any] = {"inputs": math.prod(net.card(f) for f in spec.order)}
    with open("/proc/self/clear_refs", "w") as fh:  # VmHWM from here on
        fh.write("5")
    base = _status("VmRSS")
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        with memory_guard(LIMIT):
            if forced:
                read = net.renormalised
                plan = bn_plan.plan_separator(read, spec, max_memory=LIMIT)
                out["estimate_b"], out["estimate_s"] = plan.estimate.bytes, plan.estimate.seconds
                out["route"] = f"separator, cut after {plan.cut.k} (forced)"
                built = bn_compile._compile_separator(
                    read,
                    spec,
                    plan,
                    max_memory=math.inf,
                    deadline=Deadline(SECONDS, read.source, wall),
                )
                diagram = built.diagram
            else:
                result = bn_compile.compile_classifier(
                    net, spec, max_memory=LIMIT, max_seconds=SECONDS
                )
                diagram = result.diagram
                assert result.estimate is not None
                out["estimate_b"] = result.estimate.bytes
                out["estimate_s"] = result.estimate.seconds
                out["planning"] = result.planning_seconds
                out["route"] = result.method
                out["detail"] = result.estimate.detail
                out["certified"] = result.certified
    except (bn_compile.ConfigError, MemoryError) as exc:
        out["refused"] = str(exc)[:400]
        if not forced and "no route fits" in str(exc):
            plan = bn_plan.plan_separator(net.renormalised, spec, max_memory=LIMIT)
            out["estimate_b"], out["estimate_s"] = plan.estimate.bytes, plan.estimate.seconds
    out["cpu"] = time.process_time() - cpu
    out["wall"] = time.perf_counter() - wall
    out["peak_gb"] = _status("VmHWM") - base
    if "refused" not in out:
        counts = diagram.counts()
        assert diagram.positive is not None  # problems are threshold classifiers
        out["positives"] = counts[diagram.positive]
        out["nodes"] = diagram.n_nodes
        out.update(_checks(net, diagram))
    return out


def _checks(net: Network, diagram: Any) -> dict[str, int]:
    """Disagreements of ``diagram`` with the decision of the renormalised network on
    :data:`CHECKS` inputs, and with pgmpy on :data:`PGMPY_CHECKS` of them.

    The reference posterior is one contraction of the whole network per input
    (:func:`_posteriors`); inputs within :data:`NEAR` of T are decided in exact rationals
    (:class:`~boxwatch.offline.bn.exact.ExactJoint`; ``exact_near`` counts them,
    ``unchecked`` those it had no memory for).
    """
    read = net.renormalised
    rng = np.random.default_rng(0)
    feats = list(diagram.features)
    half = CHECKS // 2
    uniform = rng.integers(0, diagram.cardinalities, size=(half, len(feats)))
    drawn = _forward_sample(read, half, rng)
    X = np.concatenate([uniform, np.stack([drawn[f] for f in feats], axis=1)])
    got = diagram.predict_positive(X)
    t = float(diagram.threshold)
    post = _posteriors(read, diagram.class_variable, feats, X, diagram.positive)
    near = np.abs(post - t) <= NEAR
    want = post >= t
    out = {"exact_near": int(np.count_nonzero(near)), "unchecked": 0}
    if near.any():
        pos = read.states[diagram.class_variable].index(diagram.positive)
        try:
            exact = ExactJoint(read, diagram.class_variable, feats).decide(
                X[near], Fraction(repr(t)), pos
            )
            want[near] = exact.positive
        except MemoryError:
            out["unchecked"] = int(np.count_nonzero(near))
            want[near] = got[near]
    out["exact_bad"] = int(np.count_nonzero(got != want))
    from pgmpy.inference import VariableElimination

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ve = VariableElimination(read.to_pgmpy())
        bad = close = 0
        for x, g in zip(X[:PGMPY_CHECKS], got[:PGMPY_CHECKS], strict=True):
            ev = {f: diagram.states[i][x[i]] for i, f in enumerate(feats)}
            try:
                p = ve.query([diagram.class_variable], evidence=ev, show_progress=False)
                value = p.get_value(**{diagram.class_variable: diagram.positive})
            except (ValueError, ZeroDivisionError):
                value = math.nan
            if abs(value - t) <= TIE_TOLERANCE:
                close += 1
            else:
                bad += int(bool(g) != (value >= t))
    out["pgmpy_bad"], out["pgmpy_near"] = bad, close
    return out


def _forward_sample(net: Network, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``n`` joint samples of every variable (parents first)."""
    values: dict[str, np.ndarray] = {}
    pending = list(net.variables)
    while pending:
        for v in [v for v in pending if all(p in values for p in net.parents[v])]:
            table = net.cpts[v][tuple(values[p] for p in net.parents[v])]
            rows = table.reshape(n, -1) if net.parents[v] else np.tile(table, (n, 1))
            cum = np.cumsum(rows, axis=1)
            draw = (cum < rng.random((n, 1)) * cum[:, -1:]).sum(axis=1)
            values[v] = np.minimum(draw, net.card(v) - 1)
            pending.remove(v)
    return values


def run_child(args: list[str], python: str = sys.executable, cwd: Path | None = None) -> dict:
    """One child of bench/bn_compile.py; its last stdout line as JSON (or why it failed)."""
    script = Path(__file__).resolve().parent / "bn_compile.py"
    try:
        text = subprocess.run(
            [python, str(script), *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=WALL,
            cwd=cwd,
        ).stdout
        return json.loads(text.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return {"refused": f"stopped from outside after {WALL} s", "wall": WALL}
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or "").strip().splitlines()
        return {"refused": f"exit {exc.returncode}: {tail[-1][:300] if tail else ''}"}


# ---------------------------------------------------------------------------- estimates
def _gib(x: float) -> str:
    return f"{x:.3f}" if math.isfinite(x) else "-"


def estimates_section(began: float) -> str:
    """Every problem by auto, a refused one forced; the table and its summary."""
    problems = all_problems()
    path = Path(os.environ.get("TMPDIR", "/tmp")) / "bn_estimates_problems.json"
    path.write_text(json.dumps(problems))
    rows, ratios, wrong_refusals, stopped, bad, checked = [], [], [], [], 0, 0
    for i, problem in enumerate(problems):
        r = run_child(["estimates-child", str(path), str(i), "auto"])
        forced = None
        refused = "refused" in r and "no route fits" in r["refused"]
        if "refused" in r:
            forced = run_child(["estimates-child", str(path), str(i), "forced"])
            if refused and "refused" not in forced:
                wrong_refusals.append(problem["name"])
            if not refused:
                stopped.append(problem["name"])
        shown = forced if forced is not None and "refused" not in forced else r
        est = shown.get("estimate_b", math.nan) / 2**30
        peak = shown.get("peak_gb", math.nan)
        ratio = est / peak if peak and math.isfinite(est) and math.isfinite(peak) else math.nan
        if "refused" not in shown:
            ratios.append((ratio, problem["name"]))
            bad += shown["exact_bad"] + shown["pgmpy_bad"]
            checked += 1
        want = (problem.get("exact_positives") or {}).get("renormalised_rows")
        exact = "-"
        if "positives" in shown:
            exact = f"{shown['exact_bad']} / {shown['pgmpy_bad']}"
            if shown.get("exact_near"):
                exact += f" ({shown['exact_near']} within {NEAR:g} of T decided in rationals"
                exact += f", {shown['unchecked']} unchecked)" if shown["unchecked"] else ")"
            if shown.get("pgmpy_near"):
                exact += f" ({shown['pgmpy_near']} within 1e-9 of T for pgmpy)"
            if want is not None:
                exact += ", count " + ("exact" if shown["positives"] == want else "WRONG")
        verdict = "-"
        if "refused" in r:
            how = (
                "forced run compiled within the limits"
                if forced and "refused" not in forced
                else f"forced run also fails ({(forced or {}).get('refused', '')[:120]})"
            )
            verdict = ("refused: " if refused else "ran, stopped at a limit: ") + how
        planning = f" (+{shown['planning']:.1f} planning)" if "planning" in shown else ""
        outcome = (
            f"{shown['positives']:,} of {shown['inputs']:,}"
            if "positives" in shown
            else f"not compiled: {shown.get('refused', '')[:160]}"
        )
        rows.append(
            f"| {problem['name']} | {len(problem['features'])} | {shown.get('route', '-')} | "
            f"{outcome} | {_gib(est)} | {_gib(peak)} | "
            f"{ratio:.2f} | {shown.get('estimate_s', math.nan):.1f}{planning} | "
            f"{shown.get('cpu', math.nan):.1f} | {shown.get('wall', math.nan):.1f} | "
            f"{verdict} | {exact} |"
        )
        print(rows[-1], flush=True)
    finite = [x for x in ratios if math.isfinite(x[0])]
    high = max(finite, default=(math.nan, "-"))
    low = min(finite, default=(math.nan, "-"))
    summary = (
        f"{len(problems)} problems ({len(problems) - GENERATED} of problems.json, {GENERATED} "
        f"generated from seed {GENERATOR_SEED}); estimate / measured peak from "
        f"{low[0]:.2f} ({low[1]}) to {high[0]:.2f} ({high[1]}) (stated accuracy: within "
        f"{bn_plan.ESTIMATE_ACCURACY:g}x either way); refusals of a problem that compiles "
        f"within the limits when forced: {len(wrong_refusals)}"
        + (f" ({', '.join(wrong_refusals)})" if wrong_refusals else "")
        + f"; run but stopped at a limit (not refused): {len(stopped)}"
        + (f" ({', '.join(stopped)})" if stopped else "")
        + f"; disagreements with the exact decision or pgmpy on the {checked} compiled: {bad}."
    )
    print(summary)
    from _results import machine_line, run_summary

    return "\n".join(
        [
            machine_line(run_summary(began)),
            "",
            f"Each problem by `auto` in a fresh process under --max-memory "
            f"{LIMIT >> 30} GiB and --max-seconds {SECONDS:g} (RLIMIT_AS {HARD_CAP >> 30} GiB; "
            "one at a time). Measured peak: VmHWM above the RSS when the compilation started "
            "(reset through /proc/self/clear_refs). Ratio: estimate / measured peak. "
            "Seconds: the route's estimate (and the wall seconds its planning took before), "
            "then CPU and wall seconds measured, planning included (the machine is shared: "
            "compare CPU seconds; the load is in the line above). A problem refused "
            "from its estimates, or stopped at a limit while it ran, is compiled again with "
            "the separator route forced past its estimate, the limits holding. "
            f"Checks: disagreements on {CHECKS} inputs (half uniform, half drawn from the "
            "network) with the decision of the renormalised network (float posterior of the "
            f"whole network, and the exact rational decision within {NEAR:g} of T), then on "
            f"{PGMPY_CHECKS} of them with pgmpy's VariableElimination; 'count': the positives "
            "against problems.json's exact count.",
            "",
            summary,
            "",
            "| problem | features | route | positives | estimate GiB | measured peak GiB | "
            "ratio | estimate s | CPU s | wall s | refused or stopped? | "
            "disagreements exact / pgmpy |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
            *rows,
        ]
    )


# ---------------------------------------------------------------------------- speed
def speed_problems() -> list[dict[str, Any]]:
    """The 30-feature tcc4e problems of problems.json."""
    listed = json.loads((SHARED / "problems.json").read_text())
    return [p for p in listed if p["network"].startswith("tcc4e") and len(p["features"]) == 30]


SPEED_CODE = r"""
import json, math, resource, sys, time
from pathlib import Path
root, problem, mode = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
from boxwatch.offline.bn.classifier import ClassifierSpec
from boxwatch.offline.bn.compile import compile_classifier
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.limits import memory_guard
shared = Path(root).resolve().parent / "shared" / "data" / "bn"
net = load_network(shared / problem["network"])
spec = ClassifierSpec(problem["class"], problem["positive"], problem["threshold"],
                      features=problem["features"])
wall, cpu = time.perf_counter(), time.process_time()
try:
    if mode == "limits":
        with memory_guard(4 << 30):
            r = compile_classifier(net, spec, max_memory=4 << 30, max_seconds=120.0)
        out = {"positives": r.positives, "method": r.method}
    else:  # the separator forced past its estimate, its cut the fastest, 7 GiB guarded
        from boxwatch.offline.bn.classifier import resolve_spec
        from boxwatch.offline.bn.compile import _compile_separator
        from boxwatch.offline.bn.limits import Deadline
        from boxwatch.offline.bn.plan import plan_separator
        spec = resolve_spec(net, spec)
        with memory_guard(7 << 30):
            plan = plan_separator(net, spec, max_memory=1 << 50)
            built = _compile_separator(
                net, spec, plan, max_memory=1 << 50, deadline=Deadline(600.0, "", wall)
            )
        d = built.diagram
        out = {"positives": d.counts()[d.positive], "method": f"separator, cut {plan.cut.k}"}
except BaseException as exc:
    out = {"refused": (type(exc).__name__ + ": " + str(exc))[:200]}
out.update(wall=time.perf_counter() - wall, cpu=time.process_time() - cpu)
print(json.dumps(out))
"""


def _speed_case(root: Path, problem: dict[str, Any], mode: str) -> dict[str, Any]:
    try:
        text = subprocess.run(
            [str(root / ".venv" / "bin" / "python"), "-c", SPEED_CODE, str(root)]
            + [json.dumps(problem), mode],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
            timeout=WALL,
        ).stdout
        return json.loads(text.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return {"refused": f"stopped after {WALL} s", "wall": math.nan, "cpu": math.nan}


def _speed_cell(r: dict[str, Any]) -> str:
    if "refused" in r:
        return f"refused ({r['refused'][:60]}...) after {r['wall']:.1f} s"
    return f"{r['wall']:.1f} / {r['cpu']:.1f}"


def speed_section(baseline: Path, began: float) -> str:
    """Each 30-feature tcc4e problem by ``baseline`` and by this checkout, alternately."""
    here = Path(__file__).resolve().parents[1]
    rows = []
    for problem in speed_problems():
        base = _speed_case(baseline, problem, "limits")
        forced = _speed_case(baseline, problem, "more") if "refused" in base else None
        mine = _speed_case(here, problem, "limits")
        want = (problem.get("exact_positives") or {}).get("renormalised_rows")
        same = "-"
        if "positives" in mine and want is not None:
            same = "exact" if mine["positives"] == want else "WRONG"
        ratio = (
            f"{mine['cpu'] / base['cpu']:.2f}"
            if "refused" not in base and "refused" not in mine
            else "-"
        )
        rows.append(
            f"| {problem['name']} | {_speed_cell(base)} | "
            f"{_speed_cell(forced) if forced else '-'} | {_speed_cell(mine)} | {ratio} | "
            f"{mine.get('method', '-')} | {same} |"
        )
        print(rows[-1], flush=True)
    from _results import machine_line, run_summary

    return "\n".join(
        [
            machine_line(run_summary(began)),
            "",
            f"Before: {baseline} (main); after: this checkout. Each cell: wall / CPU seconds "
            "of compile_classifier (parsing excluded) in a fresh process under --max-memory "
            "4 GiB and --max-seconds 120, main first, then this checkout; a problem main "
            "refuses is forced there (its separator route at the cut it estimates fastest, "
            "past its estimate, 7 GiB guarded, 600 s; RLIMIT_AS 8 GiB). The machine is "
            "shared (load in the line above): compare CPU seconds, and ratios within one "
            "run. Target: <= 10 s each.",
            "",
            "| problem | before: 4 GiB / 120 s | before, forced | after: 4 GiB / 120 s | "
            "after / before CPU | route after | positives |",
            "|---|---|---|---|---|---|---|",
            *rows,
        ]
    )
