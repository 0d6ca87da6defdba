"""``BoxMonitor``: per-class, per-layer resolution-box monitors learned from a network's behaviour.

Fitting (this module, scikit-learn) clusters each class's *good* activations (correctly
classified) and *bad* ones (another label, predicted as the class) with tau-k-means and keeps
one min/max box per cluster. Applying the boxes is delegated to the agent's numpy runtime
(:class:`boxwatch.agent.boxes.BoxRuntime`), which is also what the artifact ships.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils import check_random_state

from boxwatch.agent.boxes import (
    COMBINE_RULES,
    NORMALIZATIONS,
    VERDICT_NAMES,
    BoxRuntime,
    BoxSet,
    layer_verdicts,
    normalize_features,
    verdict_names,
)
from boxwatch.agent.errors import ConfigError
from boxwatch.offline.coverage import search_tau_max, search_tau_min
from boxwatch.offline.evaluation import acceptance_threshold, outcome_counts
from boxwatch.offline.taukmeans import TauKMeansPath, cluster_boxes, single_threaded

DEFAULT_TAUS: tuple[float, ...] = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 0.01)
Activations = Mapping[str, np.ndarray]


@dataclass
class BoxSweep:
    """Good and bad boxes of every (layer, tau) for every class, from one descending sweep.

    ``good[layer][tau]`` and ``bad[layer][tau]`` are :class:`BoxSet` objects; ``k_good`` /
    ``k_bad`` hold the cluster counts, shape (n_taus, n_classes) per layer.
    """

    layers: list[str]
    taus: list[float]
    n_classes: int
    normalize: str
    good: dict[str, dict[float, BoxSet]] = field(default_factory=dict)
    bad: dict[str, dict[float, BoxSet]] = field(default_factory=dict)
    k_good: dict[str, np.ndarray] = field(default_factory=dict)
    k_bad: dict[str, np.ndarray] = field(default_factory=dict)
    seconds: float = 0.0

    def verdicts(self, activations: Activations, y_pred: np.ndarray) -> dict[str, dict[float, np.ndarray]]:
        """Per-layer, per-tau verdict codes for inputs predicted as ``y_pred``."""
        out: dict[str, dict[float, np.ndarray]] = {}
        for layer in self.layers:
            x = _features(activations, layer, self.normalize)
            out[layer] = {tau: layer_verdicts(self.good[layer][tau], self.bad[layer][tau], x, y_pred)
                          for tau in self.taus}
        return out


@dataclass(frozen=True)
class Verdicts:
    """Verdict codes (0 accept, 1 uncertainty, 2 reject), combined and per layer."""

    combined: np.ndarray
    per_layer: dict[str, np.ndarray]

    def names(self) -> np.ndarray:
        """The combined verdicts as names ("accept", "uncertainty", "reject")."""
        return verdict_names(self.combined)


@dataclass(frozen=True)
class Calibration:
    """Threshold on the box score and what it achieves.

    ``known_acceptance`` is measured on the calibration data itself; ``unknown_acceptance``
    (the false-accept rate) only when unknown inputs were given, else ``None``.
    """

    threshold: float
    target_acceptance: float
    known_acceptance: float
    unknown_acceptance: float | None
    n_known: int
    n_unknown: int
    scales: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "target_acceptance": self.target_acceptance,
                "known_acceptance": self.known_acceptance,
                "unknown_acceptance": self.unknown_acceptance, "n_known": self.n_known,
                "n_unknown": self.n_unknown, "scales": dict(self.scales)}


def _features(activations: Activations, layer: str, normalize: str) -> np.ndarray:
    x = np.asarray(activations[layer])
    return normalize_features(x.reshape(len(x), -1), normalize)


def build_sweep(activations_by_layer: Activations, y_true: np.ndarray, y_pred: np.ndarray, *,
                layers: Sequence[str], taus: Sequence[float], n_classes: int,
                normalize: str = "l2", max_clusters: int = 64, n_init: int = 1,
                random_state=0) -> BoxSweep:
    """Build good/bad boxes for every layer, class and tau (taus swept descending, k reused).

    Assumes validated input (see :meth:`BoxMonitor.fit`). One seed per (layer, class, kind)
    is drawn from ``random_state`` in a fixed order, so the result is deterministic.
    """
    start = time.perf_counter()
    rng = check_random_state(random_state)
    taus = sorted({float(t) for t in taus}, reverse=True)
    sweep = BoxSweep(layers=list(layers), taus=taus, n_classes=n_classes, normalize=normalize)
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    with single_threaded():
        for layer in layers:
            _sweep_layer(sweep, activations_by_layer, y_true, y_pred, layer, rng,
                         max_clusters=max_clusters, n_init=n_init)
    sweep.seconds = time.perf_counter() - start
    return sweep


def _sweep_layer(sweep: BoxSweep, activations_by_layer: Activations, y_true: np.ndarray,
                 y_pred: np.ndarray, layer: str, rng: np.random.RandomState, *,
                 max_clusters: int, n_init: int) -> None:
    """Fill ``sweep`` for one layer (assumes valid input)."""
    taus, n_classes, normalize = sweep.taus, sweep.n_classes, sweep.normalize
    x = _features(activations_by_layer, layer, normalize)
    d = x.shape[1]
    per_kind: dict[str, dict[float, list]] = {"good": {t: [] for t in taus}, "bad": {t: [] for t in taus}}
    ks = {"good": np.zeros((len(taus), n_classes), np.int64), "bad": np.zeros((len(taus), n_classes), np.int64)}
    for cls in range(n_classes):
        predicted = y_pred == cls
        for kind, mask in (("good", predicted & (y_true == cls)), ("bad", predicted & (y_true != cls))):
            seed = int(rng.randint(0, 2**31 - 1))
            xs = x[mask]
            if len(xs) == 0:
                for i, t in enumerate(taus):
                    per_kind[kind][t].append((np.zeros((0, d)), np.zeros((0, d))))
                    ks[kind][i, cls] = 0
                continue
            path = TauKMeansPath(xs, max_clusters=max_clusters, random_state=seed, n_init=n_init)
            for i, (t, clustering) in enumerate(sorted(path.sweep(taus).items(), reverse=True)):
                per_kind[kind][t].append(cluster_boxes(xs, clustering.labels))
                ks[kind][i, cls] = clustering.k
    sweep.good[layer] = {t: BoxSet.from_boxes(per_kind["good"][t], d) for t in taus}
    sweep.bad[layer] = {t: BoxSet.from_boxes(per_kind["bad"][t], d) for t in taus}
    sweep.k_good[layer], sweep.k_bad[layer] = ks["good"], ks["bad"]


class BoxMonitor(BaseEstimator):
    """Resolution-box runtime monitor of a classifier, one sub-monitor per class and layer.

    Parameters
    ----------
    layers : sequence of str or None, default=None
        Layers to monitor; ``None`` takes every key of the activations given to ``fit``
        (sorted).
    tau : float, mapping or "auto", default="auto"
        Clustering parameter. A float applies to every layer and class; a mapping gives
        ``{layer: float}`` or ``{layer: [tau per class]}``. ``"auto"`` chooses a tau per
        class and layer (the paper's "combined parameters") from ``taus``: the one with the
        best per-class F1 on the ``validation`` set given to ``fit`` (ties: the larger tau),
        or, without validation data, the middle of the coverage interval
        ``[tau_min, tau_max]`` (Algorithm 1) of the class's good activations.
    taus : sequence of float, default=DEFAULT_TAUS
        Candidates for ``tau="auto"`` (the paper's 12 values 1.0 ... 0.01).
    combine : {"any", "majority", "all"}, default="any"
        Rule combining per-layer verdicts; see :func:`boxwatch.agent.boxes.combine_verdicts`.
    normalize : {"l2", "none"}, default="l2"
        Feature normalisation before boxing. L2 rows made the distance score markedly
        better (``shared/FACTS.md``); ``"none"`` reproduces the paper.
    score_layers : sequence of str or None, default=None
        Layers whose box distances make the score; ``None`` means all monitored layers.
    max_clusters : int, default=64
        Upper bound on k per class, layer and kind.
    n_init : int, default=1
        k-means restarts per k.
    eps_cov, eps_ival : float, default=0.01
        Algorithm 1 thresholds for the coverage search.
    random_state : int, RandomState or None, default=0
        Seeds every k-means fit.

    Attributes
    ----------
    layers_ : list of str
    n_classes_ : int
    tau_ : dict of str to ndarray of shape (n_classes,)
        The tau used for each layer and class.
    runtime_ : BoxRuntime
        The fitted boxes and rules; what the agent loads.
    selection_ : dict or None
        With ``tau="auto"`` and validation data: ``{"taus": [...], "f1": {layer: ndarray of
        shape (n_taus, n_classes)}}``.
    calibration_ : Calibration or None
    build_seconds_ : float
        Time spent building the boxes (last sweep).
    sweep_ : BoxSweep
        The boxes of every swept tau (the candidates with ``tau="auto"`` and validation
        data), kept for per-tau evaluation curves.
    """

    def __init__(self, layers: Sequence[str] | None = None, *, tau: Any = "auto",
                 taus: Sequence[float] = DEFAULT_TAUS, combine: str = "any", normalize: str = "l2",
                 score_layers: Sequence[str] | None = None, max_clusters: int = 64, n_init: int = 1,
                 eps_cov: float = 0.01, eps_ival: float = 0.01, random_state=0):
        self.layers = layers
        self.tau = tau
        self.taus = taus
        self.combine = combine
        self.normalize = normalize
        self.score_layers = score_layers
        self.max_clusters = max_clusters
        self.n_init = n_init
        self.eps_cov = eps_cov
        self.eps_ival = eps_ival
        self.random_state = random_state

    def _check_params(self, layers: list[str]) -> list[str]:
        problems = []
        if self.combine not in COMBINE_RULES:
            problems.append(f"combine={self.combine!r}: expected one of {COMBINE_RULES}")
        if self.normalize not in NORMALIZATIONS:
            problems.append(f"normalize={self.normalize!r}: expected one of {NORMALIZATIONS}")
        if not self.taus or any(not 0 <= float(t) <= 1 for t in self.taus):
            problems.append(f"taus={list(self.taus)}: need a non-empty list of values in [0, 1]")
        if int(self.max_clusters) < 1:
            problems.append(f"max_clusters={self.max_clusters} should be >= 1")
        for name in self.score_layers or []:
            if name not in layers:
                problems.append(f"score layer {name!r} is not monitored; monitored: {layers}")
        if isinstance(self.tau, str):
            if self.tau != "auto":
                problems.append(f"tau={self.tau!r}: expected a float, a mapping or 'auto'")
        elif isinstance(self.tau, Mapping):
            for name in self.tau:
                if name not in layers:
                    problems.append(f"tau given for unknown layer {name!r}; monitored: {layers}")
        elif not 0 <= float(self.tau) <= 1:
            problems.append(f"tau={self.tau} should lie in [0, 1]")
        return problems

    def _check_data(self, activations: Activations, y_true: np.ndarray | None, y_pred: np.ndarray,
                    layers: Sequence[str], where: str, problems: list[str] | None = None) -> None:
        problems = list(problems or [])
        missing = [name for name in layers if name not in activations]
        if missing:
            problems.append(f"{where}: no activations for layers {missing}; given {sorted(activations)}")
        n = len(y_pred)
        for name in layers:
            if name in activations and len(activations[name]) != n:
                problems.append(f"{where}: layer {name!r} has {len(activations[name])} rows, y_pred has {n}")
        if y_true is not None and len(y_true) != n:
            problems.append(f"{where}: y_true has {len(y_true)} entries, y_pred has {n}")
        if problems:
            raise ConfigError(problems)

    def fit(self, activations_by_layer: Activations, y_true: np.ndarray, y_pred: np.ndarray, *,
            validation: tuple[Activations, np.ndarray, np.ndarray] | None = None,
            n_classes: int | None = None) -> BoxMonitor:
        """Learn good and bad boxes per class and layer.

        Parameters
        ----------
        activations_by_layer : mapping of str to ndarray of shape (n_samples, ...)
            Training activations per layer (flattened per row).
        y_true, y_pred : ndarray of shape (n_samples,)
            Labels and the network's predictions.
        validation : (activations, y_true, y_pred), optional
            Held-out inputs for ``tau="auto"``; unknown inputs carry label -1.
        n_classes : int, optional
            Defaults to ``max(y_true, y_pred) + 1``.

        Returns
        -------
        self
        """
        y_true, y_pred = np.asarray(y_true).astype(np.int64), np.asarray(y_pred).astype(np.int64)
        layers = list(self.layers) if self.layers is not None else sorted(activations_by_layer)
        problems = self._check_params(layers)
        if validation is not None:
            try:
                self._check_data(validation[0], np.asarray(validation[1]), np.asarray(validation[2]),
                                 layers, "validation")
            except ConfigError as exc:
                problems += exc.problems
        self._check_data(activations_by_layer, y_true, y_pred, layers, "fit", problems)
        k = int(n_classes) if n_classes is not None else int(max(y_true.max(), y_pred.max())) + 1
        if len(y_pred) == 0 or y_pred.min() < 0 or y_pred.max() >= k:
            raise ConfigError(f"fit: y_pred must be non-empty with classes in [0, {k})")
        selection = None
        if self.tau == "auto" and validation is None:
            chosen = self._select_by_coverage(activations_by_layer, y_true, y_pred, layers, k)
            candidate = sorted({float(t) for v in chosen.values() for t in v}, reverse=True)
        else:
            candidate = self._candidate_taus(layers)
        sweep = build_sweep(activations_by_layer, y_true, y_pred, layers=layers, taus=candidate,
                            n_classes=k, normalize=self.normalize, max_clusters=self.max_clusters,
                            n_init=self.n_init, random_state=self.random_state)
        if self.tau == "auto" and validation is not None:
            chosen, selection = self._select_by_f1(sweep, validation)
        elif self.tau != "auto":
            chosen = self._explicit_taus(layers, k)
        good = {layer: _pick(sweep.good[layer], chosen[layer]) for layer in layers}
        bad = {layer: _pick(sweep.bad[layer], chosen[layer]) for layer in layers}
        score_layers = list(self.score_layers) if self.score_layers is not None else list(layers)
        meta = {"tau": {layer: [float(t) for t in chosen[layer]] for layer in layers}}
        self.layers_ = layers
        self.n_classes_ = k
        self.tau_ = {layer: np.asarray(chosen[layer], dtype=np.float64) for layer in layers}
        self.selection_ = selection
        self.build_seconds_ = sweep.seconds
        self.sweep_ = sweep
        self.calibration_ = None
        self.runtime_ = BoxRuntime(layers=layers, n_classes=k, good=good, bad=bad,
                                   normalize=self.normalize, combine=self.combine,
                                   score_layers=score_layers, meta=meta)
        return self

    def _candidate_taus(self, layers: list[str]) -> list[float]:
        if isinstance(self.tau, str):
            return sorted({float(t) for t in self.taus}, reverse=True)
        if isinstance(self.tau, Mapping):
            values = [np.atleast_1d(np.asarray(v, dtype=np.float64)) for v in self.tau.values()]
            return sorted({float(t) for v in values for t in v}, reverse=True)
        return [float(self.tau)]

    def _explicit_taus(self, layers: list[str], k: int) -> dict[str, np.ndarray]:
        if not isinstance(self.tau, Mapping):
            return {layer: np.full(k, float(self.tau)) for layer in layers}
        problems, out = [], {}
        for layer in layers:
            if layer not in self.tau:
                problems.append(f"tau mapping has no entry for monitored layer {layer!r}")
                continue
            v = np.atleast_1d(np.asarray(self.tau[layer], dtype=np.float64))
            if len(v) not in (1, k):
                problems.append(f"tau[{layer!r}] has {len(v)} values; need 1 or n_classes={k}")
            out[layer] = np.broadcast_to(v, (k,)).copy() if len(v) == 1 else v
        if problems:
            raise ConfigError(problems)
        return out

    def _select_by_f1(self, sweep: BoxSweep, validation: tuple[Activations, np.ndarray, np.ndarray]
                      ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        acts, yv_true, yv_pred = validation
        yv_true, yv_pred = np.asarray(yv_true).astype(np.int64), np.asarray(yv_pred).astype(np.int64)
        verdicts = sweep.verdicts(acts, yv_pred)
        taus = np.asarray(sweep.taus)  # descending: argmax picks the larger tau on ties
        chosen, f1 = {}, {}
        for layer in sweep.layers:
            table = np.zeros((len(taus), sweep.n_classes))
            for i, tau in enumerate(sweep.taus):
                counts = outcome_counts(verdicts[layer][tau], yv_true, yv_pred, sweep.n_classes)
                tn, fp, mn, fn, tp, mp = counts.T.astype(np.float64)
                precision = np.divide(tp, tp + fp, out=np.zeros_like(tp), where=(tp + fp) > 0)
                recall = np.divide(tp, tp + fn + mp, out=np.zeros_like(tp), where=(tp + fn + mp) > 0)
                s = precision + recall
                table[i] = np.divide(2 * precision * recall, s, out=np.zeros_like(s), where=s > 0)
            f1[layer] = table
            chosen[layer] = taus[np.argmax(table, axis=0)]
        return chosen, {"taus": list(sweep.taus), "f1": f1}

    def _select_by_coverage(self, activations: Activations, y_true: np.ndarray, y_pred: np.ndarray,
                            layers: list[str], k: int) -> dict[str, np.ndarray]:
        rng = check_random_state(self.random_state)
        out = {}
        with single_threaded():
            for layer in layers:
                out[layer] = self._coverage_taus(activations, y_true, y_pred, layer, k, rng)
        return out

    def _coverage_taus(self, activations: Activations, y_true: np.ndarray, y_pred: np.ndarray,
                       layer: str, k: int, rng: np.random.RandomState) -> np.ndarray:
        x = _features(activations, layer, self.normalize)
        taus = np.full(k, 1.0)
        for cls in range(k):
            xs = x[(y_pred == cls) & (y_true == cls)]
            seed = int(rng.randint(0, 2**31 - 1))
            if len(xs) < 2:
                continue
            path = TauKMeansPath(xs, max_clusters=self.max_clusters, random_state=seed,
                                 n_init=self.n_init)
            lo = search_tau_min(path, eps_cov=self.eps_cov, eps_ival=self.eps_ival)
            hi = search_tau_max(path, eps_cov=self.eps_cov, eps_ival=self.eps_ival)
            taus[cls] = round(0.5 * (lo + hi), 6)
        return taus

    def _check_fitted(self) -> None:
        if not hasattr(self, "runtime_"):
            raise ConfigError("this BoxMonitor is not fitted yet: call fit() first")

    def predict(self, activations_by_layer: Activations, y_pred: np.ndarray) -> Verdicts:
        """Verdicts for inputs the network classified as ``y_pred``.

        Returns
        -------
        Verdicts
            ``combined`` (n_samples,) and ``per_layer`` {layer: (n_samples,)} int8 codes:
            0 accept, 1 uncertainty, 2 reject (names in ``VERDICT_NAMES``).
        """
        self._check_fitted()
        y_pred = np.asarray(y_pred)
        self._check_data(activations_by_layer, None, y_pred, self.layers_, "predict")
        combined, per_layer = self.runtime_.verdicts(activations_by_layer, y_pred)
        return Verdicts(combined=combined, per_layer=per_layer)

    def score_samples(self, activations_by_layer: Activations, y_pred: np.ndarray) -> np.ndarray:
        """Out-of-box score, shape (n_samples,): higher is more unusual.

        Per score layer: Euclidean distance of the (normalised) activation to the nearest
        good box of the predicted class (0 inside), divided by the layer's calibration
        scale; the layers' values are averaged. Computed from the stored boxes only.
        """
        self._check_fitted()
        y_pred = np.asarray(y_pred)
        self._check_data(activations_by_layer, None, y_pred, self.runtime_.score_layers, "score_samples")
        return self.runtime_.scores(activations_by_layer, y_pred)

    def calibrate(self, acts_known: Activations, y_pred_known: np.ndarray,
                  target_acceptance: float = 0.95, acts_unknown: Activations | None = None,
                  y_pred_unknown: np.ndarray | None = None) -> Calibration:
        """Choose the score threshold that accepts ``target_acceptance`` of known inputs.

        Sets each score layer's scale to the ``target_acceptance`` quantile of its distances
        on the known data (so layers weigh alike), then the threshold on the combined score.
        With unknown inputs, also measures their acceptance (the false-accept rate).

        Returns
        -------
        Calibration
        """
        self._check_fitted()
        if not 0 < target_acceptance <= 1:
            raise ConfigError(f"target_acceptance={target_acceptance} should lie in (0, 1]")
        y_pred_known = np.asarray(y_pred_known)
        rt = self.runtime_
        self._check_data(acts_known, None, y_pred_known, rt.score_layers, "calibrate (known)")
        if len(y_pred_known) == 0:
            raise ConfigError("calibrate: no known inputs given")
        per_layer = rt.layer_scores(acts_known, y_pred_known)
        scales = {}
        for layer, s in per_layer.items():
            finite = s[np.isfinite(s)]
            q = acceptance_threshold(finite, target_acceptance) if len(finite) else 1.0
            scales[layer] = float(q) if q > 0 else float(finite[finite > 0].mean()) if np.any(finite > 0) else 1.0
        rt.score_scales = scales
        combined = rt.combine_scores(per_layer)
        threshold = acceptance_threshold(combined, target_acceptance)
        rt.threshold = threshold
        unknown_rate, n_unknown = None, 0
        if acts_unknown is not None:
            if y_pred_unknown is None:
                raise ConfigError("calibrate: acts_unknown needs y_pred_unknown")
            su = self.score_samples(acts_unknown, y_pred_unknown)
            unknown_rate, n_unknown = float(np.mean(su <= threshold)), len(su)
        cal = Calibration(threshold=threshold, target_acceptance=target_acceptance,
                          known_acceptance=float(np.mean(combined <= threshold)),
                          unknown_acceptance=unknown_rate, n_known=len(combined),
                          n_unknown=n_unknown, scales=scales)
        rt.meta["calibration"] = cal.as_dict()
        self.calibration_ = cal
        return cal

    def decide(self, activations_by_layer: Activations, y_pred: np.ndarray) -> np.ndarray:
        """Accept (``True``) where the calibrated score is at most the threshold."""
        return self.runtime_.decide(self.score_samples(activations_by_layer, y_pred))

    def to_members(self, prefix: str = "monitors/boxes") -> dict[str, Any]:
        """Artifact members for the agent (see :meth:`BoxRuntime.to_members`)."""
        self._check_fitted()
        return self.runtime_.to_members(prefix)


def _pick(by_tau: Mapping[float, BoxSet], taus: np.ndarray) -> BoxSet:
    """Per class, the boxes of that class's tau (assumes every tau is in ``by_tau``)."""
    per_class = [by_tau[float(t)].boxes_of(cls) for cls, t in enumerate(taus)]
    d = next(iter(by_tau.values())).n_features
    return BoxSet.from_boxes(per_class, d)


__all__ = ["DEFAULT_TAUS", "VERDICT_NAMES", "BoxMonitor", "BoxSweep", "Calibration", "Verdicts",
           "build_sweep"]
