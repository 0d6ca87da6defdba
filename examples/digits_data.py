"""Write the example's data sets from scikit-learn's bundled digits (no download needed).

* ``train.npz`` / ``validation.npz``: known digits 0-7 (the model's own 60/20 split), x, y;
* ``unknown.npz``: half of the digits 8 and 9 plus uniform noise images, x only -- the
  unknown inputs that measure the false-accept rate (and choose tau with ``selection: f1``);
* ``unknown_digits.npz`` / ``unknown_noise.npz``: the same inputs by kind (near: digits
  8-9; far: noise), shown separately at the report's operating point;
* ``stream.npz``: what the demo streams: held-out known digits (``x_known``, ``y_known``),
  the other half of the 8s and 9s and fresh noise (``x_unknown``).

Pixels stay raw (0..16); the artifact's preprocessing scales them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits

KNOWN_CLASSES = 8
SEED = 0


def split_indices(n: int, seed: int = SEED) -> dict[str, np.ndarray]:
    """The model's deterministic 60/20/20 split (same as train_model.py)."""
    order = np.random.default_rng(seed).permutation(n)
    a, b = int(0.6 * n), int(0.8 * n)
    return {"train": order[:a], "validation": order[a:b], "test": order[b:]}


def make_sets(seed: int = SEED) -> dict[str, dict[str, np.ndarray]]:
    """All four sets as arrays (float32 pixels 0..16, int64 labels)."""
    digits = load_digits()
    x = digits.data.astype(np.float32)
    y = digits.target.astype(np.int64)
    known = y < KNOWN_CLASSES
    xk, yk = x[known], y[known]
    idx = split_indices(len(yk), seed)
    rng = np.random.default_rng(seed + 1)
    xu = x[~known][rng.permutation(int((~known).sum()))]
    half = len(xu) // 2
    noise = rng.integers(0, 17, size=(2 * 100, 64)).astype(np.float32)
    return {
        "train": {"x": xk[idx["train"]], "y": yk[idx["train"]]},
        "validation": {"x": xk[idx["validation"]], "y": yk[idx["validation"]]},
        "unknown": {"x": np.concatenate([xu[:half], noise[:100]])},
        # The same unknown inputs by kind, for the report's operating point only.
        "unknown_digits": {"x": xu[:half]},
        "unknown_noise": {"x": noise[:100]},
        "stream": {
            "x_known": xk[idx["test"]],
            "y_known": yk[idx["test"]],
            "x_unknown": np.concatenate([xu[half:], noise[100:]]),
        },
    }


def write_datasets(out_dir: str | Path, seed: int = SEED) -> dict[str, Path]:
    """Write the ``.npz`` files into ``out_dir``; return their paths by set name."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, arrays in make_sets(seed).items():
        paths[name] = out / f"{name}.npz"
        np.savez(paths[name], **arrays)  # type: ignore[arg-type]  # numpy types **kwds as allow_pickle
    return paths


if __name__ == "__main__":
    for name, path in write_datasets(sys.argv[1] if len(sys.argv) > 1 else ".").items():
        print(f"{name}: {path}")
