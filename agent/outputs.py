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
from collections.abc import Mapping, Sequence
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any, NamedTuple

import msgspec
import numpy as np

from boxwatch.agent.kafka.base import Consumed
from boxwatch.agent.kafka.headers import carried_headers
from boxwatch.agent.vocab import DEAD_LETTER_REASONS

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


def verdict_outputs(
    topic: str,
    recs: Sequence[Consumed],
    ids: Sequence[str],
    *,
    predicted: Sequence[str],
    verdicts: Sequence[str],
    reasons: Sequence[str],
    reason_layers: Sequence[str | None],
    nearest: Sequence[str | None],
    layers: Mapping[str, Sequence[str]],
    scores: Sequence[float],
    accepted: Sequence[bool] | None,
    artifact_id: str,
    model_version: str,
    timings: Mapping[str, Any],
) -> list[Output]:
    """One verdict record per input, the batch encoded at once.

    ``reasons``, ``reason_layers`` and ``nearest`` are each input's reason, the layer it
    points at and the nearest other class (None: written as ``null``).

    Byte for byte what :func:`verdict_output` writes for each body, without a
    ``json.dumps`` of a nested dict per record: the fields shared by the batch are encoded
    once, the scores by msgspec in one call (:func:`json_numbers`), the strings by the
    escaper ``json`` itself uses.
    """
    tail = (
        f',"artifact_id":{_json_str(artifact_id)},"model_version":'
        f'{_json_str(model_version)},"timings":{_dumps(dict(timings)).decode()}}}'
    ).encode()
    layer_keys = [_json_str(name) + ":" for name in layers]
    flags = (
        [b"null"] * len(ids) if accepted is None else [b"true" if a else b"false" for a in accepted]
    )
    # Few distinct (class, verdict, reason, layer, nearest, layer verdicts...) per batch:
    # each is encoded once.
    middles: dict[tuple, bytes] = {}
    topics: dict[str, bytes] = {}
    out: list[Output] = []
    append = out.append
    heads = zip(predicted, verdicts, reasons, reason_layers, nearest, *layers.values(), strict=True)
    for rec, rid, head, score, flag in zip(
        recs, ids, heads, json_numbers(scores), flags, strict=True
    ):
        middle = middles.get(head)
        if middle is None:
            layer_json = ",".join(
                [k + _json_str(v) for k, v in zip(layer_keys, head[5:], strict=True)]
            )
            middle = middles[head] = (
                f'"predicted_class":{_json_str(head[0])},"verdict":{_json_str(head[1])},'
                f'"reason":{_json_str(head[2])},"layer":{_json_or_null(head[3])},'
                f'"nearest_class":{_json_or_null(head[4])},"layers":{{{layer_json}}}'
            ).encode()
        t = topics.get(rec.topic)
        if t is None:
            t = topics[rec.topic] = _json_str(rec.topic).encode()
        value = _VERDICT % (
            _json_str(rid).encode(),
            t,
            rec.partition,
            rec.offset,
            middle,
            score,
            flag,
            tail,
        )
        append(Output("verdict", topic, rid.encode("utf-8"), value, []))
    return out


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
