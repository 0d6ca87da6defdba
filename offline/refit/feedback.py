"""What comes back from the field: captured inputs and reviewers' labels, joined by id.

The agent copies every rejected or uncertain input to ``topics.capture`` (docs/records.md);
reviewers label some of them by the record id the agent emitted. A label names one of
:data:`LABEL_KINDS`; the join never guesses: ids it cannot match, or that disagree with
themselves, are reported and left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

CORRECT, WRONG, UNKNOWN, NEW = "correct", "wrong", "unknown", "new"
# A label's kind: the model's prediction was right; it was wrong (the true class is named);
# the input is none of the model's classes; it is a new kind of input (tagged by a name).
LABEL_KINDS = (CORRECT, WRONG, UNKNOWN, NEW)


@dataclass(frozen=True)
class Label:
    """One reviewer's label of one captured record."""

    id: str
    kind: str  # one of LABEL_KINDS
    true_class: str | None = None  # the class name, for WRONG only
    tag: str | None = None  # the new kind's name, for NEW only


@dataclass(frozen=True)
class Captures:
    """Captured inputs, decoded as the agent decoded them: one row per distinct record id."""

    ids: list[str]
    inputs: np.ndarray  # (n, *input shape) float32, raw: before the artifact's preprocessing
    timestamps_ms: np.ndarray  # (n,) int64: the capture record's timestamp
    verdicts: list[str]  # the boxwatch-verdict header: reject or uncertainty
    reasons: list[str]  # the boxwatch-reason header
    layers: list[str | None]  # boxwatch-layer, where the record had one
    nearest_classes: list[str | None]  # boxwatch-nearest-class, where the record had one
    problems: list[str] = field(default_factory=list)  # records left out, where and why


@dataclass(frozen=True)
class LabelledCaptures:
    """Captures joined with their labels by id (only rows with exactly one usable label)."""

    captures: Captures
    labels: list[Label]  # labels[i] is the label of captures.ids[i]
    y_true: np.ndarray  # (n,) int64 class index the label gives; -1 for UNKNOWN and NEW
    y_pred: np.ndarray  # (n,) int64 the parent model's predicted class of each input
    problems: list[str] = field(default_factory=list)  # missing, duplicate or conflicting ids
