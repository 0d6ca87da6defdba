"""Closed vocabularies have one owner (``boxwatch.agent.vocab``): metrics, config validation,
the build schema and the estimators use its objects, and nobody else spells them out."""

from __future__ import annotations

import ast
import re

import pytest
from consumed import Record
from locations import ROOT
from prometheus_client import CollectorRegistry

from boxwatch.agent import boxes, config, gate, metrics, preprocessing, taps, vocab
from boxwatch.agent.errors import ConfigError
from boxwatch.agent.kafka import clients
from boxwatch.agent.outputs import dead_letter_output
from boxwatch.agent.records import BadRecord
from boxwatch.offline.monitors import estimator
from boxwatch.offline.monitors.estimator import BoxMonitor
from boxwatch.offline.release.config import SCHEMA

OWNED = {
    name: value
    for name, value in vars(vocab).items()
    if name.isupper() and isinstance(value, tuple) and len(value) > 1
}


def test_owned_vocabularies_are_tuples_of_distinct_names():
    assert {"VERDICTS", "GATE_OUTCOMES", "DEAD_LETTER_REASONS", "SELECTIONS"} <= set(OWNED)
    for name, value in OWNED.items():
        assert len(set(value)) == len(value) and all(isinstance(v, str) for v in value), name


def test_users_hold_the_owners_objects():
    assert metrics.VERDICTS is vocab.VERDICTS and boxes.VERDICT_NAMES is vocab.VERDICTS
    assert metrics.AGENT_OUTPUTS is vocab.AGENT_OUTPUTS
    assert metrics.GATE_OUTCOMES is vocab.GATE_OUTCOMES is gate.OUTCOME_NAMES
    assert metrics.INVALID_REASONS is vocab.DEAD_LETTER_REASONS
    assert tuple(clients.LIBRARIES) == vocab.KAFKA_LIBRARIES and boxes.KERNELS is vocab.BOX_KERNELS
    assert boxes.COMBINE_RULES is vocab.COMBINE_RULES and boxes.SCORES is vocab.SCORES
    assert boxes.NORMALIZATIONS is vocab.NORMALIZATIONS and taps.POOLINGS is vocab.POOLINGS
    assert estimator.SELECTIONS is vocab.SELECTIONS
    assert boxes.SCORE_MEANS is vocab.SCORE_MEANS
    assert boxes.UNCERTAINTY_RULES is vocab.UNCERTAINTY_RULES
    assert boxes.MODEL_OUTPUTS is vocab.MODEL_OUTPUTS
    assert boxes.REASON_NAMES is vocab.VERDICT_REASONS
    assert preprocessing.DTYPES is vocab.INPUT_DTYPES


def test_build_schema_enums_are_the_owners():
    props = SCHEMA["properties"]
    mon = props["monitor"]["properties"]
    model = props["model"]["properties"]
    assert mon["selection"]["enum"] == list(vocab.SELECTIONS)  # no undocumented "fixed"
    assert mon["combine"]["enum"] == list(vocab.COMBINE_RULES)
    assert mon["normalize"]["enum"] == list(vocab.NORMALIZATIONS)
    assert mon["score"]["enum"] == list(vocab.SCORES)
    assert mon["score_mean"]["enum"] == list(vocab.SCORE_MEANS)
    one, per_layer = model["pooling"]["oneOf"]
    assert one["enum"] == per_layer["additionalProperties"]["enum"] == list(vocab.POOLINGS)
    assert model["preprocessing"]["properties"]["dtype"]["enum"] == list(vocab.INPUT_DTYPES)


def _label_values(registry: CollectorRegistry, label: str, metric: str | None = None) -> set[str]:
    """The values ``label`` takes in ``metric``'s samples (in every metric's when None)."""
    return {
        s.labels[label]
        for m in registry.collect()
        if metric is None or m.name == metric
        for s in m.samples
        if label in s.labels
    }


def test_metric_label_values_are_the_owners():
    registry = CollectorRegistry()
    m = metrics.AgentMetrics(registry)
    m.prime_classes(["0", "1"], ["fc1"], ["yes"])
    prefix = "boxwatch_agent_"
    assert _label_values(registry, "reason", prefix + "invalid_records") == set(
        vocab.DEAD_LETTER_REASONS
    )
    for counter in ("outputs", "outputs_payload_omitted", "outputs_dropped"):
        assert _label_values(registry, "kind", prefix + counter) == set(vocab.AGENT_OUTPUTS)
    assert _label_values(registry, "verdict") == set(vocab.VERDICTS)
    assert _label_values(registry, "outcome") == set(vocab.GATE_OUTCOMES)
    pairs = {
        (s.labels["verdict"], s.labels["reason"])
        for m in registry.collect()
        if m.name == prefix + "verdict_reasons"
        for s in m.samples
    }
    assert pairs == {(v, r) for r, verdicts in vocab.REASON_VERDICTS.items() for v in verdicts}


def test_every_verdict_has_reasons_and_every_reason_its_verdicts():
    assert vocab.VERDICT_REASONS == tuple(vocab.REASON_VERDICTS)
    for reason, verdicts in vocab.REASON_VERDICTS.items():
        assert verdicts and set(verdicts) <= set(vocab.VERDICTS), reason
    assert {v for vs in vocab.REASON_VERDICTS.values() for v in vs} == set(vocab.VERDICTS)


def test_the_records_doc_lists_every_reason_with_its_verdicts():
    doc = (ROOT / "docs" / "records.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| ([a-z, ]+) \|", doc, flags=re.M)
    listed = {reason: {v.strip() for v in verdicts.split(",")} for reason, verdicts in rows}
    assert listed == {reason: set(v) for reason, v in vocab.REASON_VERDICTS.items()}


def test_agent_config_validators_accept_exactly_the_owners():
    for name in vocab.KAFKA_LIBRARIES:
        assert config._library(name) is None
    assert config._library("librdkafka") is not None
    for name in ("auto", *vocab.BOX_KERNELS):
        assert config._box_kernel(name) is None
    assert config._box_kernel("cuda") is not None
    assert config._policy(dict(zip(vocab.GATE_OUTCOMES, vocab.GATE_ACTIONS, strict=True))) is None
    assert config._policy({"maybe": "release"}) and config._policy({"blocked": "drop"})


def test_estimator_and_taps_validate_with_the_owners():
    for name in vocab.POOLINGS:
        taps._check_pooling(name, ["a"])
    with pytest.raises(ConfigError):
        taps._check_pooling("sum", ["a"])
    for param, values in (
        ("selection", vocab.SELECTIONS),
        ("combine", vocab.COMBINE_RULES),
        ("normalize", vocab.NORMALIZATIONS),
        ("score", vocab.SCORES),
    ):
        for value in values:
            assert BoxMonitor(["a"], **{param: value})._check_params(["a"]) == [], value
        assert BoxMonitor(["a"], **{param: "fixed"})._check_params(["a"]), param


def test_dead_letter_reasons_are_checked():
    rec = Record("in", 0, 0, b"x")
    for reason in vocab.DEAD_LETTER_REASONS:
        dead_letter_output("dlq", rec, reason, "why", store_payload=True)
        assert BadRecord(reason, "why").reason == reason
    with pytest.raises(ValueError, match="unknown dead-letter reason"):
        dead_letter_output("dlq", rec, "weird", "why", store_payload=True)
    with pytest.raises(ValueError, match="unknown dead-letter reason"):
        BadRecord("weird", "why")


def _string_collections(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set) and len(node.elts) > 1:
            if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
                yield node, frozenset(e.value for e in node.elts)


def test_no_literal_copy_of_an_owned_vocabulary():
    owned = {frozenset(v): name for name, v in OWNED.items()}
    owned[frozenset(("auto", *vocab.BOX_KERNELS))] = "BOX_KERNELS with auto"
    copies = []
    for folder in ("agent", "offline", "boxwatch", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "agent" / "vocab.py":
                continue
            for node, values in _string_collections(ast.parse(path.read_text())):
                if values in owned:
                    copies.append(f"{path.relative_to(ROOT)}:{node.lineno} {owned[values]}")
    assert copies == []


def test_the_scan_finds_a_copy():
    tree = ast.parse("KINDS = ['reject', 'accept', 'uncertainty']\nX = ('a', 'b')\n")
    found = [values for _, values in _string_collections(tree)]
    assert frozenset(vocab.VERDICTS) in found
