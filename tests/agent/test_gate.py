"""The BN gate against a brute-force reading of its documented semantics."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from boxwatch.agent.errors import ArtifactError
from boxwatch.agent.gate import BLOCKED, CERTIFIED, UNVERIFIED, RuleGate

FEATURES = ("A", "B", "C")
STATES = (("a0", "a1", "a2"), ("b0", "b1"), ("c0", "c1", "c2", "c3"))
TERMINALS = ("no", "yes")
RULES = [
    {"id": "r_hold", "premise": {"A": [2], "B": [1]}, "conclusion": "yes", "verdict": "holds"},
    {"id": "r_fail", "premise": {"C": [0, 1]}, "conclusion": "yes", "verdict": "violated"},
    {"id": "r_fail2", "premise": {"A": [0], "C": [0]}, "conclusion": "no", "verdict": "violated"},
    {"id": "r_b0", "premise": {"B": [0]}, "conclusion": "no", "verdict": "violated"},
]


def naive(x, d):
    """The documented semantics, one record at a time."""
    blocked, certified = [], []
    for r in RULES:
        inside = all(x[FEATURES.index(f)] in allowed for f, allowed in r["premise"].items())
        concl = TERMINALS.index(r["conclusion"])
        if inside and r["verdict"] == "holds" and d == concl:
            certified.append(r["id"])
        if inside and r["verdict"] == "violated" and d != concl:
            blocked.append(r["id"])
    if blocked:
        return BLOCKED, blocked
    if certified:
        return CERTIFIED, certified
    return UNVERIFIED, []


def test_gate_matches_semantics_on_every_input():
    gate = RuleGate.from_json(RULES, features=FEATURES, states=STATES, terminals=TERMINALS)
    grid = np.array(list(itertools.product(*(range(len(s)) for s in STATES))))
    rng = np.random.default_rng(0)
    decisions = rng.integers(0, 2, len(grid))
    result = gate.apply(grid, decisions)
    seen = set()
    for i, (x, d) in enumerate(zip(grid, decisions, strict=True)):
        outcome, ids = naive(tuple(x), int(d))
        assert result.outcomes[i] == outcome and result.rule_ids[i] == ids, (x, d)
        seen.add(outcome)
    assert seen == {BLOCKED, CERTIFIED, UNVERIFIED}


@pytest.mark.parametrize(
    "bad",
    [
        [{"id": "x", "premise": {"Z": [0]}, "conclusion": "yes", "verdict": "holds"}],
        [{"id": "x", "premise": {"A": [7]}, "conclusion": "yes", "verdict": "holds"}],
        [{"id": "x", "premise": {"A": [0]}, "conclusion": "maybe", "verdict": "holds"}],
        [{"id": "x", "premise": {"A": [0]}, "conclusion": "yes", "verdict": "unknown"}],
        [{"premise": {}, "conclusion": "yes", "verdict": "holds"}],
        {"not": "a list"},
    ],
)
def test_bad_rules_member_refused(bad):
    with pytest.raises(ArtifactError, match="bn/rules.json"):
        RuleGate.from_json(bad, features=FEATURES, states=STATES, terminals=TERMINALS)
