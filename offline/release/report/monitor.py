"""The report's box-monitor section: the paper's figures, the operating point, the
evaluation at the chosen tau and the build's warnings."""

from __future__ import annotations

import html

from boxwatch.offline.release.records import BuildSummary, MonitorSummary
from boxwatch.offline.release.report.figures import (
    class_names,
    coverage_figure,
    layer_names,
    outcomes_figure,
    precision_recall_figure,
)
from boxwatch.offline.release.report.markup import esc, figure, given, num, omitted, table
from boxwatch.offline.release.report.verdicts import operating_point

EVAL_KEYS = ("tp", "fp", "tn", "fn", "mp", "mn", "precision", "recall", "f1")


def monitor_section(summary: BuildSummary) -> str:
    """Figures 5, 7 and 8, then the operating point, the evaluation and the warnings."""
    monitor = given(summary.monitor)
    if monitor is None:
        return ""
    coverage = given(monitor.coverage) or {}
    classes_n = max([len(v.per_class) for v in coverage.values()] + [0])
    classes = class_names(given(summary.model), classes_n)
    out = ['<section id="monitor-figures"><h2>Box monitor</h2>']
    if coverage:
        out.append(
            figure(
                "fig-coverage",
                coverage_figure(monitor, classes),
                "clustering coverage vs tau",
                "Fig. 5 \u2014 Clustering coverage of the good features' boxes vs the clustering "
                "parameter \u03c4, one line per class, one panel per layer; large dots mark each "
                "class's chosen \u03c4. Plotted: " + html.escape(_coverage_measure(monitor)) + ".",
            )
        )
    else:
        out.append(omitted("fig-coverage-omitted", "No coverage data in the summary."))
    if given(monitor.curves):
        out.append(
            figure(
                "fig-outcomes",
                outcomes_figure(monitor),
                "outcome counts vs tau",
                "Fig. 7 \u2014 Numbers of the six outcomes (totals over the class monitors) on the "
                "validation and unknown inputs vs \u03c4, one panel per layer.",
            )
        )
        out.append(
            figure(
                "fig-precision-recall",
                precision_recall_figure(monitor),
                "precision-recall",
                "Fig. 8 \u2014 Precision vs recall, one point per \u03c4 (uniform over classes), one "
                "curve per layer; stars: each layer's chosen per-class \u03c4; cross: the combined "
                "monitor.",
            )
        )
    else:
        out.append(omitted("fig-outcomes-omitted", "No outcome curves in the summary."))
    out.append(operating_point(monitor))
    out.append(_evaluation(monitor))
    out.append(_warnings(monitor))
    out.append("</section>")
    return "".join(out)


def _coverage_measure(monitor: MonitorSummary) -> str:
    """What the coverage curves plot, as the summary states it (default: r_u itself)."""
    for curve in (given(monitor.coverage) or {}).values():
        if given(curve.measure):
            return str(curve.measure)
    return "the upper coverage bound r_u"


def _evaluation(monitor: MonitorSummary) -> str:
    evaluation = given(monitor.evaluation)
    head = (
        '<h3 id="evaluation">Evaluation at the chosen \u03c4</h3><p>Outcome counts on the '
        "validation inputs and data.unknown, as the agent's runtime gave them: combined, "
        "the emitted verdict; per layer, that layer's own box verdict (definitions "
        "below).</p>"
    )
    if evaluation is None:
        return head + omitted("evaluation-omitted", "No evaluation in the summary.")
    rows = [
        [esc(layer)]
        + [num(f"eval-L{i}-{k}", getattr(evaluation.per_layer[layer], k)) for k in EVAL_KEYS]
        for i, layer in enumerate(layer_names(monitor))
        if layer in evaluation.per_layer
    ]
    rows.append(
        ["<strong>combined</strong>"]
        + [num(f"eval-combined-{k}", getattr(evaluation.combined, k)) for k in EVAL_KEYS]
    )
    header = ("Layer", *(k.upper() for k in EVAL_KEYS[:6]), "Precision", "Recall", "F1")
    return head + table(
        header, rows, numeric=(False, *[True] * len(EVAL_KEYS)), table_id="evaluation-table"
    )


def _warnings(monitor: MonitorSummary) -> str:
    warnings = given(monitor.warnings)
    if warnings is None:
        return ""
    head = '<h3 id="warnings">Warnings</h3>'
    if not warnings:
        return head + '<p id="warnings-none">None.</p>'
    items = "".join(
        f'<li id="warning-{j}"><code>{esc(w.name)}</code>: {esc(w.message)}</li>'
        for j, w in enumerate(warnings)
    )
    return (
        head
        + "<p>Each name can be listed in <code>policy.fail_on</code> to fail the build.</p><ul>"
        + items
        + "</ul>"
    )
