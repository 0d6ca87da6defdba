"""Backpressure for five minutes: the CI test's scenario with writes failing for 300 s.

Runs ``tests/reliability/test_reliability_broker.py::test_backpressure_pauses_consumption_and_resumes``
with ``BOXWATCH_BACKPRESSURE_SECONDS`` (default 300): the verdict topic is deleted with
auto-creation off while ~320 inputs/s keep arriving; the agent must stay paused with flat
consumption and RSS < 1 GB, then deliver every verdict after the topic is back. Writes the
test's figures into bench/RESULTS.md under "## backpressure (bench/backpressure.py)".

Usage::

    .venv/bin/python bench/backpressure.py [--seconds 300]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from soak import write_results  # noqa: E402

SECTION = "## backpressure (bench/backpressure.py)"
TEST = (
    "tests/reliability/test_reliability_broker.py::test_backpressure_pauses_consumption_and_resumes"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0, help="how long writes fail")
    ap.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    args = ap.parse_args()
    t0 = time.time()
    env = {**os.environ, "BOXWATCH_BACKPRESSURE_SECONDS": str(args.seconds)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", TEST],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    figures = [
        ln.strip() for ln in run.stdout.splitlines() if ln.strip().startswith("backpressure:")
    ]
    passed = run.returncode == 0
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    lines = [
        f"_{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; this machine: {os.cpu_count()} cores "
        f"(shared), {mem:.0f} GB RAM, Python {platform.python_version()}; total run "
        f"{time.time() - t0:.0f} s_",
        "",
        f"Writes failing for {args.seconds:g} s (verdict topic deleted, auto-creation off): "
        f"{'PASS' if passed else 'FAIL'}",
        "",
        *(f"- {f}" for f in figures),
    ]
    print("\n".join(lines))
    if not passed:
        print(run.stdout[-4000:], run.stderr[-2000:], sep="\n")
    if not args.no_write:
        write_results(lines, section=SECTION)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
