"""``boxwatch compile-bn``, called in-process: JSON keys, figures, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bn_synthetic import random_dag
from click.testing import CliRunner
from locations import SHARED_BN

from boxwatch.cli import EXIT_OK, EXIT_USAGE, cli
from boxwatch.offline.bn.formats import write_bif
from boxwatch.offline.progress import INTERVAL_ENV, LINE

SHARED = SHARED_BN
JSON_KEYS = {
    "features",
    "order",
    "nodes",
    "nodes_quasi",
    "nodes_per_level",
    "positives",
    "inputs",
    "ties",
    "exact_inputs",
    "certified",
    "uncertified",
    "seconds",
    "parse_seconds",
}

# The classifier P(v3 = s1 | x) > 0.4 of ``bif_file``'s network.
V3_S1_AT_04 = ("--class", "v3", "--positive", "s1", "--threshold", "0.4")


@pytest.fixture
def bif_file(tmp_path: Path) -> Path:
    path = tmp_path / "net.bif"
    path.write_text(write_bif(random_dag(7, seed=8, floor=0.01)))
    return path


def run(*args: str):
    return CliRunner().invoke(cli, ["compile-bn", *args], catch_exceptions=False)


def test_json_output_has_the_documented_keys(bif_file):
    res = run(
        str(bif_file), *V3_S1_AT_04, "--features", "v0,v5,v6", "--order", "v6,v0,v5", "--json"
    )
    assert res.exit_code == EXIT_OK, res.output
    info = json.loads(res.stdout)
    assert JSON_KEYS <= set(info)
    assert info["order"] == ["v6", "v0", "v5"]
    assert sorted(info["features"]) == ["v0", "v5", "v6"]
    net = random_dag(7, seed=8, floor=0.01)
    assert info["inputs"] == int(np.prod([net.card(v) for v in ("v0", "v5", "v6")]))
    assert sum(info["nodes_quasi_per_level"]) == info["nodes_quasi"]
    assert sum(info["nodes_per_level"]) == info["nodes"]
    assert 0 <= info["positives"] <= info["inputs"]


def test_both_methods_report_the_same_diagram(bif_file):
    common = [
        str(bif_file),
        "--class",
        "v3",
        "--positive",
        "s0",
        "--threshold",
        "0.5",
        "--features",
        "v0,v4,v5,v6",
        "--json",
    ]
    a = json.loads(run(*common, "--method", "joint").stdout)
    b = json.loads(run(*common, "--method", "decompose").stdout)
    c = json.loads(run(*common, "--method", "jointree").stdout)
    for key in ("nodes", "nodes_quasi", "positives", "ties", "nodes_per_level"):
        assert a[key] == b[key] == c[key], key
    assert (a["method"], b["method"], c["method"]) == ("joint", "decompose/separator", "jointree")


def test_text_output_goes_to_stdout_and_a_note_to_stderr(bif_file):
    res = run(str(bif_file), "--class", "v3", "--positive", "s1", "--threshold", "0.5")
    assert res.exit_code == EXIT_OK
    assert "quasi-reduced" in res.stdout and "positives" in res.stdout
    assert "compiled" in res.stderr and "compiled" not in res.stdout


TIE_NET = """network t {
}
variable C { type discrete [ 2 ] { neg, pos }; }
variable H { type discrete [ 2 ] { h0, h1 }; }
variable F { type discrete [ 2 ] { f0, f1 }; }
variable G { type discrete [ 2 ] { g0, g1 }; }
probability ( C ) { table 0.02, 0.98; }
probability ( H | C ) { (neg) 0.3, 0.7; (pos) 0.3, 0.7; }
probability ( F | H ) { (h0) 0.9, 0.1; (h1) 0.2, 0.8; }
probability ( G | C ) { (neg) 0.35, 0.65; (pos) 0.35, 0.65; }
"""


@pytest.mark.parametrize("method", ["joint", "decompose"])
def test_exact_ties_and_the_exact_path_are_reported(tmp_path, method):
    # F and G carry no evidence (equal rows): every posterior is exactly the prior 0.98
    path = tmp_path / "tie.bif"
    path.write_text(TIE_NET)
    args = [str(path), "--class", "C", "--positive", "pos", "--threshold", "0.98"]
    res = run(*args, "--features", "F,G", "--method", method, "--json")
    assert res.exit_code == EXIT_OK, res.output
    info = json.loads(res.stdout)
    assert (info["ties"], info["positives"], info["inputs"]) == (4, 4, 4)
    assert info["exact_inputs"] == 4 and info["certified"] is True
    text = run(*args, "--features", "F,G", "--method", method).stdout
    assert "posterior exactly T" in text and "exact rational arithmetic" in text
    assert "the diagram equals the classifier of the network as read" in text


def test_bad_spec_exits_2_with_every_problem(bif_file):
    res = run(
        str(bif_file),
        "--class",
        "v3",
        "--positive",
        "nope",
        "--threshold",
        "0",
        "--features",
        "v0,zz",
    )
    assert res.exit_code == EXIT_USAGE
    assert "positive state 'nope'" in res.stderr
    assert "threshold 0.0" in res.stderr
    assert "['zz']" in res.stderr


def test_parse_error_exits_2_naming_the_line(tmp_path):
    path = tmp_path / "broken.bif"
    path.write_text(
        "variable A {\n  type discrete [ 2 ] { a, b };\n}\nprobability ( A ) {\n"
        "  table 0.5, x;\n}\n"
    )
    res = run(str(path), "--class", "A", "--positive", "a", "--threshold", "0.5")
    assert res.exit_code == EXIT_USAGE
    assert f"{path}:5: expected a number, found 'x'" in res.stderr


@pytest.mark.shared_data
@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/data/bn (absent in a plain clone)")
def test_child_reference_figures_from_the_command_line():
    res = run(
        str(SHARED / "child.bif.gz"),
        "--class",
        "BirthAsphyxia",
        "--positive",
        "no",
        "--threshold",
        "0.9",
        "--order",
        "LVHreport,GruntingReport,RUQO2,LowerBodyO2,XrayReport,Age,CO2Report",
        "--json",
    )
    info = json.loads(res.stdout)
    assert (info["nodes_quasi"], info["positives"], info["inputs"]) == (41, 844, 1080)


def test_json_reports_the_chosen_routes_estimate(bif_file):
    res = run(str(bif_file), *V3_S1_AT_04, "--json")
    assert res.exit_code == EXIT_OK, res.output
    info = json.loads(res.stdout)
    assert info["estimate"]["route"] == info["method"]
    assert info["estimate"]["bytes"] > 0 and info["estimate"]["seconds"] > 0
    text = run(str(bif_file), *V3_S1_AT_04).stdout
    assert f"estimate     {info['method']}: ~" in text


def test_over_the_memory_limit_exits_2_with_one_line(bif_file):
    res = run(str(bif_file), *V3_S1_AT_04, "--max-memory", "1K")
    assert res.exit_code == EXIT_USAGE
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "memory limit 1 KiB" in lines[0] and "joint: ~" in lines[0]
    assert res.stdout == ""


def test_a_bad_size_is_a_usage_error(bif_file):
    res = run(str(bif_file), *V3_S1_AT_04, "--max-memory", "lots")
    assert res.exit_code == EXIT_USAGE
    assert "'lots' is not a size" in res.stderr


def test_running_out_of_memory_anyway_exits_2_with_the_estimate(bif_file, monkeypatch):
    from boxwatch.offline.bn import compile as bn_compile

    def exhausted(*_args, **_kw):
        raise MemoryError

    monkeypatch.setattr(bn_compile, "_compile_joint", exhausted)
    res = run(str(bif_file), *V3_S1_AT_04, "--method", "joint")
    assert res.exit_code == EXIT_USAGE
    assert "out of memory during the joint route (estimate joint: ~" in res.stderr
    assert "Traceback" not in res.output


def test_help_documents_the_limits():
    res = CliRunner().invoke(cli, ["compile-bn", "--help"])
    assert "--max-memory" in res.output and "--max-seconds" in res.output
    assert "exits 2" in res.output


def test_argmax_json_counts_every_state_and_agrees_across_routes(bif_file):
    net = random_dag(7, seed=8, floor=0.01)
    cls = next(v for v in net.variables if net.card(v) >= 3)
    infos = []
    for method in ("joint", "decompose", "jointree"):
        res = run(
            str(bif_file), "--class", cls, "--decision", "argmax", "--method", method, "--json"
        )
        assert res.exit_code == EXIT_OK, res.output
        infos.append(json.loads(res.stdout))
    info = infos[0]
    assert info["decision"] == "argmax" and info["positive"] is None
    assert info["terminals"] == list(net.states[cls])
    assert sum(info["decided"].values()) == info["inputs"]
    assert info["positives"] is None
    assert {
        k: v
        for k, v in infos[1].items()
        if k not in ("seconds", "method", "estimate", "parse_seconds", "planning_seconds")
    } == {
        k: v
        for k, v in info.items()
        if k not in ("seconds", "method", "estimate", "parse_seconds", "planning_seconds")
    }
    text = run(str(bif_file), "--class", cls, "--decision", "argmax")
    assert text.exit_code == EXIT_OK and f"argmax_c P({cls} = c | x)" in text.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--decision", "argmax", "--positive", "s1"], "--positive apply to --decision threshold"),
        (["--decision", "argmax", "--threshold", "0.5"], "--threshold apply"),
        (["--positive", "s1"], "--threshold required with --decision threshold"),
        ([], "--positive and --threshold required"),
    ],
)
def test_decision_options_are_checked_as_usage_errors(bif_file, args, message):
    res = run(str(bif_file), "--class", "v3", *args)
    assert res.exit_code == EXIT_USAGE
    assert message in res.output


def test_a_route_that_cannot_certify_says_so(tmp_path, monkeypatch):
    from boxwatch.offline.bn import compile as bn_compile

    # naive Bayes (the additive route) with every posterior exactly 0.98, and no room to
    # patch its sub-classifiers
    path = tmp_path / "nb.bif"
    path.write_text(
        TIE_NET.replace("probability ( H | C ) { (neg) 0.3, 0.7; (pos) 0.3, 0.7; }", "")
        .replace("variable H { type discrete [ 2 ] { h0, h1 }; }", "")
        .replace("probability ( F | H ) { (h0) 0.9, 0.1; (h1) 0.2, 0.8; }", "")
        + "probability ( F | C ) { (neg) 0.9, 0.1; (pos) 0.9, 0.1; }\n"
    )
    monkeypatch.setattr(bn_compile, "ADDITIVE_EXACT_LIMIT", 0)
    args = [str(path), "--class", "C", "--positive", "pos", "--threshold", "0.98"]
    args += ["--features", "F,G", "--method", "decompose"]
    info = json.loads(run(*args, "--json").stdout)
    assert (info["method"], info["certified"], info["uncertified"]) == (
        "decompose/additive",
        False,
        4,
    )
    assert "exact        NO: 4 inputs" in run(*args).stdout


def test_each_phase_shows_by_name_on_stderr_and_stdout_stays_json(bif_file, monkeypatch):
    """Issue 39, point 6: off a terminal, one line per interval (0 here: every count)."""
    monkeypatch.setenv(INTERVAL_ENV, "0")
    res = run(str(bif_file), *V3_S1_AT_04, "--method", "decompose", "--json")
    assert res.exit_code == EXIT_OK, res.output
    json.loads(res.stdout)  # nothing but the JSON on stdout
    for phase in ("reading the network", "choosing the feature order", "compiling"):
        assert f"\n{phase}: done in " in f"\n{res.stderr}", phase
    assert any(LINE.match(line) and "/" in line for line in res.stderr.splitlines())
    assert "\r" not in res.stderr


def test_quiet_shows_no_progress(bif_file, monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "0")
    res = run(str(bif_file), *V3_S1_AT_04, "--quiet")
    assert res.exit_code == EXIT_OK, res.output
    assert len(res.stderr.splitlines()) == 1 and "compiled" in res.stderr


OFF_ROWS_BIF = """network n {
}
variable C {
  type discrete [ 2 ] { neg, pos };
}
variable F {
  type discrete [ 2 ] { f0, f1 };
}
probability ( C ) {
  table 0.4, 0.6;
}
probability ( F | C ) {
  (neg) 0.3, 0.7;
  (pos) 0.5, 0.5005;
}
"""


@pytest.mark.parametrize(("row", "warned"), [("0.5005", True), ("0.5000001", False)])
def test_the_reading_and_the_largest_row_deviation_are_said(tmp_path, row, warned):
    path = tmp_path / "off.bif"
    path.write_text(OFF_ROWS_BIF.replace("0.5005", row))
    args = (str(path), "--class", "C", "--positive", "pos", "--threshold", "0.5")
    text = run(*args)
    assert text.exit_code == EXIT_OK, text.output
    assert "reading      each CPT row divided by its sum (1 row off 1 as written" in text.stdout
    assert ("warning:" in text.stderr and "'F'" in text.stderr) == warned
    info = json.loads(run(*args, "--json").stdout)["reading"]
    assert info["rows_off"] == 1 and info["variable"] == "F"
    assert info["largest_row_deviation"] == pytest.approx(float(row) - 0.5)
