"""Outputs that cannot be sent whole: digest stubs, carried headers, bounded refusals.

The delivery policy is checked here against a producer that refuses what a real one
refuses (records over its size limit); ``test_reliability_hostile.py`` runs the same paths
against real brokers with both client libraries.
"""

from __future__ import annotations

import hashlib
import json

import pytest
from consumed import Record
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from prometheus_client import generate_latest
from reliability_helpers import parse_metrics

from boxwatch.agent.kafka import DeliveryFailure
from boxwatch.agent.kafka.headers import (
    UNREADABLE,
    UndecodableName,
    carried_headers,
    header_problem,
)
from boxwatch.agent.kafka.kafka_python import install_lenient_header_names
from boxwatch.agent.outputs import (
    OMITTED_HEADER,
    Output,
    dead_letter_output,
    omit_payload,
    output_bytes,
)

TOPICS = {"inputs": "in", "bn_inputs": "bn", "verdicts": "v", "gate": "g", "dead_letter": "dlq"}


def test_headers_a_producer_cannot_write_are_named_and_never_carried():
    name = UndecodableName(b"\xff\xfe-x")
    assert name.encode("utf-8") == b"\xff\xfe-x"
    assert "is not UTF-8" in header_problem([("ok", b"1"), (name, b"v")])
    assert "could not read" in header_problem(UNREADABLE)
    assert "not a UTF-8 string" in header_problem([("bad\udcff", b"v")])
    assert header_problem([("a", None), ("", b""), ("ü", b"\xff")]) is None
    assert carried_headers(
        [("a", None), (name, b"v"), ("b", b"1"), ("bad\udcff", b"v"), ("ü", bytearray(b"2"))]
    ) == [("b", b"1"), ("ü", b"2")]


def test_kafka_python_reads_a_non_utf8_header_name_instead_of_failing():
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )

    class Raw(str):
        def encode(self, *args, **kwargs):
            return b"\xc3\x28"

    builder.append(0, timestamp=1, key=None, value=b"v0", headers=[(Raw("x"), b"h")])
    builder.append(1, timestamp=1, key=b"k", value=b"v1", headers=[("fine", None)])
    data = bytes(builder.build())
    install_lenient_header_names()
    records = list(DefaultRecordBatch(data))
    assert [r.value for r in records] == [b"v0", b"v1"]
    name, value = records[0].headers[0]
    assert isinstance(name, UndecodableName) and name.raw == b"\xc3\x28" and value == b"h"
    assert records[1].headers == [("fine", None)] and records[1].key == b"k"


def test_a_dead_letter_too_large_to_send_becomes_a_digest_stub():
    payload = b"{" + b" " * 2_000_000
    rec = Record(
        "in", 3, 42, payload, headers=[("trace", b"t"), ("x-null", None)], key=b"k" * 5_000
    )
    dl = dead_letter_output("dlq", rec, "not_json", "invalid JSON", store_payload=True)
    assert dl.reason == "not_json" and ("x-null", None) not in dl.headers
    stub = omit_payload(dl)
    assert output_bytes(stub) < 4_000
    body = json.loads(stub.value)
    assert body["payload_sha256"] == hashlib.sha256(payload).hexdigest()
    assert body["payload_bytes"] == len(payload) and body["reason"] == "not_json"
    assert body["source"] == {"topic": "in", "partition": 3, "offset": 42}
    assert body["header_names"] == ["trace"]
    h = dict(stub.headers)
    assert stub.key is None and h["boxwatch-key-bytes"] == b"5000"
    assert h["boxwatch-dlq-reason"] == b"not_json" and h[OMITTED_HEADER] == b"true"
    digest_only = dead_letter_output("dlq", rec, "not_json", "x", store_payload=False)
    again = omit_payload(digest_only)
    assert again.value == digest_only.value and again.key is None


class RefusingProducer:
    """Acknowledges outputs up to ``limit`` bytes and refuses larger ones, as a producer
    refuses records over its maximum request size; ``refuse_all`` refuses everything."""

    def __init__(self, limit: int, refuse_all: bool = False) -> None:
        self.limit, self.refuse_all = limit, refuse_all
        self.sent: list[Output] = []
        self.calls = 0

    def deliver(self, outputs, timeout_s, stop=None):
        self.calls += 1
        failed = []
        for out in outputs:
            if self.refuse_all or output_bytes(out) > self.limit:
                failed.append(DeliveryFailure(out, "MessageSizeTooLargeError", False))
            else:
                self.sent.append(out)
        return failed


class IdleConsumer:
    """The consumer calls a delivery makes; commits are recorded."""

    def __init__(self) -> None:
        self.commits: list[dict] = []

    def pause(self): ...
    def resume(self): ...
    def keep_membership(self): ...

    def commit(self, offsets, timeout_s):
        self.commits.append(dict(offsets))


@pytest.fixture
def make_agent(example, agent_factory):
    """``make_agent(**settings)``: an agent of the example whose consumer only records commits."""

    def make(**settings):
        agent = agent_factory(example, topics=TOPICS, **settings)
        agent._consumer = IdleConsumer()
        return agent

    return make


def _metrics(agent):
    return parse_metrics(generate_latest(agent.metrics.registry).decode())


def test_refused_outputs_are_retried_a_bounded_number_of_times_then_stubbed(make_agent):
    agent = make_agent(max_output_bytes=50_000_000)  # nothing stubbed before sending
    agent._producer = producer = RefusingProducer(limit=100_000)
    outs = agent.process([Record("in", 0, 1, b"{" + b" " * 500_000), Record("in", 0, 2, b"{bad")])
    delivered = agent._deliver(outs)
    assert [o.reason for o in delivered] == ["not_json", "not_json"]
    assert OMITTED_HEADER in dict(delivered[0].headers) and delivered[1] is outs[1]
    assert producer.calls == 3  # two refused tries of the whole letter, then its stub
    m = _metrics(agent)
    assert m['boxwatch_agent_outputs_payload_omitted_total{kind="dead_letter"}'] == 1
    assert m['boxwatch_agent_outputs_dropped_total{kind="dead_letter"}'] == 0


def test_an_output_refused_even_as_a_stub_is_dropped_and_counted(make_agent):
    agent = make_agent()
    agent._producer = producer = RefusingProducer(limit=0, refuse_all=True)
    outs = agent.process([Record("in", 0, 1, b"{bad")])
    assert agent._deliver(outs) == []
    assert producer.calls == 4  # bounded: two tries, then two of its stub
    m = _metrics(agent)
    assert m['boxwatch_agent_outputs_dropped_total{kind="dead_letter"}'] == 1
    assert m['boxwatch_agent_outputs_payload_omitted_total{kind="dead_letter"}'] == 0


def test_large_dead_letters_are_stubbed_before_sending(make_agent):
    agent = make_agent(max_output_bytes=10_000)
    agent._producer = producer = RefusingProducer(limit=20_000)
    outs = agent.process([Record("in", 0, 1, b"{" + b" " * 15_000)])
    delivered = agent._deliver(outs)
    assert producer.calls == 1 and OMITTED_HEADER in dict(delivered[0].headers)


def test_metrics_count_what_was_delivered_not_what_was_processed(make_agent):
    agent = make_agent()
    agent._producer = RefusingProducer(limit=0, refuse_all=True)
    agent._handle_batch([Record("in", 0, 1, b"{bad")])  # its dead letter is dropped
    m = _metrics(agent)
    assert m['boxwatch_agent_invalid_records_total{reason="not_json"}'] == 0
    assert m['boxwatch_agent_outputs_dropped_total{kind="dead_letter"}'] == 1
    assert agent.status.dead_letters == 0
    assert agent._consumer.commits == [{("in", 0): 2}]  # never stuck on it
    agent._producer = RefusingProducer(limit=10_000_000)
    agent._handle_batch([Record("in", 0, 2, b"{bad")])
    m = _metrics(agent)
    assert m['boxwatch_agent_invalid_records_total{reason="not_json"}'] == 1
    assert m['boxwatch_agent_outputs_total{kind="dead_letter"}'] == 1
    assert agent.status.dead_letters == 1
