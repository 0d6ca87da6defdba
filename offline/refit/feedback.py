"""What comes back from the field: captured inputs and reviewers' labels, joined by id.

The agent copies every rejected or uncertain input to ``topics.capture`` (docs/records.md);
reviewers label some of them by the record id the agent emitted. A label names one of
:data:`LABEL_KINDS`; the join never guesses: ids it cannot match, or that disagree with
themselves, are reported and left out.

Labels are JSON Lines, one object per line (a file), or the same objects one per record (a
Kafka topic); ``id`` is the verdict record's ``id`` (a string, or an integer as the agent
accepts it), ``label`` one of::

    {"id": "a1", "label": "correct"}        the model's prediction was right
    {"id": "a2", "label": "wrong: 7"}       it was wrong; the true class, by its name
    {"id": "a3", "label": "unknown"}        none of the model's classes
    {"id": "a4", "label": "new:scooter"}    a new kind of input, tagged by a free-form name

Spaces after the colon are optional; ``reviewer`` and ``note`` keys are allowed and ignored.
A malformed line of a file stops with :class:`~boxwatch.agent.errors.ConfigError` naming
``file:line``; a malformed record of a topic is reported in :attr:`Labels.problems`
(``topic:partition:offset``) and skipped, since a topic cannot be fixed in place.

Captures are read from the capture topic (bounded: up to its end offsets at the start) or
from a directory export of it (:func:`export_captures`; both in :mod:`.archive`), and each
input is decoded by the agent's own decoder (same content types, same id rules).
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from boxwatch.agent.errors import ConfigError
from boxwatch.agent.kafka.base import Record
from boxwatch.agent.outputs import (
    LAYER_HEADER,
    NEAREST_HEADER,
    OMITTED_HEADER,
    REASON_HEADER,
    VERDICT_HEADER,
)
from boxwatch.agent.records import BadRecord, _record_id, decode_model_input, parse_json_object
from boxwatch.offline.refit.archive import (
    Located,
    read_export,
    read_topic,
    stream_topic,
    write_export,
)
from boxwatch.offline.refit.archive import where as located_at

CORRECT, WRONG, UNKNOWN, NEW = "correct", "wrong", "unknown", "new"
# A label's kind: the model's prediction was right; it was wrong (the true class is named);
# the input is none of the model's classes; it is a new kind of input (tagged by a name).
LABEL_KINDS = (CORRECT, WRONG, UNKNOWN, NEW)
# An export lists this many of its unusable records (it counts them all).
LISTED_PROBLEMS = 20


@dataclass(frozen=True)
class Label:
    """One reviewer's label of one captured record."""

    id: str
    kind: str  # one of LABEL_KINDS
    true_class: str | None = None  # the class name, for WRONG only
    tag: str | None = None  # the new kind's name, for NEW only
    where: str | None = field(default=None, compare=False)  # file:line or topic:partition:offset

    def __post_init__(self) -> None:
        if self.kind not in LABEL_KINDS:
            raise ValueError(f"label kind {self.kind!r} is not one of {LABEL_KINDS}")
        if (self.kind == WRONG) != bool(self.true_class):
            raise ValueError(f"true_class={self.true_class!r}: a class name for wrong only")
        if (self.kind == NEW) != bool(self.tag):
            raise ValueError(f"tag={self.tag!r}: a name for new only")

    def text(self) -> str:
        """The label as a reviewer writes it (``wrong: 7``, ``new:scooter``)."""
        if self.kind == WRONG:
            return f"wrong: {self.true_class}"
        return f"new:{self.tag}" if self.kind == NEW else self.kind


class Labels(list[Label]):
    """Labels as read, in order, with the records left out (``problems``: where and why)."""

    def __init__(self, labels: Iterable[Label] = (), problems: Iterable[str] = ()) -> None:
        super().__init__(labels)
        self.problems = list(problems)


@dataclass(frozen=True)
class Captures:
    """Captured inputs, decoded as the agent decoded them: one row per distinct record id."""

    ids: list[str]
    inputs: np.ndarray  # (n, *input shape) float32, raw: before the artifact's preprocessing
    timestamps_ms: np.ndarray  # (n,) int64: the capture record's timestamp
    verdicts: list[str]  # the boxwatch-verdict header: reject or uncertainty
    reasons: list[str]  # the boxwatch-reason header
    layers: list[str | None]  # boxwatch-layer, where the record had one
    nearest_classes: list[str | None]  # boxwatch-nearest-class, where the record had one
    problems: list[str] = field(default_factory=list)  # records left out, where and why


@dataclass(frozen=True)
class LabelledCaptures:
    """Captures joined with their labels by id (only rows with exactly one usable label)."""

    captures: Captures
    labels: list[Label]  # labels[i] is the label of captures.ids[i]
    y_true: np.ndarray  # (n,) int64 class index the label gives; -1 for UNKNOWN and NEW
    y_pred: np.ndarray  # (n,) int64 the parent model's predicted class of each input
    problems: list[str] = field(default_factory=list)  # missing, duplicate or conflicting ids


_LABEL_KEYS = ("id", "label", "reviewer", "note")
_LABEL_FORMS = "correct, wrong: <class>, unknown, new:<name>"
FIRST_IDS = 5  # a problem about many ids names this many of them


def parse_label(value: bytes, *, where: str | None = None) -> Label:
    """One label from its JSON object (a line of a file, a topic record's value).

    ``ValueError`` says on one line what is wrong; ``where`` is kept on the label.
    """
    try:
        obj = parse_json_object(value)
        rid = _record_id(obj.get("id")) if "id" in obj else None
    except BadRecord as exc:
        raise ValueError(exc.detail) from None
    unknown = sorted(set(obj) - set(_LABEL_KEYS))
    if unknown:
        raise ValueError(f"unknown keys {unknown} (a label has id, label, reviewer, note)")
    if rid is None or "label" not in obj:
        raise ValueError("a label needs both 'id' and 'label'")
    label = obj["label"]
    if not isinstance(label, str):
        raise ValueError(f"'label' is {type(label).__name__}, not text ({_LABEL_FORMS})")
    text = label.strip()
    if text in (CORRECT, UNKNOWN):
        return Label(rid, text, where=where)
    head, colon, name = text.partition(":")
    if colon and head in (WRONG, NEW):
        name = name.strip()
        if not name:
            what = "the true class" if head == WRONG else "the new kind"
            raise ValueError(f"label {label!r} names no {what} after the colon")
        if head == WRONG:
            return Label(rid, WRONG, true_class=name, where=where)
        return Label(rid, NEW, tag=name, where=where)
    raise ValueError(f"label {label!r} is not one of: {_LABEL_FORMS}")


def read_labels(path: str | Path) -> Labels:
    """The labels of a JSON Lines file, in order (blank lines skipped).

    The first malformed line stops with :class:`ConfigError` naming ``file:line``.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"labels file {path}: not found") from None
    except OSError as exc:
        raise ConfigError(f"labels file {path}: {exc.strerror}") from None
    labels = Labels()
    for n, line in enumerate(data.split(b"\n"), 1):
        if line.strip():
            try:
                labels.append(parse_label(line, where=f"{path}:{n}"))
            except ValueError as exc:
                raise ConfigError(f"{path}:{n}: {exc}") from None
    return labels


def read_labels_topic(
    brokers: str,
    topic: str,
    *,
    timeout_s: float = 30.0,
    client: Mapping[str, Any] | None = None,
) -> Labels:
    """The labels on a Kafka topic (one per record), read up to its end offsets of now.

    A malformed record is skipped and reported in ``problems`` (``topic:partition:offset``).
    """
    labels = Labels()
    for where, record in read_topic(brokers, topic, timeout_s=timeout_s, client=client):
        try:
            labels.append(parse_label(record.value or b"", where=where))
        except ValueError as exc:
            labels.problems.append(f"{where}: {exc}; skipped")
    return labels


def copy_problem(record: Record) -> str | None:
    """Why a capture-topic record holds no usable input before decoding, or None."""
    headers = dict(record.headers)
    if headers.get(OMITTED_HEADER) == b"true":
        return "payload omitted by the agent (a boxwatch.payload-omitted/1 stub): the input is gone"
    missing = [h for h in (VERDICT_HEADER, REASON_HEADER) if headers.get(h) is None]
    if missing:
        return f"not a capture copy: no {' or '.join(missing)} header"
    return None


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "replace")


def _capture_order(located: Located) -> tuple[int, str, int, int]:
    r = located.record
    return r.timestamp, r.topic, r.partition, r.offset


def decode_captures(located: Sequence[Located], shape: Sequence[int]) -> Captures:
    """Captured records decoded into inputs of ``shape``, one row per distinct id.

    Rows are in capture order (timestamp, then topic, partition and offset). A record that
    does not decode, or whose values overflow float32, is a problem; an id captured again
    with the same input is kept once, with a different input it is a problem and left out.
    """
    shape = tuple(int(d) for d in shape)
    if not shape or min(shape) < 1:
        raise ValueError(f"shape={list(shape)} should be positive dimensions")
    size = math.prod(shape)
    problems: list[str] = []
    first: dict[str, int] = {}  # id -> its row
    rows: list[tuple[str, np.ndarray, Record]] = []
    seen_at: dict[str, list[str]] = {}
    conflicting: set[str] = set()
    for where, record in sorted(located, key=_capture_order):
        why = copy_problem(record)
        if why is not None:
            problems.append(f"{where}: {why}")
            continue
        try:
            decoded = decode_model_input(
                record.value, record.headers, size=size, max_bytes=sys.maxsize
            )
        except BadRecord as exc:
            rid = f"id {exc.record_id!r}: " if exc.record_id is not None else ""
            problems.append(f"{where}: {rid}{exc}")
            continue
        with np.errstate(over="ignore"):
            x = decoded.values.astype(np.float32).reshape(shape)
        rid = decoded.record_id
        if not np.isfinite(x).all():
            problems.append(f"{where}: id {rid!r}: values overflow float32")
            continue
        seen_at.setdefault(rid, []).append(where)
        if rid not in first:
            first[rid] = len(rows)
            rows.append((rid, x, record))
        elif rows[first[rid]][1].tobytes() != x.tobytes():
            conflicting.add(rid)
    for rid in sorted(conflicting, key=first.__getitem__):
        places = seen_at[rid]
        problems.append(
            f"id {rid!r}: captured {len(places)} times with different inputs "
            f"({', '.join(places[:FIRST_IDS])}); left out"
        )
    kept = [r for r in rows if r[0] not in conflicting]
    headers = [dict(r[2].headers) for r in kept]
    return Captures(
        ids=[r[0] for r in kept],
        inputs=(np.stack([r[1] for r in kept]) if kept else np.empty((0, *shape), np.float32)),
        timestamps_ms=np.array([r[2].timestamp for r in kept], dtype=np.int64),
        verdicts=[_text(h[VERDICT_HEADER]) or "" for h in headers],
        reasons=[_text(h[REASON_HEADER]) or "" for h in headers],
        layers=[_text(h.get(LAYER_HEADER)) for h in headers],
        nearest_classes=[_text(h.get(NEAREST_HEADER)) for h in headers],
        problems=problems,
    )


def read_captures(path: str | Path, shape: Sequence[int]) -> Captures:
    """The captures of a directory export (or one of its files), decoded into ``shape``."""
    return decode_captures(read_export(path), shape)


def read_captures_topic(
    brokers: str,
    topic: str,
    shape: Sequence[int],
    *,
    timeout_s: float = 30.0,
    client: Mapping[str, Any] | None = None,
) -> Captures:
    """The captures on ``topic`` up to its end offsets of now, decoded into ``shape``
    (``client``: kafka-python consumer options, :func:`~.archive.read_topic`)."""
    return decode_captures(read_topic(brokers, topic, timeout_s=timeout_s, client=client), shape)


class Export(NamedTuple):
    """What :func:`export_topic` wrote: the file, its records, how many of them no join can
    use, and the first :data:`LISTED_PROBLEMS` of those, each with where it is and why."""

    path: Path
    records: int
    unusable: int
    problems: list[str]


def export_topic(
    brokers: str,
    topic: str,
    out_dir: str | Path,
    *,
    timeout_s: float = 30.0,
    client: Mapping[str, Any] | None = None,
) -> Export:
    """Archive ``topic`` (up to its end offsets of now) into ``out_dir/TOPIC.export.jsonl``,
    streamed to disk (memory does not grow with the topic).

    Every record is kept as it was; ``unusable`` counts the ones that hold no usable input
    (payload-omitted stubs, records that are not capture copies).
    """
    count, unusable = 0, 0
    problems: list[str] = []

    def checked(records: Iterator[Record]) -> Iterator[Record]:
        nonlocal count, unusable
        for record in records:
            count += 1
            why = copy_problem(record)
            if why is not None:
                unusable += 1
                if len(problems) < LISTED_PROBLEMS:
                    problems.append(f"{located_at(record)}: {why}")
            yield record

    path = write_export(
        checked(stream_topic(brokers, topic, timeout_s=timeout_s, client=client)), out_dir, topic
    )
    return Export(path, count, unusable, problems)


def export_captures(
    brokers: str, topic: str, out_dir: str | Path, *, timeout_s: float = 30.0
) -> int:
    """Archive a capture topic into ``out_dir`` (:func:`export_topic`); the records written."""
    return export_topic(brokers, topic, out_dir, timeout_s=timeout_s).records


def _first(ids: Sequence[str]) -> str:
    shown = ", ".join(repr(i) for i in ids[:FIRST_IDS])
    return shown + (", ..." if len(ids) > FIRST_IDS else "")


def _at(label: Label) -> str:
    return f"{label.where}: " if label.where else ""


def _take(captures: Captures, rows: Sequence[int]) -> Captures:
    """``captures`` restricted to ``rows`` (its problems kept)."""
    idx = np.asarray(rows, dtype=np.intp)
    return Captures(
        ids=[captures.ids[i] for i in rows],
        inputs=captures.inputs[idx],
        timestamps_ms=captures.timestamps_ms[idx],
        verdicts=[captures.verdicts[i] for i in rows],
        reasons=[captures.reasons[i] for i in rows],
        layers=[captures.layers[i] for i in rows],
        nearest_classes=[captures.nearest_classes[i] for i in rows],
        problems=list(captures.problems),
    )


def _one_label_per_id(labels: Sequence[Label], problems: list[str]) -> dict[str, Label]:
    """Each id's label; the ids whose labels disagree are reported in ``problems``."""
    by_id: dict[str, list[Label]] = {}
    for label in labels:
        by_id.setdefault(label.id, []).append(label)
    chosen: dict[str, Label] = {}
    for rid, group in by_id.items():
        if all(g == group[0] for g in group):
            chosen[rid] = group[0]
        else:
            said = "; ".join(f"{_at(g)}{g.text()}" for g in group[:FIRST_IDS])
            problems.append(f"id {rid!r}: {len(group)} labels disagree ({said}); left out")
    return chosen


def _class_of(
    label: Label, predicted: int, index: dict[str, int], problems: list[str]
) -> int | None:
    """The class index ``label`` gives an input the model predicted as ``predicted`` (-1:
    none of the classes, ``index`` maps class names to indices), or None, reported in
    ``problems``, for an unusable wrong label."""
    if label.kind == CORRECT:
        return predicted
    if label.kind != WRONG:
        return -1
    true = index.get(label.true_class or "")
    if true is None:
        problems.append(
            f"{_at(label)}id {label.id!r}: {label.text()}: not one of the model's "
            f"{len(index)} classes ({_first(list(index))}); left out"
        )
        return None
    if true == predicted:
        problems.append(
            f"{_at(label)}id {label.id!r}: {label.text()} names the class the model "
            "predicted (a wrong label needs the true class); left out"
        )
        return None
    return true


def _contradictions(
    captures: Captures,
    rows: list[int],
    y_true: list[int],
    chosen: dict[str, Label],
    problems: list[str],
) -> set[int]:
    """Positions in ``rows`` of identical inputs (the same float32 bytes) whose labels give
    different classes: all of them, each group reported in ``problems``."""
    same: dict[bytes, list[int]] = {}  # digest of an input's bytes -> positions in rows
    for k, i in enumerate(rows):
        same.setdefault(hashlib.sha256(captures.inputs[i].tobytes()).digest(), []).append(k)
    refused: set[int] = set()
    for group in same.values():
        if len({y_true[k] for k in group}) > 1:
            refused.update(group)
            ids = [captures.ids[rows[k]] for k in group]
            said = "; ".join(f"{rid!r} {chosen[rid].text()}" for rid in ids[:FIRST_IDS])
            problems.append(
                f"{len(group)} identical inputs labelled as different classes ({said}); left out"
            )
    return refused


def join(
    captures: Captures, labels: Sequence[Label], classes: Sequence[str], predicted: np.ndarray
) -> LabelledCaptures:
    """Captures with exactly one usable label each, in capture order; the rest reported.

    Parameters
    ----------
    captures : the decoded captures (one row per distinct id)
    labels : the reviewers' labels (a :class:`Labels` brings its own problems along)
    classes : the artifact's class names, in class-index order
    predicted : ndarray of shape (n_captures,), the parent model's predicted class index

    Labels of one id that disagree, label ids with no capture, ``wrong: X`` where X is not
    a class or is the predicted class, and identical inputs whose labels give different
    classes are reported in ``problems`` and left out; captures with no label are counted.
    """
    names = list(classes)
    index = {name: k for k, name in enumerate(names)}
    n = len(captures.ids)
    predicted = np.asarray(predicted)
    if predicted.shape != (n,):
        raise ValueError(f"predicted has shape {predicted.shape}; the captures need ({n},)")
    if n and (
        predicted.dtype.kind not in "iu" or predicted.min() < 0 or predicted.max() >= len(names)
    ):
        raise ValueError(f"predicted must hold class indices in [0, {len(names)})")
    problems = list(labels.problems) if isinstance(labels, Labels) else []
    chosen = _one_label_per_id(labels, problems)
    captured = set(captures.ids)
    no_capture = [rid for rid in chosen if rid not in captured]
    if no_capture:
        problems.append(
            f"labels with no capture: {len(no_capture)} ({_first(no_capture)}); left out"
        )
    labelled = {label.id for label in labels}
    no_label = [rid for rid in captures.ids if rid not in labelled]
    if no_label:
        problems.append(f"captures with no label: {len(no_label)} ({_first(no_label)})")
    rows: list[int] = []
    y_true: list[int] = []
    for i, rid in enumerate(captures.ids):
        label = chosen.get(rid)
        if label is not None:
            true = _class_of(label, int(predicted[i]), index, problems)
            if true is not None:
                rows.append(i)
                y_true.append(true)
    refused = _contradictions(captures, rows, y_true, chosen, problems)
    keep = [k for k in range(len(rows)) if k not in refused]
    kept_rows = [rows[k] for k in keep]
    return LabelledCaptures(
        captures=_take(captures, kept_rows),
        labels=[chosen[captures.ids[i]] for i in kept_rows],
        y_true=np.array([y_true[k] for k in keep], dtype=np.int64),
        y_pred=predicted[np.asarray(kept_rows, dtype=np.intp)].astype(np.int64),
        problems=problems,
    )
