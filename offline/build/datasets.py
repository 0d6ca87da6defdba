"""Labelled input sets for the builder: ``.npz``, IDX (MNIST layout, optionally gzipped), CSV.

Every loader returns ``(x, y)`` with ``x`` of shape (n_samples, ...) and ``y`` int64 labels
of shape (n_samples,) or ``None`` (unknown sets need no labels). Problems name the data set.
"""

from __future__ import annotations

import csv
import gzip
import struct
import zipfile
from pathlib import Path

import numpy as np
from numpy.typing import DTypeLike

from boxwatch.agent.errors import ConfigError

_IDX_DTYPES: dict[int, DTypeLike] = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def infer_format(path: Path) -> str:
    """Format from the file name: ``.npz``, ``.csv``, else IDX (``*-ubyte[.gz]``, ``.idx``)."""
    name = path.name.lower()
    if name.endswith(".npz"):
        return "npz"
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    return "idx"


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (magic 0x0000TTDD, big-endian dims, raw data), gzipped or not."""
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError) as exc:
        raise ValueError(f"cannot read IDX data ({exc})") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError("not an IDX file (bad magic number)")
    ndim = data[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise ValueError("truncated IDX header")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(data) - header != expected:
        raise ValueError(f"IDX body has {len(data) - header} bytes, dims {dims} need {expected}")
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)


def load_dataset(
    spec: dict, *, resolve, name: str, labelled: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """Load one ``data.<name>`` entry of the build config (see docs/build-config.md)."""
    path = resolve(spec["path"])
    where = f"data.{name} ({path})"
    if not path.is_file():
        raise ConfigError(f"{where}: no such file")
    fmt = spec.get("format") or infer_format(path)
    try:
        if fmt == "npz":
            x, y = _load_npz(path, spec.get("x", "x"), spec.get("y", "y"), labelled)
        elif fmt == "idx":
            x = read_idx(path)
            labels = spec.get("labels")
            if labels is None and labelled:
                raise ValueError("IDX images need 'labels: PATH' with the label file")
            y = read_idx(resolve(labels)) if labels else None
        else:
            x, y = _load_csv(path, spec.get("y", "label"), labelled)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    x = np.asarray(x)
    if y is not None:
        y = np.asarray(y)
        if y.ndim != 1 or y.dtype.kind not in "iu":
            raise ConfigError(f"{where}: labels must be a 1-d integer array, got {y.dtype} {y.shape}")
        if len(y) != len(x):
            raise ConfigError(f"{where}: {len(x)} inputs but {len(y)} labels")
        y = y.astype(np.int64)
    if "limit" in spec:
        x = x[: spec["limit"]]
        y = None if y is None else y[: spec["limit"]]
    if len(x) == 0:
        raise ConfigError(f"{where}: holds no inputs")
    return x, y


def _load_npz(path: Path, xkey: str, ykey: str, labelled: bool):
    try:
        with np.load(path, allow_pickle=False) as npz:
            files = set(npz.files)
            if xkey not in files:
                raise ValueError(f"no array {xkey!r} (has {sorted(files)})")
            if labelled and ykey not in files:
                raise ValueError(f"no label array {ykey!r} (has {sorted(files)})")
            return npz[xkey], (npz[ykey] if ykey in files else None)
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"not a readable .npz ({exc})") from None


def _load_csv(path: Path, label_column: str, labelled: bool):
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        raise ValueError("empty CSV")
    header, body = rows[0], rows[1:]
    if label_column in header:
        li = header.index(label_column)
    elif labelled:
        raise ValueError(f"no label column {label_column!r} in the header {header}")
    else:
        li = None
    try:
        table = np.array(body, dtype=np.float64)
    except ValueError:
        raise ValueError("non-numeric cell in the CSV body") from None
    if li is None:
        return table.astype(np.float32), None
    x = np.delete(table, li, axis=1).astype(np.float32)
    y = table[:, li]
    if not np.all(y == np.round(y)):
        raise ValueError(f"label column {label_column!r} holds non-integer values")
    return x, y.astype(np.int64)
