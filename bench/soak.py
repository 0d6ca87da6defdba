"""Soak: the agent (a real subprocess) under a steady binary stream for a long time.

Streams 64-float binary inputs at ``--rate`` records/s (default 2,000) for ``--minutes``
(default 30) into an embedded broker, and checks, after a warm-up:

* RSS growth of the agent process <= 5 % (sampled every 5 s from /proc/PID/status);
* no errors: every input has its verdict, no produce errors, no dead letters, one process;
* p99 end-to-end latency of the last window at most 20 % above that of the first window
  after warm-up (windows of 5 minutes, or half of what is left after warm-up on shorter
  runs); a last window faster than the first passes.

Latency of one input = time its verdict is read here minus the time it was handed to the
producer (written into its id); the paced stream and the reader use confluent-kafka
(bench/_stream.py) so they add little of their own; ``--library`` picks the agent's client. Writes its table into
bench/RESULTS.md under "## soak (bench/soak.py)".

Usage::

    .venv/bin/python bench/soak.py                 # 30 minutes
    .venv/bin/python bench/soak.py --minutes 3     # a short run
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

sys.path.insert(0, str(ROOT / "bench"))
from _stream import Retention, VerdictReader, paced_stream  # noqa: E402
from kafka_helpers import create_topics  # noqa: E402
from reliability_helpers import MODEL_TOPICS, TOPICS, agent_process, stream_rows  # noqa: E402

from boxwatch.agent.kafka import LIBRARIES  # noqa: E402
from boxwatch.embedded_broker import EmbeddedBroker  # noqa: E402

SECTION = "## soak (bench/soak.py)"
RSS_LIMIT = 0.05
P99_LIMIT = 0.20


def p99(values: list[float]) -> float:
    return float(np.percentile(values, 99)) if values else float("nan")


def write_results(lines: list[str], section: str = SECTION) -> None:
    """Replace (or append) ``section`` of bench/RESULTS.md with ``lines``."""
    path = ROOT / "bench" / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Bench results\n"
    block = "\n".join([section, "", *lines, ""]) + "\n"
    start = text.find(section)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + block
    else:
        nxt = text.find("\n## ", start + len(section))
        text = text[:start] + block + (text[nxt + 1 :] if nxt >= 0 else "")
    path.write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=2000.0, help="records per second")
    ap.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="warm-up seconds (default: 2 minutes, or 1/6 of a short run)",
    )
    ap.add_argument("--broker", choices=("noida", "tansu"), default="noida")
    ap.add_argument(
        "--library",
        choices=list(LIBRARIES),
        default="kafka-python",
        help="the agent's Kafka client library",
    )
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/boxwatch-soak"))
    ap.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    args = ap.parse_args()
    seconds = args.minutes * 60
    warm = args.warmup if args.warmup is not None else min(120.0, seconds / 6)
    window = min(300.0, (seconds - warm) / 2)
    args.workdir.mkdir(parents=True, exist_ok=True)

    from example_build import build_example

    t_start = time.time()
    example = build_example(args.workdir / "example")
    broker = EmbeddedBroker(args.broker).start()
    agent = None
    collector = VerdictReader(broker.bootstrap_servers, TOPICS["verdicts"])
    retention: Retention | None = None
    rss: list[tuple[float, int]] = []
    errors: list[str] = []
    try:
        create_topics(
            broker.bootstrap_servers,
            {
                TOPICS["inputs"]: 4,
                TOPICS["verdicts"]: 4,
                TOPICS["dead_letter"]: 1,
                TOPICS["gate"]: 1,
            },
        )
        (args.workdir / "agent.log").unlink(missing_ok=True)
        agent = agent_process(
            args.workdir,
            "agent",
            example,
            broker.bootstrap_servers,
            topics=MODEL_TOPICS,
            group_id="soak",
            kafka__library=args.library,
        ).start()
        agent.wait_ready(120)
        collector.start()
        collector.ready.wait(30)
        retention = Retention(
            broker.bootstrap_servers,
            TOPICS["inputs"],
            "soak",
            TOPICS["verdicts"],
            collector,
            partitions=4,
        )
        retention.start()
        stop = threading.Event()
        halt = threading.Event()

        def sample() -> None:
            t0 = time.monotonic()
            while not stop.wait(5.0):
                if not agent.alive:  # say when and how, then let the stream end
                    assert agent.proc is not None  # started above
                    errors.append(
                        f"agent exited with {agent.proc.returncode} after "
                        f"{time.monotonic() - t0:.0f} s"
                    )
                    print(errors[-1], flush=True)
                    halt.set()
                    return
                rss.append((time.monotonic() - t0, agent.rss_bytes()))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        gc.collect()
        gc.freeze()  # the example build's objects leave the GC's scans (reader pauses)
        t_stream = time.time()
        rows = stream_rows(example, 4096, seed=7)
        sent = paced_stream(
            broker.bootstrap_servers, TOPICS["inputs"], rows, args.rate, seconds, errors, stop=halt
        )
        deadline = time.monotonic() + 120
        while len(collector.seen) < sent and time.monotonic() < deadline:
            time.sleep(0.5)
        stop.set()
        metrics = agent.scrape()
        alive, starts, peak = agent.alive, agent.starts, agent.peak_rss_bytes()
        cpu = _cpu_seconds(agent.pid)
        code = agent.stop()
    finally:
        collector.halt.set()
        if retention is not None:
            retention.halt.set()
        if agent is not None:
            agent.kill()
        broker.stop()
    collector.join(10)

    lat = [(t - t_stream, v) for t, v in collector.lat]
    first = [v for t, v in lat if warm <= t < warm + window]
    last = [v for t, v in lat if seconds - window <= t < seconds]
    after = [b for t, b in rss if t >= warm]
    growth = (max(after[-3:]) - after[0]) / after[0] if len(after) > 3 else float("nan")
    p99_first, p99_last = p99(first), p99(last)
    drift = (p99_last - p99_first) / p99_first if p99_first else float("nan")
    lost = sent - len(collector.seen)
    produce_errors = metrics.get("boxwatch_agent_produce_errors_total", -1)
    dead = metrics.get('boxwatch_agent_outputs_total{kind="dead_letter"}', -1)
    ok = {
        "rss": growth <= RSS_LIMIT,
        "errors": (
            lost == 0
            and produce_errors == 0
            and dead == 0
            and not errors
            and alive
            and starts == 1
            and code == 0
        ),
        "p99": drift <= P99_LIMIT,
    }
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    lines = [
        f"_{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; this machine: {os.cpu_count()} cores "
        f"(shared with other jobs), {mem:.0f} GB RAM, Python {platform.python_version()}; "
        f"broker {args.broker}; agent client {args.library}; total run {time.time() - t_start:.0f} s_",
        "",
        f"Run: {args.minutes:g} min at {args.rate:g} records/s (binary float32 x 64, 4 "
        f"partitions, batch <= 256); warm-up {warm:.0f} s; latency windows {window:.0f} s "
        "(first after warm-up vs last).",
        "",
        "| figure | value | target | pass |",
        "|---|---|---|---|",
        f"| inputs sent / verdicts (distinct ids) | {sent:,} / {len(collector.seen):,} "
        f"({collector.dups} duplicates) | all | {'yes' if lost == 0 else 'NO'} |",
        f"| achieved rate | {sent / seconds:,.0f} records/s | {args.rate:g} | |",
        f"| agent RSS after warm-up: first / last / peak (VmHWM) | {after[0] / 2**20:.1f} / "
        f"{after[-1] / 2**20:.1f} / {peak / 2**20:.1f} MiB | | |"
        if after
        else "| RSS | n/a | | |",
        f"| RSS growth after warm-up | {growth * 100:+.2f} % | <= 5 % | "
        f"{'yes' if ok['rss'] else 'NO'} |",
        f"| p99 latency, first window after warm-up | {p99_first * 1e3:.1f} ms | | |",
        f"| p99 latency, last window | {p99_last * 1e3:.1f} ms | <= first + 20 % | "
        f"{'yes' if ok['p99'] else 'NO'} ({drift * 100:+.1f} %) |",
        "| latency p50 / p90 / p99 / max, whole run | "
        + " / ".join(
            f"{np.percentile([v for _, v in lat], q) * 1e3:.0f}" for q in (50, 90, 99, 100)
        )
        + " ms | | |",
        f"| produce errors / dead letters / client errors | {produce_errors:g} / {dead:g} / "
        f"{len(errors)} | 0 | {'yes' if ok['errors'] else 'NO'} |",
        f"| retention passes (DeleteRecords below committed inputs and read verdicts, every "
        f"60 s) / errors | {retention.deleted_batches} / {len(retention.errors)} | | |",
        f"| agent process: starts / exit code / CPU | {starts} / {code} / "
        f"{cpu / seconds * 100:.0f} % of one core | 1 / 0 | |",
    ]
    if args.minutes < 30:
        lines += [
            "",
            f"This was a SHORT run ({args.minutes:g} min); the 30-minute run "
            "(`bench/soak.py` without --minutes) has not been recorded here.",
        ]
    print("\n".join(lines))
    if not args.no_write:
        write_results(lines)
    return 0 if all(ok.values()) else 1


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
