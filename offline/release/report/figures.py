"""The report's figures, drawn with matplotlib and embedded as PNG data URIs.

They follow the papers: clustering coverage vs tau (Fig. 5), outcome counts vs tau (Fig. 7),
precision-recall per layer (Fig. 8) of the box monitor paper, the score histograms at the
operating point, and the allowed-vs-violating feature-value drawings (Figs. 3-4) of the BN
verification paper.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter

from boxwatch.offline.release.records import (
    BNSummary,
    ModelSummary,
    MonitorSummary,
    RuleSummary,
    as_record,
)
from boxwatch.offline.release.report.markup import fmt_value, given

MAX_COUNTEREXAMPLES_DRAWN = 3
OUTCOME_KEYS = ("tp", "fp", "tn", "fn", "mp", "mn")
OUTCOME_COLORS = {
    "tp": "#1b9e77",
    "fp": "#d95f02",
    "tn": "#7570b3",
    "fn": "#e7298a",
    "mp": "#66a61e",
    "mn": "#a6761d",
}
CELL_COLORS = {
    "allowed": "#8fd18f",
    "excluded": "#f2a0a0",
    "violating": "#5b9bd5",
    "any": "#d3d3d3",
    "outside": "#ffffff",
}
FIG_DPI = 100
# The score histogram's series after the reference: misclassified known, then each unknown set.
SERIES_COLORS = ("#ff7f0e", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")
SERIES_STYLES = ("-", "-.", ":", (0, (5, 1)))


def png(fig: Figure) -> str:
    """The figure as a ``data:image/png;base64,...`` URI (no timestamp or version metadata)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=FIG_DPI, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def layer_names(monitor: MonitorSummary) -> list[str]:
    """``monitor.layers`` then any layer that only appears in a per-layer section."""
    names = list(monitor.layers)
    for section in (monitor.tau, monitor.boxes, given(monitor.coverage), given(monitor.curves)):
        names += [n for n in section or {} if n not in names]
    evaluation = given(monitor.evaluation)
    if evaluation is not None:
        names += [n for n in evaluation.per_layer if n not in names]
    return names


def class_names(model: ModelSummary | None, n: int) -> list[str]:
    """The first ``n`` class names (``class k`` where the model summary has none)."""
    names = list(model.classes) if model is not None else []
    return [names[k] if k < len(names) else f"class {k}" for k in range(n)]


def _panels(n: int) -> tuple[Figure, list[Any]]:
    """A figure with ``n`` panels, two per row, about 6 x 3.5 in per pair of panels."""
    ncols = min(n, 2)
    nrows = math.ceil(n / ncols)
    fig = Figure(layout="constrained", figsize=(3.4 * ncols + 1.6, 3.0 * nrows + 0.5))
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, list(axes[:n])


def _tau_axis(ax: Any, taus: Sequence[float]) -> None:
    """Tau on the x axis, log-scaled when every tau is positive, largest tau on the left."""
    if taus and min(taus) > 0:
        ax.set_xscale("log")
    ax.set_xlabel("\u03c4 (clustering parameter)")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    lo, hi = (min(taus), max(taus)) if taus else (0.0, 1.0)
    if hi > lo:
        ax.set_xlim(hi * 1.15 if lo > 0 else hi, lo / 1.15 if lo > 0 else lo)


def _legend(fig: Figure, axes: list[Any], title: str) -> None:
    """One legend for all panels (the first panel's lines), right of them."""
    if axes:
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(
            handles, labels, loc="outside right center", fontsize=7, title=title, title_fontsize=7
        )


def coverage_figure(monitor: MonitorSummary, classes: Sequence[str] = ()) -> str:
    """Fig. 5: mean clustering coverage vs tau, one line per class, one panel per layer.

    The chosen tau of each class (``monitor.tau``) is marked with a filled dot.
    """
    coverage = given(monitor.coverage) or {}
    layers = [n for n in layer_names(monitor) if n in coverage]
    fig, axes = _panels(len(layers))
    for ax, layer in zip(axes, layers, strict=True):
        taus = [float(t) for t in coverage[layer].taus]
        chosen = monitor.tau.get(layer) or []
        for k, values in enumerate(coverage[layer].per_class):
            name = classes[k] if k < len(classes) else f"class {k}"
            y = np.array([np.nan if v is None else v for v in values], dtype=float)
            (line,) = ax.plot(taus, y, marker=".", markersize=4, linewidth=1.2, label=name)
            if k < len(chosen) and chosen[k] is not None:
                hit = np.isclose(taus, chosen[k])
                if hit.any():
                    ax.plot(
                        np.asarray(taus)[hit][:1],
                        y[hit][:1],
                        "o",
                        color=line.get_color(),
                        markersize=7,
                        markeredgecolor="black",
                    )
        _tau_axis(ax, taus)
        ax.set_ylim(-0.03, 1.03)
        ax.set_ylabel("clustering coverage r\u1d64")
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.grid(alpha=0.3)
    _legend(fig, axes, "class")
    return png(fig)


def outcomes_figure(monitor: MonitorSummary) -> str:
    """Fig. 7: TP, FP, TN, FN, MP, MN (totals over classes) vs tau, one panel per layer."""
    curves = given(monitor.curves) or {}
    layers = [n for n in layer_names(monitor) if n in curves]
    fig, axes = _panels(len(layers))
    for ax, layer in zip(axes, layers, strict=True):
        curve = curves[layer]
        taus = [float(t) for t in curve.taus]
        for key in OUTCOME_KEYS:
            ax.plot(
                taus,
                getattr(curve, key),
                marker=".",
                markersize=4,
                linewidth=1.2,
                color=OUTCOME_COLORS[key],
                label=key.upper(),
            )
        _tau_axis(ax, taus)
        ax.set_ylabel("inputs")
        ax.set_title(f"layer {layer}", fontsize=9)
        ax.grid(alpha=0.3)
    _legend(fig, axes, "outcome")
    return png(fig)


def precision_recall_figure(monitor: MonitorSummary) -> str:
    """Fig. 8: precision vs recall, one point per tau and one curve per layer.

    Stars mark each layer's chosen operating point (per-class taus, ``evaluation.per_layer``);
    the black cross marks the combined monitor (``evaluation.combined``).
    """
    curves = given(monitor.curves) or {}
    evaluation = given(monitor.evaluation)
    per_layer = evaluation.per_layer if evaluation is not None else {}
    fig = Figure(layout="constrained", figsize=(6, 3.5))
    ax = fig.subplots()
    for i, layer in enumerate(n for n in layer_names(monitor) if n in curves):
        color = f"C{i % 10}"
        c = curves[layer]
        pairs = [
            (r, p, t)
            for r, p, t in zip(c.recall, c.precision, c.taus, strict=True)
            if r is not None and p is not None
        ]
        if pairs:
            r, p, _ = zip(*pairs, strict=True)
            ax.plot(
                r,
                p,
                marker="o",
                markersize=3.5,
                linewidth=1,
                color=color,
                label=f"{layer} (points: \u03c4)",
            )
            for x, y, tau in (pairs[0], pairs[-1]):
                ax.annotate(
                    f"\u03c4={tau:g}",
                    (x, y),
                    textcoords="offset points",
                    xytext=(4, 3),
                    fontsize=6,
                    color=color,
                )
        point = per_layer.get(layer)
        if point is not None and point.recall is not None and point.precision is not None:
            ax.plot(
                [point.recall],
                [point.precision],
                "*",
                markersize=13,
                color=color,
                markeredgecolor="black",
                label=f"{layer}: chosen",
            )
    combined = evaluation.combined if evaluation is not None else None
    if combined is not None and combined.recall is not None and combined.precision is not None:
        ax.plot(
            [combined.recall],
            [combined.precision],
            "X",
            markersize=9,
            color="black",
            label="combined monitor",
        )
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlabel("recall = TP / (TP + FN + MP)")
    ax.set_ylabel("precision = TP / (TP + FP)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=7)
    return png(fig)


def histogram_series(monitor: MonitorSummary) -> list[tuple[str, list[int]]]:
    """The score histogram's series, by name, the reference first: the emitted score's
    correctly classified known inputs, misclassified known inputs and each unknown set
    (``monitor.histogram``), else the fit's known and data.unknown scores
    (``monitor.detection``, summaries without it)."""
    hist = given(monitor.histogram)
    if hist is not None:
        return [
            (f"correct known ({hist.set})", hist.correct_known),
            (f"misclassified known ({hist.set})", hist.misclassified_known),
            *hist.unknown.items(),
        ]
    detection = given(monitor.detection)
    if detection is None:
        return []
    pairs = (
        ("known (validation)", detection.histogram.known),
        ("unknown", detection.histogram.unknown),
    )
    return [(name, counts) for name, counts in pairs if counts is not None]


def histogram_edges(monitor: MonitorSummary) -> list[float]:
    """The bin edges of :func:`histogram_series`."""
    hist = given(monitor.histogram)
    if hist is not None:
        return hist.edges
    detection = given(monitor.detection)
    return [] if detection is None else detection.histogram.edges


def operating_point_figure(monitor: MonitorSummary) -> str:
    """Score histograms (share of each series per bin) with the threshold: the reference
    (correctly classified known inputs) filled, the others as lines
    (:func:`histogram_series`).

    Inputs with score <= threshold are accepted (shaded).
    """
    series = histogram_series(monitor)
    assert series  # the caller draws it only then
    edges = np.asarray(histogram_edges(monitor), dtype=float)
    threshold = monitor.calibration.threshold
    fig = Figure(layout="constrained", figsize=(6, 3.5))
    ax = fig.subplots()
    for i, (label, counts_in) in enumerate(series):
        counts = np.asarray(counts_in, dtype=float)
        share = counts / counts.sum() if counts.sum() else counts
        color = "#1f77b4" if i == 0 else SERIES_COLORS[(i - 1) % len(SERIES_COLORS)]
        if i == 0:
            ax.stairs(share, edges, fill=True, alpha=0.35, color=color)
        ax.stairs(
            share,
            edges,
            color=color,
            linewidth=1.6 if i == 0 else 1.2,
            linestyle="-" if i < 2 else SERIES_STYLES[(i - 2) % len(SERIES_STYLES)],
            label=f"{label}, n={int(counts.sum())}",
        )
    if threshold is not None:
        ax.axvspan(edges[0], threshold, color="#2e7d32", alpha=0.07, label="accepted (\u2264)")
        ax.axvline(
            threshold,
            color="black",
            linestyle="--",
            linewidth=1.2,
            label=f"threshold {fmt_value(threshold)}",
        )
    ax.set_xlabel("monitor score")
    ax.set_ylabel("share of inputs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return png(fig)


def restriction(
    cube: Mapping[str, Sequence[str]],
    premise: Mapping[str, Sequence[str]],
    states: Mapping[str, Sequence[str]],
) -> dict[str, list[str]]:
    """The features a counterexample cube pins down beyond the premise.

    A feature absent from the cube, or listing every state the premise allows it (all its
    states when the premise does not name it), is free: any allowed value violates too.
    """
    out = {}
    for feature, names in cube.items():
        allowed = premise.get(feature, states.get(feature))
        if allowed is None or set(names) != set(allowed):
            out[feature] = list(names)
    return out


def rule_figure(bn: BNSummary | Mapping[str, Any], rule: RuleSummary | Mapping[str, Any]) -> str:
    """Figs. 3-4: one row per feature, one cell per state; the query and its counterexamples.

    Query panel: green states are allowed by the premise, red ones excluded. Counterexample
    panels: blue states are the violating cube (within the premise, the class is not the
    conclusion), grey means any allowed state (the cube leaves the feature free, see
    :func:`restriction`). ``bn`` and ``rule`` may be records or a summary.json's mappings.
    """
    bn, rule = as_record(bn, BNSummary), as_record(rule, RuleSummary)
    states, premise = bn.states, rule.premise
    cubes = [
        restriction(c, premise, states) for c in rule.counterexamples[:MAX_COUNTEREXAMPLES_DRAWN]
    ]
    features = [f for f in (bn.features or states) if f in states]
    features += [f for cube in [premise, *cubes] for f in cube if f not in features]
    width = max([len(states.get(f) or _cube_states(f, premise, cubes)) for f in features] + [1])
    panels = [("query", premise)] + [(f"counterexample {i + 1}", c) for i, c in enumerate(cubes)]
    longest = max([len(str(n)) for f in features for n in states.get(f, ())] + [4])
    cell_in = min(0.8, max(0.5, 0.047 * longest))  # ~0.047 in per character at 5.5 pt
    fig_w = min(9.5, 1.6 + cell_in * width * len(panels))
    chars = max(4, int((fig_w - 1.8) / (width * len(panels)) / 0.047))
    fig = Figure(layout="constrained", figsize=(fig_w, 0.9 + 0.3 * len(features)))
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for p, (ax, (title, cube)) in enumerate(zip(axes, panels, strict=True)):
        for row, feature in enumerate(features):
            names = list(states.get(feature) or _cube_states(feature, premise, cubes))
            allowed = set(premise.get(feature, names))
            for col, name in enumerate(names):
                if p == 0:
                    kind = "allowed" if name in allowed else "excluded"
                elif feature not in cube:
                    kind = "any" if name in allowed else "outside"
                else:
                    kind = "violating" if name in cube[feature] else "outside"
                ax.add_patch(
                    Rectangle(
                        (col, row),
                        0.94,
                        0.86,
                        facecolor=CELL_COLORS[kind],
                        edgecolor="#777",
                        linewidth=0.5,
                    )
                )
                label = str(name) if len(str(name)) <= chars else str(name)[: chars - 1] + "\u2026"
                ax.text(col + 0.47, row + 0.43, label, ha="center", va="center", fontsize=5.5)
        ax.set_xlim(-0.05, width)
        ax.set_ylim(len(features), -0.1)
        ax.set_xticks([])
        ax.set_title(title, fontsize=8)
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
    axes[0].set_yticks([r + 0.43 for r in range(len(features))], features, fontsize=7)
    for ax in axes:
        ax.tick_params(axis="y", length=0)
    fig.suptitle(
        f"rule {rule.id}: premise \u21d2 {bn.class_} = {rule.conclusion}; "
        "counterexamples give another class",
        fontsize=8,
    )
    legend = [
        Patch(facecolor=CELL_COLORS[k], edgecolor="#777", label=label)
        for k, label in (
            ("allowed", "allowed by premise"),
            ("excluded", "excluded by premise"),
            ("violating", "counterexample (violating)"),
            ("any", "any allowed value"),
            ("outside", "not in the counterexample"),
        )
    ]
    fig.legend(handles=legend, loc="outside lower center", ncol=3, fontsize=6.5, frameon=False)
    return png(fig)


def _cube_states(feature: str, *cubes_or_premise: Any) -> list[str]:
    """State names of ``feature`` seen in a premise or cubes (used when ``bn.states`` lacks it)."""
    seen: list[str] = []
    for item in cubes_or_premise:
        for cube in item if isinstance(item, list) else [item]:
            seen += [s for s in cube.get(feature, []) if s not in seen]
    return seen
