"""Clustering coverage of boxes with a resolution, and the tau_min / tau_max search.

Resolution-box paper, Sec. 3 and Algorithm 1, with the corrected cell count of
``shared/ALGORITHMS.md``: along each dimension of the global box ``[a, b]`` (divided into
``N = |X|`` cells), a local interval ``[a', b']`` covers
``ceil(N (b' - a) / (b - a)) - floor(N (a' - a) / (b - a))`` cells (at least 1; 1 when
``a' == b'``). Dimensions where the global box has zero width are left out. Cell counts are
astronomically large in many dimensions, so everything is computed in log space.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

from boxwatch.offline.monitors.taukmeans import (
    TauKMeansPath,
    cluster_boxes,
    n_distinct_rows,
    single_threaded,
)

_SNAP = 1e-9  # N (x - a) / (b - a) within this (relative) of an integer counts as that integer


@dataclass(frozen=True)
class Coverage:
    """Clustering coverage bounds of a set of local boxes (Proposition 1).

    ``lower``/``upper`` are the bounds r_l, r_u as plain ratios (they may underflow to 0 in
    many dimensions); ``log_lower``/``log_upper`` are their natural logs (``-inf`` for 0).
    """

    lower: float
    upper: float
    log_lower: float
    log_upper: float
    n_boxes: int
    n_dims: int

    @property
    def mean(self) -> float:
        """(r_l + r_u) / 2, the value Algorithm 1 compares."""
        return 0.5 * (self.lower + self.upper)


def _snap(v: np.ndarray) -> np.ndarray:
    r = np.round(v)
    return np.where(np.abs(v - r) <= _SNAP * np.maximum(1.0, np.abs(v)), r, v)


def log_covered_cells(
    lo: np.ndarray, hi: np.ndarray, a: np.ndarray, b: np.ndarray, n: int
) -> np.ndarray:
    """Natural log of the number of cells each box covers, shape (n_boxes,).

    Parameters
    ----------
    lo, hi : ndarray of shape (n_boxes, n_dims)
        Local boxes, restricted to the covered dimensions of the global box.
    a, b : ndarray of shape (n_dims,)
        Global box, ``a < b`` in every dimension.
    n : int
        Resolution: cells per dimension (|X|).
    """
    width = b - a
    upper = np.ceil(_snap(n * (hi - a) / width))
    lower = np.floor(_snap(n * (lo - a) / width))
    cells = np.maximum(upper - lower, 1.0)
    cells = np.where(hi == lo, 1.0, cells)
    return np.sum(np.log(cells), axis=1)


def clustering_coverage(x: np.ndarray, boxes: tuple[np.ndarray, np.ndarray]) -> Coverage:
    """Bounds r_l, r_u on the share of ``B(x)``'s cells covered by the local ``boxes``.

    Parameters
    ----------
    x : ndarray of shape (n_samples, n_features)
        The clustered set X (defines the global box and the resolution N = n_samples).
    boxes : (lo, hi), each ndarray of shape (n_boxes, n_features)

    Returns
    -------
    Coverage
        r_u sums the boxes' coverages; r_l subtracts the coverage of every pairwise
        intersection (Proposition 1).
    """
    x = np.asarray(x, dtype=np.float64)
    lo, hi = (np.asarray(v, dtype=np.float64) for v in boxes)
    if x.ndim != 2 or len(x) == 0:
        raise ValueError(f"x must be a non-empty 2-d array; got shape {x.shape}")
    if lo.shape != hi.shape or lo.ndim != 2 or lo.shape[1] != x.shape[1]:
        raise ValueError(f"boxes of shape {lo.shape}/{hi.shape} do not match x {x.shape}")
    n = len(x)
    a, b = x.min(axis=0), x.max(axis=0)
    dims = a != b
    n_dims = int(dims.sum())
    a, b, lo, hi = a[dims], b[dims], lo[:, dims], hi[:, dims]
    total = n_dims * np.log(n)
    log_boxes = log_covered_cells(lo, hi, a, b, n) - total
    log_upper = float(logsumexp(log_boxes)) if len(lo) else -np.inf
    if _distinct_points(lo, hi):  # tau = 0: no two boxes meet, no pair to look at
        nonempty = np.zeros(0, dtype=bool)
    else:
        i, j = np.triu_indices(len(lo), k=1)
        ilo, ihi = np.maximum(lo[i], lo[j]), np.minimum(hi[i], hi[j])
        nonempty = np.all(ilo <= ihi, axis=1)
    if nonempty.any():
        log_int = float(logsumexp(log_covered_cells(ilo[nonempty], ihi[nonempty], a, b, n) - total))
        ratio = np.exp(log_int - log_upper)
        log_lower = log_upper + np.log1p(-ratio) if ratio < 1 else -np.inf
    else:
        log_lower = log_upper
    return Coverage(
        lower=float(np.exp(log_lower)),
        upper=float(np.exp(log_upper)),
        log_lower=float(log_lower),
        log_upper=float(log_upper),
        n_boxes=len(lo),
        n_dims=n_dims,
    )


def _distinct_points(lo: np.ndarray, hi: np.ndarray) -> bool:
    """Whether the boxes are distinct points (the clusters of tau = 0): then no two of them
    intersect, which saves looking at every pair (quadratic in the samples)."""
    if len(lo) < 2 or not np.array_equal(lo, hi):
        return False
    return n_distinct_rows(lo) == len(lo)


def coverage_at(path: TauKMeansPath, tau: float) -> Coverage:
    """Coverage of the tau-k-means boxes of ``path.x``."""
    clustering = path.cluster(tau)
    return clustering_coverage(path.x, cluster_boxes(path.x, clustering.labels))


def _bisect(
    more_than_eps: Callable[[float], bool], eps_ival: float, *, move_low: bool
) -> tuple[float, float]:
    low, high = 0.0, 1.0
    while high - low > eps_ival:
        mid = 0.5 * (low + high)
        if more_than_eps(mid) == move_low:
            low = mid
        else:
            high = mid
    return low, high


def search_tau_max(path: TauKMeansPath, *, eps_cov: float = 0.01, eps_ival: float = 0.01) -> float:
    """Algorithm 1: the smallest tau whose mean coverage is within ``eps_cov`` of tau = 1's."""
    top = coverage_at(path, 1.0).mean
    _, high = _bisect(lambda t: top - coverage_at(path, t).mean > eps_cov, eps_ival, move_low=True)
    return high


def search_tau_min(path: TauKMeansPath, *, eps_cov: float = 0.01, eps_ival: float = 0.01) -> float:
    """Algorithm 1 mirrored: the largest tau whose mean coverage is within ``eps_cov`` of tau = 0's."""
    bottom = coverage_at(path, 0.0).mean
    low, _ = _bisect(
        lambda t: coverage_at(path, t).mean - bottom > eps_cov, eps_ival, move_low=False
    )
    return low


def tau_interval(
    x: np.ndarray,
    *,
    eps_cov: float = 0.01,
    eps_ival: float = 0.01,
    max_clusters: int = 64,
    random_state=0,
) -> tuple[float, float]:
    """``(tau_min, tau_max)``: where clustering coverage changes with tau (Sec. 4.1).

    Parameters
    ----------
    x : ndarray of shape (n_samples, n_features)
    eps_cov : float
        Coverage difference treated as "close".
    eps_ival : float
        Bisection stops when the interval is this short.
    """
    if not (0 < eps_ival < 1 and eps_cov >= 0):
        raise ValueError(f"need 0 < eps_ival={eps_ival} < 1 and eps_cov={eps_cov} >= 0")
    path = TauKMeansPath(x, max_clusters=max_clusters, random_state=random_state)
    with single_threaded():
        return (
            search_tau_min(path, eps_cov=eps_cov, eps_ival=eps_ival),
            search_tau_max(path, eps_cov=eps_cov, eps_ival=eps_ival),
        )
