"""Output record schemas (version 1): verdicts, gate records, dead letters and copies.

* verdict topic -- JSON ``boxwatch.verdict/1``: id, source (topic, partition, offset),
  predicted class, combined and per-layer verdicts, score, artifact id, model version and
  timings; keyed by the input id.
* gate topic -- JSON ``boxwatch.gate/1``: id, source, decided class, outcome (certified /
  blocked / unverified), rule ids, artifact id.
* dead-letter topic -- the original bytes and headers (or, when payloads must not be kept,
  a JSON stub with their sha256), plus headers ``boxwatch-dlq-reason``,
  ``boxwatch-dlq-detail``, ``boxwatch-source-topic``, ``-partition``, ``-offset`` and
  ``boxwatch-payload-sha256``.
* capture / release / review topics -- the original bytes and headers plus
  ``boxwatch-verdict`` or ``boxwatch-decision`` / ``boxwatch-gate`` headers.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

VERDICT_SCHEMA = "boxwatch.verdict/1"
GATE_SCHEMA = "boxwatch.gate/1"
DEAD_LETTER_SCHEMA = "boxwatch.dead-letter/1"
MAX_DETAIL_CHARS = 300

Headers = list[tuple[str, bytes]]


@dataclass(frozen=True)
class Output:
    """One record to produce; ``kind`` labels the outputs metric."""

    kind: str
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers


def source_of(rec: Any) -> dict[str, Any]:
    return {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset}


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")


def verdict_output(topic: str, rec: Any, record_id: str, body: dict[str, Any]) -> Output:
    return Output("verdict", topic, record_id.encode("utf-8"),
                  _dumps({"schema": VERDICT_SCHEMA, "id": record_id, "source": source_of(rec),
                          **body}), [])


def gate_output(topic: str, rec: Any, record_id: str, body: dict[str, Any]) -> Output:
    return Output("gate", topic, record_id.encode("utf-8"),
                  _dumps({"schema": GATE_SCHEMA, "id": record_id, "source": source_of(rec),
                          **body}), [])


def copy_output(kind: str, topic: str, rec: Any, extra: dict[str, str]) -> Output:
    """The original record, with extra ``boxwatch-*`` headers (capture, release, review)."""
    headers = list(rec.headers or []) + [(k, v.encode("utf-8")) for k, v in extra.items()]
    return Output(kind, topic, rec.key, rec.value, headers)


def dead_letter_output(
    topic: str, rec: Any, reason: str, detail: str, *, store_payload: bool
) -> Output:
    """The bad record kept whole (or as a digest stub) with why it was refused."""
    payload = rec.value if rec.value is not None else b""
    digest = hashlib.sha256(payload).hexdigest()
    headers: Headers = list(rec.headers or []) if store_payload else []
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
        value = _dumps({"schema": DEAD_LETTER_SCHEMA, "payload_omitted": True,
                        "payload_sha256": digest, "payload_bytes": len(payload),
                        "reason": reason, "source": source_of(rec)})
    return Output("dead_letter", topic, rec.key, value, headers)
