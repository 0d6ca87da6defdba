"""The build's activation store: memory-mapped ``.npy`` files in a temporary folder.

Extraction writes each batch's logits and pooled activations into arrays allocated once per
data set (:func:`numpy.lib.format.open_memmap`), so a set's activations never sit whole in
the process's own memory: the kernel pages them in as the fit reads them and writes them back
to disk under memory pressure. The folder (``boxwatch-store-*`` under ``--work-dir``, else
the system's temporary folder) is removed when the build ends, failed or not.

A folder on a memory file system (``tmpfs``, ``ramfs``) holds the same bytes in RAM:
:func:`memory_filesystem` names it so the build's estimate counts the store in full.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from types import TracebackType

import numpy as np
from numpy.typing import DTypeLike

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn.limits import format_bytes

PREFIX = "boxwatch-store-"
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs")


class ActivationStore:
    """Arrays for one build: memory-mapped files in a temporary folder under ``parent``
    (default: the system's temporary folder), or plain in-memory arrays (``in_memory``).

    Use as a context manager; :meth:`close` removes the folder (maps still open stay
    readable on POSIX until dropped).
    """

    def __init__(self, parent: Path | None = None, *, in_memory: bool = False) -> None:
        self.in_memory = in_memory
        self.parent = Path(tempfile.gettempdir()) if parent is None else Path(parent)
        self.folder: Path | None = None
        self.nbytes = 0
        self._count = 0

    def __enter__(self) -> ActivationStore:
        if not self.in_memory:
            try:
                self.folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=self.parent))
            except OSError as exc:
                raise ConfigError(
                    f"--work-dir {self.parent}: cannot create the activation store there "
                    f"({exc.strerror or exc})"
                ) from None
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def allocate(self, shape: tuple[int, ...], dtype: DTypeLike = np.float32) -> np.ndarray:
        """A new zeroed array of ``shape``: a view of a ``.npy`` file mapped read-write (a
        plain ndarray, so what is computed from it is one too), or in memory."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        self.nbytes += nbytes
        if self.folder is None:
            return np.zeros(shape, dtype=dtype)
        path = self.folder / f"{self._count}.npy"
        self._count += 1
        try:
            mapped = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
            _reserve(path)
        except OSError as exc:
            raise ConfigError(
                f"--work-dir {self.parent}: the activation store could not grow to "
                f"{format_bytes(self.nbytes)} ({exc.strerror or exc}); give --work-dir a "
                "folder with more free space"
            ) from None
        return np.asarray(mapped)

    def close(self) -> None:
        """Remove the folder and everything in it."""
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def _reserve(path: Path) -> None:
    """Allocate the disk blocks of ``path`` now: a sparse file whose disk fills up later
    kills the process with SIGBUS on a page write, where this raises ``OSError`` (ENOSPC).
    File systems without ``fallocate`` are left sparse."""
    if not hasattr(os, "posix_fallocate"):
        return
    with open(path, "r+b") as fh:
        try:
            os.posix_fallocate(fh.fileno(), 0, os.fstat(fh.fileno()).st_size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise


def free_bytes(folder: Path) -> int | None:
    """Bytes free for an unprivileged writer in ``folder`` (``None`` when unknown)."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def memory_filesystem(folder: Path) -> str | None:
    """The file system type of ``folder`` when it keeps its files in RAM (``tmpfs``,
    ``ramfs``), else ``None`` (also where ``/proc/self/mounts`` cannot be read)."""
    try:
        real = os.path.realpath(folder)
        with open("/proc/self/mounts") as fh:
            mounts = [line.split()[1:3] for line in fh if len(line.split()) >= 3]
    except OSError:
        return None
    best, kind = "", None
    for point, fstype in mounts:
        point = point.replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fstype
    return kind if kind in MEMORY_FILESYSTEMS else None
