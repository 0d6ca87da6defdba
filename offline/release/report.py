"""The build report: one self-contained HTML page (figures as embedded PNG) plus ``summary.json``.

A reviewer reads the HTML in a browser or on paper; a pipeline reads ``summary.json``. Both are
drawn only from the build summary, so every number on the page is a summary value. Figures follow
the papers: clustering coverage vs tau (Fig. 5), outcome counts vs tau (Fig. 7), precision-recall
per layer (Fig. 8) of the box monitor paper, and the allowed-vs-violating feature-value drawings
(Figs. 3-4) of the BN verification paper.

Key numbers carry stable element ids and ``data-value`` (the summary value as JSON), and show
it formatted by :func:`fmt_value`. ``L{i}`` in an id is the layer's position in
``monitor.layers``, ``C{k}`` a class index, ``{j}`` a rule, FMO query or timing index:

* header: ``meta-name``, ``meta-model-version``, ``meta-builder-version``, ``meta-created-at``,
  ``artifact-id``, ``artifact-key-id``, ``artifact-path``, ``artifact-sha256``,
  ``artifact-bytes``, ``policy-status`` (PASS/FAIL), ``policy-reason-{j}``;
* model: ``model-path``, ``model-format``, ``model-digest``, ``model-n-classes``,
  ``model-accuracy-train``, ``model-accuracy-validation``;
* monitor: ``monitor-taus``, ``monitor-tau-selection``, ``monitor-calibration-set``, ``monitor-score``,
  ``monitor-tau-L{i}-C{k}``, ``monitor-boxes-good-L{i}-C{k}``, ``monitor-boxes-bad-L{i}-C{k}``;
  the layer choice: ``layer-choice-mode`` (``auto`` or ``config``), ``layer-choice-rule``, per
  candidate ``j`` (graph order) ``layer-choice-{j}-layer``, ``-auroc``, ``-chosen``,
  ``-reason``;
  ``calibration-threshold``, ``calibration-target-acceptance``, ``calibration-known-acceptance``,
  ``calibration-unknown-acceptance``, ``calibration-n-known``, ``calibration-n-unknown``,
  ``detection-auroc``, ``detection-fpr-at-95``; per unknown set ``j`` (``unknown``, then
  ``unknown_*``): ``operating-point-{j}-set``, ``-n``, ``-acceptance``, ``-auroc``;
  the emitted verdict split per set ``j``: ``split-{j}-set``, ``-n``, ``-accept``,
  ``-uncertainty``, ``-reject``; model errors per labelled set ``S`` (validation, test):
  ``errors-S-n``, ``-misclassified``, ``-accept``, ``-uncertainty``, ``-reject``,
  ``-auroc-score``, ``-auroc-msp``; baselines per row ``j``: ``baseline-{j}-method``,
  ``-correct``, ``-misclassified``, ``-{unknown set}`` (with data.test: ``-test-correct``,
  ``-test-misclassified``); ``warning-{j}`` (or
  ``warnings-none``); ``eval-L{i}-{key}`` and ``eval-combined-{key}``
  for key in tp fp tn fn mp mn precision recall f1;
* BN: ``bn-file``, ``bn-class``, ``bn-decision``, ``bn-positive``, ``bn-threshold``, ``bn-nodes``,
  ``bn-nodes-quasi``, ``bn-positives``, ``bn-inputs``, ``bn-ties``, ``bn-seconds``,
  ``rule-{j}-id``, ``rule-{j}-verdict``, ``rule-{j}-violations``, ``rule-{j}-probability``,
  ``fmo-{j}-id``, ``fmo-{j}-verdict``; ``timing-{j}``;
* figures (``<figure>`` with ``<img>`` and ``<figcaption>``): ``fig-coverage``,
  ``fig-outcomes``, ``fig-precision-recall``, ``fig-operating-point``, ``fig-rule-{j}`` (violated
  rules only); an absent section leaves ``{name}-omitted`` (``model-``, ``monitor-``, ``bn-``,
  ``fig-coverage-``, ``fig-outcomes-``, ``calibration-``, ``evaluation-``, ``bn-rules-``,
  ``bn-fmo-``) with a sentence saying so.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter

from boxwatch.agent.atomic import write_atomic
from boxwatch.agent.errors import BoxwatchError
from boxwatch.offline.monitors.baselines import NEEDS
from boxwatch.offline.release.emitted import BASELINES

REPORT_NAME = "report.html"
SUMMARY_NAME = "summary.json"
MISSING = "n/a"
MAX_COUNTEREXAMPLES_DRAWN = 3
OUTCOME_KEYS = ("tp", "fp", "tn", "fn", "mp", "mn")
EVAL_KEYS = (*OUTCOME_KEYS, "precision", "recall", "f1")
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

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:1.5em auto;
max-width:62em;padding:0 1em;color:#222;line-height:1.4}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{border:1px solid #ccc;padding:.25em .55em;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.15em 1em}dl.meta dt{font-weight:600}
dl.meta dd{margin:0;overflow-wrap:anywhere}
.status{display:inline-block;font-weight:700;padding:.15em .7em;border-radius:.3em;color:#fff}
.pass{background:#2e7d32}.fail{background:#c62828}
.holds{color:#2e7d32;font-weight:600}.violated{color:#c62828;font-weight:600}
.cannot_flip_twice{color:#555}
figure{margin:1em 0;page-break-inside:avoid;break-inside:avoid}
figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.9em;color:#444;margin-top:.3em}
.omitted{color:#666;font-style:italic}code{font-size:.9em;overflow-wrap:anywhere}
nav ul{columns:2;font-size:.92em}
@media print{body{max-width:none;margin:0}nav{display:none}h2{page-break-after:avoid}
.status{-webkit-print-color-adjust:exact;print-color-adjust:exact}}
"""


# ----------------------------------------------------------------------------- writing


def summary_json(summary: Mapping[str, Any]) -> str:
    """The canonical ``summary.json`` text (sorted keys, indent 2, trailing newline).

    Raises ValueError listing every non-finite float or non-JSON value by its path, so a
    summary builder learns all of them at once.
    """
    problems = list(_json_problems(summary, "summary"))
    if problems:
        raise ValueError("summary is not plain finite JSON at: " + ", ".join(problems))
    return json.dumps(summary, indent=2, sort_keys=True, allow_nan=False) + "\n"


def write_report(summary: Mapping[str, Any], out_dir: str | Path) -> Path:
    """Write ``out_dir/report.html`` and ``out_dir/summary.json`` atomically; return the HTML path.

    Both texts are rendered before anything touches the disk; each file is written to a temp
    file in ``out_dir`` and renamed over the old one, so readers see the old or the new file
    whole. ``out_dir`` is created when missing.
    """
    text = summary_json(summary)
    page = render_report(summary)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BoxwatchError(f"cannot create report folder {out}: {exc.strerror or exc}") from None
    _write_atomic(out / SUMMARY_NAME, text)
    _write_atomic(out / REPORT_NAME, page)
    return out / REPORT_NAME


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) atomically (:func:`~boxwatch.agent.atomic.write_atomic`)."""
    try:
        write_atomic(path, text.encode("utf-8"), mode=0o644)  # a report is meant to be read
    except OSError as exc:
        raise BoxwatchError(f"cannot write {path}: {exc.strerror or exc}") from None


def _json_problems(obj: Any, where: str) -> Iterator[str]:
    """Paths under ``obj`` holding non-finite floats or values JSON cannot hold as-is."""
    if obj is None or isinstance(obj, str | bool | int):
        return
    if isinstance(obj, float):
        if not math.isfinite(obj):
            yield f"{where}={obj!r}"
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            if not isinstance(key, str):
                yield f"{where}[{key!r}] (non-string key)"
            yield from _json_problems(value, f"{where}.{key}")
    elif isinstance(obj, list | tuple):
        for i, value in enumerate(obj):
            yield from _json_problems(value, f"{where}[{i}]")
    else:
        yield f"{where} ({type(obj).__name__})"


# ----------------------------------------------------------------------------- formatting


def fmt_value(value: Any) -> str:
    """How every number is shown: ints plainly, floats with 4 decimals (or 3-digit exponent
    form outside [1e-3, 1e5)), None as ``n/a``."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value == 0 or 1e-3 <= abs(value) < 1e5:
            return f"{value:.4f}"
        return f"{value:.3e}"
    return str(value)


def _e(value: Any) -> str:
    """HTML-escaped text of ``value`` (None as ``n/a``)."""
    return html.escape(MISSING if value is None else str(value), quote=True)


def _num(elem_id: str, value: Any) -> str:
    """A number with a stable id, its exact value in ``data-value`` and its formatted text."""
    return (
        f'<span id="{_e(elem_id)}" class="num" data-value="{_e(json.dumps(value))}">'
        f"{_e(fmt_value(value))}</span>"
    )


def _text(elem_id: str, value: Any) -> str:
    """A string field with a stable id."""
    return f'<span id="{_e(elem_id)}">{_e(value)}</span>'


def _rows(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    numeric: Sequence[bool] = (),
    table_id: str | None = None,
) -> str:
    """An HTML table; ``rows`` hold ready HTML cells, ``numeric`` right-aligns columns."""
    num = (list(numeric) + [False] * len(header))[: len(header)]
    attr = f' id="{_e(table_id)}"' if table_id else ""
    head = "".join(
        f"<th{' class=n' if n else ''}>{_e(h)}</th>" for h, n in zip(header, num, strict=True)
    )
    body = "".join(
        "<tr>"
        + "".join(f"<td{' class=n' if n else ''}>{c}</td>" for c, n in zip(row, num, strict=True))
        + "</tr>"
        for row in rows
    )
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(elem_id: str, uri: str, alt: str, caption: str) -> str:
    """An embedded figure with its caption."""
    return (
        f'<figure id="{_e(elem_id)}"><img src="{uri}" alt="{_e(alt)}">'
        f"<figcaption>{caption}</figcaption></figure>"
    )


def _omitted(elem_id: str, why: str) -> str:
    return f'<p id="{_e(elem_id)}" class="omitted">{_e(why)}</p>'


def _cube_text(
    cube: Mapping[str, Any], features: Sequence[str] = (), empty: str = "any input"
) -> str:
    """``f in {a, b}; g = c`` for a cube of allowed state names (escaped), in feature order.

    A value may be one state name or a list of them.
    """
    if not cube:
        return _e(empty)
    order = [f for f in features if f in cube] + [f for f in cube if f not in features]
    parts = []
    for feature in order:
        value = cube[feature]
        names = [value] if isinstance(value, str) or not isinstance(value, Sequence) else value
        names = list(names)
        parts.append(
            f"{feature} = {names[0]}"
            if len(names) == 1
            else f"{feature} \u2208 {{{', '.join(map(str, names))}}}"
        )
    return _e("; ".join(parts))


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


def _witness_text(witness: Any) -> str:
    """An FMO witness: fixed features, the feature's rising values and the classes they get."""
    if isinstance(witness, Mapping) and {"fixed", "values", "classes"} <= set(witness):
        fixed = "; ".join(f"{k} = {v}" for k, v in (witness["fixed"] or {}).items())
        rise = " \u2192 ".join(map(str, witness["values"]))
        classes = " \u2192 ".join(map(str, witness["classes"]))
        return _e(f"{fixed + ': ' if fixed else ''}{rise} gives {classes}")
    return f"<code>{_e(json.dumps(witness, sort_keys=True))}</code>"


# ----------------------------------------------------------------------------- figures


def _png(fig: Figure) -> str:
    """The figure as a ``data:image/png;base64,...`` URI (no timestamp or version metadata)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=FIG_DPI, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _layer_names(monitor: Mapping[str, Any]) -> list[str]:
    """``monitor.layers`` then any layer that only appears in a per-layer section."""
    names = list(monitor.get("layers") or [])
    for key in ("tau", "boxes", "coverage", "curves"):
        names += [n for n in (monitor.get(key) or {}) if n not in names]
    names += [
        n for n in ((monitor.get("evaluation") or {}).get("per_layer") or {}) if n not in names
    ]
    return names


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


def _class_names(summary_model: Mapping[str, Any] | None, n: int) -> list[str]:
    names = list((summary_model or {}).get("classes") or [])
    return [names[k] if k < len(names) else f"class {k}" for k in range(n)]


def _coverage_measure(monitor: dict[str, Any]) -> str:
    """What the coverage curves plot, as the summary states it (default: r_u itself)."""
    for layer in monitor.get("coverage", {}).values():
        if layer.get("measure"):
            return str(layer["measure"])
    return "the upper coverage bound r_u"


def coverage_figure(monitor: Mapping[str, Any], classes: Sequence[str] = ()) -> str:
    """Fig. 5: mean clustering coverage vs tau, one line per class, one panel per layer.

    The chosen tau of each class (``monitor.tau``) is marked with a filled dot.
    """
    coverage = monitor["coverage"]
    layers = [n for n in _layer_names(monitor) if n in coverage]
    fig, axes = _panels(len(layers))
    for ax, layer in zip(axes, layers, strict=True):
        taus = [float(t) for t in coverage[layer]["taus"]]
        per_class = coverage[layer]["per_class"]
        chosen = (monitor.get("tau") or {}).get(layer) or []
        for k, values in enumerate(per_class):
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
    if layers:
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(
            handles, labels, loc="outside right center", fontsize=7, title="class", title_fontsize=7
        )
    return _png(fig)


def outcomes_figure(monitor: Mapping[str, Any]) -> str:
    """Fig. 7: TP, FP, TN, FN, MP, MN (totals over classes) vs tau, one panel per layer."""
    curves = monitor["curves"]
    layers = [n for n in _layer_names(monitor) if n in curves]
    fig, axes = _panels(len(layers))
    for ax, layer in zip(axes, layers, strict=True):
        taus = [float(t) for t in curves[layer]["taus"]]
        for key in OUTCOME_KEYS:
            if curves[layer].get(key) is not None:
                ax.plot(
                    taus,
                    curves[layer][key],
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
    if layers:
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(
            handles,
            labels,
            loc="outside right center",
            fontsize=7,
            title="outcome",
            title_fontsize=7,
        )
    return _png(fig)


def precision_recall_figure(monitor: Mapping[str, Any]) -> str:
    """Fig. 8: precision vs recall, one point per tau and one curve per layer.

    Stars mark each layer's chosen operating point (per-class taus, ``evaluation.per_layer``);
    the black cross marks the combined monitor (``evaluation.combined``).
    """
    curves = monitor["curves"]
    evaluation = monitor.get("evaluation") or {}
    per_layer = evaluation.get("per_layer") or {}
    fig = Figure(layout="constrained", figsize=(6, 3.5))
    ax = fig.subplots()
    for i, layer in enumerate(n for n in _layer_names(monitor) if n in curves):
        color = f"C{i % 10}"
        c = curves[layer]
        pairs = [
            (r, p, t)
            for r, p, t in zip(
                c.get("recall") or [], c.get("precision") or [], c["taus"], strict=True
            )
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
        point = per_layer.get(layer) or {}
        if point.get("recall") is not None and point.get("precision") is not None:
            ax.plot(
                [point["recall"]],
                [point["precision"]],
                "*",
                markersize=13,
                color=color,
                markeredgecolor="black",
                label=f"{layer}: chosen",
            )
    combined = evaluation.get("combined") or {}
    if combined.get("recall") is not None and combined.get("precision") is not None:
        ax.plot(
            [combined["recall"]],
            [combined["precision"]],
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
    return _png(fig)


def operating_point_figure(monitor: Mapping[str, Any]) -> str:
    """Score histograms of known and unknown inputs (share of each set) with the threshold.

    Inputs with score <= threshold are accepted (shaded).
    """
    hist = monitor["detection"]["histogram"]
    edges = np.asarray(hist["edges"], dtype=float)
    threshold = (monitor.get("calibration") or {}).get("threshold")
    fig = Figure(layout="constrained", figsize=(6, 3.5))
    ax = fig.subplots()
    for key, color, label in (
        ("known", "#1f77b4", "known (validation)"),
        ("unknown", "#d62728", "unknown"),
    ):
        counts = hist.get(key)
        if counts is None:
            continue
        counts = np.asarray(counts, dtype=float)
        share = counts / counts.sum() if counts.sum() else counts
        ax.stairs(share, edges, fill=True, alpha=0.35, color=color)
        ax.stairs(share, edges, color=color, linewidth=1.2, label=f"{label}, n={int(counts.sum())}")
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
    return _png(fig)


def rule_figure(bn: Mapping[str, Any], rule: Mapping[str, Any]) -> str:
    """Figs. 3-4: one row per feature, one cell per state; the query and its counterexamples.

    Query panel: green states are allowed by the premise, red ones excluded. Counterexample
    panels: blue states are the violating cube (within the premise, the class is not the
    conclusion), grey means any allowed state (the cube leaves the feature free, see
    :func:`restriction`).
    """
    states: Mapping[str, Sequence[str]] = bn.get("states") or {}
    premise: Mapping[str, Sequence[str]] = rule.get("premise") or {}
    cubes = [
        restriction(c, premise, states)
        for c in list(rule.get("counterexamples") or [])[:MAX_COUNTEREXAMPLES_DRAWN]
    ]
    features = [f for f in (bn.get("features") or states) if f in states]
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
    conclusion = f"{bn.get('class', 'class')} = {rule.get('conclusion')}"
    fig.suptitle(
        f"rule {rule.get('id')}: premise \u21d2 {conclusion}; counterexamples give another class",
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
    return _png(fig)


def _cube_states(feature: str, *cubes_or_premise: Any) -> list[str]:
    """State names of ``feature`` seen in a premise or cubes (used when ``bn.states`` lacks it)."""
    seen: list[str] = []
    for item in cubes_or_premise:
        for cube in item if isinstance(item, list) else [item]:
            seen += [s for s in cube.get(feature, []) if s not in seen]
    return seen


# ----------------------------------------------------------------------------- sections


def _header(summary: Mapping[str, Any]) -> str:
    meta = summary.get("metadata") or {}
    art = summary.get("artifact") or {}
    policy = summary.get("policy")
    failed = list((policy or {}).get("failed") or [])
    status, cls = ("FAIL", "fail") if failed else ("PASS", "pass")
    items = [
        ("Model version", _text("meta-model-version", meta.get("model_version"))),
        ("Artifact id", _text("artifact-id", art.get("artifact_id"))),
        ("Signing key id", _text("artifact-key-id", art.get("key_id"))),
        ("Created", _text("meta-created-at", meta.get("created_at"))),
        ("Builder version", _text("meta-builder-version", meta.get("builder_version"))),
        ("Artifact file", f"<code>{_text('artifact-path', art.get('path'))}</code>"),
        ("Artifact SHA-256", f"<code>{_text('artifact-sha256', art.get('sha256'))}</code>"),
        ("Artifact size (bytes)", _num("artifact-bytes", art.get("bytes"))),
    ]
    dl = "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in items)
    if policy is None:
        note = "<p>No build policy configured.</p>"
    else:
        fail_on = ", ".join(map(str, policy.get("fail_on") or [])) or "nothing"
        note = f"<p>Policy fails on: {_e(fail_on)}.</p>"
        if failed:
            note += (
                '<ul id="policy-reasons">'
                + "".join(f'<li id="policy-reason-{i}">{_e(r)}</li>' for i, r in enumerate(failed))
                + "</ul>"
            )
    return (
        f'<header><h1 id="meta-name">{_e(meta.get("name", "boxwatch build"))}</h1>'
        f"<p>Build report of <code>boxwatch build-artifact</code> \u2014 policy "
        f'<span id="policy-status" class="status {cls}">{status}</span></p>{note}'
        f'<dl class="meta">{dl}</dl></header>'
    )


def _model_section(summary: Mapping[str, Any]) -> str:
    model = summary.get("model")
    monitor = summary.get("monitor")
    out = ['<section id="model"><h2>Model and monitor</h2>']
    if model is None:
        out.append(_omitted("model-omitted", "No model in this build (the config has none)."))
    else:
        acc = model.get("accuracy") or {}
        rows: list[tuple[str, ...]] = [
            ("File", f"<code>{_text('model-path', model.get('path'))}</code>"),
            ("Format", _text("model-format", model.get("format"))),
            ("Digest", f"<code>{_text('model-digest', model.get('digest'))}</code>"),
            (
                "Classes",
                f"{_num('model-n-classes', len(model.get('classes') or []))}: "
                f"{_e(', '.join(map(str, model.get('classes') or [])))}",
            ),
            ("Layers", _e(", ".join(map(str, model.get("layers") or [])))),
            ("Accuracy (train)", _num("model-accuracy-train", acc.get("train"))),
            ("Accuracy (validation)", _num("model-accuracy-validation", acc.get("validation"))),
        ]
        out.append(_rows(("Model", ""), [(_e(k), v) for k, v in rows], table_id="model-table"))
    if monitor is None:
        out.append(
            _omitted(
                "monitor-omitted",
                "No box monitor in this build (the config has no model or no monitor section).",
            )
        )
        out.append("</section>")
        return "".join(out)
    classes_n = max([len(v) for v in (monitor.get("tau") or {}).values()] + [0])
    classes = _class_names(model, classes_n)
    taus = list(monitor.get("taus") or [])
    out.append(
        f"<p>Monitored layers: {_e(', '.join(_layer_names(monitor)))}. Candidate \u03c4: "
        f'<span id="monitor-taus" data-value="{_e(json.dumps(taus))}">'
        f"{_e(', '.join(fmt_value(t) for t in taus))}</span>. "
        f"\u03c4 selection: {_text('monitor-tau-selection', monitor.get('tau_selection'))}; "
        f"calibrated on: {_text('monitor-calibration-set', monitor.get('calibration_set'))}; "
        f"score: {_text('monitor-score', monitor.get('score', 'distance'))}"
        + (
            f" (contrast layers: {_e(', '.join(monitor['contrast_layers']))})"
            if monitor.get("contrast_layers")
            else ""
        )
        + ".</p>"
    )
    out.append(_layer_choice(monitor.get("layer_choice")))
    rows = []
    for i, layer in enumerate(_layer_names(monitor)):
        tau = (monitor.get("tau") or {}).get(layer) or []
        boxes = (monitor.get("boxes") or {}).get(layer) or {}
        good, bad = boxes.get("good") or [], boxes.get("bad") or []
        for k in range(max(len(tau), len(good), len(bad))):
            rows.append(
                (
                    _e(layer),
                    _e(classes[k] if k < len(classes) else f"class {k}"),
                    _num(f"monitor-tau-L{i}-C{k}", tau[k] if k < len(tau) else None),
                    _num(f"monitor-boxes-good-L{i}-C{k}", good[k] if k < len(good) else None),
                    _num(f"monitor-boxes-bad-L{i}-C{k}", bad[k] if k < len(bad) else None),
                )
            )
    out.append(
        _rows(
            ("Layer", "Class", "Chosen \u03c4", "Good boxes", "Bad boxes"),
            rows,
            numeric=(False, False, True, True, True),
            table_id="monitor-table",
        )
    )
    out.append("</section>")
    return "".join(out)


def _layer_choice(choice: Mapping[str, Any] | None) -> str:
    """Why these layers: the config's list, or the auto choice's ranking of every candidate."""
    if not choice:
        return ""
    mode = choice.get("mode")
    head = (
        f"<p>Layer choice: {_text('layer-choice-mode', mode)} "
        f"({_text('layer-choice-rule', choice.get('rule'))}"
    )
    if mode != "auto":
        return head + ").</p>"
    rows = choice.get("rows") or {}
    head += (
        f"; ranked on {_e(rows.get('train'))} training and {_e(rows.get('validation'))} "
        f"{_e(choice.get('set'))} inputs, pooling {_e(choice.get('pooling'))}).</p>"
    )
    table = [
        (
            _text(f"layer-choice-{j}-layer", c.get("layer")),
            _e(c.get("kind")),
            _e(c.get("features")),
            _num(f"layer-choice-{j}-auroc", c.get("auroc")),
            _text(f"layer-choice-{j}-chosen", "yes" if c.get("chosen") else "no"),
            _text(f"layer-choice-{j}-reason", c.get("reason")),
        )
        for j, c in enumerate(choice.get("candidates") or [])
    ]
    return head + _rows(
        ("Candidate", "Kind", "Features", "Held-out-class AUROC", "Chosen", "Why"),
        table,
        numeric=(False, False, True, True, False, False),
        table_id="layer-choice-table",
    )


def _monitor_figures(summary: Mapping[str, Any]) -> str:
    monitor = summary.get("monitor")
    if monitor is None:
        return ""
    classes_n = max(
        [len(v.get("per_class") or []) for v in (monitor.get("coverage") or {}).values()] + [0]
    )
    classes = _class_names(summary.get("model"), classes_n)
    out = ['<section id="monitor-figures"><h2>Box monitor</h2>']
    if monitor.get("coverage"):
        out.append(
            _figure(
                "fig-coverage",
                coverage_figure(monitor, classes),
                "clustering coverage vs tau",
                "Fig. 5 \u2014 Clustering coverage of the good features' boxes vs the clustering "
                "parameter \u03c4, one line per class, one panel per layer; large dots mark each "
                "class's chosen \u03c4. Plotted: " + html.escape(_coverage_measure(monitor)) + ".",
            )
        )
    else:
        out.append(_omitted("fig-coverage-omitted", "No coverage data in the summary."))
    if monitor.get("curves"):
        out.append(
            _figure(
                "fig-outcomes",
                outcomes_figure(monitor),
                "outcome counts vs tau",
                "Fig. 7 \u2014 Numbers of the six outcomes (totals over the class monitors) on the "
                "validation and unknown inputs vs \u03c4, one panel per layer.",
            )
        )
        out.append(
            _figure(
                "fig-precision-recall",
                precision_recall_figure(monitor),
                "precision-recall",
                "Fig. 8 \u2014 Precision vs recall, one point per \u03c4 (uniform over classes), one "
                "curve per layer; stars: each layer's chosen per-class \u03c4; cross: the combined "
                "monitor.",
            )
        )
    else:
        out.append(_omitted("fig-outcomes-omitted", "No outcome curves in the summary."))
    out.append(_operating_point(monitor))
    out.append(_evaluation(monitor))
    out.append(_warnings(monitor))
    out.append("</section>")
    return "".join(out)


def _share_cells(prefix: str, v: Mapping[str, Any]) -> list[str]:
    return [_num(f"{prefix}-{k}", v.get(k)) for k in ("n", "accept", "uncertainty", "reject")]


def _operating_point(monitor: Mapping[str, Any]) -> str:
    cal = monitor.get("calibration")
    det = monitor.get("detection") or {}
    out = ['<h3 id="operating-point">Calibrated operating point</h3>']
    if cal is None and not det:
        return out[0] + _omitted("calibration-omitted", "No calibration in the summary.")
    out.append(
        "<p>The monitor emits one verdict per input: <em>accept</em>, <em>uncertainty</em> or "
        "<em>reject</em>. <strong>Accepted</strong> means the emitted verdict is accept; "
        "uncertainty and reject never count as accepted. With <code>combine: calibrated</code> "
        "inputs scoring above the threshold on the score are rejected; of the others, those "
        "on which the model's confidence (its top softmax probability) is below the "
        "confidence floor get uncertainty, and the rest are accepted. Both are chosen so "
        "that the emitted verdicts accept the target share of the correctly classified "
        "known calibration inputs.</p>"
    )
    if det.get("histogram"):
        out.append(
            _figure(
                "fig-operating-point",
                operating_point_figure(monitor),
                "score histograms",
                "Operating point \u2014 monitor scores of known (validation) and unknown inputs "
                "(the data.unknown set), "
                "as the share of each set per bin; inputs scoring above the threshold (dashed) "
                "are rejected.",
            )
        )
    cal = cal or {}
    rows = [
        ("Threshold on the score", "calibration-threshold", cal.get("threshold")),
        (
            "Confidence floor (below it: uncertainty; empty: none)",
            "calibration-confidence-floor",
            cal.get("confidence_floor"),
        ),
        (
            "Target: share of correctly classified known inputs accepted",
            "calibration-target-acceptance",
            cal.get("target_acceptance"),
        ),
        (
            "Accepted (emitted verdicts), calibration population",
            "calibration-known-acceptance",
            cal.get("known_acceptance"),
        ),
        (
            "Accepted (emitted verdicts), data.unknown",
            "calibration-unknown-acceptance",
            cal.get("unknown_acceptance"),
        ),
        (
            "Calibration population (correct known inputs)",
            "calibration-n-known",
            cal.get("n_known"),
        ),
        ("Unknown inputs", "calibration-n-unknown", cal.get("n_unknown")),
        ("Score AUROC (known vs data.unknown)", "detection-auroc", det.get("auroc")),
        (
            "Score alone: unknown share under the 95% known quantile (not the verdicts)",
            "detection-fpr-at-95",
            det.get("fpr_at_95"),
        ),
    ]
    out.append(
        _rows(
            ("Quantity", "Value"),
            [(_e(k), _num(i, v)) for k, i, v in rows],
            numeric=(False, True),
            table_id="calibration-table",
        )
    )
    verdicts = monitor.get("verdicts") or {}
    split = verdicts.get("split") or {}
    if split:
        out.append(
            f"<p>Emitted verdicts, computed by the agent's own runtime on the "
            f"{_e(verdicts.get('set'))} inputs (correct / misclassified known), each "
            "unknown set and (when given) the test set, as the share of each set:</p>"
        )
        out.append(
            _rows(
                ("Set", "Inputs", "Accept", "Uncertainty", "Reject"),
                [
                    [_text(f"split-{j}-set", name), *_share_cells(f"split-{j}", v)]
                    for j, (name, v) in enumerate(split.items())
                ],
                numeric=(False, True, True, True, True),
                table_id="verdict-split-table",
            )
        )
    points = monitor.get("operating_points") or []
    if points:
        out.append(
            "<p>Each unknown set: the share of its emitted verdicts that accept "
            "(false accepts), and how well the score separates it from the known "
            "validation inputs (AUROC).</p>"
        )
        out.append(
            _rows(
                ("Unknown set", "Inputs", "Accepted", "AUROC"),
                [
                    (
                        _text(f"operating-point-{j}-set", p.get("set")),
                        _num(f"operating-point-{j}-n", p.get("n")),
                        _num(f"operating-point-{j}-acceptance", p.get("acceptance")),
                        _num(f"operating-point-{j}-auroc", p.get("auroc")),
                    )
                    for j, p in enumerate(points)
                ],
                numeric=(False, True, True, True),
                table_id="operating-points-table",
            )
        )
    out.append(_model_errors(monitor))
    out.append(_baselines(monitor))
    return "".join(out)


def _model_errors(monitor: Mapping[str, Any]) -> str:
    errors = monitor.get("model_errors") or {}
    out = ['<h3 id="model-errors">Model errors</h3>']
    if not errors:
        return out[0] + _omitted("model-errors-omitted", "No labelled held-out inputs.")
    out.append(
        "<p>The model's wrong predictions on labelled held-out inputs (data.test is "
        "never used to fit or calibrate): the share of each emitted verdict among "
        "them, and how well the box score and the maximum softmax probability rank "
        "wrong predictions above right ones (AUROC; 0.5 is chance).</p>"
    )
    rows = []
    for name, e in errors.items():
        v = e.get("verdicts") or {}
        rows.append(
            [
                _e(name),
                _num(f"errors-{name}-n", e.get("n")),
                _num(f"errors-{name}-misclassified", e.get("n_misclassified")),
                _num(f"errors-{name}-accept", v.get("accept")),
                _num(f"errors-{name}-uncertainty", v.get("uncertainty")),
                _num(f"errors-{name}-reject", v.get("reject")),
                _num(f"errors-{name}-auroc-score", e.get("auroc_score")),
                _num(f"errors-{name}-auroc-msp", e.get("auroc_msp")),
            ]
        )
    out.append(
        _rows(
            (
                "Set",
                "Inputs",
                "Misclassified",
                "Accept",
                "Uncertainty",
                "Reject",
                "AUROC (box score)",
                "AUROC (MSP)",
            ),
            rows,
            numeric=(False, *[True] * 7),
            table_id="model-errors-table",
        )
    )
    return "".join(out)


def _baselines(monitor: Mapping[str, Any]) -> str:
    rows_in = monitor.get("baselines") or []
    out = ['<h3 id="baselines">Baselines at matched acceptance</h3>']
    if not rows_in:
        return out[0] + _omitted("baselines-omitted", "No baseline rows in the summary.")
    sets = list((rows_in[0].get("unknown") or {}).keys())
    labels = [BASELINES[r["method"]].label for r in rows_in if r.get("method") in BASELINES]
    out.append(
        f"<p>The baselines ({_e(', '.join(labels))}; defined under what the columns mean), each "
        "with the threshold that accepts the same share of correctly classified known "
        "validation inputs as the box monitor's emitted verdicts; the share each "
        "accepts of misclassified known inputs and of every unknown set (lower is "
        "better).</p>"
    )
    has_test = "test" in rows_in[0]
    rows = []
    for j, r in enumerate(rows_in):
        test = r.get("test") or {}
        rows.append(
            [
                _text(f"baseline-{j}-method", r.get("method")),
                _num(f"baseline-{j}-correct", r.get("correct_known")),
                _num(f"baseline-{j}-misclassified", r.get("misclassified_known")),
                *[
                    _num(f"baseline-{j}-{name}", (r.get("unknown") or {}).get(name))
                    for name in sets
                ],
                *(
                    [
                        _num(f"baseline-{j}-test-correct", test.get("correct_known")),
                        _num(f"baseline-{j}-test-misclassified", test.get("misclassified_known")),
                    ]
                    if has_test
                    else []
                ),
            ]
        )
    header = (
        "Method",
        "Correct known accepted",
        "Misclassified accepted",
        *[f"{n} accepted" for n in sets],
        *(("Test: correct accepted", "Test: misclassified accepted") if has_test else ()),
    )
    out.append(
        _rows(
            header, rows, numeric=(False, *[True] * (len(header) - 1)), table_id="baselines-table"
        )
    )
    return "".join(out)


def _warnings(monitor: Mapping[str, Any]) -> str:
    warnings = monitor.get("warnings")
    if warnings is None:
        return ""
    out = ['<h3 id="warnings">Warnings</h3>']
    if not warnings:
        return out[0] + '<p id="warnings-none">None.</p>'
    out.append(
        "<p>Each name can be listed in <code>policy.fail_on</code> to fail the build.</p><ul>"
    )
    out += [
        f'<li id="warning-{j}"><code>{_e(w.get("name"))}</code>: {_e(w.get("message"))}</li>'
        for j, w in enumerate(warnings)
    ]
    return "".join(out) + "</ul>"


DEFINITIONS: tuple[tuple[str, str], ...] = (
    (
        "accept / uncertainty / reject",
        "the verdict the agent emits for an input; "
        "\u201caccepted\u201d always means the verdict is accept",
    ),
    (
        "correct known / misclassified known",
        "validation (or test) inputs of a known class that the model classified right / wrong",
    ),
    ("unknown set", "inputs of no known class (data.unknown, data.unknown_*)"),
    ("TN", "true negative: the model was right and the monitor accepted"),
    ("FP", "false positive: the model was right and the monitor rejected"),
    ("MN", "missed negative: the model was right and the monitor said uncertainty"),
    ("TP", "true positive: the model was wrong or the input unknown, and the monitor rejected"),
    ("FN", "false negative: the model was wrong or the input unknown, and the monitor accepted"),
    (
        "MP",
        "missed positive: the model was wrong or the input unknown, and the monitor "
        "said uncertainty",
    ),
    ("precision", "TP / (TP + FP): of the rejected inputs, the share that deserved it"),
    ("recall", "TP / (TP + FN + MP): of the inputs that deserved rejection, the share rejected"),
    ("F1", "the harmonic mean of precision and recall"),
    (
        "AUROC",
        "the chance that a random input of the second kind (unknown, or a wrong "
        "prediction) scores higher than a random one of the first (known, or a right "
        "prediction); 0.5 is chance, 1 perfect",
    ),
    ("threshold", "inputs whose score exceeds it are rejected (combine: calibrated)"),
    *((b.label, f"baseline on {NEEDS[b.needs]}: {b.description}") for b in BASELINES.values()),
    ("\u03c4", "the clustering parameter: smaller \u03c4 gives more, tighter boxes"),
)


def _definitions() -> str:
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in DEFINITIONS)
    return (
        '<section id="definitions"><h2>What the columns mean</h2>'
        f'<dl class="meta">{items}</dl></section>'
    )


def _evaluation(monitor: Mapping[str, Any]) -> str:
    evaluation = monitor.get("evaluation")
    out = [
        '<h3 id="evaluation">Evaluation at the chosen \u03c4</h3><p>Outcome counts on the '
        "validation inputs and data.unknown, as the agent's runtime gave them: combined, "
        "the emitted verdict; per layer, that layer's own box verdict (definitions "
        "below).</p>"
    ]
    if not evaluation:
        return out[0] + _omitted("evaluation-omitted", "No evaluation in the summary.")
    per_layer = evaluation.get("per_layer") or {}
    rows = []
    for i, layer in enumerate(_layer_names(monitor)):
        if layer in per_layer:
            rows.append(
                [_e(layer)] + [_num(f"eval-L{i}-{k}", per_layer[layer].get(k)) for k in EVAL_KEYS]
            )
    if evaluation.get("combined") is not None:
        rows.append(
            ["<strong>combined</strong>"]
            + [_num(f"eval-combined-{k}", evaluation["combined"].get(k)) for k in EVAL_KEYS]
        )
    header = ("Layer", *(k.upper() for k in OUTCOME_KEYS), "Precision", "Recall", "F1")
    return out[0] + _rows(
        header, rows, numeric=(False, *[True] * len(EVAL_KEYS)), table_id="evaluation-table"
    )


def _bn_section(summary: Mapping[str, Any]) -> str:
    bn = summary.get("bn")
    out = ['<section id="bn"><h2>Bayesian-network classifier</h2>']
    if bn is None:
        out.append(
            _omitted(
                "bn-omitted", "No Bayesian network in this build (the config has no BN section)."
            )
        )
        return "".join(out) + "</section>"
    compile_rows = [
        ("File", f"<code>{_text('bn-file', bn.get('file'))}</code>"),
        ("Class variable", _text("bn-class", bn.get("class"))),
        ("Decision", _text("bn-decision", bn.get("decision", "threshold"))),
        ("Positive state", _text("bn-positive", bn.get("positive"))),
        ("Decision threshold", _num("bn-threshold", bn.get("threshold"))),
        ("Features", _e(", ".join(map(str, bn.get("features") or [])))),
        ("Variable order", _e(", ".join(map(str, bn.get("order") or [])))),
        ("Diagram nodes", _num("bn-nodes", bn.get("nodes"))),
        ("Quasi-reduced nodes", _num("bn-nodes-quasi", bn.get("nodes_quasi"))),
        ("Positive inputs", _num("bn-positives", bn.get("positives"))),
        ("All inputs", _num("bn-inputs", bn.get("inputs"))),
        (
            "Ties at the threshold" if bn.get("decision") != "argmax" else "Ties between states",
            _num("bn-ties", bn.get("ties")),
        ),
        ("Compile time (s)", _num("bn-seconds", bn.get("seconds"))),
    ]
    if bn.get("decision") == "argmax":
        compile_rows.insert(
            -1,
            (
                "Inputs decided per state",
                _e(", ".join(f"{k}: {v:,}" for k, v in (bn.get("decided") or {}).items())),
            ),
        )
        compile_rows.insert(
            -1,
            (
                "Ties per pair of states",
                _e(
                    ", ".join(
                        f"{'/'.join(p['states'])}: {p['inputs']:,}"
                        for p in bn.get("tie_pairs") or []
                    )
                    or "none"
                ),
            ),
        )
    out.append("<h3>Compiled decision diagram</h3>")
    out.append(
        _rows(
            ("Quantity", "Value"),
            [(_e(k), v) for k, v in compile_rows],
            table_id="bn-compile-table",
        )
    )
    rules = list(bn.get("rules") or [])
    features = list(bn.get("features") or [])
    out.append("<h3>If-then rules</h3>")
    if rules:
        rows = []
        for j, r in enumerate(rules):
            cex = list(r.get("counterexamples") or [])
            verdict = str(r.get("verdict"))
            premise = r.get("premise") or {}
            first = (
                _cube_text(
                    restriction(cex[0], premise, bn.get("states") or {}),
                    features,
                    "any input the premise allows",
                )
                if cex
                else MISSING
            )
            rows.append(
                (
                    _text(f"rule-{j}-id", r.get("id")),
                    _cube_text(premise, features),
                    _e(f"{bn.get('class', 'class')} = {r.get('conclusion')}"),
                    f'<span id="rule-{j}-verdict" class="{_e(verdict)}">{_e(verdict)}</span>',
                    _num(f"rule-{j}-violations", r.get("violations")),
                    _num(f"rule-{j}-probability", r.get("probability")),
                    first,
                )
            )
        out.append(
            _rows(
                (
                    "Rule",
                    "Premise",
                    "Conclusion",
                    "Verdict",
                    "Violating inputs",
                    "Probability",
                    "First counterexample",
                ),
                rows,
                numeric=(False, False, False, False, True, True, False),
                table_id="bn-rules-table",
            )
        )
        for j, r in enumerate(rules):
            if r.get("verdict") == "violated":
                total = len(r.get("counterexamples") or [])
                shown = min(total, MAX_COUNTEREXAMPLES_DRAWN)
                out.append(
                    _figure(
                        f"fig-rule-{j}",
                        rule_figure(bn, r),
                        f"rule {r.get('id')} counterexamples",
                        f"Rule {_e(r.get('id'))} (violated) \u2014 query: green states are allowed "
                        f"by the premise, red ones excluded; the class should be "
                        f"{_e(bn.get('class'))} = {_e(r.get('conclusion'))}. Counterexamples "
                        f"drawn: {shown} of {total}; their blue states give another class, grey "
                        f"means any allowed state.",
                    )
                )
    else:
        out.append(_omitted("bn-rules-omitted", "No rules were checked."))
    fmo = list(bn.get("fmo") or [])
    features = list(bn.get("features") or [])
    out.append("<h3>Feature monotonicity (FMO) queries</h3>")
    if fmo:
        rows = []
        for j, q in enumerate(fmo):
            verdict = str(q.get("verdict"))
            witness = q.get("witness")
            rows.append(
                (
                    _text(f"fmo-{j}-id", q.get("id")),
                    _e(q.get("feature")),
                    _e(q.get("kind")),
                    _cube_text(q.get("given") or {}, features, "any"),
                    f'<span id="fmo-{j}-verdict" class="{_e(verdict)}">{_e(verdict)}</span>',
                    _e(q.get("reason", "")),
                    "\u2014" if witness is None else _witness_text(witness),
                )
            )
        out.append(
            _rows(
                ("Query", "Feature", "Kind", "Given", "Verdict", "Reason", "Witness"),
                rows,
                table_id="bn-fmo-table",
            )
        )
    else:
        out.append(_omitted("bn-fmo-omitted", "No FMO queries were checked."))
    return "".join(out) + "</section>"


def _timings(summary: Mapping[str, Any]) -> str:
    timings = summary.get("timings")
    if not timings:
        return ""
    rows = [(_e(step), _num(f"timing-{j}", secs)) for j, (step, secs) in enumerate(timings.items())]
    return (
        '<section id="timings"><h2>Timings</h2>'
        + _rows(("Step", "Seconds"), rows, numeric=(False, True), table_id="timings-table")
        + "</section>"
    )


def render_report(summary: Mapping[str, Any]) -> str:
    """The report as one self-contained HTML page: inline CSS, figures as data-URI PNGs."""
    title = (summary.get("metadata") or {}).get("name", "boxwatch build")
    nav = [("model", "Model and monitor")]
    if summary.get("monitor") is not None:
        nav += [
            ("monitor-figures", "Box monitor"),
            ("operating-point", "Operating point"),
            ("evaluation", "Evaluation"),
        ]
    nav.append(("bn", "Bayesian network"))
    if summary.get("timings"):
        nav.append(("timings", "Timings"))
    nav.append(("definitions", "Definitions"))
    links = "".join(f'<li><a href="#{a}">{_e(t)}</a></li>' for a, t in nav)
    body = "".join(
        (
            _header(summary),
            f"<nav><ul>{links}</ul></nav>",
            _model_section(summary),
            _monitor_figures(summary),
            _bn_section(summary),
            _timings(summary),
            _definitions(),
        )
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)} \u2014 boxwatch build report</title><style>{CSS}</style>"
        f"</head><body>{body}</body></html>\n"
    )
