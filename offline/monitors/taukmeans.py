"""tau-k-means: grow k until the relative inertia gain drops below tau (resolution-box paper).

k = 1, 2, ... and stop at the first k with ``1 - inertia(k+1) / inertia(k) < tau``. Fits are
cached by k in a :class:`TauKMeansPath`, so a descending tau sweep reuses every k already
fitted: a smaller tau can only stop at the same or a larger k.

Inside :func:`direct_kmeans` a fit skips ``KMeans.fit``'s checks and runs its steps itself
(:func:`_direct_kmeans`: KMeans' k-means++ and Lloyd steps, the fits of one data set sharing
its centring and squared distances, at about a third of the CPU time on the small per-class
sets of a layer choice's ranking monitors; KMeans' labels, centres and inertia in every
test).
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from threadpoolctl import ThreadpoolController

try:  # KMeans.fit's Lloyd steps (private to scikit-learn: without them, KMeans.fit runs)
    from sklearn.cluster._k_means_common import _inertia_dense
    from sklearn.cluster._k_means_lloyd import lloyd_iter_chunked_dense
except ImportError:  # pragma: no cover - another scikit-learn layout
    lloyd_iter_chunked_dense = _inertia_dense = None

# KMeans' defaults, which _direct_kmeans repeats.
_MAX_ITER, _TOL = 300, 1e-4
_direct: ContextVar[bool] = ContextVar("boxwatch_direct_kmeans", default=False)


def single_threaded() -> AbstractContextManager:
    """Run k-means single-threaded: per-class sets are small, and thread start-up and
    contention cost far more than they save (about 6-14x slower on a shared 2-core box).
    Entering it costs microseconds (:func:`_controller`)."""
    return _controller(len(sys.modules)).limit(limits=1)


@functools.lru_cache(maxsize=1)
def _controller(_modules: int) -> ThreadpoolController:
    """The thread pools of the libraries loaded (BLAS, OpenMP), found again only when
    modules were imported since (``_modules``, the count of ``sys.modules``): finding them
    costs milliseconds, and the layer choice enters :func:`single_threaded` hundreds of
    times."""
    return ThreadpoolController()


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


# Up to this many rows, the direct fits of one data set share its squared distances (an
# n x n matrix, 32 MB at the cap) instead of computing each k-means++ trial's row.
_SHARED_DISTANCES = 2048


@dataclass
class _Centred:
    """What every k of :func:`_direct_kmeans` on one data set shares, computed once."""

    x: np.ndarray  # the rows, float64, C order, minus their mean
    mean: np.ndarray
    norms: np.ndarray  # squared row norms of x
    tol: float  # KMeans' tolerance: tol times the mean variance per feature
    weight: np.ndarray  # KMeans' sample weights: ones
    first: np.ndarray  # the cumulative probabilities of the first centre's draw
    rng: np.random.RandomState  # reseeded per fit: a new RandomState costs 50-100 us
    _sq: np.ndarray | None = None

    @classmethod
    def of(cls, x: np.ndarray) -> _Centred:
        fit = np.array(x, dtype=np.float64, order="C", copy=True)
        mean = fit.mean(axis=0)
        fit -= mean
        tol = float(np.mean(np.var(fit, axis=0))) * _TOL
        weight = np.ones(len(fit))
        first = (weight / weight.sum()).cumsum()  # RandomState.choice's own cdf
        first /= first[-1]
        norms = np.einsum("ij,ij->i", fit, fit)
        return cls(fit, mean, norms, tol, weight, first, np.random.RandomState())

    def sq_distances(self, ids: np.ndarray) -> np.ndarray:
        """Squared Euclidean distances (clipped at 0) of rows ``ids`` to every row, as
        k-means++ computes them: from one shared matrix up to :data:`_SHARED_DISTANCES`
        rows (a row of a larger product may differ from its own in the last bits)."""
        if len(self.x) > _SHARED_DISTANCES:
            return _sq_distances(self.x[ids], self.x, self.norms[ids], self.norms)
        if self._sq is None:
            self._sq = _sq_distances(self.x, self.x, self.norms, self.norms)
        return self._sq[ids]


def _sq_distances(
    a: np.ndarray, b: np.ndarray, a_norms: np.ndarray, b_norms: np.ndarray
) -> np.ndarray:
    """``max(|a_i|^2 + |b_j|^2 - 2 a_i.b_j, 0)`` in scikit-learn's order of operations."""
    dist = -2 * (a @ b.T)
    dist += a_norms[:, np.newaxis]
    dist += b_norms[np.newaxis, :]
    return np.maximum(dist, 0, out=dist)


def _direct_kmeans(
    x: np.ndarray, k: int, seed: int, centred: _Centred | None = None
) -> tuple[np.ndarray, np.ndarray, float]:
    """``KMeans(n_clusters=k, n_init=1, random_state=seed).fit(x)``'s labels, centres and
    inertia, single-threaded, for a finite float64 ``x`` of at least ``k`` rows: its steps
    (centring, greedy k-means++ with 2 + log k trials per centre, the Lloyd loop) without
    its input checks, which cost more than the fit on a few hundred rows. ``centred``
    (``_Centred.of(x)``) shares the centring and the k-means++ distances between the fits
    of one ``x``: the distances may differ from KMeans' in the last bits, so a trial
    landing within rounding of a boundary could pick another centre; the Lloyd steps are
    KMeans' own. Checked against ``KMeans`` in tests/offline/monitors/test_taukmeans.py."""
    c = centred if centred is not None else _Centred.of(x)
    fit, weight = c.x, c.weight
    rng = c.rng
    rng.seed(seed)  # the stream of RandomState(seed)
    centres = np.empty((k, fit.shape[1]))
    trials = 2 + int(np.log(k))
    # RandomState.choice(n, p=weight / weight.sum())'s draw, from the shared cdf
    first = int(c.first.searchsorted(rng.random_sample(), side="right"))
    centres[0] = fit[first]
    closest = c.sq_distances(np.array([first]))[0]
    potential = closest @ weight
    column = weight.reshape(-1, 1)
    last = len(closest) - 1
    for i in range(1, k):
        # weight is all ones: weight * closest is closest, bit for bit
        ids = np.searchsorted(np.cumsum(closest), rng.uniform(size=trials) * potential)
        np.minimum(ids, last, out=ids)
        dist = c.sq_distances(ids)
        np.minimum(closest, dist, out=dist)
        potentials = dist @ column
        best = int(np.argmin(potentials))
        potential, closest = potentials[best], dist[best]
        centres[i] = fit[ids[best]]
    labels, inertia, found = _lloyd(fit, weight, centres, c.tol)
    return labels.astype(np.int64), found + c.mean, inertia


def _lloyd(
    x: np.ndarray, weight: np.ndarray, centres: np.ndarray, tol: float
) -> tuple[np.ndarray, float, np.ndarray]:
    """scikit-learn's ``_kmeans_single_lloyd`` (one thread, at most ``_MAX_ITER`` steps),
    its steps called directly: labels, inertia and centres from ``centres``."""
    assert lloyd_iter_chunked_dense is not None and _inertia_dense is not None
    k = len(centres)
    new = np.zeros_like(centres)
    labels = np.full(len(x), -1, dtype=np.int32)
    old = labels.copy()
    in_clusters = np.zeros(k, dtype=x.dtype)
    shift = np.zeros(k, dtype=x.dtype)
    strict = False
    for _ in range(_MAX_ITER):
        lloyd_iter_chunked_dense(x, weight, centres, new, in_clusters, labels, shift, 1)
        centres, new = new, centres
        if np.array_equal(labels, old):
            strict = True
            break
        if (shift**2).sum() <= tol:
            break
        old[:] = labels
    if not strict:
        lloyd_iter_chunked_dense(
            x, weight, centres, centres, in_clusters, labels, shift, 1, update_centers=False
        )
    return labels, float(_inertia_dense(x, weight, centres, labels, 1)), centres


@functools.cache
def _direct_agrees() -> bool:
    """Whether :func:`_direct_kmeans` gives ``KMeans``' result on a small fixed set, checked
    once per process: where a scikit-learn release fits otherwise, fits keep ``KMeans``."""
    if lloyd_iter_chunked_dense is None:  # pragma: no cover - another scikit-learn layout
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
        self._centred: _Centred | None = None  # the direct fits' shared centring

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
                if self._centred is None:
                    self._centred = _Centred.of(fit)
                labels, centres, inertia = _direct_kmeans(
                    fit, k, int(self._seeds[k]), self._centred
                )
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
