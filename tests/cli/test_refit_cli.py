"""``boxwatch refit`` and ``boxwatch capture-report`` from a capture export and a labels file:
exit codes, what they print, and the sources they refuse."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from click.testing import CliRunner

from boxwatch.agent.artifact import load_artifact
from boxwatch.agent.kafka.base import Record
from boxwatch.agent.members import REFIT
from boxwatch.agent.outputs import copy_output, reason_headers
from boxwatch.agent.records import TENSOR_TYPE
from boxwatch.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE, cli
from boxwatch.offline.refit.archive import write_export

TOPIC = "cap"
N_CAPTURES = 60


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(scope="module")
def reviews(model_example, tmp_path_factory):
    """An export of captures of the example's unknown digits, and labels calling them
    ``correct`` (so the refit widens boxes over unknown inputs: a guard must trip)."""
    out = tmp_path_factory.mktemp("reviews")
    x = np.load(model_example.data / "unknown_digits.npz")["x"][:N_CAPTURES]
    records = []
    for i, row in enumerate(x):
        rid = f"u{i}"
        value = np.asarray(row, "<f4").tobytes()
        headers = [
            ("content-type", TENSOR_TYPE.encode()),
            ("id", rid.encode()),
            ("dtype", b"float32"),
        ]
        consumed = Record("in", 0, i, 1_700_000_000_000 + 1000 * i, rid.encode(), value, headers)
        copy = copy_output(
            "capture", TOPIC, consumed, reason_headers("reject", "outside_boxes", None, None)
        )
        records.append(Record(TOPIC, 0, i, consumed.timestamp, copy.key, copy.value, copy.headers))
    export = write_export(records, out / "export", TOPIC)
    labels = out / "labels.jsonl"
    labels.write_text(
        "".join(json.dumps({"id": f"u{i}", "label": "correct"}) + "\n" for i in range(len(x)))
    )
    return export.parent, labels


def refit_args(example, reviews, out, *extra: str) -> list[str]:
    captures, labels = reviews
    return [
        "refit",
        str(example.artifact),
        "--config",
        str(example.config),
        "--public-key",
        str(example.public_key),
        "--key",
        str(example.private_key),
        "--captures",
        str(captures),
        "--labels",
        str(labels),
        "--out",
        str(out),
        "--created-at",
        "1700000100",
        "--quiet",
        *extra,
    ]


def test_a_tripped_guard_exits_1_writes_nothing_and_shows_the_table(
    model_example, reviews, tmp_path
):
    out = tmp_path / "child.bwa"
    result = run(*refit_args(model_example, reviews, out))
    assert result.exit_code == EXIT_FAILED, result.output
    assert not out.exists()
    assert "refit guards failed: unknown_acceptance:unknown" in result.stderr
    assert result.stderr.strip().count("\n") == 0  # one line
    table = result.stdout.splitlines()
    assert table[0].split() == ["data", "measure", "n", "before", "after"]
    assert any(line.startswith("validation") for line in table[1:])


def test_the_override_writes_the_child_and_records_it(model_example, reviews, tmp_path):
    out = tmp_path / "child.bwa"
    result = run(*refit_args(model_example, reviews, out, "--allow-guard-failure", "--json"))
    assert result.exit_code == EXIT_OK, result.output
    summary = json.loads(result.stdout)
    record = load_artifact(out, None).json(REFIT)
    assert record["overridden"] == summary["overridden"] and record["overridden"]
    assert summary["child"]["path"] == str(out) and "guards overridden" in result.stderr
    assert summary["captures"]["correct"] == N_CAPTURES


@pytest.mark.parametrize(
    ("drop", "add", "says"),
    [
        (["--captures"], [], "give the captures once"),
        ([], ["--captures-topic", "t"], "give the captures once"),
        (["--labels"], [], "no labels"),
        (["--captures"], ["--captures-topic", "t"], "need --brokers"),
    ],
)
def test_sources_given_wrongly_are_usage_errors(model_example, reviews, tmp_path, drop, add, says):
    args = refit_args(model_example, reviews, tmp_path / "child.bwa")
    for option in drop:
        at = args.index(option)
        del args[at : at + 2]
    result = run(*args, *add)
    assert result.exit_code == EXIT_USAGE and says in result.output, result.output


def test_the_capture_report_prints_its_clusters_and_writes_its_folder(
    model_example, reviews, tmp_path
):
    captures, labels = reviews
    result = run(
        "capture-report",
        str(model_example.artifact),
        "--model",
        str(model_example.model),
        "--public-key",
        str(model_example.public_key),
        "--captures",
        str(captures),
        "--labels",
        str(labels),
        "--out",
        str(tmp_path / "report"),
    )
    assert result.exit_code == EXIT_OK, result.output
    out = tmp_path / "report"
    report = json.loads((out / "capture_report.json").read_text())
    clusters = report["clusters"]
    # the table: a header, then one row per cluster of the JSON, with its size and verdict
    header, *rows = result.stdout.splitlines()
    assert header.split()[:3] == ["cluster", "size", "verdict"]
    assert [row.split()[:2] for row in rows] == [[str(c["id"]), str(c["size"])] for c in clusters]
    assert all(c["verdict"] in row for c, row in zip(clusters, rows, strict=True))
    # every capture counted once: accepted now, in a cluster, scattered, or not finite
    in_clusters = sum(c["size"] for c in clusters)
    assert in_clusters + report["n_scattered"] == report["n_clustered"]
    assert report["n_clustered"] + report["n_accepted"] + report["n_not_finite"] == N_CAPTURES
    assert sum(sum(per_bin) for per_bin in report["rate"].values()) == N_CAPTURES
    members = [i for c in clusters for i in c["member_ids"]]
    assert len(members) == len(set(members)) == in_clusters
    assert set(members) <= {f"u{i}" for i in range(N_CAPTURES)}
    # the reviewer called every capture correct: each cluster's labels say so
    assert all(c["labels"]["correct"] == c["size"] for c in clusters)
    assert result.stderr.startswith(
        f"{N_CAPTURES} captures: {report['n_accepted']} accepted by the artifact now, "
        f"{in_clusters} in {len(clusters)} cluster(s), {report['n_scattered']} scattered; "
    )
    # the page stands alone: each plot written beside it is embedded in it
    page = (out / "capture_report.html").read_text()
    plots = sorted(out.glob("*.png"))
    assert len(plots) == 3
    assert all(base64.b64encode(p.read_bytes()).decode() in page for p in plots)


def test_labels_it_cannot_join_are_warned_on_one_line_each(model_example, reviews, tmp_path):
    captures, labels = reviews
    odd = tmp_path / "labels.jsonl"
    odd.write_text(
        labels.read_text() + json.dumps({"id": "gone\nSECOND", "label": "correct"}) + "\n"
    )
    out = tmp_path / "child.bwa"
    args = refit_args(model_example, (captures, odd), out, "--allow-guard-failure")
    result = run(*args)
    assert result.exit_code == EXIT_OK, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "no capture" in warnings[0] and "SECOND" in warnings[0]


def test_a_child_created_before_its_parent_is_refused(model_example, reviews, tmp_path):
    args = refit_args(model_example, reviews, tmp_path / "child.bwa")
    at = args.index("--created-at")
    args[at + 1] = "1000"
    result = run(*args)
    assert result.exit_code == EXIT_USAGE and "before its parent's" in result.stderr
    assert not (tmp_path / "child.bwa").exists()
