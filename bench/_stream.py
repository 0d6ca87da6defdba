"""Shared by the agent benches: a paced binary input stream and a verdict reader.

Both use confluent-kafka (librdkafka), so the load generator and the reader cost the bench
process little CPU and add little latency of their own; the agent under test runs in its
own process with whichever client library is being measured. The id of each input is
``SEQ-SENTNS`` (sequence number, ``time.time_ns()`` when handed to the producer), so the
reader computes end-to-end latency = time the verdict was read - time the input was sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import numpy as np
from confluent_kafka import Consumer, Producer

from boxwatch.agent.records import TENSOR_TYPE

TICK_S = 0.002


def paced_stream(
    bootstrap: str,
    topic: str,
    rows: np.ndarray,
    rate: float,
    seconds: float,
    errors: list[str],
    stop: threading.Event | None = None,
) -> int:
    """Send binary float32 inputs at ``rate``/s for ``seconds`` (2 ms ticks); returns the count."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    payloads = [r.astype("<f4").tobytes() for r in rows]
    headers_base = [("content-type", TENSOR_TYPE.encode()), ("dtype", b"float32")]

    def on_error(err, _msg) -> None:
        if err is not None:
            errors.append(err.str())

    t0 = time.monotonic()
    sent = 0
    while (now := time.monotonic()) - t0 < seconds and not (stop and stop.is_set()):
        due = int((now - t0) * rate)
        while sent < due:
            rid = f"{sent}-{time.time_ns()}".encode()
            p.produce(
                topic,
                payloads[sent % len(payloads)],
                rid,
                headers=[*headers_base, ("id", rid)],
                on_delivery=on_error,
            )
            sent += 1
        p.poll(0)
        time.sleep(TICK_S)
    if p.flush(30):
        errors.append("producer flush timed out")
    return sent


class VerdictReader(threading.Thread):
    """Reads the verdict topic from the start; latency per input, distinct ids, duplicates."""

    def __init__(
        self, bootstrap: str, topic: str, on_verdict: Callable[[dict], None] | None = None
    ):
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.on_verdict = on_verdict
        self.lat: list[tuple[float, float]] = []  # (read time s, latency s)
        self.seen: set[int] = set()
        self.positions: dict[int, int] = {}  # partition -> next offset to read
        self.dups = 0
        self.halt = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"reader-{time.time_ns()}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
                "session.timeout.ms": 6000,
            }
        )
        c.subscribe([self.topic], on_assign=lambda *_: self.ready.set())
        try:
            while not self.halt.is_set():
                msgs = c.consume(5000, 0.002)
                now = time.time_ns()
                for m in msgs:
                    if m.error() is not None:
                        continue
                    partition, offset, value = m.partition(), m.offset(), m.value()
                    # a record (not an error event): all three are set
                    assert partition is not None and offset is not None and value is not None
                    self.positions[partition] = offset + 1
                    v = json.loads(value)
                    seq, sent_ns = (int(x) for x in v["id"].split("-"))
                    if seq in self.seen:
                        self.dups += 1
                    self.seen.add(seq)
                    self.lat.append((now / 1e9, (now - sent_ns) / 1e9))
        finally:
            c.close()


class Retention(threading.Thread):
    """Plays the broker's retention: every ``every_s`` deletes what is done with.

    Input records below the agent group's committed offsets and verdicts below what the
    reader has read (``DeleteRecords``), so an embedded broker's memory stays bounded on
    long runs, as a production topic's retention keeps its disk bounded. Never deletes an
    input the agent has not committed nor a verdict the reader has not read.
    """

    def __init__(
        self,
        bootstrap: str,
        inputs: str,
        group: str,
        verdicts: str,
        reader: VerdictReader,
        partitions: int,
        every_s: float = 60.0,
    ):
        super().__init__(daemon=True)
        self.bootstrap, self.inputs, self.group, self.verdicts = bootstrap, inputs, group, verdicts
        self.reader, self.partitions, self.every_s = reader, partitions, every_s
        self.halt = threading.Event()
        self.deleted_batches = 0
        self.errors: list[str] = []

    def run(self) -> None:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        group = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "enable.auto.commit": False,
            }
        )
        try:
            while not self.halt.wait(self.every_s):
                try:
                    committed = group.committed(
                        [TopicPartition(self.inputs, p) for p in range(self.partitions)], timeout=10
                    )
                    cut = [tp for tp in committed if tp.offset > 0]
                    cut += [
                        TopicPartition(self.verdicts, p, o)
                        for p, o in dict(self.reader.positions).items()
                    ]
                    if cut:
                        for fut in admin.delete_records(cut, request_timeout=10).values():
                            fut.result(15)
                        self.deleted_batches += 1
                except Exception as exc:  # reported in the results, never fatal to the run
                    self.errors.append(repr(exc)[:200])
        finally:
            group.close()
