"""Input decoders: every documented form decodes; every bad record gets its reason."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boxwatch.agent.metrics import INVALID_REASONS
from boxwatch.agent.records import (
    NPY_TYPE,
    TENSOR_TYPE,
    BadRecord,
    decode_bn_input,
    decode_model_batch,
    decode_model_input,
)

SIZE = 4
FEATURES = ("A", "B")
STATES = (("lo", "hi"), ("x", "y", "z"))


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def test_json_input():
    rec = decode_model_input(b'{"id": "a1", "input": [[1, 2], [3, 4.5]]}', None, size=SIZE)
    assert rec.record_id == "a1"
    np.testing.assert_array_equal(rec.values, [1, 2, 3, 4.5])
    rec = decode_model_input(b'{"id": 7, "input": [0,0,0,0]}',
                             [("content-type", b"application/json")], size=SIZE)
    assert rec.record_id == "7"


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "uint8", "int64"])
def test_raw_tensor_input(dtype):
    arr = np.array([1, 2, 3, 4], dtype=np.dtype(dtype).newbyteorder("<"))
    headers = [("content-type", TENSOR_TYPE.encode()), ("id", b"t"), ("dtype", dtype.encode()),
               ("shape", b"1,4")]
    rec = decode_model_input(arr.tobytes(), headers, size=SIZE)
    np.testing.assert_array_equal(rec.values, [1, 2, 3, 4])


def test_npy_input():
    headers = [("content-type", NPY_TYPE.encode()), ("id", b"n")]
    rec = decode_model_input(npy_bytes(np.arange(4, dtype=np.float32).reshape(2, 2)), headers,
                             size=SIZE)
    np.testing.assert_array_equal(rec.values, [0, 1, 2, 3])


BAD_CASES = [
    (b"\x00\xff garbage", None, "bad_content_type"),
    (b"{not json", None, "not_json"),
    (b'{"id": "a", "input": [1, 2, 3', None, "not_json"),
    (b"[1, 2, 3, 4]", [("content-type", b"application/json")], "bad_schema"),
    (b'{"input": [1, 2, 3, 4]}', None, "missing_id"),
    (b'{"id": null, "input": [1, 2, 3, 4]}', None, "missing_id"),
    (b'{"id": true, "input": [1, 2, 3, 4]}', None, "missing_id"),
    (b'{"id": "a", "id": "b", "input": [1, 2, 3, 4]}', None, "duplicate_id"),
    (b'{"id": "a"}', None, "bad_schema"),
    (b'{"id": "a", "input": [1, 2, 3]}', None, "bad_shape"),
    (b'{"id": "a", "input": [[1, 2], [3]]}', None, "bad_shape"),
    (b'{"id": "a", "input": ["1", "x", 3, 4]}', None, "bad_dtype"),
    (b'{"id": "a", "input": [1, 2, 3, NaN]}', None, "not_finite"),
    (b'{"id": "a", "input": [1, 2, 3, 1e999]}', None, "not_finite"),
    (b'{"id": "a", "input": [1, 2, 3, 1' + b"0" * 400 + b']}', None, "not_finite"),
    (b'{"id": "a", "input": ' + b"[" * 5000 + b"]" * 5000 + b"}", None, "not_json"),
    (b"\x00\x00\x80\x3f" * 4, [("content-type", TENSOR_TYPE.encode()), ("id", b"t")], "bad_dtype"),
    (b"\x00\x00\x80\x3f" * 4, [("content-type", TENSOR_TYPE.encode()), ("id", b"t"),
                               ("dtype", b"complex64")], "bad_dtype"),
    (b"\x00\x00\x80\x3f" * 4, [("content-type", TENSOR_TYPE.encode()), ("dtype", b"float32")],
     "missing_id"),
    (b"\x00\x00\x80\x3f" * 4, [("content-type", TENSOR_TYPE.encode()), ("id", b"a"), ("id", b"b"),
                               ("dtype", b"float32")], "duplicate_id"),
    (b"\x00\x00\x80\x3f" * 3, [("content-type", TENSOR_TYPE.encode()), ("id", b"t"),
                               ("dtype", b"float32")], "bad_shape"),
    (b"\x00\x00\x80" * 4, [("content-type", TENSOR_TYPE.encode()), ("id", b"t"),
                           ("dtype", b"float32")], "bad_shape"),
    (np.full(4, np.inf, dtype="<f4").tobytes(), [("content-type", TENSOR_TYPE.encode()),
                                                  ("id", b"t"), ("dtype", b"float32")], "not_finite"),
    (b"not npy", [("content-type", NPY_TYPE.encode()), ("id", b"n")], "bad_schema"),
    (b"{}", [("content-type", b"text/csv")], "bad_content_type"),
    (None, None, "bad_schema"),
    (b'{"id": "a", "input": [' + b"1," * 400_000 + b"1]}", None, "too_large"),
]


@pytest.mark.parametrize("value,headers,reason", BAD_CASES)
def test_bad_model_records(value, headers, reason):
    with pytest.raises(BadRecord) as info:
        decode_model_input(value, headers, size=SIZE, max_bytes=100_000)
    assert info.value.reason == reason, info.value.detail
    assert info.value.reason in INVALID_REASONS


def test_bn_records():
    rec = decode_bn_input(b'{"id": "c", "evidence": {"B": "z", "A": "hi"}}',
                          features=FEATURES, states=STATES)
    assert rec.record_id == "c" and rec.states.tolist() == [1, 2]
    cases = {
        b'{"id": "c", "evidence": {"A": "hi", "B": "z", "C": "q"}}': "unknown_variable",
        b'{"id": "c", "evidence": {"A": "mid", "B": "z"}}': "unknown_state",
        b'{"id": "c", "evidence": {"A": ["hi"], "B": "z"}}': "unknown_state",
        b'{"id": "c", "evidence": {"A": "hi"}}': "missing_evidence",
        b'{"id": "c", "evidence": ["A", "hi"]}': "bad_schema",
        b'{"evidence": {"A": "hi", "B": "z"}}': "missing_id",
        b"\xff\xfe": "not_json",
    }
    for value, reason in cases.items():
        with pytest.raises(BadRecord) as info:
            decode_bn_input(value, features=FEATURES, states=STATES)
        assert info.value.reason == reason, value


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.lists(st.tuples(st.sampled_from(
    ["content-type", "id", "dtype", "shape", "x"]), st.binary(max_size=20)), max_size=5))
def test_decoder_never_raises_anything_but_bad_record(value, headers):
    """Arbitrary bytes and headers: a valid input or a BadRecord with a known reason."""
    try:
        rec = decode_model_input(value, headers, size=SIZE)
    except BadRecord as exc:
        assert exc.reason in INVALID_REASONS
    else:
        assert rec.values.shape == (SIZE,) and np.isfinite(rec.values).all()


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c,
                                                                        max_size=4),
                    max_leaves=12))
def test_bn_decoder_on_arbitrary_json(obj):
    value = json.dumps({"id": "h", "evidence": obj}).encode()
    try:
        rec = decode_bn_input(value, features=FEATURES, states=STATES)
    except BadRecord as exc:
        assert exc.reason in INVALID_REASONS
    else:
        assert rec.states.shape == (2,)


def _record_strategy():
    """Mostly well-formed float32 tensors, with every kind of variant and damage mixed in."""
    floats = st.floats(width=32, allow_nan=True, allow_infinity=True)
    plain = st.lists(floats, min_size=SIZE, max_size=SIZE).map(
        lambda v: np.array(v, dtype="<f4").tobytes())
    values = st.one_of(plain, plain, st.binary(max_size=40), st.none(),
                       st.just(b'{"id": "j", "input": [1, 2, 3, 4]}'))
    header = st.tuples(st.sampled_from(["content-type", "Content-Type", "id", "ID", "dtype",
                                        "shape", "other"]),
                       st.sampled_from([TENSOR_TYPE.encode(), b"float32", b"float64", b"4",
                                        b"1,4", b"r1", b"\xff\xfe", b"", b"x" * 300]))
    typical = st.just([("content-type", TENSOR_TYPE.encode()), ("id", b"r"),
                       ("dtype", b"float32")])
    return st.tuples(values, st.one_of(typical, typical, st.lists(header, max_size=5)))


@settings(max_examples=300, deadline=None)
@given(st.lists(_record_strategy(), min_size=1, max_size=12), st.sampled_from([16, 1 << 20]))
def test_batch_decoder_decides_like_the_record_decoder(records, max_bytes):
    """Same good rows, values, ids and bad reasons as decoding each record on its own."""
    x, ids, rows, bad = decode_model_batch(records, size=SIZE, max_bytes=max_bytes)
    want_good, want_bad = [], []
    for i, (value, headers) in enumerate(records):
        try:
            rec = decode_model_input(value, headers, size=SIZE, max_bytes=max_bytes)
        except BadRecord as exc:
            want_bad.append((i, exc.reason, exc.detail))
        else:
            want_good.append((i, rec.record_id, rec.values))
    assert rows == [i for i, _, _ in want_good]
    assert ids == [r for _, r, _ in want_good]
    assert x.shape == (len(rows), SIZE) and x.dtype == np.float64
    for k, (_, _, values) in enumerate(want_good):
        np.testing.assert_array_equal(x[k], values)
    assert [(i, e.reason, e.detail) for i, e in bad] == want_bad


def _tensor(shape: bytes) -> list[tuple[str, bytes]]:
    return [("content-type", TENSOR_TYPE.encode()), ("id", b"t"), ("dtype", b"float32"),
            ("shape", shape)]


STRICT_CASES = [
    # numbers written as strings, booleans and nulls in "input" are not numbers
    (b'{"id": "a", "input": ["0.5", "1", "2", "3"]}', None, "bad_dtype"),
    (b'{"id": "a", "input": [true, false, true, false]}', None, "bad_dtype"),
    (b'{"id": "a", "input": [1, 2, 3, true]}', None, "bad_dtype"),
    (b'{"id": "a", "input": [1.5, 2, 3, false]}', None, "bad_dtype"),
    (b'{"id": "a", "input": [1, 2, 3, null]}', None, "bad_dtype"),
    (b'{"id": "a", "input": [[1, 2], [3, "4"]]}', None, "bad_dtype"),
    (b'{"id": "a", "input": [[1, 2], [true]]}', None, "bad_dtype"),
    (b'{"id": "a", "input": "1234"}', None, "bad_dtype"),
    (b'{"id": "a", "input": null}', None, "bad_dtype"),
    # a shape header must be positive integers whose product is the value count
    (b"\x00\x00\x80\x3f" * 4, _tensor(b"-2,-2"), "bad_shape"),
    (b"\x00\x00\x80\x3f" * 4, _tensor(b"-1,-4"), "bad_shape"),
    (b"\x00\x00\x80\x3f" * 4, _tensor(b"4,1,-1,-1"), "bad_shape"),
    (b"\x00\x00\x80\x3f" * 4, _tensor(b"4,"), "bad_shape"),
    (b"\x00\x00\x80\x3f" * 4, _tensor(b"1,,4"), "bad_shape"),
    (b"\x00\x00\x80\x3f" * 4, _tensor(b"4_0"), "bad_shape"),
    (b"\x00\x00\x80\x3f" * 4, _tensor(b""), "bad_shape"),
    (b"\x00\x00\x80\x3f" * 4, _tensor(b"9" * 5000), "bad_shape"),
    # an id must be text a verdict can carry (a lone surrogate cannot be encoded)
    (b'{"id": "\\ud800", "input": [1, 2, 3, 4]}', None, "missing_id"),
]


@pytest.mark.parametrize("value,headers,reason", STRICT_CASES)
def test_lax_inputs_are_refused(value, headers, reason):
    """Each case was accepted (or given another reason) before; both decoders refuse it."""
    with pytest.raises(BadRecord) as info:
        decode_model_input(value, headers, size=SIZE)
    assert info.value.reason == reason, info.value.detail
    x, ids, rows, bad = decode_model_batch([(value, headers)], size=SIZE)
    assert rows == [] and [(i, e.reason) for i, e in bad] == [(0, reason)]


@pytest.mark.parametrize("shape", [b"1,4", b"4", b" 2 , 2 ", b"1,1,4,1"])
def test_positive_shape_headers_still_decode(shape):
    rec = decode_model_input(b"\x00\x00\x80\x3f" * 4, _tensor(shape), size=SIZE)
    np.testing.assert_array_equal(rec.values, [1, 1, 1, 1])
