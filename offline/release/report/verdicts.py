"""The report's operating point: the calibration, what the emitted verdicts do with each
set (the split, the unknown sets), the model's errors and the baselines beside them."""

from __future__ import annotations

from boxwatch.offline.monitors.baselines import BASELINES as TABLE
from boxwatch.offline.release.emitted import BOX_METHOD
from boxwatch.offline.release.records import (
    BaselineComparison,
    MonitorSummary,
    ShareChoice,
    VerdictShares,
)
from boxwatch.offline.release.report.figures import histogram_series, operating_point_figure
from boxwatch.offline.release.report.markup import esc, figure, given, num, omitted, table, text


def operating_point(monitor: MonitorSummary) -> str:
    """The threshold and floor, the score histograms, the verdict split, each unknown set,
    then the model errors and the baselines."""
    cal = monitor.calibration
    det = given(monitor.detection)
    out = [
        '<h3 id="operating-point">Calibrated operating point</h3>',
        "<p>The monitor emits one verdict per input: <em>accept</em>, <em>uncertainty</em> or "
        "<em>reject</em>. <strong>Accepted</strong> means the emitted verdict is accept; "
        "uncertainty and reject never count as accepted. With <code>combine: calibrated</code> "
        "inputs scoring above the threshold on the score are rejected; of the others, those "
        "on which the model's confidence (its top softmax probability) is below the "
        "confidence floor get uncertainty, and the rest are accepted. Both are chosen so "
        "that the emitted verdicts accept the target share of the correctly classified "
        "known calibration inputs.</p>",
    ]
    series = histogram_series(monitor)
    if series:
        names = ", ".join(f"<em>{esc(name)}</em>" for name, _counts in series)
        out.append(
            figure(
                "fig-operating-point",
                operating_point_figure(monitor),
                "score histograms",
                "Operating point \u2014 the monitor's score as the share of each series per "
                f"bin: {names}; the first (filled) is the reference. Inputs scoring above the "
                "threshold (dashed) are rejected.",
            )
        )
    rows = [
        ("Threshold on the score", "calibration-threshold", cal.threshold),
        (
            "Error score (ranks the model's mistakes for uncertainty; empty: no uncertainty)",
            "calibration-error-score",
            given(cal.error_score),
        ),
        (
            "Error model's cut (probability of a mistake above it: uncertainty; empty: none)",
            "calibration-error-cut",
            given(cal.error_cut),
        ),
        (
            "Confidence floor (below it: uncertainty; empty: none)",
            "calibration-confidence-floor",
            given(cal.confidence_floor),
        ),
        (
            "Share of the non-accepted budget given to uncertainty",
            "calibration-confidence-share",
            given(cal.confidence_share),
        ),
        (
            "How the share was chosen",
            "calibration-share-choice",
            _share_reason(given(cal.share_choice)),
        ),
        (
            "Target: share of correctly classified known inputs accepted",
            "calibration-target-acceptance",
            cal.target_acceptance,
        ),
        (
            "Accepted (emitted verdicts), calibration population",
            "calibration-known-acceptance",
            cal.known_acceptance,
        ),
        (
            "Accepted (emitted verdicts), data.unknown",
            "calibration-unknown-acceptance",
            cal.unknown_acceptance,
        ),
        ("Calibration population (correct known inputs)", "calibration-n-known", cal.n_known),
        ("Unknown inputs", "calibration-n-unknown", cal.n_unknown),
        (
            "Score AUROC (known vs data.unknown)",
            "detection-auroc",
            None if det is None else det.auroc,
        ),
        (
            "Score alone: unknown share under the 95% known quantile (not the verdicts)",
            "detection-fpr-at-95",
            None if det is None else det.fpr_at_95,
        ),
    ]
    out.append(
        table(
            ("Quantity", "Value"),
            [(esc(k), num(i, v)) for k, i, v in rows],
            numeric=(False, True),
            table_id="calibration-table",
        )
    )
    out.append(_split(monitor))
    out.append(_unknown_sets(monitor))
    out.append(_model_errors(monitor))
    out.append(_baselines(monitor))
    return "".join(out)


def _share_cells(prefix: str, v: VerdictShares) -> list[str]:
    return [
        num(f"{prefix}-n", v.n),
        num(f"{prefix}-accept", v.accept),
        num(f"{prefix}-uncertainty", v.uncertainty),
        num(f"{prefix}-reject", v.reject),
    ]


def _split(monitor: MonitorSummary) -> str:
    verdicts = given(monitor.verdicts)
    if verdicts is None or not verdicts.split:
        return ""
    return (
        f"<p>Emitted verdicts, computed by the agent's own runtime on the "
        f"{esc(verdicts.set)} inputs (correct / misclassified known), each "
        "unknown set and (when given) the test set, as the share of each set:</p>"
    ) + table(
        ("Set", "Inputs", "Accept", "Uncertainty", "Reject"),
        [
            [text(f"split-{j}-set", name), *_share_cells(f"split-{j}", v)]
            for j, (name, v) in enumerate(verdicts.split.items())
        ],
        numeric=(False, True, True, True, True),
        table_id="verdict-split-table",
    )


def _unknown_sets(monitor: MonitorSummary) -> str:
    points = monitor.operating_points
    if not points:
        return ""
    return (
        "<p>Each unknown set: the share of its emitted verdicts that accept "
        "(false accepts), and how well the score separates it from the known "
        "validation inputs (AUROC).</p>"
    ) + table(
        ("Unknown set", "Inputs", "Accepted", "AUROC"),
        [
            (
                text(f"operating-point-{j}-set", p.set),
                num(f"operating-point-{j}-n", p.n),
                num(f"operating-point-{j}-acceptance", p.acceptance),
                num(f"operating-point-{j}-auroc", p.auroc),
            )
            for j, p in enumerate(points)
        ],
        numeric=(False, True, True, True),
        table_id="operating-points-table",
    )


def _model_errors(monitor: MonitorSummary) -> str:
    errors = given(monitor.model_errors) or {}
    head = '<h3 id="model-errors">Model errors</h3>'
    if not errors:
        return head + omitted("model-errors-omitted", "No labelled held-out inputs.")
    rows = [
        [
            esc(name),
            num(f"errors-{name}-n", e.n),
            num(f"errors-{name}-misclassified", e.n_misclassified),
            num(f"errors-{name}-accept", e.verdicts.accept),
            num(f"errors-{name}-uncertainty", e.verdicts.uncertainty),
            num(f"errors-{name}-reject", e.verdicts.reject),
            num(f"errors-{name}-auroc-score", e.auroc_score),
            num(f"errors-{name}-auroc-msp", e.auroc_msp),
        ]
        for name, e in errors.items()
    ]
    return (
        head + "<p>The model's wrong predictions on labelled held-out inputs (data.test is "
        "never used to fit or calibrate): the share of each emitted verdict among "
        "them, and how well the box score and the maximum softmax probability rank "
        "wrong predictions above right ones (AUROC; 0.5 is chance).</p>"
        + table(
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


def _method_label(method: str) -> str:
    """A row's method as the tables show it: the baseline table's label."""
    return TABLE[method].label if method in TABLE else method


def _point_sentence(c: BaselineComparison) -> str:
    """Which matched point the comparison is, in words."""
    share = num("baselines-accepted-share", c.accepted_share)
    n = num("baselines-n-correct", c.n_correct)
    wrong = num("baselines-n-misclassified", c.n_misclassified)
    where = text("baselines-set", c.set)
    matched = (
        f"each baseline's threshold accepts the same share ({share}) of the {n} correctly "
        f"classified known {where} inputs as the box monitor's emitted verdicts (to the "
        "input, equal scores aside; a verdict counts as accepted only when it is accept), so "
        f"the columns compare at one operating point; the set also holds {wrong} "
        "misclassified inputs"
    )
    if c.point == "test":
        return (
            '<p>Matched on the test set (<code id="baselines-point">test</code>, data.test: '
            f"never used to fit, select or calibrate): {matched}.</p>"
        )
    return (
        '<p>Matched on the calibration set (<code id="baselines-point">validation</code>): '
        f"{matched}. No data.test was given: the box monitor chose its layers, \u03c4 and "
        "threshold on these same inputs, so this comparison favours it; add a labelled "
        "data.test for a comparison on inputs no method has seen.</p>"
    )


def _baselines(monitor: MonitorSummary) -> str:
    """The matched comparison: what each method accepts, then how its score ranks."""
    c = given(monitor.baselines)
    head = '<h3 id="baselines">Baselines at a matched operating point</h3>'
    if c is None or not c.rows:
        return head + omitted("baselines-omitted", "No baseline comparison in the summary.")
    sets = list(c.rows[0].unknown)
    accepted, ranking = [], []
    for j, r in enumerate(c.rows):
        method = [
            text(f"baseline-{j}-method", _method_label(r.method)),
            text(
                f"baseline-{j}-reads",
                given(r.layer) or ("-" if r.method == BOX_METHOD else "logits"),
            ),
        ]
        accepted.append(
            [
                *method,
                num(f"baseline-{j}-correct", r.correct_known),
                num(f"baseline-{j}-misclassified", r.misclassified_known),
                *[num(f"baseline-{j}-{name}", r.unknown.get(name)) for name in sets],
            ]
        )
        ranking.append(
            [
                text(f"baseline-{j}-rank-method", _method_label(r.method)),
                *[num(f"baseline-{j}-auroc-{name}", r.auroc.get(name)) for name in sets],
                num(f"baseline-{j}-error-auroc", r.error_auroc),
                num(f"baseline-{j}-aurc", r.aurc),
            ]
        )
    accepted_head = (
        "Method",
        "Reads",
        "Correct known accepted",
        "Misclassified accepted",
        *[f"{n} accepted" for n in sets],
    )
    ranking_head = (
        "Method",
        *[f"AUROC vs {n}" for n in sets],
        "Error AUROC",
        "AURC",
    )
    out = [
        head,
        _point_sentence(c),
        "<p>The share each method accepts of the correctly and wrongly classified known "
        "inputs and of every unknown set (for the misclassified and unknown inputs, lower "
        "is better):</p>",
        table(
            accepted_head,
            accepted,
            numeric=(False, False, *[True] * (len(accepted_head) - 2)),
            table_id="baselines-table",
        ),
        "<p>How each score ranks, whatever the threshold: AUROC of the known inputs against "
        "each unknown set, error AUROC (misclassified above correctly classified inputs) and "
        "AURC (the mean share of mistakes among the most trusted inputs over every coverage, "
        "lower is better). The box monitor's AUROC is its box score's; its error AUROC and "
        "AURC are its error score's, the score its uncertainty verdict thresholds.</p>",
        table(
            ranking_head,
            ranking,
            numeric=(False, *[True] * (len(ranking_head) - 1)),
            table_id="baselines-ranking-table",
        ),
    ]
    if c.not_computed:
        items = "".join(
            f'<li id="baseline-not-computed-{esc(name)}">{esc(_method_label(name))}: '
            f"{esc(why)}</li>"
            for name, why in c.not_computed.items()
        )
        out.append(f"<p>Not computed by this build:</p><ul>{items}</ul>")
    return "".join(out)


def _share_reason(choice: ShareChoice | None) -> str | None:
    """Why the build gave uncertainty its share of the budget (None: no choice recorded)."""
    return None if choice is None else f"{choice.method}: {choice.reason}"
