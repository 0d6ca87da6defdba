"""The monitor half of a build: activations, box monitors, calibration and evaluation.

Validation inputs (known classes only, by default) choose tau per layer by held-out-class
validation, or per class and layer by F1 with unknown inputs labelled -1
(``selection: f1``), and calibrate the score threshold; the same inputs, with the unknown
ones, give the report's curves and operating point. Without a validation set the coverage
search picks tau and calibration uses the training inputs (the summary says so).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from boxwatch.agent.boxes import normalize_features
from boxwatch.offline.monitors.coverage import coverage_at
from boxwatch.offline.monitors.estimator import (
    DEFAULT_CONFIDENCE_SHARE,
    DEFAULT_TARGET_ACCEPTANCE,
    DEFAULT_TAUS,
    BoxMonitor,
    build_sweep,
)
from boxwatch.offline.monitors.evaluation import detection, outcomes_per_class, total
from boxwatch.offline.monitors.taukmeans import TauKMeansPath

UNKNOWN_LABEL = -1
COVERAGE_MEASURE = "per-dimension geometric mean of the upper coverage bound r_u"
HISTOGRAM_BINS = 30
DEFAULT_COMBINE = "calibrated"


@dataclass
class MonitorOutcome:
    """The fitted monitor and what the artifact and report say about it."""

    monitor: BoxMonitor
    accuracy: dict[str, float | None]
    contents: dict[str, Any]
    summary: dict[str, Any]
    logits: dict[str, np.ndarray] = field(default_factory=dict)
    calibration_rows: dict[str, np.ndarray] = field(default_factory=dict)

    def members(self, prefix: str) -> dict[str, Any]:
        return self.monitor.to_members(prefix)


def _finite(v: float | None) -> float | None:
    return None if v is None or not np.isfinite(v) else float(v)


def _concat(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([a[k], b[k]]) for k in a}


def fit_monitors(
    mi: Any, params: dict[str, Any], *, extract: Callable, progress=None
) -> MonitorOutcome:
    """Fit, select, calibrate and evaluate the box monitors of a validated model config."""
    sets = {name: x for name, (x, _y) in mi.data.items()}
    with (
        progress(
            "extracting activations", sum(len(x) for name, x in sets.items() if name != "test")
        )
        if progress
        else nullcontext()
    ) as bar:
        acts, preds, logits = {}, {}, {}
        for name, x in sets.items():
            if name == "test":  # reported only (pipeline); never fitted or calibrated on
                continue
            logits[name], acts[name] = extract(mi, x, bar)
            preds[name] = logits[name].argmax(axis=1)
    n_classes = len(mi.classes)
    y = {name: mi.data[name][1] for name in mi.data}
    accuracy: dict[str, float | None] = {
        name: float(np.mean(preds[name] == y[name]))
        for name in ("train", "validation")
        if name in y and y[name] is not None
    }
    tau_param = params.get("tau", list(DEFAULT_TAUS))
    taus = sorted(
        {float(t) for t in (tau_param if isinstance(tau_param, list) else DEFAULT_TAUS)},
        reverse=True,
    )
    selection = params.get("selection", "held-out-class")
    has_val = "validation" in acts
    # The selection/evaluation set: validation inputs plus unknown ones labelled -1.
    eval_acts, eval_true, eval_pred = None, None, None
    if has_val:
        eval_acts, eval_true, eval_pred = acts["validation"], y["validation"], preds["validation"]
        if "unknown" in acts:
            eval_acts = _concat(eval_acts, acts["unknown"])
            eval_true = np.concatenate([eval_true, np.full(len(preds["unknown"]), UNKNOWN_LABEL)])
            eval_pred = np.concatenate([eval_pred, preds["unknown"]])
    if isinstance(tau_param, float | int):
        tau: Any = float(tau_param)
    else:
        tau = "auto"
    validation: tuple[Any, ...] | None = None
    if has_val and tau == "auto" and selection == "f1":
        eval_logits = logits["validation"]
        if "unknown" in acts:
            eval_logits = np.concatenate([eval_logits, logits["unknown"]])
        validation = (eval_acts, eval_true, eval_pred, eval_logits)
    elif has_val:  # held-out-class selection and calibration use known inputs only
        validation = (
            acts["validation"],
            y["validation"],
            preds["validation"],
            logits["validation"],
        )
    target = float(params.get("target_acceptance", DEFAULT_TARGET_ACCEPTANCE))
    # "coverage" (and "fixed" with a tau list, as before): the coverage search chooses tau.
    estimator_selection = selection if selection in ("f1", "held-out-class") else "coverage"
    monitor = BoxMonitor(
        mi.layers,
        tau=tau,
        taus=taus,
        selection=estimator_selection,
        combine=params.get("combine", DEFAULT_COMBINE),
        target_acceptance=target,
        confidence_share=params.get("confidence_share", DEFAULT_CONFIDENCE_SHARE),
        normalize=params.get("normalize", "l2"),
        score_layers=params.get("score_layers"),
        score=params.get("score", "fused"),
        score_mean=params.get("score_mean", "quadratic"),
        energy_term=params.get("energy_term", True),
        contrast_layers=params.get("contrast_layers", "auto"),
        contrast_classes=params.get("contrast_classes", 1),
        random_state=params.get("random_state", 0),
    ).fit(
        acts["train"],
        y["train"],
        preds["train"],
        validation=validation,
        n_classes=n_classes,
        logits=logits["train"],
    )
    held = monitor.calibration_rows_
    if has_val:
        calib_set = "validation"
        calib = (acts["validation"], y["validation"], preds["validation"], logits["validation"])
    elif len(held):
        calib_set = "train (held out)"
        calib = (
            {k: v[held] for k, v in acts["train"].items()},
            y["train"][held],
            preds["train"][held],
            logits["train"][held],
        )
    else:  # another combine rule without validation data: the score threshold only
        calib_set = "train"
        calib = (acts["train"], y["train"], preds["train"], logits["train"])
    cal = monitor.calibrate(
        calib[0],
        calib[2],
        target_acceptance=target,
        acts_unknown=acts.get("unknown"),
        y_pred_unknown=preds.get("unknown"),
        y_true_known=calib[1],
        logits_known=calib[3],
        logits_unknown=logits.get("unknown"),
    )
    summary: dict[str, Any] = {
        "layers": list(mi.layers),
        "taus": taus,
        "tau": {layer: [float(t) for t in monitor.tau_[layer]] for layer in mi.layers},
        # Held-out-class selection: each layer's AUROC per candidate (the tau_at_edge check).
        "tau_auroc": {
            layer: [_finite(float(v)) for v in values]
            for layer, values in ((monitor.selection_ or {}).get("auroc") or {}).items()
        },
        # Without validation data fit() falls back to the coverage search.
        "tau_selection": (
            "fixed" if tau != "auto" else estimator_selection if has_val else "coverage"
        ),
        "score": monitor.score,
        "contrast_layers": list(monitor.contrast_layers_),
        "calibration_set": calib_set,
        "boxes": {
            layer: {
                "good": monitor.runtime_.good[layer].counts().tolist(),
                "bad": monitor.runtime_.bad[layer].counts().tolist(),
            }
            for layer in mi.layers
        },
        "calibration": {
            k: (_finite(v) if isinstance(v, float) else v)
            for k, v in cal.as_dict().items()
            if k != "scales"
        },
    }
    if eval_acts is not None:
        summary.update(
            _evaluation(
                monitor,
                mi,
                acts,
                preds,
                logits,
                y,
                eval_acts,
                eval_true,
                eval_pred,
                taus,
                n_classes,
                params,
            )
        )
    summary["coverage"] = _coverage(
        monitor,
        mi,
        acts["train"],
        y["train"],
        preds["train"],
        taus,
        n_classes,
        params.get("random_state", 0),
    )
    contents = {
        "count": len(mi.layers) * n_classes,
        "boxes": int(sum(sum(v["good"]) + sum(v["bad"]) for v in summary["boxes"].values())),
        "combine": monitor.combine,
        "normalize": monitor.normalize,
        "score": monitor.score,
        "threshold": _finite(cal.threshold),
        "target_acceptance": cal.target_acceptance,
    }
    rows = {"train": held} if calib_set == "train (held out)" else {}
    return MonitorOutcome(monitor, accuracy, contents, summary, logits, rows)


def _evaluation(
    monitor, mi, acts, preds, logits, y, eval_acts, eval_true, eval_pred, taus, n_classes, params
) -> dict[str, Any]:
    """Per-tau outcome curves and the score's detection figures (the emitted verdicts'
    outcome counts come from the agent's runtime, :mod:`.emitted`)."""
    sweep = monitor.sweep_
    if sweep.taus != taus:  # fit swept other taus (fixed tau, coverage selection)
        sweep = build_sweep(
            acts["train"],
            y["train"],
            preds["train"],
            layers=mi.layers,
            taus=taus,
            n_classes=n_classes,
            normalize=monitor.normalize,
            random_state=params.get("random_state", 0),
        )
    by_layer = sweep.verdicts(eval_acts, eval_pred)
    curves = {}
    for layer in mi.layers:
        rows = [
            total(outcomes_per_class(by_layer[layer][t], eval_true, eval_pred, n_classes))
            for t in sweep.taus
        ]
        curves[layer] = {
            "taus": list(sweep.taus),
            **{k: [getattr(r, k) for r in rows] for k in ("tp", "fp", "tn", "fn", "mp", "mn")},
            "precision": [r.precision for r in rows],
            "recall": [r.recall for r in rows],
        }
    out: dict[str, Any] = {"curves": curves}
    if "unknown" in acts and "validation" in acts:
        known = monitor.outlier_score(
            acts["validation"], preds["validation"], logits=logits["validation"]
        )
        unknown = monitor.outlier_score(acts["unknown"], preds["unknown"], logits=logits["unknown"])
        det = detection(known, unknown, target_acceptance=params.get("target_acceptance", 0.95))
        finite = np.concatenate([known[np.isfinite(known)], unknown[np.isfinite(unknown)]])
        hi = float(np.quantile(finite, 0.99)) if len(finite) else 1.0
        edges = np.linspace(0.0, max(hi, 1e-9), HISTOGRAM_BINS + 1)
        out["detection"] = {
            "auroc": _finite(det.auroc),
            "fpr_at_95": _finite(det.fpr),
            "histogram": {
                "edges": edges.tolist(),
                "known": np.histogram(np.clip(known, 0, hi), edges)[0].tolist(),
                "unknown": np.histogram(np.clip(unknown, 0, hi), edges)[0].tolist(),
            },
        }
    return out


def _coverage(monitor, mi, acts, y_true, y_pred, taus, n_classes, random_state) -> dict[str, Any]:
    """Coverage of each class's good boxes at every tau (the paper's Fig. 5).

    The ratio r_u underflows to 0 in tens of dimensions, so the curve plots its geometric
    mean per dimension, ``exp(log r_u / n_dims)``: 1 for one box over the whole data, and
    comparable across layers of different widths.
    """
    rng = np.random.RandomState(random_state)
    out = {}
    per_class: list[list[float | None]]
    for layer in mi.layers:
        x = np.asarray(acts[layer]).reshape(len(y_pred), -1)
        x = normalize_features(x, monitor.normalize)
        per_class = []
        for cls in range(n_classes):
            xs = x[(y_pred == cls) & (y_true == cls)]
            seed = int(rng.randint(0, 2**31 - 1))
            if len(xs) < 2:
                per_class.append([None] * len(taus))
                continue
            path = TauKMeansPath(xs, random_state=seed)
            covs = [coverage_at(path, t) for t in taus]
            per_class.append([_finite(float(np.exp(c.log_upper / max(c.n_dims, 1)))) for c in covs])
        out[layer] = {"taus": list(taus), "per_class": per_class, "measure": COVERAGE_MEASURE}
    return out
