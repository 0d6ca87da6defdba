"""Hostile and unusual Kafka records, each with the one outcome the agent must give it.

Every kind is deterministic: a bad record names the single dead-letter reason it must get,
a valid one the output it must get (a verdict, or a gate record). Header edge cases that
kafka-python's producer refuses to write are sent with confluent-kafka (null values) or
with :class:`RawHeaderName` (header names that are not UTF-8).
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from boxwatch.agent.records import JSON_TYPE, NPY_TYPE, TENSOR_TYPE

CT = "content-type"
Headers = list[tuple[str, bytes | None]]


class RawHeaderName(str):
    """A header name whose wire bytes are ``raw`` (kafka-python encodes names by calling
    ``encode``), so a test can send names that are not UTF-8."""

    raw: bytes

    def __new__(cls, raw: bytes) -> RawHeaderName:
        obj = super().__new__(cls, raw.decode("latin-1"))
        obj.raw = raw
        return obj

    def encode(self, *args, **kwargs) -> bytes:  # type: ignore[override]
        return self.raw


@dataclass
class Hostile:
    """One record to send and what must come of it."""

    kind: str
    topic: str  # "inputs" or "bn_inputs"
    value: bytes | None
    headers: Headers = field(default_factory=list)
    key: bytes | None = None
    reason: str | None = None  # the dead-letter reason; None: a valid record
    verdict: str | None = None  # for valid model inputs whose verdict is known in advance
    rows: np.ndarray | None = None  # a valid model input's values (offline comparison)
    evidence: dict[str, str] | None = None  # a valid BN record's evidence

    @property
    def needs_confluent(self) -> bool:
        """kafka-python's producer refuses null header values and records with neither key
        nor value."""
        return any(v is None for _, v in self.headers) or (self.value is None and not self.key)


def tensor_record(rid: str, row: np.ndarray, dtype: str = "float32") -> tuple[bytes, Headers]:
    return (
        np.asarray(row, dtype="<f4").tobytes(),
        [(CT, TENSOR_TYPE.encode()), ("id", rid.encode()), ("dtype", dtype.encode())],
    )


def _npy(arr: np.ndarray, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=allow_pickle)
    return buf.getvalue()


def _json(obj: object) -> bytes:
    return json.dumps(obj).encode()


def bad_model_records(size: int, rng: np.random.Generator) -> list[Hostile]:
    """Bad model inputs, one of each kind (ids ``h-<kind>``)."""
    row = rng.normal(size=size)
    good = row.tolist()
    tensor = row.astype("<f4").tobytes()

    def th(rid: str, **over: bytes | None) -> Headers:
        base = {CT: TENSOR_TYPE.encode(), "id": rid.encode(), "dtype": b"float32"}
        base.update(over)
        return [(k, v) for k, v in base.items()]

    out: list[Hostile] = []

    def add(
        kind: str,
        value: bytes | None,
        reason: str,
        headers: Headers | None = None,
        key: bytes | None = None,
    ) -> None:
        out.append(Hostile(kind, "inputs", value, list(headers or []), key, reason))

    rid = "h"
    add("random_bytes", b"\x00\x01garbage\xff\xfe", "bad_content_type")
    add("random_bytes_json_type", b"\xff\xfe\x00{", "not_json", [(CT, JSON_TYPE.encode())])
    add("truncated_json", _json({"id": rid, "input": good})[:50], "not_json")
    add("trailing_comma", b'{"id": "x", "input": [1, 2,],}', "not_json")
    add("single_quotes", b"{'id': 'x', 'input': [1]}", "not_json")
    add(
        "deep_nesting",
        b'{"id": "x", "input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "not_json",
    )
    add("not_utf8_json", b'{"id": "\xff\xfe", "input": [1]}', "not_json")
    add("top_level_array", b"[1, 2, 3]", "bad_schema", [(CT, JSON_TYPE.encode())])
    add("top_level_string", b'"hello"', "bad_schema", [(CT, JSON_TYPE.encode())])
    add("empty_value", b"", "bad_content_type")
    add("empty_value_json_type", b"", "not_json", [(CT, JSON_TYPE.encode())])
    add("null_value", None, "bad_schema")
    add("missing_input", _json({"id": "x"}), "bad_schema")
    add("missing_id", _json({"input": good}), "missing_id")
    add("bool_id", _json({"id": True, "input": good}), "missing_id")
    add("empty_id", _json({"id": "", "input": good}), "missing_id")
    add("long_id", _json({"id": "x" * 300, "input": good}), "missing_id")
    add(
        "duplicate_id_json",
        b'{"id": "a", "id": "b", "input": ' + _json(good) + b"}",
        "duplicate_id",
    )
    add("wrong_size_json", _json({"id": "x", "input": good[:-1]}), "bad_shape")
    add("ragged_json", _json({"id": "x", "input": [[1.0, 2.0], [3.0]]}), "bad_shape")
    add("numeric_strings", _json({"id": "x", "input": [str(v) for v in good]}), "bad_dtype")
    add("booleans", _json({"id": "x", "input": [True] * size}), "bad_dtype")
    add("nulls_in_input", _json({"id": "x", "input": [None] * size}), "bad_dtype")
    add("nan_token", b'{"id": "x", "input": [NaN' + b", 0" * (size - 1) + b"]}", "not_finite")
    add("huge_number", b'{"id": "x", "input": [1e400' + b", 0" * (size - 1) + b"]}", "not_finite")
    add("tensor_wrong_size", tensor[:-4], "bad_shape", th("t1"))
    add("tensor_odd_bytes", tensor + b"\x00\x00\x00", "bad_shape", th("t2"))
    add("tensor_bad_dtype", tensor, "bad_dtype", th("t3", dtype=b"complex64"))
    add("tensor_no_dtype", tensor, "bad_dtype", [(CT, TENSOR_TYPE.encode()), ("id", b"t4")])
    add("tensor_negative_shape", tensor, "bad_shape", th("t5") + [("shape", b"-8,-8")])
    add("tensor_garbage_shape", tensor, "bad_shape", th("t6") + [("shape", b"a,b")])
    add("tensor_shape_mismatch", tensor, "bad_shape", th("t7") + [("shape", b"3,5")])
    add("tensor_no_id", tensor, "missing_id", [(CT, TENSOR_TYPE.encode()), ("dtype", b"float32")])
    add("tensor_duplicate_id", tensor, "duplicate_id", th("t8") + [("id", b"other")])
    inf = row.astype("<f4")
    inf[3] = np.inf
    add("tensor_inf", inf.tobytes(), "not_finite", th("t9"))
    nan = row.astype("<f4")
    nan[0] = np.nan
    add("tensor_nan", nan.tobytes(), "not_finite", th("t10"))
    add(
        "npy_garbage",
        b"\x93NUMPY garbage" * 10,
        "bad_schema",
        [(CT, NPY_TYPE.encode()), ("id", b"n1")],
    )
    add(
        "npy_complex",
        _npy(row.astype(np.complex64)),
        "bad_dtype",
        [(CT, NPY_TYPE.encode()), ("id", b"n2")],
    )
    add(
        "npy_booleans",
        _npy(np.ones(size, dtype=bool)),
        "bad_dtype",
        [(CT, NPY_TYPE.encode()), ("id", b"n4")],
    )
    add(
        "npy_pickled_objects",
        _npy(np.array([{"a": 1}] * 4, dtype=object), allow_pickle=True),
        "bad_schema",
        [(CT, NPY_TYPE.encode()), ("id", b"n3")],
    )
    add(
        "wrong_content_type",
        _json({"id": "x", "input": good}),
        "bad_content_type",
        [(CT, b"text/csv")],
    )
    # Header edge cases.
    add("null_id_header", tensor, "missing_id", th("t11", id=None))
    add("null_dtype_header", tensor, "bad_dtype", th("t12", dtype=None))
    add("null_header_on_bad_record", b"{oops", "not_json", [("x-trace", None)])
    add(
        "non_utf8_header_name_json",
        _json({"id": "x", "input": good}),
        "bad_header",
        [(RawHeaderName(b"\xff\xfe-name"), b"v")],
    )
    add(
        "non_utf8_header_name_tensor",
        tensor,
        "bad_header",
        th("t13") + [(RawHeaderName(b"\xc3\x28"), b"v")],
    )
    add("many_headers", b"{oops", "not_json", [(f"x-{i}", b"v" * 10) for i in range(2_000)])
    # Dead letters larger than a producer may send (payload + headers over ~1 MB).
    add("dead_letter_too_large", b"{" + b" " * 1_048_400, "not_json")
    add("header_too_large", b"{oops", "not_json", [("x-blob", b"b" * 1_000_000)])
    add("key_near_limit", b"{oops", "not_json", key=b"k" * 1_000_000)
    return out


def valid_model_records(rows: np.ndarray, size: int) -> list[Hostile]:
    """Valid model inputs: plain tensors and JSON, and unusual but legal forms."""
    out: list[Hostile] = []
    for i, row in enumerate(rows):
        rid = f"v{i}"
        if i % 3 == 0:
            out.append(
                Hostile("valid_json", "inputs", _json({"id": rid, "input": row.tolist()}), rows=row)
            )
        else:
            value, headers = tensor_record(rid, row)
            out.append(Hostile("valid_tensor", "inputs", value, headers, rows=row))
    extremes = {"huge_finite": 1e300, "huge_negative": -1e300, "float32_overflow": 1e39}
    for name, v in extremes.items():  # finite input, non-finite activations: never accept
        out.append(
            Hostile(
                name,
                "inputs",
                _json({"id": f"x-{name}", "input": [v] * size}),
                verdict="reject",
                rows=np.full(size, v),
            )
        )
    row = rows[0]
    value, headers = tensor_record("e-null-header", row)
    out.append(
        Hostile("valid_with_null_header", "inputs", value, headers + [("x-note", None)], rows=row)
    )
    out.append(
        Hostile(
            "valid_with_null_content_type",
            "inputs",
            _json({"id": "e-null-ct", "input": row.tolist()}),
            [(CT, None)],
            rows=row,
        )
    )
    value, headers = tensor_record("e-empty-name", row)
    out.append(
        Hostile("valid_with_empty_header_name", "inputs", value, headers + [("", b"x")], rows=row)
    )
    value, headers = tensor_record("e-big-key", row)
    out.append(
        Hostile("valid_with_large_key", "inputs", value, headers, key=b"k" * 500_000, rows=row)
    )
    return out


def bn_records(
    features: Sequence[str], states: Sequence[Sequence[str]], rng: np.random.Generator, n_valid: int
) -> list[Hostile]:
    """Bad BN records of each kind, and ``n_valid`` valid ones (ids ``b<i>``)."""

    def evidence() -> dict[str, str]:
        return {f: str(s[int(rng.integers(len(s)))]) for f, s in zip(features, states, strict=True)}

    out: list[Hostile] = []

    def add(kind: str, value: bytes | None, reason: str, headers: Headers | None = None) -> None:
        out.append(Hostile(kind, "bn_inputs", value, list(headers or []), None, reason))

    ev = evidence()
    add(
        "bn_unknown_variable",
        _json({"id": "x", "evidence": {**ev, "Nope": "x"}}),
        "unknown_variable",
    )
    add(
        "bn_unknown_state",
        _json({"id": "x", "evidence": {**ev, features[0]: "not-a-state"}}),
        "unknown_state",
    )
    add(
        "bn_state_not_string",
        _json({"id": "x", "evidence": {**ev, features[0]: 1}}),
        "unknown_state",
    )
    add(
        "bn_missing_evidence",
        _json({"id": "x", "evidence": {k: v for k, v in ev.items() if k != features[-1]}}),
        "missing_evidence",
    )
    add("bn_evidence_not_object", _json({"id": "x", "evidence": list(ev.items())}), "bad_schema")
    add("bn_random_bytes", b"\x00\xff\x10", "not_json")
    add("bn_empty_value", b"", "not_json")
    add("bn_null_value", None, "bad_schema")
    add("bn_missing_id", _json({"evidence": ev}), "missing_id")
    add(
        "bn_duplicate_id", b'{"id": "a", "id": "b", "evidence": ' + _json(ev) + b"}", "duplicate_id"
    )
    add(
        "bn_non_utf8_header_name",
        _json({"id": "x", "evidence": ev}),
        "bad_header",
        [(RawHeaderName(b"\xfe"), b"v")],
    )
    for i in range(n_valid):
        e = evidence()
        out.append(
            Hostile("bn_valid", "bn_inputs", _json({"id": f"b{i}", "evidence": e}), evidence=e)
        )
    return out
