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
    _plain_json,
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
    rec = decode_model_input(
        b'{"id": 7, "input": [0,0,0,0]}', [("content-type", b"application/json")], size=SIZE
    )
    assert rec.record_id == "7"


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "uint8", "int64"])
def test_raw_tensor_input(dtype):
    arr = np.array([1, 2, 3, 4], dtype=np.dtype(dtype).newbyteorder("<"))
    headers = [
        ("content-type", TENSOR_TYPE.encode()),
        ("id", b"t"),
        ("dtype", dtype.encode()),
        ("shape", b"1,4"),
    ]
    rec = decode_model_input(arr.tobytes(), headers, size=SIZE)
    np.testing.assert_array_equal(rec.values, [1, 2, 3, 4])


def test_npy_input():
    headers = [("content-type", NPY_TYPE.encode()), ("id", b"n")]
    rec = decode_model_input(
        npy_bytes(np.arange(4, dtype=np.float32).reshape(2, 2)), headers, size=SIZE
    )
    np.testing.assert_array_equal(rec.values, [0, 1, 2, 3])


def test_npy_booleans_are_bad_dtype_as_in_json():
    headers = [("content-type", NPY_TYPE.encode()), ("id", b"n")]
    with pytest.raises(BadRecord) as exc:
        decode_model_input(npy_bytes(np.ones(4, dtype=bool)), headers, size=SIZE)
    assert exc.value.reason == "bad_dtype"


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
    (b'{"id": "a", "input": [1, 2, 3, 1' + b"0" * 400 + b"]}", None, "not_finite"),
    (b'{"id": "a", "input": ' + b"[" * 5000 + b"]" * 5000 + b"}", None, "not_json"),
    (b"\x00\x00\x80\x3f" * 4, [("content-type", TENSOR_TYPE.encode()), ("id", b"t")], "bad_dtype"),
    (
        b"\x00\x00\x80\x3f" * 4,
        [("content-type", TENSOR_TYPE.encode()), ("id", b"t"), ("dtype", b"complex64")],
        "bad_dtype",
    ),
    (
        b"\x00\x00\x80\x3f" * 4,
        [("content-type", TENSOR_TYPE.encode()), ("dtype", b"float32")],
        "missing_id",
    ),
    (
        b"\x00\x00\x80\x3f" * 4,
        [("content-type", TENSOR_TYPE.encode()), ("id", b"a"), ("id", b"b"), ("dtype", b"float32")],
        "duplicate_id",
    ),
    (
        b"\x00\x00\x80\x3f" * 3,
        [("content-type", TENSOR_TYPE.encode()), ("id", b"t"), ("dtype", b"float32")],
        "bad_shape",
    ),
    (
        b"\x00\x00\x80" * 4,
        [("content-type", TENSOR_TYPE.encode()), ("id", b"t"), ("dtype", b"float32")],
        "bad_shape",
    ),
    (
        np.full(4, np.inf, dtype="<f4").tobytes(),
        [("content-type", TENSOR_TYPE.encode()), ("id", b"t"), ("dtype", b"float32")],
        "not_finite",
    ),
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


@pytest.mark.parametrize("value,headers,reason", BAD_CASES)
def test_bad_model_records_in_a_batch(value, headers, reason):
    """The batch decoder gives each bad record the reference's reason, between good ones."""
    good = (b'{"id": "g", "input": [1, 2, 3, 4]}', None)
    x, ids, rows, bad = decode_model_batch(
        [good, (value, headers), good], size=SIZE, max_bytes=100_000
    )
    assert rows == [0, 2] and ids == ["g", "g"]
    assert [(i, e.reason) for i, e in bad] == [(1, reason)], bad


def test_bn_records():
    rec = decode_bn_input(
        b'{"id": "c", "evidence": {"B": "z", "A": "hi"}}', features=FEATURES, states=STATES
    )
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
@given(
    st.binary(max_size=300),
    st.lists(
        st.tuples(
            st.sampled_from(["content-type", "id", "dtype", "shape", "x"]), st.binary(max_size=20)
        ),
        max_size=5,
    ),
)
def test_decoder_never_raises_anything_but_bad_record(value, headers):
    """Arbitrary bytes and headers: a valid input or a BadRecord with a known reason."""
    try:
        rec = decode_model_input(value, headers, size=SIZE)
    except BadRecord as exc:
        assert exc.reason in INVALID_REASONS
    else:
        assert rec.values.shape == (SIZE,) and np.isfinite(rec.values).all()


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=4),
        max_leaves=12,
    )
)
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
        lambda v: np.array(v, dtype="<f4").tobytes()
    )
    values = st.one_of(
        plain,
        plain,
        st.binary(max_size=40),
        st.none(),
        st.just(b'{"id": "j", "input": [1, 2, 3, 4]}'),
    )
    header = st.tuples(
        st.sampled_from(["content-type", "Content-Type", "id", "ID", "dtype", "shape", "other"]),
        st.sampled_from(
            [
                TENSOR_TYPE.encode(),
                b"float32",
                b"float64",
                b"4",
                b"1,4",
                b"r1",
                b"\xff\xfe",
                b"",
                b"x" * 300,
            ]
        ),
    )
    typical = st.just([("content-type", TENSOR_TYPE.encode()), ("id", b"r"), ("dtype", b"float32")])
    return st.tuples(values, st.one_of(typical, typical, st.lists(header, max_size=5)))


def assert_batch_decodes_like_records(records, max_bytes: int) -> None:
    """``decode_model_batch`` gives the record decoder's accepts, ids, bit-identical values,
    reasons and details, record by record."""
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
        assert x[k].tobytes() == values.tobytes(), (x[k], values)
    assert [(i, e.reason, e.detail) for i, e in bad] == want_bad


@settings(max_examples=300, deadline=None)
@given(st.lists(_record_strategy(), min_size=1, max_size=12), st.sampled_from([16, 1 << 20]))
def test_batch_decoder_decides_like_the_record_decoder(records, max_bytes):
    """Same good rows, values, ids and bad reasons as decoding each record on its own."""
    assert_batch_decodes_like_records(records, max_bytes)


def _tensor(shape: bytes) -> list[tuple[str, bytes]]:
    return [
        ("content-type", TENSOR_TYPE.encode()),
        ("id", b"t"),
        ("dtype", b"float32"),
        ("shape", shape),
    ]


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


@pytest.mark.parametrize(
    "value",
    [
        b'{"id": "a1", "input": [0.5, 1, -2e-3, 16.0]}',
        b'{"input":[0,0,0,1E5],"id":7}',
        b'{"id": "r", "input": [[1, 2], [3, 4.5]]}',
        b'{"id": "r", "input": [ [ [1], [2] ], [ [3], [4] ] ] }\n',
        b'{"id": "caf\xc3\xa9", "input": [1, 2, 3, 4]}',
        b'{"id": "caf\\u00e9\\n", "input": [1, 2, 3, 4]}',
    ],
)
def test_plain_json_takes_the_fast_path(value):
    """The forms the agent mostly sees are decided by msgspec, not the reference."""
    plain = _plain_json(value, SIZE)
    assert plain is not None
    ref = decode_model_input(value, None, size=SIZE)
    assert plain[0] == ref.record_id
    np.testing.assert_array_equal(np.asarray(plain[1], dtype=np.float64), ref.values)


@pytest.mark.parametrize(
    "value",
    [
        b'{"id": "a", "id": "a", "input": [1, 2, 3, 4]}',
        b'{"id": "a", "input": [1, 2, 3, 4], "input": [1, 2, 3, 4]}',
        b'{"id": 1, "input": [1, 2, 3, 4], "id": 1}',
        b'{"\\u0069d": "a", "id": "b", "input": [1, 2, 3, 4]}',
        b'{"id": "a", "input": [1, 2, 3, 4], "extra": 1}',
        b'{"id": "a", "input": [[1, 2], [3]]}',
    ],
)
def test_fast_path_leaves_the_rest_to_the_reference(value):
    assert _plain_json(value, SIZE) is None


# JSON documents assembled from parts: mostly plain records, with every variant the fast
# path must either decode exactly like the reference or leave to it.
_WS = st.sampled_from(["", "", " ", "\n", "\t ", "\r\n"])
_NUMBER = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    st.integers(-(2**70), 2**70).map(str),
    st.builds(
        lambda a, b, e: f"{a}.{b}e{e}",
        st.integers(0, 10**20),
        st.integers(0, 10**20),
        st.integers(-340, 340),
    ),
    st.sampled_from(
        [
            "0",
            "-0",
            "-0.0",
            "1E5",
            "1e+2",
            "2.5e-3",
            "1e400",
            "-1e400",
            "1e-400",
            "1" + "0" * 320,
            "9007199254740993",
            "18446744073709551617",
            "1.00000000000000011102230246251565404236316680908203125",
            "1.00000000000000011102230246251565404236316680908203125000001",
            "2.2250738585072011e-308",
            "4.9406564584124654e-324",
            "1.7976931348623158e308",
            "NaN",
            "Infinity",
            "-Infinity",
            "01",
            "1.",
            ".5",
            "+1",
            "- 1",
            "true",
            "false",
            "null",
            '"1"',
            "[]",
            "{}",
        ]
    ),
)
_PLAIN_NUMBER = st.one_of(
    st.floats(0, 16).map(lambda v: repr(float(round(v)))), st.integers(0, 16).map(str)
)
_ID = st.one_of(
    st.text(max_size=6).map(lambda t: json.dumps(t, ensure_ascii=False)),
    st.text(max_size=6).map(json.dumps),
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(
        [
            '"r1"',
            '""',
            "null",
            "true",
            "1.5",
            "[]",
            "{}",
            '"' + "x" * 257 + '"',
            '"' + "x" * 256 + '"',
            '"\\ud800"',
            '"a\\"b"',
            '"a:b,c"',
            "-0",
            "1" + "0" * 255,
            "1" + "0" * 256,
            "1" + "0" * 400,
            "1" + "0" * 5000,
        ]
    ),
)


@st.composite
def _json_input(draw) -> str:
    ws = draw(_WS)
    num = draw(st.sampled_from([_PLAIN_NUMBER, _PLAIN_NUMBER, _NUMBER]))

    def row(n: int) -> str:
        return "[" + f",{ws}".join(draw(st.lists(num, min_size=n, max_size=n))) + "]"

    kind = draw(
        st.sampled_from(
            [
                "flat",
                "flat",
                "flat",
                "2x2",
                "4x1",
                "2x3",
                "1x2x2",
                "ragged",
                "short",
                "long",
                "scalar",
                "deep",
                "deep_in",
            ]
        )
    )
    if kind == "flat":
        return row(SIZE)
    if kind in ("2x2", "4x1", "2x3"):
        rows, cols = int(kind[0]), int(kind[2])
        return f"[{ws}" + f",{ws}".join(row(cols) for _ in range(rows)) + f"{ws}]"
    if kind == "1x2x2":
        return "[[" + ",".join(row(2) for _ in range(2)) + "]]"
    if kind == "ragged":
        return "[" + row(3) + "," + row(1) + "]"
    if kind == "scalar":
        return draw(num)
    if kind == "deep":
        depth = draw(st.sampled_from([9, 100_000]))
        return "[" * depth + ",".join(draw(st.lists(num, min_size=4, max_size=4))) + "]" * depth
    if kind == "deep_in":  # nesting that starts shallow and goes deep inside
        return "[[1,2],[3," + "[" * 100_000 + "4" + "]" * 100_000 + "]]"
    return row(SIZE - 1 if kind == "short" else SIZE + 1)


@st.composite
def _json_record(draw) -> bytes:
    ws = draw(_WS)
    members = [('"id"', draw(_ID)), ('"input"', draw(_json_input()))]
    extras = draw(
        st.lists(
            st.sampled_from(
                [
                    ('"id"', '"dup"'),
                    ('"id"', "2"),
                    ('"input"', "[1,2,3,4]"),
                    ('"\\u0069d"', '"esc"'),
                    ('"x"', "1"),
                    ('"x"', '{"k": 1, "k": 2}'),
                    ('"x"', '{"id": 1, "id": 2}'),
                    ('"x"', '"\\"id\\""'),
                    ("drop", ""),
                ]
            ),
            max_size=2,
        )
    )
    for key, value in extras:
        if key != "drop":
            members.append((key, value))
        elif members:
            members.pop(draw(st.integers(0, len(members) - 1)))
    members = draw(st.permutations(members))
    text = "{" + ws + f",{ws}".join(f"{k}{ws}:{ws}{v}" for k, v in members) + ws + "}"
    data = text.encode("utf-8", "surrogatepass")
    damage = draw(st.sampled_from(["none"] * 6 + ["truncate", "byte", "trailing", "bom"]))
    if damage == "truncate":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif damage == "byte":
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    elif damage == "trailing":
        data += draw(st.sampled_from([b" x", b"}", b"\x00", b"\n\n", b",{}"]))
    elif damage == "bom":
        data = b"\xef\xbb\xbf" + data
    return data


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(
            _json_record(),
            st.sampled_from(
                [
                    None,
                    [],
                    [("content-type", b"application/json")],
                    [("Content-Type", b"text/plain")],
                    [("content-type", b"application/json; charset=utf-8"), ("id", b"h")],
                ]
            ),
        ),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from([64, 1 << 20]),
)
def test_json_batch_decoder_decides_like_the_reference(records, max_bytes):
    """Generated JSON records: the msgspec path accepts exactly what the reference accepts,
    with the same ids and bit-identical values; every refusal has the reference's reason."""
    assert_batch_decodes_like_records(records, max_bytes)


def test_missing_dtype_header_says_it_is_missing():
    """Issue 29: not ``dtype header '' is not one of [...]``."""
    headers = [("content-type", TENSOR_TYPE.encode()), ("id", b"t")]
    with pytest.raises(BadRecord) as exc:
        decode_model_input(b"\x00\x00\x80\x3f" * 4, headers, size=SIZE)
    assert exc.value.reason == "bad_dtype"
    assert "no dtype header" in exc.value.detail and "''" not in exc.value.detail
