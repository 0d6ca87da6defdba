"""``boxwatch demo``: the bundled example end to end (build, broker, agent, live stream)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import click

from boxwatch.agent.config import load_agent_config
from boxwatch.commands.console import EXIT_FAILED, finish
from boxwatch.demo import TOPICS, build_example, stream, watch
from boxwatch.embedded_broker import KINDS, BrokerKind
from boxwatch.examples import example_path


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
