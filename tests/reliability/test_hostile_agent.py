"""No file and no client can freeze the agent (issue 37), at sizes that keep CI fast.

The hostile inputs are generated as families (``tests/hostile_inputs.py``): JSON text full of
escapes, terminated or not, brackets inside strings, deep nesting; members overlapping each
other or the central directory in several layouts; idle, half-open and trickling HTTP
clients at several paces. Readers are timed at two sizes (the larger must not take more than
3x the linear share of time) and ``inspect`` is measured for time and peak memory in its own
process. A real agent on a real embedded broker is probed while slow clients hold its
connection cap and hostile candidates are reloaded: ``/healthz`` answers every probe,
``/metrics`` at least 95% of them, and SIGTERM ends it within its grace period.
``bench/hostile.py`` runs the issue's cases at ten times their sizes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hostile_inputs import (
    JSON_FAMILIES,
    OVERLAP_LAYOUTS,
    Prober,
    SlowClients,
    best_of,
    manifest_artifact,
    measure,
    overlapping_artifact,
    signature_artifact,
)
from kafka_helpers import create_topics
from reliability_helpers import (
    MODEL_TOPICS,
    PYTHON,
    ROOT,
    AgentProcess,
    agent_process,
    refusals_at_start,
    shared_example,
)

from boxwatch.agent import artifact as art
from boxwatch.agent.errors import ArtifactError
from boxwatch.commands.console import EXIT_FAILED
from boxwatch.embedded_broker import EmbeddedBroker, available_kinds

RELOADS = "boxwatch_agent_artifact_reloads_total"
REQUEST_TIMEOUT_S = 2  # the live agent's metrics.request_timeout_s
MAX_CONNECTIONS = 16  # the live agent's metrics.max_connections: 64 slow clients overflow it
GRACE_S = 10  # the live agent's shutdown_timeout_s (the default)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return shared_example(tmp_path_factory)


def _refusal(data: bytes) -> Callable[[], None]:
    def load() -> None:
        with pytest.raises(ArtifactError):
            art.load_artifact(data, None)

    return load


# -- readers: time linear in the input, memory bounded -------------------------------------------
@pytest.mark.parametrize("family", sorted(JSON_FAMILIES))
def test_hostile_manifest_text_is_refused_in_linear_time(family):
    """What ``inspect`` without a key reads first: 8x the text, at most 24x the time (a
    rescan at every quote gave 64x), and 2 MB in well under 2 s."""
    make = JSON_FAMILIES[family]
    small, large = manifest_artifact(make(256 << 10)), manifest_artifact(make(2 << 20))
    t_small = best_of(3, _refusal(small))
    t_large = best_of(3, _refusal(large))
    assert t_large < 2.0, (family, t_large)
    assert t_large < 24 * max(t_small, 1e-3), (family, t_small, t_large)


@pytest.mark.parametrize("layout", OVERLAP_LAYOUTS)
def test_overlapping_members_are_refused_whatever_their_size(layout):
    """Refused from the index: 8x the bytes (and 4x the members) costs no more than 24x."""
    small = overlapping_artifact(1 << 20, 15, layout)
    large = overlapping_artifact(8 << 20, 60, layout)
    t_small = best_of(3, _refusal(small))
    t_large = best_of(3, _refusal(large))
    assert t_large < 0.5, (layout, t_large)
    assert t_large < 24 * max(t_small, 1e-3), (layout, t_small, t_large)


def _inspect(path: Path) -> object:
    return measure([PYTHON, "-m", "boxwatch", "inspect", str(path)], timeout=120, cwd=ROOT)


@pytest.mark.slow
def test_inspect_refuses_hostile_artifacts_fast_in_bounded_memory(example, tmp_path):
    """The issue's ``inspect`` cases: escaped quotes as the manifest (32 KB took 17.7 s), and
    60 members over the same 16 MiB (34 s, 2.95 GB): exit 1 with one line, within seconds,
    peak memory within 3x the file of what inspecting the example takes."""
    baseline = _inspect(example.artifact)
    assert baseline.returncode == 0, baseline.stderr[-2000:]
    cases = {
        "escaped_quotes_manifest": manifest_artifact(JSON_FAMILIES["escaped_quotes"](320 << 10)),
        "overlapping_members": overlapping_artifact(16 << 20, 60, "shared_blob"),
    }
    for name, blob in cases.items():
        path = tmp_path / f"{name}.bwa"
        path.write_bytes(blob)
        got = _inspect(path)
        lines = got.stderr.strip().splitlines()
        assert got.returncode == EXIT_FAILED and len(lines) == 1, (name, got.stderr[-2000:])
        assert "Traceback" not in got.stderr, (name, got.stderr[-2000:])
        assert got.seconds < baseline.seconds + 5.0, (name, got.seconds, baseline.seconds)
        assert got.peak_rss < baseline.peak_rss + 3 * len(blob) + (64 << 20), (
            name,
            got.peak_rss >> 20,
            baseline.peak_rss >> 20,
        )


# -- the live agent ----------------------------------------------------------------------------------
HOSTILE_CANDIDATES: dict[str, Callable[[], bytes]] = {
    # The case: 200 KB of escaped quotes as manifest.sig (froze the agent).
    "escaped_quotes_signature_200KB": lambda: signature_artifact(
        JSON_FAMILIES["escaped_quotes"](200 << 10)
    ),
    # As much of another family as the signature's cap lets through.
    "escaped_strings_signature": lambda: signature_artifact(
        JSON_FAMILIES["escaped_strings_in_array"](art.MAX_SIGNATURE_BYTES)
    ),
    "escaped_quotes_manifest_2MB": lambda: manifest_artifact(
        JSON_FAMILIES["escaped_quotes"](2 << 20)
    ),
    "overlapping_shared_blob": lambda: overlapping_artifact(4 << 20, 60, "shared_blob"),
    "overlapping_into_directory": lambda: overlapping_artifact(4 << 20, 60, "into_directory"),
}
"""name -> the bytes of a candidate artifact the agent must refuse at once."""


@dataclass
class LiveAgent:
    """A real agent process on a real broker; its artifact path can be replaced."""

    agent: AgentProcess
    live: Path
    good: Path

    @property
    def address(self) -> str:
        return self.agent.metrics_address

    def ensure_running(self) -> None:
        if not self.agent.alive:
            shutil.copyfile(self.good, self.live)
            self.agent.start().wait_ready()

    def place(self, blob: bytes) -> None:
        tmp = self.live.with_name("candidate")
        tmp.write_bytes(blob)
        os.replace(tmp, self.live)

    def reloads(self, result: str) -> float | None:
        m = self.agent.scrape()
        return m.get(f'{RELOADS}{{result="{result}"}}') if m else None


@pytest.fixture(scope="module")
def live(example, tmp_path_factory) -> Iterator[LiveAgent]:
    kinds = available_kinds()
    if "noida" not in kinds:
        pytest.skip("the noida broker binary is not installed (pip install noida-db)")
    workdir = tmp_path_factory.mktemp("hostile-agent")
    broker = EmbeddedBroker("noida").start()
    agent = None
    try:
        create_topics(broker.bootstrap_servers, {t: 1 for t in MODEL_TOPICS.values()})
        live_path = workdir / "live.bwa"
        shutil.copyfile(example.artifact, live_path)

        class Live:
            artifact, public_key, model = live_path, example.public_key, example.model

        agent = agent_process(
            workdir,
            "agent",
            Live,
            broker.bootstrap_servers,
            topics=MODEL_TOPICS,
            metrics__request_timeout_s=REQUEST_TIMEOUT_S,
            metrics__max_connections=MAX_CONNECTIONS,
            reload__timeout_s=5,
        )
        handle = LiveAgent(agent, live_path, example.artifact)
        handle.ensure_running()
        yield handle
    finally:
        if agent is not None:
            agent.kill()
        broker.stop()


@pytest.mark.integration
def test_slow_clients_never_shut_out_health_or_metrics(live):
    """64 idle, half-open and trickling clients (one byte every 0.5, 1 or 5 s), reconnecting
    as soon as they are closed, against a cap of 16: /healthz answers every probe (one late),
    /metrics at least 95%, and no slow client keeps its connection past the request deadline.
    (Turning the cap over as fast as the clients reconnected closed one scrape in seven in CI.)"""
    live.ensure_running()
    clients = SlowClients(live.address, 64, paces=(0.5, 1.0, 5.0))
    health = Prober(live.address, ["/healthz"], every=0.25, timeout=2.0)
    scraper = Prober(live.address, ["/metrics"], every=0.25, timeout=2.0)
    clients.start()
    try:
        time.sleep(1.0)
        health.start()
        scraper.start()
        time.sleep(5.0)
    finally:
        health.stop()
        scraper.stop()
        clients.stop()
    assert clients.error is None
    healthy, probes = health.answered("/healthz")
    scraped, scrapes = scraper.answered("/metrics")
    # The probers share this process with the clients' thread: on a loaded machine one of
    # their requests can reach the server late; bench/hostile.py measures the strict target.
    assert probes >= 8 and healthy >= probes - 1, health.probes
    assert scrapes >= 8 and scraped >= 0.95 * scrapes, scraper.probes
    assert clients.stats.closed_by_server >= 64
    assert clients.stats.longest < REQUEST_TIMEOUT_S + 1.5, clients.stats.longest
    assert live.agent.alive, live.agent.log_tail()


@pytest.mark.integration
def test_hostile_reloads_are_refused_at_once_and_the_agent_keeps_answering(live):
    """Each hostile candidate on SIGHUP: counted as a failure within seconds, while /healthz
    and /metrics answer every probe and the agent's peak memory grows by less than 64 MB."""
    live.ensure_running()
    before = live.agent.peak_rss_bytes()
    failures = live.reloads("failure") or 0.0
    prober = Prober(live.address, ["/healthz", "/metrics"], every=0.2, timeout=2.0)
    prober.start()
    slow: dict[str, float] = {}
    try:
        for name, make in HOSTILE_CANDIDATES.items():
            live.place(make())
            t0 = time.monotonic()
            live.agent.signal(signal.SIGHUP)
            failures += 1
            while live.reloads("failure") != failures and time.monotonic() - t0 < 10:
                assert live.agent.alive, live.agent.log_tail()
                time.sleep(0.05)
            slow[name] = time.monotonic() - t0
            assert live.reloads("failure") == failures, (name, live.agent.log_tail())
    finally:
        prober.stop()
        shutil.copyfile(live.good, live.live)
    assert max(slow.values()) < 5.0, slow
    healthy, probes = prober.answered("/healthz")
    scraped, scrapes = prober.answered("/metrics")
    assert healthy == probes and scraped == scrapes, prober.probes
    assert live.agent.peak_rss_bytes() - before < 64 << 20
    assert live.reloads("timeout") == 0
    log = live.agent.log_text()
    assert "Traceback" not in log, live.agent.log_tail(60)


@pytest.mark.integration
def test_sigterm_during_a_hostile_reload_and_slow_clients_exits_in_the_grace_period(live):
    live.ensure_running()
    clients = SlowClients(live.address, 64, paces=(0.5, 5.0))
    clients.start()
    try:
        time.sleep(1.0)
        live.place(HOSTILE_CANDIDATES["escaped_quotes_signature_200KB"]())
        live.agent.signal(signal.SIGHUP)
        t0 = time.monotonic()
        live.agent.signal(signal.SIGTERM)
        assert live.agent.proc is not None
        try:
            code = live.agent.proc.wait(timeout=GRACE_S + 10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit {GRACE_S + 10} s after SIGTERM:\n{live.agent.log_tail()}")
        elapsed = time.monotonic() - t0
    finally:
        clients.stop()
        shutil.copyfile(live.good, live.live)
    assert code == 0, live.agent.log_tail()
    assert elapsed <= GRACE_S, elapsed


@pytest.mark.slow
def test_hostile_artifacts_at_start_are_refused_within_seconds(example, tmp_path):
    """Started with the issue's 200 KB signature (it printed nothing for 60 s), a 2 MB
    escaped manifest or 60 overlapping members: exit 1 with one line, within seconds."""
    names = ["escaped_quotes_signature_200KB", "escaped_quotes_manifest_2MB"]
    names.append("overlapping_shared_blob")
    paths = {}
    for name in names:
        paths[name] = tmp_path / f"{name}.bwa"
        paths[name].write_bytes(HOSTILE_CANDIDATES[name]())
    refusals_at_start(example, paths, within=30)
