"""``boxwatch demo``: the bundled example end to end, on embedded defaults only.

1. a signing key, the example data sets and the build config in the work folder;
2. ``build-artifact`` on the digits MLP and the synthetic credit BN (artifact + report);
3. an embedded Kafka-protocol broker on a free loopback port (or ``--bootstrap-servers``);
4. the agent, verifying the artifact, with /metrics on a free loopback port;
5. a stream of known digits (JSON and binary), unknown inputs (digits 8-9, noise), credit
   applications and a few malformed records; a live table of what comes back;
6. everything stopped cleanly, and a final summary.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np
import yaml

from boxwatch.agent.gate import decode_rules
from boxwatch.agent.keys import generate_keypair
from boxwatch.agent.members import DIAGRAM_META, RULES
from boxwatch.agent.records import TENSOR_TYPE
from boxwatch.examples import example_path

if TYPE_CHECKING:  # the builder is imported where it is used (the demo's agent half is light)
    from boxwatch.offline.release.records import BuildSummary

TOPICS = {
    "inputs": "demo.inputs",
    "bn_inputs": "demo.credit",
    "verdicts": "demo.verdicts",
    "gate": "demo.gate",
    "dead_letter": "demo.dead-letter",
    "release": "demo.released",
    "review": "demo.review",
}
OUTPUT_TOPICS = ("verdicts", "gate", "dead_letter")


def write_build_config(workdir: Path) -> Path:
    """The bundled build config, with absolute paths to the bundled model, BN and rules."""
    from boxwatch.examples.digits_data import write_datasets

    write_datasets(workdir / "data")
    cfg = yaml.safe_load(example_path("demo", "build.yaml").read_text())
    cfg["model"]["path"] = str(example_path("digits", "model.onnx"))
    for key in ("file", "rules", "fmo"):
        cfg["bn"][key] = str(example_path("credit", Path(cfg["bn"][key]).name))
    path = workdir / "build.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def build_example(workdir: Path) -> tuple[Path, Path, BuildSummary]:
    """Key, config, artifact and report in ``workdir``; returns (artifact, public key, summary)."""
    from boxwatch.agent.artifact import write_artifact
    from boxwatch.agent.keys import load_private_key
    from boxwatch.commands.console import progress_bar, summary_table
    from boxwatch.offline.release.config import load_config
    from boxwatch.offline.release.pipeline import build, prepare
    from boxwatch.offline.release.report import write_report

    private, public = workdir / "keys" / "demo.key", workdir / "keys" / "demo.pub"
    generate_keypair(private, public, force=True)
    config = write_build_config(workdir)
    outcome = build(prepare(load_config(config)), load_private_key(private), progress=progress_bar)
    artifact = workdir / "demo.bwa"
    write_artifact(artifact, outcome.artifact)
    summary = outcome.summary.written_to(artifact)
    write_report(summary, workdir / "report")
    click.echo(summary_table(summary.to_dict(), artifact), err=True)
    return artifact, public, summary


def credit_records(artifact: Any, n: int, seed: int = 1) -> list[bytes]:
    """Credit applications: half uniformly random, half inside a random rule's premise.

    ``artifact`` is the loaded artifact; its diagram gives the features and states, its
    ``bn/rules.json`` the premises (so the gate has rules to certify or block with).
    """
    d = artifact.json(DIAGRAM_META)
    features, states = d["features"], d["states"]
    rules = decode_rules(artifact.json(RULES))
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        premise = rules[int(rng.integers(len(rules)))].premise if i % 2 and rules else {}
        evidence = {}
        for f, names in zip(features, states, strict=True):
            allowed = premise.get(f, range(len(names)))
            evidence[f] = names[int(rng.choice(list(allowed)))]
        out.append(json.dumps({"id": f"credit-{i}", "evidence": evidence}).encode())
    return out


def take_inputs(x: np.ndarray, n: int, what: str) -> tuple[np.ndarray, str | None]:
    """``n`` rows of ``x``, cycling through it again when it holds fewer, and the note that
    says so (None when ``x`` was large enough): a count is never capped silently."""
    if n <= len(x) or not len(x):
        return x[:n], None
    note = (
        f"note: {n} {what} asked for, the example holds {len(x)}; each is sent "
        f"{-(-n // len(x))} times or fewer, in turn"
    )
    return x[np.arange(n) % len(x)], note


def stream(
    bootstrap: str,
    workdir: Path,
    artifact: Any,
    n_known: int,
    n_unknown: int,
    n_credit: int,
    say: Callable[[str], None] = print,
) -> int:
    """Produce the demo's inputs; returns how many records were sent."""
    from kafka import KafkaProducer

    data = np.load(workdir / "data" / "stream.npz")
    known, note_known = take_inputs(data["x_known"], n_known, "known digits (--known)")
    unknown, note_unknown = take_inputs(data["x_unknown"], n_unknown, "unknown inputs (--unknown)")
    for note in (note_known, note_unknown):
        if note:
            say(note)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    sent = 0
    for i, x in enumerate(known):
        if i % 2:  # half as JSON, half as raw float32 tensors
            producer.send(
                TOPICS["inputs"], json.dumps({"id": f"known-{i}", "input": x.tolist()}).encode()
            )
        else:
            producer.send(
                TOPICS["inputs"],
                x.astype("<f4").tobytes(),
                headers=[
                    ("content-type", TENSOR_TYPE.encode()),
                    ("id", f"known-{i}".encode()),
                    ("dtype", b"float32"),
                ],
            )
        sent += 1
    for i, x in enumerate(unknown):
        producer.send(
            TOPICS["inputs"], json.dumps({"id": f"unknown-{i}", "input": x.tolist()}).encode()
        )
        sent += 1
    for value in credit_records(artifact, n_credit):
        producer.send(TOPICS["bn_inputs"], value)
        sent += 1
    for bad in (b"{not json", b'{"id": "short", "input": [1, 2, 3]}', b'{"input": [0]}'):
        producer.send(TOPICS["inputs"], bad)
        sent += 1
    producer.send(TOPICS["bn_inputs"], b'{"id": "c-bad", "evidence": {"Age": "ancient"}}')
    producer.flush()
    producer.close()
    return sent + 1


def _table(counts: Counter, gate: Counter, dlq: int, started: float, metrics_url: str) -> str:
    n = sum(counts.values())

    def rate(verdict: str) -> float:
        return counts.get(verdict, 0) / n if n else 0.0

    elapsed = max(time.time() - started, 1e-9)
    total = n + sum(gate.values()) + dlq
    return (
        f"verdicts {n:5d} (accept {counts.get('accept', 0)}, uncertainty "
        f"{counts.get('uncertainty', 0)}, reject {counts.get('reject', 0)}) | uncertainty rate "
        f"{rate('uncertainty'):.3f} reject rate {rate('reject'):.3f} | gate certified "
        f"{gate.get('certified', 0)} blocked {gate.get('blocked', 0)} unverified "
        f"{gate.get('unverified', 0)} | dead letters {dlq} | {total / elapsed:.0f} out/s | "
        f"{metrics_url}"
    )


def watch(bootstrap: str, expected: int, metrics_url: str, timeout: float) -> dict[str, Any]:
    """Read the output topics until every input has its output; print a live table."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        *(TOPICS[t] for t in OUTPUT_TOPICS),
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        consumer_timeout_ms=500,
    )
    verdicts: Counter = Counter()
    by_class: Counter = Counter()
    gate: Counter = Counter()
    dlq: Counter = Counter()
    started = time.time()
    last = 0.0
    while time.time() - started < timeout:
        for rec in consumer.poll(timeout_ms=300).values():
            for r in rec:
                if r.topic == TOPICS["dead_letter"]:
                    dlq[dict(r.headers).get("boxwatch-dlq-reason", b"?").decode()] += 1
                    continue
                body = json.loads(r.value)
                if r.topic == TOPICS["verdicts"]:
                    verdicts[body["verdict"]] += 1
                    kind = "known" if body["id"].startswith("known") else "unknown"
                    by_class[(kind, body["verdict"])] += 1
                else:
                    gate[body["outcome"]] += 1
        done = sum(verdicts.values()) + sum(gate.values()) + sum(dlq.values())
        if time.time() - last > 1.0 or done >= expected:
            click.echo(_table(verdicts, gate, sum(dlq.values()), started, metrics_url), err=True)
            last = time.time()
        if done >= expected:
            break
    consumer.close()
    return {
        "verdicts": dict(verdicts),
        "by_kind": {f"{k} {v}": n for (k, v), n in by_class.items()},
        "gate": dict(gate),
        "dead_letters": dict(dlq),
        "received": sum(verdicts.values()) + sum(gate.values()) + sum(dlq.values()),
    }
