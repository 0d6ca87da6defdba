"""What the agent will emit on the build's own data: the verdict split, model errors, baselines.

Every figure here comes from the agent's code path: :class:`MonitorRuntime.run_model` over
a :class:`BoxRuntime` rebuilt from the artifact's own members (the same bytes the signed
artifact will hold), on the raw inputs of each data set. "Accepted" always means the
emitted verdict is ``accept``; ``uncertainty`` and ``reject`` are counted apart and never
as accepted.

Set names of the split (also ``contents["verdict_split"]`` of the manifest):
``correct_known`` and ``misclassified_known`` (validation inputs the model classified
right / wrong) and ``unknown:<name>`` for each unknown set (``<name>`` as in the config's
``data`` section, e.g. ``unknown:unknown_digits``). A labelled ``data.test`` set gets the
same split under ``test:correct_known`` / ``test:misclassified_known`` in the summary only.

The baseline comparison (:func:`comparison`) sets every baseline of :data:`BASELINES` at the
threshold that accepts the same share of one labelled set's correctly classified inputs as
the emitted verdicts: ``data.test`` when the config gives it, else the calibration set.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from msgspec import UNSET

from boxwatch.agent.artifact import Artifact
from boxwatch.agent.boxes import ACCEPT, VERDICT_NAMES, BoxRuntime
from boxwatch.agent.inputs import one_line
from boxwatch.agent.preprocessing import Preprocessing
from boxwatch.agent.runtime import BOXES_PREFIX, MODEL_SPEC, ModelResult, MonitorRuntime
from boxwatch.offline.monitors.baselines import BASELINES as TABLE
from boxwatch.offline.monitors.baselines import (
    ClassScorer,
    OnFeatures,
    OnLogits,
    fit_on_best_layer,
    msp,
)
from boxwatch.offline.monitors.estimator import SELECTION_TOLERANCE
from boxwatch.offline.monitors.evaluation import aurc, auroc, outcomes_per_class, total
from boxwatch.offline.release.config import MONITOR_WARNINGS
from boxwatch.offline.release.records import (
    BaselineComparison,
    BaselineRow,
    BuildWarning,
    Evaluation,
    ModelErrors,
    MonitorFit,
    OutcomeRates,
    ScoreHistogram,
    VerdictShares,
)

UNKNOWN_LABEL = -1
RUN_BATCH = 8192  # rows per run_model call (the demo's sets fit in one)


def _edge_is_best(taus: list[float], aurocs: list[float | None] | None) -> bool:
    """Whether the finest or coarsest tau beats every other candidate's held-out-class
    AUROC by more than the selection's tolerance (a wider list might do better still).

    Picking the finest tau is the selection's tie-break among AUROCs within the tolerance
    of the best, so a pick at the edge alone says nothing about the list.
    """
    if not aurocs or len(aurocs) != len(taus) or len(taus) < 3:
        return False
    values = [v if v is not None else float("-inf") for v in aurocs]
    edges = {taus.index(max(taus)), taus.index(min(taus))}
    inner = max(v for i, v in enumerate(values) if i not in edges)
    return any(values[i] > inner + SELECTION_TOLERANCE for i in edges)


# Warnings (names accepted by ``policy.fail_on``), what each one means.
WARNINGS: dict[str, str] = {
    "low_known_acceptance": "the emitted verdicts accept less than target_acceptance minus "
    "3 points of the correctly classified known validation inputs",
    "tau_at_edge": "the finest or the coarsest candidate tau scores best for most layers, "
    "beyond the held-out-class selection's tolerance (selection f1: is chosen for most "
    "class-layer pairs): widen the candidate list",
    "empty_contrast": "score: fused, but no layer made the contrast term: the score is the "
    "distance score alone",
    "few_training_inputs": "a class has fewer than max(10, its good boxes in a layer) "
    "correctly classified training inputs",
    "input_not_monitored": "the model's input is not monitored (model.monitor_input: false, "
    "or it cannot be) and the monitored layers accept more than 10 points more of an "
    "unknown set than a monitor of the input alone would; without unknown sets to measure "
    "on, whenever the input is not monitored",
}
assert tuple(WARNINGS) == MONITOR_WARNINGS  # one vocabulary: the schema's enum
LOW_ACCEPTANCE_MARGIN = 0.03
MIN_TRAINING_INPUTS = 10
# input_not_monitored: accepted share of an unknown set above a monitor of the input alone.
INPUT_GAP = 0.10


@dataclass(frozen=True)
class SetVerdicts:
    """One data set as the agent saw it: labels (None: unknown), the emitted result, the
    model's logits and the monitored layers' activations (what feature baselines read)."""

    name: str
    y: np.ndarray | None
    result: ModelResult
    logits: np.ndarray
    acts: Mapping[str, np.ndarray]

    @property
    def right(self) -> np.ndarray:
        """Where the model's prediction is the label (a labelled set only)."""
        assert self.y is not None
        return np.asarray(self.result.predicted == self.y)


def agent_runtime(artifact: Artifact, tap: Any) -> MonitorRuntime:
    """The runtime :func:`boxwatch.agent.runtime.load_runtime` builds from ``artifact``'s
    members, with the already opened ``tap`` (opened as the agent opens it)."""
    spec = artifact.json(MODEL_SPEC)
    return MonitorRuntime(
        artifact=artifact,
        classes=[str(c) for c in spec["classes"]],
        model_version=str(spec.get("model_version", "unknown")),
        preprocessing=Preprocessing.from_dict(spec["preprocessing"]),
        tap=tap,
        boxes=BoxRuntime.from_members(artifact.json, artifact.arrays, prefix=BOXES_PREFIX),
        diagram=None,
        gate=None,
    )


def run_sets(
    runtime: MonitorRuntime, sets: Mapping[str, tuple[np.ndarray, np.ndarray | None]]
) -> dict[str, ModelResult]:
    """``run_model`` over each set's raw inputs, in batches of :data:`RUN_BATCH` rows."""
    out = {}
    for name, (x, _y) in sets.items():
        parts = [runtime.run_model(x[i : i + RUN_BATCH]) for i in range(0, len(x), RUN_BATCH)]
        out[name] = ModelResult(
            predicted=np.concatenate([p.predicted for p in parts]),
            verdicts=np.concatenate([p.verdicts for p in parts]),
            layer_verdicts={
                k: np.concatenate([p.layer_verdicts[k] for p in parts])
                for k in parts[0].layer_verdicts
            },
            scores=np.concatenate([p.scores for p in parts]),
            inference_seconds=sum(p.inference_seconds for p in parts),
            monitor_seconds=sum(p.monitor_seconds for p in parts),
        )
    return out


def shares(verdicts: np.ndarray) -> VerdictShares:
    """The share of each emitted verdict among ``verdicts``, and their count."""
    v = np.asarray(verdicts)
    return VerdictShares(
        **{
            name: float(np.mean(v == code)) if len(v) else 0.0
            for code, name in enumerate(VERDICT_NAMES)
        },
        n=len(v),
    )


def split(
    labelled: Mapping[str, tuple[np.ndarray, ModelResult]],
    unknown: Mapping[str, ModelResult],
) -> dict[str, VerdictShares]:
    """The verdict split: correct / misclassified known (per labelled set) and each unknown set.

    ``labelled`` maps a prefix (``""`` for validation, ``"test:"``) to (labels, result).
    """
    out: dict[str, VerdictShares] = {}
    for pre, (y, res) in labelled.items():
        right = res.predicted == y
        out[f"{pre}correct_known"] = shares(res.verdicts[right])
        out[f"{pre}misclassified_known"] = shares(res.verdicts[~right])
    for name, res in unknown.items():
        out[f"unknown:{name}"] = shares(res.verdicts)
    return out


def _finite_or_none(v: float | None) -> float | None:
    return None if v is None or not np.isfinite(v) else float(v)


def _rank_scores(scores: np.ndarray) -> np.ndarray:
    """Scores for ranking: NaN (a broken row, rejected) as the highest."""
    s = np.asarray(scores, np.float64)
    return np.where(np.isnan(s), np.inf, s)


def score_auroc(low: np.ndarray, high: np.ndarray) -> float | None:
    """AUROC of "``high`` scores higher", None when a side is empty."""
    if len(low) == 0 or len(high) == 0:
        return None
    return _finite_or_none(auroc(_rank_scores(low), _rank_scores(high)))


# The baselines the build computes, in table order: those on the model's logits, and those on
# one monitored layer's features (fitted on the training inputs'). ReAct is not among them: it
# needs the output layer's weights, which the build does not read from the model.
BASELINES: dict[str, OnLogits | OnFeatures] = {
    name: b for name, b in TABLE.items() if isinstance(b, OnLogits | OnFeatures)
}
BOX_METHOD = "box monitor (emitted accept)"
# Validation rows a feature baseline's layer choice ranks on (bench/detection.py samples as
# many for KNN); larger layers are left out (Mahalanobis inverts a features x features matrix).
LAYER_CHOICE_ROWS = 1000
MAX_BASELINE_FEATURES = 1024
# Training rows the feature baselines fit on at most (KNN keeps them all and scores against
# all of them; Mahalanobis' class means and covariance are as good from this many).
MAX_BASELINE_ROWS = 20000
HISTOGRAM_BINS = 30


def model_errors(y: np.ndarray, res: ModelResult, logits: np.ndarray | None) -> ModelErrors:
    """The model's wrong predictions: their verdict split, and how well the box score and
    MSP rank wrong above right predictions (AUROC, 0.5 = no better than chance)."""
    right = res.predicted == y
    auroc_msp = None
    if logits is not None:
        s = msp(logits)
        auroc_msp = score_auroc(s[right], s[~right])
    return ModelErrors(
        n=len(y),
        n_misclassified=int((~right).sum()),
        error_rate=float(np.mean(~right)) if len(y) else None,
        verdicts=shares(res.verdicts[~right]),
        auroc_score=score_auroc(res.scores[right], res.scores[~right]),
        auroc_msp=auroc_msp,
    )


@dataclass(frozen=True)
class Method:
    """One baseline as the comparison runs it: its name in :data:`BASELINES`, how it scores
    a set (higher: less trusted), and the monitored layer it reads (None: the logits)."""

    name: str
    score: Callable[[SetVerdicts], np.ndarray]
    layer: str | None = None


def logit_methods() -> list[Method]:
    """The baselines of :data:`BASELINES` on the model's logits alone."""
    return [
        Method(name, functools.partial(_on_logits, b.score))
        for name, b in BASELINES.items()
        if isinstance(b, OnLogits)
    ]


def _on_logits(score: Callable[[np.ndarray], np.ndarray], data: SetVerdicts) -> np.ndarray:
    return score(data.logits)


def _on_layer(scorer: ClassScorer, layer: str, data: SetVerdicts) -> np.ndarray:
    return scorer.score(_flat(data.acts[layer]))


def _flat(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).reshape(len(x), -1)


def baseline_rows(rows: np.ndarray, random_state: int | None) -> np.ndarray:
    """``rows`` (sorted training row indices), at most :data:`MAX_BASELINE_ROWS` of them
    drawn with ``random_state``, sorted: what the feature baselines fit on."""
    if len(rows) <= MAX_BASELINE_ROWS:
        return rows
    drawn = np.random.default_rng(random_state).permutation(len(rows))[:MAX_BASELINE_ROWS]
    return rows[np.sort(drawn)]


def feature_methods(
    train: tuple[Mapping[str, np.ndarray], np.ndarray],
    validation: tuple[Mapping[str, np.ndarray], np.ndarray],
    *,
    random_state: int | None = None,
) -> tuple[list[Method], dict[str, str]]:
    """The baselines of :data:`BASELINES` on features, each fitted on the training inputs'
    features of the monitored layer where it best tells the validation inputs' own class
    from the others (:func:`~boxwatch.offline.monitors.baselines.fit_on_best_layer`, on at
    most :data:`LAYER_CHOICE_ROWS` validation rows drawn with ``random_state``); and those
    that cannot be fitted (no layer of 2 to :data:`MAX_BASELINE_FEATURES` features, too few
    training inputs), by name with the reason.

    ``train`` and ``validation``: (activations by layer, labels), known inputs only.
    """
    (train_acts, y_train), (val_acts, y_val) = train, validation
    layers = [
        layer for layer, a in train_acts.items() if 2 <= _flat(a).shape[1] <= MAX_BASELINE_FEATURES
    ]
    rows = np.random.default_rng(random_state).permutation(len(y_val))[:LAYER_CHOICE_ROWS]
    methods, skipped = [], {}
    for name, baseline in BASELINES.items():
        if not isinstance(baseline, OnFeatures):
            continue
        if not layers:
            skipped[name] = f"no monitored layer has 2 to {MAX_BASELINE_FEATURES} features"
            continue
        try:
            layer, scorer = fit_on_best_layer(
                baseline,
                {layer: _flat(train_acts[layer]) for layer in layers},
                y_train,
                {layer: _flat(val_acts[layer])[rows] for layer in layers},
                y_val[rows],
            )
        except ValueError as exc:  # too few training inputs (per class) for the baseline
            skipped[name] = one_line(str(exc), 200)
            continue
        methods.append(Method(name, functools.partial(_on_layer, scorer, layer), layer))
    return methods, skipped


def _share(mask: np.ndarray) -> float | None:
    return float(np.mean(mask)) if len(mask) else None


def _row(
    method: str,
    data: SetVerdicts,
    unknown: Sequence[SetVerdicts],
    accepted: Callable[[SetVerdicts], np.ndarray],
    score: Callable[[SetVerdicts], np.ndarray],
    error_score: np.ndarray,
    **extra: Any,
) -> BaselineRow:
    """One row: the shares ``accepted`` keeps of ``data``'s correct and misclassified
    inputs and of each unknown set, ``score``'s AUROC of ``data`` against each unknown set,
    and how ``error_score`` (of ``data``'s inputs) ranks the model's mistakes."""
    right, mask = data.right, accepted(data)
    known_scores = score(data)
    errors = ~right
    return BaselineRow(
        method=method,
        correct_known=_share(mask[right]),
        misclassified_known=_share(mask[errors]),
        unknown={u.name: _share(accepted(u)) for u in unknown},
        auroc={u.name: score_auroc(known_scores, score(u)) for u in unknown},
        error_auroc=score_auroc(error_score[right], error_score[errors]),
        aurc=_finite_or_none(aurc(_rank_scores(error_score), errors)) if len(errors) else None,
        **extra,
    )


def _within(scores: Mapping[str, np.ndarray], t: float, data: SetVerdicts) -> np.ndarray:
    """Where ``data``'s precomputed scores are at most ``t`` (NaN never)."""
    return np.asarray(_rank_scores(scores[data.name]) <= t)


def _lookup(scores: Mapping[str, np.ndarray], data: SetVerdicts) -> np.ndarray:
    return scores[data.name]


def _emitted_accept(data: SetVerdicts) -> np.ndarray:
    return np.asarray(data.result.verdicts == ACCEPT)


def _box_score(data: SetVerdicts) -> np.ndarray:
    return data.result.scores


def comparison(
    point: Literal["test", "validation"],
    data: SetVerdicts,
    unknown: Sequence[SetVerdicts],
    methods: Sequence[Method],
    error_score: Callable[[SetVerdicts], np.ndarray],
    not_computed: Mapping[str, str] | None = None,
) -> BaselineComparison:
    """The box monitor's emitted verdicts on ``data`` (a labelled set) and on each unknown
    set, beside each of ``methods`` at the threshold that accepts the same share of
    ``data``'s correctly classified inputs as the emitted verdicts (a verdict counts as
    accepted only when it is ``accept``): the share each accepts of the misclassified inputs
    and of each unknown set, its AUROC against each unknown set, and how it ranks the model's
    mistakes (error AUROC, AURC). The box monitor ranks them by ``error_score(data)``
    (the runtime's :meth:`~boxwatch.agent.boxes.BoxRuntime.error_score` on the set), a
    baseline by its own score."""
    right = data.right
    emitted_accept = data.result.verdicts[right] == ACCEPT
    share = float(np.mean(emitted_accept)) if len(emitted_accept) else None
    rows = [
        _row(
            BOX_METHOD,
            data,
            unknown,
            _emitted_accept,
            _box_score,
            error_score(data),
        )
    ]
    n_accepted = int(emitted_accept.sum())
    for method in methods:
        scores = {d.name: method.score(d) for d in (data, *unknown)}
        known = np.sort(_rank_scores(scores[data.name][right]))
        # the n_accepted-th lowest score: accepts n_accepted inputs (more on ties)
        t = float(known[n_accepted - 1]) if n_accepted else -np.inf
        rows.append(
            _row(
                method.name,
                data,
                unknown,
                functools.partial(_within, scores, t),
                functools.partial(_lookup, scores),
                scores[data.name],
                threshold=_finite_or_none(t),
                layer=UNSET if method.layer is None else method.layer,
            )
        )
    return BaselineComparison(
        point=point,
        set=data.name,
        accepted_share=share,
        n_correct=int(right.sum()),
        n_misclassified=int((~right).sum()),
        rows=rows,
        not_computed=dict(not_computed or {}),
    )


def score_histogram(data: SetVerdicts, unknown: Sequence[SetVerdicts]) -> ScoreHistogram:
    """Histograms of the emitted score: ``data``'s correctly classified inputs (the
    reference), its misclassified ones and each unknown set, on shared edges from the
    lowest finite score to the 99th percentile (scores beyond the edges count in the end
    bins, non-finite ones in the last)."""
    right = data.right
    series = [data.result.scores[right], data.result.scores[~right]]
    series += [u.result.scores for u in unknown]
    finite = np.concatenate([s[np.isfinite(s)] for s in series])
    lo = float(finite.min()) if len(finite) else 0.0
    hi = float(np.quantile(finite, 0.99)) if len(finite) else 1.0
    edges = np.linspace(lo, max(hi, lo + 1e-9), HISTOGRAM_BINS + 1)

    def counts(s: np.ndarray) -> list[int]:
        clipped = np.clip(np.where(np.isfinite(s), s, edges[-1]), edges[0], edges[-1])
        return [int(c) for c in np.histogram(clipped, edges)[0]]

    return ScoreHistogram(
        set=data.name,
        edges=[float(e) for e in edges],
        correct_known=counts(series[0]),
        misclassified_known=counts(series[1]),
        unknown={u.name: counts(u.result.scores) for u in unknown},
    )


def outcome_table(y_true: np.ndarray, res: ModelResult, n_classes: int) -> Evaluation:
    """The six outcomes of the emitted verdicts (combined and per layer), as the summary keeps
    them (``evaluation``)."""
    pred = res.predicted

    def rates(verdicts: np.ndarray) -> OutcomeRates:
        o = total(outcomes_per_class(verdicts, y_true, pred, n_classes))
        return OutcomeRates(
            tp=o.tp,
            fp=o.fp,
            tn=o.tn,
            fn=o.fn,
            mp=o.mp,
            mn=o.mn,
            precision=o.precision,
            recall=o.recall,
            f1=o.f1,
        )

    return Evaluation(
        combined=rates(res.verdicts),
        per_layer={layer: rates(v) for layer, v in res.layer_verdicts.items()},
    )


def warnings(
    fit: MonitorFit,
    verdict_split: Mapping[str, VerdictShares],
    target: float,
    train_counts: Sequence[int],
    classes: Sequence[str] = (),
) -> list[BuildWarning]:
    """The build's warnings (names in :data:`WARNINGS`), in that order.

    ``target``: the monitor's target acceptance; ``train_counts``: correctly classified
    training inputs (those the boxes were fitted on) per class; ``classes``: their names,
    for the messages.
    """
    found = (
        _low_known_acceptance(verdict_split.get("correct_known"), target),
        _tau_at_edge(fit),
        _empty_contrast(fit),
        _few_training_inputs(fit, train_counts, classes),
    )
    return [w for w in found if w is not None]


def input_not_monitored(
    reason: str, measured: Mapping[str, tuple[float, float]]
) -> BuildWarning | None:
    """The ``input_not_monitored`` warning of a build that does not monitor the model's
    input (``reason``: why not): when some unknown set of ``measured`` (name: share the
    emitted verdicts accept, share a monitor of the input alone accepts) is accepted more
    than :data:`INPUT_GAP` more often, or when nothing was measured."""
    if not measured:
        return BuildWarning(
            name="input_not_monitored",
            message=f"{reason}; no unknown set measures what it lets through "
            "(add data.unknown or data.unknown_* sets, or monitor the input)",
        )
    over = [
        f"{name} {ours:.1%} accepted, {alone:.1%} by a monitor of the input alone"
        for name, (ours, alone) in measured.items()
        if ours - alone > INPUT_GAP
    ]
    if not over:
        return None
    return BuildWarning(name="input_not_monitored", message=f"{reason}: {'; '.join(over)}")


def _low_known_acceptance(correct: VerdictShares | None, target: float) -> BuildWarning | None:
    if correct is None or not correct.n or correct.accept >= target - LOW_ACCEPTANCE_MARGIN:
        return None
    return BuildWarning(
        name="low_known_acceptance",
        message=f"the emitted verdicts accept {correct.accept:.3f} of correctly "
        f"classified known validation inputs; target {target:.3f}",
    )


def _tau_at_edge(fit: MonitorFit) -> BuildWarning | None:
    taus = [float(t) for t in fit.taus]
    method = fit.tau_selection
    if len(taus) < 2 or method not in ("held-out-class", "f1"):
        return None
    edges = {max(taus), min(taus)}
    if method == "f1":
        picks = [float(t) for v in fit.tau.values() for t in v]
        at_edge = sum(t in edges for t in picks)
    else:
        picks = [float(v[0]) for v in fit.tau.values() if v]
        aurocs = fit.tau_auroc or {}
        at_edge = sum(
            _edge_is_best(taus, aurocs[layer]) if layer in aurocs else v[0] in edges
            for layer, v in fit.tau.items()
            if v
        )
    if not picks or at_edge <= len(picks) / 2:
        return None
    unit = "class-layer pairs" if method == "f1" else "layers"
    return BuildWarning(
        name="tau_at_edge",
        message=f"tau is the finest ({min(taus):g}) or coarsest ({max(taus):g}) candidate "
        f"for {at_edge} of {len(picks)} {unit}",
    )


def _empty_contrast(fit: MonitorFit) -> BuildWarning | None:
    if fit.score != "fused" or fit.contrast_layers:
        return None
    return BuildWarning(
        name="empty_contrast",
        message="score fused, but no layer reached the contrast term's AUROC "
        "bar: the score is the distance score alone",
    )


def _few_training_inputs(
    fit: MonitorFit, train_counts: Sequence[int], classes: Sequence[str]
) -> BuildWarning | None:
    few = []
    for cls, n in enumerate(train_counts):
        k = max([int(b.good[cls]) for b in fit.boxes.values() if cls < len(b.good)] + [0])
        need = max(MIN_TRAINING_INPUTS, k)
        if n < need:
            label = classes[cls] if cls < len(classes) else str(cls)
            few.append(f"class {label}: {n} < {need}")
    if not few:
        return None
    return BuildWarning(
        name="few_training_inputs",
        message="correctly classified training inputs: " + "; ".join(few),
    )
