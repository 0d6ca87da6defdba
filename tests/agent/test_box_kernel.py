"""The native box kernel decides exactly like the numpy path: same memberships, and distances
bit-identical to the per-dimension float32 accumulation (within 1e-5 of the padded path)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boxwatch.agent import boxes as boxes_module
from boxwatch.agent.boxes import BoxSet, box_kernel, set_box_kernel
from boxwatch.agent.config import load_agent_config
from boxwatch.agent.errors import ConfigError

native = pytest.mark.skipif(
    boxes_module._NATIVE is None,
    reason="the native box kernel is not built (no C compiler at install time)",
)


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
    them on box corners and faces, with NaN and infinite features sprinkled in."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    d = draw(st.integers(1, 40))
    n_classes = draw(st.integers(1, 5))
    per_class = []
    for _ in range(n_classes):
        k = draw(st.integers(0, 20))  # more than one block of the kernel's LANES boxes
        centre = rng.normal(size=(k, d)).astype(np.float32)
        half = np.abs(rng.normal(scale=0.7, size=(k, d))).astype(np.float32)
        half[rng.random((k, d)) < 0.1] = 0.0
        per_class.append((centre - half, centre + half))
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
    special = rng.random((n, d)) < 0.01
    x[special] = rng.choice(
        np.array([np.nan, np.inf, -np.inf], np.float32), size=int(special.sum())
    )
    return bs, x, y


@native
@settings(max_examples=200, deadline=None)
@given(problems())
def test_native_equals_numpy(problem):
    bs, x, y = problem
    previous = set_box_kernel("native")
    try:
        inside = bs.contains(x, y)
        dist, inside2 = bs.distance_and_contains(x, y)
        dist_only = bs.distance(x, y)
        set_box_kernel("numpy")
        np.testing.assert_array_equal(inside, bs.contains(x, y))
        np.testing.assert_array_equal(inside2, inside)
        np.testing.assert_array_equal(dist_only, dist)
        padded, inside_np = bs.distance_and_contains(x, y)
        np.testing.assert_array_equal(inside_np, inside)
        np.testing.assert_allclose(dist, padded, rtol=1e-5, atol=1e-6)
        # The per-dimension numpy path accumulates exactly as the kernel does: bit-identical.
        saved = (boxes_module._PADDED_ELEMENTS, boxes_module._ROWWISE_MIN_DISTANCE)
        boxes_module._PADDED_ELEMENTS, boxes_module._ROWWISE_MIN_DISTANCE = 0, 0
        try:
            np.testing.assert_array_equal(bs.distance(x, y), dist)
        finally:
            boxes_module._PADDED_ELEMENTS, boxes_module._ROWWISE_MIN_DISTANCE = saved
    finally:
        set_box_kernel(previous)


@native
@pytest.mark.parametrize("d", [1, 3, 16, 17, 130])
def test_blocks_of_boxes_give_the_one_box_loop_distances(monkeypatch, d):
    """The kernel takes LANES boxes at a time from a transposed copy: class sizes around
    multiples of LANES (0, 1, LANES - 1, LANES, LANES + 1, 5 LANES + 3), feature counts around
    the early-exit block, NaN and infinite rows, inputs on faces and a gap whose square
    underflows (distance 0, yet outside) all give the per-dimension numpy path's membership
    and distances bit for bit, also for the fused score's other-class distances."""
    lanes = boxes_module._NATIVE.LANES
    rng = np.random.default_rng(d)
    sizes = [0, 1, lanes - 1, lanes, lanes + 1, 5 * lanes + 3]
    per_class = []
    for k in sizes:
        centre = rng.normal(size=(k, d)).astype(np.float32)
        half = np.abs(rng.normal(scale=0.4, size=(k, d))).astype(np.float32)
        per_class.append((centre - half, centre + half))
    per_class[1][0][0, 0] = per_class[1][1][0, 0] = 0.0  # a flat side at 0
    bs = BoxSet.from_boxes(per_class, d)
    other = boxes_module.complement_boxes(bs, 2)
    # One neighbour class, read in place (no copy of its boxes): class 0 has none.
    nearest = boxes_module.complement_classes(bs, 1)[:, 0]
    nearest[bs.counts() == 0] = -1
    n = 600
    y = rng.integers(0, len(sizes), size=n)
    x = rng.normal(scale=1.2, size=(n, d)).astype(np.float32)
    pick = rng.integers(0, len(bs.lo), size=n)
    on_face = rng.random(n) < 0.3
    corner = np.where(rng.random((n, d)) < 0.5, bs.lo[pick], bs.hi[pick])
    x[on_face] = corner[on_face]
    y[on_face] = np.searchsorted(bs.offsets, pick[on_face], side="right") - 1
    x[:5], y[:5] = bs.lo[bs.offsets[1]], 1  # inside the flat box ...
    x[:5, 0] = np.float32(-1e-30)  # ... but for a gap whose square is 0 in float32
    x[5:10, -1] = np.nan
    x[10:15, 0] = np.inf
    x[15:20] = -np.inf
    where = rng.random(n) < 0.5
    before = set_box_kernel("native")
    try:
        native = (
            bs.contains(x, y),
            bs.contains(x, y, where),
            *bs.distance_and_contains(x, y),
            *bs.fused_distances(x, y, other),
            *bs.fused_distances(x, y, bs, nearest),
        )
        set_box_kernel("numpy")
        monkeypatch.setattr(boxes_module, "_PADDED_ELEMENTS", 0)
        monkeypatch.setattr(boxes_module, "_ROWWISE_MIN_DISTANCE", 0)
        numpy_path = (
            bs.contains(x, y),
            bs.contains(x, y, where),
            *bs.distance_and_contains(x, y),
            *bs.fused_distances(x, y, other),
            *bs.fused_distances(x, y, bs, nearest),
        )
    finally:
        set_box_kernel(before)
    for got, want in zip(native, numpy_path, strict=True):
        np.testing.assert_array_equal(got, want)
    copied = bs.fused_distances(x, y, boxes_module.complement_boxes(bs, 1))
    for got, want in zip(native[-3:], copied, strict=True):
        np.testing.assert_array_equal(got, want)
    inside, dist = native[0], native[2]
    assert not inside[:5].any() and (dist[:5] == 0).all()  # outside, at distance 0
    np.testing.assert_array_equal(native[1], inside & where)
    assert np.isnan(dist[5:10][y[5:10] > 0]).all() and np.isinf(dist[y == 0]).all()
    assert inside[20:].any() and (dist[20:] > 0).any()


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
    tlo, thi = BoxSet(lo, hi, offsets)._lanes
    assert tlo.shape == (2 * 3 + k.LANES,)  # every box once, then LANES floats closing it
    dist = np.empty(4, np.float64)
    with pytest.raises(ValueError, match="dist must hold 32 bytes"):
        k.distance_contains(x, y, lo, hi, offsets, 3, out, np.empty(4, np.float32), tlo, thi)
    with pytest.raises(ValueError, match="tlo and thi must both"):
        k.distance_contains(x, y, lo, hi, offsets, 3, out, dist, tlo[:-1], thi[:-1])
    with pytest.raises(ValueError, match="tlo and thi must both"):
        k.distance_contains(x, y, lo, hi, offsets, 3, out, dist, tlo, thi[:-2].copy())
    k.distance_contains(x + 2, y, lo, hi, offsets, 3, out, dist, tlo, thi)
    np.testing.assert_allclose(dist, np.sqrt(3.0))
    assert not out.any()
    inside, d_own, d_other = np.empty(4, np.uint8), np.empty(4), np.empty(4)
    with pytest.raises(ValueError, match="tlo and thi must both"):
        k.fused_distances(
            x,
            y,
            lo,
            hi,
            offsets,
            3,
            lo,
            hi,
            offsets,
            inside,
            d_own,
            d_other,
            tlo,
            thi,
            tlo,
            thi[1:],
        )
    k.fused_distances(
        x + 2, y, lo, hi, offsets, 3, lo, hi, offsets, inside, d_own, d_other, tlo, thi, tlo, thi
    )
    np.testing.assert_allclose(d_own, np.sqrt(3.0))
    np.testing.assert_allclose(d_other, np.sqrt(3.0))
    args = (
        x + 2,
        y,
        lo,
        hi,
        offsets,
        3,
        lo,
        hi,
        offsets,
        inside,
        d_own,
        d_other,
        tlo,
        thi,
        tlo,
        thi,
    )
    k.fused_distances(*args, np.array([1, -1], np.int64))  # class 0's neighbour: class 1
    np.testing.assert_allclose(d_other, np.sqrt(3.0))
    with pytest.raises(ValueError, match="one int64 per class"):
        k.fused_distances(*args, np.array([1], np.int64))
    with pytest.raises(ValueError, match="classes of the other boxes or -1"):
        k.fused_distances(*args, np.array([2, 0], np.int64))


def test_build_info_names_the_kernel_in_use():
    from prometheus_client import CollectorRegistry, generate_latest

    from boxwatch.agent.metrics import AgentMetrics

    previous = set_box_kernel("numpy")
    try:
        text = generate_latest(AgentMetrics(CollectorRegistry()).registry).decode()
    finally:
        set_box_kernel(previous)
    assert 'boxwatch_agent_build_info{box_kernel="numpy",' in text
