"""The monitor half of a build: activations, box monitors, calibration and evaluation.

Validation inputs (known classes only, by default) choose tau per layer by held-out-class
validation, or per class and layer by F1 with unknown inputs labelled -1
(``selection: f1``), and calibrate the score threshold; the same inputs, with the unknown
ones, give the report's curves and operating point. Without a validation set the coverage
search picks tau and calibration uses the training inputs (the summary says so).

The estimator is built from the config's ``monitor`` section
(:meth:`~.records.MonitorSection.estimator`); every parameter the build needs afterwards
(candidate taus, target acceptance, seed) is read back from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
from joblib import Parallel, delayed
from msgspec import UNSET, UnsetType

from boxwatch.agent.boxes import ACCEPT, normalize_features
from boxwatch.agent.taps import INPUT_LAYER, pool
from boxwatch.offline.monitors.coverage import coverage_at
from boxwatch.offline.monitors.estimator import BoxMonitor, Calibration, build_sweep
from boxwatch.offline.monitors.evaluation import detection, outcomes_per_class, total
from boxwatch.offline.monitors.perclass import CHUNK_VALUES
from boxwatch.offline.monitors.taukmeans import TauKMeansPath, single_threaded
from boxwatch.offline.progress import Progress, tick
from boxwatch.offline.release.records import (
    Accuracy,
    BoxCounts,
    CalibrationSummary,
    CoverageCurve,
    DetectionSummary,
    Histogram,
    ModelInputs,
    MonitorFit,
    MonitorSection,
    OutcomeCurve,
    ShareChoice,
    Shares,
    candidate_taus,
)

UNKNOWN_LABEL = -1
COVERAGE_MEASURE = "per-dimension geometric mean of the upper coverage bound r_u"
HISTOGRAM_BINS = 30
# Rows per class the coverage curve's k-means path runs on at most (a figure of the report,
# not the artifact; the path's cost grows with rows times clusters).
MAX_COVERAGE_ROWS = 5000
HELD_OUT = "train (held out)"
# What BoxMonitor.fit and calibrate take: activations by layer, labels, predictions, logits.
FitData = tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True)
class Tapped:
    """One data set through the model: activations by layer, logits, predictions, labels."""

    acts: dict[str, np.ndarray]
    logits: np.ndarray
    pred: np.ndarray
    y: np.ndarray | None

    def rows(self, idx: np.ndarray | slice) -> Tapped:
        """The rows ``idx`` of this set (a view for a slice)."""
        return Tapped(
            {k: v[idx] for k, v in self.acts.items()},
            self.logits[idx],
            self.pred[idx],
            None if self.y is None else self.y[idx],
        )

    @property
    def labels(self) -> np.ndarray:
        """The labels of a labelled set (train, validation)."""
        assert self.y is not None
        return self.y

    def fit_data(self) -> FitData:
        """(activations, labels, predictions, logits), as the estimator takes them."""
        return self.acts, self.labels, self.pred, self.logits


@dataclass
class MonitorOutcome:
    """The fitted monitor and what the artifact and report say about it."""

    monitor: BoxMonitor
    accuracy: Accuracy
    contents: dict[str, Any]
    summary: MonitorFit
    logits: dict[str, np.ndarray] = field(default_factory=dict)
    calibration_rows: dict[str, np.ndarray] = field(default_factory=dict)
    # Each set's monitored-layer activations (the report's feature baselines read them).
    acts: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def members(self, prefix: str) -> dict[str, Any]:
        return self.monitor.to_members(prefix)


def _finite(v: float | None) -> float | None:
    return None if v is None or not np.isfinite(v) else float(v)


@dataclass(frozen=True)
class _Sets:
    """The tapped data sets a monitor is fitted, selected, calibrated and evaluated on."""

    train: Tapped
    validation: Tapped | None
    unknown: Tapped | None  # data.unknown (the other unknown sets serve the emitted verdicts)
    evaluation: Tapped | None  # validation inputs, then data.unknown's labelled -1

    @classmethod
    def of(cls, tapped: dict[str, Tapped], evaluation: Tapped | None) -> _Sets:
        validation, unknown = tapped.get("validation"), tapped.get("unknown")
        if evaluation is None:
            evaluation = validation
        return cls(tapped["train"], validation, unknown, evaluation)


def fit_monitors(
    mi: ModelInputs,
    params: MonitorSection,
    *,
    extract: Callable[..., tuple[np.ndarray, dict[str, np.ndarray]]],
    progress: Progress | None = None,
) -> MonitorOutcome:
    """Fit, select, calibrate and evaluate the box monitors of a validated model config;
    ``progress`` shows each phase (default: nothing shown)."""
    progress = Progress(mode="off") if progress is None else progress
    tapped, evaluation = _tap_sets(mi, extract, progress)
    sets = _Sets.of(tapped, evaluation)
    # The sweep counts one step per layer, class and kind of box (good, bad).
    with progress.phase("fitting boxes (tau sweep)", len(mi.layers) * len(mi.classes) * 2):
        monitor = _fit(params.estimator(mi.layers), sets, len(mi.classes))
    calib_set, calib = _calibration_set(sets.train, sets.validation, monitor.calibration_rows_)
    with progress.phase("calibrating the score"):
        cal = monitor.calibrate(
            calib.acts,
            calib.pred,
            target_acceptance=float(monitor.target_acceptance),
            acts_unknown=None if sets.unknown is None else sets.unknown.acts,
            y_pred_unknown=None if sets.unknown is None else sets.unknown.pred,
            y_true_known=calib.y,
            logits_known=calib.logits,
            logits_unknown=None if sets.unknown is None else sets.unknown.logits,
        )
    summary = _fit_summary(monitor, mi, sets, cal, calib_set, progress)
    contents = {
        "count": len(mi.layers) * len(mi.classes),
        "boxes": int(sum(sum(b.good) + sum(b.bad) for b in summary.boxes.values())),
        "combine": monitor.combine,
        "normalize": monitor.normalize,
        "score": monitor.score,
        "threshold": _finite(cal.threshold),
        "target_acceptance": cal.target_acceptance,
    }
    rows = {"train": monitor.calibration_rows_} if calib_set == HELD_OUT else {}
    logits = {name: s.logits for name, s in tapped.items()}
    acts = {name: s.acts for name, s in tapped.items()}
    return MonitorOutcome(monitor, _accuracy(tapped), contents, summary, logits, rows, acts)


def input_alone(
    mi: ModelInputs,
    params: MonitorSection,
    outcome: MonitorOutcome,
    pooling: str,
    names: Sequence[str],
) -> dict[str, float]:
    """The share of each unknown set of ``names`` that a box monitor of the model's input
    alone (pooled ``pooling``, the config's monitor settings, fitted and calibrated as the
    build's own) accepts: what monitoring the input would catch (``input_not_monitored``)."""

    def tapped(name: str) -> Tapped:
        x, y = mi.data[name]
        logits = outcome.logits[name]
        acts = {INPUT_LAYER: pool(mi.preprocessing.apply(x), pooling)}
        return Tapped(acts, logits, logits.argmax(axis=1), y)

    known = {name: tapped(name) for name in ("train", "validation") if name in mi.data}
    sets = _Sets(known["train"], known.get("validation"), None, known.get("validation"))
    monitor = _fit(params.estimator([INPUT_LAYER]), sets, len(mi.classes))
    out = {}
    for name in names:
        unknown = tapped(name)
        verdicts = monitor.predict(unknown.acts, unknown.pred, logits=unknown.logits).combined
        out[name] = float(np.mean(verdicts == ACCEPT)) if len(verdicts) else 0.0
    return out


def _fit(monitor: BoxMonitor, sets: _Sets, n_classes: int) -> BoxMonitor:
    """Fit ``monitor`` on the training inputs; validation inputs choose tau (with the unknown
    ones for ``selection: f1``; known ones only for held-out-class selection)."""
    validation = None
    if sets.validation is not None:
        f1 = monitor.tau == "auto" and monitor.selection == "f1"
        chosen_on = sets.evaluation if f1 and sets.evaluation is not None else sets.validation
        validation = chosen_on.fit_data()
    train = sets.train
    return monitor.fit(
        train.acts,
        train.labels,
        train.pred,
        validation=validation,
        n_classes=n_classes,
        logits=train.logits,
    )


def _fit_summary(
    monitor: BoxMonitor,
    mi: ModelInputs,
    sets: _Sets,
    cal: Calibration,
    calib_set: str,
    progress: Progress,
) -> MonitorFit:
    """The summary of a fitted, calibrated monitor: taus, boxes, calibration, the per-tau
    curves and the score's detection figures (with validation data), the coverage."""
    taus = candidate_taus(monitor)
    if monitor.tau != "auto":
        tau_selection = "fixed"
    else:  # without validation data fit() falls back to the coverage search
        tau_selection = monitor.selection if sets.validation is not None else "coverage"
    curves: dict[str, OutcomeCurve] | UnsetType = UNSET
    detected: DetectionSummary | UnsetType = UNSET
    evaluated = sets.validation is not None and sets.evaluation is not None
    # Steps: the coverage's one per layer and class, and the curves' sweep (one per layer,
    # class and kind) when the fit swept other taus.
    cells = len(mi.layers) * len(mi.classes)
    steps = cells * (3 if evaluated and monitor.sweep_.taus != taus else 1)
    with progress.phase("evaluating (curves, coverage)", steps):
        if sets.validation is not None and sets.evaluation is not None:
            curves = _curves(monitor, mi, sets.train, sets.evaluation, taus)
            if sets.unknown is not None:
                detected = _detection(monitor, sets.validation, sets.unknown, cal.target_acceptance)
        coverage = _coverage(monitor, mi, sets.train, taus, len(mi.classes))
    return MonitorFit(
        layers=list(mi.layers),
        taus=taus,
        tau={layer: [float(t) for t in monitor.tau_[layer]] for layer in mi.layers},
        tau_auroc=_tau_auroc(monitor),
        tau_selection=tau_selection,
        score=monitor.score,
        contrast_layers=list(monitor.contrast_layers_),
        calibration_set=calib_set,
        boxes={
            layer: BoxCounts(
                good=monitor.runtime_.good[layer].counts().tolist(),
                bad=monitor.runtime_.bad[layer].counts().tolist(),
            )
            for layer in mi.layers
        },
        calibration=_calibration_summary(cal),
        curves=curves,
        detection=detected,
        coverage=coverage,
    )


def _tap_sets(
    mi: ModelInputs, extract: Callable[..., Any], progress: Progress
) -> tuple[dict[str, Tapped], Tapped | None]:
    """Every data set but ``test`` through the model (``test`` is only reported, by the
    pipeline: never fitted or calibrated on), and the evaluation set: the validation inputs
    followed by ``data.unknown``'s, labelled -1 (``None`` without both). The two are
    extracted into one array of which each set is a view, so the evaluation set costs no
    copy."""
    names = [name for name in mi.data if name != "test"]
    total_rows = sum(len(mi.data[name][0]) for name in names)
    joint = "validation" in names and "unknown" in names
    out: dict[str, Tapped] = {}
    evaluation = None
    with progress.phase("extracting activations", total_rows) as bar:
        for name in names:
            x, y = mi.data[name]
            if joint and name == "unknown":
                continue  # extracted with the validation set
            if joint and name == "validation":
                x_unknown, y_unknown = mi.data["unknown"]
                logits, acts = extract(mi, [x, x_unknown], bar)
                labels = np.concatenate([y, np.full(len(x_unknown), UNKNOWN_LABEL)])
                evaluation = Tapped(acts, logits, logits.argmax(axis=1), labels)
                for part, rows, labelled in (
                    ("validation", slice(0, len(x)), y),
                    ("unknown", slice(len(x), None), y_unknown),
                ):
                    view = evaluation.rows(rows)
                    out[part] = Tapped(view.acts, view.logits, view.pred, labelled)
                continue
            logits, acts = extract(mi, x, bar)
            out[name] = Tapped(acts, logits, logits.argmax(axis=1), y)
    return {name: out[name] for name in names}, evaluation


def _accuracy(sets: dict[str, Tapped]) -> Accuracy:
    """The model's accuracy on the labelled training and validation sets."""

    def accuracy(s: Tapped) -> float:
        return float(np.mean(s.pred == s.y))

    val = sets.get("validation")
    return Accuracy(
        train=accuracy(sets["train"]),
        validation=UNSET if val is None or val.y is None else accuracy(val),
    )


def _calibration_set(
    train: Tapped, validation: Tapped | None, held: np.ndarray
) -> tuple[str, Tapped]:
    """Where the score threshold is calibrated: the validation set, else the training rows
    ``fit`` held out, else (a combine rule other than calibrated) the training set."""
    if validation is not None:
        return "validation", validation
    if len(held):
        return HELD_OUT, train.rows(held)
    return "train", train


def _calibration_summary(cal: Calibration) -> CalibrationSummary:
    """The summary's ``calibration``: the calibration without its per-layer scales, non-finite
    floats as None."""

    def value(v: Any) -> Any:
        return _finite(v) if isinstance(v, float) else v

    return CalibrationSummary(
        threshold=value(cal.threshold),
        confidence_floor=value(cal.confidence_floor),
        target_acceptance=value(cal.target_acceptance),
        known_acceptance=value(cal.known_acceptance),
        unknown_acceptance=value(cal.unknown_acceptance),
        n_known=cal.n_known,
        n_unknown=cal.n_unknown,
        known_split=Shares(**cal.known_split),
        population=cal.population,
        error_score=cal.error_score,
        error_cut=value(cal.error_cut),
        confidence_share=value(cal.confidence_share),
        share_choice=msgspec.convert(cal.share_choice, ShareChoice) if cal.share_choice else UNSET,
    )


def _tau_auroc(monitor: BoxMonitor) -> dict[str, list[float | None]]:
    """Held-out-class selection: each layer's AUROC per candidate tau (the tau_at_edge check)."""
    selection = monitor.selection_ or {}
    return {
        layer: [_finite(float(v)) for v in values]
        for layer, values in (selection.get("auroc") or {}).items()
    }


def _curves(
    monitor: BoxMonitor, mi: ModelInputs, train: Tapped, evaluation: Tapped, taus: list[float]
) -> dict[str, OutcomeCurve]:
    """Per-tau outcome curves of each layer on the evaluation set (the emitted verdicts'
    outcome counts come from the agent's runtime, :mod:`.emitted`)."""
    sweep = monitor.sweep_
    n_classes = len(mi.classes)
    if sweep.taus != taus:  # fit swept other taus (fixed tau, coverage selection)
        sweep = build_sweep(
            train.acts,
            train.labels,
            train.pred,
            layers=mi.layers,
            taus=taus,
            n_classes=n_classes,
            normalize=monitor.normalize,
            random_state=monitor.random_state,
            n_jobs=monitor.n_jobs,
        )
    by_layer = sweep.verdicts(evaluation.acts, evaluation.pred)
    curves = {}
    for layer in mi.layers:
        rows = [
            total(
                outcomes_per_class(
                    by_layer[layer][t], evaluation.labels, evaluation.pred, n_classes
                )
            )
            for t in sweep.taus
        ]
        curves[layer] = OutcomeCurve(
            taus=list(sweep.taus),
            tp=[r.tp for r in rows],
            fp=[r.fp for r in rows],
            tn=[r.tn for r in rows],
            fn=[r.fn for r in rows],
            mp=[r.mp for r in rows],
            mn=[r.mn for r in rows],
            precision=[r.precision for r in rows],
            recall=[r.recall for r in rows],
        )
    return curves


def _detection(
    monitor: BoxMonitor, validation: Tapped, unknown: Tapped, target: float
) -> DetectionSummary:
    """How the score alone separates the validation inputs from ``data.unknown``."""
    known = monitor.outlier_score(validation.acts, validation.pred, logits=validation.logits)
    other = monitor.outlier_score(unknown.acts, unknown.pred, logits=unknown.logits)
    det = detection(known, other, target_acceptance=target)
    finite = np.concatenate([known[np.isfinite(known)], other[np.isfinite(other)]])
    hi = float(np.quantile(finite, 0.99)) if len(finite) else 1.0
    edges = np.linspace(0.0, max(hi, 1e-9), HISTOGRAM_BINS + 1)
    return DetectionSummary(
        auroc=_finite(det.auroc),
        fpr_at_95=_finite(det.fpr),
        histogram=Histogram(
            edges=edges.tolist(),
            known=np.histogram(np.clip(known, 0, hi), edges)[0].tolist(),
            unknown=np.histogram(np.clip(other, 0, hi), edges)[0].tolist(),
        ),
    )


def _coverage(
    monitor: BoxMonitor, mi: ModelInputs, train: Tapped, taus: list[float], n_classes: int
) -> dict[str, CoverageCurve]:
    """Coverage of each class's good boxes at every tau (the paper's Fig. 5).

    The ratio r_u underflows to 0 in tens of dimensions, so the curve plots its geometric
    mean per dimension, ``exp(log r_u / n_dims)``: 1 for one box over the whole data, and
    comparable across layers of different widths. A class with more than
    :data:`MAX_COVERAGE_ROWS` correctly classified training inputs is measured on that many
    of them, drawn with its seed (a report figure: the boxes themselves use every row).
    The classes run through joblib as the fit's do (``monitor.n_jobs``, the active
    ``joblib.parallel_config``), a few at a time; their seeds are drawn here, in order, so
    the curves do not depend on what runs them.
    """
    rng = np.random.RandomState(monitor.random_state)
    y_true, y_pred = train.labels, train.pred

    def jobs() -> Iterator[Any]:
        chunk: list[tuple[np.ndarray, int]] = []
        held = 0
        for layer in mi.layers:
            x = np.asarray(train.acts[layer]).reshape(len(y_pred), -1)
            for cls in range(n_classes):
                rows = np.flatnonzero((y_pred == cls) & (y_true == cls))
                seed = int(rng.randint(0, 2**31 - 1))
                if len(rows) > MAX_COVERAGE_ROWS:
                    drawn = np.random.default_rng(seed).permutation(len(rows))[:MAX_COVERAGE_ROWS]
                    rows = rows[np.sort(drawn)]
                # One class's rows at a time (normalisation is row-wise): the layer is never
                # copied whole, which matters when it is a memory-mapped store.
                xs = normalize_features(x[rows], monitor.normalize)
                chunk.append((xs, seed))
                held += xs.size + 1
                if held >= CHUNK_VALUES:
                    yield delayed(_coverage_curves)(chunk, taus)
                    chunk, held = [], 0
        if chunk:
            yield delayed(_coverage_curves)(chunk, taus)

    curves = (
        curve
        for done in Parallel(n_jobs=monitor.n_jobs, return_as="generator")(jobs())
        for curve in done
    )
    out = {}
    for layer in mi.layers:
        per_class = []
        for _ in range(n_classes):
            per_class.append(next(curves))
            tick()
        out[layer] = CoverageCurve(taus=list(taus), per_class=per_class, measure=COVERAGE_MEASURE)
    return out


def _coverage_curves(
    classes: list[tuple[np.ndarray, int]], taus: list[float]
) -> list[list[float | None]]:
    """Each ``(normalised good rows, seed)``'s coverage at every tau, k-means single-threaded
    (None at every tau for fewer than two rows)."""
    out: list[list[float | None]] = []
    with single_threaded():
        for xs, seed in classes:
            if len(xs) < 2:
                out.append([None] * len(taus))
                continue
            path = TauKMeansPath(xs, random_state=seed)
            covs = [coverage_at(path, t) for t in taus]
            out.append([_finite(float(np.exp(c.log_upper / max(c.n_dims, 1)))) for c in covs])
    return out
