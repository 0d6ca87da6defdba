"""``boxwatch capture-report``: clusters of rejected captures, shift told apart from new kinds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from boxwatch.agent.errors import BoxwatchError
from boxwatch.agent.inputs import one_line
from boxwatch.agent.runtime import load_runtime
from boxwatch.commands.console import EXIT_USAGE, aligned, echo_err, fail, trusted_keys_option
from boxwatch.commands.feedback import feedback_options, labelled, load_captures, load_labels
from boxwatch.offline.refit.capture_report import BINS, REPORT_NAME, capture_report


@click.command("capture-report")
@click.argument("artifact", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--model",
    "model_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The model file the artifact monitors (its digest is checked, as the agent does).",
)
@trusted_keys_option("Trusted public key (PEM); repeat for several.")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The report folder (capture_report.html, capture_report.json, plots).",
)
@feedback_options(labels_required=False)
@click.option(
    "--bins",
    type=click.IntRange(min=1),
    default=BINS,
    show_default=True,
    help="Time bins over the capture window (the rate and growth plots).",
)
def capture_report_cmd(
    artifact: Path,
    model_path: Path,
    public_keys: tuple[Path, ...],
    out_dir: Path,
    captures_path: Path | None,
    captures_topic: str | None,
    labels_path: Path | None,
    labels_topic: str | None,
    brokers: str | None,
    client_options: dict[str, Any],
    timeout_s: float,
    bins: int,
) -> None:
    """Report on the captures of ARTIFACT: shift, or new kinds of input?

    Runs every capture (the agent's topics.capture, or its export) through the artifact's
    model and box monitor again, clusters the rejected and uncertain ones in the monitored
    layers, and says of each cluster whether it is a new kind of input (it grows: more of
    its captures come late in the window than of the others), a shift of a known class
    (near that class's boxes: correct inputs the monitor no longer accepts), or unclear;
    labels, when given, decide a cluster's verdict once 3 of its captures are labelled (a new
    kind when most of them, or at least 3 and a tenth of them, say unknown). Plots the
    capture rate per class over time. Prints one row per cluster (stdout) and writes the
    report folder (docs/monitors.md, "Reading the capture report").

    \b
    Example:
      boxwatch capture-report model.bwa --model model.onnx --public-key release.pub \\
        --captures reviews/ --out capture-report/
    Exit codes: 0 report written; 2 usage, input or label error, untrusted artifact;
    70 internal error.
    """
    try:
        runtime = load_runtime(artifact, [str(k) for k in public_keys], model_path=model_path)
        captures = load_captures(
            runtime, captures_path, captures_topic, brokers, timeout_s, client_options
        )
        labels = load_labels(labels_path, labels_topic, brokers, timeout_s, client_options)
        joined = None if labels is None else labelled(runtime, captures, labels)
        report = capture_report(runtime, captures, labelled=joined, out_dir=out_dir, bins=bins)
    except BoxwatchError as exc:
        fail(exc, EXIT_USAGE)
    header, rows = report.table()
    click.echo(aligned([header, *([one_line(cell) for cell in row] for row in rows)]))
    in_clusters = report.n_clustered - report.n_scattered
    echo_err(
        f"{report.n_captures} captures: {report.n_accepted} accepted by the artifact now, "
        f"{in_clusters} in {len(report.clusters)} cluster(s), {report.n_scattered} scattered; "
        f"{len(report.new_kinds)} cluster(s) flagged as a new kind; "
        f"report: {out_dir / REPORT_NAME}"
    )
