"""Labels in: the label format, captures read from a real broker or its export, the join."""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pytest
from click.testing import CliRunner
from kafka import KafkaProducer
from kafka_helpers import create_topics

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.kafka.base import KafkaUnavailable, Record
from boxwatch.agent.outputs import Output, copy_output, omit_payload, reason_headers
from boxwatch.agent.records import JSON_TYPE, NPY_TYPE, TENSOR_TYPE
from boxwatch.cli import EXIT_OK, EXIT_USAGE, cli
from boxwatch.offline.refit.archive import Located, read_export, read_topic, write_export
from boxwatch.offline.refit.feedback import (
    CORRECT,
    NEW,
    UNKNOWN,
    WRONG,
    Captures,
    Label,
    Labels,
    decode_captures,
    export_captures,
    join,
    read_captures,
    read_captures_topic,
    read_labels,
    read_labels_topic,
)

SHAPE = (2, 3)
CLASSES = ["zero", "one", "two", "three"]
CAPTURE = "t.capture"
UNREACHABLE = "127.0.0.1:1"


# -- captures as the agent writes them -------------------------------------------------------------
def model_input(rid: str, x: np.ndarray, form: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    """One model-input record (value, headers) of ``form``: json, tensor or npy."""
    if form == "json":
        body = json.dumps({"id": rid, "input": x.tolist()}).encode()
        return body, [("content-type", JSON_TYPE.encode())]
    if form == "tensor":
        return x.astype("<f4").tobytes(), [
            ("content-type", TENSOR_TYPE.encode()),
            ("id", rid.encode()),
            ("dtype", b"float32"),
            ("shape", b"2,3"),
        ]
    buf = io.BytesIO()
    np.save(buf, x.astype(np.float64))
    return buf.getvalue(), [("content-type", NPY_TYPE.encode()), ("id", rid.encode())]


def capture_of(rid: str, x: np.ndarray, form: str = "json", **why: str | None) -> Output:
    """The agent's capture copy of that input (``copy_output`` with its reason headers)."""
    value, headers = model_input(rid, x, form)
    consumed = Record("t.inputs", 0, 0, 0, rid.encode(), value, [*headers, ("trace", b"t1")])
    reason = {"verdict": "reject", "reason": "outside_boxes", "layer": "/l1", "nearest": "two"}
    reason.update(why)
    return copy_output(
        "capture",
        CAPTURE,
        consumed,
        reason_headers(reason["verdict"], reason["reason"], reason["layer"], reason["nearest"]),
    )


def located(outputs: list[Output]) -> list[Located]:
    """Outputs as records read back at offsets 0, 1, ... of partition 0, one ms apart."""
    return [
        Located(f"{CAPTURE}:0:{k}", Record(CAPTURE, 0, k, 1000 + k, o.key, o.value, o.headers))
        for k, o in enumerate(outputs)
    ]


# Records sent to a broker are stamped from the start of this run, not from 1970: a broker's
# time-based retention deletes records that old, even while a test reads them.
T0_MS = int(time.time()) * 1000


def produce(kafka, outputs: list[Output], topic: str = CAPTURE, partitions: int = 3) -> None:
    """Send output k to partition k mod ``partitions`` at :data:`T0_MS` + k ms, each in a
    batch of its own."""
    producer = kafka.producer()
    for k, out in enumerate(outputs):
        producer.send(
            topic,
            key=out.key,
            value=out.value,
            headers=out.headers,
            partition=k % partitions,
            timestamp_ms=T0_MS + k,
        )
        producer.flush()


def x_of(seed: int) -> np.ndarray:
    return (np.arange(6, dtype=np.float32).reshape(SHAPE) + seed) / 4


def captures(*ids: str, inputs: list[np.ndarray] | None = None) -> Captures:
    """Captures of ``ids`` with distinct inputs (or ``inputs``), as the readers build them."""
    xs = inputs if inputs is not None else [x_of(k) for k in range(len(ids))]
    n = len(ids)
    return Captures(
        ids=list(ids),
        inputs=np.stack(xs).astype(np.float32),
        timestamps_ms=np.arange(n, dtype=np.int64),
        verdicts=["reject"] * n,
        reasons=["outside_boxes"] * n,
        layers=["/l1"] * n,
        nearest_classes=["two"] * n,
    )


def write_lines(tmp_path, *lines: str):
    path = tmp_path / "labels.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


# -- labels ----------------------------------------------------------------------------------------
def test_each_label_kind_is_read(tmp_path):
    path = write_lines(
        tmp_path,
        '{"id": "a1", "label": "correct"}',
        '{"id": "a2", "label": "wrong: three", "reviewer": "jd", "note": "a 3"}',
        '{"id": "a3", "label": "wrong:two"}',
        "",
        '{"id": 17, "label": "unknown"}',
        '{"id": "a5", "label": "new:scooter"}',
        '{"id": "a6", "label": "new: electric scooter"}',
    )
    labels = read_labels(path)
    assert labels == [
        Label("a1", CORRECT),
        Label("a2", WRONG, true_class="three"),
        Label("a3", WRONG, true_class="two"),
        Label("17", UNKNOWN),
        Label("a5", NEW, tag="scooter"),
        Label("a6", NEW, tag="electric scooter"),
    ]
    assert [lab.where for lab in labels][:2] == [f"{path}:1", f"{path}:2"]
    assert labels[3].where == f"{path}:5"
    assert labels.problems == []


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("{not json", "invalid JSON"),
        ('["a1", "correct"]', "expected a JSON object"),
        ('{"label": "correct"}', "needs both 'id' and 'label'"),
        ('{"id": "a2"}', "needs both 'id' and 'label'"),
        ('{"id": true, "label": "correct"}', "'id' must be a string or an integer"),
        ('{"id": "", "label": "correct"}', "'id' must be 1 to 256 characters"),
        ('{"id": "a2", "id": "a3", "label": "correct"}', "duplicate keys ['id']"),
        ('{"id": "a2", "label": 3}', "'label' is int, not text"),
        ('{"id": "a2", "label": "maybe"}', "label 'maybe' is not one of: correct, wrong"),
        ('{"id": "a2", "label": "Correct"}', "label 'Correct' is not one of"),
        ('{"id": "a2", "label": "wrong:"}', "names no the true class after the colon"),
        ('{"id": "a2", "label": "new"}', "label 'new' is not one of"),
        ('{"id": "a2", "label": "new:  "}', "names no the new kind"),
        ('{"id": "a2", "label": "correct", "by": "jd"}', "unknown keys ['by']"),
    ],
)
def test_a_malformed_label_line_stops_naming_file_and_line(tmp_path, line, says):
    path = write_lines(tmp_path, '{"id": "a1", "label": "correct"}', line)
    with pytest.raises(ConfigError) as caught:
        read_labels(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:2: ") and says in message
    assert "\n" not in message


def test_a_missing_labels_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        read_labels(tmp_path / "none.jsonl")


def test_a_label_refuses_a_kind_without_its_name():
    with pytest.raises(ValueError, match="a class name for wrong only"):
        Label("a1", WRONG)
    with pytest.raises(ValueError, match="not one of"):
        Label("a1", "maybe")


# -- the join ------------------------------------------------------------------------------------
def test_the_join_gives_each_kind_its_class_in_capture_order():
    caps = captures("a1", "a2", "a3", "a4")
    labels = [
        Label("a4", NEW, tag="scooter"),
        Label("a2", WRONG, true_class="three"),
        Label("a1", CORRECT),
        Label("a3", UNKNOWN),
    ]
    joined = join(caps, labels, CLASSES, np.array([1, 2, 0, 2]))
    assert joined.captures.ids == ["a1", "a2", "a3", "a4"]
    assert [lab.kind for lab in joined.labels] == [CORRECT, WRONG, UNKNOWN, NEW]
    assert joined.y_true.tolist() == [1, 3, -1, -1]
    assert joined.y_pred.tolist() == [1, 2, 0, 2]
    assert joined.y_true.dtype == joined.y_pred.dtype == np.int64
    np.testing.assert_array_equal(joined.captures.inputs, caps.inputs)
    assert joined.problems == []


def test_missing_ids_are_reported_and_never_guessed():
    caps = captures("a1", "a2", "a3")
    labels = [Label("a1", CORRECT), Label("zz", CORRECT), Label("yy", UNKNOWN)]
    joined = join(caps, labels, CLASSES, np.array([0, 1, 2]))
    assert joined.captures.ids == ["a1"]
    assert joined.problems == [
        "labels with no capture: 2 ('zz', 'yy'); left out",
        "captures with no label: 2 ('a2', 'a3')",
    ]


def test_a_repeated_label_is_one_label_and_disagreeing_labels_are_left_out():
    caps = captures("a1", "a2")
    labels = [
        Label("a1", CORRECT, where="l:1"),
        Label("a1", CORRECT, where="l:4"),
        Label("a2", CORRECT, where="l:2"),
        Label("a2", WRONG, true_class="three", where="l:3"),
    ]
    joined = join(caps, labels, CLASSES, np.array([0, 1]))
    assert joined.captures.ids == ["a1"] and joined.y_true.tolist() == [0]
    assert joined.problems == [
        "id 'a2': 2 labels disagree (l:2: correct; l:3: wrong: three); left out"
    ]


def test_a_wrong_label_naming_no_class_or_the_predicted_class_is_left_out():
    caps = captures("a1", "a2", "a3")
    labels = [
        Label("a1", WRONG, true_class="seven", where="l:1"),
        Label("a2", WRONG, true_class="one", where="l:2"),
        Label("a3", WRONG, true_class="zero"),
    ]
    joined = join(caps, labels, CLASSES, np.array([0, 1, 2]))
    assert joined.captures.ids == ["a3"] and joined.y_true.tolist() == [0]
    assert len(joined.problems) == 2
    assert joined.problems[0].startswith("l:1: id 'a1': wrong: seven: not one of the model's 4")
    assert joined.problems[1].startswith("l:2: id 'a2': wrong: one names the class the model")


def test_identical_inputs_whose_labels_contradict_are_all_refused():
    same, other, third = x_of(0), x_of(1), x_of(2)
    caps = captures(
        "a1", "a2", "b1", "b2", "c1", "c2", inputs=[same, same, other, other, third, third]
    )
    labels = [
        Label("a1", CORRECT),  # the model said three: class three
        Label("a2", WRONG, true_class="one"),  # the same input: class one
        Label("b1", WRONG, true_class="two"),  # a known class ...
        Label("b2", UNKNOWN),  # ... and none, for the same input
        Label("c1", CORRECT),  # identical inputs whose labels agree are kept
        Label("c2", WRONG, true_class="two"),
    ]
    joined = join(caps, labels, CLASSES, np.array([3, 3, 1, 1, 0, 0]))
    assert joined.problems == [
        "2 identical inputs labelled as different classes ('a1' correct; 'a2' wrong: one); "
        "left out",
        "2 identical inputs labelled as different classes ('b1' wrong: two; 'b2' unknown); "
        "left out",
        "2 identical inputs labelled as different classes ('c1' correct; 'c2' wrong: two); "
        "left out",
    ]
    assert joined.captures.ids == [] and joined.captures.inputs.shape == (0, *SHAPE)


def test_identical_inputs_agreeing_on_their_class_are_kept():
    x = x_of(2)
    caps = captures("c1", "c2", "c3", "c4", inputs=[x, x, x_of(3), x_of(3)])
    labels = [
        Label("c1", CORRECT),
        Label("c2", WRONG, true_class="two"),
        Label("c3", UNKNOWN),
        Label("c4", NEW, tag="kite"),
    ]
    joined = join(caps, labels, CLASSES, np.array([2, 1, 0, 0]))
    assert joined.problems == []
    assert joined.captures.ids == ["c1", "c2", "c3", "c4"]
    assert joined.y_true.tolist() == [2, 2, -1, -1]


def test_the_problems_of_the_labels_read_come_along():
    caps = captures("a1")
    labels = Labels([Label("a1", CORRECT)], ["t.labels:0:3: not JSON; skipped"])
    joined = join(caps, labels, CLASSES, np.array([0]))
    assert joined.problems == ["t.labels:0:3: not JSON; skipped"]


def test_the_join_checks_the_predictions_it_is_given():
    with pytest.raises(ValueError, match="the captures need"):
        join(captures("a1", "a2"), [], CLASSES, np.array([0]))
    with pytest.raises(ValueError, match="class indices"):
        join(captures("a1"), [], CLASSES, np.array([4]))


# -- captures, decoded as the agent decodes them ----------------------------------------------------
@pytest.mark.parametrize("form", ["json", "tensor", "npy"])
def test_a_capture_of_each_content_type_decodes_into_the_shape(form):
    x = x_of(1)
    caps = decode_captures(located([capture_of("a1", x, form, layer=None)]), SHAPE)
    assert caps.ids == ["a1"] and caps.problems == []
    assert caps.inputs.dtype == np.float32 and caps.inputs.shape == (1, *SHAPE)
    np.testing.assert_array_equal(caps.inputs[0], x)
    assert caps.verdicts == ["reject"] and caps.reasons == ["outside_boxes"]
    assert caps.layers == [None] and caps.nearest_classes == ["two"]
    assert caps.timestamps_ms.tolist() == [1000]


def test_captures_that_hold_no_input_are_problems_with_where():
    stub = omit_payload(capture_of("a2", x_of(2)))
    bad = capture_of("a3", x_of(3))._replace(value=b'{"id": "a3", "input": [1, 2]}')
    not_a_copy = capture_of("a4", x_of(4))._replace(headers=[("content-type", b"application/json")])
    big = capture_of("a5", x_of(5))._replace(value=b'{"id": "a5", "input": [1e300,0,0,0,0,0]}')
    caps = decode_captures(located([capture_of("a1", x_of(1)), stub, bad, not_a_copy, big]), SHAPE)
    assert caps.ids == ["a1"]
    assert caps.problems == [
        f"{CAPTURE}:0:1: payload omitted by the agent (a boxwatch.payload-omitted/1 stub): "
        "the input is gone",
        f"{CAPTURE}:0:2: id 'a3': bad_shape: 2 values, the model takes 6",
        f"{CAPTURE}:0:3: not a capture copy: no boxwatch-verdict or boxwatch-reason header",
        f"{CAPTURE}:0:4: id 'a5': values overflow float32",
    ]


def test_a_recaptured_id_is_one_capture_and_a_conflicting_one_is_left_out():
    outputs = [
        capture_of("a1", x_of(1)),
        capture_of("a2", x_of(2)),
        capture_of("a1", x_of(1), "tensor", verdict="uncertainty"),  # at-least-once: again
        capture_of("a2", x_of(7)),  # another input under the same id
    ]
    caps = decode_captures(located(outputs), SHAPE)
    assert caps.ids == ["a1"] and caps.verdicts == ["reject"]
    assert caps.problems == [
        f"id 'a2': captured 2 times with different inputs ({CAPTURE}:0:1, {CAPTURE}:0:3); left out"
    ]


def test_a_malformed_export_line_stops_naming_file_and_line(tmp_path):
    path = tmp_path / "c.export.jsonl"
    (tmp_path / "labels.jsonl").write_text("not an export\n")  # beside it: never read
    line = json.dumps(
        {
            "schema": "boxwatch.capture-export/1",
            "topic": "c",
            "partition": 0,
            "offset": 0,
            "timestamp_ms": 1,
            "key": None,
            "headers": [],
            "value": "not base64!",
        }
    )
    path.write_text(line + "\n")
    with pytest.raises(ConfigError, match=f"^{path}:1: value is not valid base64$"):
        read_captures(tmp_path, SHAPE)
    path.write_text('{"schema": "other/1"}\n')
    with pytest.raises(ConfigError, match="schema is 'other/1'"):
        read_captures(path, SHAPE)
    with pytest.raises(ConfigError, match="no such file or directory"):
        read_captures(tmp_path / "none", SHAPE)
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="nested too deep|not JSON"):
        read_captures(path, SHAPE)


def test_an_export_streams_by_partition_and_a_failed_one_leaves_the_last_whole(tmp_path):
    """Records arriving with their partitions interleaved (as a topic read brings them) are
    written partition by partition, as read_topic orders them; a read that fails midway
    leaves the earlier export as it was and no temporary file behind."""
    records = [
        Record(CAPTURE, p, o, 1000 + o, f"k{p}{o}".encode(), f"v{p}{o}".encode(), [("h", b"x")])
        for o in range(3)
        for p in (2, 0, 1)
    ]
    path = write_export(iter(records), tmp_path, CAPTURE)
    by_partition = sorted(records, key=lambda r: (r.partition, r.offset))
    assert [r for _, r in read_export(path)] == by_partition
    assert write_export(by_partition, tmp_path, CAPTURE).read_bytes() == path.read_bytes()
    before = path.read_bytes()

    def broken():
        yield records[0]
        raise KafkaUnavailable("the broker went away")

    with pytest.raises(KafkaUnavailable):
        write_export(broken(), tmp_path, CAPTURE)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_client_option_kafka_python_does_not_know_is_a_config_error():
    with pytest.raises(ConfigError, match="--client-option: .*bogus_option"):
        read_captures_topic(
            "127.0.0.1:1", CAPTURE, SHAPE, timeout_s=5, client={"bogus_option": "1"}
        )


@pytest.mark.parametrize("brokers", [",", "host:notaport", "nohost", ":9092"])
def test_brokers_that_are_not_host_port_are_a_config_error(brokers):
    with pytest.raises(ConfigError, match="--brokers"):
        read_captures_topic(brokers, CAPTURE, SHAPE, timeout_s=5)


# -- a real broker -----------------------------------------------------------------------------
ROUND_TRIP = [
    ("a1", 1, "json"),
    ("a2", 2, "tensor"),
    ("a3", 3, "npy"),
    ("a1", 1, "npy"),  # captured again: one capture
    ("a4", 4, "json"),
]


@pytest.mark.integration
def test_the_export_reads_back_as_the_topic_does(broker, kafka, tmp_path):
    create_topics(broker.bootstrap_servers, {CAPTURE: 3})
    outputs = [capture_of(rid, x_of(seed), form) for rid, seed, form in ROUND_TRIP]
    outputs.append(omit_payload(capture_of("a5", x_of(5))))
    produce(kafka, outputs)
    started = time.monotonic()
    from_topic = read_captures_topic(broker.bootstrap_servers, CAPTURE, SHAPE, timeout_s=20)
    assert time.monotonic() - started < 10  # bounded: it stops at the end offsets
    assert export_captures(broker.bootstrap_servers, CAPTURE, tmp_path, timeout_s=20) == 6
    from_export = read_captures(tmp_path, SHAPE)
    assert from_topic.ids == from_export.ids == ["a1", "a2", "a3", "a4"]
    np.testing.assert_array_equal(from_topic.inputs, from_export.inputs)
    np.testing.assert_array_equal(from_topic.inputs[1], x_of(2))
    for name in ("timestamps_ms", "verdicts", "reasons", "layers", "nearest_classes"):
        assert np.array_equal(getattr(from_topic, name), getattr(from_export, name)), name
    assert from_topic.timestamps_ms.tolist() == [T0_MS + k for k in (0, 1, 2, 4)]
    # the same stub reported from both, the export naming its line and its topic place
    assert len(from_topic.problems) == len(from_export.problems) == 1
    where, why = from_topic.problems[0].split(": ", 1)
    assert where == f"{CAPTURE}:2:1" and "payload omitted" in why
    assert from_export.problems[0].endswith(f" ({where}): {why}")
    # nothing lost: every record whole, keys and headers in their order
    archived = {(r.partition, r.offset): r for _, r in read_export(tmp_path)}
    assert [(r.key, r.value, r.headers) for _, r in sorted(archived.items())] == [
        (o.key, o.value, o.headers) for o in (outputs[k] for k in (0, 3, 1, 4, 2, 5))
    ]


@pytest.mark.integration
def test_an_empty_topic_returns_at_once(broker, tmp_path):
    create_topics(broker.bootstrap_servers, {CAPTURE: 2})
    started = time.monotonic()
    caps = read_captures_topic(broker.bootstrap_servers, CAPTURE, SHAPE, timeout_s=20)
    assert caps.ids == [] and caps.inputs.shape == (0, *SHAPE) and caps.problems == []
    assert export_captures(broker.bootstrap_servers, CAPTURE, tmp_path, timeout_s=20) == 0
    assert time.monotonic() - started < 5
    assert (tmp_path / f"{CAPTURE}.export.jsonl").read_bytes() == b""
    assert read_captures(tmp_path, SHAPE).ids == []


@pytest.mark.integration
def test_records_sent_in_batches_are_all_read(broker):
    """Many records per batch: every one is read once, on a broker whose end offsets count
    records (noida) as on one whose end offsets count batches (Tansu)."""
    create_topics(broker.bootstrap_servers, {CAPTURE: 2})
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap_servers, linger_ms=100, batch_size=400
    )
    for k in range(300):
        producer.send(CAPTURE, f"value-{k:04d}".encode(), partition=k % 2)
    producer.flush()
    producer.close()
    got = read_topic(broker.bootstrap_servers, CAPTURE, timeout_s=20)
    assert sorted(located.record.value for located in got) == [
        f"value-{k:04d}".encode() for k in range(300)
    ]


@pytest.mark.integration
def test_labels_on_a_topic_skip_malformed_records_and_report_them(broker, kafka):
    topic = "t.labels"
    create_topics(broker.bootstrap_servers, {topic: 1})
    values = [b'{"id": "a1", "label": "correct"}', b"{oops", b'{"id": 7, "label": "wrong: two"}']
    produce(kafka, [Output("label", topic, None, v, []) for v in values], topic, partitions=1)
    labels = read_labels_topic(broker.bootstrap_servers, topic, timeout_s=20)
    assert labels == [Label("a1", CORRECT), Label("7", WRONG, true_class="two")]
    assert labels[1].where == f"{topic}:0:2"
    assert len(labels.problems) == 1
    assert labels.problems[0].startswith(f"{topic}:0:1: invalid JSON")
    assert labels.problems[0].endswith("; skipped")


@pytest.mark.integration
def test_a_missing_topic_is_a_config_error(broker):
    with pytest.raises(ConfigError, match="topic 'nowhere' does not exist"):
        read_captures_topic(broker.bootstrap_servers, "nowhere", SHAPE, timeout_s=10)


def test_an_unreachable_broker_is_one_clear_error_within_the_timeout():
    started = time.monotonic()
    with pytest.raises(KafkaUnavailable, match=f"cannot reach Kafka at {UNREACHABLE} within 1 s"):
        read_labels_topic(UNREACHABLE, "t.labels", timeout_s=1)
    assert time.monotonic() - started < 3


# -- the command line ----------------------------------------------------------------------------
@pytest.mark.integration
def test_export_captures_writes_the_topic_and_sums_it_up(broker, kafka, tmp_path):
    create_topics(broker.bootstrap_servers, {CAPTURE: 1})
    produce(
        kafka, [capture_of("a1", x_of(1)), omit_payload(capture_of("a2", x_of(2)))], partitions=1
    )
    out = tmp_path / "reviews"
    args = ["--brokers", broker.bootstrap_servers, "--topic", CAPTURE, "--out", str(out)]
    result = CliRunner().invoke(cli, ["export-captures", *args], catch_exceptions=False)
    assert result.exit_code == EXIT_OK, result.output
    assert result.stderr.startswith(
        f"exported 2 records of {CAPTURE!r} to {out / (CAPTURE + '.export.jsonl')}; "
        f"1 without a usable input (first: {CAPTURE}:"
    )
    assert len(result.stderr.splitlines()) == 1
    assert read_captures(out, SHAPE).ids == ["a1"]


def test_export_captures_from_an_unreachable_broker_exits_2_with_one_line(tmp_path):
    args = ["--brokers", UNREACHABLE, "--topic", CAPTURE, "--out", str(tmp_path), "--timeout", "1"]
    result = CliRunner().invoke(cli, ["export-captures", *args], catch_exceptions=False)
    assert result.exit_code == EXIT_USAGE
    assert result.stderr == f"error: cannot reach Kafka at {UNREACHABLE} within 1 s\n"
