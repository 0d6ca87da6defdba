"""The end-of-build table: the precision/recall row says what counts as positive, and the
matched comparison's misclassified shares are printed beside the box verdicts'."""

from __future__ import annotations

from pathlib import Path

from boxwatch.commands.console import POSITIVE, summary_table


def _line(table: str, start: str) -> str:
    return next(li for li in table.splitlines() if li.startswith(start))


def test_precision_recall_row_says_what_positive_means(example):
    table = summary_table(example.summary.to_dict(), Path("model.bwa"))
    line = _line(table, "validation ")
    ev = example.summary.monitor.evaluation.combined
    assert f"recall {ev.recall:.4g}" in line
    assert line.endswith(f"({POSITIVE})")
    assert "misclassified or unknown" in POSITIVE and "reject" in POSITIVE


def test_matched_comparison_row_names_its_point_and_each_method(example):
    compared = example.summary.monitor.baselines
    table = summary_table(example.summary.to_dict(), Path("model.bwa"))
    line = _line(table, f"misclassified accepted ({compared.point})")
    box, *baselines = compared.rows
    assert f"box verdicts {box.misclassified_known:.4g}" in line
    for row in baselines:
        assert f"{row.method} {row.misclassified_known:.4g}" in line
    assert f"correct {compared.set} inputs" in line
