"""The build's records: summary.json round-trips through them, its committed schema is the
generated one, config sections refuse unknown keys and agree with the config schema, the
monitor's defaults are the estimator's, and the summary owns the policy's verdict."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import msgspec
import pytest
from example_build import build_example
from locations import ROOT

from boxwatch.offline.monitors.estimator import BoxMonitor
from boxwatch.offline.release.config import SCHEMA
from boxwatch.offline.release.records import (
    BNSection,
    BuildSpec,
    BuildSummary,
    DatasetSpec,
    MetadataSection,
    ModelSection,
    MonitorSection,
    PolicySection,
    summary_schema,
    summary_schema_text,
)
from boxwatch.offline.release.report import summary_json

SCHEMA_FILE = ROOT / "docs" / "summary.schema.json"
# The keys summary.json has had since issue 22 (histogram since issue 38), for a build with
# a model (validation and unknown sets, layers auto) and a BN: a record that drops or renames
# one fails here.
TOP_KEYS = {"artifact", "bn", "metadata", "model", "monitor", "policy", "timings"}
MONITOR_KEYS = {
    "baselines",
    "boxes",
    "calibration",
    "calibration_set",
    "contrast_layers",
    "coverage",
    "curves",
    "detection",
    "evaluation",
    "histogram",
    "layer_choice",
    "layers",
    "model_errors",
    "operating_points",
    "score",
    "tau",
    "tau_auroc",
    "tau_selection",
    "taus",
    "verdicts",
    "warnings",
}
BN_KEYS = {
    "certified",
    "class",
    "decided",
    "decision",
    "exact_inputs",
    "features",
    "file",
    "fmo",
    "inputs",
    "nodes",
    "nodes_quasi",
    "order",
    "positive",
    "positives",
    "rules",
    "seconds",
    "states",
    "terminals",
    "threshold",
    "tie_pairs",
    "ties",
}


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return build_example(tmp_path_factory.mktemp("records"))


def test_summary_json_holds_todays_keys(example):
    data = json.loads(example.summary.to_json())
    assert set(data) == TOP_KEYS
    assert set(data["monitor"]) == MONITOR_KEYS
    assert set(data["bn"]) == BN_KEYS
    assert set(data["monitor"]["calibration"]) == {
        "threshold",
        "confidence_floor",
        "target_acceptance",
        "known_acceptance",
        "unknown_acceptance",
        "n_known",
        "n_unknown",
        "known_split",
        "population",
        "error_score",
        "error_cut",
        "confidence_share",
        "share_choice",
    }
    # The bundled example's validation set holds labelled mistakes: the budget split is
    # chosen on them and the summary says how.
    choice = data["monitor"]["calibration"]["share_choice"]
    assert choice["method"] in ("auto", "default") and choice["reason"]


def test_summary_round_trips_through_json(example):
    summary = example.summary
    text = summary.to_json()
    assert json.loads(text) == summary.to_dict()
    assert text == json.dumps(summary.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"
    back = BuildSummary.from_json(text)
    assert back == summary
    assert back.to_json() == text
    assert BuildSummary.from_dict(summary.to_dict()) == summary
    assert summary_json(summary.to_dict()) == text


def test_bn_only_summary_round_trips(tmp_path):
    summary = build_example(tmp_path, without="model").summary
    text = summary.to_json()
    assert set(json.loads(text)) == TOP_KEYS - {"model", "monitor"}
    assert BuildSummary.from_json(text).to_json() == text


def test_summary_json_refuses_unknown_keys(example):
    data = example.summary.to_dict()
    data["monitor"]["calibration"]["extra"] = 1
    with pytest.raises(msgspec.ValidationError, match=r"unknown field `extra`"):
        BuildSummary.from_dict(data)


def test_committed_schema_is_the_generated_one():
    assert SCHEMA_FILE.read_text(encoding="utf-8") == summary_schema_text(), (
        "docs/summary.schema.json is out of date: run .venv/bin/python tools/summary_schema.py"
    )


def test_example_summary_is_valid_under_its_schema(example):
    validator = jsonschema.Draft202012Validator(summary_schema())
    data = json.loads(example.summary.to_json())
    assert list(validator.iter_errors(data)) == []
    data["monitor"]["operating_points"][0]["n"] = "many"
    del data["metadata"]["name"]
    assert len(list(validator.iter_errors(data))) == 2


def _properties(schema: dict) -> set[str]:
    return set(schema["properties"])


def _fields(record: type[msgspec.Struct]) -> set[str]:
    return {f.encode_name for f in msgspec.structs.fields(record)}


@pytest.mark.parametrize(
    ("record", "schema"),
    [
        (BuildSpec, SCHEMA),
        (MetadataSection, SCHEMA["properties"]["metadata"]),
        (ModelSection, SCHEMA["properties"]["model"]),
        (DatasetSpec, SCHEMA["properties"]["data"]["properties"]["train"]),
        (MonitorSection, SCHEMA["properties"]["monitor"]),
        (BNSection, SCHEMA["properties"]["bn"]),
        (PolicySection, SCHEMA["properties"]["policy"]),
    ],
)
def test_config_sections_have_the_schemas_keys_and_refuse_others(record, schema):
    assert _fields(record) == _properties(schema)
    with pytest.raises(msgspec.ValidationError, match="unknown field `surplus`"):
        msgspec.convert({"surplus": 1}, record)


def test_monitor_section_holds_what_was_given_and_the_estimator_the_defaults():
    assert MonitorSection.from_raw(None).estimator_params() == {}
    assert MonitorSection().estimator(None).get_params() == BoxMonitor().get_params()
    section = MonitorSection.from_raw({"target_acceptance": 0.9, "tau": [0.1, 1, 0.1]})
    assert section.confidence_share is msgspec.UNSET
    params = section.estimator(["a"]).get_params()
    assert params["target_acceptance"] == 0.9 and params["taus"] == [1.0, 0.1]
    assert params["confidence_share"] == BoxMonitor().confidence_share
    assert MonitorSection.from_raw({"tau": 0.2}).estimator(None).tau == 0.2
    assert MonitorSection.from_raw({"tau": "search"}).estimator(None).tau == "auto"
    only = MonitorSection.from_raw({"score": "distance", "combine": "any"})
    assert only.estimator_params(only=("score",)) == {"score": "distance"}


def test_policy_failures_are_the_summarys_verdict(example):
    summary = example.summary
    assert summary.policy_failures(PolicySection()) == []
    mon = summary.monitor
    worst = max(p.acceptance for p in mon.operating_points)
    recall = mon.evaluation.combined.recall
    policy = PolicySection(
        fail_on=["rule_violated", "bn_ties"],
        min_recall=1,
        max_unknown_acceptance=worst / 2,
    )
    failed = summary.policy_failures(policy)
    violated = [r.id for r in summary.bn.rules if r.verdict == "violated"]
    assert failed[0] == f"rule_violated: {', '.join(violated)}"
    assert failed[1] == f"min_recall: recall {recall} < 1"
    assert failed[2].startswith("max_unknown_acceptance: ") and failed[2].endswith(f"> {worst / 2}")
    assert len(failed) == 3  # no ties in the example's BN
    judged = summary.judged(policy)
    assert judged.policy.failed == failed and judged.policy.fail_on == policy.fail_on
    bn_only = msgspec.structs.replace(summary, monitor=msgspec.UNSET)
    assert bn_only.policy_failures(PolicySection(max_unknown_acceptance=0.5)) == [
        "max_unknown_acceptance: no unknown set to measure"
    ]


def test_written_to_sets_the_artifact_path_only(example):
    moved = example.summary.written_to(Path("out/model.bwa"))
    assert moved.artifact.path == "out/model.bwa"
    assert msgspec.structs.replace(moved.artifact, path=msgspec.UNSET) == example.summary.artifact
