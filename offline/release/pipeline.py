"""``build-artifact``'s pipeline: validate everything, then monitors, BN, artifact, summary.

:func:`prepare` reads and checks every input and raises one :class:`ConfigError` listing
all problems (missing files, shapes, unknown layers, labels outside the classes, unknown BN
variables or states, bad rules) -- ``--dry-run`` stops there. :func:`build` does the work
and returns the signed artifact bytes with the summary the report is drawn from.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from msgspec import UNSET, UnsetType
from threadpoolctl import threadpool_limits

from boxwatch import __version__
from boxwatch.agent.artifact import (
    Artifact,
    build_artifact_bytes,
    digest_files,
    load_artifact,
    resolve_created_at,
)
from boxwatch.agent.boxes import BoxRuntime
from boxwatch.agent.errors import BoxwatchError, ConfigError
from boxwatch.agent.inputs import one_line, quote
from boxwatch.agent.keys import key_id
from boxwatch.agent.members import (
    BOXES_PREFIX,
    DIAGRAM_PREFIX,
    MODEL_SPEC,
    RULES,
    TRAIN_PREDICTIONS,
    VERIFICATION,
)
from boxwatch.agent.preprocessing import InputRange, Preprocessing
from boxwatch.agent.runtime import ModelResult, model_files
from boxwatch.agent.taps import (
    COARSE_INPUT_LAYER,
    INPUT_LAYER,
    LayerInfo,
    Tap,
    offers_coarse,
    open_tap,
)
from boxwatch.offline.monitors.baselines import BASELINES as TABLE
from boxwatch.offline.monitors.baselines import NEEDS
from boxwatch.offline.progress import Phase, Progress
from boxwatch.offline.release import bn_stage, emitted, layer_choice
from boxwatch.offline.release.config import BuildConfig, unknown_sets
from boxwatch.offline.release.datasets import load_dataset
from boxwatch.offline.release.memory import MemoryEstimate, MemoryGuard, Resources, estimate
from boxwatch.offline.release.monitor_stage import MonitorOutcome, fit_monitors, input_alone
from boxwatch.offline.release.records import (
    ArtifactSummary,
    BaselineComparison,
    BNSummary,
    BuildSpec,
    BuildSummary,
    BuildWarning,
    Evaluation,
    LabelledData,
    LayerChoiceSummary,
    Metadata,
    ModelErrors,
    ModelInputs,
    ModelSummary,
    MonitorSection,
    MonitorSummary,
    OperatingPoint,
    PolicyResult,
    ScoreHistogram,
    VerdictShares,
    VerdictsSummary,
)
from boxwatch.offline.release.store import ActivationStore
from boxwatch.offline.release.train_predictions import predictions_member

EXTRACT_BATCH = 512
CONFIG_RULE = (
    "listed in the build config, and the model's input unless model.monitor_input is false"
)
FED_DTYPE = "float32"  # what both taps feed a model (OnnxTap.run, TorchTap.run)


@dataclass
class Prepared:
    """Everything :func:`build` needs, checked, with what the build may use and the memory
    it is estimated to need (``--dry-run`` prints it)."""

    cfg: BuildConfig
    model: ModelInputs | None
    bn: bn_stage.BNInputs | None
    resources: Resources = field(default_factory=Resources)
    memory: MemoryEstimate | None = None


@dataclass
class BuildOutcome:
    """What a build produced: the artifact bytes and its summary (which holds the policy's
    verdict)."""

    artifact: bytes
    summary: BuildSummary
    files: dict[str, bytes] = field(default_factory=dict)
    """Files for the report folder beside report.html (``bn.repair``'s proposals)."""

    @property
    def policy_failures(self) -> list[str]:
        """Why the artifact breaks the config's policy (empty: it passes)."""
        return self.summary.policy.failed


@dataclass
class _Assembly:
    """What the two halves add to the artifact as the build goes: members, the manifest's
    ``contents``, and the seconds each step took."""

    members: dict[str, Any] = field(default_factory=dict)
    contents: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass
class _ModelHalf:
    """The model half of a build: the inputs with their final layers, the fitted monitor,
    where the layers came from, and the model's record in the manifest."""

    inputs: ModelInputs
    monitor: MonitorOutcome
    layer_choice: LayerChoiceSummary
    record: dict[str, Any]
    summary: ModelSummary
    params: MonitorSection  # the config's monitor section
    extract: Callable[..., tuple[np.ndarray, dict[str, np.ndarray]]]  # into the store


def _collect(problems: list[str], step: Callable[[], Any]) -> Any:
    """Run one validation step, adding its problems to ``problems`` instead of stopping."""
    try:
        return step()
    except ConfigError as exc:
        problems.extend(exc.problems)
    except BoxwatchError as exc:
        problems.append(str(exc))
    return None


def prepare(
    cfg: BuildConfig, out: Path | None = None, *, resources: Resources | None = None
) -> Prepared:
    """Validate every input of the config; raise one :class:`ConfigError` with all problems.

    ``out``, the artifact path to write, is checked too (its folder must exist), so that
    ``--dry-run`` catches what would otherwise fail after the whole build. The build's
    memory is estimated and held to ``resources``' bound (default: this machine's memory;
    :mod:`.memory`), and the BN compilation to ``max_memory`` too when it is given.
    """
    resources = Resources() if resources is None else resources
    problems: list[str] = check_out_path(out)
    model = _checked_model(cfg, problems) if cfg.spec.model is not None else None
    bn = _collect(problems, lambda: bn_stage.prepare(cfg)) if cfg.spec.bn is not None else None
    if bn is not None and resources.max_memory is not None:
        limit = resources.max_memory
        bn.max_memory = limit if bn.max_memory is None else min(bn.max_memory, limit)
    if problems:
        raise ConfigError(problems)
    memory = _collect(
        problems,
        lambda: estimate(
            model,
            resources,
            batch=EXTRACT_BATCH,
            params=cfg.spec.monitor.with_jobs(resources.n_jobs),
        ),
    )
    if memory is not None:
        problems.extend(memory.problems())
    if problems:
        raise ConfigError(problems)
    return Prepared(cfg, model, bn, resources, memory)


def prepare_model(cfg: BuildConfig, *, auto: bool = False) -> ModelInputs:
    """The model half of :func:`prepare` alone (``boxwatch layers --config``); ``auto``
    prepares it for ``layers: auto`` whatever the config's ``layers`` say."""
    if cfg.spec.model is None:
        raise ConfigError(f"{cfg.path}: the config has no model section")
    problems: list[str] = []
    model = _checked_model(cfg, problems, auto=auto)
    if problems or model is None:
        raise ConfigError(problems or ["model: could not be prepared"])
    return model


def _checked_model(
    cfg: BuildConfig, problems: list[str], *, auto: bool = False
) -> ModelInputs | None:
    model = _prepare_model(cfg, problems, auto=auto)
    if model is not None:
        before = len(problems)
        problems.extend(check_model_input(model))
        problems.extend(check_training_data(model))
        if len(problems) == before:
            problems.extend(_probe_model(model))
    return model


def check_out_path(out: Path | None) -> list[str]:
    """Problems with the artifact's output path: its folder must exist, it must not be one."""
    if out is None:
        return []
    if out.is_dir():
        return [f"--out {out}: is a directory (give the artifact's file name)"]
    parent = out.parent
    if not parent.is_dir():
        return [f"--out {out}: folder {parent} does not exist (create it first)"]
    return []


def check_model_input(model: ModelInputs) -> list[str]:
    """Problems of ``model.input_name``, ``model.preprocessing.shape`` and the input's dtype
    against the model's own input (name, rank, fixed dims, float32), ONNX and ``.pt2``
    alike, found before the model is run (``--dry-run`` too). A TorchScript file declares
    no input: the probe run finds its misfits."""
    tap, pre = model.tap, model.preprocessing
    declared = tap.input
    if not declared.shape:
        return []
    name, dims = declared.name, list(declared.shape)
    problems = []
    if pre.input_name is not None and name is not None and pre.input_name != name:
        problems.append(
            f"model.input_name: {quote(pre.input_name)} is not an input of the model "
            f"(its input is {quote(name)})"
        )
    want = [int(d) for d in pre.shape]
    shown = [d if d is not None else "?" for d in dims]
    if len(dims) != len(want) + 1:
        problems.append(
            f"model.preprocessing.shape: {want} makes inputs of rank {len(want) + 1} (with the "
            f"batch axis) but the model's input has rank {len(dims)} (shape {shown})"
        )
    elif any(isinstance(d, int) and d > 0 and d != w for d, w in zip(dims[1:], want, strict=True)):
        problems.append(
            f"model.preprocessing.shape: {want} does not fit the model's input shape {shown}"
        )
    if declared.dtype is not None and declared.dtype != FED_DTYPE:
        problems.append(
            f"model: its input {quote(name or '')} takes {declared.dtype}, but the model is fed "
            f"{FED_DTYPE} (export it with a {FED_DTYPE} input)"
        )
    return problems


def check_training_data(model: ModelInputs) -> list[str]:
    """Problems the build would otherwise meet late: values that are not finite and real in
    any data set, and known classes without training inputs."""
    problems = []
    for name, (x, _y) in model.data.items():
        if x.dtype.kind not in "biuf":
            problems.append(f"data.{name}: inputs of dtype {x.dtype}; only real numbers")
        elif x.dtype.kind == "f":
            bad = np.flatnonzero(~np.isfinite(x).reshape(len(x), -1).all(axis=1))
            if len(bad):
                problems.append(
                    f"data.{name}: {len(bad):,} inputs hold values that are not finite "
                    f"(NaN or inf), the first is input {int(bad[0])}"
                )
    train = model.data.get("train")
    y = None if train is None else train[1]
    n = len(model.classes)
    if y is not None and len(y) and y.min() >= 0 and y.max() < n:
        counts = np.bincount(y, minlength=n)
        missing = [model.classes[i] for i in range(n) if counts[i] == 0]
        if missing:
            shown = ", ".join(quote(c, 40) for c in missing[:10])
            problems.append(
                f"data.train: no training inputs for class(es) {shown}; every known class "
                "needs some"
            )
    return problems


def _probe_model(model: ModelInputs) -> list[str]:
    """Run the model on two training inputs: its outputs must be one logit per class."""
    try:
        probe = model.tap.run(model.preprocessing.apply(model.data["train"][0][:2]))[0]
    except BoxwatchError as exc:
        return list(exc.problems) if isinstance(exc, ConfigError) else [str(exc)]
    except Exception as exc:  # onnxruntime and torch raise their own types
        return [f"model: running it on two training inputs failed ({one_line(str(exc), 300)})"]
    if probe.ndim != 2:
        return [f"model: its output has shape {list(probe.shape)}, not (batch, logits)"]
    if probe.shape[1] != len(model.classes):
        return [
            f"classes: the model outputs {probe.shape[1]} logits but "
            f"{len(model.classes)} classes are configured"
        ]
    return []


def _prepare_model(
    cfg: BuildConfig, problems: list[str], *, auto: bool = False
) -> ModelInputs | None:
    spec = cfg.spec
    m = spec.model
    assert m is not None  # the callers checked
    before = len(problems)
    files = _collect(problems, lambda: _model_files(cfg))
    path = files[0][1] if files else cfg.resolve(m.path)
    classes = list(spec.classes or [])
    auto = auto or spec.layers == layer_choice.AUTO
    layers = [] if auto else list(spec.layers)
    if not classes:
        problems.append("classes: the model section needs the list of class names")
    if not spec.data:
        problems.append("data: the model section needs data.train (and ideally validation)")
    if "shape" not in m.preprocessing:
        problems.append("model.preprocessing.shape: the input shape (without batch) is required")
    if len(problems) > before:
        return None
    preprocessing = _collect(
        problems,
        lambda: Preprocessing.from_dict({**m.preprocessing, "input_name": m.input_name}),
    )
    listed = list(layers)
    pooling: str | dict[str, str] = _tapped(m.pooling, layers) if auto else m.pooling
    entry = None
    if preprocessing is not None:
        entry = _collect(
            problems,
            lambda: layer_choice.input_plan(
                (None, *preprocessing.shape),
                kind=m.input_kind,
                pooling=m.pooling,
                monitor=m.monitor_input,
            ),
        )
    inputs = [n for n in (INPUT_LAYER, COARSE_INPUT_LAYER) if n in layers]
    coarse: list[str] = []
    if not auto and not m.monitor_input and inputs:
        problems.append(
            f"model.monitor_input: false, but layers lists {inputs[0]!r}; drop one of them"
        )
    elif not auto and entry is not None and entry.monitored and not inputs:
        # An explicit list keeps the model's input, pooled as its kind says (an image on
        # two grids).
        pooling = {n: layer_choice.pooling_of(m.pooling, n) for n in layers}
        pooling[INPUT_LAYER] = entry.pooling
        coarse = [COARSE_INPUT_LAYER] if entry.coarse else []
        pooling.update({n: "flatten" for n in coarse})
        layers = [INPUT_LAYER, *coarse, *layers]
    tap = _collect(
        problems, lambda: open_tap(path, layers, pooling=pooling, threads=1, device=m.device)
    )
    if tap is not None and coarse and not offers_coarse(tap.candidates()):
        # A graph tensor has the coarse view's name: the input is watched on its grid only.
        layers = [n for n in layers if n not in coarse]
        pooling = {n: layer_choice.pooling_of(pooling, n) for n in layers}
        tap = _collect(
            problems, lambda: open_tap(path, layers, pooling=pooling, threads=1, device=m.device)
        )
    data = _load_data(cfg, preprocessing, classes, problems)
    if "train" not in data and len(problems) == before:
        problems.append("data.train: the model section needs training inputs")
    if auto and tap is not None and len(problems) == before:
        problems.extend(_check_auto(tap, m.pooling, data))
    if len(problems) > before:
        return None
    return ModelInputs(
        path=path,
        files=files,
        format=m.format,
        preprocessing=preprocessing,
        pooling=m.pooling if auto else pooling,
        layers=layers,
        classes=classes,
        tap=tap,
        data=data,
        auto=auto,
        input_kind=m.input_kind,
        monitor_input=m.monitor_input,
        listed=None if auto else listed,
        device=m.device,
    )


def input_plan(model: ModelInputs) -> layer_choice.InputPlan:
    """How a prepared model's input is monitored: its kind, pooling and why (the input's
    shape is ``model.preprocessing.shape``, which the checks hold to the model's)."""
    return layer_choice.input_plan(
        (None, *model.preprocessing.shape),
        kind=model.input_kind,
        pooling=model.pooling,
        monitor=model.monitor_input,
    )


def _load_data(
    cfg: BuildConfig,
    preprocessing: Preprocessing | None,
    classes: list[str],
    problems: list[str],
) -> dict[str, LabelledData]:
    """Every data set of the config that loads, checked against the model's input size and
    the classes (the others' problems added to ``problems``)."""
    data: dict[str, LabelledData] = {}
    for name, spec in cfg.spec.data.items():
        loaded = _collect(
            problems,
            functools.partial(
                load_dataset,
                spec,
                resolve=cfg.resolve,
                name=name,
                labelled=name in ("train", "validation", "test"),
            ),
        )
        if loaded is None:
            continue
        x, y = loaded
        if preprocessing is not None and x[0].size != preprocessing.size:
            problems.append(
                f"data.{name}: each input has {x[0].size} values, the model's "
                f"preprocessing.shape {list(preprocessing.shape)} needs {preprocessing.size}"
            )
        if y is not None and len(y) and (y.min() < 0 or y.max() >= len(classes)):
            bad = sorted({int(v) for v in y if v < 0 or v >= len(classes)})[:5]
            problems.append(f"data.{name}: labels {bad} are outside the {len(classes)} classes")
        data[name] = (x, y)
    return data


def _check_auto(
    tap: Tap, pooling: str | dict[str, str], data: dict[str, LabelledData]
) -> list[str]:
    """What ``layers: auto`` needs, checked before the build (``--dry-run`` too)."""
    problems = []
    if not layer_choice.rankable(tap.candidates(), pooling):
        problems.append(
            f"layers: auto found no candidate layer with 2 to {layer_choice.MAX_FEATURES:,} "
            f"features, conv maps pooled (pooling: {pooling}); list the layers to monitor"
        )
    name = "validation" if "validation" in data else "train"
    y = data[name][1]
    if y is not None and len(np.unique(y)) < 2:
        problems.append(
            f"data.{name}: layers: auto ranks layers by held-out-class validation, which "
            "needs inputs of at least 2 known classes"
        )
    return problems


def output_layer(tap: Tap, infos: list[LayerInfo], n_classes: int) -> str | None:
    """The candidate that is the model's output: ONNX's first graph output, else (torch)
    the last candidate of shape (batch, n_classes)."""
    name = getattr(tap, "output_name", None)
    if name is not None and any(i.name == name for i in infos):
        return str(name)
    fits = [i.name for i in infos if len(i.shape) == 2 and i.shape[1] == n_classes]
    return fits[-1] if fits else None


def _tapped(pooling: str | dict[str, str], names: Sequence[str]) -> str | dict[str, str]:
    """The config's pooling restricted to the layers a tap opens (a mapping may name
    layers that ``layers: auto`` does not pick)."""
    if isinstance(pooling, str):
        return pooling
    return {name: layer_choice.pooling_of(pooling, name) for name in names}


def choose_layers(
    model: ModelInputs, params: MonitorSection | Mapping[str, Any]
) -> layer_choice.LayerChoice:
    """``layers: auto``: the layers :mod:`.layer_choice` picks for ``model`` from its
    known inputs (train and validation; never ``data.unknown*``). ``params`` is the
    config's ``monitor`` section (record or raw mapping). The build and ``boxwatch layers
    --config`` both call this.
    """
    infos = model.tap.candidates()
    validation = model.data.get("validation")
    train_x, train_y = model.data["train"]
    assert train_y is not None  # labelled (load_dataset)
    return layer_choice.choose_layers(
        lambda names: open_tap(
            model.path,
            names,
            pooling=_tapped(model.pooling, names),
            threads=1,
            device=model.device,
        ),
        infos,
        output=output_layer(model.tap, infos, len(model.classes)),
        pooling=model.pooling,
        preprocess=model.preprocessing.apply,
        train=(train_x, train_y),
        validation=None
        if validation is None or validation[1] is None
        else (validation[0], validation[1]),
        n_classes=len(model.classes),
        params=params,
        batch=EXTRACT_BATCH,
        input_kind=model.input_kind,
        monitor_input=model.monitor_input,
    )


def _model_files(cfg: BuildConfig) -> list[tuple[str, Path]]:
    """Every file the model loads, by recorded name: the model digest covers them all.

    ``model.external_data`` is optional; when given it must name exactly the files the
    ONNX graph references (see :func:`boxwatch.agent.runtime.model_files`).
    """
    m = cfg.spec.model
    assert m is not None  # the callers checked
    declared = m.external_data
    return model_files(
        cfg.resolve(m.path),
        declared=None if declared is None else [cfg.resolve(p) for p in declared],
    )


def extract(
    model: ModelInputs,
    x: np.ndarray | Sequence[np.ndarray],
    bar: Phase | None = None,
    *,
    store: ActivationStore | None = None,
    guard: MemoryGuard | None = None,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Logits and activations of ``x`` (or of several sets, their rows one after another),
    in batches of :data:`EXTRACT_BATCH` rows of each set (what the agent computes online),
    written into arrays of ``store`` (default: in memory); ``guard`` checks the process's
    memory after each batch."""
    parts = [x] if isinstance(x, np.ndarray) else list(x)
    n = sum(len(part) for part in parts)
    allocate = np.zeros if store is None else store.allocate
    logits: np.ndarray | None = None
    acts: dict[str, np.ndarray] = {}
    row = 0
    for part in parts:
        for start in range(0, len(part), EXTRACT_BATCH):
            out, a = model.tap.run(model.preprocessing.apply(part[start : start + EXTRACT_BATCH]))
            if logits is None:
                logits = allocate((n, *out.shape[1:]), out.dtype)
                acts = {
                    layer: allocate((n, a[layer].shape[1]), np.float32) for layer in model.layers
                }
            logits[row : row + len(out)] = out
            for layer in model.layers:
                acts[layer][row : row + len(out)] = a[layer]
            row += len(out)
            if bar is not None:
                bar.update(len(out))
            if guard is not None:
                guard.check("extracting activations")
    assert logits is not None  # every data set holds inputs (load_dataset)
    return logits, acts


def build(
    prepared: Prepared,
    private_key: Ed25519PrivateKey,
    *,
    created_at: int | None = None,
    progress: Progress | None = None,
) -> BuildOutcome:
    """Run the whole build; deterministic for the same inputs, key and creation time.

    Activations go through the activation store of ``prepared.resources`` (memory-mapped
    files, removed at the end) and the extraction is held to its memory bound
    (:mod:`.memory`). ``progress`` shows each long phase (default: nothing shown)."""
    resources = prepared.resources
    with ActivationStore(resources.work_dir, in_memory=resources.in_memory) as store:
        guard = MemoryGuard(resources.bound, resources.bound_name)
        into = functools.partial(extract, store=store, guard=guard)
        return _build(prepared, private_key, created_at, progress, into)


def _build(
    prepared: Prepared,
    private_key: Ed25519PrivateKey,
    created_at: int | None,
    progress: Progress | None,
    extract_into: Callable[..., tuple[np.ndarray, dict[str, np.ndarray]]],
) -> BuildOutcome:
    """:func:`build`, its activations extracted by ``extract_into``."""
    cfg = prepared.cfg
    # --jobs over monitor.n_jobs: how the per-class work runs, never what it gives.
    spec = msgspec.structs.replace(
        cfg.spec, monitor=cfg.spec.monitor.with_jobs(prepared.resources.n_jobs)
    )
    parts = _Assembly()
    progress = Progress(mode="off") if progress is None else progress
    half = (
        None
        if prepared.model is None
        else _model_half(prepared.model, spec, parts, progress, extract_into)
    )
    bn_summary = UNSET if prepared.bn is None else _bn_half(prepared.bn, parts, progress)
    parts.contents["model_version"] = spec.metadata.model_version
    sign = functools.partial(
        build_artifact_bytes,
        private_key=private_key,
        created_at=resolve_created_at(created_at),
        model=None if half is None else half.record,
        config=_config_record(cfg),
    )
    monitor_summary: MonitorSummary | UnsetType = UNSET
    if half is not None:
        # What the agent will emit, from the members the artifact holds (signed once here
        # without the split, which the manifest then carries; the members do not change).
        t0 = time.perf_counter()
        draft = load_artifact(sign(parts.members, contents=parts.contents), None)
        with progress.phase("running the agent's runtime on the held-out sets"):
            monitor_summary, verdict_split = _emitted(half, draft)
        if verdict_split:
            parts.contents["verdict_split"] = verdict_split
        parts.timings["emitted verdicts"] = time.perf_counter() - t0
    artifact = sign(parts.members, contents=parts.contents)
    built = load_artifact(artifact, None)  # the contract's own reading of what was written
    summary = BuildSummary(
        metadata=Metadata(
            name=cfg.path.stem if spec.metadata.name is None else spec.metadata.name,
            model_version=spec.metadata.model_version,
            builder_version=__version__,
            created_at=built.manifest["created_at"],
        ),
        artifact=ArtifactSummary(
            artifact_id=built.artifact_id,
            key_id=key_id(private_key.public_key()),
            sha256=hashlib.sha256(artifact).hexdigest(),
            bytes=len(artifact),
        ),
        policy=PolicyResult(fail_on=list(spec.policy.fail_on)),
        model=UNSET if half is None else half.summary,
        monitor=monitor_summary,
        bn=bn_summary,
        timings={k: round(v, 3) for k, v in parts.timings.items()},
    )
    return BuildOutcome(artifact, summary.judged(spec.policy), parts.files)


def _model_half(
    mi: ModelInputs,
    spec: BuildSpec,
    parts: _Assembly,
    progress: Progress,
    extract_into: Callable[..., tuple[np.ndarray, dict[str, np.ndarray]]],
) -> _ModelHalf:
    """Choose the layers (``layers: auto``), fit the box monitors, add their members."""
    digest = digest_files(mi.files)
    if mi.auto:
        t0 = time.perf_counter()
        with threadpool_limits(limits=1), progress.phase("layer choice", _ranking_steps(mi)):
            choice = choose_layers(mi, spec.monitor)
        poolings = choice.layer_pooling()
        mi = dataclasses.replace(
            mi,
            layers=choice.layers,
            pooling=poolings,
            tap=open_tap(mi.path, choice.layers, pooling=poolings, threads=1, device=mi.device),
        )
        parts.timings["layer choice"] = time.perf_counter() - t0
        choice_summary = choice.summary()
    else:
        poolings = {n: layer_choice.pooling_of(mi.pooling, n) for n in mi.layers}
        choice_summary = LayerChoiceSummary(
            mode="config",
            layers=list(mi.layers),
            rule=CONFIG_RULE,
            pooling=poolings,
            candidates=layer_choice.listed(
                mi.tap.candidates(), mi.listed or mi.layers, poolings, input_plan(mi)
            ),
        )
    t0 = time.perf_counter()
    # Hundreds of small k-means fits: one BLAS/OpenMP thread is ~9x faster here than
    # two threads contending (measured on the example: 1.6 s against 14.2 s).
    with threadpool_limits(limits=1):
        monitor = fit_monitors(mi, spec.monitor, extract=extract_into, progress=progress)
    parts.timings["monitors"] = time.perf_counter() - t0
    parts.members[MODEL_SPEC] = {
        "format": mi.format,
        "preprocessing": mi.preprocessing.to_dict(),
        "pooling": mi.pooling,
        "layers": mi.layers,
        "classes": mi.classes,
        "model_version": spec.metadata.model_version,
        "input_range": input_range(mi).to_dict(),
    }
    parts.members.update(monitor.members(BOXES_PREFIX))
    # What a refit reads to find a class's training rows without the model's pass.
    x_train, y_train = mi.data["train"]
    parts.members[TRAIN_PREDICTIONS] = predictions_member(
        x_train, y_train, monitor.logits["train"].argmax(axis=1), len(mi.classes)
    )
    parts.contents.update(_monitor_contents(mi, monitor))
    summary = ModelSummary(
        path=str(mi.path),
        format=mi.format,
        digest=digest["digest"],
        classes=mi.classes,
        layers=mi.layers,
        accuracy=monitor.accuracy,
        input_kind=input_plan(mi).kind,
    )
    record = {"format": mi.format, **digest}
    return _ModelHalf(mi, monitor, choice_summary, record, summary, spec.monitor, extract_into)


def _ranking_steps(mi: ModelInputs) -> int:
    """The tau-sweep steps the layer choice takes, about: one per class and kind (good,
    bad) of each ranked candidate (twins of another candidate are skipped, so fewer)."""
    infos = mi.tap.candidates()
    output = output_layer(mi.tap, infos, len(mi.classes))
    n = sum(s.reason is None for s in layer_choice.to_rank(infos, mi.pooling, output))
    return n * 2 * len(mi.classes)


def _bn_half(bn: bn_stage.BNInputs, parts: _Assembly, progress: Progress) -> BNSummary:
    """Compile and verify the BN classifier, add its members."""
    t0 = time.perf_counter()
    bn_out = bn_stage.run(bn, progress)
    parts.timings["bn"] = time.perf_counter() - t0
    parts.members.update(bn_out.diagram.to_members(DIAGRAM_PREFIX))
    parts.members[RULES] = bn_out.gate_rules
    parts.members[VERIFICATION] = bn_out.verification
    parts.contents["bn"] = bn_out.contents
    parts.contents["rules"] = bn_out.rule_verdicts
    parts.files.update(bn_out.files)
    return bn_out.summary


def input_range(mi: ModelInputs) -> InputRange:
    """Per-feature min/max of the preprocessed training inputs (the agent's wrong-scale
    check): :meth:`InputRange.fit`'s result, computed :data:`EXTRACT_BATCH` rows at a time
    so that the preprocessed set is never held whole (float64, eight times the rows'
    float32 bytes over again)."""
    x = mi.data["train"][0]
    chunks = range(0, len(x), EXTRACT_BATCH)

    def flat(start: int) -> np.ndarray:
        part = mi.preprocessing.apply(x[start : start + EXTRACT_BATCH])
        rows = np.asarray(part, dtype=np.float64).reshape(len(part), -1)
        return rows[np.isfinite(rows).all(axis=1)]

    lo = hi = None
    width = 0
    for start in chunks:
        rows = flat(start)
        width = rows.shape[1]
        if len(rows):
            lo = rows.min(axis=0) if lo is None else np.minimum(lo, rows.min(axis=0))
            hi = rows.max(axis=0) if hi is None else np.maximum(hi, rows.max(axis=0))
    if lo is None or hi is None:  # no finite input: fit() takes one row of zeros then
        return InputRange.fit(np.zeros((1, width)))
    peaks = [InputRange(lo, hi)._peaks(rows) for rows in map(flat, chunks)]
    found = [p for p in peaks if p is not None and len(p)]
    return InputRange(lo, hi, float(min(p.min() for p in found)) if found else None)


def _config_record(cfg: BuildConfig) -> dict[str, Any]:
    """The config as built, with the config file's own digest (paths stay as written)."""
    raw = cfg.path.read_bytes()
    return {"file": cfg.path.name, "sha256": hashlib.sha256(raw).hexdigest(), "values": cfg.raw}


def _monitor_contents(mi: ModelInputs, monitor: MonitorOutcome) -> dict[str, Any]:
    return {
        "classes": mi.classes,
        "layers": mi.layers,
        "monitors": monitor.contents,
        "preprocessing": mi.preprocessing.to_dict(),
    }


@dataclass(frozen=True)
class _HeldOut:
    """The build's held-out data as the agent's runtime saw it."""

    sets: dict[str, LabelledData]  # validation, the unknown sets, test: what was run
    results: dict[str, ModelResult]
    logits: dict[str, np.ndarray]  # the model's logits of each set
    acts: dict[str, dict[str, np.ndarray]]  # the monitored layers' activations of each set
    unknown_names: list[str]  # "unknown" first, then "unknown_*" by name
    boxes: BoxRuntime  # the runtime's box monitor (its error score ranks the model's mistakes)

    def labelled(self) -> dict[str, tuple[np.ndarray, ModelResult]]:
        """The labelled sets by split prefix (``""`` validation, ``"test:"``): labels, result."""
        return {
            pre: (np.asarray(self.sets[name][1]), self.results[name])
            for pre, name in (("", "validation"), ("test:", "test"))
            if name in self.results and self.sets[name][1] is not None
        }

    def verdicts(self, name: str, label: str | None = None) -> emitted.SetVerdicts:
        """The set ``name`` as the comparison reads it (called ``label`` there)."""
        return emitted.SetVerdicts(
            label or name,
            self.sets[name][1],
            self.results[name],
            self.logits[name],
            self.acts[name],
        )


def _run_held_out(half: _ModelHalf, draft: Artifact) -> _HeldOut:
    """Run the agent's runtime (rebuilt from the draft artifact) on the validation inputs
    (else the training rows held out for calibration), every unknown set and the test set."""
    mi, monitor = half.inputs, half.monitor
    runtime = emitted.agent_runtime(draft, mi.tap)
    sets: dict[str, LabelledData] = {}
    logits: dict[str, np.ndarray] = {}
    acts: dict[str, dict[str, np.ndarray]] = {}
    if "validation" in mi.data:
        sets["validation"] = mi.data["validation"]
        logits["validation"] = monitor.logits["validation"]
        acts["validation"] = monitor.acts["validation"]
    elif "train" in monitor.calibration_rows:
        rows = monitor.calibration_rows["train"]
        x, y = mi.data["train"]
        sets["validation"] = (x[rows], None if y is None else y[rows])
        logits["validation"] = monitor.logits["train"][rows]
        acts["validation"] = {k: v[rows] for k, v in monitor.acts["train"].items()}
    unknown_names = unknown_sets(mi.data)
    for name in unknown_names:
        sets[name] = mi.data[name]
        logits[name] = monitor.logits[name]
        acts[name] = monitor.acts[name]
    if "test" in mi.data:
        sets["test"] = mi.data["test"]
    results = emitted.run_sets(runtime, sets)
    if "test" in results:
        logits["test"], acts["test"] = half.extract(mi, mi.data["test"][0])
    assert runtime.boxes is not None  # the artifact monitors the model
    return _HeldOut(sets, results, logits, acts, unknown_names, runtime.boxes)


def _emitted(half: _ModelHalf, draft: Artifact) -> tuple[MonitorSummary, dict[str, Any]]:
    """Run the agent's runtime on the build's data; return the monitor's summary with the
    emitted-verdict sections (``verdicts``, ``evaluation``, ``operating_points``,
    ``model_errors``, ``baselines``, ``histogram``, ``warnings``) and the manifest's
    ``verdict_split`` (empty when no labelled held-out inputs exist)."""
    mi, monitor = half.inputs, half.monitor
    held = _run_held_out(half, draft)
    labelled = held.labelled()
    unknown = {name: held.results[name] for name in held.unknown_names}
    full = emitted.split(labelled, unknown)
    verdict_split = {k: v for k, v in full.items() if not k.startswith("test:")}
    fit = monitor.summary
    known_scores = np.zeros(0)
    evaluation: Evaluation | UnsetType = UNSET
    errors: dict[str, ModelErrors] | UnsetType = UNSET
    baselines: BaselineComparison | UnsetType = UNSET
    histogram: ScoreHistogram | UnsetType = UNSET
    if "" in labelled:
        known_scores = labelled[""][1].scores
        evaluation, errors = _labelled_checks(held, labelled, unknown, len(mi.classes))
        baselines, histogram = _comparison(half, held)
    operating_points = [
        _operating_point(
            name, full[f"unknown:{name}"], emitted.score_auroc(known_scores, unknown[name].scores)
        )
        for name in held.unknown_names
    ]
    target = float(monitor.monitor.target_acceptance)
    warnings = emitted.warnings(fit, verdict_split, target, _train_counts(mi, monitor), mi.classes)
    unwatched = _input_warning(half, {name: full[f"unknown:{name}"] for name in held.unknown_names})
    if unwatched is not None:
        warnings.append(unwatched)
    summary = MonitorSummary(
        **msgspec.structs.asdict(fit),
        layer_choice=half.layer_choice,
        verdicts=VerdictsSummary(set=fit.calibration_set, split=full),
        operating_points=operating_points,
        warnings=warnings,
        evaluation=evaluation,
        model_errors=errors,
        baselines=baselines,
        histogram=histogram,
    )
    return summary, {k: msgspec.to_builtins(v) for k, v in verdict_split.items()}


def _input_warning(half: _ModelHalf, unknown: Mapping[str, VerdictShares]) -> BuildWarning | None:
    """``input_not_monitored`` when the model's input is not monitored: measured on every
    unknown set against a monitor of the input alone where one can be fitted."""
    mi = half.inputs
    if INPUT_LAYER in mi.layers:
        return None
    plan = input_plan(mi)
    measured = {}
    if unknown and plan.measurable:
        with threadpool_limits(limits=1):
            alone = input_alone(mi, half.params, half.monitor, plan.pooling, list(unknown))
        measured = {name: (shares.accept, alone[name]) for name, shares in unknown.items()}
    return emitted.input_not_monitored(plan.reason, measured)


def _operating_point(name: str, shares: VerdictShares, auroc: float | None) -> OperatingPoint:
    """What the emitted verdicts do with the unknown set ``name``: its split, the share
    accepted (false accepts), and the score's AUROC against the known validation inputs."""
    return OperatingPoint(
        set=name,
        n=shares.n,
        accept=shares.accept,
        uncertainty=shares.uncertainty,
        reject=shares.reject,
        acceptance=shares.accept,
        auroc=auroc,
    )


def _labelled_checks(
    held: _HeldOut,
    labelled: dict[str, tuple[np.ndarray, ModelResult]],
    unknown: dict[str, ModelResult],
    n_classes: int,
) -> tuple[Evaluation, dict[str, ModelErrors]]:
    """What the labelled held-out inputs tell: the outcome table (validation + data.unknown)
    and the model's errors by set."""
    y_val, res_val = labelled[""]
    if "unknown" in unknown:  # the evaluation set: validation + data.unknown (label -1)
        u = unknown["unknown"]
        joined = ModelResult(
            predicted=np.concatenate([res_val.predicted, u.predicted]),
            verdicts=np.concatenate([res_val.verdicts, u.verdicts]),
            layer_verdicts={
                k: np.concatenate([v, u.layer_verdicts[k]])
                for k, v in res_val.layer_verdicts.items()
            },
            scores=np.concatenate([res_val.scores, u.scores]),
            inference_seconds=0.0,
            monitor_seconds=0.0,
        )
        y_eval = np.concatenate([y_val, np.full(len(u.predicted), emitted.UNKNOWN_LABEL)])
        evaluation = emitted.outcome_table(y_eval, joined, n_classes)
    else:
        evaluation = emitted.outcome_table(y_val, res_val, n_classes)
    errors = {"validation": emitted.model_errors(y_val, res_val, held.logits["validation"])}
    if "test:" in labelled:
        y_t, res_t = labelled["test:"]
        errors["test"] = emitted.model_errors(y_t, res_t, held.logits["test"])
    return evaluation, errors


def _comparison(half: _ModelHalf, held: _HeldOut) -> tuple[BaselineComparison, ScoreHistogram]:
    """The baselines beside the emitted verdicts at the matched point, on ``data.test`` when
    the config gives it (else on the calibration set), and the score histograms of that set
    and every unknown set. Feature baselines fit on the training inputs the boxes were
    fitted on (at most :data:`~.emitted.MAX_BASELINE_ROWS` of them) and choose their layer
    on the validation inputs (known inputs only)."""
    mi, monitor = half.inputs, half.monitor
    train_x, train_y = mi.data["train"]
    assert train_y is not None  # labelled (load_dataset)
    fit_rows = np.setdiff1d(np.arange(len(train_x)), monitor.calibration_rows.get("train", []))
    fit_rows = emitted.baseline_rows(fit_rows, monitor.monitor.random_state)
    y_val = held.sets["validation"][1]
    assert y_val is not None  # the caller checked
    features, not_computed = emitted.feature_methods(
        ({k: v[fit_rows] for k, v in monitor.acts["train"].items()}, train_y[fit_rows]),
        (held.acts["validation"], y_val),
        random_state=monitor.monitor.random_state,
    )
    for name, baseline in TABLE.items():
        if name not in emitted.BASELINES:
            not_computed[name] = f"needs {NEEDS[baseline.needs]}, which the build does not read"
    test = "test:" in held.labelled()
    data = (
        held.verdicts("test")
        if test
        else held.verdicts("validation", monitor.summary.calibration_set)
    )
    unknown = [held.verdicts(name) for name in held.unknown_names]
    compared = emitted.comparison(
        "test" if test else "validation",
        data,
        unknown,
        [*emitted.logit_methods(), *features],
        lambda d: held.boxes.error_score(d.acts, d.result.predicted, d.logits),
        {name: not_computed[name] for name in TABLE if name in not_computed},
    )
    return compared, emitted.score_histogram(data, unknown)


def _train_counts(mi: ModelInputs, monitor: MonitorOutcome) -> list[int]:
    """Correctly classified training inputs per class, of those the boxes were fitted on."""
    train_x, train_y = mi.data["train"]
    fit_rows = np.setdiff1d(np.arange(len(train_x)), monitor.calibration_rows.get("train", []))
    pred_train = monitor.logits["train"].argmax(axis=1)[fit_rows]
    y_train = np.asarray(train_y)[fit_rows]
    return [int(np.sum((y_train == c) & (pred_train == c))) for c in range(len(mi.classes))]
