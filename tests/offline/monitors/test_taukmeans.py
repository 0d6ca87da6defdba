"""tau-k-means on its own: the stopping rule, k reuse across a tau sweep, degenerate data."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from boxwatch.offline.monitors.taukmeans import (
    TauKMeansPath,
    cluster_boxes,
    single_threaded,
    tau_kmeans,
)


def blobs(seed: int = 0, n: int = 60, centres=((0, 0), (10, 0), (0, 10))) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.vstack([rng.normal(c, 0.3, size=(n, 2)) for c in centres])


def test_three_blobs_give_three_clusters():
    res = tau_kmeans(blobs(), 0.5)
    assert res.k == 3
    assert len(np.unique(res.labels)) == 3
    # Each blob is one cluster.
    assert all(len(np.unique(res.labels[i * 60 : (i + 1) * 60])) == 1 for i in range(3))


@pytest.mark.parametrize("tau", [0.9, 0.5, 0.2, 0.05, 0.01])
def test_stopping_rule_holds(tau):
    path = TauKMeansPath(blobs(1), max_clusters=12, random_state=0)
    res = path.cluster(tau)
    inertia = {k: path.fit_k(k).inertia for k in range(1, res.k + 2) if k <= path.max_k}
    for j in range(1, res.k):  # every earlier k gained at least tau
        assert 1 - inertia[j + 1] / inertia[j] >= tau
    if res.k < path.max_k and inertia[res.k] > 0:
        assert 1 - inertia[res.k + 1] / inertia[res.k] < tau


def test_descending_sweep_reuses_k_and_matches_single_runs():
    x = blobs(2, centres=((0, 0), (4, 0), (0, 4), (4, 4), (8, 8)))
    taus = [1.0, 0.9, 0.5, 0.3, 0.1, 0.05, 0.01]
    with single_threaded():
        swept = TauKMeansPath(x, max_clusters=16, random_state=7).sweep(taus)
        ks = [swept[t].k for t in sorted(taus, reverse=True)]
        assert ks == sorted(ks)  # smaller tau never stops earlier
        for tau in taus:
            single = TauKMeansPath(x, max_clusters=16, random_state=7).cluster(tau)
            assert single.k == swept[tau].k
            np.testing.assert_array_equal(single.labels, swept[tau].labels)


def test_deterministic_for_a_seed_and_seed_matters_only_through_kmeans():
    x = np.random.default_rng(3).normal(size=(300, 5))
    a = tau_kmeans(x, 0.05, random_state=11)
    b = tau_kmeans(x, 0.05, random_state=11)
    assert a.k == b.k
    np.testing.assert_array_equal(a.labels, b.labels)


def test_inertia_zero_stops():
    # Three distinct points repeated: k=3 reaches inertia 0 and must stop there.
    x = np.repeat(np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]), 5, axis=0)
    res = tau_kmeans(x, 0.001, max_clusters=10)
    assert res.k == 3
    assert res.inertia == pytest.approx(0.0, abs=1e-20)
    # All points identical: one cluster, inertia 0, no error.
    same = tau_kmeans(np.ones((7, 3)), 0.01)
    assert (same.k, same.inertia) == (1, 0.0)


def test_fewer_samples_than_k():
    x = np.array([[0.0, 0.0], [5.0, 5.0]])
    res = tau_kmeans(x, 0.01, max_clusters=10)
    assert res.k == 2
    one = tau_kmeans(np.array([[1.0, 2.0]]), 0.01)
    assert one.k == 1
    with pytest.raises(ValueError, match="n_samples=0"):
        tau_kmeans(np.zeros((0, 2)), 0.5)
    with pytest.raises(ValueError, match="tau"):
        tau_kmeans(x, 1.5)


def test_tau_zero_is_one_cluster_per_distinct_point():
    x = np.array([[0.0], [0.0], [1.0], [2.0]])
    res = TauKMeansPath(x).cluster(0.0)
    assert res.k == 3
    assert res.labels[0] == res.labels[1] != res.labels[2]


def test_max_clusters_caps_k():
    x = np.random.default_rng(4).normal(size=(200, 3))
    assert tau_kmeans(x, 1e-9, max_clusters=5).k == 5


def test_cluster_boxes_are_tight_and_contain_their_points():
    x = blobs(5)
    labels = tau_kmeans(x, 0.3).labels
    lo, hi = cluster_boxes(x, labels)
    for i, lab in enumerate(np.unique(labels)):
        pts = x[labels == lab]
        np.testing.assert_array_equal(lo[i], pts.min(axis=0))
        np.testing.assert_array_equal(hi[i], pts.max(axis=0))
    # Unused label values are skipped, not turned into empty boxes.
    lo2, _ = cluster_boxes(x[:4], np.array([5, 5, 9, 9]))
    assert lo2.shape == (2, 2)


def activations_like(seed: int, n: int, d: int, relu: bool) -> np.ndarray:
    """Rows like a layer's activations: a few clusters, L2-normalised, ReLU'd or not."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(int(rng.integers(1, 12)), d))
    x = centres[rng.integers(len(centres), size=n)] + rng.uniform(0.1, 1.0) * rng.normal(
        size=(n, d)
    )
    x = np.maximum(x, 0) if relu else x
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("shared", [True, False], ids=["shared-distances", "per-trial"])
@pytest.mark.parametrize("seed", range(40))
def test_direct_kmeans_gives_kmeans_results_bit_for_bit(seed, shared, monkeypatch):
    """The direct path (what the layer choice's ranking monitors use) is KMeans.fit itself:
    the same labels, centres and inertia, with the k-means++ distances taken from one
    shared matrix or computed per trial as KMeans does; this fails if a scikit-learn
    release changes its steps."""
    from sklearn.cluster import KMeans

    from boxwatch.offline.monitors import taukmeans
    from boxwatch.offline.monitors.taukmeans import _direct_kmeans

    if not shared:
        monkeypatch.setattr(taukmeans, "_SHARED_DISTANCES", 0)

    rng = np.random.default_rng(1000 + seed)
    n, d = int(rng.integers(3, 300)), int(rng.choice([2, 16, 64, 128]))
    x = activations_like(seed, n, d, relu=bool(seed % 2))
    if seed % 5 == 0:  # repeated rows
        x = np.vstack([x, x[: n // 2]])
    k = int(rng.integers(2, min(len(x), 40) + 1))
    with single_threaded():
        km = KMeans(n_clusters=k, n_init=1, random_state=seed).fit(x)
        labels, centres, inertia = _direct_kmeans(x, k, seed)
    assert np.array_equal(labels, km.labels_)
    assert np.array_equal(centres, km.cluster_centers_)
    assert inertia == km.inertia_


@pytest.mark.parametrize("max_samples", [None, 50])
def test_a_sweep_inside_direct_kmeans_is_the_same_sweep(max_samples, monkeypatch):
    from boxwatch.offline.monitors import taukmeans
    from boxwatch.offline.monitors.taukmeans import direct_kmeans

    x = activations_like(7, 200, 32, relu=True)
    taus = [0.5, 0.1, 0.05, 0.01, 0.001]

    def sweep():
        path = TauKMeansPath(x, max_clusters=64, random_state=3, max_samples=max_samples)
        with single_threaded():
            return path.sweep(taus)

    plain = sweep()

    def refused(**_: object) -> None:
        raise AssertionError("KMeans.fit ran inside direct_kmeans")

    assert taukmeans._direct_agrees()  # checked once, before KMeans is refused below
    monkeypatch.setattr(taukmeans, "KMeans", refused)  # the direct path never builds one
    with direct_kmeans():
        direct = sweep()
    assert [c.k for c in plain.values()] == [c.k for c in direct.values()]
    for tau in taus:
        assert np.array_equal(plain[tau].labels, direct[tau].labels)
        assert plain[tau].inertia == direct[tau].inertia


def test_single_threaded_limits_every_pool_and_finds_new_libraries_once_imported():
    """Entering single_threaded is cheap (the pools are found once) yet still binds: every
    BLAS and OpenMP pool runs one thread inside it, and the previous counts come back."""
    from threadpoolctl import threadpool_info

    from boxwatch.offline.monitors import taukmeans

    before = {i["filepath"]: i["num_threads"] for i in threadpool_info()}
    with single_threaded():
        inside = threadpool_info()
    assert inside and all(i["num_threads"] == 1 for i in inside)
    assert {i["filepath"]: i["num_threads"] for i in threadpool_info()} == before
    with single_threaded(), single_threaded():
        pass
    assert taukmeans._controller.cache_info().currsize == 1
    found = taukmeans._controller.cache_info().misses
    sys.modules["boxwatch_test_new_module"] = types.ModuleType("boxwatch_test_new_module")
    try:
        with single_threaded():
            pass
    finally:
        del sys.modules["boxwatch_test_new_module"]
    assert taukmeans._controller.cache_info().misses == found + 1  # looked again
