"""Numeric members of the artifact as ``.npz`` bytes: deterministic to write, never pickled."""

from __future__ import annotations

import io
import zipfile

import numpy as np

from boxwatch.agent.errors import ArtifactError
from boxwatch.agent.storedzip import check_zip_index, write_stored_zip

_ALLOWED_KINDS = set("biuf")  # bool, signed, unsigned, float
MAX_ARRAYS = (
    0xFFFF  # arrays in one .npz member (a ZIP without ZIP64 holds no more); checked before parsing
)


def dumps_npz(arrays: dict[str, np.ndarray]) -> bytes:
    """Serialise named arrays to byte-identical ``.npz`` bytes (sorted names, no timestamps)."""
    entries = []
    for name in sorted(arrays):
        arr = np.asarray(arrays[name])
        if arr.dtype.kind not in _ALLOWED_KINDS:
            raise TypeError(f"array {name!r} has dtype {arr.dtype}; only numeric arrays are stored")
        buf = io.BytesIO()
        np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
        entries.append((f"{name}.npy", buf.getvalue()))
    return write_stored_zip(entries)


def loads_npz(data: bytes, *, where: str = "npz member") -> dict[str, np.ndarray]:
    """Read ``.npz`` bytes with ``allow_pickle=False``; numeric arrays only."""
    problem = check_zip_index(data, max_entries=MAX_ARRAYS)
    if problem is not None:
        raise ArtifactError(f"{where}: not a valid numeric .npz ({problem})")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            out = {name: npz[name] for name in npz.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise ArtifactError(f"{where}: not a valid numeric .npz ({exc})") from None
    for name, arr in out.items():
        if arr.dtype.kind not in _ALLOWED_KINDS:
            raise ArtifactError(f"{where}: array {name!r} has unsupported dtype {arr.dtype}")
    return out
