"""Test helper: wall-clock deadlines that expire on cue, so limit tests neither wait nor time."""

from __future__ import annotations

import time

from boxwatch.offline.bn.limits import Deadline


class Countdown(Deadline):
    """A deadline of 0.5 s that expires at its ``n``-th check (1: the first)."""

    def __init__(self, n: int, source: str = "net.bif"):
        super().__init__(0.5, source)
        self.left = n

    def check(self, reached: str) -> None:
        self.left -= 1
        if self.left <= 0:
            self.start = time.perf_counter() - 3600
        super().check(reached)
