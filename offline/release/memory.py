"""How much memory a build needs, said before it starts, and what holds it to ``--max-memory``.

:func:`estimate` adds up, once :func:`~.pipeline.prepare` has loaded the model and the data:

* ``process``: this process's own memory then (measured: the interpreter, the libraries, the
  model, the data sets as loaded);
* ``store``: the activation store (:mod:`.store`), every monitored layer's pooled
  activations and the logits of every data set. Its pages are file-backed: they count
  only when its folder is in RAM (``tmpfs``) or the store is kept in memory;
* the largest of the phases, each of which frees what it used before the next starts:
  ``extraction`` (one batch through the model), ``layer choice`` (``layers: auto``: its
  capped rows of every ranked candidate), ``fit`` (the tau sweep's working set: one layer's
  normalised training activations and one class's rows in float64 for k-means, the held-out
  -class selection's distance tables), and ``evaluation`` (calibration rows, the coverage
  curves, the feature baselines on their capped rows: KNN's similarity tables and
  Mahalanobis' covariance and class distances);
* ``workers``: with ``monitor.n_jobs`` (``--jobs``) over 1 on this machine, the worker
  processes of the per-class jobs, each its own Python, numpy and scikit-learn and a job's
  rows in flight (they live through the build; a Dask or Ray cluster's are not counted).

The estimate is held against the bound (``--max-memory``, else this machine's memory)
before any activation is extracted; a build that will not fit stops with one line
(:meth:`MemoryEstimate.problem`). While activations are extracted, :class:`MemoryGuard`
checks the process's anonymous resident memory (``RssAnon``: what the kernel cannot page
out to a file) after every batch. Nothing binds the fit itself beyond the estimate made
before it: ``RLIMIT_AS``/``RLIMIT_DATA`` caps fail inside BLAS and torch, which reserve far
more address space than they touch.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import joblib
import numpy as np
from joblib.parallel import get_active_backend

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.taps import INPUT_LAYER, LayerInfo
from boxwatch.offline.bn.limits import format_bytes, total_memory
from boxwatch.offline.monitors.baselines import CHUNK as KNN_CHUNK
from boxwatch.offline.monitors.estimator import BoxMonitor
from boxwatch.offline.monitors.perclass import CHUNK_VALUES
from boxwatch.offline.release import layer_choice
from boxwatch.offline.release.emitted import MAX_BASELINE_FEATURES, MAX_BASELINE_ROWS
from boxwatch.offline.release.monitor_stage import MAX_COVERAGE_ROWS
from boxwatch.offline.release.records import ModelInputs, MonitorSection, candidate_taus
from boxwatch.offline.release.store import free_bytes, memory_filesystem

FLOAT = 4  # bytes of a float32 activation or logit
# The fit's float64 copies of one class's rows: the k-means input, np.unique's sorted copy
# and k-means' own (TauKMeansPath, sklearn's KMeans), plus the float32 selection.
FIT_CLASS_BYTES = 4 * 8 + FLOAT
# The held-out-class selection's (validation rows x classes) float64 tables live at once.
SELECTION_TABLES = 4
# Boxes the fit keeps per class, tau and layer, on average (measured: 10 to 12 at 10 to 300
# classes, bench/build_memory.py), and the bytes a box takes per feature in a fitted BoxSet:
# its corners (float32), their order by width (int64) and the kernel's padded lanes.
BOXES_PER_CLASS = 12
BOX_BYTES = 32
# One extraction batch: the input (raw and preprocessed), the tapped layers as the model
# returns them, pooled, and the model's own working memory, taken as this many times its
# widest candidate layer.
MODEL_WORKSPACE = 3
# A worker process of the per-class jobs: its interpreter with numpy and scikit-learn
# (158 MB resident, measured), and one job's rows in flight (CHUNK_VALUES values) in float64
# this many times over (pickled, unpickled, k-means' copies): 200 MiB. Checked against
# bench/scale.py: 0.20-0.21 GB a worker at 1,000 x 512 x 50,000 on 2 cores.
WORKER_BASE = 160 << 20
WORKER_JOB_COPIES = 5
# A bound below this is a typo, not a machine (it cannot hold the interpreter).
MIN_BOUND = 64 << 20


@dataclass(frozen=True)
class Resources:
    """What a build may use: ``max_memory`` bytes (``None``: this machine's memory), the
    folder of the activation store (``None``: the system's temporary folder), or the store
    kept in memory (``in_memory``; for tests and tiny builds), and ``n_jobs``, the jobs of
    the per-class work (``--jobs``; ``None``: the config's ``monitor.n_jobs``)."""

    max_memory: int | None = None
    work_dir: Path | None = None
    in_memory: bool = False
    n_jobs: int | None = None

    @property
    def bound(self) -> int:
        """The bound in bytes: ``max_memory``, else this machine's physical memory."""
        return self.max_memory if self.max_memory is not None else total_memory()

    @property
    def bound_name(self) -> str:
        return "--max-memory" if self.max_memory is not None else "this machine's memory"


@dataclass(frozen=True)
class MemoryEstimate:
    """The build's peak memory, estimated by part (bytes), and the bound it is held to."""

    process: int
    store: int
    store_counted: bool
    phases: Mapping[str, int]
    bound: int
    bound_name: str
    store_where: str
    disk_free: int | None = None
    workers: int = 0  # worker processes of the per-class jobs on this machine
    worker_bytes: int = 0  # each

    @property
    def peak(self) -> int:
        """The estimated peak: the process, the store where it is in RAM, the largest phase,
        the worker processes."""
        return (
            self.process
            + (self.store if self.store_counted else 0)
            + max(self.phases.values(), default=0)
            + self.workers * self.worker_bytes
        )

    @property
    def largest(self) -> str:
        """The phase that sets the peak."""
        return max(self.phases, key=lambda k: self.phases[k]) if self.phases else "process"

    def text(self) -> str:
        """One line for the plan: the peak, its parts and the store."""
        parts = ", ".join(f"{name} {format_bytes(v)}" for name, v in self.phases.items())
        where = "in memory" if self.store_counted else "on disk"
        workers = (
            f"; {self.workers} worker processes {format_bytes(self.worker_bytes)} each"
            if self.workers
            else ""
        )
        return (
            f"memory: about {format_bytes(self.peak)} at peak of {format_bytes(self.bound)} "
            f"({self.bound_name}): process {format_bytes(self.process)}, then the largest of "
            f"{parts}{workers}; activation store {format_bytes(self.store)} {where} "
            f"({self.store_where})"
        )

    def problems(self) -> list[str]:
        """Why the build will not fit: memory over the bound, a store over the free disk."""
        out = []
        if self.peak > self.bound:
            workers = (
                f", {self.workers} worker processes of --jobs "
                f"{format_bytes(self.workers * self.worker_bytes)}"
                if self.workers
                else ""
            )
            out.append(
                f"the build needs about {format_bytes(self.peak)} of memory (largest phase: "
                f"{self.largest}{workers}), {self.bound_name} is {format_bytes(self.bound)}: "
                f"{_advice(self)}"
            )
        if not self.store_counted and self.disk_free is not None and self.store > self.disk_free:
            out.append(
                f"the activation store needs {format_bytes(self.store)} on disk, "
                f"{self.store_where} has {format_bytes(self.disk_free)} free: give --work-dir "
                "a folder with more space (or lower data.train.limit)"
            )
        return out


def _advice(est: MemoryEstimate) -> str:
    """What to do when the estimate passes the bound, for the part that sets it."""
    if est.workers and est.peak - est.workers * est.worker_bytes <= est.bound:
        return "lower --jobs (monitor.n_jobs), or raise --max-memory"
    if est.store_counted and est.store >= max(est.phases.values(), default=0):
        return (
            f"the activation store is in RAM ({est.store_where}); give --work-dir a folder "
            "on disk, or raise --max-memory"
        )
    if est.largest == "extraction":
        return "raise --max-memory (the model's batch alone needs it)"
    return (
        "raise --max-memory, lower data.train.limit (fewer rows), or monitor narrower "
        "layers (pooling: avg for conv maps)"
    )


class MemoryGuard:
    """Stops a build whose own memory passes ``bound`` bytes (checked when called)."""

    def __init__(self, bound: int, bound_name: str) -> None:
        self.bound = bound
        self.bound_name = bound_name

    def check(self, phase: str) -> None:
        """Raise :class:`ConfigError` when the process's anonymous resident memory (what
        cannot be paged out to a file: not the store) is over the bound."""
        used = anonymous_rss()
        if used > self.bound:
            raise ConfigError(
                f"the build passed {self.bound_name} ({format_bytes(self.bound)}) while "
                f"{phase}: {format_bytes(used)} in use; raise --max-memory, or lower "
                "data.train.limit"
            )


def _status_bytes(field_name: str) -> int:
    """A ``/proc/self/status`` size in bytes (``RssAnon:``, ``VmHWM:``), 0 when unknown."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field_name):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def anonymous_rss() -> int:
    """This process's anonymous resident memory in bytes (``RssAnon``; 0 where unknown)."""
    return _status_bytes("RssAnon:")


def worker_processes(n_jobs: int | None) -> int:
    """The worker processes ``n_jobs`` per-class jobs start on this machine (joblib's
    meaning; inside a ``joblib.parallel_config``, its backend's): none for one job, or where
    the workers are elsewhere or threads (Dask, Ray, the threading backend)."""
    backend, _ = get_active_backend()
    if type(backend).__name__ not in ("LokyBackend", "MultiprocessingBackend"):
        return 0
    n = joblib.effective_n_jobs(n_jobs)
    return n if n > 1 else 0


def estimate(
    model: ModelInputs | None,
    resources: Resources,
    *,
    batch: int,
    params: MonitorSection | None = None,
) -> MemoryEstimate:
    """The build's peak memory from a prepared model (``None``: a BN-only build) extracted
    ``batch`` rows at a time and fitted with the config's ``monitor`` section ``params``,
    held to ``resources``' bound."""
    process = anonymous_rss()
    folder = resources.work_dir if resources.work_dir is not None else Path(tempfile.gettempdir())
    ram_fs = memory_filesystem(folder)
    store_counted = resources.in_memory or ram_fs is not None
    where = "kept in memory" if resources.in_memory else str(folder)
    if ram_fs is not None and not resources.in_memory:
        where = f"{folder}, a {ram_fs} in RAM"
    phases: dict[str, int] = {}
    store = 0
    workers = 0
    if model is not None:
        monitor = (MonitorSection() if params is None else params).estimator(None)
        workers = worker_processes(monitor.get_params()["n_jobs"])
        shape = _Shape.of(model, batch, monitor)
        store = shape.store_bytes()
        phases = {
            "extraction": shape.extraction_bytes(),
            "fit": shape.fit_bytes(),
            "evaluation": shape.evaluation_bytes(),
        }
        if model.auto:
            phases = {"layer choice": shape.choice_bytes(), **phases}
        if shape.input_alone:
            phases["input alone"] = shape.input_alone_bytes()
    return MemoryEstimate(
        process=process,
        store=store,
        store_counted=store_counted,
        phases=phases,
        bound=resources.bound,
        bound_name=resources.bound_name,
        store_where=where,
        disk_free=None if store_counted else free_bytes(folder),
        workers=workers,
        worker_bytes=WORKER_BASE + WORKER_JOB_COPIES * CHUNK_VALUES * 8,
    )


@dataclass(frozen=True)
class _Shape:
    """The sizes the estimate is made of, read from a prepared model."""

    rows: Mapping[str, int]  # rows of each data set
    classes: int
    features: Sequence[int]  # each monitored layer's features after pooling (auto: a bound)
    raw: int  # values the tapped layers return per input, before pooling
    widest_candidate: int  # values of the model's widest candidate layer per input
    input_values: int  # values of one preprocessed input
    input_bytes: int  # bytes of one raw input as loaded
    largest_class: int  # training rows of the largest class
    batch: int  # rows per extraction batch
    validation: bool
    choice_features: int  # auto: features of every ranked candidate, each pooling
    input_alone: int  # the input's pooled features where a monitor of it alone is fitted
    taus: int  # candidate taus the sweeps fit
    max_clusters: int  # boxes per class and tau at most

    @classmethod
    def of(cls, model: ModelInputs, batch: int, monitor: BoxMonitor) -> _Shape:
        infos = model.tap.candidates()
        plan = layer_choice.input_plan(
            (None, *model.preprocessing.shape),
            kind=model.input_kind,
            pooling=model.pooling,
            monitor=model.monitor_input,
        )
        if model.auto:
            features, raw, choice = _auto_widths(model, infos, plan)
            watched = plan.monitored
        else:
            features, raw = _listed_widths(model, infos)
            choice, watched = 0, INPUT_LAYER in model.layers
        x, y = model.data["train"]
        counts = np.bincount(np.asarray(y)) if y is not None and len(y) else np.zeros(1)
        return cls(
            rows={name: len(data[0]) for name, data in model.data.items()},
            classes=len(model.classes),
            features=features,
            raw=max(raw, sum(features)),
            widest_candidate=max((_values(i) for i in infos), default=0),
            input_values=model.preprocessing.size,
            input_bytes=int(x[0].nbytes),
            largest_class=int(counts.max()),
            batch=batch,
            validation="validation" in model.data,
            choice_features=choice,
            input_alone=(plan.features or 0) if not watched and plan.measurable else 0,
            taus=len(candidate_taus(monitor)),
            max_clusters=int(monitor.get_params()["max_clusters"]),
        )

    def store_bytes(self) -> int:
        """Every set's pooled activations and logits (float32), the joined evaluation set
        included once."""
        per_row = (sum(self.features) + self.classes) * FLOAT
        return sum(self.rows.values()) * per_row

    def extraction_bytes(self) -> int:
        """One batch: raw and preprocessed inputs, the layers as returned and pooled, the
        model's workspace."""
        batch = min(self.batch, max(self.rows.values()))
        per_input = (
            self.input_bytes
            + 2 * self.input_values * FLOAT
            + (self.raw + sum(self.features) + self.classes) * FLOAT
            + MODEL_WORKSPACE * self.widest_candidate * FLOAT
        )
        return batch * per_input

    def fitted_bytes(self) -> int:
        """The fitted monitor's boxes, every candidate tau's (the sweep is kept for the
        report's curves): :data:`BOXES_PER_CLASS` per class, tau and layer."""
        return self.taus * self.classes * BOXES_PER_CLASS * sum(self.features) * BOX_BYTES

    def fit_bytes(self) -> int:
        """The tau sweep's working set, per layer: the normalised layer, one class's rows
        in float64 for k-means; the held-out-class selection's tables of the validation
        rows by class, the predictions and labels of every set, and the boxes so far."""
        n = self.rows["train"]
        widest = max(self.features, default=0)
        layer = n * widest * FLOAT
        per_class = self.largest_class * widest * FIT_CLASS_BYTES
        n_val = self.rows.get("validation", 0) + self.rows.get("unknown", 0)
        tables = n_val * self.classes * 8 * SELECTION_TABLES
        labels = sum(self.rows.values()) * 8 * 3
        return layer + per_class + tables + labels + self.fitted_bytes()

    def evaluation_bytes(self) -> int:
        """After the fit, beside the fitted boxes: the calibration rows of every layer
        (validation, else a held-out share of train), the feature baselines, one class of
        the coverage curve, and the largest moment of the box runtime: each class's
        distances from its boxes to the other classes' (the contrast term's neighbours)."""
        n = self.rows["train"]
        calib = self.rows.get("validation", 0) + self.rows.get("unknown", 0)
        if not self.validation:
            calib = n // 5
        coverage = min(self.largest_class, MAX_COVERAGE_ROWS) * max(self.features, default=0)
        widest = max(self.features, default=0)
        neighbours = self.classes * BOXES_PER_CLASS * self.max_clusters * widest * 8
        kept, moment = self.baseline_bytes()
        return (
            self.fitted_bytes()
            + calib * sum(self.features) * FLOAT
            + coverage * FIT_CLASS_BYTES
            + kept
            + max(moment, neighbours)
        )

    def baseline_bytes(self) -> tuple[int, int]:
        """The feature baselines (:mod:`~boxwatch.offline.monitors.baselines`), fitted on at
        most :data:`~.emitted.MAX_BASELINE_ROWS` training rows of each layer they can take:
        what is kept while the comparison runs (those rows, KNN's normalised copy,
        Mahalanobis' covariance and class means per layer), and the largest of what one step
        holds for a moment: KNN's similarity table of a chunk of queries and np.partition's copy,
        Mahalanobis' float64 rows and their centred copy, its class distances of a set."""
        widths = [f for f in self.features if f <= MAX_BASELINE_FEATURES]
        if not widths:
            return 0, 0
        rows = min(self.rows["train"], MAX_BASELINE_ROWS)
        queries = max((v for k, v in self.rows.items() if k != "train"), default=0)
        kept = rows * sum(widths) * 2 * FLOAT + sum(f * f + self.classes * f for f in widths) * 8
        moment = max(
            2 * min(KNN_CHUNK, queries) * rows * FLOAT,
            2 * rows * max(widths) * 8,
            3 * queries * self.classes * 8 + queries * max(widths) * 8,
        )
        return kept, moment

    def input_alone_bytes(self) -> int:
        """The ``input_not_monitored`` check (the model's input not monitored): a monitor of
        the pooled input alone, fitted as the build's own on the training and validation
        inputs, with one set preprocessed whole at a time."""
        if not self.input_alone:
            return 0
        known = self.rows["train"] + self.rows.get("validation", 0)
        widest_set = max(self.rows.values())
        return (
            known * self.input_alone * FLOAT
            + widest_set * self.input_values * FLOAT
            + self.largest_class * self.input_alone * FIT_CLASS_BYTES
        )

    def choice_bytes(self) -> int:
        """``layers: auto``: the capped rows of every ranked candidate in each pooling."""
        rows = layer_choice.MAX_TRAIN_ROWS + layer_choice.MAX_VALIDATION_ROWS
        return rows * self.choice_features * FLOAT + self.extraction_bytes()


def _auto_widths(
    model: ModelInputs, infos: Sequence[LayerInfo], plan: layer_choice.InputPlan
) -> tuple[list[int], int, int]:
    """``layers: auto``: a bound on the monitored features (the widest
    :data:`~.layer_choice.N_CHOSEN` rankable candidates, each in its widest pooling that
    fits, and the input), the values those return unpooled, and the ranked candidates'
    features in every pooling the choice extracts."""
    screened = [s for s in layer_choice.screen(infos, model.pooling) if s.reason is None]

    def widest(s: layer_choice.Screened) -> int:
        fits = [s.info.n_features(p) or 0 for p in layer_choice.MAP_POOLINGS] if s.pooled else []
        return max([s.features or 0, *(f for f in fits if f <= layer_choice.MAX_FEATURES)])

    features = sorted(map(widest, screened), reverse=True)[: layer_choice.N_CHOSEN]
    raw = sum(sorted((_values(s.info) for s in screened), reverse=True)[: layer_choice.N_CHOSEN])
    if plan.monitored and plan.features:
        features.append(plan.features)
        raw += model.preprocessing.size
    if plan.coarse:
        features.append(plan.coarse)
    choice = sum(
        sum(s.info.n_features(p) or 0 for p in layer_choice.MAP_POOLINGS)
        if s.pooled
        else (s.features or 0)
        for s in screened
    )
    return features, raw, choice


def _listed_widths(model: ModelInputs, infos: Sequence[LayerInfo]) -> tuple[list[int], int]:
    """Listed layers: each one's features after pooling (one run of the tap) and the
    values they return unpooled."""
    by_name = {info.name: info for info in infos}
    by_name.update({m: info for info in infos for m in info.modules})
    _, acts = model.tap.run(model.preprocessing.apply(model.data["train"][0][:1]))
    raw = sum(
        model.preprocessing.size if name == INPUT_LAYER else _values(by_name.get(name))
        for name in model.layers
    )
    return [int(acts[name].shape[1]) for name in model.layers], raw


def _values(info: LayerInfo | None) -> int:
    """Values a candidate layer returns per input (0 where its shape is unknown)."""
    if info is None:
        return 0
    return info.n_features("flatten") or 0
