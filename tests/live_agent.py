"""A real agent on a real embedded broker, for the deploy, alerting and status-page tests.

The ``live_agent_factory`` fixture (conftest) makes one on the session's example artifact.
:class:`LiveAgent` runs ``build_agent`` +
``serve`` + ``Agent.run`` in a thread (what ``boxwatch agent`` does) and streams a known mix
of known digits, unknown inputs, BN records and malformed records through it.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from kafka_helpers import consume, create_topics, make_consumer, make_producer

from boxwatch.agent.boxes import UNCERTAIN
from boxwatch.agent.records import TENSOR_TYPE
from boxwatch.agent.service import build_agent, serve
from boxwatch.embedded_broker import EmbeddedBroker, available_kinds

if TYPE_CHECKING:
    from example_build import ExampleArtifact

    from boxwatch.agent.config import AgentConfig

JOB = "boxwatch-agent"
BAD_RECORDS: tuple[tuple[str, bytes, str], ...] = (
    ("inputs", b"{oops", "not_json"),
    ("inputs", b'{"id": "short", "input": [1, 2]}', "bad_shape"),
    ("bn_inputs", b'{"id": "z", "evidence": {"Nope": "x"}}', "unknown_variable"),
)


def start_broker() -> EmbeddedBroker:
    """A running embedded broker (noida-db preferred, else Tansu); skip when none is installed."""
    kinds = available_kinds()
    if not kinds:
        pytest.skip("no embedded Kafka-protocol broker installed (pip install noida-db)")
    return EmbeddedBroker(kinds[0]).start()


@dataclass
class StreamOutcome:
    """What the agent produced for one stream, read back from its output topics."""

    sent: int
    verdicts: list[dict[str, Any]]
    gates: list[dict[str, Any]]
    dead_letter_reasons: list[str]
    verdict_counts: Counter = field(default_factory=Counter)
    gate_counts: Counter = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.verdict_counts = Counter(v["verdict"] for v in self.verdicts)
        self.gate_counts = Counter(g["outcome"] for g in self.gates)


ROLES = ("inputs", "bn_inputs", "verdicts", "gate", "dead_letter")
"""The topic roles a live agent reads and writes."""


class LiveAgent:
    """An in-process agent of ``example`` run with ``cfg`` (its broker, topics and address).

    Made by the ``live_agent_factory`` fixture: on its own topics of one broker, HTTP on a
    free port.
    """

    def __init__(self, example: ExampleArtifact, cfg: AgentConfig) -> None:
        self.example = example
        self.cfg = cfg
        self.bootstrap = cfg["kafka.bootstrap_servers"]
        self.topics = {role: cfg[f"topics.{role}"] for role in ROLES}
        self.agent = build_agent(self.cfg)
        self.http: Any = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        return self.http.address

    def start(self) -> LiveAgent:
        create_topics(self.bootstrap, {t: 2 for t in self.topics.values()})
        self.agent.check_topics()
        self.http = serve(self.agent)
        self._thread = threading.Thread(target=self.agent.run, name="live-agent", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.agent.stop()
        if self._thread is not None:
            self._thread.join(timeout=15)
        if self.http is not None:
            self.http.stop()

    def get(self, path: str) -> str:
        with urllib.request.urlopen(f"http://{self.address}{path}", timeout=5) as resp:
            return resp.read().decode("utf-8")

    def uncertain_rows(self, limit: int) -> np.ndarray:
        """Training rows the monitor calls uncertain, so the uncertainty rate is not just 0."""
        x = np.load(self.example.data / "train.npz")["x"]
        return x[np.asarray(self.agent.runtime.run_model(x).verdicts) == UNCERTAIN][:limit]

    def stream(
        self,
        n_known: int,
        n_unknown: int,
        n_bn: int,
        extra: np.ndarray | None = None,
        timeout: float = 60.0,
    ) -> StreamOutcome:
        """Send known digits, unknown inputs, ``extra`` rows, BN records and :data:`BAD_RECORDS`.

        Returns the outputs read back from the verdict, gate and dead-letter topics.
        """
        data = np.load(self.example.data / "stream.npz")
        parts = [data["x_known"][:n_known], data["x_unknown"][:n_unknown]]
        rows = np.concatenate(parts if extra is None else [*parts, extra])
        diagram = self.agent.runtime.diagram
        rng = np.random.default_rng(11)
        states = np.stack([rng.integers(0, len(s), n_bn) for s in diagram.states], axis=1)
        producer = make_producer(self.bootstrap)
        try:
            for i, row in enumerate(rows):
                producer.send(
                    self.topics["inputs"],
                    row.astype("<f4").tobytes(),
                    headers=[
                        ("content-type", TENSOR_TYPE.encode()),
                        ("id", f"m{i}".encode()),
                        ("dtype", b"float32"),
                    ],
                )
            for i in range(n_bn):
                evidence = {
                    f: diagram.states[j][states[i, j]] for j, f in enumerate(diagram.features)
                }
                producer.send(
                    self.topics["bn_inputs"],
                    json.dumps({"id": f"b{i}", "evidence": evidence}).encode(),
                )
            for topic, value, _ in BAD_RECORDS:
                producer.send(self.topics[topic], value)
            producer.flush()
        finally:
            producer.close(timeout=2)
        expected = len(rows) + n_bn + len(BAD_RECORDS)
        consumer = make_consumer(
            self.bootstrap, self.topics["verdicts"], self.topics["gate"], self.topics["dead_letter"]
        )
        try:
            got = consume(consumer, expected, timeout=timeout)
        finally:
            consumer.close()
        assert len(got) == expected, f"{len(got)} of {expected} outputs within {timeout} s"
        by_topic: dict[str, list[Any]] = {}
        for rec in got:
            by_topic.setdefault(rec.topic, []).append(rec)
        return StreamOutcome(
            sent=expected,
            verdicts=[json.loads(r.value) for r in by_topic.get(self.topics["verdicts"], [])],
            gates=[json.loads(r.value) for r in by_topic.get(self.topics["gate"], [])],
            dead_letter_reasons=[
                dict(r.headers)["boxwatch-dlq-reason"].decode()
                for r in by_topic.get(self.topics["dead_letter"], [])
            ],
        )
