"""``bn.repair`` in a build: proposals in the summary, the report and the summary table,
their files in the report folder, re-verified; never applied (the artifact is the same)."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner
from locations import ROOT

from boxwatch.agent.artifact import load_artifact
from boxwatch.agent.keys import generate_keypair, load_private_key
from boxwatch.cli import EXIT_OK, EXIT_USAGE, cli
from boxwatch.offline.bn.formats import load_network
from boxwatch.offline.bn.network import exact_value
from boxwatch.offline.release.config import load_config
from boxwatch.offline.release.pipeline import build, prepare

CREDIT = ROOT / "examples" / "credit"


def config(folder, **bn):
    """A BN-only build config on the example credit network and Table 3's rules."""
    path = folder / "build.yaml"
    section = {
        "file": str(CREDIT / "credit.net"),
        "class": "CreditWorthiness",
        "positive": "Positive",
        "threshold": 0.5,
        "rules": str(CREDIT / "rules.yaml"),
        "fmo": str(CREDIT / "fmo.yaml"),
        "counterexamples": 1,
        **bn,
    }
    path.write_text(yaml.safe_dump({"version": 1, "bn": section}))
    return path


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    folder = tmp_path_factory.mktemp("key")
    generate_keypair(folder / "k.key", folder / "k.pub")
    return folder / "k.key"


def test_repair_proposals_are_reported_and_never_applied(tmp_path, key):
    private = load_private_key(key)
    plain = build(prepare(load_config(config(tmp_path))), private, created_at=0)
    asked = build(prepare(load_config(config(tmp_path, repair=True))), private, created_at=0)
    # the artifact holds what the network as given makes: nothing applied (only the signed
    # config record differs, by the repair key)
    a, b = load_artifact(asked.artifact, None), load_artifact(plain.artifact, None)
    assert a.members == b.members and a.contents == b.contents
    (target,) = asked.summary.to_dict()["bn"]["repairs"]
    assert "repairs" not in plain.summary.to_dict()["bn"]
    assert target["target"] == "rule6" and target["verdict"] == "single parameter"
    (proposal,) = target["proposals"]
    assert proposal["reverified"] and proposal["verdicts"]["rule6"] == "holds"
    assert set(asked.files) == {proposal["file"]} and proposal["file"].startswith("repairs/")
    assert asked.summary.policy.failed == plain.summary.policy.failed == []


def test_the_build_writes_proposal_files_beside_the_report(tmp_path, key):
    path = config(tmp_path, repair=True, repair_proposals=2)
    report = tmp_path / "report"
    res = CliRunner().invoke(
        cli,
        [
            "build-artifact",
            str(path),
            "--key",
            str(key),
            "--out",
            str(tmp_path / "a.bwa"),
            "--report",
            str(report),
            "--created-at",
            "0",
        ],
    )
    assert res.exit_code == EXIT_OK, res.output
    assert "repair rule6" in res.stdout and "re-verified; repairs/credit.rule6.1.net" in res.stdout
    summary = json.loads((report / "summary.json").read_text())
    (target,) = summary["bn"]["repairs"]
    assert 1 <= len(target["proposals"]) <= 2
    for p in target["proposals"]:
        written = load_network(report / p["file"])
        (change,) = p["changes"]
        row = tuple(
            written.states[q].index(change["row"][q]) for q in written.parents["CreditWorthiness"]
        )
        assert [str(x) for x in written.texts[change["variable"]][row]] == change["row_new"]
        assert exact_value(change["new"]) == exact_value(change["row_new"][0])
    html = (report / "report.html").read_text()
    assert 'id="bn-repairs-table"' in html and "Repair proposals (not applied)" in html
    assert 'id="repair-0-0-reverified">yes<' in html


def test_repair_settings_are_checked_by_the_schema(tmp_path):
    path = config(tmp_path, repair="yes", repair_proposals=0)
    res = CliRunner().invoke(cli, ["build-artifact", str(path), "--dry-run"])
    assert res.exit_code == EXIT_USAGE
    assert "bn.repair" in res.stderr and "bn.repair_proposals" in res.stderr
