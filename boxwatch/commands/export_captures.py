"""``boxwatch export-captures``: archive a capture topic as JSON Lines, for review offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from boxwatch.agent.errors import BoxwatchError
from boxwatch.agent.inputs import one_line
from boxwatch.commands.console import EXIT_USAGE, echo_err, fail
from boxwatch.commands.feedback import parse_client_options
from boxwatch.offline.refit.feedback import export_topic


@click.command("export-captures")
@click.option(
    "--brokers", required=True, metavar="HOST:PORT[,...]", help="The Kafka bootstrap servers."
)
@click.option("--topic", required=True, help="The capture topic (the agent's topics.capture).")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The directory to write TOPIC.export.jsonl into (created if missing).",
)
@click.option(
    "--client-option",
    "client_options",
    multiple=True,
    metavar="KEY=VALUE",
    callback=parse_client_options,
    help="A kafka-python consumer option, repeatable: security_protocol=SASL_SSL, "
    "sasl_mechanism=PLAIN, ssl_cafile=ca.pem ...",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Give up (exit 2) when the topic is not read within this many seconds.",
)
def export_captures(
    brokers: str, topic: str, out_dir: Path, client_options: dict[str, Any], timeout_s: float
) -> None:
    """Archive the capture topic TOPIC into OUT/TOPIC.export.jsonl.

    Reads every partition from the beginning up to the end offsets of the moment it starts
    (and any record written before that moment a broker's end offsets leave out; no
    consumer group, nothing committed) and writes each record whole, one JSON line with
    its topic, partition, offset, timestamp, key, headers and value (base64), atomically;
    an earlier export of the topic is replaced. Labelled captures are joined from such an
    export as from the topic itself (docs/records.md, "Capture export"). One line on stderr
    counts the records written and those that hold no usable input (payload-omitted stubs,
    records that are not capture copies).

    \b
    Example:
      boxwatch export-captures --brokers localhost:9092 --topic boxwatch.capture --out reviews/
    Exit codes: 0 exported; 2 broker unreachable, topic missing or too slow; 70 internal error.
    """
    try:
        done = export_topic(brokers, topic, out_dir, timeout_s=timeout_s, client=client_options)
    except BoxwatchError as exc:
        fail(exc, EXIT_USAGE)
    except OSError as exc:
        fail(BoxwatchError(f"cannot write {out_dir}: {exc.strerror or exc}"), EXIT_USAGE)
    first = f" (first: {done.problems[0]})" if done.problems else ""
    echo_err(
        one_line(
            f"exported {done.records} records of {topic!r} to {done.path}; "
            f"{done.unusable} without a usable input{first}"
        )
    )
