"""The relative Mahalanobis term of the fused score, numpy only (Ren et al. 2021).

For the predicted class ``k`` of an input ``x`` at one layer,
``RMD_k(x) = (x - mu_k)' P (x - mu_k) - (x - mu_0)' P_0 (x - mu_0)``: its Mahalanobis distance
to the class mean (``P`` the shared within-class precision) less its distance to the mean
of all training inputs (``P_0`` their precision). Subtracting the background distance
removes the directions in which every input is far, so what is left measures how unlike
*its predicted class* an input is: what tells a near unknown (an unseen class that resembles
a known one) from a known input.

``P - P_0`` has rank at most ``n_classes - 1`` (the total covariance is the within-class one
plus a between-class part of that rank, with one ridge on both), so the term is held as a
quadratic form in that many directions (the builder keeps at most 128) plus one linear term
per class: O(n_features * n_classes) per input, like one more output layer, never an
``n_features``-squared product.
This module owns the term's arrays in the artifact; the builder fits them
(``boxwatch.offline.monitors.baselines.relative_mahalanobis``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from boxwatch.agent.errors import ArtifactError

# The largest layer (features per input) the builder fits a term for: the within-class
# covariance needs more training rows than features to mean anything, and its fit a
# features-squared matrix per layer.
MAX_FEATURES = 1024
# Up to this many classes one product per batch gives the quadratic and the linear terms of
# every class (n_features x (rank + n_classes)); past it the linear term is a dot product
# with the predicted class's row only (measured: 1.3x faster at 100 classes, 2.5x at 1,000).
FUSED_CLASSES = 64


@dataclass(frozen=True)
class RelativeMahalanobis:
    """One layer's relative Mahalanobis distance, and its scaling into a score term.

    Attributes
    ----------
    mean : ndarray of shape (n_features,), float64
        ``mu_0``, the mean of the training inputs' features.
    directions : ndarray of shape (n_features, rank), float64
        ``F`` with ``P - P_0 = F F'`` (rank at most ``min(n_features, n_classes - 1)``;
        the builder keeps at most 128 directions, those of largest weight).
    linear : ndarray of shape (n_classes, n_features), float64
        ``P (mu_k - mu_0)`` per class.
    offset : ndarray of shape (n_classes,), float64
        ``(mu_k - mu_0)' P (mu_k - mu_0)`` per class.
    center, scale : float or None
        Set by calibration: the term is ``max(0, RMD - center) / scale`` (the median and the
        ``target_acceptance`` quantile minus the median on the calibration population, as
        the energy term's); None: not calibrated, no term.
    """

    mean: np.ndarray
    directions: np.ndarray
    linear: np.ndarray
    offset: np.ndarray
    center: float | None = None
    scale: float | None = None

    def __post_init__(self) -> None:
        arrays = {
            "mean": np.asarray(self.mean, np.float64),
            "directions": np.asarray(self.directions, np.float64),
            "linear": np.asarray(self.linear, np.float64),
            "offset": np.asarray(self.offset, np.float64),
        }
        d = arrays["mean"].shape[0] if arrays["mean"].ndim == 1 else -1
        shapes_ok = (
            d > 0
            and arrays["directions"].ndim == 2
            and arrays["directions"].shape[0] == d
            and arrays["linear"].ndim == 2
            and arrays["linear"].shape[1] == d
            and arrays["offset"].shape == (arrays["linear"].shape[0],)
        )
        if not shapes_ok:
            raise ValueError(
                "relative Mahalanobis arrays disagree: "
                + ", ".join(f"{k} {v.shape}" for k, v in arrays.items())
            )
        for name, value in arrays.items():
            if not np.isfinite(value).all():
                raise ValueError(f"relative Mahalanobis {name} holds a NaN or an infinity")
            object.__setattr__(self, name, value)
        center, scale = self.center, self.scale
        if (center is not None or scale is not None) and (
            center is None
            or scale is None
            or not (math.isfinite(center) and math.isfinite(scale) and scale > 0)
        ):
            raise ValueError(
                f"relative Mahalanobis center {self.center!r} / scale {self.scale!r} should "
                "be finite numbers with a positive scale"
            )

    @property
    def n_features(self) -> int:
        return int(self.mean.shape[0])

    @property
    def n_classes(self) -> int:
        return int(self.linear.shape[0])

    @property
    def calibrated(self) -> bool:
        """Whether calibration set the term's centre and scale."""
        return self.scale is not None

    @cached_property
    def _projection(self) -> np.ndarray:
        """float32 ``[directions | linear']`` (up to :data:`FUSED_CLASSES` classes: one
        product gives both terms), else ``directions`` alone."""
        if self.fused:
            return np.hstack([self.directions, self.linear.T]).astype(np.float32)
        return self.directions.astype(np.float32)

    @cached_property
    def _projected_mean(self) -> np.ndarray:
        """``mean`` through :attr:`_projection`, float64: subtracted from the product, it
        centres the features on their ``rank + n_classes`` columns rather than all."""
        return self.mean @ self._projection.astype(np.float64)

    @cached_property
    def _linear32(self) -> tuple[np.ndarray, np.ndarray]:
        """float32 ``linear`` and, float64, each class's row times ``mean``."""
        return self.linear.astype(np.float32), self.linear @ self.mean

    @property
    def fused(self) -> bool:
        """Whether one product gives the quadratic and the linear terms (up to
        :data:`FUSED_CLASSES` classes; see :meth:`project`)."""
        return self.n_classes <= FUSED_CLASSES

    def project(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(product, quadratic)`` of inputs ``x`` (n_samples, n_features): their centred
        features through :attr:`_projection` (float64; with :attr:`fused`, the linear term
        of class ``k`` in column ``rank + k``) and the quadratic term, per input. The linear
        term of each input's class and the offset then give :meth:`distance`."""
        return self._project(self._features32(x))

    def _features32(self, x: np.ndarray) -> np.ndarray:
        """``x`` as float32 rows of :attr:`n_features` (a ValueError otherwise)."""
        x = np.asarray(x).reshape(len(x), -1)
        if x.shape[1] != self.n_features:
            raise ValueError(f"{x.shape[1]} features per input, expected {self.n_features}")
        return np.asarray(x, np.float32)

    def _project(self, x32: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`project` of checked float32 rows."""
        rank = self.directions.shape[1]
        with np.errstate(over="ignore", invalid="ignore"):
            product = (x32 @ self._projection).astype(np.float64)
            product -= self._projected_mean
            projected = product[:, :rank]
            return product, np.einsum("ij,ij->i", projected, projected)

    def distance(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``RMD_{y[i]}(x[i])``, shape (n_samples,), float64; ``x`` of shape (n_samples,
        n_features) (the layer's features flattened, before any normalisation), ``y`` the
        predicted classes in ``[0, n_classes)``. A NaN or infinite feature gives NaN or inf.

        The products run in float32, like the box tests (a fifth of the float64 time at
        the sizes of the detection bench; relative differences of about 1e-7).
        """
        x32 = self._features32(x)
        y = np.asarray(y, dtype=np.int64)
        if len(y) != len(x32) or (len(y) and (y.min() < 0 or y.max() >= self.n_classes)):
            raise ValueError(
                f"predicted classes must be {len(x32)} values in [0, {self.n_classes})"
            )
        product, quadratic = self._project(x32)
        rank = self.directions.shape[1]
        with np.errstate(over="ignore", invalid="ignore"):
            if self.fused:
                linear = product[np.arange(len(y)), rank + y]
            else:
                rows, shift = self._linear32
                linear = np.einsum("ij,ij->i", x32, rows[y], dtype=np.float64) - shift[y]
            return np.asarray(quadratic - 2.0 * linear + self.offset[y])

    def term(self, distance: np.ndarray) -> np.ndarray:
        """The scaled term ``max(0, distance - center) / scale`` (NaN stays NaN)."""
        if self.center is None or self.scale is None:
            raise ValueError("the relative Mahalanobis term is not calibrated")
        with np.errstate(invalid="ignore"):
            return np.maximum(np.asarray(distance) - self.center, 0.0) / self.scale

    def calibrated_at(self, center: float | None, scale: float | None) -> RelativeMahalanobis:
        """This term with ``center`` and ``scale`` (both None: uncalibrated)."""
        return replace(self, center=center, scale=scale)

    def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """Numeric arrays for an ``.npz`` member, names prefixed by ``prefix``."""
        return {
            f"{prefix}.mean": self.mean,
            f"{prefix}.directions": self.directions,
            f"{prefix}.linear": self.linear,
            f"{prefix}.offset": self.offset,
        }

    @classmethod
    def from_arrays(
        cls,
        arrays: Mapping[str, np.ndarray],
        prefix: str,
        *,
        center: float,
        scale: float,
        n_classes: int,
        n_features: int,
        where: str,
    ) -> RelativeMahalanobis:
        """Inverse of :meth:`to_arrays`, with the calibrated ``center`` and ``scale``; an
        :class:`ArtifactError` naming ``where`` when the arrays are missing, do not fit
        ``n_classes`` classes of ``n_features`` features or are not finite, or when the
        scale is not positive."""
        names = [f"{prefix}.{k}" for k in ("mean", "directions", "linear", "offset")]
        missing = [n for n in names if n not in arrays]
        if missing:
            raise ArtifactError(f"{where}: missing arrays {missing}")
        try:
            mean, directions, linear, offset = (np.asarray(arrays[n]) for n in names)
            got = cls(mean, directions, linear, offset, center=center, scale=scale)
        except (TypeError, ValueError) as exc:
            raise ArtifactError(f"{where}: {exc}") from None
        if (got.n_classes, got.n_features) != (n_classes, n_features):
            raise ArtifactError(
                f"{where}: {got.n_classes} classes x {got.n_features} features, expected "
                f"{n_classes} x {n_features}"
            )
        return got
