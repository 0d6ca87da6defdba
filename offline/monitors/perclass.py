"""Per-class work of a box monitor's fit, run through joblib: tau-k-means boxes and the
coverage tau search, one (layer, class) at a time.

Every class's result depends on its own rows and its own seeds only (drawn up front, in a
fixed order), so a fit gives the same boxes whatever runs the jobs: one process
(``n_jobs=None``, the default outside a ``joblib.parallel_config`` context), the cores of
this machine (``n_jobs=-1``), or a Dask or Ray cluster behind joblib's backends
(``with joblib.parallel_config(backend="dask"): monitor.fit(...)``). Jobs take a few
classes each, gathered by the caller's process (their rows only: the activations are
never copied whole, so they may be memory-mapped), and run k-means single-threaded;
as many jobs wait dispatched as there are workers (joblib's ``pre_dispatch``), each holding
its rows in this process until sent.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from joblib import Parallel, delayed

from boxwatch.agent.boxes import normalize_features
from boxwatch.offline.monitors.coverage import search_tau_max, search_tau_min
from boxwatch.offline.monitors.taukmeans import TauKMeansPath, cluster_boxes, single_threaded

# A job gathers classes until it holds about this many feature values (rows x features):
# small enough that the jobs in flight stay a small share of the activations and of a
# worker's memory (8 MB of float64 rows; 4 times that took each worker of --jobs -1 from
# 0.20 to 0.23-0.25 GB at 1,000 classes x 512 features, bench/scale.py), large enough that a
# job's fixed costs (dispatch, the single-thread context) stay small beside its work.
CHUNK_VALUES = 1 << 20
MAX_SEED = 2**31 - 1

Boxes = tuple[np.ndarray, np.ndarray]


def class_rows(
    y_true: np.ndarray, y_pred: np.ndarray, n_classes: int, rows: np.ndarray | None = None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per predicted class, its *good* rows (labelled as predicted) and its *bad* rows
    (another label), ascending; ``rows`` (ascending) restricts them, None takes all.

    One sort for every class rather than one pass over the rows per class.
    """
    r = np.arange(len(y_pred)) if rows is None else np.asarray(rows, dtype=np.int64)
    order = np.argsort(y_pred[r], kind="stable")
    by_class = r[order]
    bounds = np.searchsorted(y_pred[by_class], np.arange(n_classes + 1))
    out = []
    for cls in range(n_classes):
        idx = by_class[bounds[cls] : bounds[cls + 1]]
        good = y_true[idx] == cls
        out.append((idx[good], idx[~good]))
    return out


def class_features(x: np.ndarray, idx: np.ndarray, normalize: str) -> np.ndarray:
    """Rows ``idx`` of one layer's activations, flattened and normalised (row-wise, so the
    same values as normalising every row first); a memory-mapped ``x`` gives its pages
    back after the read (:func:`release_pages`)."""
    rows = np.asarray(x[idx])
    release_pages(x)
    return normalize_features(rows.reshape(len(rows), int(np.prod(x.shape[1:]))), normalize)


# A gather from a memory-mapped array reads the rows of about this many bytes of the array
# at a time, then gives the pages back (release_pages).
GATHER_BYTES = 1 << 24


def gather_rows(x: Any, idx: np.ndarray) -> np.ndarray:
    """``x[idx]`` as an array; from a memory-mapped ``x``, read one range of about
    :data:`GATHER_BYTES` of the array at a time, its pages given back after each
    (:func:`release_pages`). A gather of rows spread over the whole file (a random fifth of
    them, say) would otherwise map nearly every page of it, the kernel faulting in each
    touched page's neighbours: the whole file in the process's resident memory at once."""
    idx = np.asarray(idx, dtype=np.int64)
    if not _mapped(x):
        return np.asarray(x[idx])
    order = np.argsort(idx, kind="stable")
    ranked = idx[order]
    row_bytes = max(1, int(x.itemsize * np.prod(x.shape[1:], dtype=np.int64)))
    step = max(1, GATHER_BYTES // row_bytes)
    out = np.empty((len(idx), *x.shape[1:]), dtype=x.dtype)
    bounds = np.searchsorted(ranked, np.arange(0, len(x) + step, step))
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        if b > a:
            out[order[a:b]] = x[ranked[a:b]]
            release_pages(x)
    return out


def _mapped(array: Any) -> bool:
    """Whether ``array`` is a view of a shared memory map (whose pages release_pages drops)."""
    base = array
    while base is not None and not isinstance(base, mmap.mmap):
        if isinstance(base, np.memmap) and base.mode in ("c", "copyonwrite"):
            return False
        base = getattr(base, "base", None)
    return isinstance(base, mmap.mmap)


def release_pages(array: Any) -> None:
    """Drop this process's resident pages of a memory-mapped array (the OS keeps them
    cached, so reading them again costs little): the rows of a mapped file that the fit
    reads would otherwise count in its memory until the map is closed, whole activation
    matrices where each row is read once. Nothing for other arrays, nor for copy-on-write
    maps (their pages may hold changes)."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if advice is None or not _mapped(array):
        return
    base = array
    while not isinstance(base, mmap.mmap):
        base = base.base
    base.madvise(advice)


@dataclass(frozen=True)
class KindSweep:
    """One class's boxes of one kind (good or bad) at each swept tau.

    ``boxes[i]`` and ``k[i]`` belong to the i-th tau (descending); taus where tau-k-means
    stopped at the same k share one ``(lo, hi)`` pair. A sweep kept to its last tau's
    boxes holds those only (``boxes[-1]``), with every ``k``.
    """

    boxes: list[Boxes]
    k: list[int]


@dataclass(frozen=True)
class ClassTask:
    """One job's share of work: a class of a layer, its rows' features and seeds."""

    layer: int
    cls: int
    good: np.ndarray
    bad: np.ndarray
    seeds: tuple[int, int]
    taus: tuple[float, ...]
    last_only: bool = False


@dataclass(frozen=True)
class KMeansSettings:
    """How each class's tau-k-means runs (:class:`TauKMeansPath`'s parameters)."""

    max_clusters: int
    n_init: int
    max_samples: int | None

    def path(self, x: np.ndarray, seed: int) -> TauKMeansPath:
        return TauKMeansPath(
            x,
            max_clusters=self.max_clusters,
            random_state=seed,
            n_init=self.n_init,
            max_samples=self.max_samples,
        )


def sweep_kind(
    x: np.ndarray,
    taus: Sequence[float],
    seed: int,
    km: KMeansSettings,
    last_only: bool = False,
) -> KindSweep:
    """tau-k-means boxes of ``x`` (n_samples, n_features) at each of ``taus`` (descending),
    swept with one :class:`TauKMeansPath`; ``last_only`` keeps the last tau's boxes only
    (assumes valid input)."""
    d = x.shape[1]
    if len(x) == 0:
        empty = (np.zeros((0, d)), np.zeros((0, d)))
        return KindSweep([empty] * (min(1, len(taus)) if last_only else len(taus)), [0] * len(taus))
    path = km.path(x, seed)
    found = path.sweep(taus)
    made: dict[int, Boxes] = {}
    boxes, ks = [], []
    for i, t in enumerate(taus):
        clustering = found[t]
        ks.append(clustering.k)
        if last_only and i < len(taus) - 1:
            continue
        if id(clustering) not in made:
            made[id(clustering)] = cluster_boxes(x, clustering.labels)
        boxes.append(made[id(clustering)])
    return KindSweep(boxes, ks)


def _sweep_job(
    tasks: list[ClassTask], km: KMeansSettings
) -> list[tuple[int, int, KindSweep, KindSweep]]:
    """Good and bad sweeps of each task, k-means single-threaded."""
    with single_threaded():
        return [
            (
                t.layer,
                t.cls,
                sweep_kind(t.good, t.taus, t.seeds[0], km, t.last_only),
                sweep_kind(t.bad, t.taus, t.seeds[1], km, t.last_only),
            )
            for t in tasks
        ]


def _coverage_job(
    tasks: list[tuple[np.ndarray, int]], km: KMeansSettings, eps_cov: float, eps_ival: float
) -> list[float]:
    """The coverage tau (middle of Algorithm 1's interval) of each ``(good rows, seed)``;
    1 for fewer than two rows."""
    out = []
    with single_threaded():
        for x, seed in tasks:
            if len(x) < 2:
                out.append(1.0)
                continue
            path = km.path(x, seed)
            lo = search_tau_min(path, eps_cov=eps_cov, eps_ival=eps_ival)
            hi = search_tau_max(path, eps_cov=eps_cov, eps_ival=eps_ival)
            out.append(round(0.5 * (lo + hi), 6))
    return out


def _chunked(items: Iterator[tuple[Any, int]]) -> Iterator[list[Any]]:
    """Group ``(item, n_values)`` pairs into lists of about :data:`CHUNK_VALUES` values."""
    chunk: list[Any] = []
    held = 0
    for item, values in items:
        chunk.append(item)
        held += values
        if held >= CHUNK_VALUES:
            yield chunk
            chunk, held = [], 0
    if chunk:
        yield chunk


def _parallel(n_jobs: int | None) -> Parallel:
    """joblib's ``Parallel`` for the per-class jobs: results as they come, and as many jobs
    dispatched ahead as there are workers (each holds its rows here until sent)."""
    return Parallel(n_jobs=n_jobs, return_as="generator", pre_dispatch="n_jobs")


def sweep_classes(
    activations: Mapping[str, np.ndarray],
    layers: Sequence[str],
    groups: Sequence[tuple[np.ndarray, np.ndarray]],
    taus: Sequence[Sequence[Sequence[float]]],
    seeds: np.ndarray,
    *,
    normalize: str,
    km: KMeansSettings,
    n_jobs: int | None,
    last_only: bool = False,
    classes: Sequence[int] | None = None,
) -> Iterator[tuple[int, int, KindSweep, KindSweep]]:
    """``(layer index, class, good, bad)`` sweeps of every layer and class, in that order.

    ``groups``: :func:`class_rows`; ``taus[layer][class]``: the taus to sweep (descending);
    ``seeds``: shape (n_layers, n_classes, 2), the good and bad paths' seeds;
    ``last_only``: return each class's boxes at its last tau only; ``classes``
    (ascending; None: every class) the classes swept.
    """
    wanted = range(len(groups)) if classes is None else classes

    def tasks() -> Iterator[tuple[ClassTask, int]]:
        for li, layer in enumerate(layers):
            x = np.asarray(activations[layer])
            for cls in wanted:
                good, bad = groups[cls]
                task = ClassTask(
                    li,
                    cls,
                    class_features(x, good, normalize),
                    class_features(x, bad, normalize),
                    (int(seeds[li, cls, 0]), int(seeds[li, cls, 1])),
                    tuple(taus[li][cls]),
                    last_only,
                )
                yield task, task.good.size + task.bad.size + 1

    jobs = (delayed(_sweep_job)(chunk, km) for chunk in _chunked(tasks()))
    for done in _parallel(n_jobs)(jobs):
        yield from done


def coverage_taus(
    activations: Mapping[str, np.ndarray],
    layers: Sequence[str],
    groups: Sequence[tuple[np.ndarray, np.ndarray]],
    seeds: np.ndarray,
    *,
    normalize: str,
    km: KMeansSettings,
    eps_cov: float,
    eps_ival: float,
    n_jobs: int | None,
    searched: Sequence[np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Each layer's coverage tau per class (``seeds``: shape (n_layers, n_classes)), from
    its good rows (``groups``: :func:`class_rows`).

    ``searched[layer]`` (None: every class) limits the search to those classes; every other
    class with two good rows or more takes the median of their taus (rounded as they are),
    a class with fewer 1.
    """
    n = len(groups)
    wanted = [
        np.arange(n) if searched is None else np.asarray(searched[i]) for i in range(len(layers))
    ]

    def tasks() -> Iterator[tuple[tuple[np.ndarray, int], int]]:
        for li, layer in enumerate(layers):
            x = np.asarray(activations[layer])
            for cls in wanted[li].tolist():
                feats = class_features(x, groups[cls][0], normalize)
                yield (feats, int(seeds[li, cls])), feats.size + 1

    jobs = (delayed(_coverage_job)(chunk, km, eps_cov, eps_ival) for chunk in _chunked(tasks()))
    flat = iter([tau for done in _parallel(n_jobs)(jobs) for tau in done])
    out = {}
    for li, layer in enumerate(layers):
        found = np.asarray([next(flat) for _ in wanted[li]], dtype=np.float64)
        taus = np.ones(n)
        if len(wanted[li]) < n:
            many = np.asarray([len(good) >= 2 for good, _bad in groups])
            taus[many] = round(float(np.median(found)), 6) if len(found) else 1.0
        taus[wanted[li]] = found
        out[layer] = taus
    return out
