"""The BN gate: certify or block each live BN decision with the rules verified offline.

For a record x decided d by the compiled classifier:

* **blocked** -- some rule whose verification FAILED has x inside its premise and a
  conclusion other than d: x is itself a counterexample of that rule. This wins over
  certification (a rule certifying d for the same x means the two expert rules conflict
  there, and a person should look);
* **certified** -- otherwise, some rule verified to HOLD has x inside its premise (so its
  conclusion, which must be d, is proven for every input like x);
* **unverified** -- neither: no verified statement covers x.

Certified and blocked records carry the ids of the rules behind the outcome.

Rules come from the artifact member ``bn/rules.json``: a list of
``{"id", "premise": {feature: [allowed state indices]}, "conclusion": [allowed class
states], "verdict": "holds" | "violated"}``. Features absent from a premise are
unconstrained; a conclusion may also be a single class state. The class states are the
diagram's terminals: the two outputs of a threshold classifier, or every state of the class
for an argmax (multi-class) one, whose rules may allow any set of them.
:func:`encode_rules` (the builder) and :func:`decode_rules` (the agent) are the format's
one codec; the format only grows by optional keys, which older readers ignore.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from boxwatch.agent.errors import ArtifactError
from boxwatch.agent.members import RULES
from boxwatch.agent.vocab import GATE_OUTCOMES, RULE_VERDICTS

CERTIFIED, BLOCKED, UNVERIFIED = 0, 1, 2
OUTCOME_NAMES = GATE_OUTCOMES


@dataclass(frozen=True)
class RuleEntry:
    """One entry of ``bn/rules.json``: a rule by feature and class-state names."""

    rule_id: str
    premise: Mapping[str, Sequence[int]]
    conclusion: Sequence[str]
    verdict: str


def encode_rules(rules: Iterable[RuleEntry]) -> list[dict[str, Any]]:
    """The ``bn/rules.json`` member's JSON for ``rules`` (what the builder writes)."""
    out = []
    for r in rules:
        if r.verdict not in RULE_VERDICTS:
            raise ValueError(f"rule {r.rule_id!r}: verdict {r.verdict!r} not in {RULE_VERDICTS}")
        out.append(
            {
                "id": r.rule_id,
                "premise": {k: list(v) for k, v in r.premise.items()},
                "conclusion": list(r.conclusion),
                "verdict": r.verdict,
            }
        )
    return out


def decode_rules(spec: Any) -> list[RuleEntry]:
    """Parse the ``bn/rules.json`` member; :class:`ArtifactError` names the bad rule.

    Unknown keys are ignored (the format grows by optional keys only)."""
    if not isinstance(spec, list):
        raise ArtifactError(f"{RULES}: expected a list of rules")
    out = []
    for pos, r in enumerate(spec):
        try:
            conclusion = r["conclusion"]
            if isinstance(conclusion, str):
                conclusion = [conclusion]
            if r["verdict"] not in RULE_VERDICTS:
                raise ValueError(f"verdict {r['verdict']!r}")
            premise = {str(f): list(allowed) for f, allowed in r["premise"].items()}
            out.append(RuleEntry(str(r["id"]), premise, list(conclusion), r["verdict"]))
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise ArtifactError(f"{RULES}: rule #{pos} is invalid ({exc!r})") from None
    return out


@dataclass(frozen=True)
class GateRule:
    """A rule as the gate needs it: allowed-value masks per feature, conclusion, verdict."""

    rule_id: str
    masks: dict[int, np.ndarray]
    conclusion: np.ndarray
    holds: bool


@dataclass(frozen=True)
class GateResult:
    """Outcome per record and the rule ids behind each certified / blocked outcome."""

    outcomes: np.ndarray
    rule_ids: list[list[str]]


class RuleGate:
    """Applies verified rules to batches of BN decisions (vectorised over records)."""

    def __init__(self, rules: Sequence[GateRule]):
        self.rules = list(rules)

    @classmethod
    def from_json(
        cls,
        spec: list,
        *,
        features: Sequence[str],
        states: Sequence[Sequence[str]],
        terminals: Sequence[str],
    ) -> RuleGate:
        """Build from the ``bn/rules.json`` member, checking every name and index."""
        index = {f: i for i, f in enumerate(features)}
        rules = []
        for pos, r in enumerate(decode_rules(spec)):
            try:
                conclusion = np.zeros(len(terminals), dtype=bool)
                conclusion[[list(terminals).index(c) for c in r.conclusion]] = True
                masks = {}
                for feat, allowed in r.premise.items():
                    fi = index[feat]
                    mask = np.zeros(len(states[fi]), dtype=bool)
                    mask[np.asarray(allowed, dtype=np.int64)] = True
                    masks[fi] = mask
            except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
                raise ArtifactError(f"{RULES}: rule #{pos} is invalid ({exc!r})") from None
            rules.append(GateRule(r.rule_id, masks, conclusion, r.verdict == RULE_VERDICTS[0]))
        return cls(rules)

    def in_premise(self, rule: GateRule, x: np.ndarray) -> np.ndarray:
        """Boolean (n,) : which rows of ``x`` (state indices) satisfy the rule's premise."""
        inside = np.ones(len(x), dtype=bool)
        for fi, mask in rule.masks.items():
            inside &= mask[x[:, fi]]
        return inside

    def apply(self, x: np.ndarray, decisions: np.ndarray) -> GateResult:
        """Gate a batch.

        Parameters
        ----------
        x : ndarray of shape (n_records, n_features), state indices in feature order
        decisions : ndarray of shape (n_records,), terminal ids decided by the diagram
        """
        decisions = np.asarray(decisions, dtype=np.int64)
        n = len(x)
        certified = np.zeros(n, dtype=bool)
        blocked = np.zeros(n, dtype=bool)
        cert_ids: list[list[str]] = [[] for _ in range(n)]
        block_ids: list[list[str]] = [[] for _ in range(n)]
        for rule in self.rules:
            inside = self.in_premise(rule, x)
            concluded = rule.conclusion[decisions]
            if rule.holds:
                hit = inside & concluded
                certified |= hit
                target = cert_ids
            else:
                hit = inside & ~concluded
                blocked |= hit
                target = block_ids
            for i in np.flatnonzero(hit):
                target[i].append(rule.rule_id)
        outcomes = np.full(n, UNVERIFIED, dtype=np.int8)
        outcomes[certified] = CERTIFIED
        outcomes[blocked] = BLOCKED
        ids = [block_ids[i] if blocked[i] else cert_ids[i] for i in range(n)]
        return GateResult(outcomes, ids)
