"""Typed wrapper over the compiled kernel: the only importer of `hilbert_c._kernel` / `_scalar`.

Scalar calls go straight to C (validation happens there, an invalid input comes back as a
sentinel). Array calls take numpy buffers with `ffi.from_buffer` and make one C call per
batch; cffi releases the GIL around every call in API mode.
"""

from __future__ import annotations

from typing import Any, overload

import numpy as np
import numpy.typing as npt

import hilbert_c._scalar as _scalar
from hilbert_c._kernel import ffi, lib

MIN_BITS: int = lib.HK_MIN_BITS
MAX_BITS: int = lib.HK_MAX_BITS
_INVALID = (1 << 64) - 1
_LOW32 = 0xFFFFFFFF

U32 = npt.NDArray[np.uint32]
U64 = npt.NDArray[np.uint64]
F64 = npt.NDArray[np.float64]

# Scalar entry points come from the module that keeps the GIL (see build_kernel.py).
_encode = _scalar.lib.hk_encode
_decode = _scalar.lib.hk_decode


def _check_bits(bits: int) -> None:
    if not isinstance(bits, int | np.integer) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an integer in [{MIN_BITS}, {MAX_BITS}], got {bits!r}")


def encode(x: int, y: int, bits: int = 26) -> int:
    """Hilbert index of grid cell (x, y) with `bits` bits per axis (0 <= x, y < 2**bits)."""
    try:
        h: int = _encode(x, y, bits)
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"encode({x!r}, {y!r}, bits={bits!r}): {exc}") from None
    if h == _INVALID:
        _check_bits(bits)
        raise ValueError(f"cell ({x}, {y}) is outside the {bits}-bit grid [0, {1 << bits})")
    return h


def decode(h: int, bits: int = 26) -> tuple[int, int]:
    """Grid cell (x, y) of Hilbert index h (0 <= h < 4**bits)."""
    try:
        v: int = _decode(h, bits)
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"decode({h!r}, bits={bits!r}): {exc}") from None
    if v == _INVALID:
        _check_bits(bits)
        raise ValueError(f"index {h} is outside the {bits}-bit curve [0, {1 << (2 * bits)})")
    return v >> 32, v & _LOW32


def axes_to_line_2D_26b(x: int, y: int) -> int:
    """The design's name for `encode(x, y, 26)` (coordinates masked to 26 bits, as the NIF)."""
    h: int = _scalar.lib.axes_to_line_2D_26b(x, y)
    return h


def line_to_axes_2D_26b(h: int) -> tuple[int, int]:
    """The design's name for `decode(h, 26)`."""
    xy = ffi.new("uint32_t[2]")
    lib.line_to_axes_2D_26b(h, xy, xy + 1)
    return int(xy[0]), int(xy[1])


def _as_uint(name: str, a: Any, dtype: type[np.unsignedinteger[Any]], limit: int) -> Any:
    arr = np.asarray(a)
    if arr.dtype == dtype:
        return np.asarray(arr, order="C")
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be an integer array, got dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= limit):
        bad = int(np.flatnonzero((arr < 0) | (arr >= limit))[0])
        raise ValueError(f"{name}[{bad}] = {arr.flat[bad]} is outside [0, {limit})")
    return np.asarray(arr, dtype=dtype, order="C")


def encode_many(xs: npt.ArrayLike, ys: npt.ArrayLike, bits: int = 26) -> U64:
    """Hilbert indices (uint64) of the cells (xs[i], ys[i]); one C call for the batch."""
    _check_bits(bits)
    side = 1 << bits
    x = _as_uint("xs", xs, np.uint32, side)
    y = _as_uint("ys", ys, np.uint32, side)
    if x.shape != y.shape:
        raise ValueError(f"xs and ys differ in shape: {x.shape} != {y.shape}")
    out = np.empty(x.shape, dtype=np.uint64)
    bad = lib.hk_encode_many(
        ffi.from_buffer("uint32_t[]", x), ffi.from_buffer("uint32_t[]", y),
        ffi.from_buffer("uint64_t[]", out, require_writable=True), x.size, bits,
    )
    if bad >= 0:
        raise ValueError(
            f"cell ({x.flat[bad]}, {y.flat[bad]}) at index {bad} is outside the "
            f"{bits}-bit grid [0, {side})"
        )
    return out


def decode_many(hs: npt.ArrayLike, bits: int = 26) -> tuple[U32, U32]:
    """Cells (xs, ys) as uint32 arrays of the Hilbert indices hs; one C call for the batch."""
    _check_bits(bits)
    h = _as_uint("hs", hs, np.uint64, 1 << (2 * bits))
    xs = np.empty(h.shape, dtype=np.uint32)
    ys = np.empty(h.shape, dtype=np.uint32)
    bad = lib.hk_decode_many(
        ffi.from_buffer("uint64_t[]", h), ffi.from_buffer("uint32_t[]", xs, require_writable=True),
        ffi.from_buffer("uint32_t[]", ys, require_writable=True), h.size, bits,
    )
    if bad >= 0:
        raise ValueError(
            f"index {h.flat[bad]} at position {bad} is outside the {bits}-bit curve "
            f"[0, {1 << (2 * bits)})"
        )
    return xs, ys


def _as_f64_pair(lon: npt.ArrayLike, lat: npt.ArrayLike) -> tuple[F64, F64]:
    lo = np.asarray(lon, dtype=np.float64, order="C")
    la = np.asarray(lat, dtype=np.float64, order="C")
    if lo.shape != la.shape:
        raise ValueError(f"lon and lat differ in shape: {lo.shape} != {la.shape}")
    return lo, la


# Real polygons carry float noise at the edges of the world (Natural Earth's Russia has a vertex
# at lon 180.00000000000006): a coordinate this close outside [-180, 180] x [-90, 90] is the
# edge itself and is clamped onto it; anything further out stays an error.
COORD_SLACK_DEG = 1e-9


def clamp_lonlat(lon: npt.ArrayLike, lat: npt.ArrayLike) -> tuple[F64, F64]:
    """lon / lat (arrays) with the values within COORD_SLACK_DEG outside the world clamped
    onto its edge; every other value (NaN, far out) as it was, for the checks to refuse."""
    lo = np.asarray(lon, dtype=np.float64)
    la = np.asarray(lat, dtype=np.float64)
    return _clamp(lo, 180.0), _clamp(la, 90.0)


def _clamp(v: F64, edge: float) -> F64:
    over = (np.abs(v) > edge) & (np.abs(v) <= edge + COORD_SLACK_DEG)
    if not over.any():
        return v
    out: F64 = np.where(over, np.copysign(edge, v), v)
    return out


def _coord_error(lon: float, lat: float, index: int | None) -> ValueError:
    where = "" if index is None else f" at index {index}"
    return ValueError(
        f"invalid coordinate{where}: lon={lon!r}, lat={lat!r} "
        "(lon must be a finite number in [-180, 180] and lat in [-90, 90])"
    )


@overload
def lonlat_to_grid(lon: float, lat: float, bits: int = 26) -> tuple[int, int]: ...
@overload
def lonlat_to_grid(lon: npt.NDArray[Any], lat: npt.NDArray[Any], bits: int = 26) -> tuple[U32, U32]: ...
def lonlat_to_grid(lon: Any, lat: Any, bits: int = 26) -> Any:
    """WGS84 degrees to the grid cell holding the point (scalar or array form).

    lon in [-180, 180] maps linearly onto x in [0, 2**bits) and lat in [-90, 90] onto y, so a
    cell spans 360 / 2**bits degrees of longitude by 180 / 2**bits of latitude (see
    `cell_size_m`). lon = 180 and lat = 90 fall in the last column / row.
    """
    _check_bits(bits)
    scalar = np.ndim(lon) == 0 and np.ndim(lat) == 0
    try:
        lo, la = _as_f64_pair(*clamp_lonlat(lon, lat))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"invalid coordinate: lon={lon!r}, lat={lat!r}: {exc}") from None
    xs = np.empty(lo.shape, dtype=np.uint32)
    ys = np.empty(lo.shape, dtype=np.uint32)
    bad = lib.hk_lonlat_to_grid(
        ffi.from_buffer("double[]", lo), ffi.from_buffer("double[]", la),
        ffi.from_buffer("uint32_t[]", xs, require_writable=True),
        ffi.from_buffer("uint32_t[]", ys, require_writable=True), lo.size, bits,
    )
    if bad >= 0:
        raise _coord_error(float(lo.flat[bad]), float(la.flat[bad]), None if scalar else bad)
    if scalar:
        return int(xs), int(ys)
    return xs, ys


@overload
def grid_to_lonlat(x: int, y: int, bits: int = 26) -> tuple[float, float]: ...
@overload
def grid_to_lonlat(x: npt.NDArray[Any], y: npt.NDArray[Any], bits: int = 26) -> tuple[F64, F64]: ...
def grid_to_lonlat(x: Any, y: Any, bits: int = 26) -> Any:
    """Centre of grid cell (x, y) in WGS84 degrees (scalar or array form)."""
    _check_bits(bits)
    scalar = np.ndim(x) == 0 and np.ndim(y) == 0
    side = 1 << bits
    xs = _as_uint("x", x, np.uint32, side)
    ys = _as_uint("y", y, np.uint32, side)
    if xs.shape != ys.shape:
        raise ValueError(f"x and y differ in shape: {xs.shape} != {ys.shape}")
    lon = np.empty(xs.shape, dtype=np.float64)
    lat = np.empty(xs.shape, dtype=np.float64)
    bad = lib.hk_grid_to_lonlat(
        ffi.from_buffer("uint32_t[]", xs), ffi.from_buffer("uint32_t[]", ys),
        ffi.from_buffer("double[]", lon, require_writable=True),
        ffi.from_buffer("double[]", lat, require_writable=True), xs.size, bits,
    )
    if bad >= 0:
        raise ValueError(f"cell ({xs.flat[bad]}, {ys.flat[bad]}) is outside the {bits}-bit grid")
    if scalar:
        return float(lon), float(lat)
    return lon, lat


def lonlat_to_unit(lon: F64, lat: F64, bits: int) -> tuple[F64, F64]:
    """Continuous grid coordinates (cell units; the cell is their floor): the covering's space."""
    _check_bits(bits)
    lo, la = _as_f64_pair(lon, lat)
    us = np.empty(lo.shape, dtype=np.float64)
    vs = np.empty(lo.shape, dtype=np.float64)
    bad = lib.hk_lonlat_to_unit(
        ffi.from_buffer("double[]", lo), ffi.from_buffer("double[]", la),
        ffi.from_buffer("double[]", us, require_writable=True),
        ffi.from_buffer("double[]", vs, require_writable=True), lo.size, bits,
    )
    if bad >= 0:
        raise _coord_error(float(lo.flat[bad]), float(la.flat[bad]), bad)
    return us, vs


class CoverBudgetExceeded(ValueError):
    """The covering would visit more quadtree nodes than allowed."""


def cover_rings(
    lon: F64, lat: F64, ring_ends: npt.NDArray[np.int64], bits: int, max_level: int,
    max_nodes: int,
) -> tuple[U64, npt.NDArray[np.bool_], int, int]:
    """Raw C covering of even-odd rings: (ranges (N, 2), interior flags, nodes, boundary cells)."""
    _check_bits(bits)
    lo, la = _as_f64_pair(lon, lat)
    ends = np.ascontiguousarray(ring_ends, dtype=np.int64)
    out = ffi.new("hk_covering *")
    rc = lib.hk_cover(
        ffi.from_buffer("double[]", lo), ffi.from_buffer("double[]", la),
        ffi.from_buffer("int64_t[]", ends), ends.size, bits, max_level, max_nodes, out,
    )
    if rc == lib.HK_E_BUDGET:
        raise CoverBudgetExceeded(
            f"covering at level {max_level} needs more than {max_nodes} quadtree nodes"
        )
    if rc == lib.HK_E_COORD:
        raise ValueError("a vertex is not a valid lon/lat coordinate")
    if rc == lib.HK_E_NOMEM:
        raise MemoryError("out of memory while covering")
    if rc != lib.HK_OK:
        raise ValueError(f"covering failed: bad arguments (code {rc})")
    nodes, boundary = int(out.nodes), int(out.boundary_cells) if out.n else 0
    ranges, interior = _take_ranges(out)
    return ranges, interior, nodes, boundary


def _take_ranges(out: Any) -> tuple[U64, npt.NDArray[np.bool_]]:
    """A C covering's ranges and flags copied into numpy; the C buffers freed."""
    try:
        n = out.n
        if n == 0:
            return np.empty((0, 2), np.uint64), np.empty(0, bool)
        ranges = np.frombuffer(ffi.buffer(out.ranges, 16 * n), dtype=np.uint64).reshape(n, 2).copy()
        interior = np.frombuffer(ffi.buffer(out.interior, n), dtype=np.uint8).astype(bool)
        return ranges, interior
    finally:
        lib.hk_covering_free(out)


def cover_many(
    lon: F64, lat: F64, ring_ends: npt.NDArray[np.int64], poly_rings: npt.NDArray[np.int64],
    bits: npt.NDArray[np.int32], out_bits: int, max_nodes: int,
) -> tuple[U64, npt.NDArray[np.bool_], npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.int64]]:
    """Raw C covering of many polygons in one call (polygon p: rings poly_rings[p] to
    poly_rings[p + 1] of ring_ends, which count vertices from the start of lon/lat), each at
    its own bits, every range expressed at out_bits: (ranges (N, 2) in polygon order,
    interior flags, ranges per polygon, status per polygon (0 or the error code `cover_rings`
    raises for it alone: it then has no ranges), nodes per polygon)."""
    _check_bits(out_bits)
    lo, la = _as_f64_pair(lon, lat)
    ends = np.ascontiguousarray(ring_ends, dtype=np.int64)
    polys = np.ascontiguousarray(poly_rings, dtype=np.int64)
    b = np.ascontiguousarray(bits, dtype=np.int32)
    n = b.size
    if polys.size != n + 1 or (n and (polys[0] < 0 or polys[-1] > ends.size)):
        raise ValueError(f"poly_rings must hold {n + 1} ring offsets within the {ends.size} rings")
    if ends.size and (ends.min() < 0 or ends.max() > lo.size):
        raise ValueError(f"ring ends must lie within the {lo.size} vertices")
    counts = np.empty(n, np.int64)
    status = np.empty(n, np.int32)
    nodes = np.empty(n, np.int64)
    out = ffi.new("hk_covering *")
    rc = lib.hk_cover_many(
        ffi.from_buffer("double[]", lo), ffi.from_buffer("double[]", la), ffi.from_buffer("int64_t[]", ends),
        ffi.from_buffer("int64_t[]", polys), n, ffi.from_buffer("int32_t[]", b), out_bits, max_nodes, out,
        ffi.from_buffer("int64_t[]", counts, require_writable=True),
        ffi.from_buffer("int32_t[]", status, require_writable=True),
        ffi.from_buffer("int64_t[]", nodes, require_writable=True),
    )
    if rc == lib.HK_E_NOMEM:
        raise MemoryError("out of memory while covering")
    if rc != lib.HK_OK:
        raise ValueError(f"covering failed: bad arguments (code {rc})")
    ranges, interior = _take_ranges(out)
    return ranges, interior, counts, status, nodes


COVER_OK: int = lib.HK_OK
PIP_OUT: int = lib.HK_PIP_OUT
PIP_IN: int = lib.HK_PIP_IN
PIP_UNSURE: int = lib.HK_PIP_UNSURE


def points_in_polygons(
    edges: tuple[F64, F64, F64, F64], edge_lo: npt.NDArray[np.int64], edge_hi: npt.NDArray[np.int64],
    x: F64, y: F64,
) -> npt.NDArray[np.uint8]:
    """Per point i: PIP_IN if strictly inside the polygon whose edges (ax, ay, bx, by) are
    rows [edge_lo[i], edge_hi[i]), PIP_OUT if not, PIP_UNSURE where only GEOS's exact
    arithmetic could tell (or edge_lo[i] < 0): see contains.c."""
    ax, ay, bx, by = (np.ascontiguousarray(a, dtype=np.float64) for a in edges)
    lo = np.ascontiguousarray(edge_lo, dtype=np.int64)
    hi = np.ascontiguousarray(edge_hi, dtype=np.int64)
    px, py = _as_f64_pair(x, y)
    n = px.size
    if not (lo.size == hi.size == py.size == n):
        raise ValueError("edge_lo, edge_hi, x and y must have one entry per point")
    if n and ax.size and int(hi.max()) > ax.size:
        raise ValueError("an edge span is beyond the edge arrays")
    out = np.empty(n, dtype=np.uint8)
    lib.hk_points_in_polygons(
        *(ffi.from_buffer("double[]", a) for a in (ax, ay, bx, by)),
        ffi.from_buffer("int64_t[]", lo), ffi.from_buffer("int64_t[]", hi),
        ffi.from_buffer("double[]", px), ffi.from_buffer("double[]", py), n,
        ffi.from_buffer("uint8_t[]", out, require_writable=True),
    )
    return out


def match_sorted(keys: U64, needles: U64) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(i, j) for every needles[i] == keys[j], in needle order; keys sorted and distinct.
    np.searchsorted's answer, faster when the needles are sorted too (see search.c)."""
    k = np.ascontiguousarray(keys, dtype=np.uint64)
    q = np.ascontiguousarray(needles, dtype=np.uint64)
    hit = np.empty(q.size, dtype=np.int64)
    at = np.empty(q.size, dtype=np.int64)
    m = lib.hk_match_sorted(
        ffi.from_buffer("uint64_t[]", k), k.size, ffi.from_buffer("uint64_t[]", q), q.size,
        ffi.from_buffer("int64_t[]", hit, require_writable=True),
        ffi.from_buffer("int64_t[]", at, require_writable=True),
    )
    return hit[:m], at[:m]



_ROAM_I64 = ("m_slot", "q", "e_cell", "e_slot", "e_row", "e_from", "e_to", "ax_key", "ax_ent", "ay_key",
             "ay_ent", "sx_key", "sx_ent", "sy_key", "sy_ent", "s_ptr", "s_filter")
_ROAM_F64 = ("m_olon", "m_olat", "m_nlon", "m_nlat", "m_rmax", "e_lon", "e_lat", "s_radius")
_ROAM_U8 = ("m_had_old", "m_own_old", "m_own_new", "e_ver", "e_own", "pass_held", "pass_old", "pass_new")


def roam_pairs(n_slots: int, side: int, r_max: float, **cols: npt.ArrayLike) -> dict[str, Any]:
    """The roaming matcher's batch in one C call (proximity.c `hk_roam_pairs`; the columns
    are hk_roam_segment's fields). Returns the columns k, j, i, flags, d, and `work`: the
    index searches and the entries looked at."""
    keep: list[Any] = []
    g = ffi.new("hk_roam_segment *")
    for names, dtype, ctype in ((_ROAM_I64, np.int64, "int64_t[]"), (_ROAM_F64, np.float64, "double[]"),
                                (_ROAM_U8, np.uint8, "uint8_t[]")):
        for name in names:
            a = np.ascontiguousarray(cols[name], dtype)
            if a.size == 0:
                a = np.zeros(1, dtype)  # a valid pointer; its length is given elsewhere
            keep.append(a)
            setattr(g, name, ffi.from_buffer(ctype, a))
    g.n_slots, g.n_movers, g.side = n_slots, np.asarray(cols["m_slot"]).size, side
    g.n_entries, g.r_max = np.asarray(cols["e_cell"]).size, r_max
    g.n_a, g.n_s = np.asarray(cols["ax_key"]).size, np.asarray(cols["sx_key"]).size
    if np.asarray(cols["q"]).size != 16 * g.n_movers:
        raise ValueError("roam_pairs: q holds 4 boxes of 4 numbers per mover")
    cap = max(1024, 8 * g.n_movers)
    work = np.zeros(2, np.int64)
    while True:
        out = {"k": np.empty(cap, np.int64), "j": np.empty(cap, np.int64), "i": np.empty(cap, np.int64),
               "flags": np.empty(cap, np.uint8), "d": np.empty(cap, np.float64)}
        m = lib.hk_roam_pairs(g, ffi.from_buffer("int64_t[]", out["k"], require_writable=True),
                              ffi.from_buffer("int64_t[]", out["j"], require_writable=True),
                              ffi.from_buffer("int64_t[]", out["i"], require_writable=True),
                              ffi.from_buffer("uint8_t[]", out["flags"], require_writable=True),
                              ffi.from_buffer("double[]", out["d"], require_writable=True), cap,
                              ffi.from_buffer("int64_t[]", work, require_writable=True))
        if m <= cap:
            del keep
            got: dict[str, Any] = {name: a[:m] for name, a in out.items()}
            got["work"] = (int(work[0]), int(work[1]))
            return got
        cap = int(m)
