"""Shift versus new kinds of input: a report over the captures, in the monitored layers.

The captured inputs are run through the parent's model and box monitor again (the verdict,
its reason and layer, and each capture's distance to every class's good boxes); the rejected
and uncertain ones are clustered; each cluster is called a **new kind** of input
(Into-the-Unknown's new class, Lukina et al.), a **shift** of a known class, or
**unclear**; and the capture rate per class over time is drawn. docs/monitors.md ("Reading
the capture report") says how to read it.

Distances are in the monitor's own unit: each layer's distance to the nearest good box is
divided by that layer's score scale (the ``target_acceptance`` quantile of the correctly
classified calibration inputs' distances, :meth:`BoxMonitor.calibrate`), and the layers
combine as a root mean square, as the quadratic score does. So 1.0 is as far from a class's
boxes as the farthest 5% of the known, correctly classified inputs reach.
"""

from __future__ import annotations

import base64
import io
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from boxwatch.agent.atomic import write_atomic
from boxwatch.agent.boxes import ACCEPT, NOT_FINITE, BoxRuntime, normalize_features
from boxwatch.agent.errors import BoxwatchError, ConfigError
from boxwatch.agent.runtime import MonitorRuntime
from boxwatch.offline.refit.feedback import CORRECT, NEW, UNKNOWN, WRONG, Captures, LabelledCaptures
from boxwatch.offline.release.report.figures import FIG_DPI
from boxwatch.offline.release.report.markup import CSS, esc, figure, num, omitted, table, text

REPORT_NAME = "capture_report.html"
JSON_NAME = "capture_report.json"
RATE_PLOT = "capture_rate.png"
GROWTH_PLOT = "cluster_growth.png"
PROJECTION_PLOT = "clusters_pca.png"

NEW_KIND, SHIFT, UNCLEAR = "new kind", "shift", "unclear"
BINS = 12  # time bins over the capture window
BATCH = 512  # captures run through the model at once
# A cluster holds at least this many captures, and at least CLUSTER_SHARE of those clustered:
# fewer is no pattern a reviewer can act on.
MIN_CLUSTER = 5
CLUSTER_SHARE = 0.02
# A cluster's centre within this distance (the monitor's unit, see the module docstring) of a
# class's boxes sits where that class's own correct inputs sit: a shift, not a new kind.
NEAR = 1.0
# ... or within FAR of them over all monitored layers together (their root mean square): a
# centre beyond it looks unlike every class (far unknowns: noise images), whatever the
# deepest layer says.
FAR = 2.0
# A cluster grows when its second half of the capture window holds at least this many times
# the captures of its first half, and more of them than the other captures' share in that
# half explains, at most half (one-sided binomial test at GROWTH_P): a handful of
# captures that fall late by chance is no growth. A kind of input that starts a third into
# the window gives 3 to 1 on average, but it often fills most of the captures, the other
# clusters and scattered captures too, and then lifts their share: the bundled example's
# new digit came out at 1.9 to 1 against others 54-67% late, and was missed with 2, 0.001
# and no cap at half. Capped, a traffic that grows by half during the window flags large
# clusters for review (fail-safe: a reviewer's labels then call them a shift).
GROWTH_RATIO = 1.5
GROWTH_P = 0.01
# A class holding this share of a shifted cluster's predictions is named in its verdict.
SHIFT_SHARE = 0.25
# Labels decide a cluster's verdict once this many of its captures are labelled.
MIN_LABELLED = 3
# A reviewer's ``unknown`` is rarely a slip: a cluster where at least MIN_LABELLED of the
# labelled captures, and this share of them, are unknown holds a new kind, even when the
# rest are known inputs (a new class captured among a shift's inputs, which the monitored
# layers do not tell apart). On the closed-loop bench, with 50 captures labelled at random,
# a majority rule called such clusters shifts (4 of 25 labelled unknown on Fashion-MNIST
# under noise, 12 of 27 on MNIST-1D) although the unlabelled report flagged the first.
MIXED_SHARE = 0.1
SAMPLE_IDS = 5  # ids listed per cluster (its earliest captures)
MAX_DIMS = 50  # the clustering's features are projected (PCA) to at most this many
NEAREST_CHUNK = 1024  # rows whose nearest neighbours are found at once
DISTANCE_BLOCK = 1 << 22  # values (rows x classes x features) measured against boxes at once
LABEL_SPLIT = ("correct", "wrong", "unknown", "unlabelled")
_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#ff7f0e")
_NEW_COLOR = "#d62728"


@dataclass(frozen=True)
class ClusterFinding:
    """One cluster of rejected or uncertain captures and what it is taken for."""

    id: int
    size: int
    verdict: str  # "new kind", "shift of class X" (or "classes X, Y") or "unclear"
    why: str  # the figures the verdict rests on, in words
    classes: list[str]  # shift: the classes shifted; new kind and unclear: empty
    predicted: dict[str, int]  # captures per predicted class, most first
    nearest_class: str | None  # the class whose good boxes most of its captures lie nearest
    layer: str | None  # the layer most of its captures fall outside in (the verdict's reason)
    sample_ids: list[str]  # its earliest captures' ids (SAMPLE_IDS of them)
    member_ids: list[str]  # every capture's id, earliest first
    counts: list[int]  # captures per time bin
    early: int  # captures in the first half of the window
    late: int  # captures in the second half
    grows: bool
    centre_distance: float  # its centre's distance to the nearest class's boxes, deepest layer
    centre_overall: float  # the same over all monitored layers (root mean square)
    centre_by_layer: dict[str, float]  # the same in every monitored layer
    member_distance: float  # the median capture's distance to its nearest class's boxes
    labels: dict[str, int]  # LABEL_SPLIT counts of its captures

    @property
    def is_new_kind(self) -> bool:
        return self.verdict == NEW_KIND


@dataclass(frozen=True)
class CaptureReport:
    """The capture report's content: what ``capture_report.json`` holds and the CLI prints."""

    artifact_id: str
    n_captures: int
    n_accepted: int  # captures the parent accepts on a new run (not clustered)
    n_not_finite: int  # captures whose activations are not finite (not clustered)
    n_clustered: int  # rejected or uncertain captures, clustered
    n_scattered: int  # of those, the ones in no cluster
    window_ms: tuple[int, int]  # first and last capture timestamp
    bin_edges_ms: list[int]  # BINS + 1 edges; bin i is [edge i, edge i+1)
    classes: list[str]
    rate: dict[str, list[int]]  # captures per predicted class per time bin
    rate_by_label: dict[str, dict[str, list[int]]] | None  # class -> LABEL_SPLIT -> per bin
    clusters: list[ClusterFinding]
    problems: list[str]  # the captures' and the join's problems, as given

    @property
    def new_kinds(self) -> list[ClusterFinding]:
        """The clusters flagged as a new kind of input."""
        return [c for c in self.clusters if c.is_new_kind]

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able content (``capture_report.json``)."""
        out = asdict(self)
        out["window_ms"] = list(self.window_ms)
        out["format"] = "boxwatch.capture_report"
        out["version"] = 1
        return out

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, indent 2, trailing newline."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2, allow_nan=False) + "\n"

    def table(self) -> tuple[list[str], list[list[str]]]:
        """One row per cluster (header, rows): what a terminal shows."""
        header = ["cluster", "size", "verdict", "nearest", "layer", "grows", "distance", "ids"]
        rows = [
            [
                str(c.id),
                str(c.size),
                c.verdict,
                str(c.nearest_class),
                str(c.layer),
                "yes" if c.grows else "no",
                f"{c.centre_distance:.2f}",
                ", ".join(c.sample_ids[:3]),
            ]
            for c in self.clusters
        ]
        return header, rows


@dataclass(frozen=True)
class _Measured:
    """The parent's view of every capture (rows in capture order)."""

    predicted: np.ndarray  # (n,) int64
    verdicts: np.ndarray  # (n,) int8
    reasons: np.ndarray  # (n,) int8 reason codes
    layers: list[str | None]  # the layer each verdict's reason points at
    feats: dict[str, np.ndarray]  # monitored layer -> (n, n_features) normalised, float32
    distance: np.ndarray  # (n, n_classes) to each class's good boxes, the monitor's unit


def capture_report(
    runtime: MonitorRuntime,
    captures: Captures,
    *,
    labelled: LabelledCaptures | None = None,
    out_dir: str | Path,
    bins: int = BINS,
    batch_size: int = BATCH,
) -> CaptureReport:
    """Cluster the captures the parent rejects, tell shift from new kinds, write the report.

    Writes ``out_dir/capture_report.html`` (self-contained), ``capture_report.json`` and the
    plots as PNG files; returns the report's content.

    Parameters
    ----------
    runtime : MonitorRuntime
        The parent artifact as the agent loads it (model tap, box monitor, classes).
    captures : Captures
        The captured inputs, raw, with their timestamps.
    labelled : LabelledCaptures, optional
        Reviewers' labels joined by id (any subset of the captures): they decide a cluster's
        verdict once :data:`MIN_LABELLED` of its captures are labelled, and split the
        capture rate into correct / wrong / unknown.
    out_dir : path
        The report folder (created when missing).
    bins : int
        Time bins over the capture window.
    batch_size : int
        Captures run through the model at once.
    """
    boxes = runtime.boxes
    if runtime.tap is None or boxes is None or runtime.preprocessing is None:
        raise ConfigError("the capture report needs an artifact that monitors a model")
    if bins < 1 or batch_size < 1:
        raise ConfigError(f"bins={bins} and batch_size={batch_size} should be >= 1")
    n = len(captures.ids)
    if len(captures.inputs) != n or len(captures.timestamps_ms) != n:
        raise ConfigError(
            f"captures hold {n} ids, {len(captures.inputs)} inputs and "
            f"{len(captures.timestamps_ms)} timestamps"
        )
    classes = [str(c) for c in runtime.classes] or [str(k) for k in range(boxes.n_classes)]
    m = _measure(runtime, boxes, np.asarray(captures.inputs), batch_size)
    t = np.asarray(captures.timestamps_ms, dtype=np.int64)
    edges, at, late = _time_bins(t, bins)
    finite = m.reasons != NOT_FINITE
    rows = np.flatnonzero((m.verdicts != ACCEPT) & finite)
    embedding = _embedding(boxes, m.feats, rows)
    cluster_of = _clusters(embedding)
    label_kinds = _label_kinds(captures.ids, labelled)
    clusters = []
    order = np.argsort(t, kind="stable")
    first_seen = np.empty(n, dtype=np.int64)
    first_seen[order] = np.arange(n)
    for j in range(int(cluster_of.max(initial=-1)) + 1):
        members = rows[cluster_of == j]
        clusters.append(
            _finding(
                members[np.argsort(first_seen[members], kind="stable")],
                m,
                boxes,
                classes,
                captures.ids,
                labelled,
                label_kinds,
                at,
                late,
                bins,
                _late_share_of_others(late, rows, members),
            )
        )
    clusters.sort(key=lambda c: (-c.size, first_seen[captures.ids.index(c.sample_ids[0])]))
    clusters = [_renumbered(c, k) for k, c in enumerate(clusters)]
    rate = {
        name: np.bincount(at[m.predicted == k], minlength=bins).tolist()
        for k, name in enumerate(classes)
    }
    by_label = None
    if labelled is not None:
        by_label = {
            name: {
                kind: np.bincount(
                    at[(m.predicted == k) & (label_kinds == kind)], minlength=bins
                ).tolist()
                for kind in LABEL_SPLIT
            }
            for k, name in enumerate(classes)
        }
    report = CaptureReport(
        artifact_id=runtime.artifact_id,
        n_captures=n,
        n_accepted=int(np.sum((m.verdicts == ACCEPT) & finite)),
        n_not_finite=int(np.sum(~finite)),
        n_clustered=len(rows),
        n_scattered=int(np.sum(cluster_of < 0)),
        window_ms=(int(t.min(initial=0)), int(t.max(initial=0))),
        bin_edges_ms=edges,
        classes=classes,
        rate=rate,
        rate_by_label=by_label,
        clusters=clusters,
        problems=[*captures.problems, *(labelled.problems if labelled is not None else [])],
    )
    cluster_ids = _cluster_ids(report, captures.ids, rows)
    _write(report, Path(out_dir), embedding, cluster_ids, at, bins)
    return report


def _measure(runtime: MonitorRuntime, boxes: BoxRuntime, x: np.ndarray, batch: int) -> _Measured:
    """The parent's verdict, reason, prediction and monitored features of every input, in
    batches, and each input's distance to every class's good boxes."""
    assert runtime.tap is not None and runtime.preprocessing is not None  # checked by the caller
    n = len(x)
    predicted = np.zeros(n, dtype=np.int64)
    verdicts = np.zeros(n, dtype=np.int8)
    reasons = np.zeros(n, dtype=np.int8)
    layers: list[str | None] = []
    feats = {layer: [] for layer in boxes.layers}  # type: dict[str, list[np.ndarray]]
    for s in range(0, n, batch):
        with np.errstate(over="ignore", invalid="ignore"):  # non-finite rows: not_finite
            pre = runtime.preprocessing.apply(x[s : s + batch])
            logits, acts = runtime.tap.run(pre)
            logits = np.asarray(logits)
            y = logits.argmax(axis=1)
            v, _per, _scores, why = boxes.explain(acts, y, logits=logits)
        predicted[s : s + len(y)], verdicts[s : s + len(y)] = y, v
        reasons[s : s + len(y)] = why.codes
        layers += why.layers()
        for layer in boxes.layers:
            a = np.asarray(acts[layer])
            feats[layer].append(normalize_features(a.reshape(len(a), -1), boxes.normalize))
    joined = {
        layer: np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
        for layer, parts in feats.items()
    }
    for layer, f in joined.items():  # a non-finite value anywhere: nothing measured is trusted
        bad = np.asarray(~np.isfinite(f).all(axis=1), dtype=bool)
        reasons[bad] = NOT_FINITE
        joined[layer] = np.where(bad[:, None], 0.0, f).astype(np.float32)
    return _Measured(
        predicted, verdicts, reasons, layers, joined, _class_distances(boxes, joined, n)
    )


def _scale(boxes: BoxRuntime, layer: str) -> float:
    """The layer's distance unit: its calibrated score scale (1 where it has none)."""
    s = boxes.score_scales.get(layer, 1.0)
    return float(s) if s > 0 and math.isfinite(s) else 1.0


def _class_distances(boxes: BoxRuntime, feats: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """Distance of each row of ``feats`` to each class's good boxes, the monitor's unit;
    ``inf`` to a class without boxes. Rows go in blocks of about :data:`DISTANCE_BLOCK`
    values (a row repeated once per class), so memory stays bounded at any class count."""
    k = boxes.n_classes
    cols = np.arange(k)
    total = np.zeros((n, k))
    for layer in boxes.layers:
        f = feats[layer]
        step = max(1, DISTANCE_BLOCK // max(1, k * f.shape[1]))
        for s in range(0, n, step):
            part = f[s : s + step]
            d = boxes.good[layer].distance(np.repeat(part, k, axis=0), np.tile(cols, len(part)))
            total[s : s + len(part)] += (d.reshape(len(part), k) / _scale(boxes, layer)) ** 2
    return np.sqrt(total / max(1, len(boxes.layers)))


def _time_bins(t: np.ndarray, bins: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Bin edges over the window, each timestamp's bin, and whether it lies in the window's
    second half."""
    t0, t1 = (int(t.min()), int(t.max())) if len(t) else (0, 0)
    width = max(1, -(-(t1 - t0 + 1) // bins))
    edges = [t0 + width * i for i in range(bins + 1)]
    at = np.minimum((t - t0) // width, bins - 1).astype(np.int64)
    late = 2 * (t - t0) >= t1 - t0 + 1
    return edges, at, late


def _embedding(boxes: BoxRuntime, feats: Mapping[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """The clustered captures' features: each monitored layer's in the monitor's unit,
    side by side (so the Euclidean distance is the RMS over layers, as the score combines
    them), projected to at most :data:`MAX_DIMS` principal components."""
    if not len(rows):
        return np.zeros((0, 2))
    scale = math.sqrt(max(1, len(boxes.layers)))
    z = np.concatenate(
        [feats[layer][rows] / (_scale(boxes, layer) * scale) for layer in boxes.layers], axis=1
    ).astype(np.float64)
    if z.shape[1] > MAX_DIMS and len(z) > MAX_DIMS:
        from sklearn.decomposition import PCA

        z = PCA(n_components=MAX_DIMS, svd_solver="full").fit_transform(z)
    return z


def _clusters(z: np.ndarray) -> np.ndarray:
    """Cluster label of each row (-1: scattered, in no cluster).

    HDBSCAN: a density clustering, so no cluster count is asked for, inputs that fit no
    group stay scattered instead of being forced into one (ordinary rejects are sparse; a
    new kind of input arrives as a dense group), and it is deterministic. The smallest
    cluster is :data:`MIN_CLUSTER` captures or :data:`CLUSTER_SHARE` of them.
    """
    size = max(MIN_CLUSTER, math.ceil(CLUSTER_SHARE * len(z)))
    if len(z) < max(2, size):
        return np.full(len(z), -1, dtype=np.int64)
    from sklearn.cluster import HDBSCAN

    found = HDBSCAN(min_cluster_size=size, min_samples=MIN_CLUSTER, copy=True).fit_predict(z)
    return _attached(z, np.asarray(found, dtype=np.int64))


def _attached(z: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``labels`` with each scattered row joined to the cluster of its nearest clustered row
    when it is no farther from it than that cluster's members are from one another (the
    largest distance from a member to its nearest other member): HDBSCAN leaves the fringe
    of a group scattered, yet those captures are of the group as much as its core."""
    out = labels.copy()
    scattered = np.flatnonzero(labels < 0)
    clustered = np.flatnonzero(labels >= 0)
    if not len(scattered) or not len(clustered):
        return out
    reach = np.zeros(int(labels.max()) + 1)
    for k in range(len(reach)):
        own = z[labels == k]
        gaps = _nearest(own, own, exclude_self=True)[0]
        reach[k] = float(gaps.max()) if len(gaps) else 0.0
    dist, idx = _nearest(z[scattered], z[clustered])
    k = labels[clustered[idx]]
    near = dist <= reach[k]
    out[scattered[near]] = k[near]
    return out


def _nearest(
    a: np.ndarray, b: np.ndarray, *, exclude_self: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Distance from each row of ``a`` to its nearest row of ``b`` and that row's index,
    in chunks (``exclude_self``: ``a`` is ``b``, a row is not its own neighbour)."""
    dist = np.empty(len(a))
    idx = np.empty(len(a), dtype=np.int64)
    b2 = np.einsum("ij,ij->i", b, b)
    for start in range(0, len(a), NEAREST_CHUNK):
        part = a[start : start + NEAREST_CHUNK]
        d2 = np.einsum("ij,ij->i", part, part)[:, None] + b2[None, :] - 2.0 * part @ b.T
        if exclude_self:
            rows = np.arange(len(part))
            d2[rows, start + rows] = np.inf
        idx[start : start + len(part)] = d2.argmin(axis=1)
        dist[start : start + len(part)] = np.sqrt(np.maximum(d2.min(axis=1), 0.0))
    return dist, idx


def _label_kinds(ids: Sequence[str], labelled: LabelledCaptures | None) -> np.ndarray:
    """Each capture's :data:`LABEL_SPLIT` kind (``new`` counts as unknown)."""
    out = np.full(len(ids), "unlabelled", dtype=object)
    if labelled is None:
        return out
    where = {i: k for k, i in enumerate(ids)}
    for label in labelled.labels:
        if label.id in where:
            out[where[label.id]] = UNKNOWN if label.kind in (UNKNOWN, NEW) else label.kind
    return out


def _finding(
    members: np.ndarray,
    m: _Measured,
    boxes: BoxRuntime,
    classes: list[str],
    ids: Sequence[str],
    labelled: LabelledCaptures | None,
    label_kinds: np.ndarray,
    at: np.ndarray,
    late: np.ndarray,
    bins: int,
    base_late: float,
) -> ClusterFinding:
    """What one cluster (``members``, earliest first) holds and the verdict it gets
    (``base_late``: the other captures' share in the window's second half, at most half)."""
    predicted = Counter(m.predicted[members].tolist())
    nearest = Counter(m.distance[members].argmin(axis=1).tolist())
    layer = Counter(name for name in (m.layers[i] for i in members) if name is not None)
    n_late = int(late[members].sum())
    n_early = len(members) - n_late
    grows = _grows(n_early, n_late, base_late)
    by_layer = _centre_distances(boxes, m, members)
    centre = by_layer[boxes.layers[-1]]
    overall = _finite(math.sqrt(sum(min(v, 1e150) ** 2 for v in by_layer.values()) / len(by_layer)))
    member = float(np.median(m.distance[members].min(axis=1)))
    kinds = Counter(label_kinds[members].tolist())
    split = {kind: int(kinds.get(kind, 0)) for kind in LABEL_SPLIT}
    verdict, why, shifted = _verdict(
        members,
        m,
        classes,
        labelled,
        ids,
        split,
        predicted,
        grows,
        (centre, overall),
        n_early,
        n_late,
    )
    return ClusterFinding(
        id=0,
        size=len(members),
        verdict=verdict,
        why=why,
        classes=shifted,
        predicted={classes[k]: c for k, c in _ranked(predicted)},
        nearest_class=classes[_ranked(nearest)[0][0]] if nearest else None,
        layer=_ranked(layer)[0][0] if layer else None,
        sample_ids=[ids[i] for i in members[:SAMPLE_IDS]],
        member_ids=[ids[i] for i in members],
        counts=np.bincount(at[members], minlength=bins).tolist(),
        early=n_early,
        late=n_late,
        grows=bool(grows),
        centre_distance=centre,
        centre_overall=overall,
        centre_by_layer=by_layer,
        member_distance=_finite(member),
        labels=split,
    )


def _late_share_of_others(late: np.ndarray, rows: np.ndarray, members: np.ndarray) -> float:
    """The share of the other captures (clustered or scattered) in the window's second half,
    at most half: what a cluster's own share is compared with (a quieter afternoon makes
    every cluster early; a new kind that fills the other captures too makes them late, see
    GROWTH_P); half where fewer than :data:`MIN_CLUSTER` others are left."""
    others = np.setdiff1d(rows, members)
    return min(float(late[others].mean()), 0.5) if len(others) >= MIN_CLUSTER else 0.5


def _grows(n_early: int, n_late: int, base_late: float) -> bool:
    """Whether a cluster's captures come late: at least :data:`GROWTH_RATIO` times as many in
    the window's second half as in its first, and more than ``base_late`` explains."""
    n = n_early + n_late
    if n == 0 or n_late <= n_early or n_late < GROWTH_RATIO * n_early:
        return False
    from scipy.stats import binomtest

    base = min(max(base_late, 0.0), 1.0 - 1e-9)
    return bool(binomtest(n_late, n, base, alternative="greater").pvalue < GROWTH_P)


def _ranked(counts: Counter) -> list[tuple[Any, int]]:
    """``counts`` most first, ties in key order (deterministic)."""
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _finite(value: float) -> float:
    """A JSON-safe figure: infinity (a class without boxes) as a large number."""
    return float(value) if math.isfinite(value) else 1e300


def _centre_distances(boxes: BoxRuntime, m: _Measured, members: np.ndarray) -> dict[str, float]:
    """How far the cluster's centre lies from the known classes' boxes, per monitored layer.

    Its captures are grouped by predicted class; each group's centre (the mean of its
    features, normalised again as the boxes see features) is measured against every
    class's boxes and the nearest counts; the groups weigh by size. Noise around a class
    averages out in the centre, which then lies among that class's boxes; a new kind of
    input keeps its centre away from all of them.
    """
    groups, weights = np.unique(m.predicted[members], return_counts=True)
    out = {}
    for layer in boxes.layers:
        f = m.feats[layer][members]
        mean = np.stack([f[m.predicted[members] == g].mean(axis=0) for g in groups])
        centres = normalize_features(mean, boxes.normalize)
        cols = np.arange(boxes.n_classes)
        d = boxes.good[layer].distance(
            np.repeat(centres, len(cols), axis=0), np.tile(cols, len(groups))
        ).reshape(len(groups), len(cols)).min(axis=1) / _scale(boxes, layer)
        out[layer] = _finite(float(np.sum(weights * d) / weights.sum()))
    return out


def _verdict(
    members: np.ndarray,
    m: _Measured,
    classes: list[str],
    labelled: LabelledCaptures | None,
    ids: Sequence[str],
    split: Mapping[str, int],
    predicted: Counter,
    grows: bool,
    centre: tuple[float, float],
    early: int,
    late: int,
) -> tuple[str, str, list[str]]:
    """``(verdict, why, shifted classes)`` of one cluster.

    Labels decide where :data:`MIN_LABELLED` captures are labelled: mostly ``unknown`` or
    ``new:``, or at least :data:`MIN_LABELLED` and :data:`MIXED_SHARE` of them (a new kind
    among known inputs) -> new kind; else a shift of the classes they truly are. Without:
    a cluster that grows -> new kind (what Into-the-Unknown calls a new class: a network
    often files one among a known class's boxes, so where it lies cannot clear it; a shift
    that sets in during the window grows too, and its labels, mostly ``correct``, then
    call it a shift);
    else, in the deepest monitored layer (what the model tells classes apart by: a shift of
    how inputs look fades there) and over all layers together (``centre``: both
    distances), a centre within :data:`NEAR` in the deepest layer and :data:`FAR` over all
    -> shift of the classes it is predicted as; else unclear.
    """
    n_labelled = sum(split[k] for k in ("correct", "wrong", "unknown"))
    timing = f"{early} captures in the window's first half, {late} in its second"
    if labelled is not None and n_labelled >= MIN_LABELLED:
        unknown = split["unknown"]
        truth = Counter(_true_classes(members, m, labelled, ids, classes))
        shifted = _named(truth, sum(truth.values()))
        if 2 * unknown > n_labelled or (
            unknown >= MIN_LABELLED and unknown >= MIXED_SHARE * n_labelled
        ):
            mine = {ids[i] for i in members}
            tags = Counter(
                label.tag
                for label in labelled.labels
                if label.kind == NEW and label.tag and label.id in mine
            )
            tag = f" ({_ranked(tags)[0][0]!r})" if tags else ""
            why = f"{unknown} of its {n_labelled} labelled captures are unknown{tag}"
            if 2 * unknown <= n_labelled and shifted:
                why += f", among known inputs labelled as {', '.join(shifted)}"
            return NEW_KIND, f"{why}; {timing}", []
        why = (
            f"{split['correct']} of its {n_labelled} labelled captures are correct, "
            f"{split['wrong']} wrong; labelled as {', '.join(shifted)}"
        )
        return _shift(shifted), why, shifted
    deep, overall = centre
    where = (
        f"centre {deep:.2f} from the nearest class's boxes in the deepest layer (near: <= "
        f"{NEAR}), {overall:.2f} over all layers (near: <= {FAR})"
    )
    if grows:
        return NEW_KIND, f"grows: {timing}; {where}", []
    if deep <= NEAR and overall <= FAR:
        shifted = _named(Counter({classes[k]: c for k, c in predicted.items()}), len(members))
        return _shift(shifted), f"{where}, predicted as {', '.join(shifted)}; {timing}", shifted
    return UNCLEAR, f"{where}, but does not grow: {timing}", []


def _true_classes(
    members: np.ndarray,
    m: _Measured,
    labelled: LabelledCaptures,
    ids: Sequence[str],
    classes: list[str],
) -> list[str]:
    """The true class of each labelled known capture of ``members`` (correct: predicted)."""
    by_id = {label.id: label for label in labelled.labels}
    out = []
    for i in members:
        label = by_id.get(ids[i])
        if label is not None and label.kind == CORRECT:
            out.append(classes[int(m.predicted[i])])
        elif label is not None and label.kind == WRONG and label.true_class is not None:
            out.append(label.true_class)
    return out


def _named(counts: Counter, total: int) -> list[str]:
    """The classes holding :data:`SHIFT_SHARE` of ``total`` (at least the largest)."""
    ranked = _ranked(counts)
    named = [c for c, k in ranked if k >= SHIFT_SHARE * total]
    return [str(c) for c in (named or [ranked[0][0]])] if ranked else []


def _shift(shifted: list[str]) -> str:
    if len(shifted) == 1:
        return f"{SHIFT} of class {shifted[0]}"
    return f"{SHIFT} of classes {', '.join(shifted)}"


def _renumbered(c: ClusterFinding, k: int) -> ClusterFinding:
    return ClusterFinding(**{**asdict(c), "id": k})


def _cluster_ids(report: CaptureReport, ids: Sequence[str], rows: np.ndarray) -> np.ndarray:
    """Each clustered row's cluster id in the report (-1: scattered)."""
    of = {i: c.id for c in report.clusters for i in c.member_ids}
    return np.array([of.get(ids[i], -1) for i in rows], dtype=np.int64)


# -- the page and its plots -------------------------------------------------------------------
def _write(
    report: CaptureReport,
    out: Path,
    embedding: np.ndarray,
    cluster_ids: np.ndarray,
    at: np.ndarray,
    bins: int,
) -> None:
    """Render the plots, the page and the JSON, then write them (atomically, each)."""
    plots = {
        RATE_PLOT: _png(_rate_figure(report, bins)),
        GROWTH_PLOT: _png(_growth_figure(report, bins)),
        PROJECTION_PLOT: _png(_projection_figure(report, embedding, cluster_ids)),
    }
    files = {**plots, JSON_NAME: report.to_json().encode(), REPORT_NAME: _page(report, plots)}
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            write_atomic(out / name, data, mode=0o644)
    except OSError as exc:
        raise BoxwatchError(f"cannot write the capture report in {out}: {exc}") from None


def _png(fig: Figure) -> bytes:
    """PNG bytes, as the build report draws them (no timestamp or version metadata)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=FIG_DPI, metadata={"Software": None})
    return buf.getvalue()


def _time_labels(report: CaptureReport) -> list[str]:
    """Each bin's start, in seconds from the first capture."""
    t0 = report.bin_edges_ms[0]
    return [f"{(e - t0) / 1000:.0f}" for e in report.bin_edges_ms[:-1]]


def _rate_figure(report: CaptureReport, bins: int) -> Figure:
    """Captures per predicted class per time bin (a heat map); with labels, beside it the
    share of each class's captures labelled correct / wrong / unknown."""
    labelled = report.rate_by_label is not None
    fig = Figure(
        layout="constrained", figsize=(9.5 if labelled else 7.0, 0.35 * len(report.classes) + 2)
    )
    axes = fig.subplots(1, 2, width_ratios=(3, 1.4)) if labelled else [fig.subplots()]
    counts = np.array([report.rate[c] for c in report.classes], dtype=float).reshape(-1, bins)
    ax = axes[0]
    image = ax.imshow(counts, aspect="auto", cmap="Reds", interpolation="nearest")
    ax.set_yticks(range(len(report.classes)), report.classes)
    step = max(1, bins // 6)
    ax.set_xticks(range(0, bins, step), _time_labels(report)[::step])
    ax.set_xlabel("time since the first capture (s), bin start")
    ax.set_ylabel("predicted class")
    ax.set_title("captures per class over time", fontsize=9)
    fig.colorbar(image, ax=ax, label="captures")
    if report.rate_by_label is not None:
        ax = axes[1]
        y = np.arange(len(report.classes))
        left = np.zeros(len(report.classes))
        colors = {"correct": "#2ca02c", "wrong": "#ff7f0e", "unknown": _NEW_COLOR}
        colors["unlabelled"] = "#cccccc"
        for kind in LABEL_SPLIT:
            width = np.array([sum(report.rate_by_label[c][kind]) for c in report.classes])
            ax.barh(y, width, left=left, color=colors[kind], label=kind)
            left += width
        ax.set_yticks(y, report.classes)
        ax.invert_yaxis()
        ax.set_xlabel("captures")
        ax.set_title("labels per class", fontsize=9)
        ax.legend(fontsize=7)
    return fig


def _style(c: ClusterFinding, k: int) -> dict[str, Any]:
    """How a cluster is drawn: new kinds red and bold, shifts dashed, the rest thin."""
    if c.is_new_kind:
        return {"color": _NEW_COLOR, "linewidth": 2.4, "linestyle": "-"}
    dashed = c.verdict.startswith(SHIFT)
    return {
        "color": _COLORS[k % len(_COLORS)],
        "linewidth": 1.3,
        "linestyle": "--" if dashed else ":",
    }


def _growth_figure(report: CaptureReport, bins: int) -> Figure:
    """Captures per time bin of each cluster; new kinds in red."""
    fig = Figure(layout="constrained", figsize=(7.0, 3.4))
    ax = fig.subplots()
    for k, c in enumerate(report.clusters):
        ax.plot(range(bins), c.counts, marker=".", label=f"#{c.id} {c.verdict}", **_style(c, k))
    step = max(1, bins // 6)
    ax.set_xticks(range(0, bins, step), _time_labels(report)[::step])
    ax.set_xlabel("time since the first capture (s), bin start")
    ax.set_ylabel("captures per bin")
    ax.set_title("cluster growth", fontsize=9)
    ax.grid(alpha=0.3)
    if report.clusters:
        ax.legend(fontsize=7, loc="upper left")
    return fig


def _projection_figure(report: CaptureReport, z: np.ndarray, cluster_ids: np.ndarray) -> Figure:
    """The clustered captures on their first two principal components, by cluster; new
    kinds in red with their number at the centre, scattered captures in grey."""
    fig = Figure(layout="constrained", figsize=(6.0, 4.6))
    ax = fig.subplots()
    if len(z) >= 2:
        from sklearn.decomposition import PCA

        xy = PCA(n_components=2, svd_solver="full").fit_transform(z)
    else:
        xy = np.zeros((len(z), 2))
    loose = cluster_ids < 0
    ax.scatter(xy[loose, 0], xy[loose, 1], s=8, color="#bbbbbb", label="scattered")
    for k, c in enumerate(report.clusters):
        at = cluster_ids == c.id
        style = _style(c, k)
        ax.scatter(
            xy[at, 0],
            xy[at, 1],
            s=18 if c.is_new_kind else 12,
            color=style["color"],
            marker="^" if c.is_new_kind else "o",
            label=f"#{c.id} {c.verdict}",
        )
        cx, cy = xy[at].mean(axis=0)
        ax.annotate(f"#{c.id}", (cx, cy), fontsize=9, fontweight="bold", ha="center")
    ax.set_xlabel("principal component 1")
    ax.set_ylabel("principal component 2")
    ax.set_title("rejected captures in the monitored layers (PCA)", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    return fig


def _page(report: CaptureReport, plots: Mapping[str, bytes]) -> bytes:
    """The report as one self-contained HTML page (the plots embedded, also beside it)."""
    uri = {
        name: "data:image/png;base64," + base64.b64encode(b).decode() for name, b in plots.items()
    }
    items = [
        ("Artifact id", text("artifact-id", report.artifact_id)),
        ("Captures", num("n-captures", report.n_captures)),
        ("Accepted by the parent on a new run", num("n-accepted", report.n_accepted)),
        ("Not finite", num("n-not-finite", report.n_not_finite)),
        ("Rejected or uncertain, clustered", num("n-clustered", report.n_clustered)),
        ("Scattered (in no cluster)", num("n-scattered", report.n_scattered)),
        ("New kinds flagged", num("n-new-kinds", len(report.new_kinds))),
        ("Window (ms)", text("window", f"{report.window_ms[0]} \u2013 {report.window_ms[1]}")),
    ]
    dl = "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in items)
    rows = [
        [
            text(f"cluster-{c.id}-id", f"#{c.id}"),
            num(f"cluster-{c.id}-size", c.size),
            f'<span id="cluster-{c.id}-verdict" class="{"violated" if c.is_new_kind else ""}">'
            f"{esc(c.verdict)}</span><br><small>{esc(c.why)}</small>",
            esc(", ".join(f"{k}: {v}" for k, v in c.predicted.items())),
            text(f"cluster-{c.id}-nearest", c.nearest_class),
            text(f"cluster-{c.id}-layer", c.layer),
            num(f"cluster-{c.id}-centre", c.centre_distance),
            num(f"cluster-{c.id}-member", c.member_distance),
            f"<code>{esc(', '.join(c.sample_ids))}</code>",
        ]
        for c in report.clusters
    ]
    header = [
        "Cluster",
        "Size",
        "Verdict",
        "Predicted as",
        "Nearest class",
        "Layer",
        "Centre distance",
        "Median distance",
        "Earliest ids",
    ]
    numeric = (False, True, False, False, False, False, True, True, False)
    clusters = (
        table(header, rows, numeric=numeric, table_id="clusters")
        if rows
        else omitted("clusters-omitted", "No cluster: too few rejected captures, or none grouped.")
    )
    problems = "".join(f"<li>{esc(p)}</li>" for p in report.problems)
    body = (
        "<header><h1>Capture report</h1><p>Captured inputs the parent rejects, clustered in "
        "its monitored layers: a cluster is a <b>new kind</b> of input, a <b>shift</b> of a "
        "known class, or <b>unclear</b> (docs/monitors.md, \u201cReading the capture "
        f'report\u201d).</p><dl class="meta">{dl}</dl></header>'
        f'<section id="clusters-section"><h2>Clusters</h2>{clusters}'
        "<p>Distances are in the monitor's unit: 1 is as far from a class's good boxes as "
        "the farthest 5% of its correctly classified calibration inputs.</p></section>"
        '<section id="figures"><h2>Over time and in the monitored layers</h2>'
        + figure(
            "fig-rate",
            uri[RATE_PLOT],
            "captures per class over time",
            "Captures per predicted class per time bin. A shift shows as one class's row "
            "darkening (with labels: mostly correct); a new kind as several rows darkening "
            "together (with labels: unknown).",
        )
        + figure(
            "fig-growth",
            uri[GROWTH_PLOT],
            "cluster growth",
            "Captures per time bin of each cluster; new kinds in red.",
        )
        + figure(
            "fig-projection",
            uri[PROJECTION_PLOT],
            "clusters in the monitored layers",
            "The clustered captures on the first two principal components of the monitored "
            "layers' features; new kinds as red triangles, scattered captures in grey.",
        )
        + "</section>"
        + (
            f'<section id="problems"><h2>Problems</h2><ul>{problems}</ul></section>'
            if problems
            else ""
        )
    )
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>boxwatch capture report</title><style>{CSS}</style></head>"
        f"<body>{body}</body></html>\n"
    )
    return page.encode("utf-8")
