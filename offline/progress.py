"""How long builder phases show that they are working: on stderr, a bar on a terminal, one
line every :data:`DEFAULT_INTERVAL_S` seconds otherwise (CI logs), never on stdout.

The one owner of progress output. A verb makes one :class:`Progress` (``--quiet``:
``Progress(mode="off")``) and hands it to the work, which opens each phase with
:meth:`Progress.phase` (a name, and a total where the work is countable: the ETA comes from
it). Loops that cannot be handed the phase (the estimator's tau sweep, called from the
layer choice, the fit and the evaluation alike) count their steps with :func:`tick`, which
advances the phase open in the calling context, if any.

A phase shows nothing before it has run :data:`SHOW_AFTER_S`; then, on a terminal, a bar
(redrawn every :data:`REDRAW_S`), otherwise a line at once and one every interval: its
name, its count (``done/total`` and share) where it counts, the time it has run and, with a
total, an ETA. A phase that ran that long ends with ``NAME: done in T``; one that fails
leaves no end line (the error follows). A heartbeat thread keeps a phase that does not
count, or counts slowly, showing its time.

The line interval is the argument, else ``$BOXWATCH_PROGRESS_INTERVAL`` (seconds), else
:data:`DEFAULT_INTERVAL_S`; 0 prints every count (and every phase's end line), for tests.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import time
from contextvars import ContextVar, Token
from typing import Literal, TextIO

from boxwatch.agent.errors import ConfigError

INTERVAL_ENV = "BOXWATCH_PROGRESS_INTERVAL"
DEFAULT_INTERVAL_S = 10.0
SHOW_AFTER_S = 2.0
"""A phase shows nothing before it has run this long (and no end line if shorter)."""
REDRAW_S = 0.2
"""How often a terminal bar is redrawn at most (and by the heartbeat)."""
BAR_WIDTH = 24
Mode = Literal["bar", "lines", "off"]
MODES: tuple[Mode, ...] = ("bar", "lines", "off")
LINE = re.compile(
    r"^[^:\r]+: (done in |\d[\d,]*/[\d,]+ \(|\d[\d,]* steps, |[\d.]+ s elapsed|\d+ min)"
)
"""The shape of a progress line in ``lines`` mode (for log filters)."""

_current: ContextVar[Phase | None] = ContextVar("boxwatch_progress_phase", default=None)


def tick(n: int = 1) -> None:
    """Count ``n`` steps of the phase open in this context (nothing when none is open)."""
    phase = _current.get()
    if phase is not None:
        phase.update(n)


def resolve_interval(interval: float | None = None) -> float:
    """Seconds between progress lines: the argument, else :data:`INTERVAL_ENV`, else
    :data:`DEFAULT_INTERVAL_S`. Raises :class:`ConfigError` for a bad value."""
    source = "interval"
    if interval is None:
        env = os.environ.get(INTERVAL_ENV)
        if env is None:
            return DEFAULT_INTERVAL_S
        source = f"${INTERVAL_ENV}"
        try:
            interval = float(env)
        except ValueError:
            raise ConfigError(f"{source}={env!r} is not a number of seconds") from None
    if not interval >= 0:  # NaN too
        raise ConfigError(f"{source}={interval} should be >= 0 seconds")
    return float(interval)


def seconds_text(s: float) -> str:
    """``4.2 s``, ``37 s``, ``2 min 05 s``: durations as a log line says them."""
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    m, rest = divmod(int(round(s)), 60)
    return f"{m} min {rest:02d} s"


class Progress:
    """Renders the phases of one command on ``stream`` (default: stderr).

    Parameters
    ----------
    stream : text stream, optional
        Where progress goes; default ``sys.stderr`` at construction.
    mode : {"bar", "lines", "off"}, optional
        Default: ``"bar"`` when ``stream`` is a terminal, else ``"lines"``.
    interval : float, optional
        Seconds between lines in ``lines`` mode (see :func:`resolve_interval`).
    show_after : float, default=SHOW_AFTER_S
        Seconds a phase runs before it shows (in ``lines`` mode at most ``interval``).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        mode: Mode | None = None,
        interval: float | None = None,
        show_after: float = SHOW_AFTER_S,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        if mode is None:
            isatty = getattr(self.stream, "isatty", None)
            mode = "bar" if callable(isatty) and isatty() else "lines"
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} should be one of {MODES}")
        self.mode: Mode = mode
        self.interval = resolve_interval(interval) if mode == "lines" else DEFAULT_INTERVAL_S
        self.show_after = min(show_after, self.interval) if mode == "lines" else show_after
        self._stack: list[Phase] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._heart: threading.Thread | None = None
        self._drawn = 0  # characters of the bar now on the terminal line

    def phase(self, name: str, total: int | None = None) -> Phase:
        """A context manager for one phase; ``total`` steps when the work is countable."""
        return Phase(self, name, total)

    # -- used by Phase -------------------------------------------------------------------
    def _open(self, phase: Phase) -> None:
        if self.mode == "off":
            return
        with self._lock:
            if self._stack and self._drawn:
                self._erase()
            self._stack.append(phase)
            if self._heart is None:
                self._wake.clear()
                heart = threading.Thread(target=self._beat, name="boxwatch-progress", daemon=True)
                try:
                    heart.start()
                except RuntimeError:  # no thread under a memory guard: counts still show
                    return
                self._heart = heart

    def _close(self, phase: Phase, ok: bool) -> None:
        if self.mode == "off":
            return
        with self._lock:
            now = time.monotonic()
            elapsed = now - phase.start
            ended = f"{phase.name}: done in {seconds_text(elapsed)}"
            if self.mode == "bar" and self._drawn and self._top() is phase:
                if ok:
                    self._write("\r" + self._fit(ended).ljust(self._drawn) + "\n")
                else:
                    self._erase()
                self._drawn = 0
            elif self.mode == "lines" and ok and (phase.lines or elapsed >= self.show_after):
                self._write(ended + "\n")
            if phase in self._stack:
                self._stack.remove(phase)
            heart, stop = self._heart, not self._stack
            if stop:
                self._heart = None
                self._wake.set()
        if stop and heart is not None and heart is not threading.current_thread():
            heart.join()

    def _moved(self, phase: Phase) -> None:
        """A phase counted: redraw or print when it is due."""
        if self.mode == "off":
            return
        now = time.monotonic()
        if now < phase.due:
            return
        with self._lock:
            self._show(phase, now)

    # -- rendering (under the lock) ------------------------------------------------------
    def _top(self) -> Phase | None:
        return self._stack[-1] if self._stack else None

    def _show(self, phase: Phase, now: float) -> None:
        if phase is not self._top() or now < phase.due:
            return
        if self.mode == "bar":
            text = self._fit(phase.bar(now))
            self._write("\r" + text.ljust(self._drawn))
            self._drawn = len(text)
            phase.due = now + REDRAW_S
        else:
            self._write(phase.line(now) + "\n")
            phase.lines += 1
            phase.due = now + self.interval

    def _beat(self) -> None:
        """Show the open phase when it is due, even if it does not count."""
        while True:
            with self._lock:
                phase = self._top()
                wait = REDRAW_S if phase is None else phase.due - time.monotonic()
                if phase is not None and wait <= 0:
                    self._show(phase, time.monotonic())
                    wait = phase.due - time.monotonic()
            if self._wake.wait(max(wait, 0.05)):
                return

    def _fit(self, text: str) -> str:
        width = shutil.get_terminal_size((80, 24)).columns - 1
        return text[:width]

    def _erase(self) -> None:
        self._write("\r" + " " * self._drawn + "\r")
        self._drawn = 0

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr must not end the build
            pass


class Phase:
    """One phase of a :class:`Progress`: enter it, count with :meth:`update` (or
    :meth:`set_done`, or :func:`tick` from inner loops), leave it."""

    def __init__(self, progress: Progress, name: str, total: int | None) -> None:
        self.progress = progress
        self.name = name
        self.total = total if total is None or total > 0 else None
        self.done = 0
        self.start = time.monotonic()
        self.due = self.start + progress.show_after
        self.lines = 0
        self._token: Token[Phase | None] | None = None

    def __enter__(self) -> Phase:
        self.start = time.monotonic()
        self.due = self.start + self.progress.show_after
        self._token = _current.set(self)
        self.progress._open(self)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        self.progress._close(self, ok=exc_type is None)

    def update(self, n: int = 1) -> None:
        """Count ``n`` more steps."""
        self.done += n
        self.progress._moved(self)

    def set_done(self, done: int, total: int | None = None) -> None:
        """``done`` of ``total`` steps (a callback of the form ``progress(done, total)``)."""
        self.done = done
        if total is not None and total > 0:
            self.total = total
        self.progress._moved(self)

    # -- text ----------------------------------------------------------------------------
    def _counted(self) -> bool:
        return self.total is not None and self.done <= self.total

    def _eta(self, elapsed: float) -> str | None:
        if not self._counted() or not self.done:
            return None
        assert self.total is not None
        return seconds_text(elapsed * (self.total - self.done) / self.done)

    def line(self, now: float) -> str:
        """The phase as one log line (``lines`` mode)."""
        elapsed = now - self.start
        if self._counted():
            assert self.total is not None
            eta = self._eta(elapsed)
            return (
                f"{self.name}: {self.done:,}/{self.total:,} ({self.done / self.total:.0%}), "
                f"{seconds_text(elapsed)} elapsed" + (f", ETA {eta}" if eta else "")
            )
        steps = f"{self.done:,} steps, " if self.done else ""
        return f"{self.name}: {steps}{seconds_text(elapsed)} elapsed"

    def bar(self, now: float) -> str:
        """The phase as a terminal bar (``bar`` mode)."""
        elapsed = now - self.start
        if self._counted():
            assert self.total is not None
            filled = int(BAR_WIDTH * self.done / self.total)
            eta = self._eta(elapsed)
            return (
                f"{self.name} [{'#' * filled}{'-' * (BAR_WIDTH - filled)}] "
                f"{self.done / self.total:4.0%} {self.done:,}/{self.total:,} "
                f"{seconds_text(elapsed)}" + (f", ETA {eta}" if eta else "")
            )
        steps = f" {self.done:,} steps," if self.done else ""
        return f"{self.name} ...{steps} {seconds_text(elapsed)}"
