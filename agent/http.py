"""The agent's HTTP endpoints: ``/metrics``, ``/healthz``, ``/readyz`` and a status page.

One thread runs a selector loop on the configured address (loopback by default). Bounded,
so that no client can keep Prometheus or a liveness probe out: each request must arrive whole
(request line and headers) within ``request_timeout_s`` and take its answer within as much
again, however slowly it trickles; at most ``max_connections`` are open at once, and at the
cap a new connection closes the oldest one still sending its request, once that one has had
:data:`EVICTION_GRACE_S` to send it (until then new connections wait in the listen queue, where
a scraper's request arrives whole); a request head over :data:`MAX_REQUEST_HEAD_BYTES` is
refused (431). A client that goes away mid-answer is not an
error worth a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import html
import json
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.inputs import one_line
from boxwatch.agent.metrics import GATE_OUTCOMES, VERDICTS
from boxwatch.agent.preprocessing import RANGE_WARN_SHARE
from boxwatch.agent.vocab import VERDICT_REASONS

_T = TypeVar("_T")

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 5.0
"""Seconds a client has for its whole request line and headers (and again for its answer)."""
MAX_CONNECTIONS = 128
"""Connections open at once; at the cap a new one closes the oldest unfinished request."""
EVICTION_GRACE_S = 0.1
"""Seconds a connection keeps its place at the cap before a new one may close it: clients
that reconnect as fast as they are closed would otherwise turn the whole cap over within
milliseconds and close a scraper whose request is a moment behind its connection."""
MAX_REQUEST_HEAD_BYTES = 16 << 10
"""Bytes of request line and headers; more is answered 431."""
LISTEN_BACKLOG = 1024
"""Connections the kernel queues while the cap is held (the system's somaxconn may lower it)."""
ACCEPTS_PER_ROUND = (
    8  # then pending requests are read: fewer than the cap, so none is evicted unread
)
RECV_BYTES = 4096
STOP_JOIN_S = 5.0

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>boxwatch agent</title>
<meta http-equiv="refresh" content="5">
<style>body{{font-family:sans-serif;margin:2em;color:#222}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 10px;text-align:left}}th{{background:#f3f3f3}}
.warn{{color:#a40000;font-weight:bold}}</style>
</head><body>
<h1>boxwatch agent</h1>
<table>
<tr><th>artifact id</th><td id="artifact-id">{artifact_id}</td></tr>
<tr><th>model version</th><td id="model-version">{model_version}</td></tr>
<tr><th>ready</th><td id="ready">{ready}</td></tr>
<tr><th>broker</th><td id="broker">{broker}</td></tr>
<tr><th>consumption</th><td id="paused">{paused}</td></tr>
<tr><th>consumer lag</th><td id="lag">{lag}</td></tr>
<tr><th>records</th><td id="records">{records}</td></tr>
<tr><th>records/s, last minute</th><td id="rate-1m">{rate_1m:.1f}</td></tr>
<tr><th>records/s while handling batches, last minute</th><td id="rate-busy">{rate_busy}</td></tr>
<tr><th>records/s since start (average)</th><td id="rate-lifetime">{rate:.1f}</td></tr>
<tr><th>uncertainty rate</th><td id="uncertainty-rate">{uncertainty_rate:.4f}</td></tr>
<tr><th>reject rate</th><td id="reject-rate">{reject_rate:.4f}</td></tr>
<tr><th>dead letters</th><td id="dead-letters">{dead_letters}</td></tr>
{range_row}</table>
{verdict_section}{gate_section}<p><a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a> ·
<a href="/readyz">/readyz</a> · <a href="/status.json">/status.json</a></p>
</body></html>
"""


def _share(n: int, total: int) -> str:
    return f"{n / total:.3f}" if total else "-"


def _verdict_section(info: dict[str, Any]) -> str:
    """Live verdict counts and shares, beside the build's split on validation data, then the
    live count of each reason (``vocab.VERDICT_REASONS``).

    The build's split (``contents["verdict_split"]``, one column per validation set) is
    shown only when the artifact records it.
    """
    live = {v: info["verdicts"].get(v, 0) for v in VERDICTS}
    total = sum(live.values())
    split = info.get("build_verdict_split") or {}
    sets = [k for k in split if isinstance(split.get(k), dict)]
    head = "<tr><th>verdict</th><th>live</th><th>live share</th>" + "".join(
        f"<th>build: {html.escape(k)} (n={html.escape(str(split[k].get('n', '?')))})</th>"
        for k in sets
    )
    rows = [head + "</tr>"]
    for v, n in live.items():
        built = "".join(
            f'<td id="build-{html.escape(k)}-{v}">{_fmt_share(split[k].get(v))}</td>' for k in sets
        )
        rows.append(
            f'<tr><th>{v}</th><td id="verdict-{v}">{n}</td>'
            f'<td id="share-{v}">{_share(n, total)}</td>{built}</tr>'
        )
    note = (
        "<p>Build columns: share of each verdict the build measured on its validation sets.</p>"
        if sets
        else ""
    )
    reasons = info.get("reasons", {})
    why = "".join(
        f'<tr><th>{r}</th><td id="reason-{r}">{reasons.get(r, 0)}</td></tr>'
        for r in VERDICT_REASONS
    )
    return (
        f"<h2>Verdicts</h2><table>{''.join(rows)}</table>{note}<h2>Reasons</h2><table>{why}</table>"
    )


def _fmt_share(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, int | float) and not isinstance(v, bool) else "-"


def render_status_page(info: dict[str, Any]) -> str:
    """The status page for ``info`` (what the agent's ``/status.json`` returns).

    Sections follow the artifact: the verdict table only when it monitors a model, the
    BN-gate table only when it holds a BN (older callers without these keys get both).
    """

    def rows(counts: dict[str, int], prefix: str) -> str:
        return (
            "".join(
                f'<tr><th>{html.escape(k)}</th><td id="{prefix}-{html.escape(k)}">{v}</td></tr>'
                for k, v in sorted(counts.items())
            )
            or "<tr><td>none yet</td></tr>"
        )

    lag = info.get("lag")
    busy = info.get("records_per_second_busy_1m")
    range_row = ""
    if info.get("input_range_checked"):
        n_out = info.get("out_of_range", 0)
        share = info.get("out_of_range_recent_share", info.get("out_of_range_rate", 0.0))
        recent = info.get("out_of_range_recent_inputs")
        warn = bool(info.get("out_of_range_warning"))
        cls = ' class="warn"' if warn else ""
        of = f" of the last {recent}" if recent else ""
        hint = f" (over {RANGE_WARN_SHARE:.0%}: wrong scale or units?)" if warn else ""
        range_row = (
            f"<tr><th>inputs outside the training range</th>"
            f'<td id="out-of-range"{cls}>{n_out} ({share:.3f}{of}){hint}</td></tr>\n'
        )
    gate_section = (
        "<h2>BN gate</h2><table>"
        + rows({g: info["gate"].get(g, 0) for g in GATE_OUTCOMES}, "gate")
        + "</table>\n"
        if info.get("has_bn", True)
        else ""
    )
    verdict_section = _verdict_section(info) + "\n" if info.get("monitors_model", True) else ""
    return _PAGE.format(
        artifact_id=html.escape(str(info["artifact_id"])),
        model_version=html.escape(str(info["model_version"])),
        ready="yes" if info["ready"] else "no",
        broker="connected" if info.get("broker_connected") else "not connected",
        paused="paused (outputs cannot be delivered)" if info.get("paused") else "running",
        lag="-" if lag is None else str(lag),
        records=info["records"],
        rate_1m=info.get("records_per_second_1m", info["records_per_second"]),
        rate_busy="-" if busy is None else f"{busy:.1f}",
        rate=info.get("records_per_second_since_start", info["records_per_second"]),
        uncertainty_rate=info["uncertainty_rate"],
        reject_rate=info["reject_rate"],
        dead_letters=info["dead_letters"],
        range_row=range_row,
        verdict_section=verdict_section,
        gate_section=gate_section,
    )


class AgentHTTPServer:
    """Serves the endpoints from ``registry`` and the callables' answers, in one thread.

    A selector loop, not a thread per connection: an idle or trickling client costs a file
    descriptor and at most :data:`MAX_REQUEST_HEAD_BYTES` of buffer, never a thread. Every
    connection carries one request (``Connection: close``) and two deadlines of
    ``request_timeout_s`` each: one for its whole request line and headers (however they
    trickle in), then one for taking its answer. At ``max_connections`` a new connection
    closes the oldest one still sending its request that has been open for
    :data:`EVICTION_GRACE_S`; while there is none (every connection younger, or taking its
    answer), the server stops accepting and new connections wait in the kernel's listen queue.
    """

    def __init__(
        self,
        address: str,
        registry: CollectorRegistry,
        *,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
        status: Callable[[], dict[str, Any]],
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        def probe(check: Callable[[], bool], yes: bytes, no: bytes) -> Callable[[], _Answer]:
            return lambda: (200, "text/plain", yes) if check() else (503, "text/plain", no)

        self._routes: dict[str, Callable[[], _Answer]] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
            "/healthz": probe(healthy, b"ok\n", b"unhealthy\n"),
            "/readyz": probe(ready, b"ready\n", b"not ready\n"),
            "/status.json": lambda: (200, "application/json", json.dumps(status()).encode()),
            "/": lambda: (
                200,
                "text/html; charset=utf-8",
                render_status_page(status()).encode("utf-8"),
            ),
        }
        self._timeout = request_timeout_s
        self._max = max_connections
        self._grace = min(EVICTION_GRACE_S, request_timeout_s)
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        try:
            self._listener = socket.create_server(
                (host, int(port)),
                family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                backlog=LISTEN_BACKLOG,
            )
        except OSError as exc:
            reason = (
                "address already in use"
                if exc.errno == errno.EADDRINUSE
                else (exc.strerror or str(exc))
            )
            raise ConfigError(f"metrics.address {address}: cannot listen ({reason})") from None
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
        self._accepting = True
        self._selector.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._open: dict[socket.socket, _Connection] = {}  # oldest first
        self._stopping = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="boxwatch-http", daemon=True)

    @property
    def address(self) -> str:
        host, port = self._listener.getsockname()[:2]
        return f"{host!s}:{port}"

    def start(self) -> AgentHTTPServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close every connection (idempotent)."""
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(STOP_JOIN_S)
        if not self._thread.is_alive():
            self._release()

    # -- the loop -------------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            while not self._stopping.is_set():
                events = self._selector.select(self._wait_s())
                # Requests first, then new connections: a request whose bytes are here is
                # answered before any new connection can make room by closing it.
                for key, _ in sorted(events, key=lambda e: e[0].data is _LISTENER):
                    try:
                        self._dispatch(key.data)
                    except Exception as exc:  # one connection's failure never stops the loop
                        log.warning(
                            "metrics server: %s: %s", type(exc).__name__, one_line(str(exc))
                        )
                        if isinstance(key.data, _Connection):
                            self._close(key.data)
                self._expire()
                self._accept_while_room()
        finally:
            self._release()

    def _dispatch(self, what: Any) -> None:
        if what is _LISTENER:
            self._accept()
        elif what is _WAKE:
            with contextlib.suppress(OSError):
                self._wake_r.recv(64)
        elif what.sock not in self._open:  # closed earlier in this round
            return
        elif what.answer is None:
            self._read(what)
        else:
            self._write(what)

    def _wait_s(self) -> float:
        """Seconds until the nearest deadline, or until a connection may make room (at most one)."""
        times = [c.deadline for c in self._open.values()]
        if not self._accepting and (oldest := self._oldest_unfinished()) is not None:
            times.append(oldest.opened + self._grace)
        if not times:
            return 1.0
        return min(max(min(times) - time.monotonic(), 0.0), 1.0)

    def _accept(self) -> None:
        for _ in range(max(1, min(ACCEPTS_PER_ROUND, self._max // 4))):
            victim = None
            if len(self._open) >= self._max:
                victim = self._evictable(time.monotonic())
                if victim is None:
                    self._set_accepting(False)  # new connections wait in the listen queue
                    return
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors: free one for the next round
                log.debug("metrics server: accept failed (%s)", exc)
                if exc.errno in (errno.EMFILE, errno.ENFILE) and (
                    oldest := self._oldest_unfinished()
                ):
                    self._evict(oldest)
                return
            if victim is not None:  # closed only for a connection that came
                self._evict(victim)
            sock.setblocking(False)
            now = time.monotonic()
            conn = _Connection(sock, peer, now + self._timeout, now)
            self._open[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)
            self._read(conn)  # a client that sent its request with the connect: answered now

    def _accept_while_room(self) -> None:
        """Listen again once there is room under the cap, or a connection that may make it."""
        if self._accepting or self._stopping.is_set():
            return
        if len(self._open) < self._max or self._evictable(time.monotonic()) is not None:
            self._set_accepting(True)

    def _set_accepting(self, on: bool) -> None:
        if on != self._accepting:
            self._accepting = on
            if on:
                self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
            else:
                self._selector.unregister(self._listener)

    def _oldest_unfinished(self) -> _Connection | None:
        """The oldest connection still sending its request (``_open`` is oldest first)."""
        return next((c for c in self._open.values() if c.answer is None), None)

    def _evictable(self, now: float) -> _Connection | None:
        """The oldest connection still sending its request, if it has been open
        :data:`EVICTION_GRACE_S` at ``now``."""
        oldest = self._oldest_unfinished()
        return oldest if oldest is not None and oldest.opened + self._grace <= now else None

    def _evict(self, conn: _Connection) -> None:
        log.debug("metrics server: %s closed to make room (cap reached)", conn.peer)
        self._close(conn)

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._open.values() if c.deadline <= now]:
            log.debug("metrics server: %s closed at its request deadline", conn.peer)
            self._close(conn)

    def _read(self, conn: _Connection) -> None:
        data = self._exchange(conn, lambda: conn.sock.recv(RECV_BYTES))
        if data is None:
            return
        if not data:
            self._close(conn)
            return
        seen = len(conn.head)
        conn.head += data
        end = _head_end(conn.head, max(seen - 3, 0))
        if end >= 0:
            self._answer(conn, *self._respond(bytes(conn.head[:end]), conn.peer))
        elif len(conn.head) > MAX_REQUEST_HEAD_BYTES:
            self._answer(conn, 431, "text/plain", b"request head too large\n")

    def _respond(self, head: bytes, peer: Any) -> _Answer:
        """The answer to a request whose line and headers are ``head``."""
        parts = head.split(b"\n", 1)[0].rstrip(b"\r").split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return 400, "text/plain", b"bad request\n"
        if parts[0] != b"GET":
            return 501, "text/plain", b"only GET is served\n"
        route = self._routes.get(parts[1].split(b"?", 1)[0].decode("latin-1"))
        if route is None:
            return 404, "text/plain", b"not found\n"
        try:
            return route()
        except Exception as exc:  # an endpoint's failure is one answer's, not the server's
            log.warning(
                "metrics server: request from %s failed: %s: %s",
                peer,
                type(exc).__name__,
                one_line(str(exc), 300),
            )
            return 500, "text/plain", b"internal error\n"

    def _answer(self, conn: _Connection, code: int, ctype: str, body: bytes) -> None:
        head = (
            f"HTTP/1.0 {code} {HTTPStatus(code).phrase}\r\n"
            f"Server: boxwatch-agent\r\nDate: {formatdate(usegmt=True)}\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        conn.answer = memoryview(head.encode("latin-1") + body)
        conn.deadline = time.monotonic() + self._timeout
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _exchange(self, conn: _Connection, io: Callable[[], _T]) -> _T | None:
        """``io``'s result (one ``recv`` or ``send``), or ``None`` where the socket would block
        or the client is gone (then its connection is closed)."""
        try:
            return io()
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            log.debug("metrics server: client %s gone (%s)", conn.peer, exc)
            self._close(conn)
            return None

    def _write(self, conn: _Connection) -> None:
        answer = conn.answer
        assert answer is not None
        sent = self._exchange(conn, lambda: conn.sock.send(answer))
        if sent is None:
            return
        conn.answer = answer[sent:]
        if not conn.answer:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            self._close(conn)

    def _close(self, conn: _Connection) -> None:
        self._open.pop(conn.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(conn.sock)
        conn.sock.close()

    def _release(self) -> None:
        """Close the connections, the listener and the selector (once)."""
        if self._closed:
            return
        self._closed = True
        for conn in list(self._open.values()):
            self._close(conn)
        self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()


_Answer = tuple[int, str, bytes]
_LISTENER, _WAKE = object(), object()


@dataclass(eq=False)
class _Connection:
    """One client: its request head so far, then its answer still to send."""

    sock: socket.socket
    peer: Any
    deadline: float
    opened: float
    head: bytearray = field(default_factory=bytearray)
    answer: memoryview | None = None


def _head_end(head: bytearray, start: int) -> int:
    """Where the blank line ending the request head begins in ``head`` (searched from
    ``start``), or -1; lines may end in CRLF or a bare LF."""
    ends = [i for i in (head.find(b"\r\n\r\n", start), head.find(b"\n\n", start)) if i >= 0]
    return min(ends, default=-1)
