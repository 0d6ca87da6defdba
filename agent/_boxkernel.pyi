"""Types of the optional native box kernel (``agent/_boxkernel.c``), for the type checker.

Both functions check nothing: :mod:`boxwatch.agent.boxes` passes C-contiguous arrays of the
dtypes the C code reads, and the results are written into the arrays it passes.
"""

import numpy as np

def contains(
    x: np.ndarray,
    y: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    offsets: np.ndarray,
    d: int,
    out: np.ndarray,
    /,
) -> None:
    """``out[i] = 1`` when ``x[i]`` lies in a box of class ``y[i]``."""

def distance_contains(
    x: np.ndarray,
    y: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    offsets: np.ndarray,
    d: int,
    inside: np.ndarray,
    dist: np.ndarray,
    /,
) -> None:
    """Membership, and the Euclidean distance to the nearest box of class ``y[i]``."""
