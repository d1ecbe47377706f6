"""The pure core of the nightly rebuild of bindings: pandas batches in, pandas batches out.

Spark calls these inside the executors (mapInPandas, one Arrow batch at a time); the tests
call them directly. Nothing here does I/O.

Trade-off: the covering is computed once per fence, whole (not cut by regions), and kept
(fence_binding); cutting it by a worldmap is then a cheap vectorised pass over a whole batch
of fences, so trying a re-split, or cutting by two maps at once during one, costs no second
covering. The cut must equal what the fence service stores, so it is the service's own
(fence.spec.bindings_of: in the rare case the cuts push a fence past MAX_RANGES, its covering
is coarsened by the excess, which is the covering the kernel makes with that budget); the
geometry is not needed after the covering, so the cached coverings do not carry it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pandas as pd

from exchanges import binding_diff
from exchanges.fence_binding import INDEX_BITS
from exchanges.worldmap import Worldmap
from fence.spec import MAX_RANGES, Bindings, Flat, bindings_of, choose_bits_bounds, covering
from hilbert_c import kernel
from hilbert_c.covering import DEFAULT_MAX_NODES, Covering, coarsen, flatten_geojson

U64 = npt.NDArray[np.uint64]
BOOL = npt.NDArray[np.bool_]

COVER_COLUMNS = ("fence_id", "version", "bits", "level", "ranges", "interior", "error")
COVER_SCHEMA = ("fence_id string, version long, bits int, level int, n_ranges int, "
                "ranges binary, interior binary, error string")
CUT_SCHEMA = ("fence_id string, version long, region string, bits int, n_ranges int, ranges binary, "
              "interior binary")
DIFF_SCHEMA = ("region string, fence_id string, version long, action string, ranges_before int, "
               "ranges_after int, ranges_removed int, ranges_added int, bits int, ranges binary, "
               "interior binary")
ACTIONS = ("add", "change", "remove")  # the order of the differences' counts in batch_counts
DIFF_FIELDS = ("region", "fence_id", "version", "action", "ranges_before", "ranges_after", "ranges_removed",
               "ranges_added", "bits", "ranges", "interior")
# The first pass's differences name what differs, not the new ranges (the apply cuts them
# again for the few fences it changes): the cache does not hold every covering twice.
REBUILD_DIFF_FIELDS = DIFF_FIELDS[:-2]
REBUILD_SCHEMA = (COVER_SCHEMA + ", cut_regions array<string>, cut_sizes array<int>, diffs array<struct<"
                  + ", ".join(f"{n}: {t}" for n, t in (c.split() for c in DIFF_SCHEMA.split(", "))
                              if n in REBUILD_DIFF_FIELDS) + ">>"
                  + ", " + ", ".join(f"{k} {t}" for k, t in (("batch_counts", "array<long>"),
                                                              ("batch_loads", "array<long>"),
                                                              ("batch_buckets", "binary"))))
# Re-split resolution: ranges are counted by the 2^BUCKET_SHIFT-index block they start in
# (2^16 indices at 26 bits per axis: a block of 256 x 256 cells, about 150 m at 45 degrees).
BUCKET_SHIFT = 16


def to_bytes(ranges: U64, interior: BOOL) -> tuple[bytes, bytes]:
    return (np.ascontiguousarray(ranges, "<u8").tobytes(),
            np.ascontiguousarray(interior, np.uint8).tobytes())


def from_bytes(ranges: bytes | None, interior: bytes | None) -> tuple[U64, BOOL]:
    if not ranges:
        return np.empty((0, 2), np.uint64), np.empty(0, bool)
    return (np.frombuffer(ranges, "<u8").astype(np.uint64).reshape(-1, 2),
            np.frombuffer(interior or b"", np.uint8).astype(bool))


def flat(geometry: str) -> Flat:
    return flatten_geojson(orjson.loads(geometry))


# --------------------------------------------------------------------------- covering

First = tuple[int, Covering]  # (bits, the whole covering at INDEX_BITS)


def covers(geometries: Iterable[str]) -> tuple[list[First | None], list[str | None]]:
    """Each GeoJSON text's whole covering (fence.spec.covering), or None and why the kernel
    refused it. The batch's polygons go to C in one call; a geometry that does not parse as
    a plain Polygon / MultiPolygon of lon/lat pairs here, or that the batch call cannot
    cover as it is (over the node budget, bad coordinates), takes the one-fence path, which
    gives its covering at a coarser level or the exact error."""
    geometries = list(geometries)
    firsts: list[First | None] = [None] * len(geometries)
    errors: list[str | None] = [None] * len(geometries)
    coords: list[Any] = []
    ring_ends: list[int] = []
    poly_rings = [0]
    members: list[int] = []
    alone: list[int] = []
    with _no_gc():  # the parsed vertices stay alive until the batch is in one array: no cycles
        for i, text in enumerate(geometries):
            try:
                rings = _rings(text)
            except (ValueError, KeyError, TypeError, IndexError):
                alone.append(i)
                continue
            for ring in rings:
                coords.extend(ring)
                ring_ends.append(len(coords))
            poly_rings.append(len(ring_ends))
            members.append(i)
        if members:
            try:
                xy = np.array(coords, dtype=np.float64)
                if xy.ndim != 2 or xy.shape[1] < 2:
                    raise ValueError("not lon/lat pairs")
            except (ValueError, TypeError):  # 3D and 2D vertices mixed, a vertex not a number...
                alone, members = sorted(alone + members), []
        del coords
    if members:
        lon, lat = np.ascontiguousarray(xy[:, 0]), np.ascontiguousarray(xy[:, 1])
        ends = np.array(ring_ends, np.int64)
        first_vertex = np.r_[0, ends[:-1]][poly_rings[:-1]]
        x0, x1 = np.minimum.reduceat(lon, first_vertex), np.maximum.reduceat(lon, first_vertex)
        y0, y1 = np.minimum.reduceat(lat, first_vertex), np.maximum.reduceat(lat, first_vertex)
        boxes = zip(x0.tolist(), y0.tolist(), x1.tolist(), y1.tolist(), strict=True)
        bits = np.array([choose_bits_bounds(*b) for b in boxes], np.int32)
        ranges, interior, counts, status, nodes = kernel.cover_many(
            lon, lat, ends, np.array(poly_rings, np.int64), bits, INDEX_BITS, DEFAULT_MAX_NODES)
        at = np.r_[0, np.cumsum(counts)].tolist()
        for j, i in enumerate(members):
            if status[j] != kernel.COVER_OK:
                alone.append(i)
                continue
            cov = Covering(ranges[at[j]:at[j + 1]], interior[at[j]:at[j + 1]], INDEX_BITS, int(bits[j]),
                           int(nodes[j]))
            firsts[i] = int(bits[j]), coarsen(cov, MAX_RANGES)
    for i in alone:
        try:
            firsts[i] = covering(flat(geometries[i]))
        except (ValueError, KeyError, TypeError, IndexError) as exc:  # InvalidGeometry is a ValueError
            errors[i] = f"{type(exc).__name__}: {exc}"[:500]
    return firsts, errors


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic collector paused: it would walk every parsed vertex list again and again
    (a batch's parse took 3x longer with it)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _rings(text: str) -> list[Any]:
    """The closed rings (lists of vertices) of a GeoJSON Polygon / MultiPolygon text."""
    obj = orjson.loads(text)
    kind = obj["type"]
    polys = [obj["coordinates"]] if kind == "Polygon" else obj["coordinates"] if kind == "MultiPolygon" \
        else ()
    out = []
    for rings in polys:
        for ring in rings:
            out.append(ring if ring[0][:2] == ring[-1][:2] else [*ring, ring[0]])
    if not out:
        raise ValueError("no ring")
    return out


def cover_batch(batch: pd.DataFrame) -> pd.DataFrame:
    """(fence_id, version, geometry GeoJSON text) -> the whole covering of each fence at its
    level, expressed at INDEX_BITS (COVER_SCHEMA). A geometry the kernel refuses gives a row
    with `error` set and no ranges: counted and reported, never a failed job."""
    return _cover_frame(batch, *covers(batch["geometry"]))


def _cover_frame(batch: pd.DataFrame, firsts: list[First | None], errors: list[str | None]) -> pd.DataFrame:
    out = batch[["fence_id", "version"]].reset_index(drop=True)
    columns: tuple[list[Any], ...] = ([], [], [], [], [])
    bits, level, n, ranges, interior = columns
    for f in firsts:
        if f is None:
            values: tuple[Any, ...] = (0, 0, 0, b"", b"")
        else:
            values = (f[0], f[1].level, len(f[1]), *to_bytes(f[1].ranges, f[1].interior))
        for column, v in zip(columns, values, strict=True):
            column.append(v)
    out["bits"] = np.array(bits, np.int64)
    out["level"] = np.array(level, np.int64)
    out["n_ranges"] = np.array(n, np.int64)
    out["ranges"] = pd.Series(ranges, dtype=object)
    out["interior"] = pd.Series(interior, dtype=object)
    out["error"] = pd.Series(errors, dtype=object)
    return out


def per_batch(fn: Callable[..., pd.DataFrame], *args: Any) -> Callable[[Iterable[pd.DataFrame]],
                                                                      Iterator[pd.DataFrame]]:
    """`fn(batch, *args)` over every batch: the function mapInPandas takes."""
    def run(batches: Iterable[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for b in batches:
            yield fn(b, *args)
    return run


def rebuild_batch(batch: pd.DataFrame, worldmap: Worldmap) -> pd.DataFrame:
    """The nightly pass over a batch of fences read with their live bindings (live_regions,
    live_versions, live_ranges, live_interior: arrays, empty or null when none): the whole
    covering, the cut by `worldmap` (regions and sizes) and the differences with what is live
    (REBUILD_DIFF_FIELDS dicts, only for (region, fence) pairs that differ) (REBUILD_SCHEMA).

    The batch's first row also carries its totals (null on the other rows): batch_counts
    (fences, ranges, failed, then the differences of each of ACTIONS), batch_loads (ranges
    bound per region of `worldmap`, in its order) and batch_buckets (how many ranges start
    in each curve block, `pack_histogram`):
    the driver sums a few rows instead of aggregating every fence again, and the re-split's
    histogram needs no second pass over the coverings."""
    firsts, errors = covers(batch["geometry"])
    cov = _cover_frame(batch, firsts, errors)
    cuts = _cut(firsts, worldmap)
    regions, sizes, diffs = [], [], []
    for b, live_regions, live_versions, live_ranges, live_interior, fence_id, version in zip(
            cuts, batch["live_regions"], batch["live_versions"], batch["live_ranges"], batch["live_interior"],
            batch["fence_id"], batch["version"], strict=True):
        new = {} if b is None else b.per_region
        names = sorted(new)
        regions.append(names)
        sizes.append([len(new[r][0]) for r in names])
        live: dict[str, tuple[Any, bytes, bytes]] = {}
        if _present(live_regions):
            live = dict(zip(live_regions, zip(live_versions, live_ranges, live_interior, strict=True),
                            strict=True))
        out = []
        for region in (sorted(set(names) | set(live)) if live and b is not None else names):
            lv = live.get(region)
            if lv is None:  # nothing live: the whole cut is added
                n_new = len(new[region][0])
                action, before, after, removed, added = "add", 0, n_new, 0, n_new
            else:
                if region in new and to_bytes(*new[region]) == (lv[1], lv[2]):
                    continue
                lr, lf = from_bytes(lv[1], lv[2])
                nr, nf = new[region] if region in new else from_bytes(None, None)
                d = binding_diff.diff(lr, lf, nr, nf)
                action = "change" if region in new else "remove"
                before, after, removed, added = len(lr), len(nr), len(d.remove), len(d.add)
            assert b is not None  # a fence the kernel refused: its live bindings are left alone
            out.append(dict(zip(REBUILD_DIFF_FIELDS, (
                region, fence_id, int(version), action, before, after, removed, added, b.bits), strict=True)))
        diffs.append(out)
    cov["cut_regions"], cov["cut_sizes"], cov["diffs"] = regions, sizes, diffs
    loads = dict.fromkeys(worldmap.regions, 0)
    for names, n in zip(regions, sizes, strict=True):
        for region, k in zip(names, n, strict=True):
            loads[region] += k
    failed = sum(f is None for f in firsts)
    actions = dict.fromkeys(ACTIONS, 0)
    for fence_diffs in diffs:
        for row in fence_diffs:
            actions[row["action"]] += 1
    totals = (np.array([len(cov), int(cov["n_ranges"].sum()), failed, *actions.values()], np.int64),
              np.array([loads[r] for r in worldmap.regions], np.int64),
              pack_histogram(*buckets([f[1] for f in firsts if f is not None])))
    for name, value in zip(("batch_counts", "batch_loads", "batch_buckets"), totals, strict=True):
        column: list[Any] = [None] * len(cov)
        if column:
            column[0] = value
        cov[name] = pd.Series(column, dtype=object)
    return cov


def pack_histogram(ids: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]) -> bytes:
    """A histogram as bytes (little-endian int64 ids, then as many counts): one small value
    per batch that the driver collects as it is."""
    return np.concatenate([ids, counts]).astype("<i8").tobytes()


def sum_histograms(packed: Iterable[bytes]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The sum of packed histograms: (sorted ids, counts)."""
    parts = [np.frombuffer(p, "<i8").reshape(2, -1) for p in packed if p]
    if not parts:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    both = np.concatenate(parts, axis=1)
    ids, where = np.unique(both[0], return_inverse=True)
    return ids.astype(np.int64), np.bincount(where, weights=both[1]).astype(np.int64)


def buckets(covs: list[Covering]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """How many of these ranges start in each 2^BUCKET_SHIFT block of the curve."""
    if not covs:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    starts = np.concatenate([c.ranges[:, 0] for c in covs])
    b, n = np.unique(starts >> np.uint64(BUCKET_SHIFT), return_counts=True)
    return b.astype(np.int64), n.astype(np.int64)


# --------------------------------------------------------------------------- cutting by regions

def stored_covering(row: Any) -> First:
    r, f = from_bytes(row.ranges, row.interior)
    return int(row.bits), Covering(r, f, int(row.bits), int(row.level), 0)


def cut_batch(batch: pd.DataFrame, worldmap: Worldmap, old: Worldmap | None = None) -> pd.DataFrame:
    """Coverings (COVER_SCHEMA) -> one row per (fence, region) it binds (CUT_SCHEMA).

    Without `old`: exactly what the fence service stores in fence_range under `worldmap`.
    With `old`: what a region must bind while a re-split is under way: the pieces it owns
    under either map (cut at both maps' boundaries), so a position routed with either map
    finds its fences."""
    out: dict[str, list[Any]] = {k: [] for k in ("fence_id", "version", "region", "bits", "n_ranges",
                                                  "ranges", "interior")}
    for row, b in zip(batch.itertuples(index=False), cut_many(batch, worldmap, old), strict=True):
        if b is None:
            continue
        for region, (r, f) in sorted(b.per_region.items()):
            rb, fb = to_bytes(r, f)
            for k, v in zip(out, (row.fence_id, row.version, region, b.bits, len(r), rb, fb), strict=True):
                out[k].append(v)
    return pd.DataFrame({k: pd.Series(v, dtype=object if k in ("fence_id", "region", "ranges", "interior")
                                      else "int64") for k, v in out.items()})


def cut_many(batch: pd.DataFrame, worldmap: Worldmap, old: Worldmap | None = None) -> list[Bindings | None]:
    """The bindings of each stored covering of a batch (COVER_SCHEMA; None for a fence that
    failed) under `worldmap`, or, with `old`, the union cut of a re-split (see cut_batch)."""
    firsts = [None if _present(row.error) else stored_covering(row) for row in batch.itertuples(index=False)]
    if old is not None:
        return [None if f is None else union_cut(f, worldmap, old) for f in firsts]
    return _cut(firsts, worldmap)


def _cut(firsts: list[First | None], worldmap: Worldmap) -> list[Bindings | None]:
    """The bindings of a batch of coverings, cut in one vectorised pass: the pieces are
    ordered by (fence, region) and each binding is a slice of one contiguous array. Only a
    fence the cuts push past MAX_RANGES is cut again on its own (fence.spec.bindings_of,
    which coarsens its covering by the excess, as the fence service does)."""
    ok = [i for i, f in enumerate(firsts) if f is not None]
    out: list[Bindings | None] = [None] * len(firsts)
    if not ok:
        return out
    covs = [firsts[i][1] for i in ok]  # type: ignore[index]
    sizes = np.fromiter((len(c) for c in covs), np.int64, len(covs))
    start, end, flag, row, owner = worldmap.cut(np.concatenate([c.ranges for c in covs]),
                                                np.concatenate([c.interior for c in covs]))
    fence = np.repeat(np.arange(len(ok)), sizes)[row]  # nondecreasing: cut keeps row order
    k = len(worldmap.regions)
    key = fence * k + owner
    if key.size > 1 and bool((key[1:] < key[:-1]).any()):  # a fence's pieces go back to a region
        order = np.argsort(key, kind="stable")  # pieces keep their curve order within a region
        key, start, end, flag = key[order], start[order], end[order], flag[order]
    pieces = np.stack([start, end], axis=1)  # C-contiguous: every slice is a binding's bytes
    heads = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else np.empty(0, np.int64)
    tails = np.r_[heads[1:], key.size]
    too_many = np.bincount(fence, minlength=len(ok)) > MAX_RANGES
    for j, i in enumerate(ok):
        f = firsts[i]
        assert f is not None
        out[i] = bindings_of(f, worldmap) if too_many[j] else Bindings(f[0], {})
    for a, b, key_ab in zip(heads.tolist(), tails.tolist(), key[heads].tolist(), strict=True):
        j, ri = divmod(key_ab, k)
        if not too_many[j]:
            out[ok[j]].per_region[worldmap.regions[ri]] = (pieces[a:b], flag[a:b])
    return out


def union_cut(first: tuple[int, Covering], new: Worldmap, old: Worldmap) -> Bindings:
    bits, cov = first
    both = Worldmap(0, ("all",), np.union1d(new.starts, old.starts).astype(np.uint64),
                    np.zeros(np.union1d(new.starts, old.starts).size, np.int64))
    start, end, flag, _, _ = both.cut(cov.ranges, cov.interior)
    owners = {new.regions[i] for i in np.unique(new.region_index(start)).tolist()}
    owners |= {old.regions[i] for i in np.unique(old.region_index(start)).tolist()}
    per_region = {}
    for region in sorted(owners):
        sel = np.zeros(start.size, bool)
        for wm in (new, old):
            if region in wm.regions:
                sel |= wm.region_index(start) == wm.regions.index(region)
        per_region[region] = (np.stack([start[sel], end[sel]], axis=1).astype(np.uint64), flag[sel])
    return Bindings(bits, per_region)


# --------------------------------------------------------------------------- balance

def balanced(current: Worldmap, buckets: npt.ArrayLike, counts: npt.ArrayLike) -> Worldmap:
    """A map with the same regions, in the same order along the curve, each owning one
    interval that holds an equal share of the ranges counted per bucket; the current map
    when there is too little to split."""
    b = np.asarray(buckets, np.uint64)
    n = np.asarray(counts, np.int64)
    order = np.argsort(b)
    b, n = b[order], n[order]
    k = len(current.regions)
    total = int(n.sum())
    if k < 2 or total == 0 or b.size < k:
        return current
    cum = np.cumsum(n)
    # the first bucket of region i: where the running count reaches i/k of the total
    firsts = np.searchsorted(cum, [total * i / k for i in range(1, k)], side="right")
    cuts = b[np.minimum(firsts, b.size - 1)] << np.uint64(BUCKET_SHIFT)
    starts = np.concatenate([[np.uint64(0)], cuts]).astype(np.uint64)
    if not (starts[1:] > starts[:-1]).all():
        return current
    return Worldmap(current.version + 1, current.regions, starts, np.arange(k, dtype=np.int64))


def loads_by_start(wm: Worldmap, buckets: npt.ArrayLike, counts: npt.ArrayLike) -> dict[str, int]:
    """Each region's load under `wm` from the histogram of range starts: exact for the map
    `balanced` makes (its boundaries are block boundaries) but for the ranges a boundary
    cuts in two (one more piece each: at most one per fence crossing it), so a close
    estimate of what the cut would bind, without cutting every covering again."""
    b = np.asarray(buckets, np.uint64)
    n = np.asarray(counts, np.int64)
    per = np.bincount(wm.region_index(b << np.uint64(BUCKET_SHIFT)), weights=n, minlength=len(wm.regions))
    return {r: int(per[i]) for i, r in enumerate(wm.regions)}


def imbalance(loads: dict[str, int], regions: Iterable[str]) -> float:
    """The busiest region's load over the mean load (1.0 is perfect balance)."""
    values = [loads.get(r, 0) for r in regions]
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean else 1.0


# --------------------------------------------------------------------------- diff

def diff_batch(batch: pd.DataFrame) -> pd.DataFrame:
    """Live (live_* columns, null when absent) against computed bindings of (region, fence):
    the rows that differ, with the size of the minimal diff (exchanges.binding_diff) (DIFF_SCHEMA)."""
    out: dict[str, list[Any]] = {k: [] for k in ("region", "fence_id", "version", "action", "ranges_before",
                                                  "ranges_after", "ranges_removed", "ranges_added", "bits",
                                                  "ranges", "interior")}
    for row in batch.itertuples(index=False):
        has_live, has_new = _present(row.live_ranges), _present(row.ranges)
        if has_live and has_new and row.live_ranges == row.ranges and row.live_interior == row.interior:
            continue
        lr, lf = from_bytes(row.live_ranges if has_live else None, row.live_interior if has_live else None)
        nr, nf = from_bytes(row.ranges if has_new else None, row.interior if has_new else None)
        d = binding_diff.diff(lr, lf, nr, nf)
        action = "change" if has_live and has_new else "add" if has_new else "remove"
        version = row.version if has_new else row.live_version
        bits = int(row.bits) if has_new else 0
        new_r, new_f = (row.ranges, row.interior) if has_new else (None, None)
        for k, v in zip(out, (row.region, row.fence_id, int(version), action, len(lr), len(nr), len(d.remove),
                              len(d.add), bits, new_r, new_f), strict=True):
            out[k].append(v)
    objects = ("region", "fence_id", "action", "ranges", "interior")
    return pd.DataFrame({k: pd.Series(v, dtype=object if k in objects else "int64") for k, v in out.items()})


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and np.isnan(value))

