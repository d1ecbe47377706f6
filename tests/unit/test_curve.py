"""The Hilbert index: C kernel against the independent reference `hilbertcurve`."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hilbertcurve.hilbertcurve import HilbertCurve
from hypothesis import given, settings
from hypothesis import strategies as st

import hilbert_c as hk
from hilbert_c import kernel

_REF: dict[int, HilbertCurve] = {}


def ref(bits: int) -> HilbertCurve:
    if bits not in _REF:
        _REF[bits] = HilbertCurve(p=bits, n=2)
    return _REF[bits]


def test_order_one_convention() -> None:
    assert [hk.encode(x, y, 1) for x, y in [(0, 0), (0, 1), (1, 1), (1, 0)]] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("x", "y", "h"),
    [(0, 2**25, 1125899906842624), (2**26 - 1, 0, 4503599627370495),
     (12345678, 23456789, 977884209722189)],
)
def test_known_values_at_26_bits(x: int, y: int, h: int) -> None:
    assert hk.encode(x, y) == h
    assert hk.decode(h) == (x, y)
    assert kernel.axes_to_line_2D_26b(x, y) == h
    assert kernel.line_to_axes_2D_26b(h) == (x, y)


@st.composite
def cells(draw: st.DrawFn) -> tuple[int, int, int]:
    bits = draw(st.integers(1, 31))
    side = (1 << bits) - 1
    return draw(st.integers(0, side)), draw(st.integers(0, side)), bits


@settings(max_examples=2000)
@given(cells())
def test_encode_equals_reference(cell: tuple[int, int, int]) -> None:
    x, y, bits = cell
    h = hk.encode(x, y, bits)
    assert h == ref(bits).distance_from_point([x, y])
    assert hk.decode(h, bits) == (x, y)


@settings(max_examples=1000)
@given(st.integers(1, 31).flatmap(lambda b: st.tuples(st.just(b), st.integers(0, 4**b - 1))))
def test_decode_equals_reference(case: tuple[int, int]) -> None:
    bits, h = case
    assert list(hk.decode(h, bits)) == list(ref(bits).point_from_distance(h))


@pytest.mark.parametrize("bits", range(1, 7))
def test_small_orders_exhaustively(bits: int) -> None:
    side = 1 << bits
    xs, ys = np.meshgrid(np.arange(side, dtype=np.uint32), np.arange(side, dtype=np.uint32))
    hs = hk.encode_many(xs.ravel(), ys.ravel(), bits)
    assert sorted(hs.tolist()) == list(range(side * side))  # a bijection onto the curve
    order = np.argsort(hs)
    px, py = xs.ravel()[order].astype(int), ys.ravel()[order].astype(int)
    steps = np.abs(np.diff(px)) + np.abs(np.diff(py))
    assert (steps == 1).all()  # consecutive indices are neighbouring cells
    assert (px[0], py[0]) == (0, 0) and (px[-1], py[-1]) == (side - 1, 0)


@settings(max_examples=200)
@given(st.integers(1, 31), st.integers(0, 300), st.randoms(use_true_random=False))
def test_batch_equals_scalar(bits: int, n: int, rnd) -> None:  # type: ignore[no-untyped-def]
    side = 1 << bits
    xs = np.array([rnd.randrange(side) for _ in range(n)], dtype=np.uint32)
    ys = np.array([rnd.randrange(side) for _ in range(n)], dtype=np.uint32)
    hs = hk.encode_many(xs, ys, bits)
    assert hs.dtype == np.uint64
    assert hs.tolist() == [hk.encode(int(x), int(y), bits) for x, y in zip(xs, ys, strict=True)]
    dx, dy = hk.decode_many(hs, bits)
    assert dx.dtype == np.uint32 and dy.dtype == np.uint32
    assert (dx == xs).all() and (dy == ys).all()


def test_batch_accepts_other_integer_dtypes_and_views() -> None:
    xs = np.arange(0, 2000, dtype=np.int64)[::2]  # non-contiguous, signed
    ys = (np.arange(1000, dtype=np.uint16) * 7) % 1024
    got = hk.encode_many(xs, ys, 11)
    assert got.tolist() == [hk.encode(int(x), int(y), 11) for x, y in zip(xs, ys, strict=True)]
    assert hk.encode_many([], [], 26).shape == (0,)
    assert hk.encode_many(np.zeros((3, 4), np.uint32), np.ones((3, 4), np.uint32), 5).shape == (3, 4)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: hk.encode(1 << 26, 0), "outside the 26-bit grid"),
        (lambda: hk.encode(-1, 0), "outside the 26-bit grid"),
        (lambda: hk.encode(0, 0, 0), "bits must be"),
        (lambda: hk.encode(0, 0, 32), "bits must be"),
        (lambda: hk.encode(2**70, 0), "encode"),
        (lambda: hk.encode(1.5, 0), "encode"),  # type: ignore[arg-type]
        (lambda: hk.decode(4**26), "outside the 26-bit curve"),
        (lambda: hk.decode(-1), "decode"),
        (lambda: hk.encode_many([1, 2, 1 << 20], [0, 0, 0], 20), r"xs\[2\] = 1048576"),
        (lambda: hk.encode_many(np.array([1, 9], np.uint32), np.array([1, 1], np.uint32), 3),
         "at index 1"),
        (lambda: hk.encode_many([1.0], [2.0], 3), "integer array"),
        (lambda: hk.encode_many([1, 2], [1], 3), "differ in shape"),
        (lambda: hk.decode_many(np.array([0, 4**5], np.uint64), 5), "at position 1"),
        (lambda: hk.decode_many([-3], 5), "outside"),
    ],
)
def test_bad_input_is_a_clear_value_error(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        call()


def test_grid_corners_and_clamping() -> None:
    top = (1 << 26) - 1
    assert hk.lonlat_to_grid(-180.0, -90.0) == (0, 0)
    assert hk.lonlat_to_grid(180.0, 90.0) == (top, top)
    assert hk.lonlat_to_grid(0.0, 0.0) == (1 << 25, 1 << 25)
    assert hk.lonlat_to_grid(-1e-12, -1e-12) == ((1 << 25) - 1, (1 << 25) - 1)
    lon, lat = hk.grid_to_lonlat(0, 0, 1)
    assert (lon, lat) == (-90.0, -45.0)  # centre of the south-west quarter


@settings(max_examples=500)
@given(st.floats(-180, 180), st.floats(-90, 90), st.integers(1, 31))
def test_grid_round_trip(lon: float, lat: float, bits: int) -> None:
    x, y = hk.lonlat_to_grid(lon, lat, bits)
    clon, clat = hk.grid_to_lonlat(x, y, bits)
    assert abs(clon - lon) <= 360.0 / (1 << bits) * 0.5 + 1e-9
    assert abs(clat - lat) <= 180.0 / (1 << bits) * 0.5 + 1e-9
    assert hk.lonlat_to_grid(clon, clat, bits) == (x, y)  # a centre maps to its own cell


def test_grid_arrays_match_scalars() -> None:
    rng = np.random.default_rng(7)
    lon = rng.uniform(-180, 180, 1000)
    lat = rng.uniform(-90, 90, 1000)
    xs, ys = hk.lonlat_to_grid(lon, lat, 22)
    assert xs.dtype == np.uint32
    assert [hk.lonlat_to_grid(float(a), float(b), 22) for a, b in zip(lon, lat, strict=True)] == list(
        zip(xs.tolist(), ys.tolist(), strict=True)
    )
    clon, clat = hk.grid_to_lonlat(xs, ys, 22)
    assert np.allclose(clon, lon, atol=360 / 2**22) and np.allclose(clat, lat, atol=180 / 2**22)


@pytest.mark.parametrize(
    ("lon", "lat", "needle"),
    [(float("nan"), 0.0, "lon=nan"), (0.0, float("inf"), "lat=inf"), (0.0, 91.0, "lat=91.0"),
     (-180.5, 0.0, "lon=-180.5"), (0.0, -90.0000001, "lat=-90.0000001")],
)
def test_bad_coordinates_are_named(lon: float, lat: float, needle: str) -> None:
    with pytest.raises(ValueError, match=re.escape(needle)):
        hk.lonlat_to_grid(lon, lat, 20)
    with pytest.raises(ValueError, match=f"at index 2: .*{re.escape(needle)}"):
        hk.lonlat_to_grid(np.array([1.0, 2.0, lon]), np.array([1.0, 2.0, lat]), 20)


def test_bad_coordinate_types() -> None:
    with pytest.raises(ValueError, match="invalid coordinate"):
        hk.lonlat_to_grid("east", 1.0, 20)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match=r"x\[0\] = 1048576 is outside \[0, 1048576\)"):
        hk.grid_to_lonlat(1 << 20, 0, 20)
    with pytest.raises(ValueError, match="outside the 20-bit grid"):
        hk.grid_to_lonlat(np.array([0, 1 << 20], np.uint32), np.array([0, 0], np.uint32), 20)


def test_cell_size_table() -> None:
    w, h = hk.cell_size_m(20, 47.0)
    assert 25.5 < w < 26.5 and 18.9 < h < 19.3
    assert hk.cell_size_m(26, 0.0)[0] == pytest.approx(0.5965, rel=1e-3)
