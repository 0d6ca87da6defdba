"""One owner per cross-half format: artifact member names (``agent/members.py``) and the
``bn/rules.json`` codec (``agent/gate.py``), used by both the builder and the agent."""

from __future__ import annotations

import ast

import numpy as np
import pytest
from locations import ROOT

from boxwatch.agent import members
from boxwatch.agent.errors import ArtifactError
from boxwatch.agent.gate import RuleEntry, RuleGate, decode_rules, encode_rules

NAMES = {v for k, v in vars(members).items() if k.isupper() and isinstance(v, str) and "/" in v}
# A member's file name alone, as in f"{DIAGRAM_PREFIX}rules.json", spells it too.
FILE_NAMES = tuple(sorted({name.rsplit("/", 1)[-1] for name in NAMES if "." in name}))


def _spelled(value: object) -> bool:
    return isinstance(value, str) and (value in NAMES or value.endswith(FILE_NAMES))


def test_member_names_are_spelled_only_by_their_owner():
    assert {"model/spec.json", "bn/rules.json", "bn/verification.json", "monitors/boxes"} <= NAMES
    assert "bn/" in NAMES
    found = []
    for folder in ("agent", "offline", "boxwatch", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "agent" / "members.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and _spelled(node.value):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert found == []


def test_the_scan_finds_a_file_name_in_an_f_string():
    tree = ast.parse('members[f"{DIAGRAM_PREFIX}verification.json"] = report')
    assert any(isinstance(n, ast.Constant) and _spelled(n.value) for n in ast.walk(tree))


RULES = [
    RuleEntry("r1", {"A": [0, 1]}, ["yes"], "holds"),
    RuleEntry("r2", {"A": [2], "B": [0]}, ["no"], "violated"),
]


def test_rules_codec_round_trips_and_feeds_the_gate():
    encoded = encode_rules(RULES)
    assert encoded[0] == {
        "id": "r1",
        "premise": {"A": [0, 1]},
        "conclusion": ["yes"],
        "verdict": "holds",
    }
    assert decode_rules(encoded) == RULES
    gate = RuleGate.from_json(
        encoded, features=["A", "B"], states=[["a", "b", "c"], ["x", "y"]], terminals=["no", "yes"]
    )
    x = np.array([[0, 0], [2, 0], [2, 1]])
    result = gate.apply(x, np.array([1, 1, 1]))
    assert [gate_ids for gate_ids in result.rule_ids] == [["r1"], ["r2"], []]


def test_rules_format_is_additive_only():
    """Readers ignore optional keys they do not know (CONTRACTS item 3)."""
    encoded = encode_rules(RULES)
    encoded[0]["added_later"] = {"anything": 1}
    assert decode_rules(encoded) == RULES
    assert decode_rules([{**encoded[1], "conclusion": "no"}])[0].conclusion == ["no"]


@pytest.mark.parametrize(
    "spec, needle",
    [
        ({"id": "r"}, "expected a list"),
        ([{"id": "r", "premise": {}, "conclusion": ["yes"]}], "rule #0"),
        ([{"id": "r", "premise": {}, "conclusion": ["yes"], "verdict": "maybe"}], "verdict"),
        ([{"id": "r", "premise": [], "conclusion": ["yes"], "verdict": "holds"}], "rule #0"),
    ],
)
def test_bad_rules_name_the_rule(spec, needle):
    with pytest.raises(ArtifactError, match=needle):
        decode_rules(spec)
    with pytest.raises(ValueError, match="verdict"):
        encode_rules([RuleEntry("r", {}, ["yes"], "maybe")])
