"""The input preprocessing recorded in the artifact, applied identically offline and online."""

from __future__ import annotations

import functools
import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.vocab import INPUT_DTYPES

DTYPES = INPUT_DTYPES


@dataclass(frozen=True)
class Preprocessing:
    """``x -> (x * scale + offset).astype(dtype).reshape(n, *shape)``, fed as ``input_name``."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    scale: float = 1.0
    offset: float = 0.0
    input_name: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"preprocessing dtype {self.dtype!r} is not one of {DTYPES}")
        if not self.shape or any(int(d) < 1 for d in self.shape):
            raise ConfigError(f"preprocessing shape {list(self.shape)} must be positive dims")

    @functools.cached_property
    def size(self) -> int:
        """Number of scalars in one input."""
        return math.prod(int(d) for d in self.shape)

    def apply(self, x: np.ndarray) -> np.ndarray:
        """Shape a batch of raw inputs into the model's input tensor.

        Parameters
        ----------
        x : ndarray of shape (n_samples, ...) with ``prod(...) == prod(shape)``

        Returns
        -------
        ndarray of shape (n_samples, *shape) and dtype ``dtype``
        """
        x = np.asarray(x)
        n = x.shape[0] if x.ndim else 0
        if x.ndim == 0 or x.size != n * self.size:
            raise ValueError(
                f"input of shape {x.shape} does not hold {self.size} values per sample "
                f"(expected shape (n, {', '.join(map(str, self.shape))}))"
            )
        y = x.reshape((n, *self.shape)).astype(np.float64, copy=False)
        if self.scale != 1.0 or self.offset != 0.0:
            y = y * self.scale + self.offset
        return y.astype(self.dtype, copy=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Preprocessing:
        try:
            return cls(
                shape=tuple(int(v) for v in d["shape"]),
                dtype=str(d.get("dtype", "float32")),
                scale=float(d.get("scale", 1.0)),
                offset=float(d.get("offset", 0.0)),
                input_name=d.get("input_name"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"preprocessing {d!r} is invalid ({exc})") from None


# An input is "outside" when a feature leaves the training range by more than this share of
# the whole training range (all features together): measured on the bundled example, 0.35% of
# its validation inputs go past 10% (1.0% past 5%, a never-lit pixel lit once).
RANGE_TOLERANCE = 0.1
# ... or when its highest feature reaches less than this share of the lowest peak a training
# input reached (inputs at the wrong scale: [0, 1] floats sent to a model that divides by 255).
PEAK_SHARE = 0.5


@dataclass(frozen=True)
class InputRange:
    """Per-feature min/max of the preprocessed training inputs: a cheap wrong-scale check.

    Stored as ``model/spec.json``'s ``input_range`` (absent in older artifacts: no check).
    :meth:`outside` flags a preprocessed input when a feature lies beyond
    ``[min - t, max + t]`` (``t`` = :data:`RANGE_TOLERANCE` of the overall training range), or
    when even its highest feature, as a share of that feature's training range, stays below
    :data:`PEAK_SHARE` of the lowest such peak among training inputs (``peak_min``): every
    feature near its training minimum, as when inputs arrive already scaled.
    """

    min: np.ndarray
    max: np.ndarray
    peak_min: float | None = None

    @classmethod
    def fit(cls, x: np.ndarray) -> InputRange:
        """The range of preprocessed training inputs ``x`` of shape (n_samples, ...)."""
        flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
        finite = np.isfinite(flat).all(axis=1)
        flat = flat[finite] if finite.any() else np.zeros((1, flat.shape[1]))
        rng = cls(flat.min(axis=0), flat.max(axis=0))
        peaks = rng._peaks(flat)
        return cls(rng.min, rng.max, None if peaks is None else float(peaks.min()))

    def _peaks(self, flat: np.ndarray) -> np.ndarray | None:
        span = self.max - self.min
        live = span > 0
        if not live.any():
            return None
        return ((flat[:, live] - self.min[live]) / span[live]).max(axis=1)

    def outside(self, x: np.ndarray) -> np.ndarray:
        """Boolean (n_samples,): which preprocessed inputs fall outside the training range.

        Non-finite inputs count as outside.
        """
        flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
        if flat.shape[1] != self.min.size:
            return np.ones(len(flat), dtype=bool)
        tol = RANGE_TOLERANCE * float(self.max.max() - self.min.min())
        with np.errstate(invalid="ignore"):
            out = np.asarray(((flat < self.min - tol) | (flat > self.max + tol)).any(axis=1))
            out |= ~np.isfinite(flat).all(axis=1)
            peaks = self._peaks(flat) if self.peak_min else None
            if peaks is not None and self.peak_min:
                out |= peaks < PEAK_SHARE * self.peak_min
        return np.asarray(out, dtype=bool)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"min": self.min.tolist(), "max": self.max.tolist()}
        if self.peak_min is not None:
            d["peak_min"] = self.peak_min
        return d

    @classmethod
    def from_dict(cls, d: Any, size: int) -> InputRange:
        """Read ``input_range``; :class:`ArtifactError`-worthy problems raise ConfigError."""
        try:
            lo = np.asarray(d["min"], dtype=np.float64)
            hi = np.asarray(d["max"], dtype=np.float64)
            peak = d.get("peak_min")
            peak = None if peak is None else float(peak)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"input_range is invalid ({exc})") from None
        if (
            lo.shape != (size,)
            or hi.shape != (size,)
            or not (np.isfinite(lo).all() and np.isfinite(hi).all())
        ):
            raise ConfigError(f"input_range must hold {size} finite min and max values")
        return cls(lo, hi, peak)


# Honest unknown inputs fall outside the training range now and then (3% of the bundled
# demo's mixed stream); inputs at the wrong scale or in the wrong units make most of a stream
# fall outside. The agent warns only when more than RANGE_WARN_SHARE of the last
# RANGE_WINDOW inputs (whole batches) did, once it has seen RANGE_MIN_INPUTS.
RANGE_WINDOW = 1000
RANGE_WARN_SHARE = 0.2
RANGE_MIN_INPUTS = 100


@dataclass
class RangeWindow:
    """How many of the last ``size`` model inputs (whole batches) fell outside the training
    range: the share the agent's wrong-scale warning and status page read."""

    size: int = RANGE_WINDOW
    _batches: deque[tuple[int, int]] = field(default_factory=deque)
    _outside: int = 0
    _inputs: int = 0

    def add(self, outside: int, inputs: int) -> None:
        """Count a batch of ``inputs`` checked inputs, ``outside`` of them out of range;
        the oldest batches leave once the rest still hold ``size`` inputs."""
        self._batches.append((outside, inputs))
        self._outside += outside
        self._inputs += inputs
        while self._inputs - self._batches[0][1] >= self.size:
            old_out, old_n = self._batches.popleft()
            self._outside -= old_out
            self._inputs -= old_n

    @property
    def inputs(self) -> int:
        """Inputs the share is over (``size`` or a little more, once the window is full)."""
        return self._inputs

    @property
    def share(self) -> float:
        """Share of the window's inputs outside the training range (0 when empty)."""
        inputs = self._inputs  # read once: the loop thread may be adding a batch
        return min(self._outside / inputs, 1.0) if inputs else 0.0

    @property
    def alarming(self) -> bool:
        """More than :data:`RANGE_WARN_SHARE` outside, over at least
        :data:`RANGE_MIN_INPUTS` inputs: the wrong scale or units, rather than unknowns."""
        return self._inputs >= RANGE_MIN_INPUTS and self.share > RANGE_WARN_SHARE
