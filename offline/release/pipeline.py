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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from threadpoolctl import threadpool_limits

from boxwatch import __version__
from boxwatch.agent.artifact import (
    build_artifact_bytes,
    digest_files,
    load_artifact,
    resolve_created_at,
)
from boxwatch.agent.errors import BoxwatchError, ConfigError
from boxwatch.agent.inputs import one_line, quote
from boxwatch.agent.keys import key_id
from boxwatch.agent.members import BOXES_PREFIX, DIAGRAM_PREFIX, MODEL_SPEC, RULES, VERIFICATION
from boxwatch.agent.preprocessing import InputRange, Preprocessing
from boxwatch.agent.runtime import ModelResult, model_files
from boxwatch.agent.taps import LayerInfo, Tap, open_tap
from boxwatch.offline.release import bn_stage, emitted, layer_choice
from boxwatch.offline.release.config import BuildConfig
from boxwatch.offline.release.datasets import load_dataset
from boxwatch.offline.release.monitor_stage import MonitorOutcome, fit_monitors

# progress(label, total) -> a context manager whose value has .update(n) (click.progressbar).
Progress = Callable[[str, int], Any]
EXTRACT_BATCH = 512
CONFIG_RULE = "listed in the build config"


@dataclass
class ModelInputs:
    """The model half of a validated config."""

    path: Path
    files: list[tuple[str, Path]]  # (recorded name, real path): what the model digest covers
    format: str
    preprocessing: Preprocessing
    pooling: str | dict[str, str]
    layers: list[str]
    classes: list[str]
    tap: Tap
    data: dict[str, tuple[np.ndarray, np.ndarray | None]]
    # ``layers`` omitted or "auto": :func:`choose_layers` picks them (build time); until
    # then ``layers`` is empty and ``tap`` taps nothing.
    auto: bool = False


@dataclass
class Prepared:
    """Everything :func:`build` needs, checked."""

    cfg: BuildConfig
    model: ModelInputs | None
    bn: bn_stage.BNInputs | None


@dataclass
class BuildOutcome:
    """What a build produced: artifact bytes, the report's summary, failed policies."""

    artifact: bytes
    summary: dict[str, Any]
    policy_failures: list[str] = field(default_factory=list)


def _collect(problems: list[str], step: Callable[[], Any]) -> Any:
    """Run one validation step, adding its problems to ``problems`` instead of stopping."""
    try:
        return step()
    except ConfigError as exc:
        problems.extend(exc.problems)
    except BoxwatchError as exc:
        problems.append(str(exc))
    return None


def prepare(cfg: BuildConfig, out: Path | None = None) -> Prepared:
    """Validate every input of the config; raise one :class:`ConfigError` with all problems.

    ``out``, the artifact path to write, is checked too (its folder must exist), so that
    ``--dry-run`` catches what would otherwise fail after the whole build.
    """
    problems: list[str] = check_out_path(out)
    model = _checked_model(cfg, problems) if "model" in cfg.raw else None
    bn = _collect(problems, lambda: bn_stage.prepare(cfg)) if "bn" in cfg.raw else None
    if problems:
        raise ConfigError(problems)
    return Prepared(cfg, model, bn)


def prepare_model(cfg: BuildConfig, *, auto: bool = False) -> ModelInputs:
    """The model half of :func:`prepare` alone (``boxwatch layers --config``); ``auto``
    prepares it for ``layers: auto`` whatever the config's ``layers`` say."""
    if "model" not in cfg.raw:
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
    """Problems of ``model.input_name`` and ``model.preprocessing.shape`` against the model's
    own input (name, rank, fixed dims), found before the model is run (``--dry-run`` too)."""
    tap, pre = model.tap, model.preprocessing
    session = getattr(tap, "session", None)
    if session is not None:  # ONNX: the input's name and declared shape
        declared = session.get_inputs()[0]
        name: str | None = declared.name
        dims = list(declared.shape)
    elif (example := getattr(tap, "_example", None)) is not None:  # torch.export: its rank
        name, dims = None, [None, *example.shape[1:]]
    else:  # TorchScript declares nothing; the probe run finds misfits
        return []
    problems = []
    if pre.input_name is not None and name is not None and pre.input_name != name:
        problems.append(
            f"model.input_name: {quote(pre.input_name)} is not an input of the model "
            f"(its input is {quote(name)})"
        )
    want = [int(d) for d in pre.shape]
    if len(dims) != len(want) + 1:
        problems.append(
            f"model.preprocessing.shape: {want} makes inputs of rank {len(want) + 1} (with the "
            f"batch axis) but the model's input has rank {len(dims)} (shape {dims})"
        )
    elif any(isinstance(d, int) and d > 0 and d != w for d, w in zip(dims[1:], want, strict=True)):
        problems.append(
            f"model.preprocessing.shape: {want} does not fit the model's input shape {dims}"
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
    m = cfg.section("model")
    before = len(problems)
    files = _collect(problems, lambda: _model_files(cfg))
    path = files[0][1] if files else cfg.resolve(m["path"])
    classes = list(cfg.raw.get("classes") or [])
    raw_layers = cfg.raw.get("layers", layer_choice.AUTO)
    auto = auto or raw_layers == layer_choice.AUTO
    layers = [] if auto else list(raw_layers)
    if not classes:
        problems.append("classes: the model section needs the list of class names")
    if "data" not in cfg.raw:
        problems.append("data: the model section needs data.train (and ideally validation)")
    pre_raw = m.get("preprocessing") or {}
    if "shape" not in pre_raw:
        problems.append("model.preprocessing.shape: the input shape (without batch) is required")
    if len(problems) > before:
        return None
    preprocessing = _collect(
        problems, lambda: Preprocessing.from_dict({**pre_raw, "input_name": m.get("input_name")})
    )
    pooling = m.get("pooling", "flatten")
    tap = _collect(
        problems,
        lambda: open_tap(
            path, layers, pooling=_tapped(pooling, layers) if auto else pooling, threads=1
        ),
    )
    data: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    for name, spec in cfg.section("data").items():
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
    if "train" not in data and len(problems) == before:
        problems.append("data.train: the model section needs training inputs")
    if auto and tap is not None and len(problems) == before:
        problems.extend(_check_auto(tap, pooling, data))
    if len(problems) > before:
        return None
    return ModelInputs(
        path=path,
        files=files,
        format=m.get("format", "onnx"),
        preprocessing=preprocessing,
        pooling=pooling,
        layers=layers,
        classes=classes,
        tap=tap,
        data=data,
        auto=auto,
    )


def _check_auto(
    tap: Tap, pooling: str | dict[str, str], data: dict[str, tuple[np.ndarray, np.ndarray | None]]
) -> list[str]:
    """What ``layers: auto`` needs, checked before the build (``--dry-run`` too)."""
    problems = []
    if not layer_choice.rankable(tap.candidates(), pooling):
        problems.append(
            f"layers: auto found no candidate layer with 2 to {layer_choice.MAX_FEATURES:,} "
            f"features (pooling: {pooling}); list the layers to monitor, or set "
            "model.pooling: avg"
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


def choose_layers(model: ModelInputs, params: dict[str, Any]) -> layer_choice.LayerChoice:
    """``layers: auto``: the layers :mod:`.layer_choice` picks for ``model`` from its
    known inputs (train and validation; never ``data.unknown*``). ``params`` is the
    config's ``monitor`` section. The build and ``boxwatch layers --config`` both call this.
    """
    infos = model.tap.candidates()
    validation = model.data.get("validation")
    train_x, train_y = model.data["train"]
    assert train_y is not None  # labelled (load_dataset)
    return layer_choice.choose_layers(
        lambda names: open_tap(model.path, names, pooling=_tapped(model.pooling, names), threads=1),
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
    )


def _model_files(cfg: BuildConfig) -> list[tuple[str, Path]]:
    """Every file the model loads, by recorded name: the model digest covers them all.

    ``model.external_data`` is optional; when given it must name exactly the files the
    ONNX graph references (see :func:`boxwatch.agent.runtime.model_files`).
    """
    m = cfg.section("model")
    declared = m.get("external_data")
    return model_files(
        cfg.resolve(m["path"]),
        declared=None if declared is None else [cfg.resolve(p) for p in declared],
    )


def extract(
    model: ModelInputs, x: np.ndarray, bar: Any = None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Logits and activations of ``x`` in batches (what the agent computes online)."""
    logits: list[np.ndarray] = []
    acts: dict[str, list[np.ndarray]] = {layer: [] for layer in model.layers}
    for start in range(0, len(x), EXTRACT_BATCH):
        out, a = model.tap.run(model.preprocessing.apply(x[start : start + EXTRACT_BATCH]))
        logits.append(out)
        for layer in model.layers:
            acts[layer].append(a[layer])
        if bar is not None:
            bar.update(min(EXTRACT_BATCH, len(x) - start))
    return np.concatenate(logits), {k: np.concatenate(v) for k, v in acts.items()}


def build(
    prepared: Prepared,
    private_key: Ed25519PrivateKey,
    *,
    created_at: int | None = None,
    progress: Progress | None = None,
) -> BuildOutcome:
    """Run the whole build; deterministic for the same inputs, key and creation time."""
    cfg = prepared.cfg
    epoch = resolve_created_at(created_at)
    timings: dict[str, float] = {}
    members: dict[str, Any] = {}
    contents: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    model_record = None
    meta = cfg.section("metadata")
    if prepared.model is not None:
        mi = prepared.model
        digest = digest_files(mi.files)
        model_record = {"format": mi.format, **digest}
        t0 = time.perf_counter()
        if mi.auto:
            with threadpool_limits(limits=1):
                choice = choose_layers(mi, cfg.section("monitor"))
            poolings = choice.layer_pooling()
            mi = dataclasses.replace(
                mi,
                layers=choice.layers,
                pooling=poolings,
                tap=open_tap(mi.path, choice.layers, pooling=poolings, threads=1),
            )
            timings["layer choice"] = time.perf_counter() - t0
            choice_summary = choice.as_dict()
        else:
            choice_summary = {"mode": "config", "layers": list(mi.layers), "rule": CONFIG_RULE}
        t0 = time.perf_counter()
        # Hundreds of small k-means fits: one BLAS/OpenMP thread is ~9x faster here than
        # two threads contending (measured on the example: 1.6 s against 14.2 s).
        with threadpool_limits(limits=1):
            monitor = fit_monitors(mi, cfg.section("monitor"), extract=extract, progress=progress)
        timings["monitors"] = time.perf_counter() - t0
        members[MODEL_SPEC] = {
            "format": mi.format,
            "preprocessing": mi.preprocessing.to_dict(),
            "pooling": mi.pooling,
            "layers": mi.layers,
            "classes": mi.classes,
            "model_version": meta.get("model_version", "unknown"),
            "input_range": input_range(mi).to_dict(),
        }
        members.update(monitor.members(BOXES_PREFIX))
        contents.update(_monitor_contents(mi, monitor))
        summary["model"] = {
            "path": str(mi.path),
            "format": mi.format,
            "digest": digest["digest"],
            "classes": mi.classes,
            "layers": mi.layers,
            "accuracy": monitor.accuracy,
        }
        summary["monitor"] = monitor.summary
        summary["monitor"]["layer_choice"] = choice_summary
    if prepared.bn is not None:
        t0 = time.perf_counter()
        bn_out = bn_stage.run(prepared.bn)
        timings["bn"] = time.perf_counter() - t0
        members.update(bn_out.diagram.to_members(DIAGRAM_PREFIX))
        members[RULES] = bn_out.gate_rules
        members[VERIFICATION] = bn_out.verification
        contents["bn"] = bn_out.contents
        contents["rules"] = bn_out.rule_verdicts
        summary["bn"] = bn_out.summary
    contents["model_version"] = meta.get("model_version", "unknown")
    if prepared.model is not None:
        # What the agent will emit, from the members the artifact holds (signed once here
        # without the split, which the manifest then carries; the members do not change).
        t0 = time.perf_counter()
        draft = load_artifact(
            build_artifact_bytes(
                members,
                private_key=private_key,
                created_at=epoch,
                model=model_record,
                config=_config_record(cfg),
                contents=contents,
            ),
            None,
        )
        verdict_split = _emitted(mi, monitor, draft, summary["monitor"])
        if verdict_split is not None:
            contents["verdict_split"] = verdict_split
        timings["emitted verdicts"] = time.perf_counter() - t0
    artifact = build_artifact_bytes(
        members,
        private_key=private_key,
        created_at=epoch,
        model=model_record,
        config=_config_record(cfg),
        contents=contents,
    )
    built = load_artifact(artifact, None)  # the contract's own reading of what was written
    failures = policy_failures(cfg.section("policy"), summary)
    summary["metadata"] = {
        "name": meta.get("name", cfg.path.stem),
        "model_version": meta.get("model_version", "unknown"),
        "builder_version": __version__,
        "created_at": built.manifest["created_at"],
    }
    summary["artifact"] = {
        "artifact_id": built.artifact_id,
        "key_id": key_id(private_key.public_key()),
        "sha256": hashlib.sha256(artifact).hexdigest(),
        "bytes": len(artifact),
    }
    summary["policy"] = {
        "fail_on": list(cfg.section("policy").get("fail_on", [])),
        "failed": failures,
    }
    summary["timings"] = {k: round(v, 3) for k, v in timings.items()}
    return BuildOutcome(artifact, summary, failures)


def input_range(mi: ModelInputs) -> InputRange:
    """Per-feature min/max of the preprocessed training inputs (the agent's wrong-scale check)."""
    x = mi.data["train"][0]
    return InputRange.fit(mi.preprocessing.apply(x))


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


def _emitted(
    mi: ModelInputs, monitor: MonitorOutcome, draft: Any, mon: dict[str, Any]
) -> dict[str, Any] | None:
    """Run the agent's runtime on the build's data; fill the summary's emitted-verdict
    sections (``verdicts``, ``evaluation``, ``operating_points``, ``model_errors``,
    ``baselines``, ``warnings``) and return the manifest's ``verdict_split`` (None when no
    labelled held-out inputs exist)."""
    runtime = emitted.agent_runtime(draft, mi.tap)
    sets: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    logits: dict[str, np.ndarray] = {}
    if "validation" in mi.data:
        sets["validation"] = mi.data["validation"]
        logits["validation"] = monitor.logits["validation"]
    elif "train" in monitor.calibration_rows:
        rows = monitor.calibration_rows["train"]
        x, y = mi.data["train"]
        sets["validation"] = (x[rows], None if y is None else y[rows])
        logits["validation"] = monitor.logits["train"][rows]
    unknown_names = sorted(
        (n for n in mi.data if n == "unknown" or n.startswith("unknown_")),
        key=lambda n: (n != "unknown", n),
    )
    for name in unknown_names:
        sets[name] = mi.data[name]
        logits[name] = monitor.logits[name]
    if "test" in mi.data:
        sets["test"] = mi.data["test"]
    results = emitted.run_sets(runtime, sets)
    if "test" in results:
        t_logits, _acts = extract(mi, mi.data["test"][0])
        logits["test"] = t_logits
    labelled = {
        pre: (np.asarray(sets[name][1]), results[name])
        for pre, name in (("", "validation"), ("test:", "test"))
        if name in results and sets[name][1] is not None
    }
    unknown = {name: results[name] for name in unknown_names}
    full = emitted.split(labelled, unknown)
    verdict_split = {k: v for k, v in full.items() if not k.startswith("test:")}
    mon["verdicts"] = {"set": mon.get("calibration_set"), "split": full}
    n_classes = len(mi.classes)
    if "" in labelled:
        y_val, res_val = labelled[""]
        known_scores = res_val.scores
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
            mon["evaluation"] = emitted.outcome_table(y_eval, joined, n_classes)
        else:
            mon["evaluation"] = emitted.outcome_table(y_val, res_val, n_classes)
        mon["model_errors"] = {
            "validation": emitted.model_errors(y_val, res_val, logits["validation"])
        }
        if "test:" in labelled:
            y_t, res_t = labelled["test:"]
            mon["model_errors"]["test"] = emitted.model_errors(y_t, res_t, logits.get("test"))
        mon["baselines"] = emitted.baselines(
            (y_val, res_val, logits["validation"]),
            {name: (unknown[name], logits[name]) for name in unknown_names},
            full["correct_known"]["accept"],
            (*labelled["test:"], logits["test"]) if "test:" in labelled else None,
        )
    else:
        known_scores = np.zeros(0)
    mon["operating_points"] = [
        {
            "set": name,
            **{k: full[f"unknown:{name}"][k] for k in ("n", "accept", "uncertainty", "reject")},
            "acceptance": full[f"unknown:{name}"]["accept"],
            "auroc": emitted.score_auroc(known_scores, unknown[name].scores),
        }
        for name in unknown_names
    ]
    train_x, train_y = mi.data["train"]
    fit_rows = np.setdiff1d(np.arange(len(train_x)), monitor.calibration_rows.get("train", []))
    pred_train = monitor.logits["train"].argmax(axis=1)[fit_rows]
    y_train = np.asarray(train_y)[fit_rows]
    counts = [int(np.sum((y_train == c) & (pred_train == c))) for c in range(n_classes)]
    target = float((mon.get("calibration") or {}).get("target_acceptance") or 0.95)
    mon["warnings"] = emitted.warnings(mon, verdict_split, target, counts, mi.classes)
    return verdict_split or None


def policy_failures(policy: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """Human-readable reasons why the built artifact breaks the config's policy."""
    failed = []
    fail_on = set(policy.get("fail_on", []))
    bn = summary.get("bn") or {}
    if "rule_violated" in fail_on:
        bad = [r["id"] for r in bn.get("rules", []) if r["verdict"] == "violated"]
        if bad:
            failed.append(f"rule_violated: {', '.join(bad)}")
    if "fmo_violated" in fail_on:
        bad = [q["id"] for q in bn.get("fmo", []) if q["verdict"] == "violated"]
        if bad:
            failed.append(f"fmo_violated: {', '.join(bad)}")
    if "bn_ties" in fail_on and bn.get("ties"):
        failed.append(f"bn_ties: {bn['ties']} inputs have a posterior exactly T")
    ev = ((summary.get("monitor") or {}).get("evaluation") or {}).get("combined") or {}
    for key, name in (("min_recall", "recall"), ("min_precision", "precision")):
        if key in policy and (ev.get(name) is None or ev[name] < policy[key]):
            failed.append(f"{key}: {name} {ev.get(name)} < {policy[key]}")
    mon = summary.get("monitor") or {}
    if "max_unknown_acceptance" in policy:
        limit = policy["max_unknown_acceptance"]
        points = mon.get("operating_points") or []
        over = [
            f"{p['set']} {p['acceptance']:.4g}"
            for p in points
            if p.get("acceptance") is None or p["acceptance"] > limit
        ]
        if not points:
            failed.append("max_unknown_acceptance: no unknown set to measure")
        elif over:
            failed.append(f"max_unknown_acceptance: {', '.join(over)} > {limit}")
    for warning in mon.get("warnings") or []:
        if warning["name"] in fail_on:
            failed.append(f"{warning['name']}: {warning['message']}")
    return failed
