"""``boxwatch verify-bn`` in-process: tables, JSON, exit codes 0 / 1 / 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from boxwatch.cli import cli
from boxwatch.offline.progress import INTERVAL_ENV

# P(C=yes | A, B) >= 0.5 holds exactly for (A, B) in {(mid, on), (high, off), (high, on)}
# (worked out by hand from these CPTs: e.g. high/off 0.4*0.6*0.2 = 0.048 > 0.6*0.1*0.7).
BIF = """network tiny { }
variable C { type discrete [ 2 ] { no, yes }; }
variable A { type discrete [ 3 ] { low, mid, high }; }
variable B { type discrete [ 2 ] { off, on }; }
probability ( C ) { table 0.6, 0.4; }
probability ( A | C ) { (no) 0.6, 0.3, 0.1; (yes) 0.1, 0.3, 0.6; }
probability ( B | C ) { (no) 0.7, 0.3; (yes) 0.2, 0.8; }
"""
HOLDING = """rules:
  - name: high_is_yes
    if: {A: high}
    then: yes
  - name: low_off_is_no
    if: {A: "< 1", B: "off"}
    then: no
"""
VIOLATED = (
    HOLDING
    + """  - name: on_is_yes
    if: {B: on}
    then: yes
"""
)
FMO = """states:
  A: [high, mid, low]
monotonicity:
  - {name: a_fmo, feature: A}
  - {name: a_down, feature: A, check: decreasing, given: {B: on}}
  - {name: b_fmo, feature: B}
"""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "tiny.bif").write_text(BIF)
    for name, text in (("ok.yaml", HOLDING), ("bad.yaml", VIOLATED), ("fmo.yaml", FMO)):
        (tmp_path / name).write_text(text)
    return tmp_path


THRESHOLD = ("--positive", "yes", "--threshold", "0.5")
ARGMAX = ("--decision", "argmax")


def run(files, *args, decision: tuple[str, ...] = THRESHOLD):
    """``boxwatch verify-bn tiny.bif --class C`` with ``decision`` (P(yes | x) > 0.5 unless
    said) and ``args``, in-process."""
    base = ["verify-bn", str(files / "tiny.bif"), "--class", "C", *decision]
    return CliRunner().invoke(cli, base + list(args), catch_exceptions=False)


def test_all_rules_hold_exit_0_and_table(files):
    res = run(files, "--rules", str(files / "ok.yaml"), "--fmo", str(files / "fmo.yaml"))
    assert res.exit_code == 0, res.output
    assert "high_is_yes" in res.stdout and "holds" in res.stdout
    assert "b_fmo" in res.stdout and "cannot flip twice" in res.stdout
    assert "2 of 2 rules hold" in res.stderr


def test_violated_rule_exit_1_with_count_and_compact_counterexample(files):
    res = run(files, "--rules", str(files / "bad.yaml"), "--json")
    assert res.exit_code == 1
    report = json.loads(res.stdout)
    assert report["all_hold"] is False
    on = {r["rule"]: r for r in report["rules"]}["on_is_yes"]
    assert (on["verdict"], on["violating_inputs"], on["premise_inputs"]) == ("violated", 1, 3)
    assert on["counterexamples"][0]["fixed"] == {"A": "low"}
    assert on["witness"] == {"A": "low", "B": "on"} and on["witness_class"] == "no"
    # P(A=low, B=on) = 0.6*0.6*0.3 + 0.4*0.1*0.8
    assert on["violating_probability"] == pytest.approx(0.6 * 0.6 * 0.3 + 0.4 * 0.1 * 0.8)
    text = run(files, "--rules", str(files / "bad.yaml"))
    assert "A=low" in text.stdout and "1 of 3" in text.stdout


def test_monotonicity_with_declared_descending_order(files):
    # A declared high < mid < low: the class only ever goes yes -> no as A "rises".
    res = run(files, "--rules", str(files / "ok.yaml"), "--fmo", str(files / "fmo.yaml"), "--json")
    mono = {m["query"]: m for m in json.loads(res.stdout)["monotonicity"]}
    assert mono["a_fmo"]["verdict"] == "holds"
    assert mono["a_down"]["verdict"] == "holds"
    assert mono["b_fmo"]["verdict"] == "holds" and "cannot flip twice" in mono["b_fmo"]["reason"]


def test_input_errors_exit_2_listing_every_problem(files):
    (files / "typo.yaml").write_text(
        "rules:\n  - {name: r1, if: {Z: 1}, then: yes}\n  - {name: r2, if: {C: yes}, then: maybe}\n"
    )
    res = run(files, "--rules", str(files / "typo.yaml"))
    assert res.exit_code == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 3
    assert any("'r1'" in ln and "'Z'" in ln for ln in lines)
    assert any("'r2'" in ln and "class variable" in ln for ln in lines)
    assert any("'r2'" in ln and "maybe" in ln for ln in lines)
    missing = run(files, "--rules", str(files / "nope.yaml"))
    assert missing.exit_code == 2 and "cannot read" in missing.stderr
    bad_class = run(files, "--rules", str(files / "ok.yaml"), "--features", "A,Q")
    assert bad_class.exit_code == 2


def test_compilation_over_the_memory_limit_exits_2_naming_the_estimate(files):
    res = run(files, "--rules", str(files / "ok.yaml"), "--max-memory", "100")
    assert res.exit_code == 2
    assert "no route fits the memory limit 100 B" in res.stderr and "joint: ~" in res.stderr
    assert res.stdout == ""


ARGMAX_RULES = """states:
  C: [no, yes]
  A: [low, mid, high]
rules:
  - name: high_not_no
    if: {A: high}
    then: {not: "no"}
  - name: on_any
    if: {B: "on"}
    then: [no, yes]
  - name: on_is_yes
    if: {B: "on"}
    then: yes
monotonicity:
  - {name: a_up, feature: A, check: increasing}
"""


def test_argmax_rules_and_monotonicity_exit_1_with_counts(files):
    (files / "argmax.yaml").write_text(ARGMAX_RULES)
    res = run(files, "--rules", str(files / "argmax.yaml"), "--json", decision=ARGMAX)
    assert res.exit_code == 1, res.output
    info = json.loads(res.stdout)
    assert info["classifier"]["decision"] == "argmax"
    rules = {r["rule"]: r for r in info["rules"]}
    # argmax on two states: yes iff P(yes | x) > 0.5 (a tie goes to "no", index 0); the
    # hand-worked posteriors above give yes exactly for (mid, on), (high, off), (high, on).
    assert rules["high_not_no"]["verdict"] == "holds"
    assert rules["on_any"]["verdict"] == "holds"
    assert (rules["on_is_yes"]["verdict"], rules["on_is_yes"]["violating_inputs"]) == (
        "violated",
        1,
    )
    assert info["monotonicity"][0]["verdict"] == "holds"


def test_argmax_monotonicity_needs_the_class_order(files):
    (files / "m.yaml").write_text("monotonicity:\n  - {name: a, feature: A}\n")
    res = run(files, "--rules", str(files / "m.yaml"), decision=ARGMAX)
    assert res.exit_code == 2
    assert "declare the order of its states" in res.stderr


def test_no_monotonicity_queries_says_none_were_asked(files):
    """Issue 29: not "0 of 0 monotonicity queries hold"."""
    res = run(files, "--rules", str(files / "ok.yaml"))
    assert res.exit_code == 0, res.output
    assert "0 of 0" not in res.stderr
    assert "2 of 2 rules hold, no monotonicity queries asked" in res.stderr


def test_verification_counts_its_rules_and_queries_on_stderr(files, monkeypatch):
    """Issue 39, point 6: the verification phase shows its count and ETA off a terminal."""
    monkeypatch.setenv(INTERVAL_ENV, "0")
    res = run(files, "--rules", str(files / "ok.yaml"), "--fmo", str(files / "fmo.yaml"), "--json")
    assert res.exit_code == 0, res.output
    json.loads(res.stdout)
    lines = res.stderr.splitlines()
    assert any(line.startswith("verifying rules and queries: 1/5 (20%)") for line in lines), lines
    assert "verifying rules and queries: done in " in res.stderr
    assert "\r" not in res.stderr


def test_the_reading_is_said_and_far_rows_warned(files):
    res = run(files, "--rules", str(files / "ok.yaml"))
    assert res.exit_code == 0, res.output
    assert "reading: each CPT row divided by its sum (every row sums to exactly 1" in res.stdout
    assert "warning" not in res.stderr
    (files / "tiny.bif").write_text(BIF.replace("(yes) 0.2, 0.8;", "(yes) 0.2, 0.8005;"))
    res = run(files, "--rules", str(files / "ok.yaml"), "--json")
    reading = json.loads(res.stdout)["compile"]["reading"]
    assert (reading["rows_off"], reading["variable"]) == (1, "B")
    assert "warning:" in res.stderr and "off 1 by 0.0005" in res.stderr
