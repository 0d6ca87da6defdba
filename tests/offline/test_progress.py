"""Progress of long phases (issue 39, point 6): a line every interval off a terminal, a bar
on one, nothing with mode "off"; the interval comes from the argument or the environment."""

from __future__ import annotations

import io
import os
import select
import time

import pytest

from boxwatch.agent.errors import ConfigError
from boxwatch.offline.bn.limits import _data_in_use
from boxwatch.offline.progress import INTERVAL_ENV, LINE, Progress, resolve_interval, tick


def _lines(progress: Progress) -> list[str]:
    stream = progress.stream
    assert isinstance(stream, io.StringIO)
    return stream.getvalue().splitlines()


def test_lines_name_the_phase_count_and_eta_without_carriage_returns():
    progress = Progress(io.StringIO(), interval=0)
    with progress.phase("fitting boxes", 4) as phase:
        for _ in range(4):
            phase.update()
    text = progress.stream.getvalue()  # type: ignore[attr-defined]
    assert "\r" not in text
    lines = _lines(progress)
    assert any(line.startswith("fitting boxes: 1/4 (25%)") and "ETA" in line for line in lines)
    assert lines[-1].startswith("fitting boxes: done in ")
    assert all(LINE.match(line) for line in lines), lines


def test_a_short_phase_shows_nothing_at_the_default_interval():
    progress = Progress(io.StringIO(), mode="lines", interval=10)
    with progress.phase("layer choice", 10) as phase:
        phase.update(10)
    assert progress.stream.getvalue() == ""  # type: ignore[attr-defined]


def test_a_phase_that_does_not_count_still_shows_its_time():
    progress = Progress(io.StringIO(), interval=0)
    with progress.phase("writing the report"):
        time.sleep(0.2)  # the heartbeat prints while the phase does not count
    lines = _lines(progress)
    assert any(line.startswith("writing the report: ") and "elapsed" in line for line in lines)
    assert lines[-1].startswith("writing the report: done in ")


def test_tick_counts_the_phase_open_in_this_context_and_nothing_outside_one():
    tick()  # no phase open: nothing happens
    progress = Progress(io.StringIO(), interval=0)
    with progress.phase("tau sweep", 3) as phase:
        tick(2)
        assert phase.done == 2
    tick()
    assert phase.done == 2


def test_a_failed_phase_leaves_no_end_line():
    progress = Progress(io.StringIO(), interval=0)
    with pytest.raises(RuntimeError), progress.phase("compiling", 2) as phase:
        phase.update()
        raise RuntimeError("refused")
    assert not any("done in" in line for line in _lines(progress))


def test_mode_off_writes_nothing():
    progress = Progress(io.StringIO(), mode="off", interval=0)
    with progress.phase("layer choice", 2) as phase:
        phase.update(2)
        time.sleep(0.1)
    assert progress.stream.getvalue() == ""  # type: ignore[attr-defined]


def test_a_terminal_gets_a_bar_redrawn_in_place():
    master, slave = os.openpty()
    try:
        with open(slave, "w", closefd=False) as tty:
            progress = Progress(tty, show_after=0)
            assert progress.mode == "bar"
            with progress.phase("extracting activations", 8) as phase:
                for _ in range(8):
                    phase.update()
                    time.sleep(0.03)
        out = ""
        while select.select([master], [], [], 0.2)[0]:  # all the terminal received
            out += os.read(master, 65536).decode()
    finally:
        os.close(master)
        os.close(slave)
    assert "\rextracting activations [" in out and "#" in out
    assert "extracting activations: done in " in out and out.endswith("\n")


def test_the_interval_comes_from_the_argument_then_the_environment(monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "0.5")
    assert resolve_interval() == 0.5
    assert resolve_interval(3) == 3
    monkeypatch.setenv(INTERVAL_ENV, "soon")
    with pytest.raises(ConfigError, match="BOXWATCH_PROGRESS_INTERVAL='soon'"):
        resolve_interval()
    with pytest.raises(ConfigError, match=">= 0"):
        resolve_interval(-1)


def test_a_phase_under_a_memory_guard_with_no_room_for_a_thread_still_counts():
    """compile-bn and verify-bn cap the data segment; a heartbeat thread's stack may not fit
    (starting it raises), and the phase must still run and show its counts."""
    resource = pytest.importorskip("resource")
    old = resource.getrlimit(resource.RLIMIT_DATA)
    progress = Progress(io.StringIO(), interval=0)
    resource.setrlimit(resource.RLIMIT_DATA, (_data_in_use() + (1 << 20), old[1]))
    try:
        with progress.phase("verifying rules and queries", 2) as phase:
            phase.update(2)
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, old)
    assert _lines(progress)[-1].startswith("verifying rules and queries: done in ")
