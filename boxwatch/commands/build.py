"""``boxwatch build-artifact``: one config in, one signed artifact (and a report) out."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import click

from boxwatch.agent.artifact import write_artifact
from boxwatch.agent.errors import ArtifactError, ConfigError, KeyFileError
from boxwatch.agent.inputs import one_line, show_path
from boxwatch.agent.keys import load_private_key
from boxwatch.commands.console import (
    EXIT_FAILED,
    EXIT_USAGE,
    VerbExit,
    finish,
    summary_table,
)
from boxwatch.commands.options import SizeParam, progress_option
from boxwatch.offline.progress import Progress
from boxwatch.offline.release.config import load_config
from boxwatch.offline.release.memory import Resources
from boxwatch.offline.release.pipeline import build, check_out_path, prepare
from boxwatch.offline.release.report import write_report

KEY_FILE_ENV = "BOXWATCH_SIGNING_KEY_FILE"


def _check_jobs(_ctx: click.Context, _param: click.Parameter, value: int | None) -> int | None:
    """``--jobs``: joblib's convention admits every int but 0."""
    if value == 0:
        raise click.BadParameter("0 jobs: give N >= 1, -1 (every core) or -2 (all but one)")
    return value


@click.command("build-artifact")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--key",
    "key_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"Ed25519 private key (PEM) that signs the artifact [${KEY_FILE_ENV}].",
)
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the artifact (atomically). Required unless --dry-run.",
)
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for report.html and summary.json.",
)
@click.option("--dry-run", is_flag=True, help="Validate the config and every input, build nothing.")
@click.option(
    "--created-at",
    type=int,
    help="Creation time (Unix seconds); default $SOURCE_DATE_EPOCH, else now.",
)
@click.option(
    "--max-memory",
    type=SizeParam(),
    default=None,
    help="Memory the build may use, e.g. 8G or 512M (default: this machine's). The peak "
    "is estimated before any activation is extracted (printed with --dry-run); a build "
    "estimated over it exits 2, and so does one whose memory passes it while activations "
    "are extracted. The BN compilation is held to it too (bn.max_memory if lower).",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Folder for the activation store, memory-mapped files removed after the build "
    "(default: $TMPDIR, else the system's temporary folder). Put it on a disk: a tmpfs "
    "holds the store in RAM, and the estimate then counts it.",
)
@click.option(
    "--jobs",
    "n_jobs",
    type=int,
    default=None,
    metavar="N",
    callback=_check_jobs,
    help="Jobs for the per-class work (the boxes' k-means and tau search, the layer "
    "choice's ranking monitors, the report's curves), joblib's convention: N jobs, -1 "
    "every core, -2 all but one. Takes precedence over the config's monitor.n_jobs; "
    "without either, 1 job. The artifact is the same whatever the jobs; each job is a "
    "process of its own (more memory).",
)
@progress_option
def build_artifact(
    config: Path,
    key_path: Path | None,
    out: Path | None,
    report_dir: Path | None,
    dry_run: bool,
    created_at: int | None,
    max_memory: int | None,
    work_dir: Path | None,
    n_jobs: int | None,
    progress: Progress,
) -> None:
    """Build the signed artifact a release pipeline publishes.

    Validates every input first (all problems listed at once) and estimates the build's
    peak memory (stderr), extracts activations into a disk-backed store (model.device
    runs the model: cpu, cuda or cuda:N), fits and selects the box monitors, calibrates the
    score threshold, compiles the BN classifier, verifies its rules and monotonicity
    queries, then writes the artifact atomically and prints a summary table. The same config, data, key and creation time give a
    byte-identical artifact. The key never comes from the config: use --key or
    $BOXWATCH_SIGNING_KEY_FILE. Each phase that runs over 2 s shows its progress on stderr
    (the summary table alone goes to stdout).

    \b
    Example:
      boxwatch build-artifact build.yaml --key ci.key --out model.bwa --report report/
    Exit codes: 0 built; 1 built, but a policy of the config failed; 2 config or input error
    (a build that will not fit --max-memory too); 70 internal error.
    """
    key_path = key_path or (Path(os.environ[KEY_FILE_ENV]) if KEY_FILE_ENV in os.environ else None)
    problems: list[str] = []
    prepared = None
    try:
        resources = Resources(max_memory=max_memory, work_dir=work_dir, n_jobs=n_jobs)
        prepared = prepare(load_config(config), out, resources=resources)
    except ConfigError as exc:
        problems += exc.problems
        if not any(p.startswith("--out ") for p in exc.problems):
            problems += check_out_path(out)  # the schema round stops before prepare()
    except MemoryError:
        problems.append(
            "out of memory while reading the inputs (data sets too large for this machine)"
        )
    private_key = None
    if key_path is not None:
        try:
            private_key = load_private_key(key_path)
        except KeyFileError as exc:
            problems.append(str(exc))
    elif not dry_run:
        problems.append(f"no signing key: give --key PATH or set ${KEY_FILE_ENV}")
    if out is None and not dry_run:
        problems.append("--out ARTIFACT is required (or use --dry-run)")
    if problems:
        _fail(config, problems)
    assert prepared is not None
    if (
        prepared.model is not None
        and prepared.memory is not None
        and (dry_run or progress.mode != "off")
    ):
        click.echo(prepared.memory.text(), err=True)
    if dry_run:
        click.echo(f"{config}: valid; nothing built (--dry-run)", err=True)
        return
    assert private_key is not None and out is not None
    try:
        outcome = build(prepared, private_key, created_at=created_at, progress=progress)
        write_artifact(out, outcome.artifact)
        summary = outcome.summary.written_to(out)
        if report_dir is not None:
            with progress.phase("writing the report"):
                write_report(summary, report_dir, outcome.files)
    except (ConfigError, KeyFileError, ArtifactError) as exc:
        _fail(config, exc.problems if isinstance(exc, ConfigError) else [str(exc)], exc)
    except MemoryError as exc:
        _fail(
            config,
            ["out of memory while reading the inputs (data sets too large for this machine)"],
            exc,
        )
    click.echo(summary_table(summary.to_dict(), out))
    if report_dir is not None:
        click.echo(f"report: {report_dir / 'report.html'}", err=True)
    if outcome.policy_failures:
        finish(EXIT_FAILED)


def _fail(config: Path, problems: list[str], cause: BaseException | None = None) -> NoReturn:
    """Every problem at once (one line when there is one), then exit 2."""
    if len(problems) == 1:
        lines: tuple[str, ...] = (one_line(f"error: {show_path(config)}: {problems[0]}"),)
    else:
        lines = (
            f"error: {show_path(config)}: {len(problems)} problem(s):",
            *(one_line(f"  - {p}") for p in problems),
        )
    raise VerbExit(EXIT_USAGE, lines) from cause
