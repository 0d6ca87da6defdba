"""Bench: repair proposals for violated BN rules (issue 42 targets).

Per network and rule set of the tests and examples -- credit with the paper's Table 3 rules
(the example's synthetic network, and the paper's own, where every rule holds), child's
Disease = Lung at T = 0.2 (examples/child/lung-rules.yaml) and its argmax classifier
(examples/child/disease-rules.yaml), alarm's LVFAILURE and insurance's DrivQuality with the
rules of bench/rules/ -- and per violated rule (and "all rules" together): the verdict, the
seconds to the first proposal and in all (both include the analysis of every parameter,
which the network's targets share), the best proposal's change, the exact minimum, the
inputs it flips, whether it re-verified, the parameters examined and the pairs tried.

Target: every proposal re-verifies; <= 60 s per violated rule on networks of child's size.

Run: ``.venv/bin/python bench/bn_repair.py`` (reads ../shared/data/bn in place; rows of
absent networks are skipped). Writes its table to bench/RESULTS.md under "## bn_repair".
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine_line, run_summary, write_section

from boxwatch.offline.bn.classifier import ClassifierSpec, resolve_spec
from boxwatch.offline.bn.compile import compile_classifier
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.repair import repair
from boxwatch.offline.bn.rules import ClassifierSchema, load_spec

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "bn"
HEADING = "## bn_repair (bench/bn_repair.py)"
TARGET_SECONDS = 60.0
BUDGET = 60.0
"""``--max-seconds`` of every run (the pair search's budget)."""


@dataclass(frozen=True)
class Case:
    """One network, classifier and rule set."""

    label: str
    file: Path
    spec: ClassifierSpec
    rules: Path


CREDIT = ClassifierSpec("CreditWorthiness", "Positive", 0.5)
CASES = (
    Case("credit (example), Table 3", ROOT / "examples/credit/credit.net", CREDIT,
         ROOT / "examples/credit/rules.yaml"),
    Case("credit (paper), Table 3", DATA / "credit.net", CREDIT,
         ROOT / "examples/credit/rules.yaml"),
    Case("child, Lung at 0.2", DATA / "child.bif.gz", ClassifierSpec("Disease", "Lung", 0.2),
         ROOT / "examples/child/lung-rules.yaml"),
    Case("child, argmax Disease", DATA / "child.bif.gz",
         ClassifierSpec("Disease", decision="argmax"), ROOT / "examples/child/disease-rules.yaml"),
    Case("alarm, LVFAILURE at 0.3", DATA / "alarm.bif.gz",
         ClassifierSpec("LVFAILURE", "TRUE", 0.3,
                        features=("HISTORY", "CVP", "PCWP", "BP", "HRBP", "HREKG", "HRSAT")),
         ROOT / "bench/rules/alarm-lvfailure.yaml"),
    Case("insurance, DrivQuality=Poor at 0.4", DATA / "insurance.bif.gz",
         ClassifierSpec("DrivQuality", "Poor", 0.4),
         ROOT / "bench/rules/insurance-drivquality.yaml"),
)  # fmt: skip


def run(case: Case) -> tuple[list[list[str]], list[str]]:
    """The case's table rows and the problems against the targets."""
    network = load_network(case.file)
    spec = resolve_spec(network, case.spec)
    diagram = compile_classifier(network, spec).diagram
    rules = load_spec(case.rules, ClassifierSchema.from_diagram(diagram, network.variables))
    with tempfile.TemporaryDirectory() as out:
        report = repair(
            network, spec, rules, out_dir=out, source=case.file, proposals=1, max_seconds=BUDGET
        )
    violated = sum(v != "holds" for v in report.verdicts.values())
    if not report.targets:
        row = [case.label, f"all {len(report.verdicts)} hold", "-", "-", "-", "-", "-", "-", "-"]
        return [[*row, "-", "-"]], []
    rows, problems = [], []
    for t in report.targets:
        best = t.proposals[0] if t.proposals else None
        first = "-" if t.seconds_first is None else f"{t.seconds_first:.2f}"
        rows.append(
            [
                case.label,
                t.name,
                t.verdict if t.complete else "none found (budget)",
                first,
                f"{t.seconds:.2f}",
                "-" if best is None else f"{float(best.change):.6g}",
                "-" if best is None or best.minimum is None else f"{float(best.minimum):.6g}",
                "-" if best is None else f"{best.flips:,}",
                "-"
                if best is None
                else ("yes" if all(p.reverified for p in t.proposals) else "NO"),
                str(t.parameters),
                f"{t.pairs_tried}/{t.pairs_total}",
            ]
        )
        if any(not p.reverified for p in t.proposals):
            problems.append(f"{case.label} {t.name}: a proposal did not re-verify")
        if t.seconds > TARGET_SECONDS and t.name in report.verdicts:
            problems.append(f"{case.label} {t.name}: {t.seconds:.1f} s > {TARGET_SECONDS:.0f} s")
    print(f"{case.label}: {violated} of {len(report.verdicts)} rules violated, "
          f"analysis {report.setup_seconds:.2f} s, all {report.seconds:.2f} s")  # fmt: skip
    return rows, problems


def main() -> int:
    began = time.perf_counter()
    head = [
        "network, rules",
        "target",
        "verdict",
        "first proposal s",
        "total s",
        "change",
        "minimum",
        "flips",
        "re-verified",
        "parameters",
        "pairs",
    ]
    rows: list[list[str]] = []
    problems: list[str] = []
    skipped = []
    for case in CASES:
        if not case.file.is_file():
            skipped.append(case.label)
            continue
        got, bad = run(case)
        rows += got
        problems += bad
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    table = "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        + ["| " + " | ".join(r) + " |" for r in rows]
    )
    verdict = "all targets met" if not problems else "; ".join(problems)
    notes = [
        machine_line(run_summary(began)),
        "",
        "Per violated rule (and all rules together): the best proposal (proposals=1, "
        f"--max-seconds {BUDGET:.0f}); seconds include the analysis of every parameter, "
        "shared by the network's targets. `minimum`: the exact smallest change of the "
        "proposal's parameter (single parameters only). Targets: every proposal re-verifies; "
        f"<= {TARGET_SECONDS:.0f} s per violated rule on networks of child's size: {verdict}.",
    ]
    if skipped:
        notes.append(f"Skipped (network absent): {', '.join(skipped)}.")
    write_section(HEADING, "\n".join(notes) + "\n\n" + table)
    print(verdict)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
