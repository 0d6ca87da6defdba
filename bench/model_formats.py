"""The agent with the bundled example as ONNX and as a ``torch.export`` program (``.pt2``).

The same weights both ways (the ``.pt2`` is exported from ``examples/digits/model.onnx``'s
initializers into ``examples/digits/train_model.py``'s ``DigitsMLP``), the same monitored
layers (``input``, the first ReLU, the second linear layer), one artifact built for each.
Measured for each format:

* start-up: a fresh ``python`` process importing the agent and building it from the
  artifact (imports, signature and digests, model load), wall clock;
* the tap alone (model call with the monitored layers), batches of 1 and 256;
* ``agent.process`` per record (decode, model, monitors, verdict records), in-process,
  binary inputs, batches of 16 and 256;
* the agent streaming from an embedded broker (kafka-python, 6 partitions), records/s,
  looping in the thread that loaded the model (as ``boxwatch agent`` does) and in another
  thread (``bench/agent_throughput.py``'s ``agent_rate``, as an application embedding the
  agent may).

Each figure is the best of ``--rounds`` rounds that alternate the formats (this machine is
shared: the least disturbed round); the in-process ones are each round's median.

Run: ``.venv/bin/python bench/model_formats.py [--records 20000] [--rounds 3]``.
Writes its table to bench/RESULTS.md under "## model_formats".
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine_line, run_summary, write_section
from agent_throughput import agent_rate, create, fill

from boxwatch.agent.artifact import write_artifact
from boxwatch.agent.config import load_agent_config
from boxwatch.agent.keys import generate_keypair, load_private_key
from boxwatch.agent.records import TENSOR_TYPE
from boxwatch.agent.service import build_agent
from boxwatch.commands.demo import write_build_config
from boxwatch.embedded_broker import EmbeddedBroker
from boxwatch.examples import example_path
from boxwatch.offline.release.config import load_config
from boxwatch.offline.release.pipeline import build, prepare

HEADING = "## model_formats (bench/model_formats.py)"
LAYERS = {
    "onnx": ["input", "/act1/Relu_output_0", "/fc2/Gemm_output_0"],
    "torch": ["input", "act1", "fc2"],
}
_STARTUP = """
import json, sys
from boxwatch.agent.config import load_agent_config
from boxwatch.agent.service import build_agent
build_agent(load_agent_config(None, environ={}, overrides=json.loads(sys.argv[1])))
"""


def digits_pt2(out: Path) -> Path:
    """The bundled ONNX model's weights in its torch module, saved with ``torch.export``."""
    import onnx
    from onnx import numpy_helper

    spec = importlib.util.spec_from_file_location(
        "train_model", example_path("digits", "train_model.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    graph = onnx.load(str(example_path("digits", "model.onnx"))).graph
    weights = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in graph.initializer}
    model = module.DigitsMLP()
    model.load_state_dict(weights)
    model.eval()
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(model, (torch.zeros(2, 64),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, str(out))
    return out


def build_artifacts(work: Path) -> dict[str, tuple[Path, Path]]:
    """Format -> (artifact, model): one build per format, the same data and parameters."""
    key = work / "k.key"
    generate_keypair(key, work / "k.pub", force=True)
    config = write_build_config(work)
    models = {"onnx": example_path("digits", "model.onnx"), "torch": digits_pt2(work / "d.pt2")}
    out = {}
    for fmt, model in models.items():
        raw = yaml.safe_load(config.read_text())
        raw["model"].update({"path": str(model), "format": fmt})
        if fmt == "torch":  # the program's input is its forward argument
            raw["model"]["input_name"] = "x"
        raw["layers"] = LAYERS[fmt]
        raw["monitor"]["tau"] = [1.0, 0.2, 0.05]
        raw.pop("bn", None)
        path = work / f"build-{fmt}.yaml"
        path.write_text(yaml.safe_dump(raw))
        built = build(prepare(load_config(path)), load_private_key(key))
        artifact = work / f"{fmt}.bwa"
        write_artifact(artifact, built.artifact)
        out[fmt] = (artifact, model)
    return out


def overrides(artifact: Path, model: Path, public: Path) -> dict[str, object]:
    return {
        "artifact": str(artifact),
        "public_keys": [str(public)],
        "model": str(model),
        "topics.inputs": "in",
        "topics.verdicts": "v",
        "topics.dead_letter": "dlq",
    }


def startup(settings: dict[str, object]) -> float:
    """Seconds of a fresh process (interpreter start included) until the agent is built."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", _STARTUP, json.dumps(settings)], check=True)
    return time.perf_counter() - t0


def tap_seconds(agent, x: np.ndarray, batch: int, repeats: int) -> float:
    """Median seconds of one tap call (model and monitored layers) on ``batch`` rows."""
    rt = agent.runtime
    rows = rt.preprocessing.apply(x[np.arange(batch) % len(x)])
    for _ in range(10):
        rt.tap.run(rows)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        rt.tap.run(rows)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def process_us(agent, x: np.ndarray, batch: int, repeats: int) -> float:
    """Median microseconds per record of ``agent.process`` on binary records."""
    records = [
        SimpleNamespace(
            topic="in",
            partition=0,
            offset=i,
            value=x[i % len(x)].astype("<f4").tobytes(),
            headers=[
                ("content-type", TENSOR_TYPE.encode()),
                ("id", str(i).encode()),
                ("dtype", b"float32"),
            ],
            key=None,
            timestamp=0,
        )
        for i in range(batch)
    ]
    for _ in range(5):
        agent.process(records)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        agent.process(records)
        times.append((time.perf_counter() - t0) / batch * 1e6)
    return statistics.median(times)


def rate_in_this_thread(
    bootstrap: str, artifact: Path, public: Path, model: Path, n: int, group: str
) -> float:
    """Records/s of the agent looping in the thread that loaded the model, as ``boxwatch
    agent`` runs it (a watcher thread times it and stops it after ``n`` records)."""
    settings = {
        **overrides(artifact, model, public),
        "topics.inputs": "bench.fmt",
        "topics.verdicts": "bench.fmt.verdicts",
        "topics.dead_letter": "bench.dlq",
        "kafka.bootstrap_servers": bootstrap,
        "kafka.group_id": group,
        "metrics.address": "127.0.0.1:0",
        "kafka.library": "kafka-python",
    }
    agent = build_agent(load_agent_config(None, environ={}, overrides=settings))
    agent.check_topics()
    timed: dict[str, float] = {}

    def watch() -> None:
        deadline = time.monotonic() + 600
        while agent.status.records < n and time.monotonic() < deadline:
            if "t0" not in timed and agent.status.records > 0:
                timed["t0"], timed["r0"] = time.perf_counter(), agent.status.records
            time.sleep(0.005)
        timed["t1"], timed["r1"] = time.perf_counter(), agent.status.records
        agent.stop()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    agent.run()
    watcher.join()
    return (timed["r1"] - timed["r0"]) / (timed["t1"] - timed["t0"])


def streaming(
    built: dict[str, tuple[Path, Path]], public: Path, x: np.ndarray, args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    """Best records/s of the agent on a pre-filled topic, per format and per thread the
    agent loops in: ``loading`` (the model's) or ``other`` (alternating rounds)."""
    best = {where: dict.fromkeys(built, 0.0) for where in ("loading", "other")}
    broker = EmbeddedBroker("noida").start()
    try:
        b = broker.bootstrap_servers
        create(b, ["bench.fmt", "bench.fmt.verdicts", "bench.dlq"])
        fill(b, "bench.fmt", x, args.records, "binary")
        for k in range(args.rounds):
            for fmt, (artifact, model) in built.items():
                here = rate_in_this_thread(b, artifact, public, model, args.records, f"h{fmt}{k}")
                best["loading"][fmt] = max(best["loading"][fmt], here)
                other = agent_rate(
                    b,
                    artifact,
                    public,
                    "bench.fmt",
                    args.records,
                    f"o{fmt}{k}",
                    "kafka-python",
                    model=model,
                )
                best["other"][fmt] = max(best["other"][fmt], other.per_s)
    finally:
        broker.stop()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        built = build_artifacts(work)
        public = work / "k.pub"
        x = np.load(work / "data" / "stream.npz")["x_known"]
        settings = {fmt: overrides(a, m, public) for fmt, (a, m) in built.items()}
        agents = {
            fmt: build_agent(load_agent_config(None, environ={}, overrides=s))
            for fmt, s in settings.items()
        }
        # Rounds alternate the formats; each figure is the best round's median (this machine
        # is shared: the least disturbed round).
        runs: dict[str, dict[str, list[float]]] = {fmt: {} for fmt in built}
        for _ in range(args.rounds):
            for fmt, agent in agents.items():
                for key, value in (
                    ("startup", startup(settings[fmt])),
                    ("tap1", tap_seconds(agent, x, 1, 300)),
                    ("tap256", tap_seconds(agent, x, 256, 150)),
                    ("proc16", process_us(agent, x, 16, 100)),
                    ("proc256", process_us(agent, x, 256, 50)),
                ):
                    runs[fmt].setdefault(key, []).append(value)
        figures = {fmt: {k: min(v) for k, v in r.items()} for fmt, r in runs.items()}
        rates = streaming(built, public, x, args)
    o, t = figures["onnx"], figures["torch"]
    rows = [
        (
            "start-up: a fresh process until the agent is built (imports, artifact, model)",
            f"{o['startup']:.2f} s",
            f"{t['startup']:.2f} s",
            f"{t['startup'] / o['startup']:.1f}x the time",
        ),
        *(
            (
                f"tap call (model + monitored layers), batch {n}",
                f"{o[key] * 1e6:,.0f} us ({n / o[key]:,.0f} rec/s)",
                f"{t[key] * 1e6:,.0f} us ({n / t[key]:,.0f} rec/s)",
                f"{t[key] / o[key]:.1f}x the time",
            )
            for n, key in ((1, "tap1"), (256, "tap256"))
        ),
        *(
            (
                f"agent.process per record, binary inputs, batch {n}",
                f"{o[key]:.1f} us",
                f"{t[key]:.1f} us",
                f"{t[key] / o[key]:.1f}x the time",
            )
            for n, key in ((16, "proc16"), (256, "proc256"))
        ),
        *(
            (
                f"agent streaming {args.records:,} binary records (kafka-python), {where}",
                f"{rates[key]['onnx']:,.0f} rec/s",
                f"{rates[key]['torch']:,.0f} rec/s",
                f"{rates[key]['torch'] / rates[key]['onnx']:.2f}x the rate",
            )
            for key, where in (
                ("loading", "looping in the thread that loaded the model (as `boxwatch agent`)"),
                ("other", "looping in another thread (an application embedding the agent)"),
            )
        ),
    ]
    table = "\n".join(
        [
            "| measure | ONNX | .pt2 | .pt2 against ONNX |",
            "|---|---|---|---|",
            *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows),
        ]
    )
    text = "\n".join(
        [
            machine_line(
                f"bundled digits MLP, same weights both ways, layers input + 2; torch "
                f"{torch.__version__}, 1 intra-op thread; {run_summary(began)}"
            ),
            "",
            table,
        ]
    )
    print(text)
    write_section(HEADING, text)


if __name__ == "__main__":
    main()
