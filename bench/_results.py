"""Shared by the benches: the machine line and writing one section of bench/RESULTS.md."""

from __future__ import annotations

import datetime as dt
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def memory_gb() -> float:
    """Total memory of this machine in GB (from /proc/meminfo)."""
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024**2
    return float("nan")


def machine_line(extra: str = "") -> str:
    """``_date; this machine: N cores, M GB RAM, Python X_`` for a results section."""
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    tail = f"; {extra}" if extra else ""
    return (
        f"_{when}; this machine: {os.cpu_count()} cores, {memory_gb():.0f} GB RAM, "
        f"Python {platform.python_version()}{tail}_"
    )


def run_summary(began: float) -> str:
    """``total run N s; load average at the end A B C`` for a bench begun at ``began``."""
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"total run {time.perf_counter() - began:.0f} s; load average at the end {load}"


def write_section(heading: str, text: str) -> None:
    """Replace the ``heading`` section of bench/RESULTS.md with ``text``, keeping the others."""
    old = RESULTS.read_text() if RESULTS.is_file() else "# Bench results\n"
    start = old.find(heading + "\n")
    if start < 0:
        new = old.rstrip("\n") + f"\n\n{heading}\n\n{text.strip()}\n"
    else:
        nxt = old.find("\n## ", start + len(heading))
        new = old[:start] + f"{heading}\n\n{text.strip()}\n" + (old[nxt:] if nxt >= 0 else "")
    RESULTS.write_text(new)
