"""The report's operating point: the calibration, what the emitted verdicts do with each
set (the split, the unknown sets), the model's errors and the baselines beside them."""

from __future__ import annotations

from boxwatch.offline.release.emitted import BASELINES
from boxwatch.offline.release.records import MonitorSummary, ShareChoice, VerdictShares
from boxwatch.offline.release.report.figures import operating_point_figure
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
    if det is not None:
        out.append(
            figure(
                "fig-operating-point",
                operating_point_figure(monitor),
                "score histograms",
                "Operating point \u2014 monitor scores of known (validation) and unknown inputs "
                "(the data.unknown set), "
                "as the share of each set per bin; inputs scoring above the threshold (dashed) "
                "are rejected.",
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


def _baselines(monitor: MonitorSummary) -> str:
    rows_in = given(monitor.baselines) or []
    head = '<h3 id="baselines">Baselines at matched acceptance</h3>'
    if not rows_in:
        return head + omitted("baselines-omitted", "No baseline rows in the summary.")
    sets = list(rows_in[0].unknown)
    has_test = given(rows_in[0].test) is not None
    rows = []
    for j, r in enumerate(rows_in):
        test = given(r.test)
        cells = [
            text(f"baseline-{j}-method", r.method),
            num(f"baseline-{j}-correct", r.correct_known),
            num(f"baseline-{j}-misclassified", r.misclassified_known),
            *[num(f"baseline-{j}-{name}", r.unknown.get(name)) for name in sets],
        ]
        if has_test:
            cells += [
                num(f"baseline-{j}-test-correct", None if test is None else test.correct_known),
                num(
                    f"baseline-{j}-test-misclassified",
                    None if test is None else test.misclassified_known,
                ),
            ]
        rows.append(cells)
    header = (
        "Method",
        "Correct known accepted",
        "Misclassified accepted",
        *[f"{n} accepted" for n in sets],
        *(("Test: correct accepted", "Test: misclassified accepted") if has_test else ()),
    )
    labels = [BASELINES[r.method].label for r in rows_in if r.method in BASELINES]
    return (
        head
        + f"<p>The baselines ({esc(', '.join(labels))}; defined under what the columns mean), each "
        "with the threshold that accepts the same share of correctly classified known "
        "validation inputs as the box monitor's emitted verdicts; the share each "
        "accepts of misclassified known inputs and of every unknown set (lower is "
        "better).</p>"
        + table(
            header, rows, numeric=(False, *[True] * (len(header) - 1)), table_id="baselines-table"
        )
    )


def _share_reason(choice: ShareChoice | None) -> str | None:
    """Why the build gave uncertainty its share of the budget (None: no choice recorded)."""
    return None if choice is None else f"{choice.method}: {choice.reason}"
