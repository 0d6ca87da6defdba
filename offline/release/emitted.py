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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from boxwatch.agent.artifact import Artifact
from boxwatch.agent.boxes import ACCEPT, VERDICT_NAMES, BoxRuntime
from boxwatch.agent.preprocessing import Preprocessing
from boxwatch.agent.runtime import BOXES_PREFIX, MODEL_SPEC, ModelResult, MonitorRuntime
from boxwatch.offline.monitors.baselines import BASELINES as TABLE
from boxwatch.offline.monitors.baselines import OnLogits, msp
from boxwatch.offline.monitors.estimator import SELECTION_TOLERANCE
from boxwatch.offline.monitors.evaluation import (
    acceptance_threshold,
    auroc,
    outcomes_per_class,
    total,
)
from boxwatch.offline.release.config import MONITOR_WARNINGS
from boxwatch.offline.release.records import (
    BuildWarning,
    Evaluation,
    ModelErrors,
    MonitorFit,
    OutcomeRates,
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
}
assert tuple(WARNINGS) == MONITOR_WARNINGS  # one vocabulary: the schema's enum
LOW_ACCEPTANCE_MARGIN = 0.03
MIN_TRAINING_INPUTS = 10


@dataclass
class SetVerdicts:
    """One data set as the agent saw it: labels (None: unknown), verdicts, scores, logits."""

    name: str
    y: np.ndarray | None
    result: ModelResult
    logits: np.ndarray | None


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


# The baselines the build computes: the table's entries on the model's logits alone (the
# build keeps no training features for the others), in table order.
BASELINES: dict[str, OnLogits] = {name: b for name, b in TABLE.items() if isinstance(b, OnLogits)}


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


def baselines(
    val: tuple[np.ndarray, ModelResult, np.ndarray],
    unknown: Mapping[str, tuple[ModelResult, np.ndarray]],
    accepted_share: float,
    test: tuple[np.ndarray, ModelResult, np.ndarray] | None = None,
) -> list[dict[str, Any]]:
    """Each baseline of :data:`BASELINES` at the threshold that accepts ``accepted_share`` of
    the correctly classified known validation inputs (the monitor's own emitted accept
    share), beside the box monitor's row: the share each accepts of misclassified known
    inputs, of each unknown set and (``test``, at the validation threshold) of the test set's
    correct and misclassified inputs."""

    def share(mask: np.ndarray) -> float | None:
        return float(np.mean(mask)) if len(mask) else None

    def labelled(y: np.ndarray, res: ModelResult, accepted: np.ndarray) -> dict[str, Any]:
        right = res.predicted == y
        return {
            "correct_known": share(accepted[right]),
            "misclassified_known": share(accepted[~right]),
        }

    y, res, logits = val
    right = res.predicted == y
    box: dict[str, Any] = {
        "method": "box monitor (emitted accept)",
        **labelled(y, res, res.verdicts == ACCEPT),
        "unknown": {name: share(r.verdicts == ACCEPT) for name, (r, _l) in unknown.items()},
    }
    if test is not None:
        box["test"] = labelled(test[0], test[1], test[1].verdicts == ACCEPT)
    rows = [box]
    for method, baseline in BASELINES.items():
        fn = baseline.score
        s = fn(logits)
        if not right.any() or accepted_share <= 0:
            t = -np.inf
        else:
            t = acceptance_threshold(s[right], min(1.0, accepted_share))
        row: dict[str, Any] = {
            "method": method,
            "threshold": _finite_or_none(t),
            **labelled(y, res, s <= t),
            "unknown": {name: share(fn(lg) <= t) for name, (_r, lg) in unknown.items()},
        }
        if test is not None:
            row["test"] = labelled(test[0], test[1], fn(test[2]) <= t)
        rows.append(row)
    return rows


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
