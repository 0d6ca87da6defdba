"""Refit: a parent artifact and reviewed captures become a signed, checked child artifact.

:func:`refit` takes the parent artifact (verified: signature, digests, and the model's
digest against the model file its build config names), the **build config it was built
from** (refused unless its file digest, else its values, equal what the parent records),
and the labelled captures (:class:`~.feedback.LabelledCaptures`). It reads the training,
validation and unknown sets the config names with the build's own loaders (the training
set refused unless its digest is the one the parent stores, where it stores one) and runs
them through the model as the build does.

* **Affected classes**: the parent model's predicted class of each capture labelled
  ``correct`` (one more *good* row of that class) or ``wrong: t`` (one more *bad* row of
  its predicted class): the box monitor's good and bad boxes are per predicted class.
  ``unknown`` and ``new`` captures change no box; they join the unknowns the table
  measures. A capture whose input the model does not predict as the join says, or whose
  label contradicts the prediction, or whose activations are not finite, is left out (and
  listed).
* **Re-clustering**: each affected class, in each monitored layer, is clustered again by
  the build's tau-k-means (:func:`~boxwatch.offline.monitors.estimator.build_sweep` on
  those classes only, with the build's candidate taus, the parent's tau of that class and
  layer, and the build's seed) on its training rows (the training inputs the model
  predicts as the class, found from the predictions the build stores:
  :mod:`~boxwatch.offline.release.train_predictions`; only those rows go through the model)
  and its captured rows. Every other class keeps the parent's boxes byte for byte.
* **Recalibration**: the threshold, confidence floor and error model are set as the build
  sets them (:meth:`BoxMonitor.calibrate` on the validation set, with ``data.unknown``).
  Labelled captures do not join the calibration population: they are the tail the parent
  rejected or doubted, not a sample of the stream, so counting them would move the
  threshold for every class; they act through their classes' boxes.
* **Guards** (policy): the child must accept at least ``target_acceptance`` − 2 points of
  the validation set's correctly classified inputs, and no unknown set more than 1 point
  above the parent; otherwise :class:`RefitGuardError` and nothing is written, unless
  ``allow_guard_failure`` (the overridden guards are recorded).
* **Child**: the parent's members with the box monitor replaced and :data:`REFIT` added
  (the parent's id and sha256, each affected class's box counts before and after and the
  captures used, the old and new operating point, the before/after table, the guards),
  signed with the release key by the build's artifact writer; its manifest's contents
  name the parent too.

docs/monitors.md ("Refitting from labelled captures") is the user's account.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from threadpoolctl import threadpool_limits

from boxwatch.agent.artifact import (
    Artifact,
    build_artifact_bytes,
    canonical_json,
    load_artifact,
    resolve_created_at,
    write_artifact,
)
from boxwatch.agent.boxes import ACCEPT, REJECT, BoxRuntime, BoxSet
from boxwatch.agent.errors import ArtifactError, BoxwatchError, ConfigError
from boxwatch.agent.inputs import quote, show_path
from boxwatch.agent.keys import key_id, load_private_key, load_trusted_keys
from boxwatch.agent.members import BOXES_PREFIX, MODEL_SPEC, REFIT, REFIT_ROWS
from boxwatch.agent.runtime import check_model_digest
from boxwatch.agent.taps import open_tap
from boxwatch.offline.monitors.estimator import BoxMonitor, build_sweep
from boxwatch.offline.monitors.taukmeans import direct_kmeans
from boxwatch.offline.progress import Progress
from boxwatch.offline.refit.feedback import CORRECT, NEW, UNKNOWN, WRONG, LabelledCaptures
from boxwatch.offline.release.config import BuildConfig, load_config, unknown_sets
from boxwatch.offline.release.emitted import shares
from boxwatch.offline.release.monitor_stage import Tapped
from boxwatch.offline.release.pipeline import (
    EXTRACT_BATCH,
    check_out_path,
    extract,
    prepare_model,
)
from boxwatch.offline.release.records import ModelInputs, candidate_taus
from boxwatch.offline.release.train_predictions import stored_predictions

REFIT_FORMAT = "boxwatch.refit"
REFIT_VERSION = 1
# The guards: the child accepts at least target_acceptance minus this of the validation
# set's correctly classified inputs, and of each unknown set at most the parent's share
# plus this (shares, not points).
KNOWN_SLACK = 0.02
UNKNOWN_SLACK = 0.01
# Shares are counts over a set's size: a difference within this is rounding, not a change.
SHARE_TOLERANCE = 1e-9
# The training set goes through the model this many rows at a time; only the rows of
# affected classes are kept.
TRAIN_CHUNK = 16 * EXTRACT_BATCH
# Left-out captures listed by id in refit.json at most (the count is always given).
MAX_LISTED = 100
VALIDATION, CAPTURES = "validation", "captures"
CORRECT_KNOWN, MISCLASSIFIED_KNOWN = "correct_known", "misclassified_known"
CAPTURED_UNKNOWN = "unknown"
KNOWN_GUARD = "known_acceptance"
UNKNOWN_GUARD = "unknown_acceptance"


class RefitGuardError(BoxwatchError):
    """A refit broke its guards (policy: the CLI exits 1); no child was written.

    ``failures`` says which guard and by how much; ``summary`` is the refit's summary
    (its child fields empty), so the table can still be shown."""

    def __init__(self, failures: list[str], summary: RefitSummary):
        self.failures = list(failures)
        self.summary = summary
        super().__init__(
            f"refit guards failed: {'; '.join(self.failures)} (no child written; "
            "allow_guard_failure writes it anyway)"
        )


@dataclass(frozen=True)
class ClassChange:
    """One affected class: the captures that changed it and its box counts per layer."""

    name: str
    index: int
    correct: list[str]  # ids of the captures labelled correct: good rows added
    wrong: list[str]  # ids of the captures labelled wrong: bad rows added
    good: dict[str, tuple[int, int]]  # layer -> good boxes (before, after)
    bad: dict[str, tuple[int, int]]  # layer -> bad boxes (before, after)

    def as_dict(self) -> dict[str, Any]:
        return {
            "class": self.name,
            "index": self.index,
            "captures": {CORRECT: len(self.correct), WRONG: len(self.wrong)},
            "ids": {CORRECT: list(self.correct), WRONG: list(self.wrong)},
            "boxes": {
                layer: {"good": list(self.good[layer]), "bad": list(self.bad[layer])}
                for layer in self.good
            },
        }


@dataclass(frozen=True)
class OperatingPoint:
    """Where a box monitor accepts: its score threshold, confidence floor and error cut."""

    threshold: float | None
    confidence_floor: float | None
    error_cut: float | None

    @classmethod
    def of(cls, rt: BoxRuntime) -> OperatingPoint:
        return cls(
            rt.threshold,
            rt.confidence_floor,
            None if rt.error_model is None else rt.error_model.threshold,
        )

    def as_dict(self) -> dict[str, Any]:
        return {k: _finite(v) for k, v in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class TableRow:
    """One line of the before/after table: a share of a set's inputs accepted."""

    data: str  # VALIDATION (the parent's validation and unknown sets) or CAPTURES
    measure: str  # CORRECT_KNOWN, MISCLASSIFIED_KNOWN, or "unknown:<set>" / CAPTURED_UNKNOWN
    n: int
    before: float | None  # None: the set is empty
    after: float | None

    def label(self) -> str:
        """The measure as the table prints it."""
        if self.measure == CORRECT_KNOWN:
            return "correct known accepted"
        if self.measure == MISCLASSIFIED_KNOWN:
            return "misclassified accepted"
        if self.measure == CAPTURED_UNKNOWN:
            return "unknowns accepted"
        return f"{self.measure.removeprefix('unknown:')} (unknown) accepted"


@dataclass(frozen=True)
class Guard:
    """One guard of the refit: the child's value against its limit."""

    name: str  # KNOWN_GUARD, or UNKNOWN_GUARD:<set>
    limit: float
    value: float
    passed: bool

    def failure(self) -> str:
        """Why the guard failed, in one phrase."""
        if self.name == KNOWN_GUARD:
            return (
                f"{self.name}: the child accepts {self.value:.1%} of the correct validation "
                f"inputs, below {self.limit:.1%} (target - {KNOWN_SLACK:.0%})"
            )
        return (
            f"{self.name}: the child accepts {self.value:.1%} of the set, above "
            f"{self.limit:.1%} (the parent's + {UNKNOWN_SLACK:.0%})"
        )


@dataclass(frozen=True)
class RefitSummary:
    """What one refit did: the record the child carries (:meth:`record`), the child itself,
    and how long it took; :meth:`table_rows` is the before/after table a CLI prints."""

    parent_id: str
    parent_sha256: str
    classes: list[ClassChange]
    before: OperatingPoint
    after: OperatingPoint
    table: list[TableRow]
    guards: list[Guard]
    overridden: list[str]  # names of failed guards the child was written despite
    captures: dict[str, int]  # used captures by label kind, and "left_out"
    left_out: list[str]  # "<id>: why" of each capture left out
    child_id: str | None = None  # None: no child written (a guard failed)
    child_sha256: str | None = None
    path: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def failed(self) -> list[Guard]:
        """The guards that failed (overridden or not)."""
        return [g for g in self.guards if not g.passed]

    def record(self) -> dict[str, Any]:
        """What :data:`REFIT` holds: parent, changes, operating points, table, guards."""
        return {
            "format": REFIT_FORMAT,
            "version": REFIT_VERSION,
            "parent": {"artifact_id": self.parent_id, "sha256": self.parent_sha256},
            "classes": [c.as_dict() for c in self.classes],
            "operating_point": {"before": self.before.as_dict(), "after": self.after.as_dict()},
            "table": [dataclasses.asdict(r) for r in self.table],
            "guards": [dataclasses.asdict(g) for g in self.guards],
            "overridden": list(self.overridden),
            "captures": dict(self.captures),
            "left_out": self.left_out[:MAX_LISTED],
        }

    def to_dict(self) -> dict[str, Any]:
        """The summary as plain JSON values (the record, the child and the timings)."""
        return {
            **self.record(),
            "child": {
                "artifact_id": self.child_id,
                "sha256": self.child_sha256,
                "path": self.path,
            },
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
        }

    def table_rows(self) -> list[tuple[str, str, str, str, str]]:
        """The before/after table: a header, then one row per measure."""

        def pct(v: float | None) -> str:
            return "-" if v is None else f"{v:.1%}"

        rows = [("data", "measure", "n", "before", "after")]
        rows += [(r.data, r.label(), f"{r.n:,}", pct(r.before), pct(r.after)) for r in self.table]
        return rows


def refit(
    parent: Path,
    public_keys: list[str],
    config: Path,
    labelled: LabelledCaptures,
    *,
    private_key: Path,
    out: Path,
    allow_guard_failure: bool = False,
    created_at: int | None = None,
    progress: Progress | None = None,
) -> RefitSummary:
    """Re-cluster the classes the labelled captures touch, recalibrate, check the guards
    and write the signed child artifact to ``out`` (see the module's docstring).

    Raises :class:`~boxwatch.agent.errors.ArtifactError` (parent untrusted or tampered
    with, model digest mismatch), :class:`ConfigError` (config or training data not the
    parent's, no validation set, no usable label, bad ``out``), ``KeyFileError`` and
    :class:`RefitGuardError` (a guard failed, not allowed: nothing written).
    ``created_at``: the child's creation time (default ``SOURCE_DATE_EPOCH``, else now;
    never before the parent's, :class:`ConfigError` otherwise).
    """
    start = time.perf_counter()
    progress = Progress(mode="off") if progress is None else progress
    problems = check_out_path(out)
    if problems:
        raise ConfigError(problems)
    signer = load_private_key(private_key)
    art = load_artifact(parent, load_trusted_keys(list(public_keys)))
    parent_sha = _parent_digest(parent, art)
    created_at = resolve_created_at(created_at)
    if created_at < art.created_at:
        raise ConfigError(
            f"the child's creation time {created_at} is before its parent's "
            f"({art.created_at}): an agent would refuse it as a rollback"
        )
    if MODEL_SPEC not in art.members:
        raise ConfigError(f"{show_path(parent)}: the artifact monitors no model; nothing to refit")
    cfg = load_config(config)
    _check_config(cfg, art.manifest.get("config"), parent)
    m = cfg.spec.model
    if m is None:  # the config matched the parent's, which monitors a model
        raise ConfigError(f"{show_path(config)}: the config has no model section")
    model_path = check_model_digest(art, cfg.resolve(m.path))
    mi = _model(prepare_model(cfg), art, model_path)
    if "validation" not in mi.data:
        raise ConfigError(
            f"{show_path(config)}: the refit recalibrates and guards on data.validation; "
            "the config has none"
        )
    old = BoxRuntime.from_members(art.json, art.arrays, prefix=BOXES_PREFIX)
    seconds: dict[str, float] = {}

    t0 = time.perf_counter()
    stored = stored_predictions(art, *mi.data["train"], len(mi.classes))
    unknowns = set(unknown_sets(mi.data))
    measured = [name for name in mi.data if name == VALIDATION or name in unknowns]
    inputs = _captured_inputs(labelled, mi)
    total = sum(len(mi.data[name][0]) for name in ["train", *measured]) + len(inputs)
    earlier = _earlier_rows(art, mi)
    total += len(earlier[0])
    with progress.phase("refit: extracting activations", total) as bar:
        caught = _tap(mi, inputs, None, bar) if len(inputs) else None
        used = _usable(labelled, caught, len(mi.classes))
        affected = sorted({int(c) for c in used.pred[used.boxed]})
        kept = _carried(earlier, inputs[used.boxed])
        carried = _tap(mi, kept[0], kept[1], bar) if len(kept[0]) else None
        train = _train_rows(mi, affected, stored, bar)
        sets = {name: _tap(mi, *mi.data[name], bar) for name in measured}
    seconds["extract"] = time.perf_counter() - t0

    est = cfg.spec.monitor.estimator(mi.layers)
    with (
        progress.phase("refit: fitting boxes", len(mi.layers) * len(affected) * 2),
        threadpool_limits(limits=1),
    ):
        good, bad, fit_seconds = _refit_boxes(est, old, train, used, affected, carried)
    seconds["fit"] = fit_seconds

    t0 = time.perf_counter()
    child = dataclasses.replace(old, good=good, bad=bad, meta=copy.deepcopy(old.meta))
    validation, unknown = sets[VALIDATION], sets.get("unknown")
    with progress.phase("refit: calibrating"), threadpool_limits(limits=1):
        est.adopt(child).calibrate(
            validation.acts,
            validation.pred,
            target_acceptance=float(est.target_acceptance),
            acts_unknown=None if unknown is None else unknown.acts,
            y_pred_unknown=None if unknown is None else unknown.pred,
            y_true_known=validation.labels,
            logits_known=validation.logits,
            logits_unknown=None if unknown is None else unknown.logits,
        )
    seconds["calibrate"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    # One BLAS thread: the box runtime's products are small, and two threads contending
    # on a shared machine took up to 5x longer (measured on a ResNet cell).
    with progress.phase("refit: measuring the parent and the child"), threadpool_limits(limits=1):
        table, split = _table(old, child, sets, used)
    guards = _guards(table, float(est.target_acceptance))
    seconds["measure"] = time.perf_counter() - t0
    failed = [g for g in guards if not g.passed]
    summary = RefitSummary(
        parent_id=art.artifact_id,
        parent_sha256=parent_sha,
        classes=_changes(old, child, used, affected, mi.classes, labelled.captures.ids),
        before=OperatingPoint.of(old),
        after=OperatingPoint.of(child),
        table=table,
        guards=guards,
        overridden=[g.name for g in failed] if allow_guard_failure else [],
        captures=used.counts(),
        left_out=used.left_out,
    )
    if failed and not allow_guard_failure:
        seconds["total"] = time.perf_counter() - start
        raise RefitGuardError(
            [g.failure() for g in failed], dataclasses.replace(summary, seconds=seconds)
        )
    rows = (
        np.concatenate([kept[0], inputs[used.boxed]]).astype(np.float32),
        np.concatenate([kept[1], used.tapped.labels[used.boxed]]).astype(np.int64),
    )
    data = _child_bytes(art, child, summary, split, signer, created_at, rows)
    built = load_artifact(data, {key_id(signer.public_key()): signer.public_key()})
    write_artifact(out, data)
    seconds["total"] = time.perf_counter() - start
    return dataclasses.replace(
        summary,
        child_id=built.artifact_id,
        child_sha256=hashlib.sha256(data).hexdigest(),
        path=str(out),
        seconds=seconds,
    )


def _earlier_rows(art: Artifact, mi: ModelInputs) -> tuple[np.ndarray, np.ndarray]:
    """The labelled captured inputs earlier refits clustered the parent's boxes on, and
    their labelled classes (none for a parent ``build-artifact`` made)."""
    shape = (0, *mi.preprocessing.shape)
    if REFIT_ROWS not in art.members:
        return np.zeros(shape, np.float32), np.zeros(0, np.int64)
    arrays = art.arrays(REFIT_ROWS)
    x, y = arrays.get("inputs"), arrays.get("y_true")
    if x is None or y is None or len(x) != len(y) or x.shape[1:] != shape[1:]:
        raise ArtifactError(f"{REFIT_ROWS}: not the inputs and classes of this model's rows")
    return x.astype(np.float32), y.astype(np.int64)


def _carried(
    earlier: tuple[np.ndarray, np.ndarray], new: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The earlier rows but those whose input is labelled again now (the new label wins)."""
    x, y = earlier
    if not len(x) or not len(new):
        return x, y
    again = {row.tobytes() for row in np.ascontiguousarray(new, np.float32)}
    keep = np.array([row.tobytes() not in again for row in np.ascontiguousarray(x, np.float32)])
    return x[keep], y[keep]


def _finite(v: float | None) -> float | None:
    return None if v is None or not np.isfinite(v) else float(v)


def _parent_digest(parent: Path, art: Artifact) -> str:
    """The sha256 of the parent file, read again: refused when it no longer holds the
    artifact just verified (the file changed in between)."""
    data = Path(parent).read_bytes()
    if load_artifact(data, None).manifest_bytes != art.manifest_bytes:
        raise ArtifactError(f"{show_path(parent)}: the artifact changed while it was read")
    return hashlib.sha256(data).hexdigest()


def _check_config(cfg: BuildConfig, recorded: Any, parent: Path) -> None:
    """The config must be the one the parent was built from: the same file digest, else the
    same values (a copy of the file, re-serialised); one line naming what differs."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("values"), dict):
        raise ConfigError(f"{show_path(parent)}: the artifact records no build config")
    if hashlib.sha256(cfg.path.read_bytes()).hexdigest() == recorded.get("sha256"):
        return
    values = recorded["values"]
    if _json(cfg.raw) == _json(values):
        return
    differ = _differences(values, cfg.raw)
    shown = ", ".join(differ[:5]) + (f" and {len(differ) - 5} more" if len(differ) > 5 else "")
    raise ConfigError(
        f"{show_path(cfg.path)}: not the build config the parent was built from "
        f"({quote(recorded.get('file', '?'))}, sha256 {str(recorded.get('sha256'))[:12]}…): "
        f"{shown or 'values'} differ"
    )


def _json(value: Any) -> bytes | None:
    """The canonical JSON of ``value`` (None when it has none)."""
    try:
        return canonical_json(value)
    except (TypeError, ValueError):
        return None


def _differences(a: Any, b: Any, at: str = "") -> list[str]:
    """Dotted keys where two configs differ (a whole value where it is not a mapping)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        out = []
        for key in sorted({*a, *b}, key=str):
            where = f"{at}.{key}" if at else str(key)
            if key not in a or key not in b:
                out.append(where)
            else:
                out += _differences(a[key], b[key], where)
        return out
    return [] if _json(a) == _json(b) and _json(a) is not None else [at or "(top level)"]


def _model(mi: ModelInputs, art: Artifact, model_path: Path) -> ModelInputs:
    """The prepared model with the parent's monitored layers and pooling (``layers: auto``
    chose them at build time; the artifact records the choice), tapped as the build did."""
    spec = art.json(MODEL_SPEC)
    layers, pooling = list(spec["layers"]), spec.get("pooling", "flatten")
    if list(spec["classes"]) != list(mi.classes):
        raise ConfigError(
            f"classes: the config's {mi.classes} are not the parent's {list(spec['classes'])}"
        )
    tap = open_tap(model_path, layers, pooling=pooling, threads=1, device=mi.device)
    return dataclasses.replace(mi, layers=layers, pooling=pooling, tap=tap)


def _captured_inputs(labelled: LabelledCaptures, mi: ModelInputs) -> np.ndarray:
    """The captured inputs, one row per labelled capture, checked against the model's
    input size."""
    x = np.asarray(labelled.captures.inputs)
    n = len(labelled.captures.ids)
    size = mi.preprocessing.size
    if len(x) != n or len(labelled.labels) != n or x.size != n * size:
        raise ConfigError(
            f"labelled captures: {n} ids, {len(labelled.labels)} labels and inputs of shape "
            f"{list(x.shape)}; the model takes {size} values per input"
        )
    return x


def _tap(mi: ModelInputs, x: np.ndarray, y: np.ndarray | None, bar: Any) -> Tapped:
    """``x`` through the model as the build extracts it: activations, logits, predictions."""
    logits, acts = extract(mi, x, bar)
    return Tapped(acts, logits, logits.argmax(axis=1), y)


def _train_rows(mi: ModelInputs, classes: list[int], stored: np.ndarray | None, bar: Any) -> Tapped:
    """The training inputs the model predicts as one of ``classes``, with their labels.

    With the build's stored predictions (``stored``, checked against this training set)
    only those rows go through the model, in row order, and must come out predicted as
    stored; where one does not (a model whose outputs depend on the rest of the batch), or
    without them, the whole set goes through the model :data:`TRAIN_CHUNK` rows at a time
    and the other rows are dropped. The same rows either way, and the same activations
    where a row's outputs do not depend on its batch (ONNX Runtime on CPU: bit for bit on
    every model of the closed-loop bench)."""
    x, y = mi.data["train"]
    assert y is not None  # labelled (load_dataset)
    if stored is not None:
        rows = np.flatnonzero(np.isin(stored, classes))
        run = rows if len(rows) else np.arange(min(1, len(x)))  # one row gives the widths
        part = _tap(mi, x[run], y[run], bar)
        if np.array_equal(part.pred[: len(rows)], stored[rows]):
            bar.update(len(x) - len(run))  # the rows it need not run
            return part.rows(slice(len(rows)))
        bar.set_done(bar.done - len(run))  # counted again below
    parts = []
    for s in range(0, len(x), TRAIN_CHUNK):
        part = _tap(mi, x[s : s + TRAIN_CHUNK], y[s : s + TRAIN_CHUNK], bar)
        parts.append(part.rows(np.flatnonzero(np.isin(part.pred, classes))))
    return _joined(parts)


def _joined(parts: list[Tapped]) -> Tapped:
    """The rows of ``parts``, one after another."""
    ys = [p.labels for p in parts]
    return Tapped(
        {k: np.concatenate([p.acts[k] for p in parts]) for k in parts[0].acts},
        np.concatenate([p.logits for p in parts]),
        np.concatenate([p.pred for p in parts]),
        np.concatenate(ys),
    )


@dataclass(frozen=True)
class _Used:
    """The labelled captures as the refit reads them: each row's activations and the
    model's prediction, which rows change boxes (``boxed``), which are unknowns, and why
    the others were left out."""

    tapped: Tapped  # every capture (``y``: the labelled class, -1 for unknown and new)
    kinds: list[str]
    boxed: np.ndarray  # bool: a usable correct / wrong label
    unknown: np.ndarray  # bool: a usable unknown / new label
    left_out: list[str]

    @property
    def pred(self) -> np.ndarray:
        return self.tapped.pred

    def counts(self) -> dict[str, int]:
        kinds = np.asarray(self.kinds, dtype=object)
        usable = self.boxed | self.unknown
        out = {
            kind: int(np.sum(usable & (kinds == kind))) for kind in (CORRECT, WRONG, UNKNOWN, NEW)
        }
        out["left_out"] = len(self.left_out)
        return out


def _usable(labelled: LabelledCaptures, caught: Tapped | None, n_classes: int) -> _Used:
    """Which captures the refit uses; :class:`ConfigError` when none changes a box."""
    ids = labelled.captures.ids
    kinds = [label.kind for label in labelled.labels]
    if caught is None or not len(ids):
        raise ConfigError("no usable label: no labelled capture was given")
    y_true = np.asarray(labelled.y_true, np.int64)
    y_pred = np.asarray(labelled.y_pred, np.int64)
    kind = np.asarray(kinds, dtype=object)
    finite = np.isfinite(caught.logits.reshape(len(ids), -1)).all(axis=1)
    for a in caught.acts.values():
        finite &= np.isfinite(a.reshape(len(ids), -1)).all(axis=1)
    agrees = caught.pred == y_pred
    known_label = (y_true >= 0) & (y_true < n_classes)
    consistent = np.where(
        kind == CORRECT,
        y_true == y_pred,
        np.where(kind == WRONG, known_label & (y_true != y_pred), y_true < 0),
    )
    ok = finite & agrees & consistent
    boxed = ok & ((kind == CORRECT) | (kind == WRONG))
    unknown = ok & ((kind == UNKNOWN) | (kind == NEW))
    left_out = []
    for i in np.flatnonzero(~(boxed | unknown)):
        if not finite[i]:
            why = "its activations or logits are not finite"
        elif not agrees[i]:
            why = f"the model predicts class {int(caught.pred[i])}, the join says {int(y_pred[i])}"
        else:
            why = f"label {kinds[i]!r} (class {int(y_true[i])}) contradicts the prediction {int(y_pred[i])}"
        left_out.append(f"{quote(ids[i])}: {why}")
    if not boxed.any():
        raise ConfigError(
            f"no usable label: none of the {len(ids)} labelled captures is a 'correct' or "
            f"'wrong' label of an input the model predicts as the join says "
            f"({int(unknown.sum())} unknown or new change no box, {len(left_out)} left out)"
        )
    tapped = Tapped(caught.acts, caught.logits, caught.pred, y_true)
    return _Used(tapped, kinds, boxed, unknown, left_out)


def _swept_taus(est: BoxMonitor, old: BoxRuntime) -> list[float]:
    """The taus the build swept: the candidates (tau chosen on validation data), or the
    taus the parent holds (a fixed tau, the coverage search's), descending."""
    recorded = {float(t) for v in old.meta["tau"].values() for t in v}
    searched = est.tau == "auto" and est.selection != "coverage"
    return sorted(recorded | (set(candidate_taus(est)) if searched else set()), reverse=True)


def _refit_boxes(
    est: BoxMonitor,
    old: BoxRuntime,
    train: Tapped,
    used: _Used,
    affected: list[int],
    carried: Tapped | None,
) -> tuple[dict[str, BoxSet], dict[str, BoxSet], float]:
    """The parent's good and bad boxes with the ``affected`` classes re-clustered on their
    training rows, the captured rows of earlier refits (``carried``) and the new captured
    rows; the seconds the clustering took."""
    cap = used.tapped.rows(np.flatnonzero(used.boxed))
    parts = [train, cap]
    if carried is not None:
        parts.insert(1, carried.rows(np.flatnonzero(np.isin(carried.pred, affected))))
    acts = {layer: np.concatenate([p.acts[layer] for p in parts]) for layer in old.layers}
    y_true = np.concatenate([p.labels for p in parts])
    y_pred = np.concatenate([p.pred for p in parts])
    params = est.get_params()
    with direct_kmeans():  # KMeans' steps without its input checks
        sweep = build_sweep(
            acts,
            y_true,
            y_pred,
            layers=old.layers,
            taus=_swept_taus(est, old),
            n_classes=old.n_classes,
            normalize=old.normalize,
            max_clusters=int(params["max_clusters"]),
            n_init=int(params["n_init"]),
            random_state=int(params["random_state"]),
            class_taus={
                layer: np.asarray(old.meta["tau"][layer], np.float64) for layer in old.layers
            },
            n_jobs=params["n_jobs"],
            classes=affected,
        )
    chosen = set(affected)
    good: dict[str, BoxSet] = {}
    bad: dict[str, BoxSet] = {}
    for layer in old.layers:
        for into, parent, fitted in (
            (good, old.good[layer], sweep.good[layer]),
            (bad, old.bad[layer], sweep.bad[layer]),
        ):
            new = next(iter(fitted.values()))  # one set under every tau: each class's own
            per_class = [(new if c in chosen else parent).boxes_of(c) for c in range(old.n_classes)]
            into[layer] = BoxSet.from_boxes(per_class, parent.n_features)
    return good, bad, sweep.seconds


def _verdicts(rt: BoxRuntime, t: Tapped) -> np.ndarray:
    """The verdict codes the agent emits for ``t`` (a row whose logits or activations are
    not finite is rejected, as the agent's runtime fails closed)."""
    if not len(t.pred):
        return np.zeros(0, np.int8)
    with np.errstate(over="ignore", invalid="ignore"):
        combined, _per = rt.verdicts(t.acts, t.pred, logits=t.logits)
    n = len(t.pred)
    broken = ~np.isfinite(t.logits.reshape(n, -1)).all(axis=1)
    for a in t.acts.values():
        broken |= ~np.isfinite(a.reshape(n, -1)).all(axis=1)
    return np.where(broken, REJECT, combined).astype(np.int8)


def _share(accepted: np.ndarray) -> float | None:
    return float(np.mean(accepted)) if len(accepted) else None


def _table(
    old: BoxRuntime, child: BoxRuntime, sets: dict[str, Tapped], used: _Used
) -> tuple[list[TableRow], dict[str, Any]]:
    """The before/after table, and the child's verdict split in the manifest's form."""
    data = {**sets, CAPTURES: used.tapped}
    codes = {name: (_verdicts(old, t), _verdicts(child, t)) for name, t in data.items()}
    val = sets[VALIDATION]
    right = val.pred == val.labels
    kinds = np.asarray(used.kinds, dtype=object)
    unknown = unknown_sets(sets)
    rows: list[tuple[str, str, str, np.ndarray]] = [
        (VALIDATION, CORRECT_KNOWN, VALIDATION, right),
        (VALIDATION, MISCLASSIFIED_KNOWN, VALIDATION, ~right),
        *[(VALIDATION, f"unknown:{n}", n, np.ones(len(sets[n].pred), bool)) for n in unknown],
        (CAPTURES, CORRECT_KNOWN, CAPTURES, used.boxed & (kinds == CORRECT)),
        (CAPTURES, MISCLASSIFIED_KNOWN, CAPTURES, used.boxed & (kinds == WRONG)),
        (CAPTURES, CAPTURED_UNKNOWN, CAPTURES, used.unknown),
    ]
    table, split = [], {}
    for where, measure, name, picked in rows:
        before, after = (c[picked] for c in codes[name])
        table.append(
            TableRow(
                where, measure, int(picked.sum()), _share(before == ACCEPT), _share(after == ACCEPT)
            )
        )
        if where == VALIDATION:
            split[measure] = msgspec.to_builtins(shares(after))
    return table, split


def _guards(table: list[TableRow], target: float) -> list[Guard]:
    """The refit's guards on the validation rows of the table."""
    guards = []
    for row in table:
        if row.data != VALIDATION or row.after is None:
            continue
        if row.measure == CORRECT_KNOWN:
            limit = target - KNOWN_SLACK
            passed = row.after >= limit - SHARE_TOLERANCE
            guards.append(Guard(KNOWN_GUARD, limit, row.after, passed))
        elif row.measure.startswith("unknown:") and row.before is not None:
            limit = row.before + UNKNOWN_SLACK
            passed = row.after <= limit + SHARE_TOLERANCE
            name = f"{UNKNOWN_GUARD}:{row.measure.removeprefix('unknown:')}"
            guards.append(Guard(name, limit, row.after, passed))
    return guards


def _changes(
    old: BoxRuntime,
    child: BoxRuntime,
    used: _Used,
    affected: list[int],
    classes: list[str],
    ids: list[str],
) -> list[ClassChange]:
    """Each affected class's captures and box counts, before and after."""
    kinds = np.asarray(used.kinds, dtype=object)
    out = []
    for c in affected:
        mine = used.boxed & (used.pred == c)
        out.append(
            ClassChange(
                name=classes[c],
                index=c,
                correct=[ids[i] for i in np.flatnonzero(mine & (kinds == CORRECT))],
                wrong=[ids[i] for i in np.flatnonzero(mine & (kinds == WRONG))],
                good={
                    layer: (int(old.good[layer].counts()[c]), int(child.good[layer].counts()[c]))
                    for layer in old.layers
                },
                bad={
                    layer: (int(old.bad[layer].counts()[c]), int(child.bad[layer].counts()[c]))
                    for layer in old.layers
                },
            )
        )
    return out


def _child_bytes(
    art: Artifact,
    child: BoxRuntime,
    summary: RefitSummary,
    split: dict[str, Any],
    signer: Any,
    created_at: int | None,
    rows: tuple[np.ndarray, np.ndarray],
) -> bytes:
    """The child artifact: the parent's members, the new box monitor, :data:`REFIT` and
    the captured rows its boxes hold (:data:`REFIT_ROWS`), its manifest naming the parent,
    signed by ``signer``."""
    members: dict[str, Any] = dict(art.members)
    members.update(child.to_members(BOXES_PREFIX))
    members[REFIT] = summary.record()
    members[REFIT_ROWS] = {"inputs": rows[0], "y_true": rows[1]}
    contents = copy.deepcopy(art.contents)
    monitors = contents.setdefault("monitors", {})
    monitors["threshold"] = _finite(child.threshold)
    monitors["boxes"] = int(
        sum(int(child.good[k].counts().sum() + child.bad[k].counts().sum()) for k in child.layers)
    )
    contents["verdict_split"] = split
    contents["refit"] = {
        "parent": summary.parent_id,
        "parent_sha256": summary.parent_sha256,
        "classes": [c.name for c in summary.classes],
        "overridden": list(summary.overridden),
    }
    return build_artifact_bytes(
        members,
        private_key=signer,
        created_at=created_at,
        model=art.manifest.get("model"),
        config=art.manifest.get("config"),
        contents=contents,
    )


__all__ = [
    "ClassChange",
    "Guard",
    "OperatingPoint",
    "RefitGuardError",
    "RefitSummary",
    "TableRow",
    "refit",
]
