"""``boxwatch refit``: a parent artifact and reviewed captures become a signed child artifact."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from boxwatch.agent.errors import BoxwatchError
from boxwatch.agent.inputs import one_line
from boxwatch.agent.runtime import load_runtime
from boxwatch.commands.build import KEY_FILE_ENV
from boxwatch.commands.console import (
    EXIT_FAILED,
    EXIT_USAGE,
    aligned,
    echo_err,
    fail,
    finish,
    trusted_keys_option,
)
from boxwatch.commands.feedback import feedback_options, labelled, load_captures, load_labels
from boxwatch.commands.options import progress_option
from boxwatch.offline.progress import Progress
from boxwatch.offline.refit.refit import RefitGuardError, RefitSummary, refit
from boxwatch.offline.release.config import load_config


@click.command("refit")
@click.argument("parent", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--config",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The build config the parent was built from (its data and model are read again).",
)
@trusted_keys_option("Trusted public key (PEM) the parent must be signed with; repeat for several.")
@click.option(
    "--key",
    "key_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"Ed25519 private key (PEM) that signs the child [${KEY_FILE_ENV}].",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the child artifact (atomically).",
)
@feedback_options(labels_required=True)
@click.option(
    "--allow-guard-failure",
    is_flag=True,
    help="Write the child even when a guard fails (the overridden guards are recorded in it).",
)
@click.option(
    "--created-at",
    type=int,
    help="The child's creation time (Unix seconds); default $SOURCE_DATE_EPOCH, else now; "
    "never before the parent's (an agent refuses an older artifact on reload).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the refit's summary as JSON.")
@progress_option
def refit_artifact(
    parent: Path,
    config: Path,
    public_keys: tuple[Path, ...],
    key_path: Path | None,
    out: Path,
    captures_path: Path | None,
    captures_topic: str | None,
    labels_path: Path | None,
    labels_topic: str | None,
    brokers: str | None,
    client_options: dict[str, Any],
    timeout_s: float,
    allow_guard_failure: bool,
    created_at: int | None,
    as_json: bool,
    progress: Progress,
) -> None:
    """Refit PARENT's monitors from labelled captures into a signed child artifact.

    Joins the captures (the agent's topics.capture, or its export) with the reviewers'
    labels by record id (docs/records.md: correct, wrong: CLASS, unknown, new:NAME), then
    re-clusters only the classes the labels touch (a correct capture widens its class's
    good boxes, a wrong one its predicted class's bad boxes) with the parent's tau and seed,
    recalibrates the threshold and floor on the config's validation set, and measures the
    parent and the child on it, its unknown sets and the labelled captures. Guards: the
    child must accept at least target_acceptance - 2 points of the correct validation
    inputs and no unknown set more than 1 point above the parent; otherwise nothing is
    written (exit 1) unless --allow-guard-failure. Ids the join cannot match, duplicates
    that disagree and contradicting labels are reported and left out, never guessed.
    The child names the parent's digest and what changed (monitors/refit.json); deploy it
    like any artifact (an agent reloads it on SIGHUP).

    \b
    Example:
      boxwatch export-captures --brokers kafka:9092 --topic boxwatch.capture --out reviews/
      boxwatch refit model.bwa --config build.yaml --public-key release.pub --key release.key \\
        --captures reviews/ --labels labels.jsonl --out model-2.bwa
    Exit codes: 0 child written; 1 a guard failed (nothing written); 2 usage, config, data or
    label error, untrusted parent; 70 internal error.
    """
    key_path = key_path or (Path(os.environ[KEY_FILE_ENV]) if KEY_FILE_ENV in os.environ else None)
    if key_path is None:
        finish(EXIT_USAGE, f"error: no signing key: give --key PATH or set ${KEY_FILE_ENV}")
    keys = [str(k) for k in public_keys]
    try:
        cfg = load_config(config)
        model = cfg.spec.model
        runtime = load_runtime(
            parent, keys, model_path=None if model is None else cfg.resolve(model.path)
        )
        captures = load_captures(
            runtime, captures_path, captures_topic, brokers, timeout_s, client_options
        )
        labels = load_labels(labels_path, labels_topic, brokers, timeout_s, client_options)
        assert labels is not None  # feedback_options(labels_required=True)
        joined = labelled(runtime, captures, labels)
        for problem in [*captures.problems, *joined.problems]:
            echo_err(one_line(f"warning: {problem}"))
        summary = refit(
            parent,
            keys,
            config,
            joined,
            private_key=key_path,
            out=out,
            allow_guard_failure=allow_guard_failure,
            created_at=created_at,
            progress=progress,
        )
    except RefitGuardError as exc:
        _show(exc.summary, as_json)
        finish(EXIT_FAILED, f"error: {exc}")
    except BoxwatchError as exc:
        fail(exc, EXIT_USAGE)
    _show(summary, as_json)
    overridden = (
        f"; guards overridden: {', '.join(summary.overridden)}" if summary.overridden else ""
    )
    echo_err(
        f"wrote {out} (child {summary.child_id} of {summary.parent_id}; "
        f"{len(summary.classes)} class(es) refitted{overridden})"
    )


def _show(summary: RefitSummary, as_json: bool) -> None:
    """The before/after table (or the JSON summary) on stdout."""
    if as_json:
        click.echo(json.dumps(summary.to_dict(), indent=2, sort_keys=True))
        return
    click.echo(aligned(summary.table_rows()))
