"""Hostile inputs at ten times the sizes of issue 37: readers, and a live agent under attack.

Readers (each command in its own process, measured for wall time and peak RSS; target:
refused or finished in <= 5 s and <= 512 MB):

* ``manifest.sig`` of escaped quotes, never closed, at 2 MB (the issue's 200 KB froze the
  agent), through ``verify-artifact`` (the agent's path) and ``inspect`` without a key;
* every JSON-text family of ``tests/hostile_inputs.py`` as ``manifest.json`` at 320 KB (the
  issue's 32 KB took ``inspect`` 17.7 s) and at the manifest's 4 MiB cap;
* 160 MiB artifacts whose 600 members overlap, in every layout (the issue's 16 MiB with 60
  members took ``inspect`` 34 s and 2.95 GB).

Live agent (a real process on an embedded noida-db broker, default HTTP limits): 64 idle,
half-open and trickling clients (the target), then 320 (ten times the issue's 32), reconnecting
as they are closed, while a scraper GETs /metrics every 2 s, /healthz is probed every second,
and hostile candidates (the 2 MB signature, a 160 MiB overlapping artifact) are reloaded every
5 s; then one more hostile reload and SIGTERM at once. Targets: >= 95% of scrapes answered, /healthz 200 throughout, exit within
the grace period (``shutdown_timeout_s``, 10 s).

Writes its tables into bench/RESULTS.md under "## hostile (bench/hostile.py)".

Usage::

    .venv/bin/python bench/hostile.py                  # about 4 minutes
    .venv/bin/python bench/hostile.py --seconds 20     # shorter live phases
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from _results import machine_line, run_summary, write_section  # noqa: E402
from hostile_inputs import (  # noqa: E402
    JSON_FAMILIES,
    OVERLAP_LAYOUTS,
    Prober,
    SlowClients,
    manifest_artifact,
    measure,
    overlapping_artifact,
    signature_artifact,
)
from kafka_helpers import create_topics  # noqa: E402
from reliability_helpers import MODEL_TOPICS, PYTHON, agent_process  # noqa: E402

from boxwatch.agent.artifact import MAX_MANIFEST_BYTES  # noqa: E402
from boxwatch.embedded_broker import EmbeddedBroker  # noqa: E402

SECTION = "## hostile (bench/hostile.py)"
MAX_SECONDS = 5.0
MAX_PEAK = 512 << 20
SCRAPE_SHARE = 0.95
GRACE_S = 10
RELOAD_EVERY_S = 5.0


def manifest_of(make: Callable[[int], bytes], size: int) -> bytes:
    """An artifact whose manifest is ``make(size)``."""
    return manifest_artifact(make(size))


def reader_cases() -> list[tuple[str, Callable[[], bytes], str]]:
    """(case, make the artifact's bytes, verb) at ten times the issue's sizes."""
    cases: list[tuple[str, Callable[[], bytes], str]] = []
    sig = lambda: signature_artifact(JSON_FAMILIES["escaped_quotes"](2 << 20))  # noqa: E731
    cases += [("escaped_quotes as manifest.sig, 2 MB", sig, verb) for verb in ("verify", "inspect")]
    for family, make in sorted(JSON_FAMILIES.items()):
        for size, label in ((320 << 10, "320 KB"), (MAX_MANIFEST_BYTES, "4 MiB")):
            cases.append(
                (
                    f"{family} as manifest.json, {label}",
                    partial(manifest_of, make, size),
                    "inspect",
                )
            )
    for layout in OVERLAP_LAYOUTS:
        cases.append(
            (
                f"600 members overlapping ({layout}), 160 MiB",
                partial(overlapping_artifact, 160 << 20, 600, layout, digests=False),
                "inspect",
            )
        )
    return cases


def run_readers(workdir: Path, public_key: Path) -> tuple[list[str], bool]:
    lines = [
        "| case | command | exit | seconds | peak RSS | target (<= 5 s, <= 512 MB) |",
        "|---|---|---|---|---|---|",
    ]
    ok_all = True
    for case, make, verb in reader_cases():
        path = workdir / "case.bwa"
        path.write_bytes(make())
        argv = [PYTHON, "-m", "boxwatch"]
        if verb == "verify":
            argv += ["verify-artifact", str(path), "--public-key", str(public_key)]
        else:
            argv += ["inspect", str(path)]
        got = measure(argv, timeout=300, cwd=ROOT)
        ok = got.seconds <= MAX_SECONDS and got.peak_rss <= MAX_PEAK and got.returncode == 1
        ok = ok and len(got.stderr.strip().splitlines()) == 1
        ok_all &= ok
        command = "verify-artifact" if verb == "verify" else "inspect (no key)"
        lines.append(
            f"| {case} | {command} | {got.returncode} | {got.seconds:.2f} | "
            f"{got.peak_rss / 2**20:.0f} MB | {'met' if ok else 'MISSED'} |"
        )
        print(lines[-1], flush=True)
        path.unlink()
    return lines, ok_all


def run_live(
    workdir: Path, example, n_clients: int, seconds: float, broker: EmbeddedBroker
) -> tuple[str, bool]:
    """One live phase: ``n_clients`` slow clients, scrapes, probes and hostile reloads."""
    live = workdir / f"live-{n_clients}.bwa"
    shutil.copyfile(example.artifact, live)

    class Live:
        artifact, public_key, model = live, example.public_key, example.model

    agent = agent_process(
        workdir,
        f"agent-{n_clients}",
        Live,
        broker.bootstrap_servers,
        group_id=f"hostile-{n_clients}",
        topics=MODEL_TOPICS,
    )
    candidates = [
        signature_artifact(JSON_FAMILIES["escaped_quotes"](2 << 20)),
        overlapping_artifact(160 << 20, 600, "shared_blob", digests=False),
    ]
    try:
        agent.start().wait_ready()
        address = agent.metrics_address
        clients = SlowClients(address, n_clients, paces=(0.5, 1.0, 5.0))
        scraper = Prober(address, ["/metrics"], every=2.0, timeout=2.0)
        health = Prober(address, ["/healthz"], every=1.0, timeout=2.0)
        clients.start()
        time.sleep(2.0)
        scraper.start()
        health.start()
        reloads = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            tmp = live.with_name("candidate")
            tmp.write_bytes(candidates[reloads % len(candidates)])
            tmp.replace(live)
            agent.signal(signal.SIGHUP)
            reloads += 1
            time.sleep(RELOAD_EVERY_S)
        scraper.stop()
        health.stop()
        # One more hostile reload and SIGTERM at once, under the same clients.
        agent.signal(signal.SIGHUP)
        t_term = time.monotonic()
        agent.signal(signal.SIGTERM)
        try:
            code = agent.proc.wait(timeout=GRACE_S + 20) if agent.proc else None
        except subprocess.TimeoutExpired:
            code = None
        exit_s = time.monotonic() - t_term
        clients.stop()
    finally:
        agent.kill()
    scraped, scrapes = scraper.answered("/metrics")
    healthy, probes = health.answered("/healthz")
    refused = agent.log_text().count("artifact reload failed")
    tracebacks = agent.log_text().count("Traceback")
    ok = (
        scraped >= SCRAPE_SHARE * scrapes
        and healthy == probes
        and code == 0
        and exit_s <= GRACE_S
        and tracebacks == 0
    )
    latencies = sorted(p.seconds for p in scraper.probes if p.status == 200)
    worst = f"{latencies[-1] * 1000:.0f} ms" if latencies else "-"
    row = (
        f"| {n_clients} | {seconds:.0f} s | {scraped}/{scrapes} ({scraped / max(scrapes, 1):.0%}),"
        f" slowest {worst} | {healthy}/{probes} | {min(refused, reloads)} of {reloads} refused | "
        f"{clients.stats.closed_by_server} (longest {clients.stats.longest:.1f} s) | "
        f"{code}, {exit_s:.1f} s | {'met' if ok else 'MISSED'} |"
    )
    print(row, flush=True)
    return row, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="each live phase")
    parser.add_argument("--clients", type=int, nargs="+", default=[64, 320])
    parser.add_argument("--no-write", action="store_true", help="print only; RESULTS.md unchanged")
    args = parser.parse_args()
    began = time.perf_counter()
    from example_build import build_example

    with tempfile.TemporaryDirectory(prefix="boxwatch-hostile-") as tmp:
        workdir = Path(tmp)
        example = build_example(workdir / "example")
        readers, readers_ok = run_readers(workdir, example.public_key)
        broker = EmbeddedBroker("noida").start()
        try:
            create_topics(broker.bootstrap_servers, {t: 1 for t in MODEL_TOPICS.values()})
            live_rows = [
                "| slow clients | attack | /metrics every 2 s | /healthz every 1 s | "
                "hostile reloads | closed by the agent | SIGTERM exit | target |",
                "|---|---|---|---|---|---|---|---|",
            ]
            live_ok = True
            for n in args.clients:
                row, ok = run_live(workdir, example, n, args.seconds, broker)
                live_rows.append(row)
                live_ok &= ok
        finally:
            broker.stop()
    text = "\n".join(
        [
            machine_line(run_summary(began)),
            "",
            "Readers: each command in its own process (wall time includes the interpreter's "
            "start); exit 1 with one line is a refusal.",
            "",
            *readers,
            "",
            "Live agent (noida-db, default limits: metrics.request_timeout_s 5, "
            "metrics.max_connections 128, reload.timeout_s 60, shutdown_timeout_s 10); clients "
            "idle, half-open or trickling one byte every 0.5, 1 or 5 s, reconnecting when "
            "closed; a hostile reload every 5 s (the 2 MB signature, a 160 MiB artifact of 600 "
            "overlapping members); then one more with SIGTERM at once. Probes stop at SIGTERM.",
            "",
            *live_rows,
        ]
    )
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0 if readers_ok and live_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
