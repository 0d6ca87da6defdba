"""The agent's HTTP endpoints: ``/metrics``, ``/healthz``, ``/readyz`` and a status page.

Stdlib server in a daemon thread; binds the configured address (loopback by default).
"""

from __future__ import annotations

import html
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from boxwatch.agent.metrics import GATE_OUTCOMES, VERDICTS

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>boxwatch agent</title>
<meta http-equiv="refresh" content="5">
<style>body{{font-family:sans-serif;margin:2em;color:#222}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 10px;text-align:left}}th{{background:#f3f3f3}}</style>
</head><body>
<h1>boxwatch agent</h1>
<table>
<tr><th>artifact id</th><td id="artifact-id">{artifact_id}</td></tr>
<tr><th>model version</th><td id="model-version">{model_version}</td></tr>
<tr><th>ready</th><td id="ready">{ready}</td></tr>
<tr><th>records</th><td id="records">{records}</td></tr>
<tr><th>records/s</th><td>{rate:.1f}</td></tr>
<tr><th>uncertainty rate</th><td id="uncertainty-rate">{uncertainty_rate:.4f}</td></tr>
<tr><th>reject rate</th><td id="reject-rate">{reject_rate:.4f}</td></tr>
<tr><th>dead letters</th><td id="dead-letters">{dead_letters}</td></tr>
</table>
<h2>Verdicts</h2><table>{verdict_rows}</table>
<h2>BN gate</h2><table>{gate_rows}</table>
<p><a href="/metrics">/metrics</a> · <a href="/healthz">/healthz</a> ·
<a href="/readyz">/readyz</a> · <a href="/status.json">/status.json</a></p>
</body></html>
"""


def render_status_page(info: dict[str, Any]) -> str:
    """The status page for ``info`` (what :func:`status_info` returns)."""

    def rows(counts: dict[str, int], prefix: str) -> str:
        return (
            "".join(
                f'<tr><th>{html.escape(k)}</th><td id="{prefix}-{html.escape(k)}">{v}</td></tr>'
                for k, v in sorted(counts.items())
            )
            or "<tr><td>none yet</td></tr>"
        )

    return _PAGE.format(
        artifact_id=html.escape(str(info["artifact_id"])),
        model_version=html.escape(str(info["model_version"])),
        ready="yes" if info["ready"] else "no",
        records=info["records"],
        rate=info["records_per_second"],
        uncertainty_rate=info["uncertainty_rate"],
        reject_rate=info["reject_rate"],
        dead_letters=info["dead_letters"],
        verdict_rows=rows({v: info["verdicts"].get(v, 0) for v in VERDICTS}, "verdict"),
        gate_rows=rows({g: info["gate"].get(g, 0) for g in GATE_OUTCOMES}, "gate"),
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
    ) -> None:
        host, _, port = address.rpartition(":")

        class Handler(BaseHTTPRequestHandler):
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

        self.server = ThreadingHTTPServer((host.strip("[]"), int(port)), Handler)
        self.server.daemon_threads = True
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
