"""Layer choice (``layers: auto``): which candidate taps of a model the box monitor watches.

One owner for the choice: ``build-artifact`` and ``boxwatch layers --config`` both call
:func:`choose_layers`. The criterion is the one the monitor already uses to pick tau and
the contrast layers, the *held-out-class* AUROC: every known validation input, its own
class withheld, plays an unknown that lands in its nearest other class, and a layer scores
by how well its box score term tells the real known inputs from these stand-ins
(:class:`~boxwatch.offline.monitors.estimator.BoxMonitor`, ``selection="held-out-class"``).
Only known inputs are used: ``data.unknown*`` never enters the choice.

The rule, deterministic:

1. *screen*: a candidate needs a fixed feature count (after the configured pooling) between
   2 and :data:`MAX_FEATURES`; a candidate whose features equal the model's input or an
   earlier candidate's on the ranking rows (a Flatten or Identity of it) is left out;
2. *rank*: per remaining candidate, a one-layer monitor is fitted on (up to
   :data:`MAX_TRAIN_ROWS` of) the training inputs with the build's monitor settings, tau
   picked by held-out-class validation on (up to :data:`MAX_VALIDATION_ROWS` of) the
   validation inputs; its AUROC at the chosen tau ranks it (ties: graph order);
3. *pick*: candidates form *blocks*, consecutive candidates (graph order) of the same
   output shape, such as a Gemm and its Relu; the best-ranked candidate of each block
   stands for it, and the :data:`N_CHOSEN` best blocks are monitored. The model's output
   (the logits) is ranked but left out (taken only when nothing else ranks);
4. *input*: the model's input (:data:`~boxwatch.agent.taps.INPUT_LAYER`) is monitored too,
   on a 7x7 grid (``pooling: grid``) when it is an image, as it is otherwise (flatten). The
   held-out-class AUROC cannot rank it (held-out classes look like the others in pixel
   space), but it is what catches inputs from another data set: on the 32 cells of
   ``bench/detection.py``, the cells where at most 5% of the far unknowns are accepted went
   from 16 (hand-picked hidden layers) to 32 with it (31 with this rule's own layers).

Why this rule (``bench/layer_choice.py``; docs/build-config.md has the table): on 20 cells
of ``bench/detection.py``'s suite (MNIST and Fashion-MNIST, CNN and MLP; 10 to develop the
rule, 10 held out), the fused score's AUROC against near and far unknowns averaged 0.846 /
0.987 on the held-out cells with it, as with the suite's hand-picked layers (0.845 / 0.984),
and 0.819 / 0.969 with "the top 2 by AUROC plus the penultimate layer". The held-out-class
AUROC alone ranks the logits and a layer's pre-activation high, but boxes on the logits
catch few unknowns and a layer and its activation repeat each other, while layers of
different depths (a conv map with the dense layers) add to one another. Adding the
penultimate layer to this rule lowered the AUROCs by up to 0.004.

Without a validation set, :data:`HELD_OUT_SHARE` of the training inputs (stratified by
label) stand in for it during the choice.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.taps import INPUT_LAYER, LayerInfo, Tap
from boxwatch.offline.monitors.estimator import BoxMonitor, _held_out_rows
from boxwatch.offline.release.records import (
    LayerCandidate,
    LayerChoiceSummary,
    MonitorSection,
    RowCounts,
    candidate_taus,
)

AUTO = "auto"
# Box monitors over wider layers are slow to fit and score; wider conv maps need pooling.
# 4,096 let the suite CNN's flattened 1,568-feature conv map in: the monitor then took 90%
# of the model call (bench/detection.py); with 1,024 it takes 20%.
MAX_FEATURES = 1024
MAX_TRAIN_ROWS = 2000
MAX_VALIDATION_ROWS = 1000
N_CHOSEN = 3
HELD_OUT_SHARE = 0.2
# The monitor parameters of the config that apply to the ranking monitors (the others, such
# as the calibration's, cannot change a held-out-class AUROC); the rest are the estimator's.
RANKING_PARAMETERS = ("tau", "normalize", "score", "contrast_classes", "random_state")
RULE = (
    f"the best candidate of each of the top {N_CHOSEN} blocks by held-out-class AUROC "
    "(known inputs only; the model's output left out)"
)


@dataclass
class LayerChoice:
    """What :func:`choose_layers` chose, and why, per candidate (graph order)."""

    layers: list[str]
    candidates: list[dict[str, Any]]
    set: str
    n_train: int
    n_validation: int
    seconds: float = 0.0
    rule: str = RULE
    pooling: str | dict[str, str] = "flatten"
    mode: str = AUTO
    poolings: dict[str, str] | None = None

    def layer_pooling(self) -> dict[str, str]:
        """The pooling of each chosen layer (what the tap and the artifact use)."""
        if self.poolings is not None:
            return dict(self.poolings)
        return {name: pooling_of(self.pooling, name) for name in self.layers}

    def summary(self) -> LayerChoiceSummary:
        """The build summary's ``monitor.layer_choice`` section."""
        return LayerChoiceSummary(
            mode="auto",
            rule=self.rule,
            layers=list(self.layers),
            set=self.set,
            rows=RowCounts(train=self.n_train, validation=self.n_validation),
            pooling=self.layer_pooling(),
            seconds=round(self.seconds, 3),
            candidates=[msgspec.convert(c, LayerCandidate) for c in self.candidates],
        )


def pooling_of(pooling: str | Mapping[str, str], name: str) -> str:
    """The config's pooling for layer ``name`` (one option, or a per-layer mapping)."""
    if isinstance(pooling, str):
        return pooling
    return str(pooling.get(name, "flatten"))


def input_pooling(info: LayerInfo) -> str:
    """How auto pools the model's input: a grid for images, else as it is."""
    return "grid" if len(info.shape) > 2 else "flatten"


def screen(
    infos: Sequence[LayerInfo], pooling: str | Mapping[str, str]
) -> list[tuple[LayerInfo, str | None]]:
    """Each candidate with ``None`` (rankable) or the reason it cannot be monitored."""
    out: list[tuple[LayerInfo, str | None]] = []
    for info in infos:
        n = info.n_features(pooling_of(pooling, info.name))
        if n is None:
            reason: str | None = "feature count unknown (dynamic axis)"
        elif n < 2:
            reason = f"{n} feature"
        elif n > MAX_FEATURES:
            hint = "; pooling: avg would give fewer" if len(info.shape) > 2 else ""
            reason = f"{n:,} features > {MAX_FEATURES:,}{hint}"
        else:
            reason = None
        out.append((info, reason))
    return out


def rankable(infos: Sequence[LayerInfo], pooling: str | Mapping[str, str]) -> list[str]:
    """Names of the candidates :func:`screen` keeps (``--dry-run`` needs at least one)."""
    return [info.name for info, reason in screen(infos, pooling) if reason is None]


def blocks(infos: Sequence[LayerInfo]) -> dict[str, int]:
    """Each candidate's block: consecutive candidates (graph order) with the same output
    shape, such as a layer and its activation, share one."""
    out: dict[str, int] = {}
    block = 0
    for j, info in enumerate(infos):
        if j and info.shape != infos[j - 1].shape:
            block += 1
        out[info.name] = block
    return out


def _rows(n: int, cap: int, rng: np.random.RandomState) -> np.ndarray:
    """Up to ``cap`` sorted row indices out of ``n``, drawn with ``rng``."""
    if n <= cap:
        return np.arange(n)
    return np.sort(rng.permutation(n)[:cap])


def _extract(
    tap: Tap, x: np.ndarray, batch: int, preprocess: Any
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Logits and pooled activations of ``x``, in batches."""
    logits: list[np.ndarray] = []
    acts: dict[str, list[np.ndarray]] = {name: [] for name in tap.layers}
    for start in range(0, len(x), batch):
        out, a = tap.run(preprocess(x[start : start + batch]))
        logits.append(out)
        for name in tap.layers:
            acts[name].append(a[name])
    return np.concatenate(logits), {k: np.concatenate(v) for k, v in acts.items()}


def ranking_taus(template: BoxMonitor) -> list[float]:
    """The taus the ranking sweeps: the config's fixed tau, else its candidates (the
    config's list, else the estimator's own)."""
    if isinstance(template.tau, int | float) and not isinstance(template.tau, bool):
        return [float(template.tau)]
    return candidate_taus(template)


def choose_layers(
    open_tap: Any,
    infos: Sequence[LayerInfo],
    *,
    output: str | None,
    pooling: str | Mapping[str, str],
    preprocess: Any,
    train: tuple[np.ndarray, np.ndarray],
    validation: tuple[np.ndarray, np.ndarray] | None,
    n_classes: int,
    params: MonitorSection | Mapping[str, Any],
    batch: int = 512,
) -> LayerChoice:
    """Pick the monitored layers from ``infos`` (a model's candidate taps, graph order).

    ``open_tap(names)`` opens the model with those layers tapped; ``preprocess`` maps raw
    inputs to model inputs; ``train`` and ``validation`` are labelled known inputs (no
    unknown data: the choice must not see it); ``params`` is the config's ``monitor``
    section (record or raw mapping), of which :data:`RANKING_PARAMETERS` apply. Raises
    :class:`ConfigError` when nothing can be ranked. Deterministic for the same inputs.
    """
    start = time.perf_counter()
    section = params if isinstance(params, MonitorSection) else MonitorSection.from_raw(params)
    template = section.estimator(None, only=RANKING_PARAMETERS)
    seed = int(template.random_state)
    rng = np.random.RandomState(seed)
    screened = screen(infos, pooling)
    names = [info.name for info, reason in screened if reason is None]
    if not names:
        raise ConfigError(
            f"layers: auto found no candidate layer with 2 to {MAX_FEATURES:,} features "
            f"(pooling: {pooling}); list the layers to monitor, or set model.pooling: avg"
        )
    x_tr, y_tr = train
    if validation is not None:
        set_name = "validation"
        x_va, y_va = validation
        tr_rows = _rows(len(x_tr), MAX_TRAIN_ROWS, rng)
        va_rows = _rows(len(x_va), MAX_VALIDATION_ROWS, rng)
        x_fit, y_fit = x_tr[tr_rows], np.asarray(y_tr)[tr_rows]
        x_val, y_val = x_va[va_rows], np.asarray(y_va)[va_rows]
    else:
        set_name = "train (held out)"
        held = _held_out_rows(np.asarray(y_tr), HELD_OUT_SHARE, seed)
        keep = np.setdiff1d(np.arange(len(x_tr)), held)
        keep = keep[_rows(len(keep), MAX_TRAIN_ROWS, rng)]
        held = held[_rows(len(held), MAX_VALIDATION_ROWS, rng)]
        x_fit, y_fit = x_tr[keep], np.asarray(y_tr)[keep]
        x_val, y_val = x_tr[held], np.asarray(y_tr)[held]
    if len(np.unique(y_val)) < 2:
        raise ConfigError(
            f"layers: auto needs {set_name} inputs of at least 2 known classes "
            f"(got {len(np.unique(y_val))})"
        )
    tap = open_tap(names)
    logits_fit, acts_fit = _extract(tap, x_fit, batch, preprocess)
    logits_val, acts_val = _extract(tap, x_val, batch, preprocess)
    pred_fit, pred_val = logits_fit.argmax(axis=1), logits_val.argmax(axis=1)
    taus = ranking_taus(template)
    ranking = {
        **template.get_params(),
        "tau": "auto",
        "taus": taus,
        "selection": "held-out-class",
        "combine": "calibrated",
    }
    results: dict[str, dict[str, Any]] = {}
    kept: list[str] = []
    inputs = np.asarray(preprocess(x_fit), dtype=np.float32).reshape(len(x_fit), -1)
    for name in names:
        if np.array_equal(acts_fit[name], inputs):
            results[name] = {"reason": "the model's input, reshaped"}
            continue
        twin = next((k for k in kept if np.array_equal(acts_fit[k], acts_fit[name])), None)
        if twin is not None:
            results[name] = {"reason": f"same values as {twin}"}
            continue
        kept.append(name)
        monitor = BoxMonitor(**{**ranking, "layers": [name]}).fit(
            {name: acts_fit[name]},
            y_fit,
            pred_fit,
            validation=({name: acts_val[name]}, y_val, pred_val),
            n_classes=n_classes,
        )
        sel = monitor.selection_ or {}
        tau = float(monitor.tau_[name][0])
        value = float(sel["auroc"][name][list(sel["taus"]).index(tau)])
        results[name] = {"auroc": value if np.isfinite(value) else None, "tau": tau}
    order = sorted(
        kept,
        key=lambda n: (
            -(results[n]["auroc"] if results[n]["auroc"] is not None else -1.0),
            names.index(n),
        ),
    )
    block = blocks(infos)
    best: dict[int, str] = {}  # block -> its best-ranked candidate other than the output
    for name in order:
        if name != output:
            best.setdefault(block[name], name)
    chosen = [n for n in order if best.get(block[n]) == n][:N_CHOSEN] or order[:1]
    poolings = {name: pooling_of(pooling, name) for name in chosen}
    source = next((info for info in infos if info.name == INPUT_LAYER), None)
    input_why = None
    if source is not None:
        n_in = source.n_features(input_pooling(source))
        if n_in is not None and 2 <= n_in <= MAX_FEATURES:
            chosen.append(INPUT_LAYER)
            poolings[INPUT_LAYER] = input_pooling(source)
            input_why = (
                f"the model's input ({input_pooling(source)}, {n_in} features): catches "
                "inputs unlike the training data, which auto always monitors"
            )
    candidates: list[dict[str, Any]] = []
    for info, reason in screened:
        row: dict[str, Any] = {
            "layer": info.name,
            "kind": info.kind,
            "features": info.n_features(pooling_of(pooling, info.name)),
            "auroc": None,
            "tau": None,
            "rank": None,
            "chosen": info.name in chosen,
        }
        res = results.get(info.name, {})
        row.update({k: v for k, v in res.items() if k != "reason"})
        if info.name == INPUT_LAYER and input_why is not None:
            row["features"] = info.n_features(poolings[INPUT_LAYER])
            row["reason"] = input_why
        elif info.name in order:
            row["rank"] = order.index(info.name) + 1
            rank = f"rank {row['rank']} of {len(order)}"
            top = best.get(block[info.name])
            if info.name in chosen:
                why = rank if top is None else f"{rank}, the best of its block"
            elif info.name == output:
                why = f"{rank}; the model's output, which auto leaves out"
            elif top != info.name:
                why = f"{rank}; {top} ranks higher in its block"
            else:
                why = f"{rank}; its block is not among the top {N_CHOSEN}"
            row["reason"] = why
        else:
            row["reason"] = reason or res.get("reason", "not ranked")
        candidates.append(row)
    return LayerChoice(
        layers=[info.name for info in infos if info.name in chosen],  # graph order
        candidates=candidates,
        set=set_name,
        n_train=len(y_fit),
        n_validation=len(y_val),
        seconds=time.perf_counter() - start,
        pooling=pooling if isinstance(pooling, str) else dict(pooling),
        poolings={info.name: poolings[info.name] for info in infos if info.name in chosen},
    )
