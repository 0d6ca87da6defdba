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
integer, present exactly once. Reasons are the fixed set in :data:`vocab.DEAD_LETTER_REASONS`.

:func:`decode_model_input` is the reference decoder (stdlib ``json``): it decides every
record and every reason. :func:`decode_model_batch` decodes a micro-batch with two fast
paths that only ever *accept* (plain float32 tensors with one ``frombuffer``, plain JSON
records with msgspec typed structs and one array per batch) and hands every other record to
the reference, so it decides exactly as the reference does (property-tested).
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

import msgspec
import numpy as np

from boxwatch.agent.diagram import RecordError, state_indices
from boxwatch.agent.vocab import DEAD_LETTER_REASONS

SCHEMA_VERSION = 1
JSON_TYPE = "application/json"
TENSOR_TYPE = "application/x-boxwatch-tensor"
NPY_TYPE = "application/x-npy"
BINARY_DTYPES = {
    "float32": "<f4",
    "float64": "<f8",
    "float16": "<f2",
    "uint8": "u1",
    "int64": "<i8",
}
DEFAULT_MAX_RECORD_BYTES = 1 << 20
_TENSOR_BYTES = TENSOR_TYPE.encode()
_NOT_NUMBERS = frozenset({str, bool, type(None)})
_SHAPE = re.compile(r"\s*[0-9]+\s*(?:,\s*[0-9]+\s*)*")
_MAX_JSON_DEPTH = 8

Headers = Sequence[tuple[str, bytes | None]]


class BadRecord(Exception):
    """A record that cannot be processed; ``reason`` is one of
    :data:`vocab.DEAD_LETTER_REASONS` (anything else is a bug: ``ValueError``)."""

    def __init__(self, reason: str, detail: str, record_id: str | None = None):
        if reason not in DEAD_LETTER_REASONS:
            raise ValueError(f"unknown dead-letter reason {reason!r}")
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
        obj = json.loads(
            value.decode("utf-8"), object_pairs_hook=_strict_pairs, parse_constant=_reject_constant
        )
    except BadRecord:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise BadRecord(
            "not_json", f"invalid JSON ({type(exc).__name__}: {str(exc)[:120]})"
        ) from None
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
            raise BadRecord(
                "bad_dtype", f"'input' holds {', '.join(names)} values, not numbers", rid
            )
        if list not in kinds:
            return
        lists = level if kinds == {list} else filter(list.__instancecheck__, level)
        level = list(itertools.chain.from_iterable(cast(Iterable[list[object]], lists)))


def _check_payload(value: bytes | None, max_bytes: int) -> bytes:
    """A record value must exist and stay within the size limit."""
    if value is None:
        raise BadRecord("bad_schema", "empty record (null value)")
    if len(value) > max_bytes:
        raise BadRecord("too_large", f"{len(value)} bytes exceeds the {max_bytes}-byte limit")
    return value


def decode_model_input(
    value: bytes | None,
    headers: Headers | None,
    *,
    size: int,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    check_finite: bool = True,
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
            raise BadRecord(
                "bad_shape", "'input' is not a rectangular array of numbers", rid
            ) from None
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
    records: Sequence[tuple[bytes | None, Headers | None]],
    *,
    size: int,
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> tuple[np.ndarray, list[str], list[int], list[tuple[int, BadRecord]]]:
    """Decode a micro-batch of ``(value, headers)`` model inputs at once.

    Returns ``(x, ids, rows, bad)``: ``x`` of shape (len(rows), size), float64, holds the
    good inputs in order, ``rows`` their positions in ``records``, ``ids`` their ids, and
    ``bad`` the ``(position, BadRecord)`` of the others; NaN/Inf rows are bad too. The same
    decisions as :func:`decode_model_input` record by record. Plain float32 tensors with no
    ``shape`` header (the common binary form) are decoded with one ``frombuffer`` for the
    whole batch; plain JSON records (:func:`_plain_json`) with msgspec, their flat inputs
    converted to one array for the whole batch; every other record by
    :func:`decode_model_input`.
    """
    nbytes = size * 4
    tensors: list[bytes] = []
    tensor_at: list[int] = []
    tensor_ids: list[str] = []
    flat: list[list[float]] = []
    flat_at: list[int] = []
    flat_ids: list[str] = []
    other: list[np.ndarray] = []
    other_at: list[int] = []
    other_ids: list[str] = []
    bad: list[tuple[int, BadRecord]] = []
    plain_fits = nbytes <= max_bytes
    for i, (value, headers) in enumerate(records):
        if headers:  # a plain tensor has headers; JSON mostly has none
            rid = _plain_tensor_id(value, headers, nbytes) if plain_fits else None
            if rid is not None:
                tensors.append(value)  # type: ignore[arg-type]  # a plain tensor's value is bytes
                tensor_at.append(i)
                tensor_ids.append(rid)
                continue
            json_like = value is not None and _is_json(value, headers)
        else:
            json_like = value is not None and value[:1] == b"{"
        plain = (
            _plain_json(value, size)
            if json_like and value is not None and len(value) <= max_bytes
            else None
        )
        if plain is not None:
            if isinstance(plain[1], list):
                flat.append(plain[1])
                flat_at.append(i)
                flat_ids.append(plain[0])
            else:
                other.append(plain[1])
                other_at.append(i)
                other_ids.append(plain[0])
            continue
        try:
            decoded = decode_model_input(
                value, headers, size=size, max_bytes=max_bytes, check_finite=False
            )
        except BadRecord as exc:
            bad.append((i, exc))
            continue
        other.append(decoded.values)
        other_at.append(i)
        other_ids.append(decoded.record_id)
    blocks = [np.frombuffer(b"".join(tensors), dtype="<f4").reshape(len(tensors), size)]
    if flat:
        blocks.append(
            np.fromiter(itertools.chain.from_iterable(flat), np.float64, len(flat) * size).reshape(
                len(flat), size
            )
        )
    if other:
        blocks.append(np.stack(other))
    x = np.concatenate(blocks, dtype=np.float64)
    rows, ids = tensor_at + flat_at + other_at, tensor_ids + flat_ids + other_ids
    if sum(map(bool, (tensor_at, flat_at, other_at))) > 1:  # blocks interleave
        order = np.argsort(np.array(rows), kind="stable")
        x = x[order]
        rows = [rows[k] for k in order.tolist()]
        ids = [ids[k] for k in order.tolist()]
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        bad += [
            (rows[k], BadRecord("not_finite", "NaN or infinite values", ids[k]))
            for k in np.flatnonzero(~finite).tolist()
        ]
        keep = np.flatnonzero(finite).tolist()
        x, rows, ids = x[finite], [rows[k] for k in keep], [ids[k] for k in keep]
    return x, ids, rows, sorted(bad, key=lambda b: b[0])


class _FlatInput(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """A plain JSON model input: exactly ``id`` and a flat list of numbers (GC-untracked)."""

    id: str | int
    input: list[float]


class _RawInput(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """The same object with ``input`` left as raw JSON (nested lists, decoded by depth)."""

    id: str | int
    input: msgspec.Raw


def _nested_list(depth: int) -> object:
    """``list[list[...[float]]]``, ``depth`` lists deep."""
    kind: object = float
    for _ in range(depth):
        kind = list[kind]  # type: ignore[valid-type]  # built at run time for msgspec, by depth
    return kind


_FLAT_DECODER = msgspec.json.Decoder(_FlatInput)
_RAW_DECODER = msgspec.json.Decoder(_RawInput)
_NESTED_DECODERS = {d: msgspec.json.Decoder(_nested_list(d)) for d in range(2, _MAX_JSON_DEPTH + 1)}
_OPENING = b"[ \t\n\r"


def _is_json(value: bytes, headers: Headers) -> bool:
    """Whether the reference decoder would parse ``value`` as JSON with these headers.

    Bodies that do not start with ``{`` are left to it (it allows leading whitespace).
    """
    try:
        ctype = _content_type(header_map(headers))
    except BadRecord:
        return False
    return ctype == JSON_TYPE or (ctype == "" and value[:1] == b"{")


def _plain_json(value: bytes, size: int) -> tuple[str, list[float] | np.ndarray] | None:
    """The id and input of a plain JSON model input, else None (the reference decides).

    Plain: a JSON object of exactly the keys ``id`` (a string or an integer the reference
    accepts) and ``input`` (a flat list of ``size`` numbers, or a rectangular nested list of
    them at most 8 deep). msgspec checks syntax, UTF-8, types and that numbers fit a float,
    but keeps the last of repeated keys: every ``"`` byte then delimits a key or the id or
    is an escaped quote, so a count of exactly 4 (6 with a string id) proves that each key
    appears once (an id holding an escaped quote is left to the reference). A flat input
    is returned as the list msgspec built, a nested one as a flat float64 array. Assumes
    the content type and the size limit were checked.
    """
    try:
        rec: _FlatInput | _RawInput = (flat := _FLAT_DECODER.decode(value))
        row: list[float] | np.ndarray = flat.input
        if len(row) != size:
            return None
    except msgspec.ValidationError:
        try:
            rec = _RAW_DECODER.decode(value)
        except (msgspec.DecodeError, RecursionError):  # skipping deep nesting recurses
            return None
        body = bytes(rec.input)
        decoder = _NESTED_DECODERS.get(body[: len(body) - len(body.lstrip(_OPENING))].count(b"["))
        if decoder is None:
            return None
        try:
            row = np.array(decoder.decode(body), dtype=np.float64)
        except (msgspec.DecodeError, RecursionError, ValueError):  # ragged: ValueError
            return None
        if row.size != size:
            return None
        row = row.reshape(-1)
    except (msgspec.DecodeError, RecursionError):
        return None
    rid = rec.id
    if type(rid) is str:  # UTF-8 text (msgspec refuses lone surrogates): as _record_id
        return (rid, row) if value.count(b'"') == 6 and 0 < len(rid) <= 256 else None
    if value.count(b'"') != 4:
        return None
    try:
        return _record_id(rid), row
    except BadRecord:
        return None


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
    if not dtype_name:
        raise BadRecord(
            "bad_dtype",
            f"binary input has no dtype header (content-type {TENSOR_TYPE} needs one of "
            f"{sorted(BINARY_DTYPES)})",
            rid,
        )
    if dtype_name not in BINARY_DTYPES:
        raise BadRecord(
            "bad_dtype", f"dtype header {dtype_name!r} is not one of {sorted(BINARY_DTYPES)}", rid
        )
    dtype = np.dtype(BINARY_DTYPES[dtype_name])
    if len(value) % dtype.itemsize:
        raise BadRecord(
            "bad_shape", f"{len(value)} bytes is not a whole number of {dtype_name}", rid
        )
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
            raise BadRecord(
                "bad_shape", f"shape header {shape} does not match {arr.size} values", rid
            )
    return arr.astype(np.float64)


def _decode_npy(value: bytes, rid: str) -> np.ndarray:
    try:
        arr = np.load(io.BytesIO(value), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise BadRecord("bad_schema", f"not a valid .npy payload ({str(exc)[:120]})", rid) from None
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "iuf":  # no bool, as in JSON
        raise BadRecord("bad_dtype", f"unsupported .npy dtype {getattr(arr, 'dtype', '?')}", rid)
    return arr.astype(np.float64)


@functools.lru_cache(maxsize=8)
def _state_index(states: tuple[tuple[str, ...], ...]) -> tuple[dict[str, int], ...]:
    """State name -> index per feature (cached: the agent decodes every record against the
    same diagram's states)."""
    return tuple({s: j for j, s in enumerate(names)} for names in states)


def decode_bn_input(
    value: bytes | None,
    *,
    features: Sequence[str],
    states: Sequence[Sequence[str]],
    max_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> BNInput:
    """Decode one BN record into state indices, in ``features`` order."""
    value = _check_payload(value, max_bytes)
    obj = parse_json_object(value)
    rid = _record_id(obj.get("id"))
    evidence = obj.get("evidence")
    if not isinstance(evidence, dict):
        raise BadRecord("bad_schema", "'evidence' must be an object of variable: state", rid)
    try:
        index = _state_index(states)
    except TypeError:
        index = _state_index.__wrapped__(states)  # lists of states are not hashable
    try:
        return BNInput(rid, state_indices(evidence, features, index))
    except RecordError as exc:
        raise BadRecord(exc.reason, str(exc), rid) from None
