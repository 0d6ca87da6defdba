"""``boxwatch demo``: the bundled example end to end, on embedded defaults only.

The verb (:func:`demo`, last) and the parts it runs, in order:

1. a signing key, the example data sets and the build config in the work folder
   (:func:`write_build_config`, also used by the tests and benchmarks);
2. ``build-artifact`` on the digits MLP and the synthetic credit BN (artifact + report,
   :func:`build_example`);
3. an embedded Kafka-protocol broker on a free loopback port (or ``--bootstrap-servers``;
   the broker itself is :mod:`boxwatch.embedded_broker`, shared with the tests);
4. the agent, verifying the artifact, with /metrics on a free loopback port;
5. a stream of known digits (JSON and binary), unknown inputs (digits 8-9, noise), credit
   applications and a few malformed records (:func:`stream`); a live table of what comes
   back (:func:`watch`);
6. everything stopped cleanly, and a final summary.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np
import yaml

from boxwatch.agent.config import load_agent_config
from boxwatch.agent.gate import decode_rules
from boxwatch.agent.keys import generate_keypair
from boxwatch.agent.members import DIAGRAM_META, RULES
from boxwatch.agent.records import TENSOR_TYPE
from boxwatch.commands.console import EXIT_FAILED, finish, summary_table
from boxwatch.embedded_broker import KINDS, BrokerKind
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
    from boxwatch.offline.progress import Progress
    from boxwatch.offline.release.config import load_config
    from boxwatch.offline.release.pipeline import build, prepare
    from boxwatch.offline.release.report import write_report

    private, public = workdir / "keys" / "demo.key", workdir / "keys" / "demo.pub"
    generate_keypair(private, public, force=True)
    config = write_build_config(workdir)
    outcome = build(prepare(load_config(config)), load_private_key(private), progress=Progress())
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


@click.command()
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-out"),
    show_default=True,
    help="Where keys, data, the artifact and the report are written.",
)
@click.option("--bootstrap-servers", help="Use this Kafka instead of the embedded broker.")
@click.option(
    "--broker",
    type=click.Choice(KINDS),
    default="noida",
    show_default=True,
    help="Which embedded Kafka-protocol broker to start.",
)
@click.option(
    "--known",
    "n_known",
    default=300,
    show_default=True,
    help="Known digits to stream (the held-out ones, sent again in turn beyond their number).",
)
@click.option(
    "--unknown",
    "n_unknown",
    default=150,
    show_default=True,
    help="Unknown inputs (digits 8-9, noise) to stream.",
)
@click.option(
    "--credit", "n_credit", default=300, show_default=True, help="Credit applications to stream."
)
@click.option("--timeout", default=90.0, show_default=True, help="Seconds to wait for outputs.")
def demo(
    workdir: Path,
    bootstrap_servers: str | None,
    broker: BrokerKind,
    n_known: int,
    n_unknown: int,
    n_credit: int,
    timeout: float,
) -> None:
    """Run the bundled example end to end: build, broker, agent, stream, live table.

    Builds the example artifact (digits MLP monitors + credit BN rules) and report, starts an
    embedded Kafka-protocol broker on a free loopback port (unless --bootstrap-servers),
    runs the agent on it, streams known and unknown digits, credit applications and a few
    malformed records, shows what comes back live, then stops everything. Needs nothing
    outside this package (the offline extra and the demo extra installed).

    Your own model and your own broker (started by hand, or an existing cluster): see
    docs/getting-started.md.
    """
    from boxwatch.agent.service import build_agent, serve

    t0 = time.time()
    workdir.mkdir(parents=True, exist_ok=True)
    click.echo(f"[1/4] building the example artifact in {workdir}/", err=True)
    artifact, public, _summary = build_example(workdir)
    embedded = None
    if bootstrap_servers is None:
        from boxwatch.embedded_broker import EmbeddedBroker

        embedded = EmbeddedBroker(broker).start()
        bootstrap_servers = embedded.bootstrap_servers
        click.echo(f"[2/4] embedded {broker} broker on {bootstrap_servers}", err=True)
    else:
        click.echo(f"[2/4] using Kafka at {bootstrap_servers}", err=True)
    agent = http = thread = None
    try:
        cfg = load_agent_config(
            None,
            environ={},
            overrides={
                "artifact": str(artifact),
                "public_keys": [str(public)],
                "model": str(example_path("digits", "model.onnx")),
                "kafka.bootstrap_servers": bootstrap_servers,
                "kafka.create_topics": True,
                "kafka.group_id": "boxwatch-demo",
                "metrics.address": "127.0.0.1:0",
                **{f"topics.{k}": v for k, v in TOPICS.items()},
            },
        )
        agent = build_agent(cfg)
        agent.check_topics()
        http = serve(agent)
        metrics_url = f"http://{http.address}/metrics"
        thread = threading.Thread(target=agent.run, name="boxwatch-agent", daemon=True)
        thread.start()
        click.echo(
            f"[3/4] agent running with artifact {agent.runtime.artifact_id}; metrics at "
            f"{metrics_url}, status page at http://{http.address}/",
            err=True,
        )
        sent = stream(
            bootstrap_servers,
            workdir,
            agent.runtime.artifact,
            n_known,
            n_unknown,
            n_credit,
            say=lambda line: click.echo(line, err=True),
        )
        click.echo(f"[4/4] streamed {sent} records; waiting for the outputs", err=True)
        result = watch(bootstrap_servers, sent, metrics_url, timeout)
    finally:
        if agent is not None:
            agent.stop()
        if thread is not None:
            thread.join(timeout=15)
        if http is not None:
            http.stop()
        if embedded is not None:
            embedded.stop()
    click.echo(
        json.dumps(
            {
                **result,
                "sent": sent,
                "seconds": round(time.time() - t0, 1),
                "artifact": str(artifact),
                "report": str(workdir / "report" / "report.html"),
            },
            indent=2,
        )
    )
    if result["received"] < sent:
        finish(EXIT_FAILED, f"error: only {result['received']} of {sent} outputs arrived")
