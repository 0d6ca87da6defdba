"""Bench: how wide is the exact diagram of a classifier too big to compile? (sampled lower bound)

The canonical diagram has one node per distinct sub-classifier at each level: two prefixes
share a node iff they decide alike on every completion. Sampling prefixes uniformly and
evaluating each on a set of completions (all of them where they fit) counts distinct decision
rows: a lower bound on that level's width, exact in the rows it compares. The Chao1 estimate
``distinct + f1^2 / (2 f2)`` (f1, f2: rows seen once, twice) says roughly how many more an
exhaustive count would find.

Messages come from the separator route's split (:func:`~boxwatch.offline.bn.plan.cut_at`):
each sampled prefix's CPTs are sliced at its values and contracted to the shared states, the
same for each completion, and the decisions are one matrix product.

Run: ``.venv/bin/python bench/bn_width.py``; writes its section of bench/RESULTS.md.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine_line, run_summary, write_section

from boxwatch.offline.bn.classifier import ClassifierSpec, ResolvedSpec, resolve_spec
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.network import Network
from boxwatch.offline.bn.plan import Factor, cut_at, plan_contraction, unit_factors

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "bn"
CASE = ("hepar2.bif.gz", "PBC", "present", 0.5)
LEVELS = (14, 20, 26, 30, 34)
PREFIXES = 20_000
COMPLETIONS = 4_096
TIE_TOLERANCE = 1e-9  # float decisions of sampled sub-classifiers, as measured before


def messages(
    network: Network,
    factors: Sequence[Factor],
    features: Sequence[str],
    values: np.ndarray,
    z: Sequence[str],
) -> np.ndarray:
    """Per row of ``values`` (assignments of ``features``): the factors' product summed onto ``z``."""
    where = {f: i for i, f in enumerate(features)}
    parts: list[tuple[tuple[str, ...], np.ndarray, int | None]] = []  # scope, table, feature axis
    for scope, table in factors:
        inside = [v for v in scope if v in where]
        if len(inside) > 1:
            raise ValueError(f"a CPT over several features is not sliced here: {scope}")
        if not inside:
            parts.append((scope, table, None))
            continue
        f = inside[0]
        parts.append(
            (tuple(v for v in scope if v != f), np.moveaxis(table, scope.index(f), 0), where[f])
        )

    def sliced(x: np.ndarray) -> list[Factor]:
        return [(s, t if i is None else t[x[i]]) for s, t, i in parts] + unit_factors(network, z)

    plan = plan_contraction(sliced(values[0]), list(z), max_cells=5e7)
    out = np.empty((len(values), math.prod(network.card(v) for v in z)))
    for row, x in enumerate(values):
        out[row] = plan.run(sliced(x)).reshape(-1)
    return out


def assignments(
    network: Network, features: Sequence[str], n: int, rng: np.random.Generator
) -> tuple[np.ndarray, bool]:
    """All assignments when there are at most ``n``, else ``n`` uniform ones; and whether all."""
    cards = [network.card(f) for f in features]
    if math.prod(cards) <= n:
        return np.indices(cards).reshape(len(cards), -1).T, True
    return rng.integers(0, cards, size=(n, len(cards))), False


def level_row(network: Network, spec: ResolvedSpec, k: int, rng: np.random.Generator) -> str:
    """One table row: distinct sub-classifiers among sampled prefixes of level ``k``."""
    start = time.perf_counter()
    cut = cut_at(network, spec, k)
    if cut.ctx:
        raise ValueError("features that are parents of other features are not sampled here")
    cls = spec.class_variable
    pos = network.states[cls].index(spec.positive)
    zc = network.card(cls)
    u, _ = assignments(network, cut.prefix, PREFIXES, rng)
    v, every = assignments(network, cut.suffix, COMPLETIONS, rng)
    up = messages(network, cut.upper, cut.prefix, u, cut.z).reshape(len(u), zc, -1)
    lo = messages(network, cut.lower, cut.suffix, v, cut.z).reshape(len(v), zc, -1)
    num = up[:, pos, :] @ lo[:, pos, :].T
    den = up.reshape(len(u), -1) @ lo.reshape(len(v), -1).T
    assert spec.threshold is not None  # threshold classifiers only (spec.positive above)
    with np.errstate(invalid="ignore", divide="ignore"):
        decision = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0) >= (
            spec.threshold - TIE_TOLERANCE
        )
    _, counts = np.unique(np.packbits(decision, axis=1), axis=0, return_counts=True)
    f1, f2 = int((counts == 1).sum()), int((counts == 2).sum())
    chao1 = counts.size + f1 * f1 / (2 * max(f2, 1))
    return (
        f"| {k} | {cut.n_pre:.3g} | {cut.n_suf:,} | {cut.shared_states:,} | {len(u):,} | "
        f"{len(v):,}{' (all)' if every else ''} | {counts.size:,} | {f1:,} / {f2:,} | "
        f"{chao1:.3g} | {time.perf_counter() - start:.0f} |"
    )


def main() -> None:
    """Sample the widths of the issue's hepar2 classifier in its default order."""
    began = time.perf_counter()
    file, cls, positive, threshold = CASE
    if not (SHARED / file).is_file():
        text = f"{machine_line()}\n\n- {SHARED / file} absent: skipped"
        write_section("## bn_width (bench/bn_width.py)", text)
        print(text)
        return
    network = load_network(SHARED / file)
    spec = resolve_spec(network, ClassifierSpec(cls, positive, threshold))
    rng = np.random.default_rng(0)
    inputs = math.prod(network.card(f) for f in spec.order)
    lines = [
        f"{file}, P({cls} = {positive}) >= {threshold}, all {len(spec.order)} leaves in the "
        f"default order ({inputs:.3g} inputs); uniform prefixes, seed 0:",
        "",
        "| level | prefixes | completions | shared states | prefixes sampled | completions "
        "compared | distinct sub-classifiers (width >=) | seen once / twice | Chao1 | s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k in LEVELS:
        lines.append(level_row(network, spec, k, rng))
        print(lines[-1], flush=True)
    text = "\n".join([machine_line(run_summary(began)), "", *lines])
    write_section("## bn_width (bench/bn_width.py)", text)
    print(text)


if __name__ == "__main__":
    main()
