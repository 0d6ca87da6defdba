"""The release build's data, typed: the config's sections in, the stages' outcomes and the
build summary (``summary.json``) out.

Config sections are built from the schema-valid raw config (:class:`~.config.BuildConfig`
``.spec``) and refuse unknown keys, as the schema does. A section holds what the user gave
and the defaults that belong to the config itself; the box monitor's parameters default in
:class:`~boxwatch.offline.monitors.estimator.BoxMonitor` alone (:meth:`MonitorSection.estimator`).

The summary records are what ``summary.json`` holds, field for field: :meth:`BuildSummary.to_json`
writes it, :meth:`BuildSummary.from_json` reads it back, and its JSON schema
(``docs/summary.schema.json``) is generated from them (:func:`summary_schema`). A field typed
``... | UnsetType`` is absent from the JSON when the build has nothing to say (no validation
set, no unknown set, ...). The report draws only from these records.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import numpy as np
from msgspec import UNSET, Meta, UnsetType

from boxwatch.agent.preprocessing import Preprocessing
from boxwatch.agent.taps import Tap
from boxwatch.offline.monitors.estimator import BoxMonitor

DEFAULT_COUNTEREXAMPLES = 10
UNKNOWN_MODEL_VERSION = "unknown"

R = TypeVar("R", bound=msgspec.Struct)


def _d(text: str) -> Meta:
    """A field's description (it goes into the generated JSON schema)."""
    return Meta(description=text)


def as_record(value: R | Mapping[str, Any], kind: type[R]) -> R:
    """``value`` as a ``kind`` record: a record as it is, a mapping (a summary.json's
    content) decoded; raises :class:`msgspec.ValidationError` (a ValueError) naming the field."""
    return value if isinstance(value, kind) else msgspec.convert(value, kind)


# ----------------------------------------------------------------------------- config in


class Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A section of the build config: unknown keys refused (as the schema refuses them)."""


class MetadataSection(Section, frozen=True):
    """``metadata``: what the artifact and the report are called."""

    name: str | None = None  # None: the config file's stem
    model_version: str = UNKNOWN_MODEL_VERSION
    description: str | None = None


class ModelSection(Section, frozen=True):
    """``model``: the monitored model and how its inputs are prepared."""

    path: str
    format: Literal["onnx", "torch"] = "onnx"
    input_name: str | None = None
    external_data: list[str] | None = None
    # The raw mapping :meth:`Preprocessing.from_dict` reads (it owns the defaults).
    preprocessing: dict[str, Any] = msgspec.field(default_factory=dict)
    pooling: str | dict[str, str] = "flatten"
    input_kind: str | None = None  # vocab.INPUT_KINDS (the schema checks); None: from the shape
    monitor_input: bool = True  # the model's input is monitored beside the layers
    device: str = "cpu"  # where activations are extracted: cpu, cuda, cuda:N


class DatasetSpec(Section, frozen=True):
    """One ``data.<name>`` entry: a file of inputs (and labels)."""

    path: str
    format: Literal["npz", "idx", "csv"] | None = None  # None: from the file name
    x: str = "x"  # npz: the inputs' array
    y: str | None = None  # npz: the labels' array ("y"); csv: the label column ("label")
    labels: str | None = None  # idx: the label file
    limit: int | None = None  # the first N inputs only


class MonitorSection(Section, frozen=True):
    """``monitor``: the box monitor's parameters the user gave, nothing else.

    Every other parameter takes :class:`BoxMonitor`'s own default: the build reads them
    back from the estimator (``get_params()``), never from this section.
    """

    tau: float | list[float] | Literal["search"] | UnsetType = UNSET
    selection: str | UnsetType = UNSET
    combine: str | UnsetType = UNSET
    normalize: str | UnsetType = UNSET
    score_layers: list[str] | UnsetType = UNSET
    score: str | UnsetType = UNSET
    score_mean: str | UnsetType = UNSET
    peak_factor: float | UnsetType = UNSET
    energy_term: bool | UnsetType = UNSET
    mahalanobis_term: bool | UnsetType = UNSET
    contrast_layers: list[str] | Literal["auto"] | UnsetType = UNSET
    contrast_classes: int | UnsetType = UNSET
    target_acceptance: float | UnsetType = UNSET
    confidence_share: int | float | Literal["auto"] | UnsetType = UNSET
    error_score: str | UnsetType = UNSET
    random_state: int | UnsetType = UNSET
    n_jobs: int | UnsetType = UNSET
    """Jobs of the per-class work, joblib's meaning (omitted: 1 unless inside a
    ``joblib.parallel_config`` context; -1 every core); the artifact does not depend on it."""

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any] | None) -> MonitorSection:
        """The record of a raw ``monitor`` mapping (None or empty: every default)."""
        return msgspec.convert(dict(raw or {}), cls, strict=False)

    def estimator_params(self, only: Collection[str] | None = None) -> dict[str, Any]:
        """:class:`BoxMonitor` keyword arguments for what the user gave (``only`` the
        named keys): ``tau`` a number is a fixed tau, a list the candidates of the search
        (descending, distinct), ``search`` the estimator's own candidates."""
        given = {
            k: v
            for k, v in msgspec.structs.asdict(self).items()
            if v is not UNSET and (only is None or k in only)
        }
        tau = given.pop("tau", None)
        if isinstance(tau, list):
            given["taus"] = sorted({float(t) for t in tau}, reverse=True)
        elif isinstance(tau, int | float):
            given["tau"] = float(tau)
        return given

    def estimator(
        self, layers: Sequence[str] | None, *, only: Collection[str] | None = None
    ) -> BoxMonitor:
        """The unfitted :class:`BoxMonitor` of this section (``only`` the named keys)."""
        return BoxMonitor(layers, **self.estimator_params(only))

    def with_jobs(self, n_jobs: int | None) -> MonitorSection:
        """This section with ``n_jobs`` in place of its own (``build-artifact --jobs``, which
        takes precedence over the config); None keeps the section's."""
        return self if n_jobs is None else msgspec.structs.replace(self, n_jobs=n_jobs)


def candidate_taus(monitor: BoxMonitor) -> list[float]:
    """The tau candidates ``monitor`` sweeps with ``tau="auto"``: its ``taus``, descending."""
    return sorted({float(t) for t in monitor.get_params()["taus"]}, reverse=True)


class BNSection(Section, frozen=True):
    """``bn``: the Bayesian-network classifier and the rules and queries it is checked on."""

    file: str
    class_: str = msgspec.field(name="class")
    decision: Literal["threshold", "argmax"] = "threshold"
    positive: str | None = None
    threshold: float | None = None
    features: list[str] | None = None
    order: list[str] | None = None
    rules: str | None = None
    fmo: str | None = None
    counterexamples: int = DEFAULT_COUNTEREXAMPLES
    max_memory: int | str | None = None
    repair: bool = False
    """Propose the smallest parameter changes that make each violated rule hold (report
    only: never applied)."""
    repair_proposals: int = 1
    """Proposals per violated rule."""
    repair_seconds: float = 60.0
    """Budget of the repair search (the pair search stops when it is spent)."""


class PolicySection(Section, frozen=True):
    """``policy``: what makes a built artifact fail its release (exit 1)."""

    fail_on: list[str] = msgspec.field(default_factory=list)
    min_recall: int | float | None = None
    min_precision: int | float | None = None
    max_unknown_acceptance: int | float | None = None


class BuildSpec(Section, frozen=True):
    """The whole build config as records (``BuildConfig.raw`` stays what the manifest signs)."""

    version: int
    metadata: MetadataSection = msgspec.field(default_factory=MetadataSection)
    model: ModelSection | None = None
    classes: list[str] | None = None
    layers: list[str] | Literal["auto"] = "auto"
    data: dict[str, DatasetSpec] = msgspec.field(default_factory=dict)
    monitor: MonitorSection = msgspec.field(default_factory=MonitorSection)
    bn: BNSection | None = None
    policy: PolicySection = msgspec.field(default_factory=PolicySection)


# ----------------------------------------------------------------------------- stage outcomes


LabelledData = tuple[np.ndarray, np.ndarray | None]


@dataclass(frozen=True)
class ModelInputs:
    """The model half of a validated config: the opened model and the loaded data sets."""

    path: Path
    files: list[tuple[str, Path]]  # (recorded name, real path): what the model digest covers
    format: str
    preprocessing: Preprocessing
    pooling: str | dict[str, str]
    layers: list[str]
    classes: list[str]
    tap: Tap
    data: dict[str, LabelledData]  # by data set name: inputs, labels (None: unknown set)
    # ``layers`` omitted or "auto": the layer choice picks them (build time); until then
    # ``layers`` is empty and ``tap`` taps nothing.
    auto: bool = False
    input_kind: str | None = None  # model.input_kind (None: inferred from the shape)
    monitor_input: bool = True  # model.monitor_input
    listed: list[str] | None = None  # the config's own list (without the input it adds)
    device: str = "cpu"  # model.device: where the taps run the model


# ----------------------------------------------------------------------------- summary out


class Record(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A part of ``summary.json``: unknown keys refused when one is read back."""


class Shares(Record, frozen=True):
    """Shares of a set's emitted verdicts (each in [0, 1]; 0 when the set is empty)."""

    accept: float
    uncertainty: float
    reject: float


class VerdictShares(Shares, frozen=True, kw_only=True):
    """Shares of a set's emitted verdicts, and the set's size."""

    n: Annotated[int, _d("inputs in the set")]


class Metadata(Record, frozen=True):
    """What was built, by which builder, when."""

    name: Annotated[str, _d("metadata.name of the config, else the config file's stem")]
    model_version: str
    builder_version: str
    created_at: Annotated[str, _d("the artifact's creation time, ISO 8601 UTC")]


class ArtifactSummary(Record, frozen=True):
    """The signed artifact."""

    artifact_id: str
    key_id: Annotated[str, _d("id of the signing key")]
    sha256: Annotated[str, _d("SHA-256 of the artifact file")]
    bytes: int
    path: Annotated[str, _d("where build-artifact wrote it")] | UnsetType = UNSET


class Accuracy(Record, frozen=True):
    """The model's accuracy on the labelled sets it was fitted and calibrated with."""

    train: float
    validation: float | UnsetType = UNSET


class ModelSummary(Record, frozen=True):
    """The monitored model."""

    path: str
    format: str
    digest: Annotated[str, _d("digest over every file the model loads")]
    classes: list[str]
    layers: Annotated[list[str], _d("monitored layers")]
    accuracy: Accuracy
    input_kind: (
        Annotated[str, _d("image, signal or vector: model.input_kind, else from the shape")]
        | UnsetType
    ) = UNSET


class BoxCounts(Record, frozen=True):
    """Boxes of one layer, per class (class order of ``model.classes``)."""

    good: list[int]
    bad: list[int]


class ShareChoice(Record, frozen=True):
    """How the share of the non-accepted budget given to *uncertainty* was chosen."""

    method: Annotated[str, _d("auto (on the labelled mistakes), default, or set (config)")]
    reason: str
    n_misclassified: int | UnsetType = UNSET
    shares: list[float] | UnsetType = UNSET
    misclassified_accepted: (
        Annotated[list[float], _d("misclassified calibration inputs accepted at each share")]
        | UnsetType
    ) = UNSET
    softmax_misclassified_accepted: (
        Annotated[float, _d("the same, softmax confidence alone at the same operating point")]
        | UnsetType
    ) = UNSET
    margin: (
        Annotated[float, _d("how far below softmax's figure the chosen share had to come")]
        | UnsetType
    ) = UNSET


class CalibrationSummary(Record, frozen=True):
    """The calibrated operating point: score threshold, and the error score's cut (error model)
    or floor (softmax confidence) with the share of the budget it was given."""

    threshold: Annotated[float | None, _d("inputs scoring above it are rejected")]
    target_acceptance: Annotated[float, _d("share of correctly classified known inputs to accept")]
    known_acceptance: Annotated[float | None, _d("share of the calibration population accepted")]
    unknown_acceptance: Annotated[float | None, _d("share of data.unknown accepted")]
    n_known: int
    n_unknown: int
    confidence_floor: (
        Annotated[float | None, _d("model confidence below it: uncertainty (null: no floor)")]
        | UnsetType
    ) = UNSET
    known_split: Shares | UnsetType = UNSET
    population: Annotated[str, _d("the inputs calibrated on")] | UnsetType = UNSET
    error_score: (
        Annotated[
            str | None,
            _d("what ranks the model's mistakes: error-model or softmax (null: no uncertainty)"),
        ]
        | UnsetType
    ) = UNSET
    error_cut: (
        Annotated[float | None, _d("error model's probability above it: uncertainty")] | UnsetType
    ) = UNSET
    confidence_share: (
        Annotated[float | None, _d("share of the non-accepted budget given to uncertainty")]
        | UnsetType
    ) = UNSET
    share_choice: ShareChoice | UnsetType = UNSET


class CoverageCurve(Record, frozen=True):
    """Clustering coverage of each class's good boxes at every candidate tau (Fig. 5)."""

    taus: list[float]
    per_class: list[list[float | None]]
    measure: Annotated[str, _d("what the values are")] | UnsetType = UNSET


class OutcomeCurve(Record, frozen=True):
    """The six outcomes (totals over classes) and the rates at every candidate tau (Fig. 7)."""

    taus: list[float]
    tp: list[int]
    fp: list[int]
    tn: list[int]
    fn: list[int]
    mp: list[int]
    mn: list[int]
    precision: list[float | None]
    recall: list[float | None]


class OutcomeRates(Record, frozen=True):
    """Counts of the six outcomes and the rates they give."""

    tp: int
    fp: int
    tn: int
    fn: int
    mp: int
    mn: int
    precision: float | None
    recall: float | None
    f1: float | None


class Histogram(Record, frozen=True):
    """Score histograms of known and unknown inputs (counts per bin)."""

    edges: list[float]
    known: list[int] | None
    unknown: list[int] | None


class DetectionSummary(Record, frozen=True):
    """How the score alone separates validation inputs from data.unknown."""

    auroc: float | None
    fpr_at_95: Annotated[
        float | None, _d("share of data.unknown under the 95% quantile of known scores")
    ]
    histogram: Histogram


class RowCounts(Record, frozen=True):
    """Rows the layer choice ranked on."""

    train: int
    validation: int


class LayerCandidate(Record, frozen=True):
    """One candidate layer, and why it was (not) monitored."""

    layer: Annotated[str, _d("the graph's name (ONNX tensor, torch module)")]
    kind: str
    features: Annotated[int | None, _d("after the row's pooling")]
    auroc: Annotated[float | None, _d("held-out-class AUROC (layers: auto)")]
    tau: float | None
    rank: int | None
    chosen: Annotated[bool, _d("monitored")]
    reason: str
    pooling: Annotated[str, _d("how its maps become features")] | UnsetType = UNSET
    modules: (
        Annotated[list[str], _d("the torch modules whose output it is (config names too)")]
        | UnsetType
    ) = UNSET
    pooling_auroc: (
        Annotated[
            dict[str, float | None],
            _d("a map auto pooled: held-out-class AUROC by pooling tried"),
        ]
        | UnsetType
    ) = UNSET


class LayerChoiceSummary(Record, frozen=True):
    """Where the monitored layers came from: the config's list, or ``layers: auto``."""

    mode: Literal["auto", "config"]
    rule: str
    layers: list[str]
    set: str | UnsetType = UNSET
    rows: RowCounts | UnsetType = UNSET
    pooling: Annotated[dict[str, str], _d("by layer")] | UnsetType = UNSET
    seconds: float | UnsetType = UNSET
    candidates: list[LayerCandidate] | UnsetType = UNSET


class VerdictsSummary(Record, frozen=True):
    """The emitted verdicts' split, as the agent's runtime gave them."""

    set: Annotated[str, _d("the known inputs of the split")]
    split: Annotated[
        dict[str, VerdictShares],
        _d(
            "by set: correct_known, misclassified_known, unknown:<name>; "
            "test:correct_known, test:misclassified_known with data.test"
        ),
    ]


class Evaluation(Record, frozen=True):
    """Outcome counts of the emitted verdicts on validation + data.unknown."""

    combined: OutcomeRates
    per_layer: Annotated[dict[str, OutcomeRates], _d("each layer's own box verdict")]


class ModelErrors(Record, frozen=True):
    """The model's wrong predictions on one labelled held-out set."""

    n: int
    n_misclassified: int
    error_rate: float | None
    verdicts: Annotated[VerdictShares, _d("split of the misclassified inputs")]
    auroc_score: Annotated[float | None, _d("box score, wrong above right predictions")]
    auroc_msp: Annotated[float | None, _d("the same for minus the max softmax probability")]


class LabelledAcceptance(Record, frozen=True):
    """Shares accepted of a labelled set's correctly and wrongly classified inputs."""

    correct_known: float | None
    misclassified_known: float | None


class BaselineRow(LabelledAcceptance, frozen=True, kw_only=True):
    """One method at the comparison's matched point: what it accepts and how its score ranks."""

    method: Annotated[str, _d("the box monitor's row, else the baseline table's name")]
    unknown: Annotated[dict[str, float | None], _d("share accepted, by unknown set")]
    auroc: Annotated[
        dict[str, float | None],
        _d("score AUROC of the point's known inputs against each unknown set, by set"),
    ]
    error_auroc: Annotated[
        float | None,
        _d(
            "AUROC of the score for the point's misclassified above its correctly classified "
            "inputs (the box monitor: its error score, which the uncertainty verdict thresholds)"
        ),
    ]
    aurc: Annotated[
        float | None,
        _d("area under the risk-coverage curve of that ranking (lower is better)"),
    ]
    threshold: (
        Annotated[float | None, _d("the baseline's score threshold (accepted: at most it)")]
        | UnsetType
    ) = UNSET
    layer: Annotated[str, _d("the monitored layer a feature baseline reads")] | UnsetType = UNSET


class BaselineComparison(Record, frozen=True):
    """The emitted verdicts beside every baseline the build computes, each baseline at the
    threshold that accepts the same share of one labelled set's correctly classified known
    inputs as the emitted verdicts do (the matched point)."""

    point: Annotated[
        Literal["test", "validation"],
        _d("test: matched on data.test; validation: on the calibration set (no data.test)"),
    ]
    set: Annotated[str, _d("the labelled inputs matched on")]
    accepted_share: Annotated[
        float | None,
        _d("share of the set's correctly classified inputs the emitted verdicts accept"),
    ]
    n_correct: int
    n_misclassified: int
    rows: Annotated[list[BaselineRow], _d("the box monitor's row, then one per baseline")]
    not_computed: Annotated[
        dict[str, str], _d("baselines of the table the build did not compute, and why")
    ] = msgspec.field(default_factory=dict)


class ScoreHistogram(Record, frozen=True):
    """Emitted score histograms (counts per bin, scores outside the edges in the end bins):
    one labelled set's correctly classified inputs (the reference), its misclassified ones,
    and every unknown set."""

    set: Annotated[str, _d("the labelled inputs")]
    edges: list[float]
    correct_known: list[int]
    misclassified_known: list[int]
    unknown: Annotated[dict[str, list[int]], _d("by unknown set")]


class OperatingPoint(Record, frozen=True):
    """What the emitted verdicts do with one unknown set."""

    set: str
    n: int
    acceptance: Annotated[float, _d("share accepted (false accepts)")]
    auroc: Annotated[float | None, _d("score AUROC against the known validation inputs")]
    accept: float | UnsetType = UNSET
    uncertainty: float | UnsetType = UNSET
    reject: float | UnsetType = UNSET


class BuildWarning(Record, frozen=True):
    """A warning of the build (``name`` can be listed in ``policy.fail_on``)."""

    name: str
    message: str


class MonitorFit(Record, frozen=True):
    """The fitted box monitor: its layers, taus, boxes, calibration and curves."""

    layers: list[str]
    taus: Annotated[list[float], _d("candidate taus, descending")]
    tau: Annotated[dict[str, list[float]], _d("chosen tau by layer, per class")]
    tau_selection: Annotated[str, _d("held-out-class, f1, coverage or fixed")]
    score: str
    contrast_layers: list[str]
    calibration_set: str
    boxes: dict[str, BoxCounts]
    calibration: CalibrationSummary
    tau_auroc: (
        Annotated[dict[str, list[float | None]], _d("held-out-class AUROC per candidate tau")]
        | UnsetType
    ) = UNSET
    curves: dict[str, OutcomeCurve] | UnsetType = UNSET
    detection: DetectionSummary | UnsetType = UNSET
    coverage: dict[str, CoverageCurve] | UnsetType = UNSET


class MonitorSummary(MonitorFit, frozen=True, kw_only=True):
    """The box monitor: the fit, and what its emitted verdicts do on the build's data."""

    operating_points: Annotated[list[OperatingPoint], _d("one per unknown set")]
    layer_choice: LayerChoiceSummary | UnsetType = UNSET
    verdicts: VerdictsSummary | UnsetType = UNSET
    evaluation: Evaluation | UnsetType = UNSET
    model_errors: Annotated[dict[str, ModelErrors], _d("by labelled set")] | UnsetType = UNSET
    baselines: BaselineComparison | UnsetType = UNSET
    histogram: ScoreHistogram | UnsetType = UNSET
    warnings: list[BuildWarning] | UnsetType = UNSET


class TiePair(Record, frozen=True):
    """Inputs whose two class states tie (``decision: argmax``)."""

    states: list[str]
    inputs: int


class RuleSummary(Record, frozen=True):
    """One if-then rule and its verdict on the compiled classifier."""

    id: str
    premise: Annotated[dict[str, list[str]], _d("allowed states by feature")]
    conclusion: str
    verdict: str
    violations: Annotated[int, _d("violating inputs")]
    probability: Annotated[float | None, _d("probability mass of the violating inputs")]
    counterexamples: list[dict[str, list[str]]]


class FmoSummary(Record, frozen=True):
    """One feature-monotonicity query and its verdict."""

    id: str
    feature: str
    kind: str
    verdict: str
    reason: str
    given: dict[str, list[str]]
    witness: Annotated[
        dict[str, Any] | None, _d("fixed features, the rising values and the classes they get")
    ]


class RepairChange(Record, frozen=True):
    """One CPT entry a repair proposal changes (numbers as decimal strings, exact)."""

    parameter: Annotated[str, _d("P(variable=state | parents=row)")]
    variable: str
    row: Annotated[dict[str, str], _d("the parents' states of the CPT row")]
    state: str
    old: str
    new: str
    row_old: Annotated[list[str], _d("the CPT row as written before")]
    row_new: Annotated[list[str], _d("the CPT row as the proposal writes it")]


class RepairProposal(Record, frozen=True):
    """A proposed repaired network: its changes, their size, its re-verification."""

    changes: list[RepairChange]
    change: Annotated[str, _d("largest absolute change of one CPT entry")]
    minimum: Annotated[
        str | None, _d("single parameter: the smallest change that parameter allows, exact")
    ]
    flips: Annotated[int, _d("inputs whose decision differs from the original network's")]
    reverified: Annotated[bool, _d("the written network, compiled and verified: rules hold")]
    verdicts: Annotated[dict[str, str], _d("every rule's and query's verdict on it")]
    file: Annotated[str, _d("the proposal's file name (in the report folder's repairs/)")]


class RepairReason(Record, frozen=True):
    """Why one parameter alone cannot repair a target (exact)."""

    parameter: str
    rule: str
    kind: Annotated[str, _d("unmovable, conflict, together or breaks")]
    why: str


class RepairTarget(Record, frozen=True):
    """The repairs of one violated rule (or of all of them together: ``all rules``)."""

    target: str
    rules: Annotated[list[str], _d("the rules that must hold: the target's and those that held")]
    verdict: Annotated[str, _d("single parameter, pair, none (proved) or none found")]
    proposals: list[RepairProposal]
    parameters: Annotated[int, _d("parameters examined")]
    complete: Annotated[bool, _d("every parameter was examined (the proof stands)")]
    no_single_parameter: Annotated[
        list[RepairReason], _d("when no single parameter repairs: each one's reason")
    ]
    pairs_tried: int
    pairs_total: int


class BNSummary(Record, frozen=True):
    """The compiled Bayesian-network classifier and its verified rules and queries."""

    file: str
    class_: str = msgspec.field(name="class")
    positive: str | None
    threshold: float | None
    features: list[str]
    order: list[str]
    states: dict[str, list[str]]
    nodes: int
    nodes_quasi: int
    positives: int | None
    inputs: int
    ties: int
    seconds: float
    rules: list[RuleSummary]
    fmo: list[FmoSummary]
    decision: str | UnsetType = UNSET
    terminals: list[str] | UnsetType = UNSET
    decided: Annotated[dict[str, int], _d("inputs by decided state")] | UnsetType = UNSET
    tie_pairs: list[TiePair] | UnsetType = UNSET
    exact_inputs: int | UnsetType = UNSET
    certified: bool | UnsetType = UNSET
    repairs: (
        Annotated[list[RepairTarget], _d("bn.repair: proposals per violated rule (not applied)")]
        | UnsetType
    ) = UNSET


class PolicyResult(Record, frozen=True):
    """The config's policy and what of it failed (non-empty: exit 1)."""

    fail_on: list[str]
    failed: list[str] = msgspec.field(default_factory=list)


class BuildSummary(Record, frozen=True):
    """``summary.json``: what one ``build-artifact`` run built, and how it scored."""

    metadata: Metadata
    artifact: ArtifactSummary
    policy: PolicyResult
    model: ModelSummary | UnsetType = UNSET
    monitor: MonitorSummary | UnsetType = UNSET
    bn: BNSummary | UnsetType = UNSET
    timings: Annotated[dict[str, float], _d("seconds by step")] | UnsetType = UNSET

    def policy_failures(self, policy: PolicySection) -> list[str]:
        """Human-readable reasons why the built artifact breaks ``policy`` (empty: none)."""
        failed = []
        fail_on = set(policy.fail_on)
        bn = self.bn if isinstance(self.bn, BNSummary) else None
        if "rule_violated" in fail_on and bn is not None:
            bad = [r.id for r in bn.rules if r.verdict == "violated"]
            if bad:
                failed.append(f"rule_violated: {', '.join(bad)}")
        if "fmo_violated" in fail_on and bn is not None:
            bad = [q.id for q in bn.fmo if q.verdict == "violated"]
            if bad:
                failed.append(f"fmo_violated: {', '.join(bad)}")
        if "bn_ties" in fail_on and bn is not None and bn.ties:
            failed.append(f"bn_ties: {bn.ties} inputs have a posterior exactly T")
        mon = self.monitor if isinstance(self.monitor, MonitorSummary) else None
        ev = mon.evaluation.combined if mon and isinstance(mon.evaluation, Evaluation) else None
        for key, limit, name in (
            ("min_recall", policy.min_recall, "recall"),
            ("min_precision", policy.min_precision, "precision"),
        ):
            value = None if ev is None else getattr(ev, name)
            if limit is not None and (value is None or value < limit):
                failed.append(f"{key}: {name} {value} < {limit}")
        limit = policy.max_unknown_acceptance
        if limit is not None:
            points = mon.operating_points if mon else []
            over = [f"{p.set} {p.acceptance:.4g}" for p in points if p.acceptance > limit]
            if not points:
                failed.append("max_unknown_acceptance: no unknown set to measure")
            elif over:
                failed.append(f"max_unknown_acceptance: {', '.join(over)} > {limit}")
        for warning in mon.warnings if mon and mon.warnings else []:
            if warning.name in fail_on:
                failed.append(f"{warning.name}: {warning.message}")
        return failed

    def judged(self, policy: PolicySection) -> BuildSummary:
        """This summary with ``policy``'s verdict on it (``policy.failed``)."""
        verdict = PolicyResult(fail_on=list(policy.fail_on), failed=self.policy_failures(policy))
        return msgspec.structs.replace(self, policy=verdict)

    def written_to(self, path: str | Path) -> BuildSummary:
        """This summary with the path the artifact was written to (``artifact.path``)."""
        artifact = msgspec.structs.replace(self.artifact, path=str(path))
        return msgspec.structs.replace(self, artifact=artifact)

    def to_dict(self) -> dict[str, Any]:
        """The summary as plain JSON values (what ``summary.json`` holds)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out

    def to_json(self) -> str:
        """The canonical ``summary.json`` text: see :func:`summary_text`."""
        return summary_text(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BuildSummary:
        """The record of a ``summary.json``'s content; raises :class:`msgspec.ValidationError`."""
        return msgspec.convert(data, cls)

    @classmethod
    def from_json(cls, text: str | bytes) -> BuildSummary:
        """Read a ``summary.json`` text; raises :class:`msgspec.ValidationError`."""
        return msgspec.json.decode(text, type=cls)


def summary_text(summary: Mapping[str, Any]) -> str:
    """The canonical ``summary.json`` text (sorted keys, indent 2, trailing newline).

    Raises ValueError listing every non-finite float or non-JSON value by its path, so a
    summary builder learns all of them at once.
    """
    problems = list(_json_problems(summary, "summary"))
    if problems:
        raise ValueError("summary is not plain finite JSON at: " + ", ".join(problems))
    return json.dumps(summary, indent=2, sort_keys=True, allow_nan=False) + "\n"


def _json_problems(obj: Any, where: str) -> Iterator[str]:
    """Paths under ``obj`` holding non-finite floats or values JSON cannot hold as-is."""
    if obj is None or isinstance(obj, str | bool | int):
        return
    if isinstance(obj, float):
        if not math.isfinite(obj):
            yield f"{where}={obj!r}"
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            if not isinstance(key, str):
                yield f"{where}[{key!r}] (non-string key)"
            yield from _json_problems(value, f"{where}.{key}")
    elif isinstance(obj, list | tuple):
        for i, value in enumerate(obj):
            yield from _json_problems(value, f"{where}[{i}]")
    else:
        yield f"{where} ({type(obj).__name__})"


def summary_schema() -> dict[str, Any]:
    """The JSON schema of ``summary.json``, generated from :class:`BuildSummary`."""
    generated = msgspec.json.schema(BuildSummary)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "boxwatch build summary (summary.json)",
        **generated,
    }


def summary_schema_text() -> str:
    """:func:`summary_schema` as ``docs/summary.schema.json`` holds it (``tools/summary_schema.py``
    writes it)."""
    return json.dumps(summary_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
