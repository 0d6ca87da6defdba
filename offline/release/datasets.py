"""Labelled input sets for the builder: ``.npz``, IDX (MNIST layout, optionally gzipped), CSV.

Every loader returns ``(x, y)`` with ``x`` of shape (n_samples, ...) and ``y`` int64 labels
of shape (n_samples,) or ``None`` (unknown sets need no labels). Problems name the data set.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np
from numpy.typing import DTypeLike

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import (
    one_line,
    open_regular,
    quote,
    read_bounded,
    read_gzip_bounded,
    show_path,
    size_text,
)
from boxwatch.offline.bn.limits import default_max_memory
from boxwatch.offline.release.records import DatasetSpec

MAX_DIMS = 32
"""Dimensions a data set's array may declare (numpy's own limit is 64)."""

_IDX_DTYPES: dict[int, DTypeLike] = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def infer_format(path: Path) -> str:
    """Format from the file name: ``.npz``, ``.csv``, else IDX (``*-ubyte[.gz]``, ``.idx``)."""
    name = path.name.lower()
    if name.endswith(".npz"):
        return "npz"
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    return "idx"


def data_cap() -> int:
    """Bytes one data set's array may take: a quarter of the memory bound (the build also
    holds the other sets, their activations and the model)."""
    return max(1 << 20, default_max_memory() // 4)


def text_cap() -> int:
    """Bytes a CSV file (or its decompressed stream) may have: parsed cells take tens of
    bytes per byte of text."""
    return max(1 << 20, default_max_memory() // 32)


def _check_array_header(what: str, shape: tuple[int, ...], dtype: np.dtype, cap: int) -> int:
    """Bytes of an array declared by a header, refused before allocating when it cannot be."""
    if dtype.kind not in "biuf" or dtype.fields is not None:
        kind = "complex" if dtype.kind == "c" else "non-numeric"
        raise ValueError(
            f"{what} has dtype {dtype} ({kind}); only real numbers (bool, int, float) are accepted"
        )
    if not 1 <= len(shape) <= MAX_DIMS:
        raise ValueError(f"{what} declares {len(shape)} dimensions (1 to {MAX_DIMS} allowed)")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > cap:
        raise ValueError(
            f"{what} declares shape {shape[:8]}: {nbytes:,} bytes, more than the "
            f"{size_text(cap)} ({cap:,} bytes) a data set may take under the memory limit"
        )
    return nbytes


def _read_exactly(fh: IO[bytes], nbytes: int) -> np.ndarray:
    """``nbytes`` bytes of ``fh`` into a fresh buffer (no intermediate copies)."""
    buf = np.empty(nbytes, dtype=np.uint8)
    view = buf.data
    got = 0
    while got < nbytes:
        n = fh.readinto(view[got:])  # type: ignore[attr-defined]  # files and GzipFile have it
        if not n:
            break
        got += n
    if got != nbytes:
        raise ValueError(f"the data holds {got:,} bytes where the header declares {nbytes:,}")
    return buf


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (magic 0x0000TTDD, big-endian dims, raw data), gzipped or not.

    Streamed: the magic number and the dims are read first, the body's size is checked
    against :func:`data_cap` before a byte of it is decompressed or allocated.
    """
    gz = path.name.endswith(".gz")
    with open_regular(path, what="IDX file") as raw:
        # GzipFile is a binary stream, which typeshed does not say of IO[bytes].
        fh: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw  # type: ignore[assignment]  # see above
        try:
            head = fh.read(4)
            if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in _IDX_DTYPES:
                raise ValueError("not an IDX file (bad magic number)")
            ndim = head[3]
            if ndim == 0:
                raise ValueError("truncated IDX header")
            if ndim > MAX_DIMS:
                raise ValueError(f"the IDX header declares {ndim} dimensions (at most {MAX_DIMS})")
            packed = fh.read(4 * ndim)
            if len(packed) != 4 * ndim:
                raise ValueError("truncated IDX header")
            dims = struct.unpack(f">{ndim}I", packed)
            dtype = np.dtype(_IDX_DTYPES[head[2]])
            nbytes = _check_array_header("the IDX header", dims, dtype, data_cap())
            body = _read_exactly(fh, nbytes)
            if fh.read(1):
                raise ValueError(f"IDX body is longer than the {nbytes:,} bytes dims {dims} need")
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(f"cannot read IDX data ({one_line(str(exc), 200)})") from None
    return body.view(dtype).reshape(dims)


def load_dataset(
    spec: DatasetSpec, *, resolve: Callable[[str], Path], name: str, labelled: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """Load one ``data.<name>`` entry of the build config (see docs/build-config.md)."""
    path = resolve(spec.path)
    where = f"data.{name} ({show_path(path)})"
    if not path.exists():
        raise ConfigError(f"{where}: no such file")
    fmt = spec.format or infer_format(path)
    try:
        if fmt == "npz":
            y_key = "y" if spec.y is None else spec.y
            x, y = _load_npz(path, spec.x, y_key, labelled)
        elif fmt == "idx":
            x = read_idx(path)
            if spec.labels is None and labelled:
                raise ValueError("IDX images need 'labels: PATH' with the label file")
            y = read_idx(resolve(spec.labels)) if spec.labels else None
        else:
            x, y = _load_csv(path, "label" if spec.y is None else spec.y, labelled)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except ConfigError as exc:  # the bounded readers name the file themselves
        raise ConfigError(f"data.{name}: {exc}") from None
    x = np.asarray(x)
    if x.dtype.kind not in "biuf":
        raise ConfigError(f"{where}: inputs of dtype {x.dtype}; only real numbers are accepted")
    if y is not None:
        y = np.asarray(y)
        if y.ndim != 1 or y.dtype.kind not in "iu":
            raise ConfigError(
                f"{where}: labels must be a 1-d integer array, got {y.dtype} {y.shape[:8]}"
            )
        if len(y) != len(x):
            raise ConfigError(f"{where}: {len(x)} inputs but {len(y)} labels")
        y = y.astype(np.int64)
    if spec.limit is not None:
        x = x[: spec.limit]
        y = None if y is None else y[: spec.limit]
    if len(x) == 0:
        raise ConfigError(f"{where}: holds no inputs")
    return x, y


def _load_npz(path: Path, xkey: str, ykey: str, labelled: bool):
    """``x`` (and ``y``) of an ``.npz``: each member's header is checked before allocating."""
    with open_regular(path, what=".npz file") as fh:
        try:
            with zipfile.ZipFile(fh) as zf:
                members = {n[:-4]: n for n in zf.namelist() if n.endswith(".npy")}
                if xkey not in members:
                    raise ValueError(f"no array {quote(xkey)} (has {len(members)} arrays)")
                if labelled and ykey not in members:
                    raise ValueError(f"no label array {quote(ykey)} (has {len(members)} arrays)")
                x = _npz_member(zf, members[xkey], xkey)
                y = _npz_member(zf, members[ykey], ykey) if ykey in members else None
                return x, y
        except (OSError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
            raise ValueError(f"not a readable .npz ({one_line(str(exc), 200)})") from None


def _npz_member(zf: zipfile.ZipFile, name: str, key: str) -> np.ndarray:
    info = zf.getinfo(name)
    with zf.open(info) as m:
        try:
            version = np.lib.format.read_magic(m)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(m)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(m)
        except ValueError as exc:
            raise ValueError(
                f"array {quote(key)}: not a .npy header ({one_line(str(exc), 200)})"
            ) from None
        nbytes = _check_array_header(f"array {quote(key)}", tuple(shape), dtype, data_cap())
        if nbytes > info.file_size:
            raise ValueError(
                f"array {quote(key)} declares shape {tuple(shape)[:8]} ({nbytes:,} bytes) but "
                f"its member holds {info.file_size:,} bytes"
            )
        body = _read_exactly(m, nbytes)
    return body.view(dtype).reshape(shape, order="F" if fortran else "C")


def _load_csv(path: Path, label_column: str, labelled: bool):
    """A CSV with a header row; read bounded, never echoing its content in a message."""
    cap = text_cap()
    if path.name.endswith(".gz"):
        data = read_gzip_bounded(path, cap, max_compressed=cap, what="CSV file")
    else:
        data = read_bounded(path, cap, what="CSV file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ValueError(f"line {line}: not UTF-8 text (byte offset {exc.start})") from None
    del data
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        rows = list(reader)
    except csv.Error as exc:
        problem = str(exc)
        if "field larger than field limit" in problem:
            problem = f"a field is longer than {csv.field_size_limit():,} characters"
        raise ValueError(f"line {reader.line_num}: {one_line(problem, 120)}") from None
    del text
    if not rows:
        raise ValueError("empty CSV")
    header, body = rows[0], rows[1:]
    if label_column in header:
        li = header.index(label_column)
    elif labelled:
        raise ValueError(
            f"no label column {quote(label_column)} in the header (it has {len(header)} columns)"
        )
    else:
        li = None
    try:
        table = np.array(body, dtype=np.float64)
    except ValueError:
        raise ValueError(
            "non-numeric cell, or rows of different lengths, in the CSV body"
        ) from None
    if table.ndim != 2:
        raise ValueError("the CSV body has no cells")
    if li is None:
        return table.astype(np.float32), None
    x = np.delete(table, li, axis=1).astype(np.float32)
    y = table[:, li]
    if not np.all(y == np.round(y)):
        raise ValueError(f"label column {quote(label_column)} holds non-integer values")
    return x, y.astype(np.int64)
