"""The input preprocessing recorded in the artifact, applied identically offline and online."""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
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
