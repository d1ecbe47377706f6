"""The bindings a live region change moves (`geofence region add / remove`): pure, no I/O.

A region change is two worldmaps, `old` and `new`, and the fences bound where the curve
changes hands. It runs in the re-split's two safe steps (spark_jobs/rebuild_bindings.py):
*grow* (every region binds what it owns under either map), the new map stored and taken by
every x-ingress, then *shrink* (every region binds what it owns under the new map). A
position routed with either map finds its fences at every moment; a fence bound on both
sides meanwhile is one fence to its worker (it decides per object, whichever region a
position came through), so nothing is reported twice.

Trade-off: the moves are computed from the live bindings (`fence_range`), not from the
fences' geometry: a region's pieces cut again at the new interval starts (a split), or two
regions' pieces put together and merged where a start went away (a join), give exactly the
covering cut by the new map, without covering a polygon again; so adding a region with
10,000 fences bound costs array work on their ranges, not 10,000 coverings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from exchanges.worldmap import TOP, Worldmap

U64 = npt.NDArray[np.uint64]
BOOL = npt.NDArray[np.bool_]
Piece = tuple[U64, BOOL]


@dataclass(frozen=True, eq=False)
class Bound:
    """One fence's live binding in one region (a `fence_range` row)."""

    fence_id: str
    region: str
    version: int
    bits: int
    ranges: U64  # (N, 2) inclusive, sorted
    interior: BOOL


@dataclass(frozen=True, eq=False)
class Rebind:
    """What some regions must bind of one fence at its `version` (None: nothing)."""

    fence_id: str
    version: int
    bits: int
    per_region: dict[str, Piece | None]

    @property
    def ranges(self) -> int:
        return sum(len(p[0]) for p in self.per_region.values() if p is not None)


def _cut(b: Bound, wm: Worldmap) -> dict[str, Piece]:
    return wm.clip(b.ranges, b.interior) if len(b.ranges) else {}


def merge_at(ranges: npt.ArrayLike, interior: npt.ArrayLike, starts: Iterable[int]) -> Piece:
    """Ranges sorted, and two neighbours with the same flag merged where the first ends just
    before one of `starts` and the second begins at it (a cut a join took away)."""
    r = np.asarray(ranges, dtype=np.uint64).reshape(-1, 2)
    f = np.asarray(interior, dtype=bool).reshape(-1)
    order = np.argsort(r[:, 0], kind="stable")
    r, f = r[order], f[order]
    if len(r) < 2:
        return r, f
    cuts = np.asarray(sorted(starts), dtype=np.uint64)
    touch = (r[1:, 0] == r[:-1, 1] + np.uint64(1)) & (f[1:] == f[:-1]) & np.isin(r[1:, 0], cuts)
    if not touch.any():
        return r, f
    head = np.r_[True, ~touch]  # a row that begins a merged range
    last = np.r_[head[1:], True]  # a row that ends one
    return np.stack([r[head, 0], r[last, 1]], axis=1).astype(np.uint64), f[head]


def _rebind(b: Bound, per_region: dict[str, Piece | None]) -> Rebind:
    return Rebind(b.fence_id, b.version, b.bits, per_region)


def split_grow(bound: Iterable[Bound], new: Worldmap, region: str) -> list[Rebind]:
    """Adding `region` (a split of another one): for each fence bound where `new` gives
    `region` a part, its pieces there; the old region keeps all it binds (grow)."""
    out = []
    for b in bound:
        piece = _cut(b, new).get(region)
        if piece is not None:
            out.append(_rebind(b, {region: piece}))
    return out


def split_shrink(bound: Iterable[Bound], new: Worldmap) -> list[Rebind]:
    """After the split map is live: each fence of the split region keeps only what it owns
    under `new` (None when nothing is left there)."""
    out = []
    for b in bound:
        pieces = _cut(b, new)
        if set(pieces) != {b.region}:
            out.append(_rebind(b, {b.region: pieces.get(b.region)}))
    return out


def join_grow(leaving: Iterable[Bound], staying: dict[str, Bound], into: str, old: Worldmap,
              new: Worldmap) -> list[Rebind]:
    """Removing a region into `into`: each fence bound on the leaving region gets those pieces
    added to what `into` binds of it (`staying`: fence id -> its `into` binding), merged where
    the map lost an interval start. The leaving region keeps its own until the shrink."""
    gone = set(old.starts.tolist()) - set(new.starts.tolist())
    out = []
    for b in leaving:
        have = staying.get(b.fence_id)
        if have is not None and have.version != b.version:
            raise ValueError(f"fence {b.fence_id}: bound at version {have.version} in {into} "
                             f"and {b.version} in {b.region}")
        add = np.ones(len(b.ranges), bool) if have is None else ~_within(b.ranges, have.ranges)
        if not add.any():
            continue  # grown already (the command run again)
        ranges = b.ranges[add] if have is None else np.concatenate([have.ranges, b.ranges[add]])
        flags = b.interior[add] if have is None else np.concatenate([have.interior, b.interior[add]])
        out.append(_rebind(b, {into: merge_at(ranges, flags, gone)}))
    return out


def _within(pieces: U64, ranges: U64) -> BOOL:
    """Which pieces lie inside one of `ranges` (sorted, disjoint)."""
    if not len(ranges):
        return np.zeros(len(pieces), bool)
    i = np.searchsorted(ranges[:, 0], pieces[:, 0], side="right") - 1
    ok = i >= 0
    out = np.zeros(len(pieces), bool)
    out[ok] = ranges[i[ok], 1] >= pieces[ok, 1]
    return out


def join_shrink(leaving: Iterable[Bound]) -> list[Rebind]:
    """Once the leaving region owns nothing and every x-ingress knows it: unbind it all."""
    return [_rebind(b, {b.region: None}) for b in leaving]


def moved_share(old: Worldmap, new: Worldmap) -> float:
    """The share of the curve whose owner differs between the two maps (by region name)."""
    cuts = np.union1d(old.starts, new.starts)
    lengths = np.diff(np.r_[cuts.astype(np.float64), float(TOP) + 1.0])
    a = np.array(old.regions)[old.region_index(cuts)]
    b = np.array(new.regions)[new.region_index(cuts)]
    return float(lengths[a != b].sum() / (float(TOP) + 1.0))
