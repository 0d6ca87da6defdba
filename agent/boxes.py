"""Fitted box monitors at run time: membership, verdicts and out-of-box scores, numpy only.

The offline builder (``boxwatch.offline.monitors.estimator.BoxMonitor``) learns the boxes; this module
holds what the agent needs to apply them online without scikit-learn, and their
(de)serialisation into artifact members (canonical JSON + numeric ``.npz`` arrays).

Per-layer verdicts follow Algorithm 3 of the resolution-box paper: for the predicted class
``y`` of an input, *accept* when its activation lies in some good box of ``y`` and in no bad
box of ``y``, *uncertainty* when it lies in a good and a bad box, *reject* otherwise. The
default combination (``"calibrated"``) decides on a calibrated out-of-box score instead and
gives *uncertainty* where the model's own confidence is below a calibrated floor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple, TypeGuard

import numpy as np

from boxwatch.agent import vocab
from boxwatch.agent.errors import ArtifactError, ConfigError
from boxwatch.agent.mahalanobis import RelativeMahalanobis
from boxwatch.agent.members import BOXES_PREFIX

ACCEPT, UNCERTAIN, REJECT = 0, 1, 2
VERDICT_NAMES = vocab.VERDICTS
COMBINE_RULES = vocab.COMBINE_RULES
NORMALIZATIONS = vocab.NORMALIZATIONS
SCORES = vocab.SCORES
UNCERTAINTY_RULES = vocab.UNCERTAINTY_RULES
SCORE_MEANS = vocab.SCORE_MEANS
MODEL_OUTPUTS = vocab.MODEL_OUTPUTS
ERROR_FEATURES = vocab.ERROR_FEATURES
FORMAT = "boxwatch.boxes"
# 1: the distance score; 2 adds the fused score (``score``, ``contrast_layers``,
# ``contrast_scales``, ``contrast_classes``); 3 adds the confidence rule for uncertainty
# (``uncertainty``, ``confidence_floor``, ``output``) and ``score_mean``; 4 adds the energy
# term of the fused score (``energy_center``, ``energy_scale``); 5 adds the error model
# (``uncertainty="error-model"``, ``error_model``); 6 adds ``contrast_candidates`` (the
# contrast term's neighbour classes sought among the classes whose boxes lie nearest only);
# 7 adds ``peak_factor`` (one layer's distance alone can decide the score); 8 adds the error
# model's ``class_shift`` (a term per predicted class; ``peak_factor`` may then be absent);
# 9 adds the relative Mahalanobis terms (``mahalanobis``, arrays ``M{j}.*``).
# Each monitor is written with the lowest version that holds it, and all are read; an older
# reader refuses a newer monitor rather than emit other verdicts than the builder measured.
FORMAT_VERSION = 1
FORMAT_VERSIONS = (1, 2, 3, 4, 5, 6, 7, 8, 9)
_ROWS_PER_CHUNK = 1 << 18  # vectors grouped and transposed at once
_BLOCK = 16  # dimensions tested between checks for an early exit
# Below this many inputs of one class, broadcast over (inputs, boxes, features) in chunks of
# about _BROADCAST_ELEMENTS instead of making per-dimension passes (measured crossovers).
_ROWWISE_MIN = 512
_ROWWISE_MIN_DISTANCE = 4096
_BROADCAST_ELEMENTS = 1 << 18
# One broadcast of the batch against every class's boxes padded to (n_classes, max_boxes)
# while (inputs x max_boxes x features) stays this small: online batches of a few hundred
# inputs take ~4x less time than per-class passes (measured on the bundled example).
_PADDED_ELEMENTS = 1 << 21
KERNELS = vocab.BOX_KERNELS
# The energy term enters the quadratic mean this many times: the logits weigh as one more
# monitored layer, which brings two terms (its distance and its contrast). Chosen on the
# detection suite's MNIST cells without digits 1, 8 and 4, 9 (bench/RESULTS.md): once
# barely moved near unknowns; twice cut them by about a fifth where the logits see them.
ENERGY_TERMS = 2
# ModelOutputs converts the model's outputs to float64 in blocks of about this many values,
# and numpy's l2 normalisation the features.
_OUTPUT_BLOCK = 1 << 20
# The top-two gap partitions each row up to this many classes; past it, the top's position
# is masked in a copy and the rest's maximum taken (the same values: both pick elements),
# 14x faster at 1,000 classes, where np.partition took 43% of a batch's scoring.
_PARTITION_CLASSES = 40
# verdicts and distance_terms take a larger batch this many rows at a time (each row on its
# own: the same values): the float64 features and kernel outputs of a block, not of a whole
# calibration set (40,000 rows x 2,048 features took 0.65 GB for the features alone).
ROW_BLOCK = 8192
# An error model reads the monitor's score through ``log1p``; an infinite score (outside
# every box, or not finite) reads as this, so the model still gives a finite answer.
_SCORE_CAP = 1e6


def _load_native():
    """The optional C kernel (``agent/_boxkernel.c``), or None when it was not built."""
    try:
        import boxwatch.agent._boxkernel as _boxkernel
    except ImportError:
        return None
    return _boxkernel


_NATIVE = _load_native()
_kernel = _NATIVE


def box_kernel() -> str:
    """Which implementation runs box tests: ``"native"`` (the C kernel) or ``"numpy"``."""
    return "native" if _kernel is not None else "numpy"


def set_box_kernel(name: str) -> str:
    """Choose the box-test implementation (``"auto"``, ``"native"`` or ``"numpy"``);
    returns the previous one.

    Both give identical verdicts and distances (the kernel mirrors the per-dimension numpy
    path's float32 rounding); ``"native"`` needs the extension built at install time and
    ``"auto"`` takes it when it was.
    """
    global _kernel
    if name == "auto":
        name = "native" if _NATIVE is not None else "numpy"
    if name not in KERNELS:
        raise ConfigError(f"box kernel {name!r}: expected auto or one of {KERNELS}")
    if name == "native" and _NATIVE is None:
        raise ConfigError("the native box kernel was not built (no C compiler at install time?)")
    previous = box_kernel()
    _kernel = _NATIVE if name == "native" else None
    return previous


def verdict_names(verdicts: np.ndarray) -> np.ndarray:
    """Map verdict codes (0 accept, 1 uncertainty, 2 reject) to their names."""
    return np.asarray(VERDICT_NAMES, dtype=object)[np.asarray(verdicts)]


def _top_two_gap(z: np.ndarray) -> np.ndarray:
    """Each row's top value minus its second (rows of finite values; ``z`` is not changed)."""
    if z.shape[1] <= _PARTITION_CLASSES:
        two = np.partition(z, -2, axis=1)
        return two[:, -1] - two[:, -2]
    rows = np.arange(len(z))
    top = z.argmax(axis=1)
    rest = z.copy()
    rest[rows, top] = -np.inf
    return z[rows, top] - rest.max(axis=1)


def _picks(z: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Each row's top value (NaN where it holds a NaN), its second value and whether all its
    values are finite, of rows ``z`` (float64, at least one column). The native kernel picks
    all three in one pass over the rows; numpy runs the maximum and the "all finite" down the
    transposed rows (several times faster than per row for a few hundred rows of a few
    classes) and gives no second value (None: :func:`_top_two_gap` finds it). Neither rounds:
    the same values either way."""
    if _kernel is not None:
        n, c = z.shape
        top, second, finite = np.empty(n), np.empty(n), np.empty(n, dtype=np.uint8)
        _kernel.top_two(np.ascontiguousarray(z), c, top, second, finite)
        return top, second, finite.view(bool)
    zt = np.ascontiguousarray(z.T)
    return np.maximum.reduce(zt, axis=0), None, np.logical_and.reduce(np.isfinite(zt), axis=0)


class ModelOutputs:
    """A batch of the model's outputs (``kind``: ``"logits"`` or ``"probabilities"``), read
    once: each row's top value, softmax sum and top-two gap are computed on first use and
    shared by :func:`model_confidence`, :func:`model_energy` and :func:`error_features`
    (each pass over the outputs grows with the number of classes), in blocks of about
    ``_OUTPUT_BLOCK`` values converted to float64 at a time (every row on its own, so the
    same values as one pass over them all)."""

    def __init__(self, outputs: np.ndarray, kind: str = "logits"):
        if kind not in MODEL_OUTPUTS:
            raise ConfigError(f"output={kind!r}: expected one of {MODEL_OUTPUTS}")
        out = np.asarray(outputs)
        self.outputs = out.reshape(len(out), -1)
        self.kind = kind
        # Each figure is computed on first use (plain attributes: a cached_property costs
        # more than a batch's figure on Python 3.11, and a batch reads each once or twice).
        self._block: np.ndarray | None = None
        self._picked: tuple[np.ndarray, np.ndarray | None, np.ndarray] | None = None
        self._top_sum: tuple[np.ndarray, np.ndarray] | None = None
        self._gap: np.ndarray | None = None
        self._confidence: np.ndarray | None = None
        self._energy: np.ndarray | None = None

    def _blocks(self):
        """Yield ``(rows as float64, their picks)`` in blocks, in order (a batch that fits one
        block is converted and picked once for every pass); see :func:`_picks`."""
        step = max(1, _OUTPUT_BLOCK // max(1, self.outputs.shape[1]))
        if len(self.outputs) <= step:
            if self._block is None or self._picked is None:
                self._block = np.asarray(self.outputs, dtype=np.float64)
                self._picked = _picks(self._block)
            yield self._block, self._picked
            return
        for s in range(0, len(self.outputs), step):
            z = np.asarray(self.outputs[s : s + step], dtype=np.float64)
            yield z, _picks(z)

    # A row's sum reduces the row itself: its rounding follows numpy's order for a row.
    @property
    def _top_and_sum(self) -> tuple[np.ndarray, np.ndarray]:
        """Each row's top value and softmax sum ``sum(exp(z - top))``."""
        if self._top_sum is None:
            tops, totals = [], []
            with np.errstate(invalid="ignore", over="ignore"):
                for z, (top, _, _) in self._blocks():
                    tops.append(top)
                    totals.append(np.exp(z - top[:, None]).sum(axis=1))
            self._top_sum = _joined(tops), _joined(totals)
        return self._top_sum

    @property
    def top_two_gap(self) -> np.ndarray:
        """Top value minus the second, NaN where a row is not finite (or has one value)."""
        if self._gap is None:
            if self.outputs.shape[1] < 2:
                self._gap = np.full(len(self.outputs), np.nan)
                return self._gap
            gaps = []
            with np.errstate(invalid="ignore", over="ignore"):
                for z, (top, second, finite) in self._blocks():
                    gap = _top_two_gap(z) if second is None else top - second
                    gaps.append(np.where(finite, gap, np.nan))
            self._gap = _joined(gaps)
        return self._gap

    @property
    def confidence(self) -> np.ndarray:
        """:func:`model_confidence`."""
        if self._confidence is None:
            if self.outputs.shape[1] == 0:
                self._confidence = np.full(len(self.outputs), np.nan)
            else:
                top, total = self._top_and_sum
                # total >= 1 (exp(0) counts) or NaN: no division by zero to silence
                self._confidence = top if self.kind == "probabilities" else 1.0 / total
        return self._confidence

    @property
    def energy(self) -> np.ndarray:
        """:func:`model_energy` (of the outputs read as logits)."""
        if self._energy is None:
            if self.outputs.shape[1] == 0:
                self._energy = np.full(len(self.outputs), np.nan)
            else:
                top, total = self._top_and_sum
                self._energy = -(top + np.log(total))  # log of >= 1 or NaN: no warning
        return self._energy


Outputs = np.ndarray | ModelOutputs


def _filled(n: int, value: int, dtype: type[np.integer]) -> np.ndarray:
    """``np.full(n, value, dtype)`` without its Python-level call (explain makes three a batch)."""
    out = np.empty(n, dtype=dtype)
    out.fill(value)
    return out


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """The blocks' results as one array (the block itself when there is one)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _row_slice(activations: Mapping[str, np.ndarray], n: int, start: int) -> dict[str, np.ndarray]:
    """Rows ``start`` to ``start + ROW_BLOCK`` of each layer of ``n`` rows (others as given)."""
    return {k: v[start : start + ROW_BLOCK] if len(v) == n else v for k, v in activations.items()}


def _outputs(outputs: Outputs, kind: str) -> ModelOutputs:
    """``outputs`` as :class:`ModelOutputs` read as ``kind`` (the same object when it is one)."""
    if isinstance(outputs, ModelOutputs) and outputs.kind == kind:
        return outputs
    return ModelOutputs(outputs.outputs if isinstance(outputs, ModelOutputs) else outputs, kind)


def model_confidence(outputs: Outputs, kind: str = "logits") -> np.ndarray:
    """The model's confidence in its predicted class, shape (n_samples,), float64.

    ``"logits"``: the top softmax probability; ``"probabilities"``: the top output. NaN
    where a row holds a NaN (a confidence floor then never passes it).
    """
    return _outputs(outputs, kind).confidence


def model_energy(logits: Outputs) -> np.ndarray:
    """The model's energy ``-logsumexp(logits)`` per row, shape (n_samples,), float64.

    High where the logits are weak for every class (an input unlike the training data);
    NaN where a row holds a NaN or no value, so a score built on it rejects.
    """
    if isinstance(logits, ModelOutputs):
        return logits.energy
    return ModelOutputs(logits).energy


def error_features(
    outputs: Outputs,
    kind: str,
    scores: np.ndarray,
    contrast: Sequence[np.ndarray] = (),
) -> np.ndarray:
    """The columns :data:`ERROR_FEATURES` of an error model, shape (n_samples, 5), float64.

    From the model's output (``kind`` as in :func:`model_confidence`), the monitor's score
    and its raw contrast terms (:func:`contrast_scores`, one array per contrast layer). NaN
    where the output is not finite, so an error model never trusts such a row.
    """
    read = _outputs(outputs, kind)
    conf = read.confidence
    out = np.empty((len(conf), len(ERROR_FEATURES)))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # Each column computed contiguous, then copied (numpy's vectorised log may round
        # differently from its strided loop).
        gap = read.top_two_gap
        out[:, 0] = np.log(np.maximum(conf, 1e-300))
        out[:, 1] = np.log(np.maximum(1.0 - conf, 1e-12))
        out[:, 2] = np.log(np.maximum(gap, 1e-12)) if kind == "probabilities" else gap
        # fmin takes the cap for NaN (outside every box or not finite) as for inf.
        out[:, 3] = np.log1p(np.fmin(scores, _SCORE_CAP))
        if len(contrast):
            rows = np.array(contrast)
            out[:, 4] = _mean_of_rows(np.where(np.isfinite(rows), rows, 1.0))
        else:
            out[:, 4] = 0.0
    return out


def _native_error_probability(
    model: ErrorModel,
    outputs: Outputs,
    kind: str,
    scores: np.ndarray,
    contrast: Sequence[np.ndarray],
    y_pred: np.ndarray | None,
) -> np.ndarray:
    """``model.probability(error_features(outputs, kind, scores, contrast), y_pred)`` with the
    native kernel doing every step but the logarithms, the product and the exponential (which
    stay numpy's): the same operations in the same order, so the same bits, in a third of
    the numpy calls."""
    read = _outputs(outputs, kind)
    conf = read.confidence
    n = len(conf)
    if n != len(scores):
        raise ConfigError(f"logits give {n} rows for {len(scores)} inputs")
    y = model.classes_of(y_pred, n)
    probabilities = kind == "probabilities"
    gap = read.top_two_gap
    a0, a1, a2, mean = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
    a3 = np.empty(n) if probabilities else None
    _kernel.error_args(
        conf,
        gap if probabilities else None,
        scores,
        tuple(contrast),
        _SCORE_CAP,
        a0,
        a1,
        a2,
        a3,
        mean,
    )
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        cols = (np.log(a0), np.log(a1), gap if a3 is None else np.log(a3), np.log1p(a2), mean)
        features = np.empty((n, len(cols)))
        _kernel.standardize(cols, model.mean, model.scale, features)
        t = features @ model.coef
        u = np.empty(n)
        try:
            _kernel.logit_tail(t, model.intercept, model.class_shift, y, u)
        except ValueError:  # a class without a shift (the kernel checks each)
            assert y is not None
            raise model._outside(y) from None
        e = np.exp(u)
        e += 1.0
        return np.divide(1.0, e, out=e)


@dataclass(frozen=True)
class ErrorModel:
    """A logistic model of the classifier's own mistakes over :func:`error_features`: the
    score the *uncertainty* verdict cuts, learnt offline on labelled validation mistakes.

    ``probability`` is ``sigmoid(((x - mean) / scale) @ coef + intercept + class_shift[y])``
    for an input the classifier labelled ``y`` (``class_shift``: how much likelier than the
    features say its mistakes are on that class; None: no such term); the verdict is
    *uncertainty* where it exceeds ``threshold`` (set by calibration) or is NaN.
    """

    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    threshold: float | None = None
    class_shift: np.ndarray | None = None

    def __post_init__(self) -> None:
        # C-contiguous float64 (the native kernel reads them so); the same values.
        for name in ("mean", "scale", "coef", "class_shift"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, np.ascontiguousarray(value, dtype=np.float64))
        object.__setattr__(self, "intercept", float(self.intercept))

    def probability(self, features: np.ndarray, y_pred: np.ndarray | None = None) -> np.ndarray:
        """Probability that the model's prediction is wrong, per row of ``features``;
        ``y_pred``, the predicted classes, is needed when the model has a ``class_shift``."""
        with np.errstate(over="ignore", invalid="ignore"):
            t = ((features - self.mean) / self.scale) @ self.coef + self.intercept
            y = self.classes_of(y_pred, len(t))
            if y is not None:
                assert self.class_shift is not None  # classes_of gives classes only then
                if len(y) and (y.min() < 0 or y.max() >= len(self.class_shift)):
                    raise self._outside(y)
                t = t + self.class_shift[y]
            return np.asarray(1.0 / (1.0 + np.exp(-t)))

    def classes_of(self, y_pred: np.ndarray | None, n: int) -> np.ndarray | None:
        """``y_pred`` as int64, C-contiguous, when the model has a ``class_shift`` (None
        otherwise); a ConfigError unless it holds one class per row of ``n``."""
        if self.class_shift is None:
            return None
        y = None if y_pred is None else np.asarray(y_pred)
        if y is None or y.shape != (n,) or (n and y.dtype.kind not in "iu"):
            raise ConfigError(
                "this error model has a term per predicted class: pass one predicted class per row"
            )
        return np.ascontiguousarray(y, dtype=np.int64)

    def _outside(self, y: np.ndarray) -> ConfigError:
        """The error for predicted classes ``y`` that include one without a ``class_shift``."""
        assert self.class_shift is not None
        return ConfigError(
            f"predicted classes {int(y.min())}..{int(y.max())} outside the error model's "
            f"0..{len(self.class_shift) - 1}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "features": list(ERROR_FEATURES),
            "mean": [float(v) for v in self.mean],
            "scale": [float(v) for v in self.scale],
            "coef": [float(v) for v in self.coef],
            "intercept": float(self.intercept),
            "threshold": None if self.threshold is None else float(self.threshold),
            **(
                {}
                if self.class_shift is None
                else {"class_shift": [float(v) for v in self.class_shift]}
            ),
        }

    @classmethod
    def from_dict(cls, spec: Any, where: str, n_classes: int, version: int) -> ErrorModel:
        """Read :meth:`as_dict` output of a monitor of ``n_classes`` classes written as
        ``version``; an :class:`ArtifactError` naming ``where`` otherwise."""
        n = len(ERROR_FEATURES)
        try:
            if spec["features"] != list(ERROR_FEATURES):
                raise ValueError(f"features {spec['features']!r}, expected {list(ERROR_FEATURES)}")
            vec = {
                k: np.asarray([float(v) for v in spec[k]], dtype=np.float64)
                for k in ("mean", "scale", "coef")
            }
            intercept = float(spec["intercept"])
            threshold = spec["threshold"]
            threshold = None if threshold is None else float(threshold)
            shift = spec.get("class_shift")
            if shift is not None:
                shift = np.asarray([float(v) for v in shift], dtype=np.float64)
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: malformed error_model ({exc})") from None
        if shift is not None and version < 8:
            raise ArtifactError(f"{where}: error_model class_shift needs version 8, not {version}")
        if shift is not None and not (shift.shape == (n_classes,) and np.isfinite(shift).all()):
            raise ArtifactError(
                f"{where}: error_model class_shift needs {n_classes} finite values (one per "
                f"class), got {shift.size}"
            )
        good = all(v.shape == (n,) and np.isfinite(v).all() for v in vec.values())
        if not good or not (vec["scale"] > 0).all() or not np.isfinite(intercept):
            raise ArtifactError(
                f"{where}: error_model needs {n} finite means, positive scales and finite "
                "coefficients and intercept"
            )
        if threshold is not None and not np.isfinite(threshold):
            raise ArtifactError(f"{where}: error_model threshold {threshold!r} is not finite")
        return cls(vec["mean"], vec["scale"], vec["coef"], intercept, threshold, shift)


def normalize_features(x: np.ndarray, how: str) -> np.ndarray:
    """Apply the monitor's feature normalisation (``"none"`` or ``"l2"``, row-wise) as float32.

    ``"l2"`` divides each row by its Euclidean norm (rows of norm 0 are left at 0); the
    monitor records which one it used so the agent reproduces it exactly. The norm is the
    root of the squares summed in float64 in feature order, rounded to float32: the same bits
    from the native kernel (a third to a quarter of the time of numpy's einsum at batch 256)
    and from numpy, whatever the batch a row comes in.
    """
    x = np.asarray(x, dtype=np.float32)
    if how == "none":
        return x
    if how == "l2":
        if _kernel is not None:
            x = np.ascontiguousarray(x)
            out = np.empty_like(x)
            _kernel.l2_rows(x, x.shape[1], out)
            return out
        sums = np.zeros(len(x))
        step = max(1, _OUTPUT_BLOCK // max(1, x.shape[1]))  # float64 copies of a block only
        for s in range(0, len(x) if x.shape[1] else 0, step):
            squares = np.square(x[s : s + step].astype(np.float64))  # exact in float64
            sums[s : s + step] = np.add.accumulate(squares, axis=1)[:, -1]
        norms = np.sqrt(sums).astype(np.float32)
        if not norms.all():
            norms[norms == 0] = 1.0
        return x / norms[:, None]
    raise ConfigError(f"normalize={how!r}: expected one of {NORMALIZATIONS}")


class LayerPass(NamedTuple):
    """One monitored layer's box work for a batch (:meth:`BoxSet.assess_layer`), each of
    shape (n_samples,): Algorithm 3's verdict codes (int8), membership in a good box and in
    a bad box (bool), and the distances (float64; None when not asked for)."""

    verdicts: np.ndarray
    inside: np.ndarray
    in_bad: np.ndarray
    d_own: np.ndarray | None
    d_other: np.ndarray | None


@dataclass(frozen=True)
class BoxSet:
    """The boxes of one layer for every class, grouped by class.

    Class ``c`` owns rows ``offsets[c]:offsets[c + 1]`` of ``lo`` and ``hi``.

    Attributes
    ----------
    lo, hi : ndarray of shape (n_boxes, n_features), float32
        Lower and upper corners (``lo <= hi``).
    offsets : ndarray of shape (n_classes + 1,), int64
        Start of each class's rows; ``offsets[-1] == n_boxes``.
    """

    lo: np.ndarray
    hi: np.ndarray
    offsets: np.ndarray

    def __post_init__(self) -> None:
        lo = np.ascontiguousarray(self.lo, dtype=np.float32)
        hi = np.ascontiguousarray(self.hi, dtype=np.float32)
        offsets = np.ascontiguousarray(self.offsets, dtype=np.int64)
        if lo.ndim != 2 or lo.shape != hi.shape:
            raise ValueError(f"lo {lo.shape} and hi {hi.shape} must be equal 2-d shapes")
        if (
            offsets.ndim != 1
            or offsets[0] != 0
            or offsets[-1] != len(lo)
            or np.any(np.diff(offsets) < 0)
        ):
            raise ValueError(f"offsets {offsets.tolist()} do not partition {len(lo)} boxes")
        if np.any(~(lo <= hi)):
            raise ValueError("every box needs lo <= hi (and no NaN)")
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)
        object.__setattr__(self, "offsets", offsets)

    # The layouts below are built on first use: a box set serves one kernel (native or
    # numpy) and one range of batch sizes, and a sweep builds many sets it never scores.
    @cached_property
    def _order(self) -> np.ndarray:
        """Per box, its dimensions narrowest side first: they reject non-members soonest."""
        return np.argsort(self.hi - self.lo, axis=1, kind="stable")

    @cached_property
    def _padded(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(n_classes, max_boxes, n_features) copies for small batches, with a mask of the
        real boxes (padding boxes are zeros and masked out)."""
        lo, hi, offsets = self.lo, self.hi, self.offsets
        counts = np.diff(offsets)
        width = self._max_boxes
        plo = np.zeros((len(counts), width, lo.shape[1]), dtype=np.float32)
        phi = np.zeros_like(plo)
        slot = np.arange(len(lo)) - np.repeat(offsets[:-1], counts)
        owner = np.repeat(np.arange(len(counts)), counts)
        plo[owner, slot], phi[owner, slot] = lo, hi
        real = np.arange(width)[None, :] < counts[:, None]
        return plo, phi, real

    @cached_property
    def _rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The native kernel's arrays of the boxes by rows: ``lo``, ``hi``, ``offsets``."""
        return self.lo, self.hi, self.offsets

    @cached_property
    def _lanes(self) -> tuple[np.ndarray, ...]:
        """The native kernel's arrays of the boxes: ``lo``, ``hi``, ``offsets`` and their lane
        copy (:func:`_lanes`)."""
        return (self.lo, self.hi, self.offsets, *_lanes(self.lo, self.hi, self.offsets))

    @classmethod
    def from_boxes(
        cls, per_class: Sequence[tuple[np.ndarray, np.ndarray]], n_features: int
    ) -> BoxSet:
        """Build from one ``(lo, hi)`` pair of shape (n_boxes_c, n_features) per class."""
        counts = [len(lo) for lo, _ in per_class]
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        empty = np.zeros((0, n_features), np.float32)
        lo = np.concatenate(
            [np.asarray(lo, np.float32).reshape(-1, n_features) for lo, _ in per_class] or [empty]
        )
        hi = np.concatenate(
            [np.asarray(hi, np.float32).reshape(-1, n_features) for _, hi in per_class] or [empty]
        )
        return cls(lo, hi, offsets)

    @property
    def n_classes(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_features(self) -> int:
        return self.lo.shape[1]

    def counts(self) -> np.ndarray:
        """Number of boxes per class, shape (n_classes,)."""
        return np.diff(self.offsets)

    def boxes_of(self, cls: int) -> tuple[np.ndarray, np.ndarray]:
        """``(lo, hi)`` of class ``cls``, each of shape (n_boxes_cls, n_features)."""
        a, b = self.offsets[cls], self.offsets[cls + 1]
        return self.lo[a:b], self.hi[a:b]

    def contains(self, x: np.ndarray, y: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
        """Whether each ``x[i]`` lies in some box of class ``y[i]`` (closed boxes).

        Exact and vectorised: inputs are grouped by class and transposed, so each box test
        is a run of in-place comparisons over contiguous feature rows (no gathers); each box
        tests its narrowest sides first and stops once no input of the class is left. Small
        groups (online batches) are broadcast over (inputs, boxes, features) instead.

        Parameters
        ----------
        x : ndarray of shape (n_samples, n_features)
        y : ndarray of shape (n_samples,), int, values in ``[0, n_classes)``
        where : ndarray of shape (n_samples,), bool, optional
            Test only these inputs (the others are False, untested); all when None.

        Returns
        -------
        ndarray of shape (n_samples,), bool
        """
        x, y = self._check(x, y)
        if where is not None:
            where = np.ascontiguousarray(where, dtype=bool)
            if where.shape != (len(x),):
                raise ValueError(f"where has shape {where.shape}; expected ({len(x)},)")
        if _kernel is not None and self.n_features:
            out = np.empty(len(x), dtype=np.uint8)
            args = (x, y, self.lo, self.hi, self.offsets, self.n_features, out)
            _kernel.contains(*args, *(() if where is None else (where.view(np.uint8),)))
            return out.view(bool)
        if where is not None:
            found = np.zeros(len(x), dtype=bool)
            rows = np.flatnonzero(where)
            if len(rows):
                found[rows] = self.contains(x[rows], y[rows])
            return found
        if self._padded_fits(len(x)):  # online batches: one broadcast against padded boxes
            plo, phi, real = self._padded
            xb = x[:, None, :]
            return np.any(np.all((xb >= plo[y]) & (xb <= phi[y]), axis=2) & real[y], axis=1)
        out = np.zeros(len(x), dtype=bool)
        for cls, idx, xt in self._per_class(x, y):
            out[idx] = self._contains_class(xt, cls)
        return out

    def _padded_fits(self, n: int) -> bool:
        return n * self._max_boxes * max(self.n_features, 1) <= _PADDED_ELEMENTS

    @cached_property
    def _max_boxes(self) -> int:
        """The most boxes of one class (at least 1): the width of :attr:`_padded`."""
        counts = np.diff(self.offsets)
        return max(1, int(counts.max()) if len(counts) else 1)

    def _per_class(self, x: np.ndarray, y: np.ndarray):
        """Yield ``(class, indices, x[indices].T)`` per chunk and class that has boxes.

        The transposed block is contiguous, so per-dimension work reads contiguous rows.
        Assumes valid input.
        """
        for s in range(0, len(x), _ROWS_PER_CHUNK):
            xb, yb = x[s : s + _ROWS_PER_CHUNK], y[s : s + _ROWS_PER_CHUNK]
            order = np.argsort(yb, kind="stable")
            bounds = np.searchsorted(yb[order], np.arange(self.n_classes + 1))
            xs = np.take(xb, order, axis=0)
            for cls in range(self.n_classes):
                a, b = bounds[cls], bounds[cls + 1]
                if a < b and self.offsets[cls] < self.offsets[cls + 1]:
                    yield cls, s + order[a:b], np.ascontiguousarray(xs[a:b].T)

    def _contains_class(self, xt: np.ndarray, cls: int) -> np.ndarray:
        """Membership of the columns of ``xt`` (n_features, n) in class ``cls``'s boxes.

        Assumes valid input.
        """
        n, d = xt.shape[1], xt.shape[0]
        a, b = self.offsets[cls], self.offsets[cls + 1]
        if n < _ROWWISE_MIN:  # few inputs: broadcasting beats thousands of small calls
            lo, hi = self.lo[None, a:b], self.hi[None, a:b]
            found = np.empty(n, dtype=bool)
            for s, x in _broadcast_chunks(xt, b - a):
                found[s : s + len(x)] = np.any(np.all((x >= lo) & (x <= hi), axis=2), axis=1)
            return found
        found = np.zeros(n, dtype=bool)
        ok = np.empty(n, dtype=bool)
        tmp = np.empty(n, dtype=bool)
        for k in range(self.offsets[cls], self.offsets[cls + 1]):
            lo, hi, dims = self.lo[k], self.hi[k], self._order[k]
            np.logical_not(found, out=ok)
            for pos in range(0, d, _BLOCK):
                if not ok.any():
                    break
                for j in dims[pos : pos + _BLOCK]:
                    np.greater_equal(xt[j], lo[j], out=tmp)
                    ok &= tmp
                    np.less_equal(xt[j], hi[j], out=tmp)
                    ok &= tmp
            found |= ok
        return found

    def distance_and_contains(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`distance` and :meth:`contains` together, sharing one pass when it fits.

        Exact: ``clip(x, lo, hi) - x`` is 0 in every dimension iff ``lo <= x <= hi``.
        """
        x, y = self._check(x, y)
        if _kernel is not None and self.n_features:
            return self._native_distance_contains(x, y)
        if not self._padded_fits(len(x)):
            return self.distance(x, y), self.contains(x, y)
        plo, phi, real = self._padded
        xb = x[:, None, :]
        gap = np.clip(xb, plo[y], phi[y])
        gap -= xb
        live = real[y]
        inside = np.any(live & ~np.any(gap, axis=2), axis=1)
        d2 = np.where(live, np.einsum("ikj,ikj->ik", gap, gap), np.inf)
        return np.sqrt(np.min(d2, axis=1), dtype=np.float64), inside

    def distance(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Euclidean distance from each ``x[i]`` to the nearest box of class ``y[i]``.

        0 inside a box; ``inf`` when class ``y[i]`` has no box. Accumulated per dimension
        in float32 over contiguous rows (as :meth:`contains` does).

        Parameters
        ----------
        x : ndarray of shape (n_samples, n_features)
        y : ndarray of shape (n_samples,), int

        Returns
        -------
        ndarray of shape (n_samples,), float64
        """
        x, y = self._check(x, y)
        if _kernel is not None and self.n_features:
            return self._native_distance_contains(x, y)[0]
        if self._padded_fits(len(x)):
            plo, phi, real = self._padded
            xb = x[:, None, :]
            gap = np.clip(xb, plo[y], phi[y])
            gap -= xb
            d2 = np.where(real[y], np.einsum("ikj,ikj->ik", gap, gap), np.inf)
            return np.sqrt(np.min(d2, axis=1), dtype=np.float64)
        out = np.full(len(x), np.inf)
        for cls, idx, xt in self._per_class(x, y):
            n = xt.shape[1]
            if n < _ROWWISE_MIN_DISTANCE:  # few inputs: broadcast over (inputs, boxes, features)
                a, b = self.offsets[cls], self.offsets[cls + 1]
                lo, hi = self.lo[None, a:b], self.hi[None, a:b]
                best = np.empty(n, dtype=np.float32)
                for s, xc in _broadcast_chunks(xt, b - a):
                    gap = np.clip(xc, lo, hi)
                    gap -= xc
                    best[s : s + len(xc)] = np.einsum("ikj,ikj->ik", gap, gap).min(axis=1)
                out[idx] = np.sqrt(best, dtype=np.float64)
                continue
            best = np.full(n, np.inf, dtype=np.float32)
            acc = np.empty(n, dtype=np.float32)
            gap = np.empty(n, dtype=np.float32)
            for k in range(self.offsets[cls], self.offsets[cls + 1]):
                lo, hi = self.lo[k], self.hi[k]
                acc.fill(0.0)
                for j in range(xt.shape[0]):
                    np.clip(xt[j], lo[j], hi[j], out=gap)
                    gap -= xt[j]
                    gap *= gap
                    acc += gap
                np.minimum(best, acc, out=best)
            out[idx] = np.sqrt(best, dtype=np.float64)
        return out

    def fused_distances(
        self, x: np.ndarray, y: np.ndarray, other: BoxSet, other_class: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The fused score's distances: ``(d_own, inside, d_other)``.

        ``d_own`` and ``inside`` are :meth:`distance_and_contains`; ``d_other`` is
        ``other.distance`` (``other``: the boxes of each class's nearest other classes, see
        :func:`complement_boxes`) where ``0 < d_own < inf`` and ``inf`` elsewhere (the
        contrast term needs it nowhere else). With ``other_class`` (one class of ``other``
        per class, -1: none), ``d_other`` is the distance to ``other``'s boxes of class
        ``other_class[y[i]]`` instead: ``other`` may be this set itself, with each class's
        one nearest other class, and no copy of its boxes. The native kernel does all of it
        in one pass over the inputs; the numpy path gives identical values.
        """
        x, y = self._check(x, y)
        self._check_set(other, "fused_distances: the other boxes")
        if _kernel is not None and self.n_features:
            inside, _, _, d_own, d_other = self._native_pass(x, y, None, other, other_class)
            assert d_own is not None and d_other is not None  # asked for
            return d_own, inside, d_other
        d_own, inside = self.distance_and_contains(x, y)
        rows = np.flatnonzero(np.isfinite(d_own) & (d_own > 0))
        return d_own, inside, other_distances(other, x, y, rows, other_class)

    def assess_layer(
        self,
        x: np.ndarray,
        y: np.ndarray,
        bad: BoxSet,
        other: BoxSet | None = None,
        other_class: np.ndarray | None = None,
        *,
        every_row: bool = False,
        distances: bool = True,
    ) -> LayerPass:
        """A monitored layer's box work for a batch, these being its good boxes and ``bad``
        its bad ones: membership, the bad boxes' (``every_row``: on every input, else inside
        a good box only, where it changes a verdict), Algorithm 3's verdicts and, with
        ``distances``, :meth:`distance_and_contains`'s distances (and, given ``other``,
        :meth:`fused_distances`'s ``d_other``). The native kernel reads each input once for
        all of it; the numpy path gives identical values.
        """
        x, y = self._check(x, y)
        self._check_set(bad, "assess_layer: the bad boxes")
        if other is not None:
            self._check_set(other, "assess_layer: the other boxes")
        if _kernel is not None and self.n_features:
            got = self._native_pass(x, y, bad, other, other_class, every_row, distances)
            inside, in_bad, verdicts, d_own, d_other = got
            assert in_bad is not None and verdicts is not None  # given bad boxes
            return LayerPass(verdicts, inside, in_bad, d_own, d_other)
        d_own = d_other = None
        if distances and other is not None:
            d_own, inside, d_other = self.fused_distances(x, y, other, other_class)
        elif distances:
            d_own, inside = self.distance_and_contains(x, y)
        else:
            inside = self.contains(x, y)
        in_bad = bad.contains(x, y, None if every_row else inside)
        return LayerPass(_layer_codes(inside, in_bad), inside, in_bad, d_own, d_other)

    def _check_set(self, other: BoxSet, what: str) -> None:
        if len(other.offsets) != len(self.offsets) or other.lo.shape[1] != self.lo.shape[1]:
            raise ConfigError(f"{what} must have the same classes and features")

    def _native_pass(
        self,
        x: np.ndarray,
        y: np.ndarray,
        bad: BoxSet | None,
        other: BoxSet | None,
        other_class: np.ndarray | None,
        every_row: bool = False,
        distances: bool = True,
    ) -> tuple[
        np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None, np.ndarray | None
    ]:
        """The native kernel's ``layer_pass``: ``(inside, in_bad, verdicts, d_own,
        d_other)``, None where not asked for (``in_bad`` and ``verdicts`` without ``bad``,
        ``d_other`` without ``other``). Assumes checked input."""
        n = len(x)
        inside = np.empty(n, dtype=np.uint8)
        in_bad = None if bad is None else np.empty(n, dtype=np.uint8)
        verdicts = None if bad is None else np.empty(n, dtype=np.int8)
        d_own = np.empty(n) if distances else None
        d_other = np.empty(n) if distances and other is not None else None
        _kernel.layer_pass(
            x,
            y,
            self.n_features,
            self._lanes,
            None if bad is None else bad._rows,
            None if other is None else other._lanes,
            None if other_class is None else np.ascontiguousarray(other_class, np.int64),
            every_row,
            inside,
            in_bad,
            verdicts,
            d_own,
            d_other,
        )
        bad_bool = None if in_bad is None else in_bad.view(bool)
        return inside.view(bool), bad_bool, verdicts, d_own, d_other

    def _native_distance_contains(
        self, x: np.ndarray, y: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        inside, _, _, d_own, _ = self._native_pass(x, y, None, None, None)
        assert d_own is not None  # asked for
        return d_own, inside

    def _check(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Validated ``x`` (C-contiguous float32) and ``y`` (C-contiguous int64)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.asarray(y)
        d = self.lo.shape[1]
        if x.ndim != 2 or x.shape[1] != d:
            raise ValueError(f"x has shape {x.shape}; expected (n_samples, {d})")
        if y.shape != (len(x),):
            raise ValueError(f"y has shape {y.shape}; expected ({len(x)},)")
        # The native kernel checks the class range in its own pass and names the input.
        if (_kernel is None or not d) and len(y) and (y.min() < 0 or y.max() >= self.n_classes):
            raise ValueError(
                f"predicted classes must lie in [0, {self.n_classes}); got {y.min()}..{y.max()}"
            )
        return x, np.ascontiguousarray(y, dtype=np.int64)

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """Numeric arrays for an ``.npz`` member, names prefixed by ``prefix``."""
        return {f"{prefix}.lo": self.lo, f"{prefix}.hi": self.hi, f"{prefix}.offsets": self.offsets}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], prefix: str) -> BoxSet:
        """Inverse of :meth:`to_arrays`."""
        return cls(arrays[f"{prefix}.lo"], arrays[f"{prefix}.hi"], arrays[f"{prefix}.offsets"])


def other_distances(
    other: BoxSet,
    x: np.ndarray,
    y: np.ndarray,
    rows: np.ndarray,
    other_class: np.ndarray | None = None,
) -> np.ndarray:
    """The contrast term's ``d_other`` (:meth:`BoxSet.fused_distances`) at ``rows``, ``inf``
    elsewhere and where ``other_class`` gives -1."""
    out = np.full(len(x), np.inf)
    classes = y[rows] if other_class is None else np.asarray(other_class)[y[rows]]
    rows = rows[classes >= 0]
    if len(rows):
        out[rows] = other.distance(x[rows], classes[classes >= 0])
    return out


def _lanes(
    lo: np.ndarray, hi: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The native kernel's copy of the boxes: ``(tlo, thi, cap)``.

    ``tlo`` and ``thi``: n_boxes * n_features + LANES float32 each (the last LANES are zeros).
    Each class's boxes stay where ``lo`` holds them (from row ``offsets[c]``), in blocks of
    ``LANES`` boxes (the last block narrower), each block transposed to (n_features, boxes):
    the kernel accumulates the distances of a block's boxes side by side (one SIMD lane per
    box, each lane summing its features in order, so the sums round as the one-box loop's
    do), and a class of a few boxes reads no padding. ``cap``: per class, the range every one
    of its boxes holds on each feature (the largest ``lo``, then the smallest ``hi``; an empty
    range for a class without boxes), shape (n_classes, 2, n_features): where an input lies
    in it, every box's gap is 0 and the kernel skips the feature. Empty without the kernel.
    """
    lanes = getattr(_NATIVE, "LANES", 0)
    if not lanes:
        empty = np.zeros(0, np.float32)
        return empty, empty, empty
    d = lo.shape[1]
    tlo = np.zeros(len(lo) * d + lanes, np.float32)
    thi = np.zeros_like(tlo)
    cap = np.empty((len(offsets) - 1, 2, d), np.float32)
    cap[:, 0], cap[:, 1] = np.inf, -np.inf
    for c in range(len(offsets) - 1):
        if offsets[c] < offsets[c + 1]:
            cap[c, 0] = lo[offsets[c] : offsets[c + 1]].max(axis=0)
            cap[c, 1] = hi[offsets[c] : offsets[c + 1]].min(axis=0)
        for s in range(offsets[c], offsets[c + 1], lanes):
            e = min(s + lanes, offsets[c + 1])
            tlo[s * d : e * d] = lo[s:e].T.ravel()
            thi[s * d : e * d] = hi[s:e].T.ravel()
    return tlo, thi, cap


def _broadcast_chunks(xt: np.ndarray, n_boxes: int):
    """Yield ``(start, x)`` with ``x`` of shape (m, 1, n_features) covering the columns of ``xt``."""
    n_features, n = xt.shape
    step = max(1, _BROADCAST_ELEMENTS // max(1, n_boxes * n_features))
    for s in range(0, n, step):
        yield s, xt[:, s : s + step].T[:, None, :]


def complement_boxes(boxes: BoxSet, n_neighbours: int = 0, candidates: int = 0) -> BoxSet:
    """For every class ``c``, the boxes of the other classes.

    ``n_neighbours > 0`` keeps only the boxes of the ``n_neighbours`` classes whose box
    centres come nearest to one of ``c``'s (ties: the lower class index); 0 keeps all.
    ``candidates > 0`` looks for them among the ``candidates`` classes whose mean box centre
    lies nearest ``c``'s only (no change with that many other classes or fewer).
    Each class's list starts with the boxes whose centres lie nearest to one of its own, so
    a nearest-box search finds a close box early and stops sooner (distances do not depend
    on the order).
    """
    return _complement_from_rows(boxes, _complement_rows(boxes, n_neighbours, candidates))


def _complement_from_rows(boxes: BoxSet, per_class: list[np.ndarray]) -> BoxSet:
    """The box set holding, for each class, the rows ``per_class`` of ``boxes``."""
    idx = np.concatenate(per_class) if per_class else np.zeros(0, np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(i) for i in per_class])]).astype(np.int64)
    return BoxSet(boxes.lo[idx], boxes.hi[idx], offsets)


def _complement_rows(boxes: BoxSet, n_neighbours: int, candidates: int = 0) -> list[np.ndarray]:
    """:func:`complement_boxes`'s rows of ``boxes``, one index array per class, nearest first.

    The gap from another box to a class is the smallest squared distance between its centre
    and one of the class's box centres. With ``n_neighbours > 0`` the exact gaps are
    computed for the classes that can be among the nearest only: a matrix product gives
    every gap to within :data:`_GAP_SLACK`, and a class further than the n-th nearest by
    more than that is passed over (the result is the same). ``candidates > 0`` (at least
    ``n_neighbours``) looks among the ``candidates`` classes whose mean box centre lies
    nearest the class's own only, so the work grows with the classes rather than their
    square; with ``candidates`` or fewer other classes it changes nothing.
    """
    off = boxes.offsets
    counts = np.diff(off)
    owner = np.repeat(np.arange(boxes.n_classes), counts)
    means = None
    if n_neighbours > 0 and 0 < candidates < int((counts > 0).sum()) - 1:
        means = _class_means(boxes)  # the centres are then made class by class
    else:
        centre = _centres(boxes, slice(None))
        centre_sq = (centre**2).sum(axis=1)
    per_class = []
    for c in range(boxes.n_classes):
        own = _centres(boxes, slice(off[c], off[c + 1]))
        others = np.r_[0 : off[c], off[c + 1] : off[-1]].astype(np.int64)
        if not len(own) or not len(others):  # no box of its own, or no other: index order
            per_class.append(others)
            continue
        if means is not None:  # the candidates' centres only
            rows = _rows_of(off, _nearest_means(means, counts, c, candidates))
            near = _centres(boxes, rows)
            at = np.arange(len(rows))
            at = _within_reach(near, (near**2).sum(axis=1), owner[rows], at, own, n_neighbours)
            others, gap = rows[at], _gaps(near, at, own)
        else:
            if n_neighbours > 0:
                others = _within_reach(centre, centre_sq, owner, others, own, n_neighbours)
            gap = _gaps(centre, others, own)
        others = others[np.argsort(gap, kind="stable")]
        if n_neighbours > 0:
            cls = owner[others]
            first = np.unique(cls, return_index=True)[1]  # each class's nearest box
            near = cls[np.sort(first)][:n_neighbours]
            others = others[np.isin(cls, near)]
        per_class.append(others)
    return per_class


# Relative error allowed for a squared distance from a matrix product (|a|^2 + |b|^2 - 2 a.b
# in float64): far above its rounding for a few thousand features, far below any gap that
# ranks classes.
_GAP_SLACK = 1e-9
# Elements of one (rows, own boxes, features) block of _gaps.
_GAP_ELEMENTS = 1 << 22


def _gaps(centre: np.ndarray, rows: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Squared distance from each centre ``centre[rows]`` to the nearest of ``own``, in
    blocks (each row's sum does not depend on the block it is in)."""
    out = np.empty(len(rows))
    step = max(1, _GAP_ELEMENTS // max(1, len(own) * centre.shape[1]))
    for s in range(0, len(rows), step):
        r = rows[s : s + step]
        out[s : s + len(r)] = (
            ((centre[r][:, None, :] - own[None, :, :]) ** 2).sum(axis=2).min(axis=1)
        )
    return out


def _centres(boxes: BoxSet, rows: slice | np.ndarray) -> np.ndarray:
    """The centres ``(lo + hi) / 2`` of the boxes ``rows``, float64."""
    return (boxes.lo[rows].astype(np.float64) + boxes.hi[rows]) / 2


def _class_means(boxes: BoxSet) -> np.ndarray:
    """Each class's mean box centre, shape (n_classes, n_features) (0 without boxes): summed
    in blocks of boxes, in box order (the sums do not depend on the blocks)."""
    counts = boxes.counts()
    owner = np.repeat(np.arange(boxes.n_classes), counts)
    sums = np.zeros((boxes.n_classes, boxes.n_features))
    step = max(1, _GAP_ELEMENTS // max(1, boxes.n_features))
    for s in range(0, len(owner), step):
        np.add.at(sums, owner[s : s + step], _centres(boxes, slice(s, s + step)))
    return sums / np.maximum(counts, 1)[:, None]


def _rows_of(offsets: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """The box rows of ``classes`` (ascending), in index order."""
    parts = [np.arange(offsets[j], offsets[j + 1]) for j in classes]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def _nearest_means(means: np.ndarray, counts: np.ndarray, c: int, k: int) -> np.ndarray:
    """The ``k`` classes with boxes, other than ``c``, whose mean box centre lies nearest
    ``means[c]`` (ties: the lower class), ascending."""
    gap = ((means - means[c]) ** 2).sum(axis=1)
    gap[c] = np.inf
    gap[counts == 0] = np.inf
    return np.sort(np.argsort(gap, kind="stable")[:k])


def _within_reach(
    centre: np.ndarray,
    centre_sq: np.ndarray,
    owner: np.ndarray,
    rows: np.ndarray,
    own: np.ndarray,
    n_neighbours: int,
) -> np.ndarray:
    """The boxes of ``rows`` whose class can be among the ``n_neighbours`` nearest to the
    centres ``own`` (the others' gaps exceed the n-th nearest class's by more than the
    product's error), in index order."""
    own_sq = (own**2).sum(axis=1)
    if 2 * len(rows) < len(centre):  # a few classes' boxes: gather them
        dots = own @ centre[rows].T
    else:  # most boxes: one product with all, the others' columns kept
        keep = np.zeros(len(centre), dtype=bool)
        keep[rows] = True
        dots = np.compress(keep, own @ centre.T, axis=1)
    approx = own_sq[:, None] + centre_sq[None, rows] - 2 * dots
    slack = _GAP_SLACK * (own_sq.max() + centre_sq[rows])
    low, high = (approx - slack).min(axis=0), (approx + slack).min(axis=0)
    classes, inverse = np.unique(owner[rows], return_inverse=True)
    best = np.full(len(classes), np.inf)
    np.minimum.at(best, inverse, high)
    cut = np.sort(best)[min(n_neighbours, len(best)) - 1]
    reach = np.zeros(len(classes), dtype=bool)
    reach[inverse[low <= cut]] = True
    return rows[reach[inverse]]


def complement_classes(boxes: BoxSet, n_neighbours: int = 0, candidates: int = 0) -> np.ndarray:
    """The classes whose boxes :func:`complement_boxes` gives each class, shape
    (n_classes, n_most), padded with -1 (at least one column)."""
    return _classes_from_rows(boxes, _complement_rows(boxes, n_neighbours, candidates))


def _classes_from_rows(boxes: BoxSet, rows_per_class: list[np.ndarray]) -> np.ndarray:
    """:func:`complement_classes` of the rows :func:`_complement_rows` gave."""
    owner = np.repeat(np.arange(boxes.n_classes), boxes.counts())
    per_class = [np.unique(owner[rows]) for rows in rows_per_class]
    table = np.full((boxes.n_classes, max([1, *map(len, per_class)])), -1, dtype=np.int64)
    for c, classes in enumerate(per_class):
        table[c, : len(classes)] = classes
    return table


def _finite_number(value: Any) -> TypeGuard[float | int]:
    """Whether an artifact's JSON value is a finite number (a bool is not one)."""
    return (
        isinstance(value, float | int) and not isinstance(value, bool) and bool(np.isfinite(value))
    )


def _mean_of_rows(rows: np.ndarray) -> np.ndarray:
    """``np.mean(rows, axis=0)`` of a float64 array, without its Python overhead: the same
    sum (``np.add.reduce``) divided by the same count, so the same bits."""
    return np.add.reduce(rows, axis=0) / len(rows)


def contrast_scores(d_own: np.ndarray, d_other: np.ndarray) -> np.ndarray:
    """``d_own / (d_own + d_other)``: 0 inside a box of the predicted class, 1/2 halfway
    between it and another class's box, 1 inside another class's box only.

    ``NaN`` where either distance is ``NaN`` or both are infinite; callers map it to reject.
    """
    d_own, d_other = np.asarray(d_own, np.float64), np.asarray(d_other, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = d_own / (d_own + d_other)
    out[d_own == 0] = 0.0
    return out


REASON_NAMES = vocab.VERDICT_REASONS
FAMILIAR = REASON_NAMES.index("familiar")
LOW_CONFIDENCE = REASON_NAMES.index("low_confidence")
BAD_BOX = REASON_NAMES.index("bad_box")
OUTSIDE_BOXES = REASON_NAMES.index("outside_boxes")
BETWEEN_CLASSES = REASON_NAMES.index("between_classes")
ENERGY = REASON_NAMES.index("energy")
MAHALANOBIS = REASON_NAMES.index("mahalanobis")
NOT_FINITE = REASON_NAMES.index("not_finite")
OUT_OF_RANGE = REASON_NAMES.index("out_of_range")


@dataclass(frozen=True)
class Reasons:
    """Why each input got its verdict (:meth:`BoxRuntime.explain`).

    Attributes
    ----------
    codes : ndarray of shape (n_samples,), int8
        Reason codes: index into :data:`REASON_NAMES` (``vocab.VERDICT_REASONS``).
    layer : ndarray of shape (n_samples,), int16
        For inputs not accepted, the layer the reason points at (index into
        ``layer_names``): the deciding term's layer (``outside_boxes``,
        ``between_classes``, ``mahalanobis``), the first layer holding the input in a bad
        box (``bad_box``), else the layer with the largest scaled distance; -1 for accepted
        inputs and ``not_finite``.
    nearest : ndarray of shape (n_samples,), int64
        For inputs not accepted, the nearest other class: among the classes the contrast
        term measures against (the contrast layer with the largest term), else the model's
        runner-up class; -1 where none (accepted, ``not_finite``, no logits).
    layer_names : tuple of str
    """

    codes: np.ndarray
    layer: np.ndarray
    nearest: np.ndarray
    layer_names: tuple[str, ...]

    def names(self) -> np.ndarray:
        """Reason names, shape (n_samples,), object."""
        return np.asarray(REASON_NAMES, dtype=object)[self.codes]

    def layers(self) -> list[str | None]:
        """The layer each input's reason points at, None where none."""
        names = [*self.layer_names, None]  # index -1: None
        return [names[i] for i in self.layer.tolist()]

    def override(self, where: np.ndarray, code: int) -> Reasons:
        """These reasons with ``code`` where ``where`` holds; ``not_finite`` also clears
        the layer and the nearest class (nothing measured is left to point at)."""
        where = np.asarray(where, dtype=bool)
        if not where.any():
            return self
        codes = np.where(where, np.int8(code), self.codes).astype(np.int8)
        if code != NOT_FINITE:
            return Reasons(codes, self.layer, self.nearest, self.layer_names)
        return Reasons(
            codes,
            np.where(where, -1, self.layer).astype(np.int16),
            np.where(where, -1, self.nearest),
            self.layer_names,
        )


@dataclass
class AssessTrace:
    """What one :meth:`BoxRuntime.assess` pass computed, for :meth:`BoxRuntime.explain`: the
    features and bad-box tests per layer, and the score's scaled terms (distances, contrast
    terms, relative Mahalanobis terms, the energy term once; empty without a score)."""

    feats: dict[str, np.ndarray] = field(default_factory=dict)
    in_bad: dict[str, np.ndarray] = field(default_factory=dict)
    terms: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))
    peaked: np.ndarray | None = None  # where one layer's distance made the score (peak_factor)


@dataclass(frozen=True)
class _ReasonLayout:
    """What :meth:`BoxRuntime.explain` reads of a monitor's settings, built once for them.

    ``names``: the layers the reasons index; ``monitored`` / ``score_at``: the index of each
    monitored / score layer there; per term of the score (distances, contrast terms,
    relative Mahalanobis terms, the energy term): ``kinds`` (reason code), ``term_at``
    (layer index, -1: the energy) and
    ``weight`` (what its value weighs in the score); ``nearest``: per contrast layer and
    class, the one class its contrast term measures against (None: more than one).
    """

    names: tuple[str, ...]
    monitored: np.ndarray
    score_at: np.ndarray
    kinds: np.ndarray
    term_at: np.ndarray
    weight: np.ndarray
    n_dist: int
    n_con: int
    nearest: np.ndarray | None


def layer_verdicts(good: BoxSet, bad: BoxSet, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Algorithm 3 for one layer: verdict codes of shape (n_samples,), int8."""
    return _layer_codes(good.contains(x, y), bad.contains(x, y))


# Algorithm 3's verdict per (in a good box, in a bad box), indexed by in_good + 2 * in_bad.
_LAYER_CODES = np.array([REJECT, ACCEPT, REJECT, UNCERTAIN], dtype=np.int8)


def _layer_codes(in_good: np.ndarray, in_bad: np.ndarray) -> np.ndarray:
    """Algorithm 3's verdict codes from the two memberships (bool arrays of one shape)."""
    return _LAYER_CODES.take(in_good.view(np.uint8) | (in_bad.view(np.uint8) << 1))


def combine_verdicts(per_layer: np.ndarray, rule: str) -> np.ndarray:
    """Combine verdicts of shape (n_layers, n_samples) into one per sample.

    Rules:

    * ``"any"`` (default, cautious): reject if any layer rejects; else uncertainty if any
      layer is uncertain; else accept.
    * ``"majority"``: reject if more than half of the layers reject; else uncertainty if
      any layer is uncertain or rejects; else accept.
    * ``"all"`` (permissive): reject only if every layer rejects; else accept if every
      layer accepts; else uncertainty.
    """
    per_layer = np.asarray(per_layer)
    n_layers = per_layer.shape[0]
    rejects = np.sum(per_layer == REJECT, axis=0)
    accepts = np.sum(per_layer == ACCEPT, axis=0)
    if rule == "any":
        return np.max(per_layer, axis=0).astype(np.int8)
    if rule == "majority":
        out = np.where(accepts == n_layers, ACCEPT, UNCERTAIN)
        return np.where(2 * rejects > n_layers, REJECT, out).astype(np.int8)
    if rule == "all":
        out = np.where(accepts == n_layers, ACCEPT, UNCERTAIN)
        return np.where(rejects == n_layers, REJECT, out).astype(np.int8)
    if rule == "calibrated":
        raise ConfigError(
            "combine='calibrated' decides on scores, not on layer verdicts: use BoxRuntime.assess"
        )
    raise ConfigError(f"combine={rule!r}: expected one of {COMBINE_RULES}")


@dataclass
class BoxRuntime:
    """Everything the agent needs to apply a fitted box monitor; no scikit-learn.

    Attributes
    ----------
    layers : list of str
        Monitored layers, in order.
    n_classes : int
    good, bad : dict of str to BoxSet
        Boxes of correctly / incorrectly classified training activations, per layer.
    normalize : {"none", "l2"}
        Feature normalisation applied before any box test.
    combine : {"any", "majority", "all", "calibrated"}
        How per-layer verdicts make the combined one (:func:`combine_verdicts`), or
        ``"calibrated"`` (see :meth:`verdicts`).
    score_layers : list of str
        Layers whose distances make the combined score.
    score_scales : dict of str to float
        Each score layer's distance is divided by its scale (set by calibration, else 1).
    score : {"distance", "fused"}
        ``"distance"``: the mean over score layers of distance / scale. ``"fused"`` adds the
        mean over ``contrast_layers`` of :func:`contrast_scores` / scale (the distance to the
        predicted class's boxes against the distance to the other classes' boxes), and maps
        any non-finite score to ``inf`` (reject).
    contrast_layers : list of str
        Layers of the contrast term (``score="fused"``); each must be monitored.
    contrast_classes : int
        ``d_other`` looks at the boxes of this many nearest other classes
        (:func:`complement_boxes`; 0: all of them).
    contrast_candidates : int
        The nearest other classes are sought among this many classes whose mean box centre
        lies nearest (:func:`complement_boxes`; 0: every class, as before format 6): the
        search then grows with the classes rather than their square.
    contrast_scales : dict of str to float
        Scale of each contrast layer's term (set by calibration, else 1).
    threshold : float or None
        Combined scores ``<= threshold`` are accepted by :meth:`decide`.
    meta : dict
        JSON-able provenance (taus, calibration figures).
    uncertainty : {"error-model", "confidence", "bad-box"}
        With ``combine="calibrated"``, what turns an input within the threshold into
        *uncertainty*: ``"error-model"``, the probability of a mistake from ``error_model``
        above its threshold; ``"confidence"``, the model's confidence (:func:`model_confidence`
        of its output) below ``confidence_floor`` (no floor: never); ``"bad-box"`` (how
        monitors built before format 3 decide), some layer's bad box of the predicted class.
    confidence_floor : float or None
        Lowest confidence accepted (``uncertainty="confidence"``), set by calibration.
    output : {"logits", "probabilities"}
        How the model's output reads, for :func:`model_confidence`.
    score_mean : {"quadratic", "arithmetic"}
        How the scaled terms make the score (:meth:`combine_scores`).
    energy_center, energy_scale : float or None
        The energy term of the fused quadratic score (set by calibration when the monitor
        was fitted with logits; None: no term): ``max(0, energy - center) / scale``, with
        the energy :func:`model_energy` of the model's logits.
    mahalanobis : dict of str to RelativeMahalanobis
        The relative Mahalanobis terms of the fused quadratic score, by score layer (fitted
        on the training inputs; a term counts once calibration set its centre and scale):
        ``max(0, RMD - center) / scale`` at the predicted class, each one more term of the
        mean (:mod:`boxwatch.agent.mahalanobis`).
    error_model : ErrorModel or None
        With ``uncertainty="error-model"``: the learnt model of the classifier's mistakes and
        its calibrated cut.
    peak_factor : float or None
        The score is at least the largest scaled distance term divided by this: one layer
        far outside its boxes decides the score however familiar the other layers look
        (None: the mean of the terms alone, as before format 7).
    """

    layers: list[str]
    n_classes: int
    good: dict[str, BoxSet]
    bad: dict[str, BoxSet]
    normalize: str = "l2"
    combine: str = "any"
    score_layers: list[str] = field(default_factory=list)
    score_scales: dict[str, float] = field(default_factory=dict)
    threshold: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    score: str = "distance"
    contrast_layers: list[str] = field(default_factory=list)
    contrast_scales: dict[str, float] = field(default_factory=dict)
    contrast_classes: int = 0
    uncertainty: str = "bad-box"
    confidence_floor: float | None = None
    output: str = "logits"
    score_mean: str = "arithmetic"
    energy_center: float | None = None
    energy_scale: float | None = None
    error_model: ErrorModel | None = None
    contrast_candidates: int = 0
    peak_factor: float | None = None
    mahalanobis: dict[str, RelativeMahalanobis] = field(default_factory=dict)
    _others: dict[str, BoxSet] = field(default_factory=dict, init=False, repr=False, compare=False)
    _other_classes: dict[tuple[str, int, int], np.ndarray] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _complements: dict[tuple[str, int, int], list[np.ndarray]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _layouts: dict[tuple, _ReasonLayout] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def other_boxes(self, layer: str) -> BoxSet:
        """Per class, the good boxes of its ``contrast_classes`` nearest other classes
        (:func:`complement_boxes`), built on first use and cached."""
        if layer not in self._others:
            rows = self._complement_rows(layer)
            self._others[layer] = _complement_from_rows(self.good[layer], rows)
        return self._others[layer]

    def _contrast_boxes(self, layer: str) -> tuple[BoxSet, np.ndarray | None]:
        """The boxes ``d_other`` is measured to, and the class of them for each class (None:
        the same class): with one neighbour class (``contrast_classes=1``) the layer's good
        boxes themselves and each class's neighbour (-1: none), no copy of its boxes; else
        :meth:`other_boxes`."""
        if self.contrast_classes != 1:
            return self.other_boxes(layer), None
        key = (layer, -1, self.contrast_candidates)  # -1: the neighbour, not a table
        if key not in self._other_classes:
            good = self.good[layer]
            first = self._other_classes_of(layer)[:, 0]
            self._other_classes[key] = np.where(good.counts() > 0, first, -1)
        return self.good[layer], self._other_classes[key]

    def _complement_rows(self, layer: str) -> list[np.ndarray]:
        """:func:`_complement_rows` of the layer's good boxes at this monitor's settings,
        built once for :meth:`other_boxes` and :meth:`_other_classes_of`."""
        key = (layer, self.contrast_classes, self.contrast_candidates)
        if key not in self._complements:
            self._complements[key] = _complement_rows(
                self.good[layer], self.contrast_classes, self.contrast_candidates
            )
        return self._complements[key]

    def _flat(self, activations: Mapping[str, np.ndarray], layer: str) -> np.ndarray:
        """The layer's activations, one flattened row per input (a ConfigError when the
        layer is missing)."""
        if layer not in activations:
            raise ConfigError(
                f"activations lack monitored layer {layer!r}; got {sorted(activations)}"
            )
        x = np.asarray(activations[layer])
        return x.reshape(len(x), -1)

    def _features(self, activations: Mapping[str, np.ndarray], layer: str) -> np.ndarray:
        return normalize_features(self._flat(activations, layer), self.normalize)

    def verdicts(
        self,
        activations: Mapping[str, np.ndarray],
        y_pred: np.ndarray,
        *,
        logits: np.ndarray | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Combined and per-layer verdict codes, each of shape (n_samples,), int8.

        Per-layer verdicts are always Algorithm 3's. The combined verdict follows
        ``combine``: a rule over the layer verdicts (:func:`combine_verdicts`), or
        ``"calibrated"``: *reject* when the score exceeds the calibrated threshold, else
        *uncertainty* when the model's confidence (from ``logits``, its output) is below
        ``confidence_floor`` (``uncertainty="bad-box"``: when some layer puts the input
        inside a bad box of its predicted class), else *accept*. Both thresholds come from
        calibration, so the emitted verdicts accept the share of correct known inputs it
        was asked for.
        """
        n = len(y_pred)
        if n <= ROW_BLOCK:
            combined, per, _scores = self.assess(
                activations, y_pred, want_scores=False, logits=logits
            )
            return combined, per
        parts = [
            self.verdicts(
                _row_slice(activations, n, s),
                np.asarray(y_pred)[s : s + ROW_BLOCK],
                logits=None if logits is None else np.asarray(logits)[s : s + ROW_BLOCK],
            )
            for s in range(0, n, ROW_BLOCK)
        ]
        return np.concatenate([c for c, _ in parts]), {
            layer: np.concatenate([p[layer] for _, p in parts]) for layer in parts[0][1]
        }

    def needs_logits(self) -> bool:
        """Whether the verdicts read the model's output (a confidence floor or an energy term)."""
        floor = self.combine == "calibrated" and (
            (self.uncertainty == "confidence" and self.confidence_floor is not None)
            or (self.uncertainty == "error-model" and self.error_model is not None)
        )
        return floor or self.has_energy_term()

    def _restricts_contrast(self) -> bool:
        """Whether ``contrast_candidates`` can change the contrast term: a fused score whose
        neighbour search has more other classes to look at than candidates."""
        return (
            self.score == "fused"
            and self.contrast_classes > 0
            and 0 < self.contrast_candidates < self.n_classes - 1
        )

    def has_energy_term(self) -> bool:
        """Whether the score holds the energy term (fused quadratic score, calibrated with logits)."""
        return (
            self.score == "fused"
            and self.score_mean == "quadratic"
            and self.energy_scale is not None
        )

    def mahalanobis_layers(self) -> list[str]:
        """The layers whose relative Mahalanobis term the score holds (fused quadratic score,
        calibrated terms), in score-layer order."""
        if self.score != "fused" or self.score_mean != "quadratic":
            return []
        return [
            layer
            for layer in self.score_layers
            if layer in self.mahalanobis and self.mahalanobis[layer].calibrated
        ]

    def mahalanobis_distances(
        self,
        activations: Mapping[str, np.ndarray],
        y_pred: np.ndarray,
        layers: Sequence[str] | None = None,
    ) -> dict[str, np.ndarray]:
        """Relative Mahalanobis distance at the predicted class per layer of ``layers``
        (None: :meth:`mahalanobis_layers`), before scaling, shape (n_samples,) each."""
        y_pred = np.asarray(y_pred)
        out = {}
        for layer in self.mahalanobis_layers() if layers is None else layers:
            term, x = self.mahalanobis[layer], self._flat(activations, layer)
            try:
                if _kernel is None or not term.fused or len(y_pred) != len(x):
                    out[layer] = term.distance(x, y_pred)
                    continue
                # The native kernel picks each input's linear term and adds the rest in one
                # pass (and checks the classes): the same operations, the same bits.
                product, quadratic = term.project(x)
                out[layer] = np.empty(len(x))
                _kernel.rmd_rows(
                    product,
                    term.directions.shape[1],
                    np.ascontiguousarray(y_pred, dtype=np.int64),
                    quadratic,
                    np.ascontiguousarray(term.offset),
                    out[layer],
                )
            except ValueError as exc:
                raise ConfigError(f"layer {layer!r}: {exc}") from None
        return out

    def energy(self, logits: Outputs | None, n: int) -> np.ndarray | None:
        """The energy of ``logits`` when the score holds the energy term, else None."""
        if not self.has_energy_term():
            return None
        if logits is None:
            raise ConfigError(
                "this monitor's score reads the model's output (logits) for its energy "
                "term: pass logits="
            )
        e = model_energy(logits)
        if e.shape != (n,):
            raise ConfigError(f"logits give {len(e)} rows for {n} inputs")
        return e

    def assess(
        self,
        activations: Mapping[str, np.ndarray],
        y_pred: np.ndarray,
        *,
        want_scores: bool = True,
        logits: np.ndarray | None = None,
        trace: AssessTrace | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
        """Verdicts and scores in one pass: each box test and distance computed once.

        ``logits``: the model's output for the same inputs, needed when
        :meth:`needs_logits`. Returns ``(combined, per_layer, scores)``; ``scores`` is None
        when not wanted (and not needed by the combination rule) or when no score layer is
        set. ``trace`` receives what the pass computed (:meth:`explain` reads it).
        """
        y_pred = np.asarray(y_pred)
        # Read once for the energy term, the confidence floor and the error model.
        outputs = None if logits is None else ModelOutputs(logits, self.output)
        calibrated = self.combine == "calibrated"
        scored = (want_scores or calibrated) and bool(self.score_layers)
        contrast = self.contrast_layers if scored and self.score == "fused" else []
        feats = {
            layer: self._features(activations, layer)
            for layer in dict.fromkeys(
                [*self.layers, *(self.score_layers if scored else []), *contrast]
            )
        }
        dist: dict[str, np.ndarray] = {}
        d_other: dict[str, np.ndarray] = {}
        per: dict[str, np.ndarray] = {}
        in_bad: dict[str, np.ndarray] = {}
        # A bad box only matters inside a good one (uncertainty instead of accept), except
        # where the "bad-box" rule reads every layer's bad boxes for the combined verdict.
        every_row = calibrated and self.uncertainty == "bad-box"
        for layer in feats:
            fused = layer in contrast and layer in self.score_layers  # one pass, both terms
            distances = scored and layer in self.score_layers
            other, other_class = self._contrast_boxes(layer) if fused else (None, None)
            if layer in self.layers:  # the box tests, the verdicts and the distances at once
                got = self.good[layer].assess_layer(
                    feats[layer],
                    y_pred,
                    self.bad[layer],
                    other,
                    other_class,
                    every_row=every_row,
                    distances=distances,
                )
                per[layer], in_bad[layer] = got.verdicts, got.in_bad
                d_own, far = got.d_own, got.d_other
            elif fused:
                assert other is not None
                d_own, _inside, far = self.good[layer].fused_distances(
                    feats[layer], y_pred, other, other_class
                )
            elif distances:
                d_own, far = self.good[layer].distance(feats[layer], y_pred), None
            if distances:
                assert d_own is not None
                dist[layer] = d_own
            if fused:
                assert far is not None
                d_other[layer] = far
        per = {layer: per[layer] for layer in self.layers}
        in_bad = {layer: in_bad[layer] for layer in self.layers}
        if calibrated and (self.threshold is None or not self.score_layers):
            raise ConfigError(
                "combine='calibrated' needs score layers and a threshold: "
                "calibrate the monitor first"
            )
        scores = None
        peaked: np.ndarray | None = None
        contrast_terms: dict[str, np.ndarray] = {}
        if scored:
            own = {
                layer: dist[layer]
                if layer in dist
                else self.good[layer].distance(feats[layer], y_pred)
                for layer in contrast
            }
            energy = self.energy(outputs, len(y_pred))
            relative = self.mahalanobis_distances(activations, y_pred)
            if self._native_score_fits(d_other):
                contrast_terms, rows, scores, peaked = self._native_score(
                    dist, own, d_other, energy, relative
                )
            else:
                contrast_terms = {
                    layer: contrast_scores(own[layer], d_other[layer])
                    if layer in d_other
                    else self._contrast(feats, y_pred, {layer: own[layer]})[layer]
                    for layer in contrast
                }
                terms = self._scaled_terms(dist, contrast_terms, energy, relative)
                peak = self._peak(terms[0])
                scores = self._combine(*terms, peak)
                rows = np.array([*terms[0], *terms[1], *([] if terms[2] is None else [terms[2]])])
                peaked = None if peak is None else peak == scores
        if trace is not None:
            trace.feats, trace.in_bad = feats, in_bad
            if scored:
                trace.terms, trace.peaked = rows, peaked
        if not calibrated:
            combined = combine_verdicts(
                np.stack([per[layer] for layer in self.layers]), self.combine
            )
            return combined, per, scores
        assert scores is not None and self.threshold is not None  # both checked above
        if self.uncertainty == "bad-box":
            unsure = np.logical_or.reduce([in_bad[layer] for layer in self.layers])
        elif self.uncertainty == "error-model":
            unsure = ~(
                self._error_probability(outputs, scores, list(contrast_terms.values()), y_pred)
                <= self._error_cut()
            )
        else:
            unsure = self.unsure(outputs, len(y_pred))
        within = self.decide(scores)
        combined = np.where(within, np.where(unsure, UNCERTAIN, ACCEPT), REJECT)
        return combined.astype(np.int8), per, scores

    def error_score(
        self,
        activations: Mapping[str, np.ndarray],
        y_pred: np.ndarray,
        logits: np.ndarray,
    ) -> np.ndarray:
        """How likely the model's prediction is wrong, per input (higher: likelier): the score
        the *uncertainty* verdict cuts, shape (n_samples,); NaN where the output is not
        finite. The error model's probability, else one minus the model's confidence."""
        if self.uncertainty != "error-model" or self.error_model is None:
            return 1.0 - model_confidence(logits, self.output)
        y_pred = np.asarray(y_pred)
        contrast = (
            list(self.contrast_layer_scores(activations, y_pred).values())
            if self.score == "fused"
            else []
        )
        return self._error_probability(
            logits, self.scores(activations, y_pred, logits), contrast, y_pred
        )

    def _native_score_fits(self, d_other: Mapping[str, np.ndarray]) -> bool:
        """Whether :meth:`_native_score` computes this monitor's score: the native kernel, a
        fused quadratic score, and the other classes' distance of every contrast layer from
        its box pass."""
        return (
            _kernel is not None
            and self.score == "fused"
            and self.score_mean == "quadratic"
            and all(layer in d_other for layer in self.contrast_layers)
        )

    def _native_score(
        self,
        dist: Mapping[str, np.ndarray],
        own: Mapping[str, np.ndarray],
        d_other: Mapping[str, np.ndarray],
        energy: np.ndarray | None,
        mahalanobis: Mapping[str, np.ndarray],
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray | None]:
        """:func:`contrast_scores`, :meth:`_scaled_terms`, :meth:`_peak` and :meth:`_combine`
        of a fused quadratic score in one pass of the native kernel (the same operations in
        the same order: the same bits): ``(contrast terms per contrast layer, the scaled
        terms as rows, the scores, where the peak term is the score or None)``."""
        relative = self.mahalanobis_layers()
        missing = [layer for layer in relative if layer not in mahalanobis]
        if missing:
            raise ConfigError(
                f"this monitor's score needs the relative Mahalanobis distances of {missing}"
            )
        extra = [mahalanobis[layer] for layer in relative]
        terms = [self.mahalanobis[layer] for layer in relative]
        center = [t.center for t in terms]
        scale = [
            *(self.score_scales.get(layer, 1.0) for layer in self.score_layers),
            *(self.contrast_scales.get(layer, 1.0) for layer in self.contrast_layers),
            *(t.scale for t in terms),
        ]
        repeat = [1] * len(relative)
        if self.has_energy_term():
            if energy is None:
                raise ConfigError("this monitor's score needs the energy of the model's logits")
            extra.append(energy)
            center.append(self.energy_center)
            scale.append(self.energy_scale)
            repeat.append(ENERGY_TERMS)
        n = len(energy) if energy is not None else len(dist[self.score_layers[0]])
        contrast = {layer: np.empty(n) for layer in self.contrast_layers}
        rows = np.empty((len(scale), n))
        scores = np.empty(n)
        peaked = None if self.peak_factor is None else np.empty(n, dtype=np.uint8)
        _kernel.fused_score(  # float64 arrays of n values, checked by the kernel
            tuple(dist[layer] for layer in self.score_layers),
            tuple(own[layer] for layer in self.contrast_layers),
            tuple(d_other[layer] for layer in self.contrast_layers),
            tuple(extra),
            np.array(scale, dtype=np.float64),
            np.array(center, dtype=np.float64),
            np.array(repeat, dtype=np.int64),
            float(self.peak_factor or 0.0),
            tuple(contrast.values()),
            rows,
            scores,
            peaked,
        )
        return contrast, rows, scores, None if peaked is None else peaked.view(bool)

    def _error_probability(
        self,
        logits: Outputs | None,
        scores: np.ndarray,
        contrast: Sequence[np.ndarray],
        y_pred: np.ndarray,
    ) -> np.ndarray:
        if self.error_model is None:
            raise ConfigError("uncertainty='error-model' needs an error model: calibrate first")
        if logits is None:
            raise ConfigError(
                "this monitor's verdicts need the model's output (logits) for its error "
                "model: pass logits="
            )
        if _kernel is not None:
            return _native_error_probability(
                self.error_model, logits, self.output, scores, contrast, y_pred
            )
        feats = error_features(logits, self.output, scores, contrast)
        if len(feats) != len(scores):
            raise ConfigError(f"logits give {len(feats)} rows for {len(scores)} inputs")
        return self.error_model.probability(feats, y_pred)

    def _error_cut(self) -> float:
        assert self.error_model is not None  # checked by _error_probability
        cut = self.error_model.threshold
        return np.inf if cut is None else cut

    def unsure(self, logits: Outputs | None, n: int) -> np.ndarray:
        """Where the model's confidence is below ``confidence_floor`` (NaN included).

        All False without a floor; a floor without ``logits`` is a :class:`ConfigError`.
        """
        if self.confidence_floor is None:
            return np.zeros(n, dtype=bool)
        if logits is None:
            raise ConfigError(
                "this monitor's verdicts need the model's output (logits) for its "
                "confidence floor: pass logits="
            )
        conf = model_confidence(logits, self.output)
        if conf.shape != (n,):
            raise ConfigError(f"logits give {len(conf)} rows for {n} inputs")
        return ~(conf >= self.confidence_floor)

    def layer_scores(
        self, activations: Mapping[str, np.ndarray], y_pred: np.ndarray
    ) -> dict[str, np.ndarray]:
        """Distance to the nearest good box of the predicted class, per score layer."""
        y_pred = np.asarray(y_pred)
        return {
            layer: self.good[layer].distance(self._features(activations, layer), y_pred)
            for layer in self.score_layers
        }

    def _contrast(
        self, feats: Mapping[str, np.ndarray], y_pred: np.ndarray, own: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """Contrast term per contrast layer from features and own-class distances.

        Only inputs outside every box of their class (``0 < d_own < inf``) need the other
        classes' distance: the term is 0 inside, and NaN (reject) for other values anyway.
        """
        out = {}
        for layer, d_own in own.items():
            rows = np.flatnonzero(np.isfinite(d_own) & (d_own > 0))
            boxes, other_class = self._contrast_boxes(layer)
            d_other = other_distances(boxes, feats[layer], y_pred, rows, other_class)
            out[layer] = contrast_scores(d_own, d_other)
        return out

    def contrast_layer_scores(
        self, activations: Mapping[str, np.ndarray], y_pred: np.ndarray
    ) -> dict[str, np.ndarray]:
        """:func:`contrast_scores` per contrast layer, before scaling."""
        y_pred = np.asarray(y_pred)
        feats = {layer: self._features(activations, layer) for layer in self.contrast_layers}
        own = {
            layer: self.good[layer].distance(feats[layer], y_pred) for layer in self.contrast_layers
        }
        return self._contrast(feats, y_pred, own)

    def distance_terms(
        self, activations: Mapping[str, np.ndarray], y_pred: np.ndarray
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """:meth:`layer_scores` and (``score="fused"``) :meth:`contrast_layer_scores` in one
        pass: each layer's features made once, one kernel pass for a layer in both, at most
        :data:`ROW_BLOCK` rows at a time."""
        y_pred = np.asarray(y_pred)
        n = len(y_pred)
        if n > ROW_BLOCK:
            parts = [
                self.distance_terms(_row_slice(activations, n, s), y_pred[s : s + ROW_BLOCK])
                for s in range(0, n, ROW_BLOCK)
            ]
            return (
                {k: np.concatenate([d[k] for d, _ in parts]) for k in parts[0][0]},
                {k: np.concatenate([c[k] for _, c in parts]) for k in parts[0][1]},
            )
        contrast = self.contrast_layers if self.score == "fused" else []
        dist: dict[str, np.ndarray] = {}
        terms: dict[str, np.ndarray] = {}
        for layer in dict.fromkeys([*self.score_layers, *contrast]):
            feats = self._features(activations, layer)
            if layer in contrast:
                own, _inside, other = self.good[layer].fused_distances(
                    feats, y_pred, *self._contrast_boxes(layer)
                )
                terms[layer] = contrast_scores(own, other)
            else:
                own = self.good[layer].distance(feats, y_pred)
            if layer in self.score_layers:
                dist[layer] = own
        return dist, {layer: terms[layer] for layer in contrast}

    def combine_scores(
        self,
        per_layer: Mapping[str, np.ndarray],
        contrast: Mapping[str, np.ndarray] | None = None,
        energy: np.ndarray | None = None,
        mahalanobis: Mapping[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        """The score from per-layer distances (and contrast terms): shape (n_samples,).

        The terms are each score layer's distance / scale and (``"fused"``) each contrast
        layer's contrast / scale, with the quadratic mean one relative Mahalanobis term per
        :meth:`mahalanobis_layers` (``mahalanobis``: their :meth:`mahalanobis_distances`),
        and with an energy term (:meth:`has_energy_term`)
        ``max(0, energy - energy_center) / energy_scale``, counted ``ENERGY_TERMS`` times:
        the logits' evidence that the boxes cannot see (inputs with weak logits that still
        lie near some box).
        ``score_mean="quadratic"``: their root mean square, so one
        layer far off its training range is not averaged away by layers that look familiar.
        ``"arithmetic"``: the mean of the distance terms (plus, fused, the mean of the
        contrast terms). With a ``peak_factor``, the score is the larger of that mean and
        the largest distance term over ``peak_factor``: the mean of several layers still
        averages one far-off layer down (on the detection suite, another data set's images
        outside the input grid's boxes only). Non-finite scores become ``inf`` (never
        accepted) with ``"fused"`` and ``"quadratic"``.
        """
        return self._combine_terms(*self._scaled_terms(per_layer, contrast, energy, mahalanobis))

    def _combine_terms(
        self, dist: list[np.ndarray], con: list[np.ndarray], term: np.ndarray | None
    ) -> np.ndarray:
        """:meth:`combine_scores` of the :meth:`_scaled_terms`."""
        return self._combine(dist, con, term, self._peak(dist))

    def _combine(
        self,
        dist: list[np.ndarray],
        con: list[np.ndarray],
        term: np.ndarray | None,
        peak: np.ndarray | None,
    ) -> np.ndarray:
        """:meth:`_combine_terms` with the :meth:`_peak` of ``dist`` given."""
        if term is not None:
            con = [*con, *[term] * ENERGY_TERMS]
        if self.score_mean == "quadratic":
            with np.errstate(over="ignore", invalid="ignore"):
                out = np.sqrt(_mean_of_rows(np.square(dist + con)))
        else:
            out = _mean_of_rows(np.asarray(dist))
            if self.score == "fused" and con:
                out = out + _mean_of_rows(np.asarray(con))
        if peak is not None:
            out = np.maximum(out, peak)  # a NaN in either stays NaN: rejected below
        if self.score_mean != "quadratic" and self.score != "fused":
            return out
        finite = np.isfinite(out)
        if not finite.all():
            out[~finite] = np.inf
        return out

    def _peak(self, dist: Sequence[np.ndarray]) -> np.ndarray | None:
        """The largest scaled distance term over ``peak_factor`` (None: no peak term)."""
        if self.peak_factor is None or not len(dist):
            return None
        with np.errstate(invalid="ignore"):
            return np.maximum.reduce(np.asarray(dist), axis=0) / self.peak_factor

    def _scaled_terms(
        self,
        per_layer: Mapping[str, np.ndarray],
        contrast: Mapping[str, np.ndarray] | None,
        energy: np.ndarray | None,
        mahalanobis: Mapping[str, np.ndarray] | None = None,
    ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray | None]:
        """The score's terms, each scaled (:meth:`combine_scores`): one per score layer, one
        per contrast layer (``"fused"``) followed by one per :meth:`mahalanobis_layers`, and
        the energy term (None without one)."""
        dist = [per_layer[layer] / self.score_scales.get(layer, 1.0) for layer in self.score_layers]
        con: list[np.ndarray] = []
        if self.score == "fused" and self.contrast_layers:
            if contrast is None:
                raise ConfigError(
                    f"score='fused' needs the contrast terms of {self.contrast_layers}"
                )
            con = [
                contrast[layer] / self.contrast_scales.get(layer, 1.0)
                for layer in self.contrast_layers
            ]
        relative = self.mahalanobis_layers()
        if relative:
            if mahalanobis is None or any(layer not in mahalanobis for layer in relative):
                raise ConfigError(
                    f"this monitor's score needs the relative Mahalanobis distances of {relative}"
                )
            con = [*con, *(self.mahalanobis[layer].term(mahalanobis[layer]) for layer in relative)]
        term = None
        if self.has_energy_term():
            if energy is None:
                raise ConfigError("this monitor's score needs the energy of the model's logits")
            assert self.energy_scale is not None and self.energy_center is not None
            with np.errstate(invalid="ignore"):
                term = np.maximum(energy - self.energy_center, 0.0) / self.energy_scale
        return dist, con, term

    def scores(
        self,
        activations: Mapping[str, np.ndarray],
        y_pred: np.ndarray,
        logits: np.ndarray | None = None,
    ) -> np.ndarray:
        """Continuous out-of-box score (higher = more unusual), shape (n_samples,).

        ``logits`` (the model's output for the same inputs) are needed by an energy term.
        """
        dist, contrast = self.distance_terms(activations, y_pred)
        return self.combine_scores(
            dist,
            contrast if self.score == "fused" else None,
            energy=self.energy(logits, len(np.asarray(y_pred))),
            mahalanobis=self.mahalanobis_distances(activations, y_pred),
        )

    def explain(
        self,
        activations: Mapping[str, np.ndarray],
        y_pred: np.ndarray,
        *,
        logits: np.ndarray | None = None,
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None, Reasons]:
        """:meth:`assess` (scores wanted), failing closed, and why each input got its verdict.

        An input whose ``logits`` or monitored activations hold a NaN or an infinity is
        rejected on every layer with reason ``not_finite``. The reasons read what
        :meth:`assess` computed and are worked out for the inputs not accepted only, so
        they cost little beside the verdicts. Returns ``(combined, per_layer, scores,
        reasons)``.
        """
        y_pred = np.asarray(y_pred)
        trace = AssessTrace()
        combined, per, scores = self.assess(activations, y_pred, logits=logits, trace=trace)
        n = len(y_pred)
        broken = self._not_finite(trace.feats, scores, logits, n)
        if broken is not None:
            combined = np.where(broken, REJECT, combined).astype(np.int8)
            per = {layer: np.where(broken, REJECT, v).astype(np.int8) for layer, v in per.items()}
        layout = self._reason_layout()
        reasons = Reasons(
            _filled(n, FAMILIAR, np.int8),
            _filled(n, -1, np.int16),
            _filled(n, -1, np.int64),
            layout.names,
        )
        rows = np.flatnonzero(combined != ACCEPT)
        if broken is not None:
            rows = rows[~broken[rows]]
            reasons.codes[broken] = NOT_FINITE
        if len(rows) and self._native_reasons_fit(trace, layout):
            _kernel.reasons_rows(
                trace.terms,
                rows,
                combined,
                np.ascontiguousarray(y_pred, dtype=np.int64),
                layout.weight,
                layout.kinds,
                layout.term_at,
                layout.score_at,
                trace.peaked,
                layout.nearest,
                layout.n_con,
                LOW_CONFIDENCE,
                OUTSIDE_BOXES,
                reasons.codes,
                reasons.layer,
                reasons.nearest,
            )
            if layout.nearest is None:  # the runner-up logit, or several classes a term
                contrast = trace.terms[layout.n_dist : layout.n_dist + layout.n_con][:, rows]
                reasons.nearest[rows] = self._nearest_classes(
                    rows, y_pred[rows], np.fmax(contrast, 0.0), trace, logits, layout
                )
        elif len(rows):
            why = self._why(rows, combined[rows], y_pred[rows], per, trace, logits, layout)
            reasons.codes[rows], reasons.layer[rows], reasons.nearest[rows] = why
        return combined, per, scores, reasons

    def _native_reasons_fit(self, trace: AssessTrace, layout: _ReasonLayout) -> bool:
        """Whether the native kernel works out the reasons (:meth:`_why`'s, the same values;
        the nearest class too where each class's contrast terms measure against one other):
        a calibrated monitor with a score, and uncertainty not from bad boxes."""
        return (
            _kernel is not None
            and self.combine == "calibrated"
            and self.uncertainty != "bad-box"
            and len(trace.terms) > 0
        )

    def _reason_layout(self) -> _ReasonLayout:
        """This monitor's :class:`_ReasonLayout`, built on first use and cached per setting."""
        key = (
            tuple(self.layers),
            tuple(self.score_layers),
            tuple(self.contrast_layers),
            self.score,
            self.score_mean,
            self.has_energy_term(),
            tuple(self.mahalanobis_layers()),
            self.contrast_classes,
            self.contrast_candidates,
        )
        if key in self._layouts:
            return self._layouts[key]
        names = tuple(dict.fromkeys([*self.layers, *self.score_layers, *self.contrast_layers]))
        at = {name: i for i, name in enumerate(names)}
        contrast = self.contrast_layers if self.score == "fused" else []
        n_dist, n_con = len(self.score_layers), len(contrast)
        relative = self.mahalanobis_layers()
        kinds = [OUTSIDE_BOXES] * n_dist + [BETWEEN_CLASSES] * n_con + [MAHALANOBIS] * len(relative)
        term_at = [at[name] for name in [*self.score_layers, *contrast, *relative]]
        # A term's share of the score, as its value times its weight (terms are >= 0): of
        # the mean square, its square times its count (the weight: the count's root); of the
        # arithmetic score, its value over the number of terms of its kind.
        if self.score_mean == "quadratic":
            weight = [1.0] * len(kinds)
            if self.has_energy_term():
                kinds.append(ENERGY)
                term_at.append(-1)  # the energy points at the farthest layer
                weight.append(float(np.sqrt(ENERGY_TERMS)))
        else:
            weight = [1 / max(n_dist, 1)] * n_dist + [1 / max(n_con, 1)] * n_con
        tables = [self._other_classes_of(name) for name in contrast]
        one = bool(tables) and all(t.shape[1] == 1 for t in tables)
        layout = _ReasonLayout(
            names=names,
            monitored=np.array([at[name] for name in self.layers], dtype=np.int16),
            score_at=np.array([at[name] for name in self.score_layers], dtype=np.int16),
            kinds=np.array(kinds, dtype=np.int8),
            term_at=np.array(term_at, dtype=np.int16),
            weight=np.array(weight).reshape(-1, 1),
            n_dist=n_dist,
            n_con=n_con,
            nearest=np.stack([t[:, 0] for t in tables]) if one else None,
        )
        self._layouts[key] = layout
        return layout

    def _why(
        self,
        rows: np.ndarray,
        verdicts: np.ndarray,
        y: np.ndarray,
        per: Mapping[str, np.ndarray],
        trace: AssessTrace,
        logits: np.ndarray | None,
        layout: _ReasonLayout,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Reason codes, layers (index into ``layout.names``) and nearest other classes of
        the inputs ``rows`` of the batch, with their ``verdicts`` and predicted classes ``y``.

        Assumes valid input: ``rows`` are neither accepted nor ``not_finite``.
        """
        uncertain = verdicts == UNCERTAIN
        if len(trace.terms):  # scored: a NaN term (no box on either side) decides nothing
            terms = np.fmax(trace.terms[:, rows], 0.0)
            layer = layout.score_at[terms[: layout.n_dist].argmax(axis=0)]  # the farthest
        else:
            terms = np.zeros((0, len(rows)))
            layer = np.full(len(rows), -1, dtype=np.int16)
        farthest = layer
        if self.combine == "calibrated":
            top = (terms * layout.weight).argmax(axis=0)  # the term with the largest share
            chosen = layout.term_at[top]
            held = None
            if self.uncertainty == "bad-box":
                held = np.stack([trace.in_bad[name][rows] for name in self.layers])
            code = np.where(
                uncertain, BAD_BOX if held is not None else LOW_CONFIDENCE, layout.kinds[top]
            )
            layer = np.where(uncertain | (chosen < 0), layer, chosen)
            if trace.peaked is not None:  # one layer's distance made the score: that layer
                peaked = trace.peaked[rows] & ~uncertain
                code = np.where(peaked, OUTSIDE_BOXES, code)
                layer = np.where(peaked, farthest, layer)
            if held is not None:
                first = uncertain & held.any(axis=0)
                layer[first] = layout.monitored[held.argmax(axis=0)[first]]
        else:  # a rule over the layer verdicts: the first layer that made the verdict
            v = np.stack([per[name][rows] for name in self.layers])
            in_bad = uncertain & (v == UNCERTAIN).any(axis=0)
            code = np.where(in_bad, BAD_BOX, OUTSIDE_BOXES).astype(np.int8)
            first = np.where(in_bad, (v == UNCERTAIN).argmax(axis=0), (v == REJECT).argmax(axis=0))
            layer = layout.monitored[first]
        contrast = terms[layout.n_dist : layout.n_dist + layout.n_con]
        return code, layer, self._nearest_classes(rows, y, contrast, trace, logits, layout)

    def _nearest_classes(
        self,
        rows: np.ndarray,
        y: np.ndarray,
        contrast: np.ndarray,
        trace: AssessTrace,
        logits: np.ndarray | None,
        layout: _ReasonLayout,
    ) -> np.ndarray:
        """The nearest other class of each input ``rows`` (predicted ``y``): where the score
        has contrast terms (``contrast``, scaled, shape (n_contrast_layers, len(rows))), the
        nearest of the classes the contrast layer with the largest term measures against;
        else the runner-up of ``logits``; else -1."""
        if len(contrast):
            pick = contrast.argmax(axis=0)
            if layout.nearest is not None:  # one class per class (the default): a lookup
                return layout.nearest[pick, y]
            nearest = np.empty(len(rows), dtype=np.int64)
            for j, name in enumerate(self.contrast_layers):
                sel = np.flatnonzero(pick == j)
                nearest[sel] = self._nearest_other(name, trace.feats[name], rows[sel], y[sel])
            return nearest
        if logits is not None:
            z = np.array(np.asarray(logits).reshape(len(logits), -1)[rows], dtype=np.float64)
            if z.shape[1] > 1 and z.shape[1] > y.max():
                z[np.arange(len(rows)), y] = -np.inf
                return z.argmax(axis=1)
        return np.full(len(rows), -1, dtype=np.int64)

    def _nearest_other(
        self, layer: str, feats: np.ndarray, rows: np.ndarray, y: np.ndarray
    ) -> np.ndarray:
        """Of the classes whose boxes :meth:`other_boxes` gives class ``y[i]``, the one with a
        box nearest ``feats[rows[i]]`` (normalised features); -1 where there is none.

        One distance per candidate class: what the contrast term's own search costs.
        """
        cand = self._other_classes_of(layer)[y]
        i, k = np.nonzero(cand >= 0)
        d = np.full(cand.shape, np.inf)
        d[i, k] = self.good[layer].distance(feats[rows[i]], cand[i, k])
        return cand[np.arange(len(y)), d.argmin(axis=1)]

    def _other_classes_of(self, layer: str) -> np.ndarray:
        """:func:`complement_classes` of the layer's good boxes (the classes of
        :meth:`other_boxes`), built on first use and cached."""
        key = (layer, self.contrast_classes, self.contrast_candidates)
        if key not in self._other_classes:
            rows = self._complement_rows(layer)
            self._other_classes[key] = _classes_from_rows(self.good[layer], rows)
        return self._other_classes[key]

    def _not_finite(
        self,
        feats: Mapping[str, np.ndarray],
        scores: np.ndarray | None,
        logits: np.ndarray | None,
        n: int,
    ) -> np.ndarray | None:
        """Rows whose logits or monitored features are not finite (None: no such row).

        A non-finite feature makes the score non-finite, so the features of score and
        contrast layers are read only on rows whose score is not finite; a finite sum shows
        that every value is (one cheap look for the usual batch).
        """
        z = None if logits is None else np.asarray(logits).reshape(n, -1)
        scored: set[str] = set()
        if scores is not None:
            scored = {*self.score_layers, *(self.contrast_layers if self.score == "fused" else [])}
        unscored = [x for layer, x in feats.items() if layer not in scored]
        suspect = None
        if scores is not None and not math.isfinite(float(np.asarray(scores).sum())):
            suspect = np.flatnonzero(~np.isfinite(scores))
        if suspect is None and not unscored and (z is None or math.isfinite(float(z.sum()))):
            return None
        bad = np.zeros(n, dtype=bool) if z is None else ~np.isfinite(z).all(axis=1)
        for x in unscored:
            bad |= ~np.isfinite(x).all(axis=1)
        if suspect is not None:
            for layer in scored:
                bad[suspect] |= ~np.isfinite(feats[layer][suspect]).all(axis=1)
        return bad if bad.any() else None

    def decide(self, scores: np.ndarray) -> np.ndarray:
        """Accept (``True``) where the score is finite and at most the calibrated threshold."""
        if self.threshold is None:
            raise ConfigError("the monitor has no threshold: calibrate it first")
        scores = np.asarray(scores)
        return np.isfinite(scores) & (scores <= self.threshold)

    def to_members(self, prefix: str = BOXES_PREFIX) -> dict[str, Any]:
        """Artifact members ``{prefix}.json`` (structure) and ``{prefix}.npz`` (boxes)."""
        arrays: dict[str, np.ndarray] = {}
        for i, layer in enumerate(self.layers):
            arrays.update(self.good[layer].to_arrays(f"L{i}.good"))
            arrays.update(self.bad[layer].to_arrays(f"L{i}.bad"))
        fused = self.score == "fused"
        confident = self.combine == "calibrated" and self.uncertainty == "confidence"
        v5 = self.uncertainty == "error-model"
        v8 = v5 and self.error_model is not None and self.error_model.class_shift is not None
        relative = self.mahalanobis_layers()
        v9 = bool(relative)
        v7 = self.peak_factor is not None
        v6 = self._restricts_contrast()
        v4 = v5 or self.has_energy_term()
        v3 = v9 or v8 or v7 or v6 or v4 or confident or self.score_mean != "arithmetic"
        ladder = ((9, v9), (8, v8), (7, v7), (6, v6), (5, v5), (4, v4), (3, v3), (2, fused))
        version = next((v for v, needed in ladder if needed), 1)
        spec = {
            "format": FORMAT,
            "version": version,
            "layers": list(self.layers),
            "n_classes": int(self.n_classes),
            "normalize": self.normalize,
            "combine": self.combine,
            "score_layers": list(self.score_layers),
            "score_scales": {k: float(v) for k, v in self.score_scales.items()},
            "threshold": None if self.threshold is None else float(self.threshold),
            "verdicts": list(VERDICT_NAMES),
            "meta": self.meta,
        }
        if fused:
            spec.update(
                score=self.score,
                contrast_layers=list(self.contrast_layers),
                contrast_classes=int(self.contrast_classes),
                contrast_scales={k: float(v) for k, v in self.contrast_scales.items()},
            )
        if v3:
            spec.update(
                score_mean=self.score_mean,
                uncertainty=self.uncertainty,
                confidence_floor=None
                if self.confidence_floor is None
                else float(self.confidence_floor),
                output=self.output,
            )
        if self.has_energy_term():
            assert self.energy_center is not None and self.energy_scale is not None
            spec.update(
                energy_center=float(self.energy_center), energy_scale=float(self.energy_scale)
            )
        if v6 or v7:
            spec.update(contrast_candidates=int(self.contrast_candidates))
        if v7:
            assert self.peak_factor is not None
            spec.update(peak_factor=float(self.peak_factor))
        if v5:
            if self.error_model is None:
                raise ConfigError("uncertainty='error-model' needs an error model: calibrate first")
            spec.update(error_model=self.error_model.as_dict())
        if v9:
            terms = []
            for j, layer in enumerate(relative):
                term = self.mahalanobis[layer]
                assert term.center is not None and term.scale is not None  # calibrated
                terms.append(
                    {"layer": layer, "center": float(term.center), "scale": float(term.scale)}
                )
                arrays.update(term.to_arrays(f"M{j}"))
            spec.update(mahalanobis=terms)
        return {f"{prefix}.json": spec, f"{prefix}.npz": arrays}

    @classmethod
    def from_members(
        cls,
        json_member: Callable[[str], Any] | Mapping[str, Any],
        arrays_member: Callable[[str], Mapping[str, np.ndarray]] | Mapping[str, Any],
        prefix: str = BOXES_PREFIX,
    ) -> BoxRuntime:
        """Rebuild from :meth:`to_members` output, or from an artifact's ``.json`` / ``.arrays``.

        Parameters
        ----------
        json_member, arrays_member
            Either callables such as ``artifact.json`` / ``artifact.arrays`` or a mapping of
            member name to value (e.g. the dict :meth:`to_members` returned).
        """
        jname, aname = f"{prefix}.json", f"{prefix}.npz"
        spec = json_member(jname) if callable(json_member) else json_member[jname]
        arrays = arrays_member(aname) if callable(arrays_member) else arrays_member[aname]
        try:
            if (
                not isinstance(spec, dict)
                or spec.get("format") != FORMAT
                or spec.get("version") not in FORMAT_VERSIONS
            ):
                raise ArtifactError(f"{jname}: not a {FORMAT} member of version {FORMAT_VERSIONS}")
            layers = list(spec["layers"])
            good = {
                layer: BoxSet.from_arrays(arrays, f"L{i}.good") for i, layer in enumerate(layers)
            }
            bad = {layer: BoxSet.from_arrays(arrays, f"L{i}.bad") for i, layer in enumerate(layers)}
            n_classes = int(spec["n_classes"])
            score = spec.get("score", "distance") if spec["version"] >= 2 else "distance"
            contrast_layers = list(spec.get("contrast_layers", [])) if score == "fused" else []
            if score not in SCORES or any(layer not in layers for layer in contrast_layers):
                raise ArtifactError(
                    f"{jname}: score {score!r} / contrast layers {contrast_layers} "
                    f"do not fit the monitored layers {layers}"
                )
            if any(b.n_classes != n_classes for b in [*good.values(), *bad.values()]):
                raise ArtifactError(f"{aname}: box sets disagree with n_classes={n_classes}")
            v3 = spec["version"] >= 3
            uncertainty = spec.get("uncertainty", "bad-box") if v3 else "bad-box"
            output = spec.get("output", "logits") if v3 else "logits"
            floor = spec.get("confidence_floor") if v3 else None
            score_mean = spec.get("score_mean", "arithmetic") if v3 else "arithmetic"
            if (
                score_mean not in SCORE_MEANS
                or uncertainty not in UNCERTAINTY_RULES
                or output not in MODEL_OUTPUTS
                or not (floor is None or (isinstance(floor, float | int) and np.isfinite(floor)))
            ):
                raise ArtifactError(
                    f"{jname}: score_mean {score_mean!r} / uncertainty {uncertainty!r} / "
                    f"output {output!r} / confidence_floor {floor!r} is not a rule this "
                    "agent knows"
                )
            center = spec.get("energy_center") if spec["version"] >= 4 else None
            scale = spec.get("energy_scale") if spec["version"] >= 4 else None
            energy = spec["version"] == 4 or center is not None or scale is not None
            candidates = spec.get("contrast_candidates", 0) if spec["version"] >= 6 else 0
            if not isinstance(candidates, int) or isinstance(candidates, bool) or candidates < 0:
                raise ArtifactError(
                    f"{jname}: contrast_candidates {candidates!r} should be an int >= 0"
                )
            version = spec["version"]
            peak = spec.get("peak_factor") if version >= 7 else None
            if (version == 7 or peak is not None) and not (_finite_number(peak) and peak > 0):
                raise ArtifactError(f"{jname}: peak_factor {peak!r} should be a number > 0")
            if (uncertainty == "error-model" and version < 5) or (
                version in (5, 8) and uncertainty != "error-model"
            ):
                raise ArtifactError(
                    f"{jname}: uncertainty {uncertainty!r} does not fit version {spec['version']}"
                )
            error_model = (
                ErrorModel.from_dict(spec["error_model"], jname, n_classes, version)
                if uncertainty == "error-model"
                else None
            )
            score_layers = list(spec["score_layers"])
            mahalanobis = _mahalanobis_terms(
                spec, arrays, jname, aname, score_layers, good, score, score_mean
            )
            if (
                spec["version"] >= 4
                and energy
                and not (_finite_number(center) and _finite_number(scale) and scale > 0)
            ):
                raise ArtifactError(
                    f"{jname}: energy_center {center!r} / energy_scale {scale!r} should be "
                    "finite numbers with a positive scale"
                )
            return cls(
                layers=layers,
                n_classes=n_classes,
                good=good,
                bad=bad,
                normalize=spec["normalize"],
                combine=spec["combine"],
                score_layers=score_layers,
                score_scales={k: float(v) for k, v in spec["score_scales"].items()},
                threshold=spec["threshold"],
                meta=dict(spec.get("meta", {})),
                score=score,
                contrast_layers=contrast_layers,
                contrast_classes=int(spec.get("contrast_classes", 0)),
                contrast_scales={k: float(v) for k, v in spec.get("contrast_scales", {}).items()},
                uncertainty=uncertainty,
                confidence_floor=None if floor is None else float(floor),
                output=output,
                score_mean=score_mean,
                energy_center=None if center is None else float(center),
                energy_scale=None if scale is None else float(scale),
                error_model=error_model,
                contrast_candidates=candidates,
                peak_factor=None if peak is None else float(peak),
                mahalanobis=mahalanobis,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{aname}: malformed box monitor ({exc})") from None


def _mahalanobis_terms(
    spec: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray],
    jname: str,
    aname: str,
    score_layers: list[str],
    good: Mapping[str, BoxSet],
    score: str,
    score_mean: str,
) -> dict[str, RelativeMahalanobis]:
    """The relative Mahalanobis terms of a box monitor member (format 9; none before): one
    per listed score layer of a fused quadratic score, each checked against its layer's
    boxes (classes and features); an :class:`ArtifactError` names what does not fit."""
    if spec["version"] < 9:
        return {}
    listed = spec.get("mahalanobis")
    if not isinstance(listed, list) or not listed:
        raise ArtifactError(f"{jname}: mahalanobis should be a non-empty list of terms")
    if score != "fused" or score_mean != "quadratic":
        raise ArtifactError(
            f"{jname}: relative Mahalanobis terms need score 'fused' with score_mean "
            f"'quadratic', not {score!r} / {score_mean!r}"
        )
    out: dict[str, RelativeMahalanobis] = {}
    for j, entry in enumerate(listed):
        layer = entry.get("layer") if isinstance(entry, dict) else None
        if (
            not isinstance(layer, str)
            or layer not in score_layers
            or layer not in good
            or layer in out
        ):
            raise ArtifactError(
                f"{jname}: mahalanobis[{j}] should name a score layer once; got {layer!r}"
            )
        center, scale = entry.get("center"), entry.get("scale")
        if not (_finite_number(center) and _finite_number(scale) and scale > 0):
            raise ArtifactError(
                f"{jname}: mahalanobis[{j}] center {center!r} / scale {scale!r} should be "
                "finite numbers with a positive scale"
            )
        boxes = good[layer]
        out[layer] = RelativeMahalanobis.from_arrays(
            arrays,
            f"M{j}",
            center=float(center),
            scale=float(scale),
            n_classes=boxes.n_classes,
            n_features=boxes.n_features,
            where=f"{aname}: mahalanobis term of layer {layer!r}",
        )
    return out
