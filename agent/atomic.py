"""The one atomic file writer: keys, artifacts and reports are written through it."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_file(path: str | Path, *, mode: int = 0o644) -> Iterator[BinaryIO]:
    """A binary file that replaces ``path`` whole when the block ends without an error, so
    readers see the old file or the whole new one; for data written piece by piece.

    A new temp file beside ``path`` (created readable by the owner only, then given
    ``mode``, so a secret is never readable by others, not even for an instant), written,
    fsynced and renamed over ``path``. On any failure the temp file is removed and the
    error propagates; ``path`` is left as it was.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: str | Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one
    (:func:`atomic_file`; ``OSError`` propagates)."""
    with atomic_file(path, mode=mode) as fh:
        fh.write(data)
