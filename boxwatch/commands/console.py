"""What every verb shares: the exit codes, one-line errors, summary tables.

Exit codes (documented in ``boxwatch --help`` and the README):

* 0 -- success (artifact valid, all rules hold, build done);
* 1 -- the check ran and failed (invalid artifact, rule violated, build policy failed);
* 2 -- usage, configuration or input error (bad option, missing file, bad config);
* 3 -- a feature's optional dependencies are not installed;
* 70 -- internal error (an unexpected exception: a bug to report; EX_SOFTWARE of sysexits.h);
* 130 -- interrupted (Ctrl-C).

Verbs never exit themselves: they return (success) or raise :class:`VerbExit` (through
:func:`fail` or :func:`finish`) or an error; :func:`boxwatch.cli.run_verb` turns that into
the exit code, the one place that does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from boxwatch.agent.errors import BoxwatchError
from boxwatch.agent.inputs import one_line

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_MISSING_EXTRA = 3
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_CODES = (EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_MISSING_EXTRA, EXIT_INTERNAL, EXIT_INTERRUPTED)


class VerbExit(Exception):
    """How a verb ends, other than by returning: the outcome's exit code and the lines to
    print on stderr first. Raised by verbs, turned into the exit by :mod:`boxwatch.cli`."""

    def __init__(self, code: int, lines: tuple[str, ...] = ()) -> None:
        super().__init__(code, *lines)
        self.code = code
        self.lines = lines


def trusted_keys_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--public-key PATH`` (repeatable, required) handed to the verb as ``public_keys``:
    the keys an artifact must be signed with."""
    return click.option(
        "--public-key",
        "public_keys",
        multiple=True,
        required=True,
        type=click.Path(dir_okay=False, path_type=Path),
        help=help_text,
    )


def echo_err(message: str) -> None:
    """Human-facing text goes to stderr."""
    click.echo(message, err=True)


def fail(exc: BoxwatchError, code: int) -> NoReturn:
    """End the verb with ``code`` and a one-line reason (no traceback for expected errors).

    ``exc`` stays the cause, so the CLI can apply its rules (a missing input file is a usage
    error in every verb). The line is made printable and capped
    (:func:`~boxwatch.agent.inputs.one_line`): what it echoes of the user's input cannot add
    lines or terminal escapes."""
    raise VerbExit(code, (one_line(f"error: {exc}"),)) from exc


def finish(code: int, *lines: str) -> NoReturn:
    """End the verb with ``code`` after its output (e.g. 1 when a rule is violated)."""
    raise VerbExit(code, lines)


def aligned(rows: Sequence[Sequence[str]]) -> str:
    """Rows of cells as left-aligned columns two spaces apart (a verb's table on stdout)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))] if rows else []
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


# What the precision / recall row counts as positive (offline/monitors/evaluation.py).
POSITIVE = "positive: a misclassified or unknown input; flagged: reject"


def _matched_row(compared: dict[str, Any]) -> tuple[str, str]:
    """The misclassified inputs each method accepts at the matched point (the report has
    every column)."""
    shares = ", ".join(
        f"{'box verdicts' if j == 0 else r['method']} {_fmt(r['misclassified_known'])}"
        for j, r in enumerate(compared["rows"])
    )
    return (
        f"misclassified accepted ({compared['point']})",
        f"{shares} (each baseline accepting {_fmt(compared['accepted_share'])} of the "
        f"correct {compared['set']} inputs, as the box verdicts do)",
    )


def _repair_line(target: dict[str, Any]) -> str:
    """A ``bn.repair`` target in the summary table: its best proposal, or why there is none."""
    if not target["proposals"]:
        if not target["complete"]:
            return "none found (the search stopped at bn.repair_seconds)"
        return (
            f"none: no single parameter (proved, {target['parameters']} parameters), "
            f"no pair found ({target['pairs_tried']} of {target['pairs_total']} tried)"
        )
    best = target["proposals"][0]
    changes = "; ".join(f"{c['parameter']} {c['old']} -> {c['new']}" for c in best["changes"])
    checked = "re-verified" if best["reverified"] else "NOT re-verified"
    return f"{changes} (change {best['change']}, {checked}; {best['file']})"


def summary_table(summary: dict[str, Any], out: Path) -> str:
    """The end-of-build table (stdout): what was built and how it scored."""
    rows: list[tuple[str, str]] = [
        ("artifact", str(out)),
        ("artifact id", summary["artifact"]["artifact_id"]),
        ("bytes", str(summary["artifact"]["bytes"])),
    ]
    mon = summary.get("monitor")
    if mon:
        acc = summary["model"]["accuracy"]
        rows.append(("model accuracy", ", ".join(f"{k} {_fmt(v)}" for k, v in acc.items())))
        choice = mon.get("layer_choice") or {}
        if choice.get("mode") == "auto":
            why = {c["layer"]: c["reason"] for c in choice.get("candidates") or []}
            rows.append(
                (
                    "layers (auto)",
                    ", ".join(f"{name} ({why.get(name, '?')})" for name in mon["layers"]),
                )
            )
        boxes = sum(sum(v["good"]) + sum(v["bad"]) for v in mon["boxes"].values())
        rows.append(
            (
                "monitors",
                f"{len(mon['layers'])} layers x {len(summary['model']['classes'])} "
                f"classes, {boxes} boxes",
            )
        )
        ev = (mon.get("evaluation") or {}).get("combined")
        if ev:
            rows.append(
                (
                    "validation",
                    f"precision {_fmt(ev['precision'])}, recall "
                    f"{_fmt(ev['recall'])}, F1 {_fmt(ev['f1'])} ({POSITIVE})",
                )
            )
        cal = mon["calibration"]
        rows.append(
            (
                "score threshold",
                f"{_fmt(cal['threshold'])} (target: accept "
                f"{_fmt(cal['target_acceptance'])} of correctly classified known inputs)",
            )
        )
        if cal.get("error_cut") is not None:
            rows.append(
                (
                    "error model cut",
                    f"{_fmt(cal['error_cut'])} (learnt probability that the model is wrong; "
                    "above it: uncertainty)",
                )
            )
        if cal.get("confidence_floor") is not None:
            rows.append(
                (
                    "confidence floor",
                    f"{_fmt(cal['confidence_floor'])} (model's top softmax probability; "
                    "below it: uncertainty)",
                )
            )
        choice = cal.get("share_choice") or {}
        if cal.get("confidence_share") is not None and choice:
            rows.append(
                (
                    "uncertainty share",
                    f"{_fmt(cal['confidence_share'])} of the non-accepted budget "
                    f"({choice['method']}: {choice['reason']})",
                )
            )
        split = (mon.get("verdicts") or {}).get("split") or {}
        if split:
            rows.append(("emitted verdicts", f"on {(mon.get('verdicts') or {}).get('set')}:"))
        for name, v in split.items():
            rows.append(
                (
                    f"  {name}",
                    f"accept {_fmt(v['accept'])}, uncertainty {_fmt(v['uncertainty'])}, "
                    f"reject {_fmt(v['reject'])} (n={v['n']})",
                )
            )
        det = mon.get("detection")
        if det:
            rows.append(("score AUROC", f"{_fmt(det['auroc'])} (known vs data.unknown)"))
        compared = mon.get("baselines")
        if compared:
            rows.append(_matched_row(compared))
        for w in mon.get("warnings") or []:
            rows.append((f"warning {w['name']}", w["message"]))
    bn = summary.get("bn")
    if bn:
        if bn.get("decision") == "argmax":
            decided = ", ".join(f"{k} {v}" for k, v in (bn.get("decided") or {}).items())
            line = (
                f"argmax {bn['class']}: {bn['nodes']} nodes, {bn['inputs']} inputs "
                f"({decided}), {bn['ties']} ties"
            )
        else:
            line = (
                f"{bn['class']}={bn['positive']} at T={bn['threshold']}: "
                f"{bn['nodes']} nodes, {bn['positives']}/{bn['inputs']} "
                f"positive, {bn['ties']} ties"
            )
        rows.append(("BN classifier", line))
        for r in bn["rules"]:
            rows.append(
                (
                    f"  rule {r['id']}",
                    r["verdict"]
                    + (f" ({r['violations']} violating inputs)" if r["verdict"] != "holds" else ""),
                )
            )
        for q in bn["fmo"]:
            rows.append((f"  {q['kind']} {q['id']}", q["verdict"]))
        for t in bn.get("repairs") or []:
            rows.append((f"  repair {t['target']}", _repair_line(t)))
    failed = summary["policy"]["failed"]
    rows.append(("policy", "PASS" if not failed else "FAIL: " + "; ".join(failed)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
