"""Options shared by ``refit`` and ``capture-report``: where the captures and labels come from."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.runtime import MonitorRuntime
from boxwatch.offline.refit.feedback import (
    Captures,
    LabelledCaptures,
    Labels,
    join,
    read_captures,
    read_captures_topic,
    read_labels,
    read_labels_topic,
)

PREDICT_BATCH = 512


def feedback_options(
    *, labels_required: bool
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--captures/--captures-topic, --labels/--labels-topic, --brokers, --timeout."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        options = [
            click.option(
                "--captures",
                "captures_path",
                type=click.Path(exists=True, path_type=Path),
                help="A capture export: the directory of 'boxwatch export-captures' (its "
                "*.export.jsonl files) or one such file.",
            ),
            click.option(
                "--captures-topic",
                help="Read the captures from this topic instead (needs --brokers).",
            ),
            click.option(
                "--labels",
                "labels_path",
                type=click.Path(exists=True, dir_okay=False, path_type=Path),
                help="Reviewers' labels, JSON Lines keyed by the verdict id (docs/records.md)"
                + ("." if labels_required else "; optional."),
            ),
            click.option(
                "--labels-topic",
                help="Read the labels from this topic instead (needs --brokers).",
            ),
            click.option(
                "--brokers",
                metavar="HOST:PORT[,...]",
                help="Kafka bootstrap servers of the topics.",
            ),
            click.option(
                "--client-option",
                "client_options",
                multiple=True,
                metavar="KEY=VALUE",
                callback=parse_client_options,
                help="A kafka-python consumer option for the topics, repeatable: "
                "security_protocol=SASL_SSL, sasl_mechanism=PLAIN, ssl_cafile=ca.pem ...",
            ),
            click.option(
                "--timeout",
                "timeout_s",
                type=click.FloatRange(min=0, min_open=True),
                default=30.0,
                show_default=True,
                help="Give up (exit 2) when a topic is not read within this many seconds.",
            ),
        ]
        for option in reversed(options):
            command = option(command)

        @functools.wraps(command)
        def checked(*args: Any, **kwargs: Any) -> Any:
            problems = sources_problems(
                kwargs["captures_path"],
                kwargs["captures_topic"],
                kwargs["labels_path"],
                kwargs["labels_topic"],
                kwargs["brokers"],
                labels_required=labels_required,
            )
            if problems:
                raise click.UsageError("; ".join(problems))
            return command(*args, **kwargs)

        return checked

    return decorate


def parse_client_options(
    _ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]
) -> dict[str, Any]:
    """``KEY=VALUE`` options as a mapping (values as written: kafka-python takes text for
    its TLS and SASL settings)."""
    out: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE")
        out[key.strip()] = value
    return out


def sources_problems(
    captures_path: Path | None,
    captures_topic: str | None,
    labels_path: Path | None,
    labels_topic: str | None,
    brokers: str | None,
    *,
    labels_required: bool,
) -> list[str]:
    """What is wrong with the sources given: each one once, topics with brokers."""
    problems = []
    if (captures_path is None) == (captures_topic is None):
        problems.append("give the captures once: --captures PATH or --captures-topic TOPIC")
    if labels_path is not None and labels_topic is not None:
        problems.append("give the labels once: --labels PATH or --labels-topic TOPIC")
    elif labels_required and labels_path is None and labels_topic is None:
        problems.append("no labels: give --labels PATH or --labels-topic TOPIC")
    if (captures_topic or labels_topic) and not brokers:
        problems.append("--captures-topic and --labels-topic need --brokers HOST:PORT")
    return problems


def load_captures(
    runtime: MonitorRuntime,
    path: Path | None,
    topic: str | None,
    brokers: str | None,
    timeout_s: float,
    client: dict[str, Any] | None = None,
) -> Captures:
    """The captures, decoded into the artifact's input shape."""
    if runtime.preprocessing is None:
        raise ConfigError("the artifact monitors no model: it has no captures to read")
    shape = runtime.preprocessing.shape
    if path is not None:
        return read_captures(path, shape)
    assert topic is not None and brokers is not None
    return read_captures_topic(brokers, topic, shape, timeout_s=timeout_s, client=client)


def load_labels(
    path: Path | None,
    topic: str | None,
    brokers: str | None,
    timeout_s: float,
    client: dict[str, Any] | None = None,
) -> Labels | None:
    """The labels, or None where none were given."""
    if path is not None:
        return read_labels(path)
    if topic is not None:
        assert brokers is not None
        return read_labels_topic(brokers, topic, timeout_s=timeout_s, client=client)
    return None


def predicted(runtime: MonitorRuntime, x: np.ndarray) -> np.ndarray:
    """The parent model's predicted class of each input (what the join checks labels by)."""
    out = [
        np.asarray(
            runtime.run_model(
                x[s : s + PREDICT_BATCH].reshape(len(x[s : s + PREDICT_BATCH]), -1)
            ).predicted
        )
        for s in range(0, len(x), PREDICT_BATCH)
    ]
    return np.concatenate(out).astype(np.int64) if out else np.zeros(0, dtype=np.int64)


def labelled(runtime: MonitorRuntime, captures: Captures, labels: Labels) -> LabelledCaptures:
    """The captures joined with their labels by id, checked against the parent's predictions."""
    return join(captures, labels, runtime.classes, predicted(runtime, captures.inputs))
