"""Hostile artifacts and HTTP clients (issue 37), as families generated at any size.

Shared by ``tests/agent/test_artifact.py``, ``tests/reliability/test_hostile_agent.py`` and
``bench/hostile.py`` (which runs the issue's cases at ten times their sizes):

* :data:`JSON_FAMILIES` -- JSON text an artifact may carry before its signature is checked:
  strings full of escapes (terminated or not), brackets inside strings, deep nesting;
* :func:`signature_artifact` / :func:`manifest_artifact` put such text in ``manifest.sig``
  or ``manifest.json`` of an otherwise well-formed container;
* :func:`overlapping_artifact` -- members whose data ranges overlap each other or the
  central directory, in several :data:`OVERLAP_LAYOUTS`, with a manifest that lists them
  with their true sizes and digests (so a reader that does not refuse them reads them all);
* :class:`SlowClients` -- idle, trickling and half-open HTTP clients in one thread;
  :func:`scrape` -- one GET with a deadline.
"""

from __future__ import annotations

import base64
import hashlib
import os
import resource
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from boxwatch.agent import artifact as art

# -- JSON text ---------------------------------------------------------------------------------


def _repeat(unit: bytes, n: int, head: bytes = b"", tail: bytes = b"") -> bytes:
    """``head + unit * k + tail`` of about ``n`` bytes."""
    return head + unit * max(1, (n - len(head) - len(tail)) // len(unit)) + tail


JSON_FAMILIES: dict[str, Callable[[int], bytes]] = {
    # The case: a quote, then escaped quotes, never closed.
    "escaped_quotes": lambda n: _repeat(b'\\"', n, b'"'),
    # Escaped backslashes before escaped quotes (runs of odd and even length), never closed.
    "backslash_runs": lambda n: _repeat(b'\\\\\\\\\\"\\\\\\"', n, b'"'),
    # Many short strings, each full of escapes, in an array never closed.
    "escaped_strings_in_array": lambda n: _repeat(b'"\\"\\\\\\"",', n, b"["),
    # Brackets inside an unterminated string: none of them nests.
    "brackets_in_string": lambda n: _repeat(b'[{\\"', n, b'"'),
    # A valid string: escaped quotes, closed at the end.
    "escaped_quotes_closed": lambda n: _repeat(b'\\"', n, b'"', b'"'),
    # Deep nesting, never closed.
    "deep_arrays": lambda n: _repeat(b"[", n),
    "deep_objects": lambda n: _repeat(b'{"\\"":', n),
}
"""name -> ``make(n)``: hostile JSON text of about ``n`` bytes."""


def reference_depth(data: bytes) -> int:
    """Deepest bracket nesting of ``data``, strings skipped: a plain per-byte state machine."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


# -- artifacts ---------------------------------------------------------------------------------


def fake_signature(key_id: str = "0" * 16) -> bytes:
    """A well-formed ``manifest.sig`` whose signature verifies nothing."""
    sig = base64.b64encode(bytes(64)).decode("ascii")
    return art.canonical_json({"algorithm": "ed25519", "key_id": key_id, "signature": sig})


def _manifest(members: Mapping[str, bytes | memoryview], digests: bool = True) -> bytes:
    return art.canonical_json(
        {
            "schema": art.SCHEMA,
            "schema_version": art.SCHEMA_VERSION,
            "created_at_epoch": 1_700_000_000,
            "key_id": "0" * 16,
            "members": {
                n: {
                    "sha256": hashlib.sha256(b).hexdigest() if digests else "0" * 64,
                    "size": len(b),
                }
                for n, b in sorted(members.items())
            },
        }
    )


def signature_artifact(text: bytes) -> bytes:
    """A canonical container whose ``manifest.sig`` is ``text`` (the manifest is valid)."""
    members = {"m.json": b"{}"}
    return art._container(_manifest(members), text, members)


def manifest_artifact(text: bytes) -> bytes:
    """A canonical container whose ``manifest.json`` is ``text``, with a well-formed signature."""
    return art._container(text, fake_signature(), {})


_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_EOCD = struct.Struct("<IHHHHIIH")

OVERLAP_LAYOUTS = ("shared_blob", "chained", "into_directory", "same_header", "unsorted")
"""How :func:`overlapping_artifact` lays members over each other:

* ``shared_blob`` -- local headers back to back, then one blob every member's data runs
  through to the central directory (the issue's 60 members over the same 16 MiB);
* ``chained`` -- each member has its own bytes, and its data runs on over every later member;
* ``into_directory`` -- members in order, the last one's data runs into the central directory;
* ``same_header`` -- every central entry points at the first local header;
* ``unsorted`` -- the central directory lists members backwards; the first and the last
  (by offset) overlap, the others do not.
"""


def overlapping_artifact(total: int, n_members: int, layout: str, *, digests: bool = True) -> bytes:
    """An unsigned artifact of about ``total`` bytes whose ``n_members`` members overlap.

    ``manifest.json`` and ``manifest.sig`` come first, as in a real artifact; the manifest
    lists every member with the size and digest of the bytes its index entry spans (for
    ``into_directory`` the last member's digest covers its own bytes only), so ``inspect``
    without a key reads them all unless the index is refused first. Without ``digests``
    the members' digests and CRCs are zeros (hashing 600 spans of 160 MiB each takes
    minutes; the index refuses them before either is read).
    """
    names = [f"m{i:04d}.json" for i in range(n_members)]
    own = 0 if layout == "shared_blob" else max(1, total // n_members)
    body = bytearray()
    headers: list[int] = []
    starts: list[int] = []
    for i, name in enumerate(names):
        headers.append(len(body))
        body += _LOCAL.pack(0x04034B50, 20, 0, 0, 0, 33, 0, 0, 0, len(name), 0) + name.encode()
        starts.append(len(body))
        body += bytes([0x40 + i % 26]) * own
    if layout == "shared_blob":
        body += b"x" * total
    if layout in ("shared_blob", "chained"):
        spans = [(s, len(body) - s) for s in starts]
    else:
        spans = [(s, own) for s in starts]
    if layout == "same_header":
        headers, spans = [0] * n_members, [spans[0]] * n_members
    elif layout == "unsorted":
        spans[0] = (starts[0], starts[-1] + own - starts[0])
    view = memoryview(body)
    manifest = _manifest(
        {n: view[lo : lo + size] for n, (lo, size) in zip(names, spans, strict=True)}, digests
    )
    prefix = bytearray()
    directory = bytearray()
    for name, data in (("manifest.json", manifest), ("manifest.sig", fake_signature())):
        directory += _central(name, len(prefix), data, len(data))
        prefix += _LOCAL.pack(
            0x04034B50, 20, 0, 0, 0, 33, zlib.crc32(data), len(data), len(data), len(name), 0
        )
        prefix += name.encode() + data
    order = range(n_members - 1, -1, -1) if layout == "unsorted" else range(n_members)
    for i in order:
        lo, size = spans[i]
        if layout == "into_directory" and i == n_members - 1:
            size += 64
        span = view[lo : lo + size] if digests else b""
        directory += _central(names[i], len(prefix) + headers[i], span, size)
    count = n_members + 2
    cd_offset = len(prefix) + len(body)
    eocd = _EOCD.pack(0x06054B50, 0, 0, count, count, len(directory), cd_offset, 0)
    return bytes(prefix + body + directory) + eocd


def _central(name: str, offset: int, data: bytes | memoryview, size: int) -> bytes:
    """A central-directory record for ``name`` at ``offset`` spanning ``size`` bytes."""
    crc = zlib.crc32(data)
    return (
        _CENTRAL.pack(
            0x02014B50, 20, 20, 0, 0, 0, 33, crc, size, size, len(name), 0, 0, 0, 0, 0, offset
        )
        + name.encode()
    )


# -- measuring a command -----------------------------------------------------------------------

_MEASURE = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.call(sys.argv[1:])\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


@dataclass(frozen=True)
class Measured:
    """What a command did: exit code, wall seconds, peak RSS in bytes and its stderr."""

    returncode: int
    seconds: float
    peak_rss: int
    stderr: str


def measure(argv: Sequence[str], *, timeout: float, cwd: str | os.PathLike[str]) -> Measured:
    """Run ``argv`` under a fresh parent that reports the command's own peak RSS.

    Both run in a session of their own: past ``timeout`` the whole session is killed (the
    command too, not only its parent) and :class:`subprocess.TimeoutExpired` is raised.
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _MEASURE, *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    seconds = time.perf_counter() - t0
    *lines, peak = err.rstrip("\n").split("\n")
    return Measured(proc.returncode, seconds, int(peak) * 1024, "\n".join(lines))


def best_of(runs: int, fn: Callable[[], object]) -> float:
    """The fastest of ``runs`` calls of ``fn``, in seconds (the least disturbed timing)."""
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def peak_rss_self() -> int:
    """Peak RSS of this process so far, in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- HTTP clients ------------------------------------------------------------------------------

CLIENT_KINDS = ("idle", "half_open", "trickle")
"""``idle`` sends nothing; ``half_open`` sends part of a request line and nothing more;
``trickle`` sends a request line, then one header byte every ``pace`` seconds."""


@dataclass
class _Client:
    kind: str
    pace: float
    sock: socket.socket
    opened: float
    next_send: float
    sent: int = 0


@dataclass
class ClientStats:
    """What the server did to the slow clients."""

    opened: int = 0
    closed_by_server: int = 0
    lifetimes: list[float] = field(default_factory=list)

    @property
    def longest(self) -> float:
        return max(self.lifetimes, default=0.0)


class SlowClients(threading.Thread):
    """``n`` slow HTTP clients of ``kinds`` (cycled) against ``address``, in one thread.

    Each client paces itself at one of ``paces`` (cycled); a client the server closes is
    counted (with how long it lived) and, with ``reconnect``, replaced at once, so the
    pressure stays at ``n`` connections.
    """

    def __init__(
        self,
        address: str,
        n: int,
        *,
        kinds: Sequence[str] = CLIENT_KINDS,
        paces: Sequence[float] = (0.5, 1.0, 5.0),
        reconnect: bool = True,
    ) -> None:
        super().__init__(daemon=True, name="slow-clients")
        host, port = address.rsplit(":", 1)
        self.target = (host, int(port))
        self.n, self.kinds, self.paces, self.reconnect = n, list(kinds), list(paces), reconnect
        self.stats = ClientStats()
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._made = 0

    def _open(self) -> None:
        kind = self.kinds[self._made % len(self.kinds)]
        pace = self.paces[self._made % len(self.paces)]
        self._made += 1
        try:
            sock = socket.create_connection(self.target, timeout=2)
        except OSError:
            return
        sock.setblocking(False)
        now = time.monotonic()
        client = _Client(kind, pace, sock, now, now)
        if kind == "half_open":
            sock.send(b"GET /metr")
        elif kind == "trickle":
            sock.send(b"GET /metrics HTTP/1.1\r\n")
            client.next_send = now + pace
        self._sel.register(sock, selectors.EVENT_READ, client)
        self.stats.opened += 1

    def run(self) -> None:
        try:
            for _ in range(self.n):
                self._open()
            while not self._halt.is_set():
                for key, _ in self._sel.select(timeout=0.05):
                    self._maybe_closed(key.data)
                now = time.monotonic()
                for key in list(self._sel.get_map().values()):
                    c = key.data
                    if c.kind == "trickle" and now >= c.next_send:
                        try:
                            c.sock.send(b"X")
                        except OSError:
                            self._closed(c)
                            continue
                        c.sent += 1
                        c.next_send = now + c.pace
        except BaseException as exc:  # surfaced through .error
            self.error = exc
        finally:
            for key in list(self._sel.get_map().values()):
                key.data.sock.close()
            self._sel.close()

    def _maybe_closed(self, c: _Client) -> None:
        try:
            data = c.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._closed(c)

    def _closed(self, c: _Client) -> None:
        self._sel.unregister(c.sock)
        c.sock.close()
        self.stats.closed_by_server += 1
        self.stats.lifetimes.append(time.monotonic() - c.opened)
        if self.reconnect and not self._halt.is_set():
            self._open()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)


def scrape(address: str, path: str = "/metrics", *, timeout: float = 2.0) -> int | None:
    """HTTP status of one GET of ``path`` answered within ``timeout`` seconds, else None."""
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            chunks = []
            while time.monotonic() < deadline:
                sock.settimeout(max(deadline - time.monotonic(), 0.01))
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
            else:
                return None
    except OSError:
        return None
    head = b"".join(chunks).split(b"\r\n", 1)[0].split()
    return int(head[1]) if len(head) >= 2 and head[1].isdigit() else None


@dataclass
class Probe:
    """One timed GET: path, when it was sent (monotonic), status (None: no answer in time)."""

    path: str
    at: float
    status: int | None
    seconds: float


class Prober(threading.Thread):
    """GETs each of ``paths`` every ``every`` seconds (each with ``timeout``) until stopped."""

    def __init__(
        self, address: str, paths: Sequence[str], *, every: float, timeout: float = 2.0
    ) -> None:
        super().__init__(daemon=True, name="prober")
        self.address, self.paths, self.every, self.timeout = address, list(paths), every, timeout
        self.probes: list[Probe] = []
        self._halt = threading.Event()

    def run(self) -> None:
        next_at = time.monotonic()
        while not self._halt.is_set():
            for path in self.paths:
                t0 = time.monotonic()
                status = scrape(self.address, path, timeout=self.timeout)
                self.probes.append(Probe(path, t0, status, time.monotonic() - t0))
            next_at += self.every
            self._halt.wait(max(next_at - time.monotonic(), 0.0))

    def stop(self) -> list[Probe]:
        self._halt.set()
        self.join(timeout=2 * self.timeout + 5)
        return self.probes

    def answered(self, path: str) -> tuple[int, int]:
        """(answered with 200, sent) for ``path``."""
        mine = [p for p in self.probes if p.path == path]
        return sum(p.status == 200 for p in mine), len(mine)
