"""Baseline detectors the box monitor is compared with: one table, :data:`BASELINES`.

Every score follows one convention: higher means more likely unknown or wrong, so an input
is accepted when its score is at most a threshold. Each entry says what it needs, by its
type: :class:`OnLogits` (the model's logits alone: scored directly), :class:`OnFeatures`
(one layer's features, fitted on the training inputs' features and labels) or
:class:`OnPenultimate` (the penultimate layer's features, fitted on the training inputs'
and the output layer's weights). Readers iterate the table and take the entries they can
compute: the release build's emitted figures (logits only), its report, and the benches;
a new baseline is one function or class and one row.

MSP and energy are the agent's own :func:`~boxwatch.agent.boxes.model_confidence` (negated)
and :func:`~boxwatch.agent.boxes.model_energy`, which the box score's confidence floor and
energy term use: not copies of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from boxwatch.agent.boxes import model_confidence, model_energy, normalize_features
from boxwatch.offline.monitors.evaluation import auroc

K_NEIGHBOURS = 50
REACT_PERCENTILE = 90.0
COVARIANCE_RIDGE = 1e-6  # added to the shared covariance's diagonal so it inverts
CHUNK = 2000  # query rows per similarity matrix of the KNN score

# What each kind of entry needs, as the report words it.
NEEDS: dict[str, str] = {
    "logits": "the model's logits alone",
    "features": "one layer's features and the training inputs' features and labels",
    "penultimate": "the penultimate layer's features, the training inputs' and the output "
    "layer's weights",
}


class Scorer(Protocol):
    """A fitted baseline."""

    def score(self, x: np.ndarray) -> np.ndarray:
        """Scores of ``x``'s rows, shape (n_samples,): higher = more likely unknown."""
        ...


class ClassScorer(Scorer, Protocol):
    """A fitted baseline whose reference is grouped by class."""

    def score_without(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The score of each row of ``x`` with its own class ``y[i]`` left out of the
        reference: what the row would score were its class unknown."""
        ...


def msp(logits: np.ndarray) -> np.ndarray:
    """Minus the maximum softmax probability: the agent's own
    :func:`~boxwatch.agent.boxes.model_confidence`, negated.

    Parameters
    ----------
    logits : ndarray of shape (n_samples, n_classes)
    """
    return -model_confidence(logits, "logits")


def _kth_similarity(reference: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Minus each query's k-th largest dot product with the reference rows, in chunks of
    :data:`CHUNK` queries. Assumes L2-normalised rows and ``k <= len(reference)``."""
    out = np.empty(len(queries))
    for s in range(0, len(queries), CHUNK):
        sim = queries[s : s + CHUNK] @ reference.T
        out[s : s + CHUNK] = -np.partition(sim, -k, axis=1)[:, -k]
    return out


class KNN:
    """Minus the cosine similarity to the k-th nearest training feature (Sun et al. 2022).

    Parameters
    ----------
    features : ndarray of shape (n_samples, n_features)
        The training inputs' features of one layer (L2-normalised here).
    labels : ndarray of shape (n_samples,)
        Their classes (for :meth:`score_without`).
    k : int, default=50
    """

    def __init__(self, features: np.ndarray, labels: np.ndarray, *, k: int = K_NEIGHBOURS):
        labels = np.asarray(labels)
        if len(features) != len(labels):
            raise ValueError(f"{len(features)} feature rows but {len(labels)} labels")
        if not 1 <= k <= len(features):
            raise ValueError(f"k={k} should be >= 1 and <= n_samples={len(features)}")
        self.k = k
        self.labels_ = labels
        self.features_ = normalize_features(features, "l2")

    def score(self, x: np.ndarray) -> np.ndarray:
        """Minus the cosine similarity of each row of ``x`` to its k-th nearest training
        feature, shape (n_samples,)."""
        return _kth_similarity(self.features_, normalize_features(x, "l2"), self.k)

    def score_without(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The score of each row of ``x`` against the training features of the other
        classes than ``y[i]``."""
        q = normalize_features(x, "l2")
        out = np.empty(len(q))
        for c in np.unique(y):
            rows = y == c
            out[rows] = _kth_similarity(self.features_[self.labels_ != c], q[rows], self.k)
        return out


class Mahalanobis:
    """The smallest class-conditional Mahalanobis distance, one covariance shared by the
    classes (Lee et al. 2018).

    Parameters
    ----------
    features : ndarray of shape (n_samples, n_features)
        The training inputs' features of one layer.
    labels : ndarray of shape (n_samples,)
        Their classes, ``0 .. n_classes - 1``, each with at least one row.
    """

    def __init__(self, features: np.ndarray, labels: np.ndarray) -> None:
        x = np.asarray(features, np.float64)
        y = np.asarray(labels)
        if len(x) != len(y):
            raise ValueError(f"{len(x)} feature rows but {len(y)} labels")
        if not len(y) or y.min() < 0:
            raise ValueError(f"need labels >= 0; got {len(y)} rows, smallest {y.min(initial=0)}")
        n_classes = int(y.max()) + 1
        missing = sorted(set(range(n_classes)) - set(y.tolist()))
        if missing:
            raise ValueError(f"classes {missing} of 0..{n_classes - 1} have no training row")
        self.means_ = np.stack([x[y == c].mean(0) for c in range(n_classes)])
        centred = x - self.means_[y]
        cov = centred.T @ centred / len(x) + COVARIANCE_RIDGE * np.eye(x.shape[1])
        self.precision_ = np.linalg.inv(cov)

    def per_class(self, x: np.ndarray) -> np.ndarray:
        """Squared Mahalanobis distance of each row to each class mean, shape
        (n_samples, n_classes)."""
        q = np.asarray(x, np.float64)
        a = np.einsum("ij,jk,ik->i", q, self.precision_, q)[:, None]
        b = q @ self.precision_ @ self.means_.T
        c = np.einsum("cj,jk,ck->c", self.means_, self.precision_, self.means_)[None, :]
        return np.asarray(a - 2 * b + c)

    def score(self, x: np.ndarray) -> np.ndarray:
        """The distance of each row to the nearest class mean, shape (n_samples,)."""
        return np.asarray(self.per_class(x).min(1))

    def score_without(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The distance of each row to the nearest mean of the other classes than ``y[i]``
        (the shared covariance kept)."""
        d = self.per_class(x)
        d[np.arange(len(d)), y] = np.inf
        return np.asarray(d.min(1))


class ReAct:
    """Energy of the logits recomputed from penultimate features clipped at a percentile of
    the training inputs' (Sun et al. 2021).

    Parameters
    ----------
    features : ndarray of shape (n_samples, n_features)
        The training inputs' penultimate features (their percentile is the clip).
    weight : ndarray of shape (n_features, n_classes)
        The output layer's weights (``logits = features @ weight + bias``).
    bias : ndarray of shape (n_classes,)
    percentile : float, default=90
    """

    def __init__(
        self,
        features: np.ndarray,
        weight: np.ndarray,
        bias: np.ndarray,
        *,
        percentile: float = REACT_PERCENTILE,
    ) -> None:
        w, b = np.asarray(weight, np.float64), np.asarray(bias, np.float64)
        if w.ndim != 2 or w.shape[0] != np.shape(features)[1] or b.shape != (w.shape[1],):
            raise ValueError(
                f"weight of shape {w.shape} and bias of shape {b.shape} do not map "
                f"{np.shape(features)[1]} features to logits"
            )
        self.clip_ = float(np.percentile(features, percentile))
        self.weight_, self.bias_ = w, b

    def score(self, x: np.ndarray) -> np.ndarray:
        """The energy of each row's clipped logits, shape (n_samples,)."""
        return model_energy(np.minimum(x, self.clip_) @ self.weight_ + self.bias_)


@dataclass(frozen=True)
class _Entry:
    """What every row of the table says: its label in tables, one line for the report."""

    label: str
    description: str


@dataclass(frozen=True)
class OnLogits(_Entry):
    """A baseline computed from the model's logits alone: ``score(logits)``."""

    score: Callable[[np.ndarray], np.ndarray]
    needs: ClassVar[str] = "logits"


@dataclass(frozen=True)
class OnFeatures(_Entry):
    """A baseline on one layer's features: ``fit(training features, labels)``."""

    fit: Callable[[np.ndarray, np.ndarray], ClassScorer]
    needs: ClassVar[str] = "features"


@dataclass(frozen=True)
class OnPenultimate(_Entry):
    """A baseline on the penultimate layer: ``fit(training features, weight, bias)``."""

    fit: Callable[[np.ndarray, np.ndarray, np.ndarray], Scorer]
    needs: ClassVar[str] = "penultimate"


Baseline = OnLogits | OnFeatures | OnPenultimate

# name (the summary's ``method``) -> baseline, in the order tables show them.
BASELINES: dict[str, Baseline] = {
    "msp": OnLogits("MSP", "minus the maximum softmax probability", msp),
    "energy": OnLogits("energy", "minus log-sum-exp of the logits", model_energy),
    "react": OnPenultimate(
        "ReAct",
        f"energy of the logits recomputed from the penultimate features clipped at their "
        f"{REACT_PERCENTILE:g}th training percentile",
        ReAct,
    ),
    "knn": OnFeatures(
        f"KNN k={K_NEIGHBOURS}",
        f"minus the cosine similarity to the {K_NEIGHBOURS}th nearest L2-normalised "
        "training feature",
        KNN,
    ),
    "mahalanobis": OnFeatures(
        "Mahalanobis",
        "the smallest Mahalanobis distance to a class mean, one covariance shared by the classes",
        Mahalanobis,
    ),
}


def held_out_class_auroc(scorer: ClassScorer, x: np.ndarray, y: np.ndarray) -> float:
    """How well the fitted baseline tells known inputs from unknown ones without unknown
    inputs: AUROC of each row's score against its score with its own class left out (how
    bench/detection.py chooses a feature baseline's layer, as the box monitor's held-out-class
    tau selection chooses tau)."""
    return auroc(scorer.score(x), scorer.score_without(x, y))


def fit_on_best_layer(
    baseline: OnFeatures,
    train: Mapping[str, np.ndarray],
    y_train: np.ndarray,
    validation: Mapping[str, np.ndarray],
    y_validation: np.ndarray,
) -> tuple[str, ClassScorer]:
    """``baseline`` fitted on each layer's training features, and the layer where it best
    tells the validation inputs' own class from the others (:func:`held_out_class_auroc`;
    the first such layer on ties): known inputs only, no unknown input is needed.

    Parameters
    ----------
    train, validation : mapping of layer name to ndarray of shape (n_samples, n_features)
        The same layers' features; ``validation`` may hold a sample of the validation rows.
    y_train, y_validation : ndarray of shape (n_samples,)
        Their classes.
    """
    if not train or set(train) != set(validation):
        raise ValueError(
            f"need the same layers' features for train and validation; got {sorted(train)} "
            f"and {sorted(validation)}"
        )
    fitted = {layer: baseline.fit(x, y_train) for layer, x in train.items()}
    best = max(
        fitted,
        key=lambda layer: held_out_class_auroc(fitted[layer], validation[layer], y_validation),
    )
    return best, fitted[best]
