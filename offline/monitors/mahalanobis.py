"""Fitting the fused score's relative Mahalanobis terms (:mod:`boxwatch.agent.mahalanobis`).

The covariances are those of the Mahalanobis baseline (:class:`~boxwatch.offline.monitors.
baselines.Mahalanobis`: population covariances with the same ridge), so the term equals
that baseline's distance to the class mean less its distance with one class, computed in
the low-rank form the agent applies (Woodbury: ``P - P_0 = P U (I + U' P U)^-1 U' P`` with
``U`` the class means' deviations from the overall mean, weighted by the root of each class's
share). The training features are read in blocks of rows, never copied whole.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from boxwatch.agent.mahalanobis import RelativeMahalanobis
from boxwatch.offline.monitors.baselines import COVARIANCE_RIDGE

# Training rows converted to float64 at a time: a few tens of MB per block at 1,024 features,
# outside the build's memory estimate, which counts the boxes' work.
ROW_BLOCK = 4096
# Directions whose weight is below this share of the largest are dropped: their squares add
# under 1e-16 of the term (the weighted class means sum to the overall mean, so one direction
# of the factor is zero up to rounding).
RANK_TOLERANCE = 1e-8
# At most this many directions per layer, those of the largest weights (the directions in
# which the classes differ most against their spread): the agent's cost per input is
# n_features x directions, which at 1,000 classes and 512 features would otherwise be 512
# directions and halve the monitor's scoring rate (bench/scale.py). Every model of the
# detection bench (at most 90 classes) keeps all of its directions.
MAX_DIRECTIONS = 128


def _blocks(features: Any, rows: np.ndarray | None):
    """Yield ``(start, block)``: the float64 features of ``rows`` (None: all), flattened."""
    n = len(features) if rows is None else len(rows)
    for start in range(0, n, ROW_BLOCK):
        take = slice(start, start + ROW_BLOCK)
        block = features[take] if rows is None else features[rows[take]]
        yield start, np.asarray(block, np.float64).reshape(len(block), -1)


def fit_relative_mahalanobis(
    features: Any, labels: np.ndarray, n_classes: int, rows: np.ndarray | None = None
) -> RelativeMahalanobis:
    """The uncalibrated term of one layer from the training inputs' ``features`` (n_samples,
    ...) and true ``labels`` (n_samples,), on ``rows`` of them (None: all).

    A class without training rows takes the overall mean as its own (its term is then the
    distance to the overall mean under ``P - P_0``). Past :data:`MAX_DIRECTIONS` classes the
    quadratic part keeps the :data:`MAX_DIRECTIONS` directions of largest weight. Raises
    ValueError without rows, with a non-finite feature, or with a label outside
    ``[0, n_classes)``.
    """
    labels = np.asarray(labels, np.int64)
    rows = None if rows is None else np.sort(np.asarray(rows, np.int64))
    y = labels if rows is None else labels[rows]
    if not len(y):
        raise ValueError("no training rows to fit the relative Mahalanobis term on")
    if y.min() < 0 or y.max() >= n_classes:
        raise ValueError(f"labels must lie in [0, {n_classes})")
    counts = np.bincount(y, minlength=n_classes).astype(np.float64)
    sums: np.ndarray | None = None
    for start, x in _blocks(features, rows):
        if not np.isfinite(x).all():
            raise ValueError("the training features hold a NaN or an infinity")
        part = np.zeros((n_classes, x.shape[1]))
        np.add.at(part, y[start : start + len(x)], x)
        sums = part if sums is None else sums + part
    assert sums is not None
    n = float(len(y))
    mean = sums.sum(axis=0) / n
    means = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1.0)[:, None], mean)
    d = len(mean)
    within = np.zeros((d, d))
    for start, x in _blocks(features, rows):
        centred = x - means[y[start : start + len(x)]]
        within += centred.T @ centred
    within = within / n + COVARIANCE_RIDGE * np.eye(d)
    deviations = means - mean  # (n_classes, d)
    u = (deviations * np.sqrt(counts / n)[:, None]).T  # (d, n_classes)
    linear = np.linalg.solve(within, deviations.T).T  # P (mu_k - mu_0) per class
    pu = linear.T * np.sqrt(counts / n)  # P u, from the same solve
    inner = np.eye(n_classes) + u.T @ pu  # symmetric positive definite
    lower = np.linalg.cholesky(inner)
    factor = np.linalg.solve(lower, pu.T).T  # P - P_0 = factor @ factor.T
    q, s, _vt = np.linalg.svd(factor, full_matrices=False)
    keep = s > s.max(initial=0.0) * RANK_TOLERANCE  # the null direction's rounding off
    keep[MAX_DIRECTIONS:] = False  # the largest weights first (svd sorts them)
    directions = q[:, keep] * s[keep]
    offset = np.einsum("kj,kj->k", linear, deviations)
    return RelativeMahalanobis(mean, directions, linear, offset)
