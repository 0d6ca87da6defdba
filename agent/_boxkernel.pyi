"""Types of the optional native box kernel (``agent/_boxkernel.c``), for the type checker.

The kernel checks every size it reads (a ValueError otherwise); :mod:`boxwatch.agent.boxes`
passes C-contiguous arrays of the dtypes the C code reads, and the results are written into
the arrays it passes.
"""

import numpy as np

LANES: int

def contains(
    x: np.ndarray,
    y: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    offsets: np.ndarray,
    d: int,
    out: np.ndarray,
    where: np.ndarray = ...,
    /,
) -> None:
    """``out[i] = 1`` when ``x[i]`` lies in a box of class ``y[i]`` (and ``where[i]``)."""

def layer_pass(
    x: np.ndarray,
    y: np.ndarray,
    d: int,
    good: tuple[np.ndarray, ...],
    bad: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    other: tuple[np.ndarray, ...] | None,
    ocls: np.ndarray | None,
    every_row: bool,
    inside: np.ndarray,
    in_bad: np.ndarray | None,
    verdict: np.ndarray | None,
    d_own: np.ndarray | None,
    d_other: np.ndarray | None,
    /,
) -> None:
    """One layer's box work (:meth:`boxwatch.agent.boxes.BoxSet.assess_layer`): membership
    in the good and bad boxes, Algorithm 3's verdicts and the distances."""

def l2_rows(x: np.ndarray, d: int, out: np.ndarray, /) -> None:
    """``out``: each row of ``x`` (float32, ``d`` features) over its Euclidean norm
    (:func:`boxwatch.agent.boxes.normalize_features`)."""

def simd() -> str:
    """Which lane loops run: ``"avx2"`` or ``"baseline"``."""

def set_simd(name: str, /) -> str:
    """Run the ``"avx2"`` or ``"baseline"`` lane loops; returns the previous name."""
