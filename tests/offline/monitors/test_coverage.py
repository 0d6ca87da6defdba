"""Clustering coverage (Examples 2-4 of the paper, a brute-force cell count) and Algorithm 1."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from boxwatch.offline.monitors.coverage import (
    clustering_coverage,
    coverage_at,
    search_tau_max,
    search_tau_min,
    tau_interval,
)
from boxwatch.offline.monitors.taukmeans import TauKMeansPath, cluster_boxes

X = np.array([(0.1, 0.5), (0.1, 1.0), (0.2, 0.8), (0.6, 0.2), (1.0, 0.3)])  # Example 1


def boxes_of(*clusters):
    return (
        np.array([np.min(c, axis=0) for c in clusters]),
        np.array([np.max(c, axis=0) for c in clusters]),
    )


def test_example2_covered_space_drops_zero_width_dimensions():
    x = np.array([(1.5, 2.0, 1.0), (1.8, 2.3, 1.0)])
    cov = clustering_coverage(x, boxes_of(x))
    assert cov.n_dims == 2
    assert cov.upper == pytest.approx(1.0)


def test_example3_sub_box_coverage():
    cov = clustering_coverage(X, boxes_of(X[:3]))
    assert cov.upper == pytest.approx(4 / 25, abs=1e-15)


def test_example4_clustering_coverage():
    cov = clustering_coverage(X, boxes_of(X[:3], X[3:]))
    assert cov.lower == pytest.approx(0.28, abs=1e-15)
    assert cov.upper == pytest.approx(0.28, abs=1e-15)


def brute_force_cells(x, lo, hi):
    """Cells of the N^D grid whose interior meets the box (zero-width sides cover 1 cell)."""
    n = len(x)
    a, b = x.min(0), x.max(0)
    dims = np.flatnonzero(a != b)
    per_dim = []
    for j in dims:
        edges = a[j] + (b[j] - a[j]) * np.arange(n + 1) / n
        if lo[j] == hi[j]:
            per_dim.append(1)
        else:
            per_dim.append(sum(max(lo[j], edges[i]) < min(hi[j], edges[i + 1]) for i in range(n)))
    return int(np.prod(per_dim))


@pytest.mark.parametrize("seed", range(4))
def test_cell_count_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 40, size=(8, 3)) / 4.0  # values on and off cell edges
    x[:, 2] = x[0, 2] if seed == 0 else x[:, 2]  # a constant dimension in one case
    labels = rng.integers(0, 3, size=len(x))
    lo, hi = cluster_boxes(x, labels)
    cov = clustering_coverage(x, (lo, hi))
    n_dims = int(np.sum(x.min(0) != x.max(0)))
    cells = [brute_force_cells(x, lo[i], hi[i]) for i in range(len(lo))]
    assert cov.upper == pytest.approx(sum(cells) / len(x) ** n_dims, rel=1e-12)
    inter = 0
    for i, j in itertools.combinations(range(len(lo)), 2):
        ilo, ihi = np.maximum(lo[i], lo[j]), np.minimum(hi[i], hi[j])
        if np.all(ilo <= ihi):
            inter += brute_force_cells(x, ilo, ihi)
    assert cov.lower == pytest.approx((sum(cells) - inter) / len(x) ** n_dims, rel=1e-9, abs=1e-15)
    assert cov.lower <= cov.upper


def test_high_dimensions_stay_finite_in_log_space():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 1000))
    labels = np.arange(200) % 100  # 100 boxes of 2 points: tiny in 1,000 dimensions
    cov = clustering_coverage(x, cluster_boxes(x, labels))
    assert cov.upper == 0.0  # underflows as a plain ratio ...
    assert np.isfinite(cov.log_upper) and cov.log_upper < -745  # ... but not in log space
    assert cov.log_lower <= cov.log_upper
    whole = clustering_coverage(x, cluster_boxes(x, np.zeros(200, dtype=int)))
    assert whole.log_upper == pytest.approx(0.0, abs=1e-9)


def test_overlapping_boxes_lower_bound_below_upper():
    x = np.array([(0.0, 0.0), (0.6, 0.6), (0.4, 0.4), (1.0, 1.0)])
    cov = clustering_coverage(x, cluster_boxes(x, np.array([0, 0, 1, 1])))
    assert cov.lower < cov.upper


def test_algorithm1_bounds():
    rng = np.random.default_rng(1)
    x = np.vstack([rng.normal(c, 0.05, size=(40, 2)) for c in ((0, 0), (1, 0), (0, 1), (1, 1))])
    path = TauKMeansPath(x, max_clusters=16, random_state=0)
    eps = 0.02
    t_max = search_tau_max(path, eps_cov=eps, eps_ival=0.01)
    t_min = search_tau_min(path, eps_cov=eps, eps_ival=0.01)
    assert 0 <= t_min <= t_max <= 1
    assert coverage_at(path, 1.0).mean - coverage_at(path, t_max).mean <= eps
    assert coverage_at(path, t_min).mean - coverage_at(path, 0.0).mean <= eps
    # Clustering four tight blobs removes most of the white space: coverage drops well below 1.
    assert coverage_at(path, t_min).mean < 0.2
    assert tau_interval(x, eps_cov=eps, eps_ival=0.01, max_clusters=16) == (t_min, t_max)
    with pytest.raises(ValueError):
        tau_interval(x, eps_ival=0)
