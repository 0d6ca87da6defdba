"""Labels in: the label format, captures read from a real broker or its export, the join."""

from __future__ import annotations

import io
import json
import time

import numpy as np
import pytest
from click.testing import CliRunner
from kafka_helpers import create_topics

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.kafka.base import KafkaUnavailable, Record
from boxwatch.agent.outputs import Output, copy_output, omit_payload, reason_headers
from boxwatch.agent.records import JSON_TYPE, NPY_TYPE, TENSOR_TYPE
from boxwatch.cli import EXIT_OK, EXIT_USAGE, cli
from boxwatch.offline.refit.archive import read_export
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


def located(outputs: list[Output]) -> list[tuple[str, Record]]:
    """Outputs as records read back at offsets 0, 1, ... of partition 0, one ms apart."""
    return [
        (f"{CAPTURE}:0:{k}", Record(CAPTURE, 0, k, 1000 + k, o.key, o.value, o.headers))
        for k, o in enumerate(outputs)
    ]


def produce(kafka, outputs: list[Output], topic: str = CAPTURE) -> None:
    """Send each output in a batch of its own (Tansu's high watermark counts batches)."""
    producer = kafka.producer()
    for k, out in enumerate(outputs):
        producer.send(
            topic,
            key=out.key,
            value=out.value,
            headers=out.headers,
            partition=k % 3,
            timestamp_ms=1_000 + k,
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
