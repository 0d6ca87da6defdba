"""``boxwatch build-artifact``: one config in, one signed artifact (and a report) out."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from boxwatch.agent.artifact import write_artifact
from boxwatch.agent.errors import ArtifactError, ConfigError, KeyFileError
from boxwatch.agent.keys import load_private_key
from boxwatch.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from boxwatch.offline.build import build, prepare
from boxwatch.offline.config import load_config
from boxwatch.offline.report import write_report

KEY_FILE_ENV = "BOXWATCH_SIGNING_KEY_FILE"


def progress_bar(label: str, total: int) -> Any:
    """A stderr progress bar for long build steps (what :func:`build` calls ``progress``)."""
    return click.progressbar(length=total, label=label, file=sys.stderr, show_pos=True)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def summary_table(summary: dict[str, Any], out: Path) -> str:
    """The end-of-build table (stdout): what was built and how it scored."""
    rows: list[tuple[str, str]] = [("artifact", str(out)),
                                   ("artifact id", summary["artifact"]["artifact_id"]),
                                   ("bytes", str(summary["artifact"]["bytes"]))]
    mon = summary.get("monitor")
    if mon:
        acc = summary["model"]["accuracy"]
        rows.append(("model accuracy", ", ".join(f"{k} {_fmt(v)}" for k, v in acc.items())))
        boxes = sum(sum(v["good"]) + sum(v["bad"]) for v in mon["boxes"].values())
        rows.append(("monitors", f"{len(mon['layers'])} layers x {len(summary['model']['classes'])} "
                                 f"classes, {boxes} boxes"))
        ev = (mon.get("evaluation") or {}).get("combined")
        if ev:
            rows.append(("validation", f"precision {_fmt(ev['precision'])}, recall "
                                       f"{_fmt(ev['recall'])}, F1 {_fmt(ev['f1'])}"))
        cal = mon["calibration"]
        rows.append(("score threshold", f"{_fmt(cal['threshold'])} (accepts "
                                        f"{_fmt(cal['known_acceptance'])} of known, "
                                        f"{_fmt(cal['unknown_acceptance'])} of unknown)"))
        det = mon.get("detection")
        if det:
            rows.append(("detection", f"AUROC {_fmt(det['auroc'])}, FPR@95 {_fmt(det['fpr_at_95'])}"))
        for point in mon.get("operating_points") or []:
            if point["set"] != "unknown":
                rows.append((point["set"], f"accepted {_fmt(point['acceptance'])}, AUROC "
                                           f"{_fmt(point['auroc'])}"))
    bn = summary.get("bn")
    if bn:
        rows.append(("BN classifier", f"{bn['class']}={bn['positive']} at T={bn['threshold']}: "
                                      f"{bn['nodes']} nodes, {bn['positives']}/{bn['inputs']} "
                                      f"positive, {bn['ties']} ties"))
        for r in bn["rules"]:
            rows.append((f"  rule {r['id']}", r["verdict"] + (
                f" ({r['violations']} violating inputs)" if r["verdict"] != "holds" else "")))
        for q in bn["fmo"]:
            rows.append((f"  {q['kind']} {q['id']}", q["verdict"]))
    failed = summary["policy"]["failed"]
    rows.append(("policy", "PASS" if not failed else "FAIL: " + "; ".join(failed)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


@click.command("build-artifact")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--key", "key_path", type=click.Path(dir_okay=False, path_type=Path),
              help=f"Ed25519 private key (PEM) that signs the artifact [${KEY_FILE_ENV}].")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the artifact (atomically). Required unless --dry-run.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Folder for report.html and summary.json.")
@click.option("--dry-run", is_flag=True, help="Validate the config and every input, build nothing.")
@click.option("--created-at", type=int,
              help="Creation time (Unix seconds); default $SOURCE_DATE_EPOCH, else now.")
def build_artifact(config: Path, key_path: Path | None, out: Path | None, report_dir: Path | None,
                   dry_run: bool, created_at: int | None) -> None:
    """Build the signed artifact a release pipeline publishes.

    Validates every input first (all problems listed at once), extracts activations, fits
    and selects the box monitors, calibrates the score threshold, compiles the BN classifier,
    verifies its rules and monotonicity queries, then writes the artifact atomically and
    prints a summary table. The same config, data, key and creation time give a
    byte-identical artifact. The key never comes from the config: use --key or
    $BOXWATCH_SIGNING_KEY_FILE.

    \b
    Example:
      boxwatch build-artifact build.yaml --key ci.key --out model.bwa --report report/
    Exit codes: 0 built; 1 built, but a policy of the config failed; 2 config or input error.
    """
    try:
        cfg = load_config(config)
        prepared = prepare(cfg)
        if dry_run:
            click.echo(f"{config}: valid; nothing built (--dry-run)", err=True)
            sys.exit(EXIT_OK)
        key_path = key_path or (Path(os.environ[KEY_FILE_ENV]) if KEY_FILE_ENV in os.environ else None)
        if key_path is None:
            raise ConfigError(f"no signing key: give --key PATH or set ${KEY_FILE_ENV}")
        if out is None:
            raise ConfigError("--out ARTIFACT is required (or use --dry-run)")
        private_key = load_private_key(key_path)
        outcome = build(prepared, private_key, created_at=created_at, progress=progress_bar)
        write_artifact(out, outcome.artifact)
        outcome.summary["artifact"]["path"] = str(out)
        if report_dir is not None:
            write_report(outcome.summary, report_dir)
    except (ConfigError, KeyFileError, ArtifactError) as exc:
        problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
        click.echo(f"error: {config}: {len(problems)} problem(s):", err=True)
        for p in problems:
            click.echo(f"  - {p}", err=True)
        sys.exit(EXIT_USAGE)
    click.echo(summary_table(outcome.summary, out))
    if report_dir is not None:
        click.echo(f"report: {report_dir / 'report.html'}", err=True)
    sys.exit(EXIT_FAILED if outcome.policy_failures else EXIT_OK)
