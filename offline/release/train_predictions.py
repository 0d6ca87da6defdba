"""The training set's predicted classes, kept in the artifact so a refit need not recompute them.

A refit re-clusters a class on the training rows the model *predicts* as that class, so
finding them took a pass of the whole training set through the model. The build has those
predictions already; it stores them as :data:`~boxwatch.agent.members.TRAIN_PREDICTIONS`:

* ``pred`` -- each training row's predicted class, in row order (the smallest unsigned
  integer type that holds the class indices);
* ``sha256`` -- 32 bytes: :func:`data_digest` of the training set as the build loaded it
  (its inputs and labels).

:func:`stored_predictions` reads them back for the refit, which runs the model on the
affected classes' rows only. The digest is what makes that safe: predictions of other
training data would pick other rows than the model's pass does, so training data other
than the build's are refused.
"""

from __future__ import annotations

import hashlib

import numpy as np

from boxwatch.agent.artifact import Artifact
from boxwatch.agent.errors import ArtifactError, ConfigError
from boxwatch.agent.members import TRAIN_PREDICTIONS

PRED, SHA256 = "pred", "sha256"
# Rows hashed at a time (a strided or memory-mapped set is never copied whole).
_HASH_ROWS = 4096


def data_digest(x: np.ndarray, y: np.ndarray | None) -> bytes:
    """The sha256 of a data set as loaded: each array's dtype, shape and bytes in row order
    (``y`` None: an unlabelled set)."""
    h = hashlib.sha256()
    for name, a in (("x", x), ("y", y)):
        if a is None:
            h.update(f"{name}:none;".encode())
            continue
        a = np.asarray(a)
        h.update(f"{name}:{a.dtype.str}:{list(a.shape)};".encode())
        for s in range(0, len(a), _HASH_ROWS):
            h.update(np.ascontiguousarray(a[s : s + _HASH_ROWS]).data)
    return h.digest()


def predictions_member(
    x: np.ndarray, y: np.ndarray | None, pred: np.ndarray, n_classes: int
) -> dict[str, np.ndarray]:
    """The member's arrays for the training set ``(x, y)`` and its predicted classes ``pred``
    (shape (n_samples,), each in ``[0, n_classes)``)."""
    pred = np.asarray(pred)
    if pred.shape != (len(x),):
        raise ValueError(f"pred of shape {pred.shape} for {len(x)} training rows")
    if len(pred) and (pred.min() < 0 or pred.max() >= n_classes):
        raise ValueError(f"predicted classes outside [0, {n_classes})")
    return {
        PRED: pred.astype(np.min_scalar_type(max(n_classes - 1, 0))),
        SHA256: np.frombuffer(data_digest(x, y), dtype=np.uint8).copy(),
    }


def stored_predictions(
    art: Artifact, x: np.ndarray, y: np.ndarray | None, n_classes: int
) -> np.ndarray | None:
    """Each training row's predicted class as the build stored it (int64, shape
    (n_samples,)), for the training set ``(x, y)`` loaded now; None when the artifact holds
    none (built before they were stored).

    Raises :class:`ArtifactError` when the member is not this format (or not of
    ``n_classes`` classes), :class:`ConfigError` when ``(x, y)`` is not the training set
    the build stored them for.
    """
    if TRAIN_PREDICTIONS not in art.members:
        return None
    arrays = art.arrays(TRAIN_PREDICTIONS)
    pred, digest = arrays.get(PRED), arrays.get(SHA256)
    if (
        pred is None
        or digest is None
        or pred.ndim != 1
        or pred.dtype.kind not in "iu"
        or digest.dtype != np.uint8
        or digest.shape != (32,)
    ):
        raise ArtifactError(
            f"{TRAIN_PREDICTIONS}: not the training rows' predicted classes and the training "
            "set's sha256"
        )
    if len(pred) and (int(pred.min()) < 0 or int(pred.max()) >= n_classes):
        raise ArtifactError(f"{TRAIN_PREDICTIONS}: predicted classes outside [0, {n_classes})")
    here = data_digest(x, y)
    if digest.tobytes() != here:
        raise ConfigError(
            f"data.train: not the training set the parent was built from (sha256 "
            f"{digest.tobytes().hex()[:12]}… in the parent, {here.hex()[:12]}… here); "
            "give the data it was built from"
        )
    if len(pred) != len(x):
        raise ArtifactError(
            f"{TRAIN_PREDICTIONS}: {len(pred)} predicted classes for {len(x)} training rows"
        )
    return pred.astype(np.int64)
