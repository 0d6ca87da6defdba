"""Memory and time limits of a BN compilation: sizes, the default share of RAM, the guards.

:func:`default_max_memory` is the bound every route is held to unless the caller gives one;
:func:`memory_guard` turns the kernel's OOM kill into a :class:`MemoryError` by capping the
process's data segment (``RLIMIT_DATA``) for the duration of a compilation;
:class:`Deadline` holds a command to its wall-clock limit while it runs -- reading, planning,
the routes' loops and verification call :meth:`Deadline.check` -- not only to the estimate
made before a route starts.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator

from boxwatch.agent.errors import ConfigError

MEMORY_SHARE = 0.5
MAX_SIZE = 1 << 60
"""The largest size :func:`parse_size` accepts (1 EiB; more is a typo, not a machine)."""
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes of ``"4G"``, ``"512M"``, ``"1.5GiB"``, ``"100000"`` (binary units).

    Raises
    ------
    ValueError
        For anything else, a size of zero, or one above :data:`MAX_SIZE`.
    """
    shown = repr(str(text)[:40])
    match = _SIZE.fullmatch(str(text)[:100]) if str(text).isascii() else None
    if not match:
        raise ValueError(f"{shown} is not a size (examples: 4G, 512M, 1.5GiB, 100000)")
    number = match.group(1)
    if len(number) > 30:
        raise ValueError(f"{shown}: the size is too large (at most 1 EiB)")
    value = float(number) * _UNITS[match.group(2).upper()]
    if value > MAX_SIZE:
        raise ValueError(f"{shown}: the size is too large (at most 1 EiB)")
    if int(value) <= 0:
        raise ValueError(f"{shown}: the size must be positive")
    return int(value)


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units with three significant digits (``"4.5 GiB"``)."""
    try:
        n = float(n)
    except OverflowError:
        n = float("inf")
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def format_seconds(s: float) -> str:
    """``s`` seconds, as seconds, hours or days (``"3.2 s"``, ``"5.1 h"``, ``"4e+03 days"``)."""
    try:
        s = float(s)
    except OverflowError:
        s = float("inf")
    if s < 3600:
        return f"{s:.2g} s" if s < 10 else f"{s:.0f} s"
    if s < 86400 * 3:
        return f"{s / 3600:.2g} h"
    return f"{s / 86400:.3g} days"


def total_memory() -> int:
    """Physical memory of this machine in bytes (``/proc/meminfo``, else ``sysconf``)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_max_memory() -> int:
    """The default bound: :data:`MEMORY_SHARE` of this machine's RAM, and no more than this
    process may still map under its own ``RLIMIT_AS`` (a container's or CI's cap)."""
    share = int(total_memory() * MEMORY_SHARE)
    try:
        import resource
    except ImportError:  # not POSIX
        return share
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft == resource.RLIM_INFINITY:
        return share
    return max(1 << 20, min(share, soft - _status_bytes("VmSize:")))


def _status_bytes(field: str) -> int:
    """A ``/proc/self/status`` size field in bytes (``VmData:``, ``VmSize:``), 0 when unknown."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _data_in_use() -> int:
    """Bytes of this process's data segment now (``VmData``), 0 when unknown."""
    return _status_bytes("VmData:")


GUARD_FLOOR = 64 << 20
"""Least slack :func:`memory_guard` leaves above what is in use."""


@contextlib.contextmanager
def memory_guard(max_bytes: int) -> Iterator[None]:
    """Cap the data segment at what is in use plus ``max_bytes`` (at least
    :data:`GUARD_FLOOR`); past it allocations fail.

    Allocations past the cap raise :class:`MemoryError` instead of waking the kernel's OOM
    killer. The previous limit is restored on exit. A no-op where ``RLIMIT_DATA`` is missing
    or cannot be lowered.
    """
    try:
        import resource
    except ImportError:  # not POSIX
        yield
        return
    old = resource.getrlimit(resource.RLIMIT_DATA)
    # A floor of slack: the interpreter's own small allocations (a lazy import, a parse
    # buffer) never trip the backstop; the routes' estimates still use ``max_bytes`` itself.
    cap = _data_in_use() + max(int(max_bytes), GUARD_FLOOR)
    if old[1] != resource.RLIM_INFINITY:
        cap = min(cap, old[1])
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (cap, old[1]))
    except (ValueError, OSError, OverflowError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, old)


ROUTE_ADVICE = "give fewer features, another order"
"""What a :class:`CompileTimeError` of the compilation suggests (besides more seconds)."""


class CompileTimeError(ConfigError):
    """A compilation ran past its wall-clock limit; the message says what it had reached."""

    def __init__(self, message: str, reached: str = ""):
        super().__init__(message)
        self.reached = reached
        """How far it got (``"cut 12 of 40 sized"``), as :meth:`Deadline.check` was told."""


class Deadline:
    """A wall-clock limit checked inside the loops of every phase: reading the network,
    planning and running the routes, verifying.

    Parameters
    ----------
    max_seconds : float or None
        Seconds allowed from ``start``; ``None`` never expires.
    source : str
        Named in the error (the network's path).
    start : float, optional
        ``time.perf_counter()`` value the limit counts from (default: now).
    """

    def __init__(self, max_seconds: float | None, source: str, start: float | None = None):
        self.max_seconds = max_seconds
        self.source = source
        self.start = time.perf_counter() if start is None else start
        self.route = "planning"
        self.phase: str | None = None
        self.advice = ROUTE_ADVICE

    def enter(self, phase: str | None, advice: str = ROUTE_ADVICE) -> None:
        """Say what runs from now on (``"reading the network"``; ``None``: the compilation's
        routes, named by :attr:`route`) and what the error suggests when the limit passes."""
        self.phase = phase
        self.advice = advice

    def elapsed(self) -> float:
        """Seconds since ``start``."""
        return time.perf_counter() - self.start

    def check(self, reached: str) -> None:
        """Raise :class:`CompileTimeError` once the limit has passed.

        ``reached`` says how far the route got (``"level 12 of 30"``); it is only formatted
        into the message, so callers may pass a cheap string.
        """
        if self.max_seconds is None:
            return
        elapsed = time.perf_counter() - self.start
        if elapsed > self.max_seconds:
            doing = f"while {self.phase}" if self.phase else f"in the {self.route} route"
            raise CompileTimeError(
                f"{self.source}: time limit {format_seconds(self.max_seconds)} reached after "
                f"{elapsed:.3g} s {doing} ({reached}); {self.advice}, or raise --max-seconds",
                reached,
            )
