"""Input record schemas (version 1) and their decoders; bad records become :class:`BadRecord`.

Model inputs, on the model-input topic, in one of three forms chosen by ``content-type``:

* ``application/json`` (or no header and a body starting with ``{``):
  ``{"id": "...", "input": [numbers, possibly nested]}``
* ``application/x-boxwatch-tensor``: raw little-endian tensor bytes; headers ``id``,
  ``dtype`` (float32, float64, float16, uint8, int64) and optional ``shape`` ("1,64");
* ``application/x-npy``: ``.npy`` bytes (read without pickle); header ``id``.

BN records, on their own topic: ``{"id": "...", "evidence": {"Var": "state", ...}}`` naming a
state for every feature of the compiled classifier and nothing else.

Every input must hold exactly the model's input size of finite values. ``id`` is a string or
integer, present exactly once. Reasons are the fixed set in :data:`metrics.INVALID_REASONS`.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SCHEMA_VERSION = 1
JSON_TYPE = "application/json"
TENSOR_TYPE = "application/x-boxwatch-tensor"
NPY_TYPE = "application/x-npy"
BINARY_DTYPES = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "uint8": "u1", "int64": "<i8"}
DEFAULT_MAX_RECORD_BYTES = 1 << 20
_TENSOR_BYTES = TENSOR_TYPE.encode()
_NOT_NUMBERS = frozenset({str, bool, type(None)})
_SHAPE = re.compile(r"\s*[0-9]+\s*(?:,\s*[0-9]+\s*)*")

Headers = Sequence[tuple[str, bytes]]


class BadRecord(Exception):
    """A record that cannot be processed; ``reason`` is one of the fixed reason labels."""

    def __init__(self, reason: str, detail: str, record_id: str | None = None):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.record_id = record_id


@dataclass(frozen=True)
class ModelInput:
    """One decoded model input: its id and flat float64 values."""

    record_id: str
    values: np.ndarray


@dataclass(frozen=True)
class BNInput:
    """One decoded BN record: its id and state indices in the diagram's feature order."""

    record_id: str
    states: np.ndarray


def _strict_pairs(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise BadRecord("duplicate_id" if "id" in dup else "bad_schema", f"duplicate keys {dup}")
    return dict(pairs)


def _reject_constant(token: str) -> float:
    raise BadRecord("not_finite", f"JSON constant {token} is not a finite number")


def parse_json_object(value: bytes) -> dict:
    """Parse a JSON object strictly: UTF-8, no duplicate keys, no NaN/Infinity."""
    try:
        obj = json.loads(value.decode("utf-8"), object_pairs_hook=_strict_pairs,
                         parse_constant=_reject_constant)
    except BadRecord:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BadRecord("not_json", f"invalid JSON ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not isinstance(obj, dict):
        raise BadRecord("bad_schema", f"expected a JSON object, got {type(obj).__name__}")
    return obj


def _record_id(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise BadRecord("missing_id", "'id' must be a string or an integer")
    text = str(value)
    if not text or len(text) > 256:
        raise BadRecord("missing_id", "'id' must be 1 to 256 characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRecord("missing_id", "'id' holds a lone surrogate (not Unicode text)") from None
    return text


def header_map(headers: Headers | None) -> dict[str, bytes]:
    """Headers by lower-case name; a repeated ``id`` header is a bad record."""
    out: dict[str, bytes] = {}
    for key, val in headers or ():
        k = key.lower()
        if k == "id" and k in out:
            raise BadRecord("duplicate_id", "the 'id' header appears more than once")
        out[k] = val if isinstance(val, bytes) else bytes(val or b"")
    return out


def _content_type(h: dict[str, bytes]) -> str:
    """The media type of a record's ``content-type`` header, lower case, without parameters."""
    return h.get("content-type", b"").decode("latin-1").split(";")[0].strip().lower()


def _check_numbers(value: object, rid: str) -> None:
    """Strings, booleans and nulls anywhere in ``input`` are ``bad_dtype``.

    Walks the nested lists a level at a time (``map`` / ``chain`` in C, no Python loop per
    value); what is neither a list nor one of those is left to the array conversion.
    """
    level = [value]
    while level:
        kinds = set(map(type, level))
        if kinds & _NOT_NUMBERS:
            names = sorted(k.__name__ for k in kinds & _NOT_NUMBERS)
            raise BadRecord("bad_dtype", f"'input' holds {', '.join(names)} values, not numbers",
                            rid)
        if list not in kinds:
            return
        lists = level if kinds == {list} else filter(list.__instancecheck__, level)
        level = list(itertools.chain.from_iterable(lists))


def _check_payload(value: bytes | None, max_bytes: int) -> bytes:
    """A record value must exist and stay within the size limit."""
    if value is None:
        raise BadRecord("bad_schema", "empty record (null value)")
    if len(value) > max_bytes:
        raise BadRecord("too_large", f"{len(value)} bytes exceeds the {max_bytes}-byte limit")
    return value


def decode_model_input(
    value: bytes | None, headers: Headers | None, *, size: int,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES, check_finite: bool = True,
) -> ModelInput:
    """Decode one model-input record into ``size`` finite float64 values.

    ``check_finite=False`` leaves the NaN/Inf check to the caller (the agent checks a
    whole batch at once).
    """
    value = _check_payload(value, max_bytes)
    h = header_map(headers)
    ctype = _content_type(h)
    if ctype in ("", JSON_TYPE):
        if ctype == "" and not value.lstrip()[:1] == b"{":
            raise BadRecord("bad_content_type", "no content-type header and the body is not JSON")
        obj = parse_json_object(value)
        rid = _record_id(obj.get("id"))
        if "input" not in obj:
            raise BadRecord("bad_schema", "no 'input' field", rid)
        _check_numbers(obj["input"], rid)
        try:
            arr = np.asarray(obj["input"], dtype=np.float64)
        except (TypeError, ValueError):
            raise BadRecord("bad_shape", "'input' is not a rectangular array of numbers", rid) from None
        except OverflowError:
            raise BadRecord("not_finite", "a number is too large for a float", rid) from None
    elif ctype in (TENSOR_TYPE, NPY_TYPE):
        if "id" not in h:
            raise BadRecord("missing_id", "binary records need an 'id' header")
        rid = _record_id(h["id"].decode("utf-8", "replace"))
        arr = _decode_npy(value, rid) if ctype == NPY_TYPE else _decode_tensor(value, h, rid)
    else:
        raise BadRecord("bad_content_type", f"unsupported content-type {ctype!r}")
    flat = arr.reshape(-1)
    if flat.size != size:
        raise BadRecord("bad_shape", f"{flat.size} values, the model takes {size}", rid)
    if check_finite and not np.isfinite(flat).all():
        raise BadRecord("not_finite", "NaN or infinite values", rid)
    return ModelInput(rid, flat)


def decode_model_batch(
    records: Sequence[tuple[bytes | None, Headers | None]], *, size: int,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> tuple[np.ndarray, list[str], list[int], list[tuple[int, BadRecord]]]:
    """Decode a micro-batch of ``(value, headers)`` model inputs at once.

    Returns ``(x, ids, rows, bad)``: ``x`` of shape (len(rows), size), float64, holds the
    good inputs in order, ``rows`` their positions in ``records``, ``ids`` their ids, and
    ``bad`` the ``(position, BadRecord)`` of the others; NaN/Inf rows are bad too. The same
    decisions as :func:`decode_model_input` record by record; plain float32 tensors with no
    ``shape`` header (the common binary form) skip the per-record array work and are
    decoded with one ``frombuffer`` for the whole batch.
    """
    nbytes = size * 4
    fast_values: list[bytes] = []
    fast_at: list[int] = []
    fast_ids: list[str] = []
    slow: list[tuple[int, np.ndarray, str]] = []
    bad: list[tuple[int, BadRecord]] = []
    plain_fits = nbytes <= max_bytes
    for i, (value, headers) in enumerate(records):
        rid = _plain_tensor_id(value, headers, nbytes) if plain_fits else None
        if rid is not None:
            fast_values.append(value)  # type: ignore[arg-type]
            fast_at.append(i)
            fast_ids.append(rid)
            continue
        try:
            decoded = decode_model_input(value, headers, size=size, max_bytes=max_bytes,
                                         check_finite=False)
        except BadRecord as exc:
            bad.append((i, exc))
            continue
        slow.append((i, decoded.values, decoded.record_id))
    x = np.frombuffer(b"".join(fast_values), dtype="<f4").reshape(len(fast_values), size)
    x = x.astype(np.float64)
    rows, ids = fast_at, fast_ids
    if slow:
        order = np.argsort(np.array(fast_at + [i for i, _, _ in slow]), kind="stable")
        x = np.concatenate([x, np.stack([v for _, v, _ in slow])])[order]
        rows = [(fast_at + [i for i, _, _ in slow])[k] for k in order.tolist()]
        ids = [(fast_ids + [r for _, _, r in slow])[k] for k in order.tolist()]
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        bad += [(rows[k], BadRecord("not_finite", "NaN or infinite values", ids[k]))
                for k in np.flatnonzero(~finite).tolist()]
        keep = np.flatnonzero(finite).tolist()
        x, rows, ids = x[finite], [rows[k] for k in keep], [ids[k] for k in keep]
    return x, ids, rows, sorted(bad, key=lambda b: b[0])


def _plain_tensor_id(value: bytes | None, headers: Headers | None, nbytes: int) -> str | None:
    """The id of a plain float32 tensor record of ``nbytes`` bytes, else None.

    Plain: content-type tensor, dtype float32, one id header of 1-256 characters, no shape
    header. Anything else (including every bad record) takes the full decoder.
    """
    if value is None or len(value) != nbytes or not headers:
        return None
    ctype = dtype = rid = None
    for key, val in headers:
        k = key.lower()
        if k == "content-type":
            ctype = val
        elif k == "dtype":
            dtype = val
        elif k == "id":
            if rid is not None:
                return None
            rid = val
        elif k == "shape":
            return None
    if ctype != _TENSOR_BYTES or dtype != b"float32" or not rid or len(rid) > 256:
        return None
    try:
        text = rid.decode("utf-8")
    except (UnicodeDecodeError, AttributeError):
        return None
    return text if len(text) <= 256 else None


def _decode_tensor(value: bytes, h: dict[str, bytes], rid: str) -> np.ndarray:
    dtype_name = h.get("dtype", b"").decode("latin-1").strip().lower()
    if dtype_name not in BINARY_DTYPES:
        raise BadRecord("bad_dtype", f"dtype header {dtype_name!r} is not one of "
                        f"{sorted(BINARY_DTYPES)}", rid)
    dtype = np.dtype(BINARY_DTYPES[dtype_name])
    if len(value) % dtype.itemsize:
        raise BadRecord("bad_shape", f"{len(value)} bytes is not a whole number of {dtype_name}", rid)
    arr = np.frombuffer(value, dtype=dtype)
    if "shape" in h:
        text = h["shape"].decode("latin-1")
        try:
            shape = tuple(int(d) for d in text.split(",")) if _SHAPE.fullmatch(text) else ()
        except ValueError:  # more digits than int() converts
            shape = ()
        if not shape:
            raise BadRecord("bad_shape", "shape header is not comma-separated integers", rid)
        if min(shape) < 1:
            raise BadRecord("bad_shape", f"shape header {shape} has a dimension below 1", rid)
        if math.prod(shape) != arr.size:
            raise BadRecord("bad_shape", f"shape header {shape} does not match {arr.size} values", rid)
    return arr.astype(np.float64)


def _decode_npy(value: bytes, rid: str) -> np.ndarray:
    try:
        arr = np.load(io.BytesIO(value), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise BadRecord("bad_schema", f"not a valid .npy payload ({str(exc)[:120]})", rid) from None
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "biuf":
        raise BadRecord("bad_dtype", f"unsupported .npy dtype {getattr(arr, 'dtype', '?')}", rid)
    return arr.astype(np.float64)


def decode_bn_input(
    value: bytes | None, *, features: Sequence[str], states: Sequence[Sequence[str]],
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> BNInput:
    """Decode one BN record into state indices, in ``features`` order."""
    value = _check_payload(value, max_bytes)
    obj = parse_json_object(value)
    rid = _record_id(obj.get("id"))
    evidence = obj.get("evidence")
    if not isinstance(evidence, dict):
        raise BadRecord("bad_schema", "'evidence' must be an object of variable: state", rid)
    index = {f: i for i, f in enumerate(features)}
    unknown = sorted(k for k in evidence if k not in index)
    if unknown:
        raise BadRecord("unknown_variable", f"not features of the classifier: {unknown[:5]}", rid)
    missing = [f for f in features if f not in evidence]
    if missing:
        raise BadRecord("missing_evidence", f"no state given for {missing[:5]}", rid)
    out = np.empty(len(features), dtype=np.int64)
    for name, i in index.items():
        state = evidence[name]
        try:
            out[i] = states[i].index(state)
        except ValueError:
            raise BadRecord("unknown_state",
                            f"{name}={state!r} is not one of {list(states[i])}", rid) from None
    return BNInput(rid, out)
