"""The agent's HTTP server under slow, idle and greedy clients (issue 37): a whole-request
deadline, eviction of the oldest unfinished request at the connection cap (after its grace),
and answers."""

from __future__ import annotations

import socket
import time

import pytest
from hostile_inputs import SlowClients, scrape
from prometheus_client import CollectorRegistry

from boxwatch.agent.http import MAX_REQUEST_HEAD_BYTES, AgentHTTPServer


@pytest.fixture
def server_factory():
    """``server_factory(**kw)``: a started server on a free loopback port, stopped after."""
    made: list[AgentHTTPServer] = []

    def factory(*, ready: bool = True, **kw) -> AgentHTTPServer:
        made.append(
            AgentHTTPServer(
                "127.0.0.1:0",
                CollectorRegistry(),
                healthy=lambda: True,
                ready=lambda: ready,
                status=lambda: {},
                **kw,
            ).start()
        )
        return made[-1]

    yield factory
    for srv in made:
        srv.stop()


def _connect(srv: AgentHTTPServer) -> socket.socket:
    host, port = srv.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _closed_after(sock: socket.socket, limit: float, pace: float | None = None) -> float:
    """Seconds until the server closes ``sock`` (sending a byte every ``pace`` s), or
    ``limit`` if it is still open then."""
    t0 = time.monotonic()
    sock.settimeout(pace or limit)
    while time.monotonic() - t0 < limit:
        try:
            if pace is not None:
                sock.send(b"X")
            if sock.recv(65536) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - t0
    return limit


@pytest.mark.parametrize("pace", [0.1, 0.3, 0.7])
def test_a_trickling_request_is_cut_at_its_deadline(server_factory, pace):
    """One byte every ``pace`` s keeps no connection past the request deadline (the old
    per-recv timeout never fired)."""
    srv = server_factory(request_timeout_s=1.0)
    sock = _connect(srv)
    sock.sendall(b"GET /metrics HTTP/1.1\r\n")
    try:
        assert _closed_after(sock, 6.0, pace) < 2.0
    finally:
        sock.close()


@pytest.mark.parametrize("sent", [b"", b"GET /metr", b"GET /healthz HTTP/1.1\r\nHost: x\r\n"])
def test_idle_and_half_open_requests_are_cut_at_the_deadline(server_factory, sent):
    srv = server_factory(request_timeout_s=1.0)
    sock = _connect(srv)
    sock.sendall(sent)
    try:
        assert 0.5 < _closed_after(sock, 6.0) < 2.0
    finally:
        sock.close()


@pytest.mark.parametrize("kinds", [("idle",), ("half_open",), ("trickle",), ("idle", "trickle")])
def test_health_and_metrics_answer_while_slow_clients_hold_the_cap(server_factory, kinds):
    """4 times the cap in slow clients, reconnecting as they are closed: /healthz and
    /metrics are answered (the oldest unfinished request makes room) on at least 95% of
    requests, issue 37's target for scrapes; a loaded machine can delay a scraper's bytes
    past its turn, so one lost answer in 20 is allowed, never a wrong one."""
    srv = server_factory(request_timeout_s=2.0, max_connections=8)
    clients = SlowClients(srv.address, 32, kinds=kinds, paces=(0.2, 0.5))
    clients.start()
    try:
        time.sleep(0.5)
        answers = [scrape(srv.address, path, timeout=2.0) for path in ("/healthz", "/metrics") * 20]
    finally:
        clients.stop()
    assert clients.error is None
    assert set(answers) <= {200, None}, answers
    assert answers.count(200) >= 0.95 * len(answers), answers
    assert clients.stats.closed_by_server >= 20  # evicted to make room


def test_a_request_a_moment_behind_its_connection_keeps_its_place(server_factory):
    """Clients reconnecting as fast as they are closed turned the whole cap over in
    milliseconds, closing a scraper whose request came 30 ms after its connect (one scrape in
    seven lost in CI): a connection keeps its place for the grace period, and new ones wait
    in the listen queue meanwhile."""
    srv = server_factory(request_timeout_s=2.0, max_connections=8)
    clients = SlowClients(srv.address, 32, kinds=("idle",))
    clients.start()
    answers = []
    try:
        time.sleep(0.5)
        for _ in range(10):
            with _connect(srv) as sock:
                time.sleep(0.03)
                try:
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    answers.append(sock.recv(64)[:12])
                except OSError as exc:
                    answers.append(type(exc).__name__.encode())
    finally:
        clients.stop()
    assert clients.error is None
    assert answers == [b"HTTP/1.0 200"] * 10, answers
    assert clients.stats.closed_by_server >= 20  # the cap still turns over
    assert clients.stats.longest < 2.0


def test_a_connection_at_the_cap_closes_one_slow_client_only(server_factory):
    """One new connection at the cap closes exactly one slow client, the oldest, and only
    once it has arrived: none is closed for a connection the listen queue does not hold."""
    srv = server_factory(request_timeout_s=5.0, max_connections=8)
    slow = [_connect(srv) for _ in range(8)]
    newcomer = None
    try:
        time.sleep(0.3)  # every slow client past its grace, none near its deadline
        newcomer = _connect(srv)
        time.sleep(0.5)
        closed = [_closed_after(sock, 0.05) < 0.05 for sock in slow]
        assert closed == [True] + [False] * 7, closed
        assert _closed_after(newcomer, 0.05) == 0.05  # kept: it is the one that came
    finally:
        for sock in [*slow, newcomer]:
            if sock is not None:
                sock.close()


def test_an_oversized_request_head_is_refused(server_factory):
    srv = server_factory()
    sock = _connect(srv)
    try:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: " + b"a" * MAX_REQUEST_HEAD_BYTES)
        assert sock.recv(64).startswith(b"HTTP/1.0 431")
    finally:
        sock.close()


def _raw(srv: AgentHTTPServer, request: bytes) -> bytes:
    with _connect(srv) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"200"),
        (b"GET /healthz?verbose=1 HTTP/1.0\r\n\r\n", b"200"),
        (b"GET /readyz HTTP/1.1\n\n", b"503"),
        (b"GET /nope HTTP/1.1\r\n\r\n", b"404"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"501"),
        (b"GET /\r\n\r\n", b"400"),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", b"400"),
    ],
)
def test_answers(server_factory, request_bytes, status):
    srv = server_factory(ready=False)
    answer = _raw(srv, request_bytes)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].split(b" ")[1] == status, answer[:200]
    length = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
    assert length and int(length[0].split(b":")[1]) == len(body)


def test_stop_closes_open_connections_at_once(server_factory):
    srv = server_factory(request_timeout_s=30.0)
    socks = [_connect(srv) for _ in range(5)]
    time.sleep(0.2)
    t0 = time.monotonic()
    srv.stop()
    assert time.monotonic() - t0 < 2.0
    for sock in socks:
        assert _closed_after(sock, 2.0) < 2.0
        sock.close()


def test_a_failing_endpoint_is_one_500_and_the_server_goes_on(caplog):
    def broken() -> dict:
        raise RuntimeError("status\nunavailable")

    srv = AgentHTTPServer(
        "127.0.0.1:0",
        CollectorRegistry(),
        healthy=lambda: True,
        ready=lambda: True,
        status=broken,
    ).start()
    try:
        assert scrape(srv.address, "/status.json") == 500
        assert scrape(srv.address, "/healthz") == 200
    finally:
        srv.stop()
    assert "RuntimeError: status\\nunavailable" in caplog.text
