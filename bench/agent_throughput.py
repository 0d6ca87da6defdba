"""End-to-end agent throughput and latency on a real (embedded) Kafka-protocol broker.

Measured in one run, on the bundled example (64-float inputs, 2 monitored layers, credit BN):

* the bare ceiling of the same Kafka client (kafka-python): consume a batch, decode each
  float32 input, produce a small verdict per record, flush with acks=all, commit;
* the agent's records/s with binary (raw float32) and JSON inputs, as a share of it;
* monitor time as a fraction of model time at batch 256 (in-process, same artifact);
* p50 / p99 end-to-end latency (produce -> verdict readable) at 1,000 records/s.

Run: ``.venv/bin/python bench/agent_throughput.py [--records 20000] [--broker noida]``.
Writes its table to bench/RESULTS.md under "## agent_throughput".
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.structs import OffsetAndMetadata

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine_line, write_section

from boxwatch.agent.artifact import write_artifact
from boxwatch.agent.cli_agent import build_agent
from boxwatch.agent.config import load_agent_config
from boxwatch.agent.keys import generate_keypair, load_private_key
from boxwatch.agent.records import TENSOR_TYPE
from boxwatch.demo import write_build_config
from boxwatch.embedded_broker import EmbeddedBroker
from boxwatch.examples import example_path
from boxwatch.offline.build import build, prepare
from boxwatch.offline.config import load_config

HEADING = "## agent_throughput (bench/agent_throughput.py)"
PARTITIONS = 6
GROUP = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


def build_artifact(workdir: Path) -> tuple[Path, Path]:
    generate_keypair(workdir / "k.key", workdir / "k.pub", force=True)
    config = write_build_config(workdir)
    raw = yaml.safe_load(config.read_text())
    raw["monitor"]["tau"] = [1.0, 0.2, 0.05]
    config.write_text(yaml.safe_dump(raw))
    out = build(prepare(load_config(config)), load_private_key(workdir / "k.key"))
    write_artifact(workdir / "a.bwa", out.artifact)
    return workdir / "a.bwa", workdir / "k.pub"


def fill(bootstrap: str, topic: str, x: np.ndarray, n: int, form: str) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=10,
                             batch_size=256 * 1024)
    for i in range(n):
        row = x[i % len(x)]
        if form == "binary":
            producer.send(topic, row.astype("<f4").tobytes(),
                          headers=[("content-type", TENSOR_TYPE.encode()), ("id", str(i).encode()),
                                   ("dtype", b"float32")])
        else:
            producer.send(topic, json.dumps({"id": str(i), "input": row.tolist()}).encode())
    producer.flush()
    producer.close()


def ceiling(bootstrap: str, topic: str, n: int) -> float:
    """Records/s of the bare consume-decode-produce-flush-commit loop."""
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id="ceiling",
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             max_poll_records=256, **GROUP)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=2)
    done, t0 = 0, None
    deadline = time.monotonic() + 300
    while done < n and time.monotonic() < deadline:
        polled = consumer.poll(timeout_ms=100, max_records=256)
        if not polled:
            continue
        t0 = t0 or time.perf_counter()
        offsets = {}
        for tp, recs in polled.items():
            for r in recs:
                x = np.frombuffer(r.value, dtype="<f4")
                producer.send("bench.ceiling-out", json.dumps(
                    {"id": dict(r.headers)["id"].decode(), "verdict": "accept",
                     "score": float(x[0])}).encode())
            offsets[tp] = OffsetAndMetadata(recs[-1].offset + 1, "", -1)
            done += len(recs)
        producer.flush()
        consumer.commit(offsets)
    seconds = time.perf_counter() - t0
    consumer.close()
    producer.close()
    return done / seconds


def agent_rate(bootstrap: str, artifact: Path, public: Path, topic: str, n: int,
               group: str) -> float:
    """Records/s of the agent on a pre-filled topic (from its first batch to the last)."""
    cfg = load_agent_config(None, environ={}, overrides={
        "artifact": str(artifact), "public_keys": [str(public)],
        "model": str(example_path("digits", "model.onnx")), "kafka.bootstrap_servers": bootstrap,
        "kafka.group_id": group, "topics.inputs": topic, "topics.verdicts": f"{topic}.verdicts",
        "topics.dead_letter": "bench.dlq", "metrics.address": "127.0.0.1:0",
        "kafka.create_topics": True})
    agent = build_agent(cfg)
    agent.check_topics()
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    t0 = None
    deadline = time.monotonic() + 600
    while agent.status.records < n and time.monotonic() < deadline:
        if t0 is None and agent.status.records > 0:
            t0, r0 = time.perf_counter(), agent.status.records
        time.sleep(0.005)
    seconds = time.perf_counter() - t0
    agent.stop()
    thread.join(timeout=20)
    return (agent.status.records - r0) / seconds


def monitor_fraction(artifact: Path, public: Path, x: np.ndarray) -> tuple[float, float, float]:
    """Median model and monitor seconds for batches of 256, and their ratio."""
    from boxwatch.agent.runtime import load_runtime

    rt = load_runtime(artifact, [str(public)], model_path=example_path("digits", "model.onnx"))
    batch = x[np.arange(256) % len(x)]
    inf, mon = [], []
    for _ in range(200):
        res = rt.run_model(batch)
        inf.append(res.inference_seconds)
        mon.append(res.monitor_seconds)
    mi, mm = float(np.median(inf)), float(np.median(mon))
    return mi, mm, mm / mi


def cnn_monitor_fraction() -> tuple[float, float, float] | None:
    """Model vs monitor time at batch 256 for bench/monitors.py's MNIST CNN (4 layers).

    Needs ../shared/data/mnist and bench/.cache/cnn.onnx (run bench/monitors.py first);
    returns None when either is absent.
    """
    from boxwatch.agent.taps import OnnxTap
    from boxwatch.offline.datasets import read_idx
    from boxwatch.offline.monitor import BoxMonitor

    root = Path(__file__).resolve().parents[1]
    data, model = root.parent / "shared" / "data" / "mnist", root / "bench" / ".cache" / "cnn.onnx"
    if not (data / "train10k-images-idx3-ubyte.gz").is_file() or not model.is_file():
        return None
    x = read_idx(data / "train10k-images-idx3-ubyte.gz")[:3000].astype(np.float32)[:, None] / 255
    y = read_idx(data / "train10k-labels-idx1-ubyte.gz")[:3000].astype(np.int64)
    layers = ["/pool2/MaxPool_output_0", "/act3/Relu_output_0", "/act4/Relu_output_0", "logits"]
    tap = OnnxTap(model, layers, pooling={layers[0]: "avg"}, threads=1)
    logits, acts = tap.run(x)
    pred = logits.argmax(1)
    fit = slice(0, 2000)
    monitor = BoxMonitor(layers, tau=0.05, combine="calibrated").fit(
        {k: v[fit] for k, v in acts.items()}, y[fit], pred[fit])
    monitor.calibrate({k: v[2000:] for k, v in acts.items()}, pred[2000:])
    rt = monitor.runtime_
    batch = x[:256]
    inf, mon = [], []
    for _ in range(100):
        t0 = time.perf_counter()
        lg, a = tap.run(batch)
        t1 = time.perf_counter()
        rt.assess(a, lg.argmax(1))
        inf.append(t1 - t0)
        mon.append(time.perf_counter() - t1)
    mi, mm = float(np.median(inf)), float(np.median(mon))
    return mi, mm, mm / mi


def latency(bootstrap: str, artifact: Path, public: Path, x: np.ndarray, rate: int,
            seconds: float) -> tuple[float, float, int]:
    """p50 / p99 milliseconds from produce to a readable verdict at ``rate`` records/s."""
    topic = "bench.lat"
    cfg = load_agent_config(None, environ={}, overrides={
        "artifact": str(artifact), "public_keys": [str(public)],
        "model": str(example_path("digits", "model.onnx")), "kafka.bootstrap_servers": bootstrap,
        "kafka.group_id": "lat", "topics.inputs": topic, "topics.verdicts": "bench.lat.verdicts",
        "topics.dead_letter": "bench.dlq", "metrics.address": "127.0.0.1:0",
        "kafka.create_topics": True, "batch.max_wait_ms": 5})
    agent = build_agent(cfg)
    agent.check_topics()
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    consumer = KafkaConsumer("bench.lat.verdicts", bootstrap_servers=bootstrap,
                             auto_offset_reset="latest", fetch_max_wait_ms=5)
    consumer.poll(timeout_ms=2000)
    time.sleep(4)  # let the agent's group join finish before timing
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    sent: dict[str, int] = {}
    lat: list[float] = []

    def produce() -> None:
        n = int(rate * seconds)
        start = time.perf_counter()
        for i in range(n):
            target = start + i / rate
            while time.perf_counter() < target:
                time.sleep(0.0002)
            rid = f"l{i}"
            sent[rid] = time.perf_counter_ns()
            producer.send(topic, x[i % len(x)].astype("<f4").tobytes(),
                          headers=[("content-type", TENSOR_TYPE.encode()), ("id", rid.encode()),
                                   ("dtype", b"float32")])
            if i % 20 == 0:
                producer.flush()
        producer.flush()

    pt = threading.Thread(target=produce)
    pt.start()
    deadline = time.monotonic() + seconds + 30
    n = int(rate * seconds)
    while len(lat) < n and time.monotonic() < deadline:
        for recs in consumer.poll(timeout_ms=50).values():
            now = time.perf_counter_ns()
            for r in recs:
                rid = json.loads(r.value)["id"]
                if rid in sent:
                    lat.append((now - sent[rid]) / 1e6)
    pt.join()
    agent.stop()
    thread.join(timeout=20)
    consumer.close()
    producer.close()
    warm = lat[int(0.1 * len(lat)):]
    return float(np.percentile(warm, 50)), float(np.percentile(warm, 99)), len(lat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--broker", choices=["noida", "tansu"], default="noida")
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        artifact, public = build_artifact(work)
        x = np.load(work / "data" / "stream.npz")["x_known"]
        broker = EmbeddedBroker(args.broker).start()
        try:
            b = broker.bootstrap_servers
            admin = KafkaAdminClient(bootstrap_servers=b)
            admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in (
                "bench.bin", "bench.json", "bench.ceiling-out", "bench.bin.verdicts",
                "bench.json.verdicts", "bench.dlq", "bench.lat", "bench.lat.verdicts")])
            admin.close()
            fill(b, "bench.bin", x, args.records, "binary")
            fill(b, "bench.json", x, args.records, "json")
            bare = ceiling(b, "bench.bin", args.records)
            binary = agent_rate(b, artifact, public, "bench.bin", args.records, "agent-bin")
            as_json = agent_rate(b, artifact, public, "bench.json", args.records, "agent-json")
            p50, p99, n_lat = latency(b, artifact, public, x, 1000, args.latency_seconds)
        finally:
            broker.stop()
        model_s, monitor_s, frac = monitor_fraction(artifact, public, x)
        cnn = cnn_monitor_fraction()
    rows = [
        ("bare client ceiling (consume, decode, produce, flush, commit)", f"{bare:,.0f} rec/s", "-"),
        ("agent, binary float32 inputs", f"{binary:,.0f} rec/s",
         f"{binary / bare:.0%} of ceiling (target >= 70%)"),
        ("agent, JSON inputs", f"{as_json:,.0f} rec/s", f"{as_json / bare:.0%} of ceiling"),
        ("model call, batch 256 (median)", f"{model_s * 1e3:.3f} ms", "-"),
        ("monitors, batch 256 (median)", f"{monitor_s * 1e3:.3f} ms",
         f"{frac:.0%} of model time (target <= 10%)"),
        ("MNIST CNN (bench/monitors.py), model call, batch 256",
         "-" if cnn is None else f"{cnn[0] * 1e3:.3f} ms", "needs ../shared/data and its cache"),
        ("MNIST CNN, 4 monitored layers, batch 256", "-" if cnn is None else f"{cnn[1] * 1e3:.3f} ms",
         "-" if cnn is None else f"{cnn[2]:.0%} of model time (target <= 10%)"),
        (f"end-to-end latency at 1,000 rec/s ({n_lat} records; agent in the bench's process, "
         "sharing the GIL with the load generator; bench/soak.py runs it as its own process)",
         f"p50 {p50:.1f} ms, p99 {p99:.1f} ms", "target p99 <= 50 ms"),
    ]
    table = "\n".join(["| measure | value | against target |", "|---|---|---|",
                       *(f"| {a} | {b} | {c} |" for a, b, c in rows)])
    text = "\n".join([machine_line(f"{args.broker} broker, kafka-python, {args.records:,} records, "
                                   f"{PARTITIONS} partitions, 64-float inputs"), "", table])
    print(text)
    write_section(HEADING, text)


if __name__ == "__main__":
    main()
