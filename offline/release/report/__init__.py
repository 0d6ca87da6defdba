"""The build report: one self-contained HTML page (figures as embedded PNG) plus ``summary.json``.

A reviewer reads the HTML in a browser or on paper; a pipeline reads ``summary.json``. Both are
drawn only from the build summary (:class:`~boxwatch.offline.release.records.BuildSummary`), so
every number on the page is a summary value. One module per part of the page: :mod:`.header`
(metadata, artifact, policy), :mod:`.model` (model, layers, boxes), :mod:`.monitor` (the
paper's figures, evaluation, warnings), :mod:`.verdicts` (operating point, verdict split,
model errors, baselines), :mod:`.bn` (diagram, rules, queries); :mod:`.figures` draws the
figures (:mod:`.figures` says which paper figure each follows) and :mod:`.markup` holds the
HTML pieces.

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
  candidate ``j`` (graph order) ``layer-choice-{j}-layer``, ``-modules``, ``-pooling``,
  ``-auroc``, ``-chosen``, ``-reason``;
  ``calibration-threshold``, ``calibration-target-acceptance``, ``calibration-known-acceptance``,
  ``calibration-unknown-acceptance``, ``calibration-n-known``, ``calibration-n-unknown``,
  ``detection-auroc``, ``detection-fpr-at-95``; per unknown set ``j`` (``unknown``, then
  ``unknown_*``): ``operating-point-{j}-set``, ``-n``, ``-acceptance``, ``-auroc``;
  the emitted verdict split per set ``j``: ``split-{j}-set``, ``-n``, ``-accept``,
  ``-uncertainty``, ``-reject``; model errors per labelled set ``S`` (validation, test):
  ``errors-S-n``, ``-misclassified``, ``-accept``, ``-uncertainty``, ``-reject``,
  ``-auroc-score``, ``-auroc-msp``; the baseline comparison: ``baselines-point``
  (``test`` or ``validation``), ``baselines-set``, ``baselines-accepted-share``,
  ``baselines-n-correct``, ``baselines-n-misclassified``, per row ``j`` (the box monitor
  first) ``baseline-{j}-method``, ``-reads``, ``-correct``, ``-misclassified``,
  ``-{unknown set}`` (accepted), ``-auroc-{unknown set}``, ``-error-auroc``, ``-aurc``, and
  ``baseline-not-computed-{name}``; ``warning-{j}`` (or
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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from boxwatch.agent.atomic import write_atomic
from boxwatch.agent.errors import BoxwatchError
from boxwatch.offline.monitors.baselines import NEEDS
from boxwatch.offline.release.emitted import BASELINES
from boxwatch.offline.release.records import BuildSummary, as_record, summary_text
from boxwatch.offline.release.report.bn import bn_section
from boxwatch.offline.release.report.figures import (
    CELL_COLORS,
    coverage_figure,
    operating_point_figure,
    outcomes_figure,
    precision_recall_figure,
    restriction,
    rule_figure,
)
from boxwatch.offline.release.report.header import header
from boxwatch.offline.release.report.markup import CSS, esc, fmt_value, given, num, table
from boxwatch.offline.release.report.model import model_section
from boxwatch.offline.release.report.monitor import monitor_section

REPORT_NAME = "report.html"
SUMMARY_NAME = "summary.json"

__all__ = [
    "CELL_COLORS",
    "REPORT_NAME",
    "SUMMARY_NAME",
    "coverage_figure",
    "fmt_value",
    "operating_point_figure",
    "outcomes_figure",
    "precision_recall_figure",
    "render_report",
    "restriction",
    "rule_figure",
    "summary_json",
    "write_report",
]


def summary_json(summary: BuildSummary | Mapping[str, Any]) -> str:
    """The canonical ``summary.json`` text of ``summary`` (a record, or a summary.json's
    content): sorted keys, indent 2, trailing newline.

    Raises ValueError listing every non-finite float or non-JSON value by its path, so a
    summary builder learns all of them at once; a mapping that is no build summary raises
    :class:`msgspec.ValidationError` (a ValueError) naming the field.
    """
    if not isinstance(summary, BuildSummary):
        summary_text(summary)  # refuses non-JSON values by path, before the record reads them
        summary = BuildSummary.from_dict(summary)
    return summary.to_json()


def write_report(
    summary: BuildSummary | Mapping[str, Any],
    out_dir: str | Path,
    files: Mapping[str, bytes] | None = None,
) -> Path:
    """Write ``out_dir/report.html`` and ``out_dir/summary.json`` atomically; return the HTML path.

    Both texts are rendered before anything touches the disk; each file is written to a temp
    file in ``out_dir`` and renamed over the old one, so readers see the old or the new file
    whole. ``out_dir`` is created when missing. ``files`` (paths relative to ``out_dir`` ->
    bytes: the build's repair proposals) are written beside them.
    """
    text = summary_json(summary)
    page = render_report(summary)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BoxwatchError(f"cannot create report folder {out}: {exc.strerror or exc}") from None
    for name, data in (files or {}).items():
        path = out / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, data, mode=0o644)
        except OSError as exc:
            raise BoxwatchError(f"cannot write {path}: {exc.strerror or exc}") from None
    _write_atomic(out / SUMMARY_NAME, text)
    _write_atomic(out / REPORT_NAME, page)
    return out / REPORT_NAME


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) atomically (:func:`~boxwatch.agent.atomic.write_atomic`)."""
    try:
        write_atomic(path, text.encode("utf-8"), mode=0o644)  # a report is meant to be read
    except OSError as exc:
        raise BoxwatchError(f"cannot write {path}: {exc.strerror or exc}") from None


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
    (
        "error AUROC",
        "the chance that a random misclassified input scores higher than a random correctly "
        "classified one (the score ranks the model's own mistakes)",
    ),
    (
        "AURC",
        "area under the risk-coverage curve: accept inputs from the most trusted (lowest "
        "score) up; the mean, over every coverage, of the share of mistakes among those "
        "accepted; lower is better",
    ),
    (
        "matched operating point",
        "every baseline's threshold accepts the same share of the correctly classified "
        "known inputs (of data.test when given) as the emitted verdicts",
    ),
    ("threshold", "inputs whose score exceeds it are rejected (combine: calibrated)"),
    *((b.label, f"baseline on {NEEDS[b.needs]}: {b.description}") for b in BASELINES.values()),
    ("\u03c4", "the clustering parameter: smaller \u03c4 gives more, tighter boxes"),
)


def _definitions() -> str:
    items = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in DEFINITIONS)
    return (
        '<section id="definitions"><h2>What the columns mean</h2>'
        f'<dl class="meta">{items}</dl></section>'
    )


def _timings(summary: BuildSummary) -> str:
    timings = given(summary.timings)
    if not timings:
        return ""
    rows = [(esc(step), num(f"timing-{j}", secs)) for j, (step, secs) in enumerate(timings.items())]
    return (
        '<section id="timings"><h2>Timings</h2>'
        + table(("Step", "Seconds"), rows, numeric=(False, True), table_id="timings-table")
        + "</section>"
    )


def render_report(summary: BuildSummary | Mapping[str, Any]) -> str:
    """The report as one self-contained HTML page: inline CSS, figures as data-URI PNGs.

    ``summary`` is the build's record, or a summary.json's content (read into the record).
    """
    summary = as_record(summary, BuildSummary)
    nav = [("model", "Model and monitor")]
    if given(summary.monitor) is not None:
        nav += [
            ("monitor-figures", "Box monitor"),
            ("operating-point", "Operating point"),
            ("evaluation", "Evaluation"),
        ]
    nav.append(("bn", "Bayesian network"))
    if given(summary.timings):
        nav.append(("timings", "Timings"))
    nav.append(("definitions", "Definitions"))
    links = "".join(f'<li><a href="#{a}">{esc(t)}</a></li>' for a, t in nav)
    body = "".join(
        (
            header(summary),
            f"<nav><ul>{links}</ul></nav>",
            model_section(summary),
            monitor_section(summary),
            bn_section(summary),
            _timings(summary),
            _definitions(),
        )
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(summary.metadata.name)} \u2014 boxwatch build report</title><style>{CSS}</style>"
        f"</head><body>{body}</body></html>\n"
    )
