"""The agent's HTTP endpoints: ``/metrics``, ``/healthz``, ``/readyz`` and a status page.

Stdlib server in a daemon thread; binds the configured address (loopback by default).
Bounded: each connection has a socket timeout (a slow or idle client is dropped), at most
``max_connections`` are served at once (more are closed on accept), and a client that goes
away mid-answer is not an error worth a traceback.
"""

from __future__ import annotations

import errno
import html
import json
import logging
import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.metrics import GATE_OUTCOMES, VERDICTS

log = logging.getLogger(__name__)

CONNECTION_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 32
# A client that leaves or stalls: not the server's fault, logged at debug level only.
_CLIENT_GONE = (ConnectionError, TimeoutError, socket.timeout)

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
<tr><th>records/s since start</th><td id="rate-lifetime">{rate:.1f}</td></tr>
<tr><th>uncertainty rate</th><td id="uncertainty-rate">{uncertainty_rate:.4f}</td></tr>
<tr><th>reject rate</th><td id="reject-rate">{reject_rate:.4f}</td></tr>
<tr><th>dead letters</th><td id="dead-letters">{dead_letters}</td></tr>
{range_row}</table>
{verdict_section}{gate_section}<p><a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a> ·
<a href="/readyz">/readyz</a> · <a href="/status.json">/status.json</a></p>
</body></html>
"""
# A share of inputs outside the training range above this is shown as a warning.
RANGE_WARN_SHARE = 0.05


def _share(n: int, total: int) -> str:
    return f"{n / total:.3f}" if total else "-"


def _verdict_section(info: dict[str, Any]) -> str:
    """Live verdict counts and shares, beside the build's split on validation data.

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
    return f"<h2>Verdicts</h2><table>{''.join(rows)}</table>{note}"


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
    range_row = ""
    if info.get("input_range_checked"):
        n_out = info.get("out_of_range", 0)
        share = info.get("out_of_range_rate", 0.0)
        cls = ' class="warn"' if share > RANGE_WARN_SHARE else ""
        hint = " (wrong scale or units?)" if cls else ""
        range_row = (
            f"<tr><th>inputs outside the training range</th>"
            f'<td id="out-of-range"{cls}>{n_out} ({share:.3f}){hint}</td></tr>\n'
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
        rate=info["records_per_second"],
        uncertainty_rate=info["uncertainty_rate"],
        reject_rate=info["reject_rate"],
        dead_letters=info["dead_letters"],
        range_row=range_row,
        verdict_section=verdict_section,
        gate_section=gate_section,
    )


class AgentHTTPServer:
    """Serves the endpoints from ``registry`` and the callables' answers."""

    def __init__(
        self,
        address: str,
        registry: CollectorRegistry,
        *,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
        status: Callable[[], dict[str, Any]],
        timeout_s: float = CONNECTION_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        host, _, port = address.rpartition(":")

        class Handler(BaseHTTPRequestHandler):
            timeout = timeout_s  # StreamRequestHandler sets it on the connection's socket

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
                elif path == "/healthz":
                    ok = healthy()
                    self._send(200 if ok else 503, "text/plain", b"ok\n" if ok else b"unhealthy\n")
                elif path == "/readyz":
                    ok = ready()
                    self._send(
                        200 if ok else 503, "text/plain", b"ready\n" if ok else b"not ready\n"
                    )
                elif path == "/status.json":
                    self._send(200, "application/json", json.dumps(status()).encode())
                elif path == "/":
                    self._send(
                        200,
                        "text/html; charset=utf-8",
                        render_status_page(status()).encode("utf-8"),
                    )
                else:
                    self._send(404, "text/plain", b"not found\n")

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                return

        try:
            self.server = _BoundedServer((host.strip("[]"), int(port)), Handler, max_connections)
        except OSError as exc:
            reason = (
                "address already in use"
                if exc.errno == errno.EADDRINUSE
                else (exc.strerror or str(exc))
            )
            raise ConfigError(f"metrics.address {address}: cannot listen ({reason})") from None
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="boxwatch-http", daemon=True
        )

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> AgentHTTPServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _BoundedServer(ThreadingHTTPServer):
    """A threading server with a cap on concurrent connections and quiet client errors."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Any, max_connections: int) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.debug("metrics server: %s refused, connection cap reached", client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, _CLIENT_GONE):
            log.debug("metrics server: client %s gone (%s)", client_address, exc)
        else:
            log.warning(
                "metrics server: request from %s failed: %s: %s",
                client_address,
                type(exc).__name__,
                exc,
            )
