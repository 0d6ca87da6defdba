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
   2 and :data:`MAX_FEATURES`; a map (a conv or signal layer, rank > 2 with the batch axis)
   whose flattened features pass it is pooled instead, unless the config sets its pooling:
   ranked by :data:`MAP_POOLINGS`' first (spatial average, one feature per channel). A
   candidate whose features equal the model's input or an earlier candidate's on the
   ranking rows (a Flatten or Identity of it, a global average pool of an averaged map) is
   left out, and so is the model's output (the logits) unless nothing else can be ranked;
2. *bound*: candidates form *blocks*, consecutive candidates (graph order) of the same
   output shape, such as a Gemm and its Relu or a residual stage; a block is ranked on its
   last :data:`PER_BLOCK` candidates (a block of pooled maps on its last
   :data:`PER_MAP_BLOCK`, and only the :data:`MAP_BLOCKS` deepest such blocks), so the
   choice costs a few monitor fits per model however many layers it has;
3. *rank*: per remaining candidate, a one-layer monitor is fitted on (up to
   :data:`MAX_TRAIN_ROWS` of) the training inputs with the build's monitor settings, tau
   picked by held-out-class validation on (up to :data:`MAX_VALIDATION_ROWS` of) the
   validation inputs; its AUROC at the chosen tau ranks it (ties: graph order). The
   AUROC reads the monitor's good boxes only, so it is fitted on those training inputs
   the model classifies correctly (the same good boxes, no bad ones), its k-means fits
   run directly (:func:`~boxwatch.offline.monitors.taukmeans.direct_kmeans`: KMeans'
   steps, the fits of one class sharing its distances), and a pooling whose values equal
   one tried already (the global maximum of a map and of its max-pooled map) is not
   fitted again: the ranking is the same as with full monitors at about 40% of their CPU
   time;
4. *pick*: the best-ranked candidate of each block stands for it, and the
   :data:`N_CHOSEN` best blocks are monitored. A chosen pooled map keeps the pooling of
   :data:`MAP_POOLINGS` (those giving 2 to :data:`MAX_FEATURES` features) with the best
   held-out-class AUROC, compared on :data:`POOLING_TAUS` taus around the one its ranking
   chose;
5. *input*: the model's input (:data:`~boxwatch.agent.taps.INPUT_LAYER`) is monitored too,
   pooled by its kind (:func:`input_plan`: an image on a 7x7 grid, a signal as it is, or
   on a grid past the cap, a vector as it is), or as the config's per-layer ``pooling``
   says. The held-out-class AUROC cannot rank it (held-out classes look like the others in
   pixel space), but it is what catches inputs from another data set: on the 32 cells of
   ``bench/detection.py``, the cells where at most 5% of the far unknowns are accepted went
   from 16 (hand-picked hidden layers) to 32 with it (31 with this rule's own layers).
   An image pooled by its kind is monitored a second time on a coarser grid
   (:data:`~boxwatch.agent.taps.COARSE_INPUT_LAYER`, at most 5x5 cells): on the detection
   bench's 80 image cells of seeds 0-2, the 7x7 grid alone let more than 5% of the MNIST
   digits through 6 Fashion-MNIST models, the 5x5 grid alone more than 5% of the clothing
   through 8 MNIST models, both together 1 model (issue 38; docs/build-config.md has the
   figures on seeds it was not chosen on).

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
from msgspec import UNSET

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.taps import (
    COARSE_INPUT_LAYER,
    INPUT_KINDS,
    INPUT_LAYER,
    LayerInfo,
    Tap,
    coarse_info,
    infer_input_kind,
    is_coarse_view,
    offers_coarse,
    pool,
)
from boxwatch.offline.monitors.estimator import BoxMonitor, _held_out_rows
from boxwatch.offline.monitors.taukmeans import direct_kmeans
from boxwatch.offline.release.records import (
    LayerCandidate,
    LayerChoiceSummary,
    MonitorSection,
    RowCounts,
    candidate_taus,
)

AUTO = "auto"
# Box monitors over wider layers are slow to fit and score; wider conv maps are pooled.
# 4,096 let the suite CNN's flattened 1,568-feature conv map in: the monitor then took 90%
# of the model call (bench/detection.py); with 1,024 it takes 20%.
MAX_FEATURES = 1024
MAX_TRAIN_ROWS = 2000
MAX_VALIDATION_ROWS = 1000
N_CHOSEN = 3
# A candidate (a pooled map with its best pooling) whose held-out-class AUROC is below this
# is not chosen, unless none reaches it (then the best-ranked one is): near chance, a layer
# adds noise to the score. Set on the detection suite (bench/detection.py): the CNN cells'
# first conv map, pooled, ranked 0.40-0.60 and let 3-13 points more near unknowns through
# on 4 of 20 cells; the 1-D CNN's first map max-pooled (0.68-0.78) and second map
# (0.66-0.74) took near unknowns 8-38 points down and noise from up to 28% to under 4%.
MIN_CHOSEN_AUROC = 0.65
HELD_OUT_SHARE = 0.2
# A map (conv or signal layer) over MAX_FEATURES flattened is ranked pooled by the first of
# these; once chosen, each of them that gives 2 to MAX_FEATURES features is fitted and the
# best held-out-class AUROC keeps its pooling (ties: the earlier). To keep that cheap, the
# poolings are compared on the tau the ranking chose and its neighbours in the candidates
# (POOLING_TAUS of them), not on every candidate tau.
MAP_POOLINGS = ("avg", "max", "grid")
POOLING_TAUS = 3
# Values of the flattened maps one extraction batch may hold (128 MB of float32): a large
# model's early maps (64x56x56) take a few rows at a time, not 512.
BATCH_VALUES = 2**25
# Candidates ranked per block at most (the block's last ones, its output): bounds the
# choice's cost on models with long runs of same-shape layers (a residual stage). A block of
# pooled maps (a conv and its activation, a residual stage) is ranked on its output alone.
PER_BLOCK = 2
PER_MAP_BLOCK = 1
# Blocks of pooled maps ranked at most: the deepest ones (earlier maps, nearer the pixels,
# ranked last on the suite's CNNs).
MAP_BLOCKS = 2
# Candidates whose values match an earlier one's within this (a Flatten, or a global
# average pool of a map auto pools by avg) are left out as copies of it.
COPY_RTOL, COPY_ATOL = 1e-5, 1e-6
# The monitor parameters of the config that apply to the ranking monitors (the others, such
# as the calibration's, cannot change a held-out-class AUROC), and n_jobs, which runs their
# per-class work and changes nothing in it; the rest are the estimator's.
RANKING_PARAMETERS = ("tau", "normalize", "score", "contrast_classes", "random_state", "n_jobs")
RULE = (
    f"the best candidate of each of the top {N_CHOSEN} blocks by held-out-class AUROC "
    "(known inputs only; the model's output left out), and the model's input"
)
INPUT_WHY = "catches inputs unlike the training data"
COARSE_WHY = "the model's input again on a coarser grid: catches other shapes than the fine one"
OUTPUT_WHY = "the model's output, which auto leaves out (not ranked)"


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


def _given(pooling: str | Mapping[str, str], name: str) -> bool:
    """Whether the config sets layer ``name``'s pooling itself (one option other than
    flatten, or an entry of a per-layer mapping): auto then keeps it."""
    return pooling != "flatten" if isinstance(pooling, str) else name in pooling


@dataclass(frozen=True)
class InputPlan:
    """How the build monitors the model's input: its kind (:data:`INPUT_KINDS`), whether
    the kind was inferred, the pooling its kind (or the config) gives, the features that
    makes, whether it is monitored and why; and the features of its coarse view
    (:data:`~boxwatch.agent.taps.COARSE_INPUT_LAYER`) where that is monitored too, else 0."""

    kind: str
    inferred: bool
    pooling: str
    features: int | None
    monitored: bool
    reason: str
    coarse: int = 0

    @property
    def measurable(self) -> bool:
        """Whether a monitor of the input alone can be fitted (2 to the cap features)."""
        return self.features is not None and 2 <= self.features <= MAX_FEATURES


def input_plan(
    shape: Sequence[int | None],
    *,
    kind: str | None = None,
    pooling: str | Mapping[str, str] = "flatten",
    monitor: bool = True,
) -> InputPlan:
    """The monitor of a model input of ``shape`` (batch axis first): ``kind`` from the
    config, else inferred; pooled as the config's per-layer ``pooling`` names ``input``,
    else by kind (image: ``grid``, and its coarse view beside it; signal: ``flatten``, or
    ``grid`` past :data:`MAX_FEATURES`; vector: ``flatten``); monitored when ``monitor``
    and that gives 2 to :data:`MAX_FEATURES` features. Raises :class:`ConfigError` for a
    kind the shape cannot have."""
    rank = len(shape) - 1
    resolved = kind or infer_input_kind(shape)
    if resolved not in INPUT_KINDS:
        raise ConfigError(f"model.input_kind: {resolved!r} is not one of {list(INPUT_KINDS)}")
    if resolved == "image" and rank < 3:
        raise ConfigError(
            f"model.input_kind: image needs an input of shape [C, H, W], not {list(shape[1:])}"
        )
    if resolved == "signal" and rank < 1:
        raise ConfigError("model.input_kind: signal needs an input of shape [C, L] or [L]")
    info = LayerInfo(INPUT_LAYER, tuple(shape), "Input")
    given = pooling.get(INPUT_LAYER) if isinstance(pooling, Mapping) else None
    if given is not None:
        chosen = str(given)
    elif resolved == "image":
        chosen = "grid"
    elif resolved == "signal":
        flat = info.n_features("flatten")
        chosen = "flatten" if flat is not None and flat <= MAX_FEATURES else "grid"
    else:
        chosen = "flatten"
    n = info.n_features(chosen)
    what = f"the model's input ({chosen}, {n} features, {resolved} input)"
    if n is None:
        reason = f"the model's input ({resolved}): not monitored, its size is not fixed"
    elif not 2 <= n <= MAX_FEATURES:
        reason = f"{what}: not monitored, {n:,} features (2 to {MAX_FEATURES:,} can be)"
    elif not monitor:
        reason = f"{what}: not monitored, model.monitor_input is false"
    else:
        view = coarse_info(info) if resolved == "image" and given is None else None
        width = view.n_features("flatten") if view is not None else None
        coarse = width if width is not None and 2 <= width < n else 0
        also = f" (and on a coarser grid, {coarse} features)" if coarse else ""
        why = f"{what}{also}: {INPUT_WHY}"
        return InputPlan(resolved, kind is None, chosen, n, True, why, coarse)
    return InputPlan(resolved, kind is None, chosen, n, False, reason)


@dataclass(frozen=True)
class Screened:
    """A candidate after screening: the pooling it is ranked with, why it cannot be ranked
    (``None``: it can), and whether auto pools it (a map over :data:`MAX_FEATURES`)."""

    info: LayerInfo
    pooling: str
    reason: str | None
    pooled: bool = False

    @property
    def features(self) -> int | None:
        return self.info.n_features(self.pooling)


def screen(infos: Sequence[LayerInfo], pooling: str | Mapping[str, str]) -> list[Screened]:
    """Each candidate with the pooling it is ranked with and ``None`` (rankable) or the
    reason it cannot be ranked. A map whose flattened features pass :data:`MAX_FEATURES`
    is ranked pooled (:data:`MAP_POOLINGS`), unless the config sets its pooling; the
    model's input is not ranked (:func:`input_plan` decides it)."""
    out: list[Screened] = []
    for info in infos:
        given = pooling_of(pooling, info.name)
        n = info.n_features(given)
        reason: str | None = None
        if info.name == INPUT_LAYER or is_coarse_view(info):
            reason = "the model's input: not ranked"
        elif n is None:
            reason = "feature count unknown (dynamic axis)"
        elif n < 2:
            reason = f"{n} feature"
        elif n > MAX_FEATURES:
            pooled = info.n_features(MAP_POOLINGS[0]) if len(info.shape) > 2 else None
            if (
                pooled is not None
                and 2 <= pooled <= MAX_FEATURES
                and not _given(pooling, info.name)
            ):
                out.append(Screened(info, MAP_POOLINGS[0], None, pooled=True))
                continue
            reason = f"{n:,} features > {MAX_FEATURES:,}"
        out.append(Screened(info, given, reason))
    return out


def rankable(infos: Sequence[LayerInfo], pooling: str | Mapping[str, str]) -> list[str]:
    """Names of the candidates :func:`screen` keeps (``--dry-run`` needs at least one)."""
    return [s.info.name for s in screen(infos, pooling) if s.reason is None]


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


def _per_block(screened: list[Screened], block: Mapping[str, int]) -> list[Screened]:
    """``screened`` with at most :data:`PER_BLOCK` rankable candidates per block (a block
    of pooled maps: :data:`PER_MAP_BLOCK`), the block's last ones (its output); the others
    get the reason why they are not ranked."""
    members: dict[int, list[Screened]] = {}
    for s in screened:
        if s.reason is None:
            members.setdefault(block[s.info.name], []).append(s)
    maps = [b for b, group in members.items() if all(m.pooled for m in group)]
    out = []
    for s in screened:
        b = block[s.info.name]
        group = members.get(b, [])
        ranked = [m.info.name for m in group[-(PER_MAP_BLOCK if b in maps else PER_BLOCK) :]]
        why = None
        if b in maps[:-MAP_BLOCKS]:
            why = f"not ranked: only the {MAP_BLOCKS} deepest blocks of pooled maps are"
        elif s.info.name not in ranked:
            why = (
                f"not ranked: its block of {len(group)} same-shape layers is ranked on "
                f"{', '.join(ranked)}"
            )
        if s.reason is None and why is not None:
            s = Screened(s.info, s.pooling, why, s.pooled)
        out.append(s)
    return out


def to_rank(
    infos: Sequence[LayerInfo], pooling: str | Mapping[str, str], output: str | None
) -> list[Screened]:
    """Every candidate as :func:`choose_layers` sees it: :func:`screen`, at most a few per
    block, and the model's output left out (ranked only when nothing else can be)."""
    screened = _per_block(screen(infos, pooling), blocks(infos))
    if any(s.reason is None and s.info.name != output for s in screened):
        screened = [
            Screened(s.info, s.pooling, OUTPUT_WHY, s.pooled)
            if s.reason is None and s.info.name == output
            else s
            for s in screened
        ]
    return screened


def _rows(n: int, cap: int, rng: np.random.RandomState) -> np.ndarray:
    """Up to ``cap`` sorted row indices out of ``n``, drawn with ``rng``."""
    if n <= cap:
        return np.arange(n)
    return np.sort(rng.permutation(n)[:cap])


# Activations by layer, then by pooling (one pooling per layer but auto's pooled maps).
Pooled = dict[str, dict[str, np.ndarray]]


def _extract(
    tap: Tap,
    x: np.ndarray,
    batch: int,
    preprocess: Any,
    plan: Mapping[str, tuple[tuple[int, ...], Sequence[str]]],
) -> tuple[np.ndarray, Pooled]:
    """Logits and pooled activations of ``x``, in batches: a layer of ``plan`` (a map the
    tap returns flattened) in each of its poolings, the others as the tap pools them.
    Batches shrink so the flattened maps of one hold at most :data:`BATCH_VALUES` values."""
    logits: list[np.ndarray] = []
    parts: dict[str, dict[str, list[np.ndarray]]] = {}
    wide = sum(int(np.prod(shape)) for shape, _ in plan.values())
    batch = max(1, min(batch, BATCH_VALUES // max(wide, 1)))
    for start in range(0, len(x), batch):
        out, acts = tap.run(preprocess(x[start : start + batch]))
        logits.append(out)
        for name in tap.layers:
            if name in plan:
                shape, poolings = plan[name]
                raw = acts[name].reshape(len(out), *shape)
                for p in poolings:
                    parts.setdefault(name, {}).setdefault(p, []).append(pool(raw, p))
            else:
                parts.setdefault(name, {}).setdefault("", []).append(acts[name])
    return np.concatenate(logits), {
        name: {p: np.concatenate(v) for p, v in by.items()} for name, by in parts.items()
    }


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
    input_kind: str | None = None,
    monitor_input: bool = True,
) -> LayerChoice:
    """Pick the monitored layers from ``infos`` (a model's candidate taps, graph order).

    ``open_tap(names)`` opens the model with those layers tapped (pooled as ``pooling``
    says); ``preprocess`` maps raw inputs to model inputs; ``train`` and ``validation`` are
    labelled known inputs (no unknown data: the choice must not see it); ``params`` is the
    config's ``monitor`` section (record or raw mapping), of which
    :data:`RANKING_PARAMETERS` apply; ``input_kind`` and ``monitor_input`` decide the
    model's input (:func:`input_plan`). Raises :class:`ConfigError` when nothing can be
    ranked. Deterministic for the same inputs.
    """
    start = time.perf_counter()
    section = params if isinstance(params, MonitorSection) else MonitorSection.from_raw(params)
    template = section.estimator(None, only=RANKING_PARAMETERS)
    seed = int(template.random_state)
    rng = np.random.RandomState(seed)
    block = blocks(infos)
    screened = to_rank(infos, pooling, output)
    names = [s.info.name for s in screened if s.reason is None]
    if not names:
        raise ConfigError(
            f"layers: auto found no candidate layer with 2 to {MAX_FEATURES:,} features, "
            f"conv maps pooled (pooling: {pooling}); list the layers to monitor"
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
    ranked_with = {s.info.name: s for s in screened if s.reason is None}
    plan = {
        name: (
            tuple(int(d) for d in s.info.shape[1:] if d is not None),
            [p for p in MAP_POOLINGS if _fits(s.info, p)],
        )
        for name, s in ranked_with.items()
        if s.pooled
    }
    tap = open_tap(names)
    logits_fit, acts_fit = _extract(tap, x_fit, batch, preprocess, plan)
    logits_val, acts_val = _extract(tap, x_val, batch, preprocess, plan)
    pred_fit, pred_val = logits_fit.argmax(axis=1), logits_val.argmax(axis=1)
    taus = ranking_taus(template)
    ranking = {
        **template.get_params(),
        "tau": "auto",
        "taus": taus,
        "selection": "held-out-class",
        "combine": "calibrated",
    }

    def acts(by: Pooled, name: str, p: str) -> np.ndarray:
        return by[name][p if name in plan else ""]

    # A ranking monitor's AUROC reads its good boxes only, so it is fitted on the correctly
    # classified rows: the same good boxes, without the bad ones nobody reads.
    right = np.flatnonzero(y_fit == pred_fit)

    def rank(name: str, p: str, near: float | None = None) -> dict[str, Any]:
        """The held-out-class AUROC and tau of a one-layer monitor of ``name`` pooled ``p``
        (on the candidate taus nearest ``near`` only, when given)."""
        swept = taus if near is None else _near(taus, near, POOLING_TAUS)
        with direct_kmeans():
            monitor = BoxMonitor(**{**ranking, "taus": swept, "layers": [name]}).fit(
                {name: acts(acts_fit, name, p)[right]},
                y_fit[right],
                pred_fit[right],
                validation=({name: acts(acts_val, name, p)}, y_val, pred_val),
                n_classes=n_classes,
            )
        sel = monitor.selection_ or {}
        tau = float(monitor.tau_[name][0])
        value = float(sel["auroc"][name][list(sel["taus"]).index(tau)])
        return {"auroc": value if np.isfinite(value) else None, "tau": tau}

    trials: list[tuple[np.ndarray, np.ndarray, float, float | None]] = []

    def trial(name: str, p: str, tau: float) -> float | None:
        """``rank(name, p, tau)``'s AUROC, taken from an earlier trial whose activations
        hold the same values (the global max of a map and of its max-pooled map)."""
        fit, val = acts(acts_fit, name, p), acts(acts_val, name, p)
        for seen_fit, seen_val, at, value in trials:
            if at == tau and _copy(seen_fit, fit) and _copy(seen_val, val):
                return value
        value = rank(name, p, tau)["auroc"]
        trials.append((fit, val, tau, value))
        return value

    results: dict[str, dict[str, Any]] = {}
    kept: list[str] = []
    inputs = np.asarray(preprocess(x_fit), dtype=np.float32).reshape(len(x_fit), -1)
    for name in names:
        first = acts(acts_fit, name, ranked_with[name].pooling)
        if _copy(first, inputs):
            results[name] = {"reason": "the model's input, reshaped"}
            continue
        twin = next(
            (k for k in kept if _copy(acts(acts_fit, k, ranked_with[k].pooling), first)), None
        )
        if twin is not None:
            results[name] = {"reason": f"same values as {twin}"}
            continue
        kept.append(name)
        results[name] = rank(name, ranked_with[name].pooling)
    order = sorted(
        kept,
        key=lambda n: (
            -(results[n]["auroc"] if results[n]["auroc"] is not None else -1.0),
            names.index(n),
        ),
    )
    best: dict[int, str] = {}  # block -> its best-ranked candidate other than the output
    for name in order:
        if name != output:
            best.setdefault(block[name], name)
    poolings = {name: ranked_with[name].pooling for name in order}
    tried: dict[str, dict[str, float | None]] = {}
    weak: set[str] = set()
    chosen: list[str] = []
    for name in (n for n in order if best.get(block[n]) == n):
        if len(chosen) == N_CHOSEN:
            break
        value = results[name]["auroc"] or 0.0
        if name in plan:  # a pooled map: the pooling of the best held-out-class AUROC
            tau = results[name]["tau"]
            tried[name] = {  # the ranking's own pooling is ranked already
                p: results[name]["auroc"] if p == ranked_with[name].pooling else trial(name, p, tau)
                for p in plan[name][1]
            }
            poolings[name] = max(
                tried[name], key=lambda p: (tried[name][p] or -1.0, -MAP_POOLINGS.index(p))
            )
            value = tried[name][poolings[name]] or 0.0
        if value < MIN_CHOSEN_AUROC:
            weak.add(name)
            continue
        chosen.append(name)
    chosen = chosen or order[:1]
    source = next((info for info in infos if info.name == INPUT_LAYER), None)
    entry = None
    if source is not None:
        entry = input_plan(source.shape, kind=input_kind, pooling=pooling, monitor=monitor_input)
        if entry.monitored:
            chosen.append(INPUT_LAYER)
            poolings[INPUT_LAYER] = entry.pooling
        if entry.coarse and offers_coarse(infos):
            chosen.append(COARSE_INPUT_LAYER)
            poolings[COARSE_INPUT_LAYER] = "flatten"
    candidates: list[dict[str, Any]] = []
    for s in screened:
        info = s.info
        used = poolings.get(info.name, s.pooling)
        row: dict[str, Any] = {
            "layer": info.name,
            "kind": info.kind,
            "pooling": used,
            "features": info.n_features(used),
            "auroc": None,
            "tau": None,
            "rank": None,
            "chosen": info.name in chosen,
        }
        if info.modules and list(info.modules) != [info.name]:
            row["modules"] = list(info.modules)
        res = results.get(info.name, {})
        row.update({k: v for k, v in res.items() if k != "reason"})
        if info.name == INPUT_LAYER and entry is not None:
            row["pooling"], row["features"] = entry.pooling, entry.features
            row["reason"] = entry.reason
        elif is_coarse_view(info) and entry is not None:
            row["reason"] = COARSE_WHY if entry.coarse else "the model's input: not ranked"
        elif info.name in order:
            row["rank"] = order.index(info.name) + 1
            rank_of = f"rank {row['rank']} of {len(order)}"
            top = best.get(block[info.name])
            if info.name in chosen:
                why = rank_of if top is None else f"{rank_of}, the best of its block"
            elif info.name == output:
                why = f"{rank_of}; the model's output, which auto leaves out"
            elif top != info.name:
                why = f"{rank_of}; {top} ranks higher in its block"
            elif info.name in weak:
                why = (
                    f"{rank_of}; held-out-class AUROC below {MIN_CHOSEN_AUROC} "
                    "(near chance: it would add noise to the score)"
                )
            else:
                why = f"{rank_of}; its block is not among the top {N_CHOSEN}"
            if s.pooled:
                why += f"; {info.n_features('flatten'):,} features flattened, pooled"
            if info.name in tried:
                row["pooling_auroc"] = tried[info.name]
                why += (
                    f" {poolings[info.name]} (the best held-out-class AUROC of "
                    f"{', '.join(tried[info.name])})"
                )
            elif s.pooled:
                why += f" {s.pooling} to rank"
            row["reason"] = why
        else:
            row["reason"] = s.reason or res.get("reason", "not ranked")
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


def _near(taus: Sequence[float], tau: float, n: int) -> list[float]:
    """The ``n`` taus of ``taus`` (descending) around ``tau``: it and its neighbours."""
    at = min(range(len(taus)), key=lambda i: abs(taus[i] - tau))
    first = max(0, min(at - n // 2, len(taus) - n))
    return list(taus[first : first + n])


def _copy(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether activations ``a`` and ``b`` hold the same values (up to float rounding)."""
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=COPY_RTOL, atol=COPY_ATOL))


def _fits(info: LayerInfo, pooling: str) -> bool:
    """Whether ``pooling`` gives ``info`` 2 to :data:`MAX_FEATURES` features."""
    n = info.n_features(pooling)
    return n is not None and 2 <= n <= MAX_FEATURES


def listed(
    infos: Sequence[LayerInfo],
    layers: Sequence[str],
    poolings: Mapping[str, str],
    entry: InputPlan,
) -> list[LayerCandidate]:
    """The candidate rows of a config that lists its ``layers``: each candidate with its
    pooling (``poolings``: by monitored layer) and features, whether it is monitored and
    why; the model's input, unless listed, as ``entry`` plans it."""
    by_module = {p: info.name for info in infos for p in info.modules}
    given = {by_module.get(name, name): name for name in layers}
    rows = []
    for info in infos:
        name = given.get(info.name)
        used = poolings.get(name or info.name, "flatten")
        chosen = name is not None
        if name is not None:
            reason = "listed in the build config" + ("" if name == info.name else f" as {name}")
        elif info.name == INPUT_LAYER:
            used, chosen, reason = entry.pooling, entry.monitored, entry.reason
        elif is_coarse_view(info):
            chosen = bool(entry.coarse) and INPUT_LAYER not in given
            reason = COARSE_WHY if chosen else "not listed"
        else:
            reason = "not listed"
        rows.append(
            LayerCandidate(
                layer=info.name,
                kind=info.kind,
                features=info.n_features(used),
                auroc=None,
                tau=None,
                rank=None,
                chosen=chosen,
                reason=reason,
                pooling=used,
                modules=list(info.modules)
                if info.modules and list(info.modules) != [info.name]
                else UNSET,
            )
        )
    return rows
