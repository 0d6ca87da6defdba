"""Output record schemas (version 1): verdicts, gate records, dead letters and copies.

* verdict topic -- JSON ``boxwatch.verdict/1``: id, source (topic, partition, offset),
  predicted class, combined verdict, its reason (and, unless accepted, the layer the reason
  points at and the nearest other class), per-layer verdicts, score, artifact id, model
  version and timings; keyed by the input id.
* gate topic -- JSON ``boxwatch.gate/1``: id, source, decided class, outcome (certified /
  blocked / unverified), rule ids, artifact id.
* dead-letter topic -- the original bytes and headers (or, when payloads must not be kept,
  a JSON stub with their sha256), plus headers ``boxwatch-dlq-reason``,
  ``boxwatch-dlq-detail``, ``boxwatch-source-topic``, ``-partition``, ``-offset`` and
  ``boxwatch-payload-sha256``.
* capture / release / review topics -- the original bytes and headers plus
  ``boxwatch-verdict``, ``boxwatch-reason`` (and ``boxwatch-layer``,
  ``boxwatch-nearest-class`` where known) or ``boxwatch-decision`` / ``boxwatch-gate``
  headers.

Copies and dead letters carry only the headers every producer can write (UTF-8 names, byte
values; null values are dropped). An output too large to send (:func:`output_bytes` over
``max_output_bytes``, or refused by the producer or broker) goes as :func:`omit_payload`'s
stub instead: its sha256 and size in place of the payload, never stuck in retries.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from itertools import repeat
from json.encoder import encode_basestring_ascii as _json_str
from operator import attrgetter
from typing import Any, NamedTuple

import msgspec
import numpy as np

from boxwatch.agent.boxes import Reasons
from boxwatch.agent.kafka.base import Consumed
from boxwatch.agent.kafka.headers import carried_headers
from boxwatch.agent.vocab import DEAD_LETTER_REASONS, VERDICT_REASONS, VERDICTS

VERDICT_SCHEMA = "boxwatch.verdict/1"
GATE_SCHEMA = "boxwatch.gate/1"
DEAD_LETTER_SCHEMA = "boxwatch.dead-letter/1"
OMITTED_SCHEMA = "boxwatch.payload-omitted/1"
MAX_DETAIL_CHARS = 300
MAX_KEPT_KEY_BYTES = 1024  # a stub keeps a key up to this size, else only its digest
OMITTED_HEADER = "boxwatch-payload-omitted"
# A capture copy's headers (reason_headers): the one spelling, read back by the refit.
VERDICT_HEADER = "boxwatch-verdict"
REASON_HEADER = "boxwatch-reason"
LAYER_HEADER = "boxwatch-layer"
NEAREST_HEADER = "boxwatch-nearest-class"

Headers = list[tuple[str, bytes]]


class Output(NamedTuple):
    """One record to produce; ``kind`` labels the outputs metric, ``reason`` a dead letter's."""

    kind: str
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers
    reason: str | None = None


def source_of(rec: Consumed) -> dict[str, Any]:
    return {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset}


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")


def verdict_output(topic: str, rec: Consumed, record_id: str, body: dict[str, Any]) -> Output:
    return Output(
        "verdict",
        topic,
        record_id.encode("utf-8"),
        _dumps({"schema": VERDICT_SCHEMA, "id": record_id, "source": source_of(rec), **body}),
        [],
    )


_ENCODER = msgspec.json.Encoder()
_VERDICT = (
    b'{"schema":"' + VERDICT_SCHEMA.encode() + b'","id":%b,"source":{"topic":%b,'
    b'"partition":%d,"offset":%d},%b,"score":%b,"score_accepted":%b%b'
)


def json_numbers(values: Sequence[float]) -> list[bytes]:
    """Each float as ``json.dumps`` writes it, ``null`` for NaN and infinities, in one call.

    msgspec writes the shortest round-trip digits, as ``repr`` does, and the same text
    for 0 and 1e-4 <= |x| < 1e16 (property-tested); the rest, where ``repr`` switches to
    its exponent form (``1e-05``, ``1e+16``), are written by ``repr``.
    """
    if not values:
        return []
    parts = _ENCODER.encode(values)[1:-1].split(b",")
    x = np.asarray(values, dtype=np.float64)
    mag = np.abs(x)
    for k in np.flatnonzero(np.isfinite(x) & (x != 0) & ((mag < 1e-4) | (mag >= 1e16))).tolist():
        parts[k] = repr(float(values[k])).encode()
    return parts


class VerdictHead(NamedTuple):
    """What a verdict record says of its input besides its id, source and score: the part
    that many inputs share (few classes, verdicts and reasons)."""

    predicted: str
    verdict: str
    reason: str
    layer: str | None  # the layer the reason points at (None: none)
    nearest: str | None  # the nearest other class (None: none)
    layers: tuple[str, ...]  # each monitored layer's verdict, in ``VerdictHeads.layer_names``


HeadLabels = tuple[tuple[str, str], tuple[str, str], tuple[tuple[str, str, str], ...]]
"""A head's label values in the verdict metrics: (verdict, class), (verdict, reason), and
(layer, layer verdict, class) per monitored layer."""


class VerdictHeads(NamedTuple):
    """A batch's distinct :class:`VerdictHead` s: input ``i`` has ``heads[of[i]]``, and
    ``counts[k]`` inputs have ``heads[k]``; ``json[k]`` is ``heads[k]`` as its fields sit in
    the record (between the source and the score), ``labels[k]`` what the verdict metrics
    count it under."""

    heads: list[VerdictHead]
    of: list[int]
    counts: list[int]
    layer_names: tuple[str, ...]
    json: list[bytes]
    labels: list[HeadLabels]


def _combinations(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the rows of an int64 matrix of codes (values >= -1): the first row of each
    distinct row, and each row's (an index into the first array).

    Each row is packed into one int64 (mixed radix; where the radices' product would
    overflow, column by column, renumbered on the way), so one ``np.unique`` of a vector
    does it.
    """
    shifted = codes + 1
    radices = (shifted.max(axis=0) + 1).tolist()
    if math.prod(radices) < 2**62:
        weights = [math.prod(radices[k + 1 :]) for k in range(len(radices))]
        key = shifted @ np.array(weights, dtype=np.int64)
    else:
        key = np.zeros(len(codes), dtype=np.int64)
        span = 1
        for k, radix in enumerate(radices):
            if span * radix >= 2**62:
                _, key = np.unique(key, return_inverse=True)
                span = len(codes)
            key = key * radix + shifted[:, k]
            span *= radix
    _, first, of = np.unique(key, return_index=True, return_inverse=True)
    return first, of.reshape(-1)


_NEW = tuple.__new__  # builds a NamedTuple from a tuple without a Python-level call
_TOPIC, _PARTITION, _OFFSET = attrgetter("topic"), attrgetter("partition"), attrgetter("offset")
_FLAGS = (b"false", b"true")
MAX_CACHED_HEADS = 65_536  # distinct heads a VerdictEncoder keeps encoded, then it starts over


class VerdictEncoder:
    """Writes a monitored model's verdict records (``boxwatch.verdict/1``) a batch at a time.

    Built once per artifact, so what its batches share is named and encoded once: each
    distinct head (:class:`VerdictHead`: class, verdict, reason, layers) the first time a
    batch has it, then reused (up to :data:`MAX_CACHED_HEADS`, then the cache starts over).
    Byte for byte what :func:`verdict_output` writes for each body, without a ``json.dumps``
    of a nested dict per record: the scores by msgspec in one call (:func:`json_numbers`),
    the strings by the escaper ``json`` itself uses, the records from columns.
    """

    def __init__(
        self, topic: str, classes: Sequence[str], *, artifact_id: str, model_version: str
    ) -> None:
        self.topic = topic
        self.classes = list(classes)
        self._fields = (
            f',"artifact_id":{_json_str(artifact_id)},"model_version":{_json_str(model_version)}'
        ).encode()
        self._names: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
        self._heads: dict[tuple[int, ...], tuple[VerdictHead, bytes, HeadLabels]] = {}

    def heads(
        self,
        predicted: np.ndarray,
        verdicts: np.ndarray,
        layer_verdicts: Mapping[str, np.ndarray],
        reasons: Reasons,
    ) -> VerdictHeads:
        """A batch's verdict heads from its codes.

        Parameters
        ----------
        predicted : ndarray of shape (n_samples,), int
            Class indices; one past the class names is written as its number.
        verdicts : ndarray of shape (n_samples,), int
            Verdict codes (index into :data:`vocab.VERDICTS`).
        layer_verdicts : mapping of str to ndarray of shape (n_samples,), int
            Each monitored layer's verdict codes, in the order the records list them.
        reasons : Reasons
            Why each input got its verdict (codes, the layer and the nearest class).
        """
        names = (tuple(layer_verdicts), tuple(reasons.layer_names))
        if names != self._names or len(self._heads) >= MAX_CACHED_HEADS:
            self._names = names
            self._heads = {}
        if not len(predicted):
            return VerdictHeads([], [], [], names[0], [], [])
        codes = np.stack(
            [
                predicted,
                verdicts,
                reasons.codes,
                reasons.layer,
                reasons.nearest,
                *layer_verdicts.values(),
            ],
            axis=1,
        ).astype(np.int64, copy=False)
        first, of = _combinations(codes)
        heads, encoded, labels = [], [], []
        for row in map(tuple, codes[first].tolist()):
            known = self._heads.get(row)
            if known is None:
                known = self._heads[row] = self._encode_head(row)
            heads.append(known[0])
            encoded.append(known[1])
            labels.append(known[2])
        counts = np.bincount(of, minlength=len(first)).tolist()
        return VerdictHeads(heads, of.tolist(), counts, names[0], encoded, labels)

    def _class(self, c: int) -> str:
        """Class ``c``'s name (its number past the names)."""
        return self.classes[c] if c < len(self.classes) else str(c)

    def _encode_head(self, row: tuple[int, ...]) -> tuple[VerdictHead, bytes, HeadLabels]:
        """A head from its codes, its fields as they sit between source and score, and its
        metric labels."""
        p, v, r, k, c, *per_layer = row
        layer_names, reason_layers = self._names
        head = VerdictHead(
            self._class(p),
            VERDICTS[v],
            VERDICT_REASONS[r],
            None if k < 0 else reason_layers[k],
            None if c < 0 else self._class(c),
            tuple(VERDICTS[x] for x in per_layer),
        )
        layer_json = ",".join(
            [
                _json_str(n) + ":" + _json_str(x)
                for n, x in zip(layer_names, head.layers, strict=True)
            ]
        )
        middle = (
            f'"predicted_class":{_json_str(head.predicted)},"verdict":{_json_str(head.verdict)},'
            f'"reason":{_json_str(head.reason)},"layer":{_json_or_null(head.layer)},'
            f'"nearest_class":{_json_or_null(head.nearest)},"layers":{{{layer_json}}}'
        ).encode()
        labels = (
            (head.verdict, head.predicted),
            (head.verdict, head.reason),
            tuple((n, x, head.predicted) for n, x in zip(layer_names, head.layers, strict=True)),
        )
        return head, middle, labels

    def outputs(
        self,
        recs: Sequence[Consumed],
        ids: Sequence[str],
        heads: VerdictHeads,
        *,
        scores: Sequence[float],
        accepted: Sequence[bool] | None,
        timings: Mapping[str, Any],
    ) -> list[Output]:
        """One verdict record per input (``heads`` from :meth:`heads` for the same batch),
        keyed by its id."""
        n = len(ids)
        tail = self._fields + b',"timings":' + _dumps(dict(timings)) + b"}"
        flags = repeat(b"null", n) if accepted is None else map(_FLAGS.__getitem__, accepted)
        topics = list(map(_TOPIC, recs))
        topic_json = {t: _json_str(t).encode() for t in set(topics)}
        values = map(
            _VERDICT.__mod__,
            zip(
                map(str.encode, map(_json_str, ids)),
                map(topic_json.__getitem__, topics),
                map(_PARTITION, recs),
                map(_OFFSET, recs),
                map(heads.json.__getitem__, heads.of),
                json_numbers(scores),
                flags,
                repeat(tail, n),
                strict=True,
            ),
        )
        fields = zip(
            repeat("verdict", n),
            repeat(self.topic, n),
            map(str.encode, ids),
            values,
            [[] for _ in range(n)],
            repeat(None, n),
            strict=True,
        )
        return list(map(_NEW, repeat(Output, n), fields))


def _json_or_null(text: str | None) -> str:
    return "null" if text is None else _json_str(text)


def reason_headers(
    verdict: str, reason: str, layer: str | None, nearest: str | None
) -> dict[str, str]:
    """A capture copy's ``boxwatch-*`` headers: its verdict and reason, and the layer and
    nearest other class where known."""
    headers = {VERDICT_HEADER: verdict, REASON_HEADER: reason}
    if layer is not None:
        headers[LAYER_HEADER] = layer
    if nearest is not None:
        headers[NEAREST_HEADER] = nearest
    return headers


def gate_output(topic: str, rec: Consumed, record_id: str, body: dict[str, Any]) -> Output:
    return Output(
        "gate",
        topic,
        record_id.encode("utf-8"),
        _dumps({"schema": GATE_SCHEMA, "id": record_id, "source": source_of(rec), **body}),
        [],
    )


def copy_output(kind: str, topic: str, rec: Consumed, extra: dict[str, str]) -> Output:
    """The original record, with extra ``boxwatch-*`` headers (capture, release, review)."""
    headers = carried_headers(rec.headers) + [(k, v.encode("utf-8")) for k, v in extra.items()]
    return Output(kind, topic, rec.key, rec.value, headers)


def dead_letter_output(
    topic: str, rec: Consumed, reason: str, detail: str, *, store_payload: bool
) -> Output:
    """The bad record kept whole (or as a digest stub) with why it was refused.

    ``reason`` must be one of :data:`vocab.DEAD_LETTER_REASONS` (anything else is a bug)."""
    if reason not in DEAD_LETTER_REASONS:
        raise ValueError(f"unknown dead-letter reason {reason!r}")
    payload = rec.value if rec.value is not None else b""
    digest = hashlib.sha256(payload).hexdigest()
    headers: Headers = carried_headers(rec.headers) if store_payload else []
    headers += [
        ("boxwatch-dlq-reason", reason.encode()),
        ("boxwatch-dlq-detail", detail[:MAX_DETAIL_CHARS].encode("utf-8", "replace")),
        ("boxwatch-source-topic", str(rec.topic).encode()),
        ("boxwatch-source-partition", str(rec.partition).encode()),
        ("boxwatch-source-offset", str(rec.offset).encode()),
        ("boxwatch-payload-sha256", digest.encode()),
    ]
    if store_payload:
        value = rec.value
    else:
        value = _dumps(
            {
                "schema": DEAD_LETTER_SCHEMA,
                "payload_omitted": True,
                "payload_sha256": digest,
                "payload_bytes": len(payload),
                "reason": reason,
                "source": source_of(rec),
            }
        )
    return Output("dead_letter", topic, rec.key, value, headers, reason)


def output_bytes(out: Output) -> int:
    """Bytes of key, value and headers: what a producer's maximum message size bounds."""
    return (
        len(out.key or b"")
        + len(out.value or b"")
        + sum(len(name) + len(value) for name, value in out.headers)
    )


def _source_from_headers(headers: Headers) -> dict[str, Any] | None:
    h = dict(headers)
    try:
        return {
            "topic": h["boxwatch-source-topic"].decode(),
            "partition": int(h["boxwatch-source-partition"]),
            "offset": int(h["boxwatch-source-offset"]),
        }
    except (KeyError, ValueError):
        return None


def omit_payload(out: Output) -> Output:
    """``out`` as a small stub that can always be sent: the payload's sha256 and size instead
    of the payload, only ``boxwatch-*`` headers, and a large key replaced by its digest.

    Dead letters keep their schema (``payload_omitted`` is true, ``reason`` and ``source``
    stay); other outputs become ``boxwatch.payload-omitted/1`` records of their kind.
    """
    payload = out.value or b""
    digest = hashlib.sha256(payload).hexdigest()
    headers = [
        (name, value[:MAX_DETAIL_CHARS])
        for name, value in out.headers
        if name.startswith("boxwatch-") and name != OMITTED_HEADER
    ]
    headers.append((OMITTED_HEADER, b"true"))
    key = out.key
    if key is not None and len(key) > MAX_KEPT_KEY_BYTES:
        headers += [
            ("boxwatch-key-sha256", hashlib.sha256(key).hexdigest().encode()),
            ("boxwatch-key-bytes", str(len(key)).encode()),
        ]
        key = None
    recorded = dict(out.headers).get("boxwatch-payload-sha256")
    if recorded is not None and recorded != digest.encode():
        return out._replace(key=key, headers=headers)  # the value is a digest stub already
    body: dict[str, Any] = {
        "schema": DEAD_LETTER_SCHEMA if out.kind == "dead_letter" else OMITTED_SCHEMA,
        "kind": out.kind,
        "payload_omitted": True,
        "payload_sha256": digest,
        "payload_bytes": len(payload),
        "header_names": [n[:100] for n, _ in out.headers if not n.startswith("boxwatch-")][:50],
    }
    if out.reason is not None:
        body["reason"] = out.reason
    source = _source_from_headers(out.headers)
    if source is not None:
        body["source"] = source
    return out._replace(key=key, value=_dumps(body), headers=headers)
