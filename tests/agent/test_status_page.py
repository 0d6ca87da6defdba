"""The agent's status page ``/`` rendered in headless Chromium after a known stream.

The rendered DOM (``--dump-dom``) must show the artifact id, the model version and the
verdict, gate and dead-letter counts of the records the test sent (read back from the
agent's output topics); a screenshot is kept under ``test-artifacts/``.
"""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from live_agent import BAD_RECORDS, start_broker
from locations import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = ROOT
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Flags from the machine notes: no sandbox as root, and no background connections (the
# network is closed here, and a test must not phone anywhere).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
)


class _TextById(HTMLParser):
    """Text content of every element that has an id, and every link target."""

    def __init__(self) -> None:
        super().__init__()
        self.text: dict[str, str] = {}
        self.links: list[str] = []
        self._open: list[str | None] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        self._open.append(a.get("id"))
        if a.get("id"):
            self.text[a["id"]] = ""

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()

    def handle_data(self, data):
        for element_id in self._open:
            if element_id:
                self.text[element_id] += data


def chromium(url: str, *args: str, profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
        capture_output=True,
        text=True,
        timeout=90,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def streamed(example, live_agent_factory):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    broker = start_broker()
    agent = None
    try:
        agent = live_agent_factory(broker.bootstrap_servers, "status")
        uncertain = agent.uncertain_rows(3)
        agent.start()
        outcome = agent.stream(n_known=40, n_unknown=20, n_bn=25, extra=uncertain)
        yield example, agent, outcome
    finally:
        if agent is not None:
            agent.stop()
        broker.stop()


def test_status_page_in_headless_chromium(streamed, tmp_path):
    example, agent, outcome = streamed
    url = f"http://{agent.address}/"
    dump = chromium(url, "--dump-dom", profile=tmp_path / "profile-dom")
    assert dump.returncode == 0, dump.stderr[-2000:]
    page = _TextById()
    page.feed(dump.stdout)
    text = {k: v.strip() for k, v in page.text.items()}

    runtime = example.runtime()
    assert text["artifact-id"] == runtime.artifact_id
    assert {v["artifact_id"] for v in outcome.verdicts} == {runtime.artifact_id}
    assert {v["model_version"] for v in outcome.verdicts} == {text["model-version"]}
    assert int(text["records"]) == outcome.sent
    assert int(text["dead-letters"]) == len(BAD_RECORDS) == len(outcome.dead_letter_reasons)
    shown_verdicts = {
        k.removeprefix("verdict-"): int(v) for k, v in text.items() if k.startswith("verdict-")
    }
    # Every verdict and gate outcome is shown, zero counts included.
    assert shown_verdicts == {
        v: outcome.verdict_counts.get(v, 0) for v in ("accept", "uncertainty", "reject")
    }
    shown_gate = {k.removeprefix("gate-"): int(v) for k, v in text.items() if k.startswith("gate-")}
    assert shown_gate == {
        g: outcome.gate_counts.get(g, 0) for g in ("certified", "blocked", "unverified")
    }
    n = len(outcome.verdicts)
    assert text["reject-rate"] == f"{outcome.verdict_counts['reject'] / n:.4f}"
    assert text["uncertainty-rate"] == f"{outcome.verdict_counts['uncertainty'] / n:.4f}"
    assert "/metrics" in page.links
    # Issue 29: broker and consumption state, the last minute's rate, the input-range check.
    assert text["broker"] == "connected" and text["paused"] == "running"
    assert float(text["rate-1m"]) > 0
    assert text["out-of-range"].split()[0].isdigit()

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "status-page.png"
    shot.unlink(missing_ok=True)
    result = chromium(
        url, f"--screenshot={shot}", "--window-size=900,1000", profile=tmp_path / "profile-shot"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000
