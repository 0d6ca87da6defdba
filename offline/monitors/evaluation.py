"""Monitor evaluation: the six outcomes of the paper's Table 2, F1, and score detection metrics.

For the monitor of class ``y`` only inputs *predicted* as ``y`` count. Those labelled ``y``
are negatives (the network was right), all others -- another label or unknown (label -1) --
are positives (the monitor should object):

============  ==========  ==========  ===========
label         accept      reject      uncertainty
============  ==========  ==========  ===========
``y``         TN          FP          MN
not ``y``     FN          TP          MP
============  ==========  ==========  ===========

precision = TP / (TP + FP), recall = TP / (TP + FN + MP). Results are plain dataclasses and
dicts so a report can render them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy.stats import rankdata

from boxwatch.agent.boxes import ACCEPT, REJECT, UNCERTAIN

OUTCOMES = ("tn", "fp", "mn", "fn", "tp", "mp")
# The operating point: accept this share of the correctly classified known inputs (FPR@95
# for a score). BoxMonitor's ``target_acceptance`` defaults to it.
DEFAULT_TARGET_ACCEPTANCE = 0.95


@dataclass(frozen=True)
class Outcomes:
    """Counts of the six outcomes for one monitor (class, layer, tau)."""

    tn: int = 0
    fp: int = 0
    mn: int = 0
    fn: int = 0
    tp: int = 0
    mp: int = 0

    @property
    def precision(self) -> float:
        """TP / (TP + FP); 0 when the monitor raised nothing."""
        d = self.tp + self.fp
        return self.tp / d if d else 0.0

    @property
    def recall(self) -> float:
        """TP / (TP + FN + MP); 0 when there were no positives."""
        d = self.tp + self.fn + self.mp
        return self.tp / d if d else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def as_dict(self) -> dict[str, float]:
        """Counts and the three rates, JSON-able."""
        return {**asdict(self), "precision": self.precision, "recall": self.recall, "f1": self.f1}


def outcome_counts(
    verdicts: np.ndarray, y_true: np.ndarray, y_pred: np.ndarray, n_classes: int
) -> np.ndarray:
    """Outcome counts per predicted class, shape (n_classes, 6), columns in :data:`OUTCOMES`.

    Parameters
    ----------
    verdicts : ndarray of shape (n_samples,)
        Verdict codes (0 accept, 1 uncertainty, 2 reject).
    y_true : ndarray of shape (n_samples,)
        True labels; any value outside ``[0, n_classes)`` (e.g. -1) marks an unknown input.
    y_pred : ndarray of shape (n_samples,)
        The network's predicted classes.
    """
    verdicts, y_true, y_pred = (np.asarray(v) for v in (verdicts, y_true, y_pred))
    if not verdicts.shape == y_true.shape == y_pred.shape:
        raise ValueError(f"shapes differ: {verdicts.shape}, {y_true.shape}, {y_pred.shape}")
    positive = (y_true != y_pred).astype(np.int64)
    column = 3 * positive + np.select(
        [verdicts == ACCEPT, verdicts == REJECT, verdicts == UNCERTAIN], [0, 1, 2], default=-1
    )
    if np.any(column < 0):
        raise ValueError("verdicts must be 0 (accept), 1 (uncertainty) or 2 (reject)")
    flat = np.bincount(y_pred.astype(np.int64) * 6 + column, minlength=n_classes * 6)
    return flat[: n_classes * 6].reshape(n_classes, 6)


def outcomes_per_class(
    verdicts: np.ndarray, y_true: np.ndarray, y_pred: np.ndarray, n_classes: int
) -> list[Outcomes]:
    """:func:`outcome_counts` as one :class:`Outcomes` per class."""
    counts = outcome_counts(verdicts, y_true, y_pred, n_classes)
    return [Outcomes(*(int(v) for v in row)) for row in counts]


def total(outcomes: Sequence[Outcomes]) -> Outcomes:
    """Sum outcomes over classes (micro-averaged rates)."""
    return Outcomes(*(sum(getattr(o, name) for o in outcomes) for name in OUTCOMES))


def tau_curves(
    verdicts_by_tau: Mapping[float, np.ndarray],
    y_true: np.ndarray,
    y_pred: np.ndarray,
    n_classes: int,
) -> dict[float, list[Outcomes]]:
    """Per-tau, per-class outcomes for one layer (the paper's Fig. 7 curves), taus descending."""
    return {
        tau: outcomes_per_class(verdicts_by_tau[tau], y_true, y_pred, n_classes)
        for tau in sorted(verdicts_by_tau, reverse=True)
    }


@dataclass(frozen=True)
class Detection:
    """How well a score separates known (low) from unknown (high) inputs.

    ``fpr`` is the share of unknown inputs accepted at the ``threshold`` that accepts
    ``target_acceptance`` of the known ones (FPR@95 for 0.95).
    """

    auroc: float
    fpr: float
    threshold: float
    target_acceptance: float
    n_known: int
    n_unknown: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def auroc(scores_known: np.ndarray, scores_unknown: np.ndarray) -> float:
    """Area under the ROC curve for "unknown has the higher score" (ties count half)."""
    k = np.asarray(scores_known, np.float64).ravel()
    u = np.asarray(scores_unknown, np.float64).ravel()
    if len(k) == 0 or len(u) == 0:
        raise ValueError(f"need known and unknown scores; got {len(k)} and {len(u)}")
    ranks = rankdata(np.concatenate([k, u]))
    return float((ranks[len(k) :].sum() - len(u) * (len(u) + 1) / 2) / (len(k) * len(u)))


def aurc(scores: np.ndarray, errors: np.ndarray) -> float:
    """Area under the risk-coverage curve: the mean, over coverages k/n (k = 1 .. n), of the
    share of errors among the k most trusted inputs (lower is better).

    Inputs are taken from the lowest score up; inputs with equal scores share their errors
    evenly, so the result does not depend on their order.

    Parameters
    ----------
    scores : ndarray of shape (n_samples,)
        Higher = less trusted; NaN counts as the least trusted.
    errors : ndarray of shape (n_samples,)
        bool, True where the prediction was wrong.
    """
    s = np.asarray(scores, np.float64).ravel()
    e = np.asarray(errors).ravel()
    if e.dtype != np.bool_ or len(s) != len(e) or not len(s):
        raise ValueError(
            f"need as many scores as bool errors, at least one; got {len(s)} scores and "
            f"{len(e)} errors of dtype {e.dtype}"
        )
    s = np.where(np.isnan(s), np.inf, s)
    order = np.argsort(s, kind="stable")
    _, starts, sizes = np.unique(s[order], return_index=True, return_counts=True)
    group_errors = np.add.reduceat(e[order].astype(np.float64), starts)
    before = np.concatenate([[0.0], np.cumsum(group_errors)[:-1]])
    group = np.repeat(np.arange(len(sizes)), sizes)
    k = np.arange(1, len(s) + 1)
    cumulative = before[group] + (k - starts[group]) * (group_errors / sizes)[group]
    return float(np.mean(cumulative / k))


def acceptance_threshold(
    scores_known: np.ndarray, target_acceptance: float = DEFAULT_TARGET_ACCEPTANCE
) -> float:
    """Smallest observed threshold t with ``mean(scores_known <= t) >= target_acceptance``."""
    s = np.sort(np.asarray(scores_known, np.float64).ravel())
    if len(s) == 0 or not 0 < target_acceptance <= 1:
        raise ValueError(f"need scores and 0 < target_acceptance={target_acceptance} <= 1")
    return float(s[int(np.ceil(target_acceptance * len(s))) - 1])


def detection(
    scores_known: np.ndarray,
    scores_unknown: np.ndarray,
    *,
    target_acceptance: float = DEFAULT_TARGET_ACCEPTANCE,
) -> Detection:
    """AUROC and the unknown acceptance (FPR) at ``target_acceptance`` of known inputs."""
    t = acceptance_threshold(scores_known, target_acceptance)
    u = np.asarray(scores_unknown, np.float64).ravel()
    return Detection(
        auroc=auroc(scores_known, u),
        fpr=float(np.mean(u <= t)),
        threshold=t,
        target_acceptance=target_acceptance,
        n_known=int(np.size(scores_known)),
        n_unknown=len(u),
    )
