"""tau-k-means: grow k until the relative inertia gain drops below tau (resolution-box paper).

k = 1, 2, ... and stop at the first k with ``1 - inertia(k+1) / inertia(k) < tau``. Fits are
cached by k in a :class:`TauKMeansPath`, so a descending tau sweep reuses every k already
fitted: a smaller tau can only stop at the same or a larger k.

Inside :func:`direct_kmeans` a fit skips ``KMeans.fit``'s checks and runs its steps itself
(:func:`_direct_kmeans`: the same labels, centres and inertia, bit for bit, at about half
the CPU time on the small per-class sets of a layer choice's ranking monitors).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from threadpoolctl import threadpool_limits

try:  # KMeans.fit's Lloyd loop (private to scikit-learn: without it, KMeans.fit runs)
    from sklearn.cluster._kmeans import _kmeans_single_lloyd
except ImportError:  # pragma: no cover - another scikit-learn layout
    _kmeans_single_lloyd = None

# KMeans' defaults, which _direct_kmeans repeats.
_MAX_ITER, _TOL = 300, 1e-4
_direct: ContextVar[bool] = ContextVar("boxwatch_direct_kmeans", default=False)


def single_threaded() -> AbstractContextManager:
    """Run k-means single-threaded: per-class sets are small, and thread start-up and
    contention cost far more than they save (about 6-14x slower on a shared 2-core box).
    Enter once around many fits; entering it costs milliseconds."""
    return threadpool_limits(limits=1)


@contextmanager
def direct_kmeans() -> Iterator[None]:
    """Fits of :class:`TauKMeansPath` (``n_init=1``) in this context (this thread; joblib
    workers elsewhere fit through ``KMeans.fit``, to the same result) take the direct
    path of :func:`_direct_kmeans`, where it agrees with ``KMeans`` (:func:`_direct_agrees`)."""
    token = _direct.set(True)
    try:
        yield
    finally:
        _direct.reset(token)


def _direct_kmeans(x: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    """``KMeans(n_clusters=k, n_init=1, random_state=seed).fit(x)``'s labels, centres and
    inertia, single-threaded, for a finite float64 ``x`` of at least ``k`` rows: its steps
    (centring, greedy k-means++ with 2 + log k trials per centre, the Lloyd loop) without
    its input checks, which cost more than the fit on a few hundred rows. Checked against
    ``KMeans`` in tests/offline/monitors/test_taukmeans.py."""
    assert _kmeans_single_lloyd is not None
    fit = np.array(x, dtype=np.float64, order="C", copy=True)
    rng = np.random.RandomState(seed)
    n = len(fit)
    weight = np.ones(n)
    mean = fit.mean(axis=0)
    fit -= mean
    norms = np.einsum("ij,ij->i", fit, fit)
    tol = float(np.mean(np.var(fit, axis=0))) * _TOL
    centres = np.empty((k, fit.shape[1]))
    trials = 2 + int(np.log(k))
    first = rng.choice(n, p=weight / weight.sum())
    centres[0] = fit[first]
    closest = -2 * (centres[0, np.newaxis] @ fit.T)
    closest += norms[first]
    closest += norms[np.newaxis, :]
    np.maximum(closest, 0, out=closest)
    potential = closest @ weight
    for c in range(1, k):
        ids = np.searchsorted(np.cumsum(weight * closest), rng.uniform(size=trials) * potential)
        np.clip(ids, None, closest.size - 1, out=ids)
        dist = -2 * (fit[ids] @ fit.T)
        dist += norms[ids][:, np.newaxis]
        dist += norms[np.newaxis, :]
        np.maximum(dist, 0, out=dist)
        np.minimum(closest, dist, out=dist)
        potentials = dist @ weight.reshape(-1, 1)
        best = int(np.argmin(potentials))
        potential, closest = potentials[best], dist[best]
        centres[c] = fit[ids[best]]
    labels, inertia, found, _ = _kmeans_single_lloyd(
        fit, weight, centres, max_iter=_MAX_ITER, verbose=False, tol=tol, n_threads=1
    )
    return np.asarray(labels, dtype=np.int64), found + mean, float(inertia)


@functools.cache
def _direct_agrees() -> bool:
    """Whether :func:`_direct_kmeans` gives ``KMeans``' result on a small fixed set, checked
    once per process: where a scikit-learn release fits otherwise, fits keep ``KMeans``."""
    if _kmeans_single_lloyd is None:  # pragma: no cover - another scikit-learn layout
        return False
    x = np.random.RandomState(0).normal(size=(60, 3))
    try:
        with single_threaded(), warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            km = KMeans(n_clusters=4, n_init=1, random_state=1).fit(x)
            labels, centres, inertia = _direct_kmeans(x, 4, 1)
    except Exception:  # pragma: no cover - a changed private signature
        return False
    return bool(
        np.array_equal(labels, km.labels_)
        and np.array_equal(centres, km.cluster_centers_)
        and inertia == km.inertia_
    )


@dataclass(frozen=True)
class Clustering:
    """One tau-k-means result: ``k`` clusters and each sample's cluster label."""

    k: int
    labels: np.ndarray
    inertia: float


class TauKMeansPath:
    """Deterministic k-means fits of one data set for k = 1, 2, ..., cached by k.

    Parameters
    ----------
    x : ndarray of shape (n_samples, n_features)
    max_clusters : int, default=64
        Never grow k beyond this (also capped by the number of distinct samples).
    random_state : int, RandomState or None, default=0
        Seed for every k-means fit (one seed per k, drawn once, so results do not depend
        on the order in which k values are requested).
    n_init : int, default=1
        k-means restarts per k.
    max_samples : int or None, default=None
        With more samples than this, k-means is fitted on this many of them (drawn without
        replacement with ``random_state``, before the seeds of the fits) and every sample
        joins its nearest centre; the inertias (tau-k-means' stopping rule) are the fitted
        subsample's. None fits on every sample.
    """

    def __init__(
        self,
        x: np.ndarray,
        *,
        max_clusters: int = 64,
        random_state=0,
        n_init: int = 1,
        max_samples: int | None = None,
    ):
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2:
            raise ValueError(f"x must be 2-d; got shape {x.shape}")
        if max_clusters < 1:
            raise ValueError(f"max_clusters={max_clusters} should be >= 1")
        if max_samples is not None and max_samples < 1:
            raise ValueError(f"max_samples={max_samples} should be >= 1")
        rng = check_random_state(random_state)
        self.x = x
        self.sampled = max_samples is not None and len(x) > max_samples
        if self.sampled:
            assert max_samples is not None
            pick = np.random.RandomState(rng.randint(0, 2**31 - 1)).choice(
                len(x), max_samples, replace=False
            )
            self.x_fit = x[np.sort(pick)]
        else:
            self.x_fit = x
        self.n_distinct = n_distinct_rows(self.x_fit)
        self.max_k = max(1, min(max_clusters, self.n_distinct))
        self._seeds = rng.randint(0, 2**31 - 1, size=self.max_k + 1)
        self.n_init = n_init
        self._fits: dict[int, Clustering] = {}
        self._every_sample: Clustering | None = None

    def fit_k(self, k: int) -> Clustering:
        """The (cached) k-means clustering with ``k`` clusters, ``1 <= k <= max_k``."""
        if k in self._fits:
            return self._fits[k]
        fit = self.x_fit
        if k == 1 or len(fit) <= 1:
            labels = np.zeros(len(self.x), dtype=np.int64)
            inertia = float(np.sum((fit - fit.mean(axis=0)) ** 2)) if len(fit) else 0.0
        else:
            if _direct.get() and self.n_init == 1 and _direct_agrees():
                labels, centres, inertia = _direct_kmeans(fit, k, int(self._seeds[k]))
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ConvergenceWarning)
                    km = KMeans(n_clusters=k, n_init=self.n_init, random_state=int(self._seeds[k]))
                    labels = km.fit_predict(fit).astype(np.int64)
                centres, inertia = km.cluster_centers_, float(km.inertia_)
            if self.sampled:
                labels = nearest_centre(self.x, centres)
        result = Clustering(k=k, labels=labels, inertia=inertia)
        self._fits[k] = result
        return result

    def cluster(self, tau: float, k_start: int = 1) -> Clustering:
        """tau-k-means starting from ``k_start`` (pass the k of a larger tau to reuse it).

        ``tau <= 0`` puts every distinct sample in its own cluster (the paper's tau = 0).
        Stops early when the inertia is 0 (nothing left to gain) or k reaches ``max_k``.
        """
        if tau <= 0:
            return self._distinct()
        k = max(1, min(k_start, self.max_k))
        while k < self.max_k:
            cur = self.fit_k(k)
            if cur.inertia <= 0.0:
                break
            nxt = self.fit_k(k + 1)
            if 1.0 - nxt.inertia / cur.inertia < tau:
                break
            k += 1
        return self.fit_k(k)

    def _distinct(self) -> Clustering:
        """Every distinct sample its own cluster (tau = 0), computed once."""
        if self._every_sample is None:
            if len(self.x) == 0:
                self._every_sample = Clustering(k=0, labels=np.zeros(0, np.int64), inertia=0.0)
            else:
                _, labels = np.unique(self.x, axis=0, return_inverse=True)
                labels = labels.reshape(-1).astype(np.int64)
                self._every_sample = Clustering(k=int(labels.max()) + 1, labels=labels, inertia=0.0)
        return self._every_sample

    def sweep(self, taus: Sequence[float]) -> dict[float, Clustering]:
        """tau-k-means for every tau, fitted in descending order reusing k."""
        out: dict[float, Clustering] = {}
        k = 1
        for tau in sorted(taus, reverse=True):
            res = self.cluster(tau, k_start=k)
            out[tau] = res
            k = max(k, res.k)
        return out


def tau_kmeans(
    x: np.ndarray, tau: float, *, max_clusters: int = 64, random_state=0, n_init: int = 1
) -> Clustering:
    """Cluster ``x`` (n_samples, n_features) with tau-k-means; see :class:`TauKMeansPath`."""
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau={tau} should lie in [0, 1]")
    x = np.asarray(x)
    if len(x) == 0:
        raise ValueError("n_samples=0: nothing to cluster")
    with single_threaded():
        return TauKMeansPath(
            x, max_clusters=max_clusters, random_state=random_state, n_init=n_init
        ).cluster(tau)


# nearest_centre works on blocks of about this many (rows x centres) distances.
_ASSIGN_BLOCK = 1 << 20


def nearest_centre(x: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """Index of the nearest of ``centres`` (Euclidean) for each row of ``x``, in blocks."""
    out = np.empty(len(x), dtype=np.int64)
    c_sq = np.einsum("ij,ij->i", centres, centres)
    step = max(1, _ASSIGN_BLOCK // max(1, len(centres)))
    for s in range(0, len(x), step):
        block = x[s : s + step]
        out[s : s + len(block)] = np.argmin(c_sq[None, :] - 2 * (block @ centres.T), axis=1)
    return out


def n_distinct_rows(x: np.ndarray) -> int:
    """``len(np.unique(x, axis=0))`` of a 2-d float array, from the rows' bytes where that
    counts the same (no NaN; -0.0 made 0.0 first): a byte sort is far cheaper."""
    if len(x) == 0:
        return 0
    if np.isnan(x).any():
        return len(np.unique(x, axis=0))
    rows = np.ascontiguousarray(x + 0.0)  # + 0.0 turns -0.0 into 0.0
    return len(np.unique(rows.view(np.dtype((np.void, rows.itemsize * rows.shape[1])))))


def cluster_boxes(x: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tight min/max box of each non-empty cluster, in label order.

    Returns ``(lo, hi)``, each of shape (n_used_labels, n_features).
    """
    x = np.asarray(x)
    if len(x) == 0:
        return np.zeros((0, x.shape[1]), x.dtype), np.zeros((0, x.shape[1]), x.dtype)
    _, dense = np.unique(labels, return_inverse=True)
    order = np.argsort(dense.reshape(-1), kind="stable")
    xs = x[order]
    starts = np.flatnonzero(np.r_[True, np.diff(dense.reshape(-1)[order]) != 0])
    return np.minimum.reduceat(xs, starts, axis=0), np.maximum.reduceat(xs, starts, axis=0)
