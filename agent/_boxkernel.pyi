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

def top_two(
    z: np.ndarray, c: int, top: np.ndarray, second: np.ndarray, finite: np.ndarray, /
) -> None:
    """Per row of ``z`` (float64, ``c`` values): its largest and second largest value and
    whether all are finite (:func:`boxwatch.agent.boxes._picks`)."""

def fused_score(
    dist: tuple[np.ndarray, ...],
    own: tuple[np.ndarray, ...],
    other: tuple[np.ndarray, ...],
    extra: tuple[np.ndarray, ...],
    scale: np.ndarray,
    center: np.ndarray,
    repeat: np.ndarray,
    peak_factor: float,
    contrast: tuple[np.ndarray, ...],
    terms: np.ndarray,
    score: np.ndarray,
    peaked: np.ndarray | None,
    /,
) -> None:
    """The fused quadratic score from its raw terms
    (:meth:`boxwatch.agent.boxes.BoxRuntime._native_score`)."""

def rmd_rows(
    product: np.ndarray,
    rank: int,
    y: np.ndarray,
    quadratic: np.ndarray,
    offset: np.ndarray,
    out: np.ndarray,
    /,
) -> None:
    """The relative Mahalanobis distance from its projection
    (:meth:`boxwatch.agent.boxes.BoxRuntime.mahalanobis_distances`)."""

def error_args(
    conf: np.ndarray,
    gap: np.ndarray | None,
    scores: np.ndarray,
    contrast: tuple[np.ndarray, ...],
    cap: float,
    a0: np.ndarray,
    a1: np.ndarray,
    a2: np.ndarray,
    a3: np.ndarray | None,
    mean: np.ndarray,
    /,
) -> None:
    """The error model's inputs before their logarithms."""

def standardize(
    cols: tuple[np.ndarray, ...], mean: np.ndarray, scale: np.ndarray, out: np.ndarray, /
) -> None:
    """``out[i, j] = (cols[j][i] - mean[j]) / scale[j]``."""

def logit_tail(
    t: np.ndarray,
    intercept: float,
    shift: np.ndarray | None,
    y: np.ndarray | None,
    out: np.ndarray,
    /,
) -> None:
    """``out = -((t + intercept) + shift[y])``, the error model's exponent."""

def reasons_rows(
    terms: np.ndarray,
    rows: np.ndarray,
    combined: np.ndarray,
    y: np.ndarray,
    weight: np.ndarray,
    kinds: np.ndarray,
    term_at: np.ndarray,
    score_at: np.ndarray,
    peaked: np.ndarray | None,
    nearest: np.ndarray | None,
    n_con: int,
    low_confidence: int,
    outside_boxes: int,
    codes: np.ndarray,
    layer: np.ndarray,
    nearest_out: np.ndarray,
    /,
) -> None:
    """Why the inputs ``rows`` got their verdicts (:meth:`boxwatch.agent.boxes.BoxRuntime.explain`)."""

def simd() -> str:
    """Which lane loops run: ``"avx512"``, ``"avx2"`` or ``"baseline"``."""

def set_simd(name: str, /) -> str:
    """Run the ``"avx512"``, ``"avx2"`` or ``"baseline"`` lane loops; returns the previous
    name."""
