"""The native box kernel decides exactly like the numpy path: same memberships, and distances
bit-identical to the per-dimension float32 accumulation (within 1e-5 of the padded path),
with each of its lane loops (the compiler's baseline vectors and, where the CPU has them,
AVX2 and AVX-512F)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boxwatch.agent import boxes as boxes_module
from boxwatch.agent.boxes import UNCERTAIN, BoxSet, box_kernel, set_box_kernel
from boxwatch.agent.config import load_agent_config
from boxwatch.agent.errors import ConfigError

native = pytest.mark.skipif(
    boxes_module._NATIVE is None,
    reason="the native box kernel is not built (no C compiler at install time)",
)


def _lane_loops() -> list[str]:
    """The kernel's lane loops this CPU runs (none without the kernel)."""
    k = boxes_module._NATIVE
    if k is None:
        return []
    previous = k.simd()
    found = ["baseline"]
    for name in ("avx2", "avx512"):
        try:
            k.set_simd(name)
            found.append(name)
        except ValueError:
            pass
    k.set_simd(previous)
    return found


@pytest.fixture(params=_lane_loops() or [None])
def lane_loop(request: pytest.FixtureRequest):
    """Each lane loop of the native kernel in turn (the one in use restored after)."""
    k = boxes_module._NATIVE
    if k is None:
        pytest.skip("the native box kernel is not built (no C compiler at install time)")
    previous = k.set_simd(request.param)
    yield request.param
    k.set_simd(previous)


def test_kernel_is_built_where_a_compiler_is():
    """A development install with a C compiler must build the kernel (it is optional only
    where none exists), so a broken build cannot silently fall back to numpy in CI."""
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here: the numpy path is expected")
    assert boxes_module._NATIVE is not None, "agent/_boxkernel.c was not built: run `make venv`"


def test_set_box_kernel_names_the_choices():
    with pytest.raises(ConfigError, match="expected auto or one of"):
        set_box_kernel("fortran")
    before = box_kernel()
    try:
        assert set_box_kernel("numpy") == before
        assert box_kernel() == "numpy"
        set_box_kernel("auto")
        assert box_kernel() == ("native" if boxes_module._NATIVE is not None else "numpy")
    finally:
        set_box_kernel(before)


@native
def test_set_simd_names_the_lane_loops():
    """The widest lane loops the CPU has (AVX-512F, else AVX2) are chosen at import; set_simd
    switches and refuses names it does not know (or loops the CPU lacks)."""
    k = boxes_module._NATIVE
    assert k.simd() == _lane_loops()[-1]
    with pytest.raises(ValueError, match="expected 'baseline'"):
        k.set_simd("sse9")
    with pytest.raises(TypeError):
        k.set_simd(2)
    before = k.set_simd("baseline")
    try:
        assert k.simd() == "baseline"
    finally:
        k.set_simd(before)


def test_agent_setting_chooses_the_kernel():
    base = {"artifact": "a.bwa", "public_keys": ["k.pub"]}
    assert load_agent_config(None, environ={}, overrides=base)["box_kernel"] == "auto"
    cfg = load_agent_config(None, environ={"BOXWATCH_BOX_KERNEL": "numpy"}, overrides=base)
    assert cfg["box_kernel"] == "numpy"
    with pytest.raises(ConfigError, match="box_kernel.*must be auto, native or numpy"):
        load_agent_config(None, environ={"BOXWATCH_BOX_KERNEL": "fast"}, overrides=base)


@st.composite
def problems(draw):
    """Random boxes (some classes empty, some sides of zero width) and inputs, a share of
    them on box corners and faces, with NaN and infinite features sprinkled in; in some,
    features that every box holds at 0 and most inputs are 0 on (a layer after a ReLU: the
    kernel skips them)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    d = draw(st.integers(1, 40))
    n_classes = draw(st.integers(1, 5))
    dead = rng.random(d) < (0.6 if draw(st.booleans()) else 0.0)
    per_class = []
    for _ in range(n_classes):
        k = draw(st.integers(0, 20))  # more than one block of the kernel's LANES boxes
        centre = rng.normal(size=(k, d)).astype(np.float32)
        half = np.abs(rng.normal(scale=0.7, size=(k, d))).astype(np.float32)
        half[rng.random((k, d)) < 0.1] = 0.0
        lo, hi = centre - half, centre + half
        lo[:, dead], hi[:, dead] = np.minimum(lo[:, dead], 0), np.maximum(hi[:, dead], 0)
        per_class.append((lo, hi))
    bs = BoxSet.from_boxes(per_class, d)
    n = draw(st.integers(0, 300))
    x = (rng.normal(scale=draw(st.sampled_from([0.1, 0.5, 2.0])), size=(n, d))).astype(np.float32)
    y = rng.integers(0, n_classes, size=n)
    if len(bs.lo) and n:
        pick = rng.integers(0, len(bs.lo), size=n)
        on_face = rng.random(n) < 0.4
        corner = np.where(rng.random((n, d)) < 0.5, bs.lo[pick], bs.hi[pick])
        x[on_face] = corner[on_face]
        y[on_face] = np.searchsorted(bs.offsets, pick[on_face], side="right") - 1
    x[:, dead] *= rng.random((n, int(dead.sum()))) < 0.1  # mostly 0, at times -0.0
    special = rng.random((n, d)) < 0.01
    x[special] = rng.choice(
        np.array([np.nan, np.inf, -np.inf], np.float32), size=int(special.sum())
    )
    return bs, x, y


def _box_work(bs: BoxSet, x: np.ndarray, y: np.ndarray, bad: BoxSet) -> list[np.ndarray]:
    """Every box test and distance of the set, the fused score's and a layer pass's."""
    nearest = boxes_module.complement_classes(bs, 1)[:, 0]
    nearest[bs.counts() == 0] = -1
    other = boxes_module.complement_boxes(bs, 2)
    where = np.arange(len(x)) % 2 == 0
    return [
        bs.contains(x, y),
        bs.contains(x, y, where),
        *bs.distance_and_contains(x, y),
        bs.distance(x, y),
        *bs.fused_distances(x, y, other),
        *bs.fused_distances(x, y, bs, nearest),
        *bs.assess_layer(x, y, bad, bs, nearest),
        *bs.assess_layer(x, y, bad, every_row=True, distances=False)[:3],
    ]


@native
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(problems())
def test_native_equals_numpy(lane_loop, problem):
    bs, x, y = problem
    bad = BoxSet(bs.lo[::-1] + 0.25, bs.hi[::-1] + 0.25, bs.offsets[-1] - bs.offsets[::-1])
    previous = set_box_kernel("native")
    try:
        native = _box_work(bs, x, y, bad)
        set_box_kernel("numpy")
        dist, inside = native[2], native[0]
        padded, inside_np = bs.distance_and_contains(x, y)
        np.testing.assert_array_equal(inside_np, inside)
        np.testing.assert_allclose(dist, padded, rtol=1e-5, atol=1e-6)
        # The per-dimension numpy path accumulates exactly as the kernel does: bit-identical.
        saved = (boxes_module._PADDED_ELEMENTS, boxes_module._ROWWISE_MIN_DISTANCE)
        boxes_module._PADDED_ELEMENTS, boxes_module._ROWWISE_MIN_DISTANCE = 0, 0
        try:
            numpy_path = _box_work(bs, x, y, bad)
        finally:
            boxes_module._PADDED_ELEMENTS, boxes_module._ROWWISE_MIN_DISTANCE = saved
    finally:
        set_box_kernel(previous)
    assert len(native) == len(numpy_path)
    for got, want in zip(native, numpy_path, strict=True):
        np.testing.assert_array_equal(got, want)


@native
@pytest.mark.parametrize("d", [1, 3, 16, 17, 130])
def test_blocks_of_boxes_give_the_one_box_loop_distances(monkeypatch, lane_loop, d):
    """The kernel takes LANES boxes at a time from a transposed copy, GROUP blocks side by
    side: class sizes around multiples of LANES (0, 1, LANES - 1, LANES, LANES + 1,
    4 LANES + 1, 5 LANES + 3), feature counts around the early-exit block, features every box
    holds at 0 (skipped where the input is 0), NaN and infinite rows, inputs on faces and a
    gap whose square underflows (distance 0, yet outside) all give the per-dimension numpy
    path's membership and distances bit for bit, also for the fused score's other-class
    distances and a layer's bad boxes and verdicts."""
    lanes = boxes_module._NATIVE.LANES
    rng = np.random.default_rng(d)
    sizes = [0, 1, lanes - 1, lanes, lanes + 1, 4 * lanes + 1, 5 * lanes + 3]
    dead = np.arange(d) % 3 == 1
    per_class = []
    for k in sizes:
        centre = rng.normal(size=(k, d)).astype(np.float32)
        half = np.abs(rng.normal(scale=0.4, size=(k, d))).astype(np.float32)
        lo, hi = centre - half, centre + half
        lo[:, dead], hi[:, dead] = np.minimum(lo[:, dead], 0), np.maximum(hi[:, dead], 0)
        per_class.append((lo, hi))
    per_class[1][0][0, 0] = per_class[1][1][0, 0] = 0.0  # a flat side at 0
    bs = BoxSet.from_boxes(per_class, d)
    bad = BoxSet.from_boxes([(lo[:1], hi[:1]) for lo, hi in per_class], d)  # first good boxes
    n = 600
    y = rng.integers(0, len(sizes), size=n)
    x = rng.normal(scale=1.2, size=(n, d)).astype(np.float32)
    pick = rng.integers(0, len(bs.lo), size=n)
    on_face = rng.random(n) < 0.3
    corner = np.where(rng.random((n, d)) < 0.5, bs.lo[pick], bs.hi[pick])
    x[on_face] = corner[on_face]
    y[on_face] = np.searchsorted(bs.offsets, pick[on_face], side="right") - 1
    x[: n // 2, dead] = 0.0
    x[:5], y[:5] = bs.lo[bs.offsets[1]], 1  # inside the flat box ...
    x[:5, 0] = np.float32(-1e-30)  # ... but for a gap whose square is 0 in float32
    x[5:10, -1] = np.nan
    x[10:15, 0] = np.inf
    x[15:20] = -np.inf
    before = set_box_kernel("native")
    try:
        native = _box_work(bs, x, y, bad)
        set_box_kernel("numpy")
        monkeypatch.setattr(boxes_module, "_PADDED_ELEMENTS", 0)
        monkeypatch.setattr(boxes_module, "_ROWWISE_MIN_DISTANCE", 0)
        numpy_path = _box_work(bs, x, y, bad)
    finally:
        set_box_kernel(before)
    for got, want in zip(native, numpy_path, strict=True):
        np.testing.assert_array_equal(got, want)
    nearest = boxes_module.complement_classes(bs, 1)[:, 0]
    nearest[bs.counts() == 0] = -1
    copied = bs.fused_distances(x, y, boxes_module.complement_boxes(bs, 1))
    for got, want in zip(native[8:11], copied, strict=True):
        np.testing.assert_array_equal(got, want)
    inside, dist = native[0], native[2]
    assert not inside[:5].any() and (dist[:5] == 0).all()  # outside, at distance 0
    np.testing.assert_array_equal(native[1], inside & (np.arange(n) % 2 == 0))
    assert np.isnan(dist[5:10][y[5:10] > 0]).all() and np.isinf(dist[y == 0]).all()
    assert inside[20:].any() and (dist[20:] > 0).any()
    verdicts, in_bad = native[11], native[13]
    assert (verdicts == UNCERTAIN).any() and (in_bad <= inside).all()


@native
@pytest.mark.parametrize("d", [0, 1, 3, 4, 5, 8, 49, 130])
def test_l2_normalisation_is_the_same_on_every_path(monkeypatch, lane_loop, d):
    """``normalize_features(x, "l2")``: the kernel's rows (8 at a time with AVX2, then one at
    a time) give the numpy path's bits, float64 sums in feature order, on batches around the
    block of 8 rows and on rows of 0, NaN, inf, float32's largest and subnormal values,
    magnitudes from 1e-13 to 1e13; and a row's result depends neither on its batch nor on
    the numpy path's blocks of rows."""
    rng = np.random.default_rng(d)
    n = 27
    x = rng.normal(size=(n, d)) * np.exp(rng.uniform(-30, 30, size=(n, 1)))
    x = x.astype(np.float32)
    if d:
        x[0] = 0.0
        x[1, 0] = np.nan
        x[2, -1] = np.inf
        x[3] = np.finfo(np.float32).max
        x[4] = np.float32(1e-45)
    before = set_box_kernel("native")
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            native = [boxes_module.normalize_features(x[:k], "l2") for k in (n, 9, 8, 1)]
            set_box_kernel("numpy")
            numpy_path = boxes_module.normalize_features(x, "l2")
            monkeypatch.setattr(boxes_module, "_OUTPUT_BLOCK", 5 * max(d, 1))  # 5-row blocks
            numpy_blocks = boxes_module.normalize_features(x, "l2")
    finally:
        set_box_kernel(before)
    np.testing.assert_array_equal(numpy_blocks, numpy_path)
    assert native[0].dtype == np.float32 and native[0].shape == (n, d)
    np.testing.assert_array_equal(native[0], numpy_path)
    for part in native[1:]:  # the same rows in smaller batches: the same bits
        np.testing.assert_array_equal(part, numpy_path[: len(part)])
    if d:
        assert (native[0][0] == 0).all() and np.isnan(native[0][1]).all()
        np.testing.assert_allclose(np.linalg.norm(native[0][5:], axis=1), 1.0, rtol=1e-6)


@native
def test_native_kernel_checks_its_buffers():
    """Called directly with inconsistent buffers, the kernel refuses instead of reading past them."""
    k = boxes_module._NATIVE
    lo = np.zeros((2, 3), np.float32)
    hi = np.ones((2, 3), np.float32)
    offsets = np.array([0, 1, 2], np.int64)
    x = np.zeros((4, 3), np.float32)
    y = np.zeros(4, np.int64)
    out = np.empty(4, np.uint8)
    k.contains(x, y, lo, hi, offsets, 3, out)
    assert out.tolist() == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="disagree"):
        k.contains(x[:3], y, lo, hi, offsets, 3, out)
    with pytest.raises(ValueError, match=r"must lie in \[0, 2\); input 2 has 2"):
        k.contains(x, np.array([0, 1, 2, 0], np.int64), lo, hi, offsets, 3, out)
    with pytest.raises(ValueError, match="offsets"):
        k.contains(x, y, lo, hi, np.array([0, 3, 2], np.int64), 3, out)
    with pytest.raises(ValueError, match="out must hold 4 bytes"):
        k.contains(x, y, lo, hi, offsets, 3, np.empty(3, np.uint8))
    with pytest.raises(ValueError, match="writable"):
        k.contains(x, y, lo, hi, offsets, 3, np.frombuffer(b"\0" * 4, np.uint8))
    with pytest.raises(ValueError, match="C-contiguous"):
        k.contains(np.zeros((3, 4), np.float32).T, y, lo, hi, offsets, 3, out)
    where = np.array([1, 0, 1, 0], np.uint8)
    k.contains(x, y, lo, hi, offsets, 3, out, where)
    assert out.tolist() == [1, 0, 1, 0]
    with pytest.raises(ValueError, match="where must hold 4 bytes"):
        k.contains(x, y, lo, hi, offsets, 3, out, where[:3])
    good = BoxSet(lo, hi, offsets)._lanes
    tlo, thi, cap = good[3:]
    assert tlo.shape == (2 * 3 + k.LANES,)  # every box once, then LANES floats closing it
    assert cap.shape == (2, 2, 3)  # per class: the largest lo, the smallest hi
    inside, d_own, d_other = np.empty(4, np.uint8), np.empty(4), np.empty(4)
    in_bad, verdict = np.empty(4, np.uint8), np.empty(4, np.int8)

    def layer_pass(*, x=x + 2, good=good, bad=None, other=None, ocls=None, **outs):
        kw = dict(inside=inside, in_bad=None, verdict=None, d_own=d_own, d_other=None) | outs
        k.layer_pass(x, y, 3, good, bad, other, ocls, False, *kw.values())

    layer_pass()
    np.testing.assert_allclose(d_own, np.sqrt(3.0))
    assert not inside.any()
    with pytest.raises(ValueError, match="d_own must hold 32 bytes"):
        layer_pass(d_own=np.empty(3))
    with pytest.raises(ValueError, match="d_own: expected float64 values"):
        layer_pass(d_own=np.empty(8, np.float32))
    with pytest.raises(ValueError, match="tlo and thi must both"):
        layer_pass(good=(*good[:3], tlo[:-1], thi[:-1], cap))
    with pytest.raises(ValueError, match="tlo and thi must both"):
        layer_pass(good=(*good[:3], tlo, thi[:-2].copy(), cap))
    with pytest.raises(ValueError, match="cap must hold"):
        layer_pass(good=(*good[:5], cap[:1]))
    with pytest.raises(TypeError, match="good must be a tuple of 6"):
        layer_pass(good=good[:3])
    with pytest.raises(ValueError, match="in_bad goes with bad boxes"):
        layer_pass(in_bad=in_bad)
    with pytest.raises(ValueError, match="d_other needs"):
        layer_pass(d_other=d_other)
    layer_pass(other=good, d_other=d_other)
    np.testing.assert_allclose(d_other, np.sqrt(3.0))
    layer_pass(other=good, d_other=d_other, ocls=np.array([1, -1], np.int64))  # 0's: class 1
    np.testing.assert_allclose(d_other, np.sqrt(3.0))
    with pytest.raises(ValueError, match="one int64 per class"):
        layer_pass(other=good, d_other=d_other, ocls=np.array([1], np.int64))
    with pytest.raises(ValueError, match="classes of the other boxes or -1"):
        layer_pass(other=good, d_other=d_other, ocls=np.array([2, 0], np.int64))
    with pytest.raises(ValueError, match="same classes"):
        layer_pass(bad=(lo[:1], hi[:1], offsets[:2]), in_bad=in_bad)
    layer_pass(x=x, bad=(lo, hi, offsets), in_bad=in_bad, verdict=verdict)  # inside both
    assert inside.all() and in_bad.all() and (verdict == UNCERTAIN).all()
    assert (d_own == 0).all()
    rows = np.arange(12, dtype=np.float32).reshape(4, 3)
    unit = np.empty_like(rows)
    k.l2_rows(rows, 3, unit)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="same rows of d float32"):
        k.l2_rows(rows, 5, unit)
    with pytest.raises(ValueError, match="same rows of d float32"):
        k.l2_rows(rows, 3, unit[:3])
    with pytest.raises(ValueError, match="writable"):
        k.l2_rows(rows, 3, np.frombuffer(b"\0" * 48, np.float32))
    with pytest.raises(ValueError, match="d must be >= 0"):
        k.l2_rows(rows, -1, unit)


def test_build_info_names_the_kernel_in_use():
    from prometheus_client import CollectorRegistry, generate_latest

    from boxwatch.agent.metrics import AgentMetrics

    previous = set_box_kernel("numpy")
    try:
        text = generate_latest(AgentMetrics(CollectorRegistry()).registry).decode()
    finally:
        set_box_kernel(previous)
    assert 'boxwatch_agent_build_info{box_kernel="numpy",' in text


@native
def test_score_and_reason_steps_check_their_buffers():
    """The kernel's steps after the box tests refuse arrays of the wrong type or size with
    one clear error, never reading past a buffer or misreading its values."""
    k = boxes_module._NATIVE
    n = 4
    f64, out = np.zeros(n), np.empty(n)
    top, second, finite = np.empty(n), np.empty(n), np.empty(n, np.uint8)
    k.top_two(np.zeros((n, 3)), 3, top, second, finite)
    assert finite.all() and (second == 0).all()
    with pytest.raises(ValueError, match="z: expected float64"):
        k.top_two(np.zeros((n, 3), np.float32), 3, top, second, finite)
    with pytest.raises(ValueError, match="rows of c float64"):
        k.top_two(np.zeros((n, 3)), 5, top, second, finite)
    with pytest.raises(ValueError, match="top must hold 32 bytes"):
        k.top_two(np.zeros((n, 3)), 3, np.empty(3), second, finite)

    scale, center, repeat, terms = np.ones(2), np.zeros(1), np.ones(1, np.int64), np.empty((2, n))
    k.fused_score((f64,), (), (), (f64,), scale, center, repeat, 0.0, (), terms, out, None)
    assert (out == 0).all()
    with pytest.raises(ValueError, match="dist must hold float64 arrays of 4 values"):
        k.fused_score((f64[:3],), (), (), (f64,), scale, center, repeat, 0.0, (), terms, out, None)
    with pytest.raises(ValueError, match="extra: expected float64"):
        k.fused_score(
            (f64,),
            (),
            (),
            (f64.astype(np.float32),),
            scale,
            center,
            repeat,
            0.0,
            (),
            terms,
            out,
            None,
        )
    with pytest.raises(ValueError, match="own, other and contrast must be as many"):
        k.fused_score(
            (f64,), (f64,), (), (f64,), np.ones(3), center, repeat, 0.0, (), terms, out, None
        )
    with pytest.raises(ValueError, match="scale must hold one float64 per term"):
        k.fused_score((f64,), (), (), (f64,), np.ones(3), center, repeat, 0.0, (), terms, out, None)
    with pytest.raises(ValueError, match="repeat must lie in 1 .. 64"):
        k.fused_score((f64,), (), (), (f64,), scale, center, repeat * 0, 0.0, (), terms, out, None)
    with pytest.raises(ValueError, match=r"terms must be \(n_terms, n\)"):
        k.fused_score((f64,), (), (), (f64,), scale, center, repeat, 0.0, (), terms[:1], out, None)
    with pytest.raises(TypeError, match="dist must be a tuple of arrays"):
        k.fused_score([f64], (), (), (f64,), scale, center, repeat, 0.0, (), terms, out, None)

    y = np.array([0, 1, 2, 0], np.int64)
    k.rmd_rows(np.zeros((n, 5)), 2, y, f64, np.arange(3.0), out)
    assert out.tolist() == [0.0, 1.0, 2.0, 0.0]
    with pytest.raises(ValueError, match=r"must lie in \[0, 3\); input 2 has 3"):
        k.rmd_rows(np.zeros((n, 5)), 2, y + (y == 2), f64, np.arange(3.0), out)
    with pytest.raises(ValueError, match=r"product must be \(n, rank \+ n_classes\)"):
        k.rmd_rows(np.zeros((n, 4)), 2, y, f64, np.arange(3.0), out)

    a = [np.empty(n) for _ in range(4)]
    k.error_args(f64 + 0.5, None, f64 + np.nan, (f64 + np.inf,), 7.0, *a[:3], None, a[3])
    assert a[2].tolist() == [7.0] * n and a[3].tolist() == [1.0] * n
    with pytest.raises(ValueError, match="a3 with gap"):
        k.error_args(f64, None, f64, (), 7.0, *a, out)
    with pytest.raises(ValueError, match="contrast must hold float64 arrays of 4 values"):
        k.error_args(f64, None, f64, (f64[:2],), 7.0, *a[:3], None, a[3])
    with pytest.raises(ValueError, match="one value per column"):
        k.standardize((f64, f64), np.zeros(3), np.ones(3), np.empty((n, 2)))
    with pytest.raises(ValueError, match=r"must lie in \[0, 2\); input 1 has 2"):
        k.logit_tail(f64, 0.0, np.zeros(2), np.array([0, 2, 0, 1], np.int64), out)

    codes, layer, nearest = np.empty(n, np.int8), np.empty(n, np.int16), np.empty(n, np.int64)
    reason_args = [
        np.zeros((2, n)),
        np.arange(n, dtype=np.int64),
        np.full(n, 2, np.int8),
        y,
        np.ones(2),
        np.zeros(2, np.int8),
        np.zeros(2, np.int16),
        np.zeros(1, np.int16),
        None,
        np.zeros((1, 3), np.int64),
        1,
        0,
        0,
        codes,
        layer,
        nearest,
    ]
    k.reasons_rows(*reason_args)
    assert (layer == 0).all() and (nearest == 0).all()
    with pytest.raises(ValueError, match="out of range"):
        k.reasons_rows(*reason_args[:1], np.array([0, n], np.int64), *reason_args[2:])
    with pytest.raises(ValueError, match="nearest .n_con, n_classes. int64"):
        k.reasons_rows(*reason_args[:10], 2, *reason_args[11:])
    with pytest.raises(ValueError, match=r"terms must be \(n_terms, n\) float64"):
        k.reasons_rows(np.zeros((3, n)), *reason_args[1:])
