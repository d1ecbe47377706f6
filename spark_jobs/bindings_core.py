"""The pure core of the nightly rebuild of bindings: pandas batches in, pandas batches out.

Spark calls these inside the executors (mapInPandas, one Arrow batch at a time); the tests
call them directly. Nothing here does I/O.

Trade-off: the covering is computed once per fence, whole (not cut by regions), and kept
(fence_binding); cutting it by a worldmap is then a cheap vectorised pass over a whole batch
of fences, so trying a re-split, or cutting by two maps at once during one, costs no second
covering. The cut must equal what the fence service stores, so it goes through the very
function the service uses (fence.spec.bindings_flat, with the precomputed covering), which
redoes a covering with less budget only in the rare case the cuts push it past MAX_RANGES.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pandas as pd

from fence import binding_diff
from fence.spec import MAX_RANGES, Bindings, Flat, bindings_flat, covering
from hilbert_c.covering import Covering, flatten_geojson
from ingress.worldmap import Worldmap

U64 = npt.NDArray[np.uint64]
BOOL = npt.NDArray[np.bool_]

COVER_COLUMNS = ("fence_id", "version", "geometry", "bits", "level", "ranges", "interior", "error")
COVER_SCHEMA = ("fence_id string, version long, geometry string, bits int, level int, n_ranges int, "
                "ranges binary, interior binary, error string")
CUT_SCHEMA = ("fence_id string, version long, region string, bits int, n_ranges int, ranges binary, "
              "interior binary")
BUCKET_SCHEMA = "bucket long, n long"
DIFF_SCHEMA = ("region string, fence_id string, version long, action string, ranges_before int, "
               "ranges_after int, ranges_removed int, ranges_added int, bits int, ranges binary, "
               "interior binary")
DIFF_FIELDS = ("region", "fence_id", "version", "action", "ranges_before", "ranges_after", "ranges_removed",
               "ranges_added", "bits", "ranges", "interior")
REBUILD_SCHEMA = (COVER_SCHEMA + ", cut_regions array<string>, cut_sizes array<int>, diffs array<struct<"
                  + ", ".join(f"{n}: {t}" for n, t in (c.split() for c in DIFF_SCHEMA.split(", "))) + ">>")
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

def cover_batch(batch: pd.DataFrame) -> pd.DataFrame:
    """(fence_id, version, geometry GeoJSON text) -> the whole covering of each fence at its
    level, expressed at INDEX_BITS (COVER_SCHEMA). A geometry the kernel refuses gives a row
    with `error` set and no ranges: counted and reported, never a failed job."""
    rows: dict[str, list[Any]] = {k: [] for k in ("bits", "level", "n_ranges", "ranges", "interior", "error")}
    for geometry in batch["geometry"]:
        try:
            bits, cov = covering(flat(geometry))
            r, f = to_bytes(cov.ranges, cov.interior)
            values: tuple[Any, ...] = (bits, cov.level, len(cov), r, f, None)
        except (ValueError, KeyError, TypeError, IndexError) as exc:  # InvalidGeometry is a ValueError
            values = (0, 0, 0, b"", b"", f"{type(exc).__name__}: {exc}"[:500])
        for k, v in zip(rows, values, strict=True):
            rows[k].append(v)
    out = batch[["fence_id", "version", "geometry"]].reset_index(drop=True)
    for k, v in rows.items():
        out[k] = pd.Series(v, dtype=object if k in ("ranges", "interior", "error") else "int64")
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
    (DIFF_FIELDS dicts, only for (region, fence) pairs that differ) (REBUILD_SCHEMA)."""
    cov = cover_batch(batch)
    cuts = cut_many(cov, worldmap)
    regions, sizes, diffs = [], [], []
    for row, b in zip(batch.itertuples(index=False), cuts, strict=True):
        new = {} if b is None else b.per_region
        regions.append(sorted(new))
        sizes.append([len(new[r][0]) for r in sorted(new)])
        live = {}
        if _present(row.live_regions):
            for region, version, r, f in zip(row.live_regions, row.live_versions, row.live_ranges,
                                             row.live_interior, strict=True):
                live[region] = (int(version), r, f)
        out = []
        for region in sorted(set(new) | set(live)):
            nb = to_bytes(*new[region]) if region in new else None
            lv = live.get(region)
            if b is None and lv is not None:
                continue  # a fence the kernel refused: reported, its live bindings left alone
            if nb is not None and lv is not None and nb == (lv[1], lv[2]):
                continue
            lr, lf = from_bytes(lv[1], lv[2]) if lv is not None else from_bytes(None, None)
            nr, nf = new[region] if region in new else from_bytes(None, None)
            d = binding_diff.diff(lr, lf, nr, nf)
            action = "change" if nb is not None and lv is not None else "add" if nb is not None else "remove"
            out.append(dict(zip(DIFF_FIELDS, (
                region, row.fence_id, int(row.version), action, len(lr), len(nr), len(d.remove), len(d.add),
                b.bits if b is not None else 0, nb[0] if nb else None, nb[1] if nb else None), strict=True)))
        diffs.append(out)
    cov["cut_regions"], cov["cut_sizes"], cov["diffs"] = regions, sizes, diffs
    return cov


def cut_sizes_batch(batch: pd.DataFrame, worldmap: Worldmap) -> pd.DataFrame:
    """How many ranges each region would bind of a batch's coverings under `worldmap`."""
    loads: dict[str, int] = {}
    for b in cut_many(batch, worldmap):
        for region, (r, _) in (b.per_region.items() if b is not None else ()):
            loads[region] = loads.get(region, 0) + len(r)
    return pd.DataFrame({"region": list(loads), "n": pd.Series(list(loads.values()), dtype="int64")})


# --------------------------------------------------------------------------- cutting by regions

def stored_covering(row: Any) -> tuple[int, Covering]:
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
    """The bindings of each covering of a batch (None for a fence that failed), cut in one
    vectorised pass; only a fence the cuts push past MAX_RANGES is cut again on its own
    (bindings_flat, which redoes its covering with less budget, as the fence service does)."""
    firsts: list[tuple[int, Covering] | None] = []
    for row in batch.itertuples(index=False):
        firsts.append(None if _present(row.error) else stored_covering(row))
    if old is not None:
        return [None if f is None else union_cut(f, worldmap, old) for f in firsts]
    ok = [i for i, f in enumerate(firsts) if f is not None]
    out: list[Bindings | None] = [None] * len(firsts)
    if not ok:
        return out
    covs = [firsts[i][1] for i in ok]  # type: ignore[index]
    sizes = np.array([len(c) for c in covs])
    start, end, flag, row, owner = worldmap.cut(np.concatenate([c.ranges for c in covs]),
                                                np.concatenate([c.interior for c in covs]))
    fence = np.repeat(np.arange(len(ok)), sizes)[row]  # the batch fence of each piece
    pieces = np.bincount(fence, minlength=len(ok))
    order = np.lexsort((owner, fence))  # by fence, then region; pieces keep their curve order
    bounds = np.r_[0, np.cumsum(pieces)]
    geometry = batch["geometry"].to_numpy()
    for j, i in enumerate(ok):
        bits = firsts[i][0]  # type: ignore[index]
        if pieces[j] > MAX_RANGES:
            out[i] = bindings_flat(flat(geometry[i]), worldmap, firsts[i])
            continue
        sel = order[bounds[j]:bounds[j + 1]]
        per_region = {}
        for ri in np.unique(owner[sel]).tolist():
            s = sel[owner[sel] == ri]
            per_region[worldmap.regions[ri]] = (np.stack([start[s], end[s]], axis=1), flag[s])
        out[i] = Bindings(bits, per_region)
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

def bucket_batch(batch: pd.DataFrame) -> pd.DataFrame:
    """How many ranges start in each 2^BUCKET_SHIFT block of the curve (BUCKET_SCHEMA)."""
    starts = [from_bytes(r, f)[0][:, 0] for r, f in zip(batch["ranges"], batch["interior"], strict=True)]
    all_starts = np.concatenate(starts) if starts else np.empty(0, np.uint64)
    b, n = np.unique(all_starts >> np.uint64(BUCKET_SHIFT), return_counts=True)
    return pd.DataFrame({"bucket": b.astype(np.int64), "n": n.astype(np.int64)})


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


def imbalance(loads: dict[str, int], regions: Iterable[str]) -> float:
    """The busiest region's load over the mean load (1.0 is perfect balance)."""
    values = [loads.get(r, 0) for r in regions]
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean else 1.0


# --------------------------------------------------------------------------- diff

def diff_batch(batch: pd.DataFrame) -> pd.DataFrame:
    """Live (live_* columns, null when absent) against computed bindings of (region, fence):
    the rows that differ, with the size of the minimal diff (fence.binding_diff) (DIFF_SCHEMA)."""
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

