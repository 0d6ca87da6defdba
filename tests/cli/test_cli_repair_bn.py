"""``boxwatch repair-bn`` in-process: the table, JSON, written files, exit codes 0 / 1 / 2."""

from __future__ import annotations

import json

import pytest
from bn_synthetic import naive_bayes
from click.testing import CliRunner
from locations import ROOT

from boxwatch.cli import cli
from boxwatch.offline.bn.formats import load_network, write_bif
from boxwatch.offline.progress import INTERVAL_ENV, LINE

CREDIT = ROOT / "examples" / "credit" / "credit.net"
CREDIT_RULES = ROOT / "examples" / "credit" / "rules.yaml"
CREDIT_ARGS = ["--class", "CreditWorthiness", "--positive", "Positive", "--threshold", "0.5"]
# naive Bayes whose four rules ask A's levels to order both ways (an XOR): each rule alone
# is repairable, all four together by no parameters at all
NB = """network nb { }
variable C { type discrete [ 2 ] { no, yes }; }
variable A { type discrete [ 3 ] { low, mid, high }; }
variable B { type discrete [ 2 ] { off, on }; }
probability ( C ) { table 0.6, 0.4; }
probability ( A | C ) { (no) 0.5, 0.3, 0.2; (yes) 0.2, 0.3, 0.5; }
probability ( B | C ) { (no) 0.7, 0.3; (yes) 0.3, 0.7; }
"""
XOR = """rules:
  - {name: low_on_yes, if: {A: low, B: "on"}, then: "yes"}
  - {name: high_on_no, if: {A: high, B: "on"}, then: "no"}
  - {name: low_off_no, if: {A: low, B: "off"}, then: "no"}
  - {name: high_off_yes, if: {A: high, B: "off"}, then: "yes"}
"""
NB_ARGS = ["--class", "C", "--positive", "yes", "--threshold", "0.5"]


def run(*args: str):
    return CliRunner().invoke(cli, ["repair-bn", *args])


@pytest.fixture
def nb(tmp_path):
    (tmp_path / "nb.bif").write_text(NB)
    (tmp_path / "xor.yaml").write_text(XOR)
    return tmp_path


def test_repairs_table_3_on_the_example_credit_network(tmp_path):
    out = tmp_path / "repairs"
    res = run(str(CREDIT), *CREDIT_ARGS, "--rules", str(CREDIT_RULES), "--out", str(out))
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split()[:3] == ["target", "parameter", "old"]
    assert lines[1].startswith("rule6 ") and "yes" in lines[1] and "credit.rule6.1.net" in lines[1]
    assert "1 of 11 rules violated; 1 of them repaired" in res.stderr
    written = sorted(out.iterdir())
    assert written and all(p.suffix == ".net" for p in written)
    assert load_network(written[0]).variables == load_network(CREDIT).variables


def test_json_has_each_target_its_proposals_and_the_measure(tmp_path):
    fmo = ROOT / "examples" / "credit" / "fmo.yaml"
    res = run(
        str(CREDIT),
        *CREDIT_ARGS,
        "--rules",
        str(CREDIT_RULES),
        "--fmo",
        str(fmo),
        "--out",
        str(tmp_path),
        "--json",
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["measure"].startswith("largest absolute change of one CPT entry")
    (target,) = doc["targets"]
    assert target["target"] == "rule6" and target["single_parameter_repair"]
    best = target["proposals"][0]
    assert best["reverified"] and best["verdicts"]["rule6"] == "holds"
    # the monotonicity queries are re-verified on the proposal too
    assert best["verdicts"]["assets_fmo (fmo)"] == "holds"
    (change,) = best["changes"]
    assert change["variable"] == "CreditWorthiness" and float(best["change"]) > 0


def test_rules_repairable_one_at_a_time_only_exit_0_and_say_so(nb):
    res = run(str(nb / "nb.bif"), *NB_ARGS, "--rules", str(nb / "xor.yaml"), "--out", str(nb / "o"))
    assert res.exit_code == 0, res.output
    assert "all rules     (no single parameter (proved), no pair found)" in res.stdout
    assert "for each of the 12 parameters the set of values that repairs it is empty" in res.stdout
    assert "3 of 4 rules violated; 3 of them repaired" in res.stderr


def test_a_violated_rule_without_repair_exits_1(nb):
    # high/off is "no" (0.417): high_yes asks it "yes", off_no (which holds) "no"
    (nb / "clash.yaml").write_text(
        'rules:\n  - {name: off_no, if: {B: "off"}, then: "no"}\n'
        "  - {name: high_yes, if: {A: high}, then: 'yes'}\n"
    )
    res = run(
        str(nb / "nb.bif"), *NB_ARGS, "--rules", str(nb / "clash.yaml"), "--out", str(nb / "o")
    )
    assert res.exit_code == 1, res.output
    assert "high_yes  (no single parameter (proved), no pair found)" in res.stdout
    assert "1 of 2 rules violated; 0 of them repaired" in res.stderr


def test_nothing_violated_exits_0(nb):
    (nb / "ok.yaml").write_text('rules:\n  - {name: r, if: {A: high, B: "on"}, then: "yes"}\n')
    res = run(str(nb / "nb.bif"), *NB_ARGS, "--rules", str(nb / "ok.yaml"), "--out", str(nb / "o"))
    assert res.exit_code == 0, res.output
    assert "all 1 rules hold: nothing to repair" in res.stderr
    assert not (nb / "o").exists()


@pytest.mark.parametrize(
    ("rules", "args", "message"),
    [
        (
            "rules:\n  - {name: r, if: {Nope: 1}, then: 'yes'}\n",
            NB_ARGS,
            "'Nope'",
        ),
        ("rules:\n  - {name: r, if: {A: high}, then: maybe}\n", NB_ARGS, "maybe"),
        ("rules: [\n", NB_ARGS, "xor.yaml"),
        (XOR, ["--class", "Z", "--positive", "yes", "--threshold", "0.5"], "'Z'"),
        (XOR, ["--class", "C", "--positive", "yes", "--threshold", "1.5"], "threshold"),
    ],
)
def test_bad_input_exits_2_with_one_line(nb, rules, args, message):
    (nb / "xor.yaml").write_text(rules)
    res = run(str(nb / "nb.bif"), *args, "--rules", str(nb / "xor.yaml"), "--out", str(nb / "o"))
    assert res.exit_code == 2, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], res.stderr
    assert res.stdout == ""


def test_too_many_key_inputs_exit_2_naming_features(tmp_path):
    net = naive_bayes(3, seed=0, card=41)  # every feature under the class: 41**3 key inputs
    (tmp_path / "nb.bif").write_text(write_bif(net))
    (tmp_path / "r.yaml").write_text("rules:\n  - {name: r, if: {x0: v0}, then: pos}\n")
    res = run(
        str(tmp_path / "nb.bif"),
        *["--class", "C", "--positive", "pos", "--threshold", "0.5"],
        *["--rules", str(tmp_path / "r.yaml"), "--out", str(tmp_path / "o")],
    )
    assert res.exit_code == 2, res.output
    (line,) = res.stderr.splitlines()
    assert "68,921 joint states" in line and "--features" in line


def test_a_missing_network_or_bad_option_exits_2(nb):
    res = run(str(nb / "absent.bif"), *NB_ARGS, "--rules", str(nb / "xor.yaml"))
    assert res.exit_code == 2 and "absent.bif" in res.stderr
    res = run(str(nb / "nb.bif"), *NB_ARGS, "--rules", str(nb / "xor.yaml"), "--proposals", "0")
    assert res.exit_code == 2 and "--proposals" in res.output


def test_help_states_the_measure_and_the_exit_codes():
    res = run("--help")
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert "largest absolute change of one CPT entry" in text and "co-varied proportionally" in text
    assert "Exit status: 0" in text and "BIF (.bif, .bif.gz)" in text
    assert "repair-bn" in CliRunner().invoke(cli, ["--help"]).output


def test_a_network_whose_rows_do_not_sum_to_1_is_repaired_as_the_compiler_reads_it(tmp_path):
    """Issue 42: the analysis decides on each CPT row divided by its sum (network.READING), as
    the compiler does. Here A=a1 ties at 0.5 with the numbers as written (positive) but not
    with the row divided by its sum (0.6 / 1.0004 < 0.6): the rule that A=a1 is positive is
    violated as the compiler reads it, and repaired, re-verified, with the same reading."""
    off = """network off { }
variable C { type discrete [ 2 ] { no, yes }; }
variable A { type discrete [ 2 ] { a0, a1 }; }
probability ( C ) { table 0.5, 0.5; }
probability ( A | C ) { (no) 0.4, 0.6; (yes) 0.4004, 0.6; }
"""
    (tmp_path / "off.bif").write_text(off)
    (tmp_path / "r.yaml").write_text('rules:\n  - {name: a1_yes, if: {A: a1}, then: "yes"}\n')
    out = tmp_path / "repairs"
    res = run(
        str(tmp_path / "off.bif"), *NB_ARGS, "--rules", str(tmp_path / "r.yaml"), "--out", str(out)
    )
    assert res.exit_code == 0, res.output
    assert "1 of 1 rules violated; 1 of them repaired" in res.stderr
    assert "NOT" not in res.stdout
    # repair-bn warns about the reading as compile-bn and verify-bn do (row sums off by 4e-4).
    assert "warning: " in res.stderr and "sum" in res.stderr


def test_progress_names_each_phase_on_stderr_and_quiet_shows_none(tmp_path):
    """repair-bn shows its phases through the builder's one progress facility (issue 39
    point 6): off a terminal as plain lines, none on stdout; --quiet shows none."""
    out = tmp_path / "repairs"
    args = [str(CREDIT), *CREDIT_ARGS, "--rules", str(CREDIT_RULES), "--out", str(out)]
    res = CliRunner().invoke(cli, ["repair-bn", *args], env={INTERVAL_ENV: "0"})
    assert res.exit_code == 0, res.output
    for phase in ("reading the network", "compiling", "verifying rules and queries"):
        assert f"{phase}: done in " in res.stderr, res.stderr
    assert "analysing parameters: " in res.stderr
    assert "\r" not in res.stderr
    assert not any(LINE.match(line) for line in res.stdout.splitlines())
    quiet = CliRunner().invoke(cli, ["repair-bn", *args, "--quiet"], env={INTERVAL_ENV: "0"})
    assert quiet.exit_code == 0 and not any(LINE.match(x) for x in quiet.stderr.splitlines())
