"""Control messages: how a fence change travels manager -> x-geo -> x-fence (pure codecs).

    manager --x-geo.control--> x-geo: "define" {fence, ts, bits, ranges, interior}
                                      "rebind" {fence, ts, bits, base_version, add, add_interior,
                                                remove, digest}   (exchanges/binding_diff.py)
                                      "drop" {fence_id, version, ts}
    x-geo --x-fence.in (key = the fence's worker)--> x-fence: "define" {fence, ts, recheck} / "drop"

A change goes to the regions the fence touched before or touches now (a delete to every
region). A region that keeps the fence gets a "rebind": only the ranges that changed, against
the version it has (it reads the fence's bindings from the store when that does not fit); a
region the fence enters gets a whole "define"; a region it leaves a "define" with no ranges,
which unbinds it. Every region
that binds or bound the fence forwards its definition to x-fence, on the very path its
positions take (x-fence.in, federated): so x-fence always has the definition before the
first position routed by that binding. With it goes `recheck`: a worker batch of the latest
position of each object in the region that is in the fence's old or new ranges
(exchanges.x_geo.core.XGeo.change), from which x-fence decides who is inside the new geometry.
Several regions forward the same version; x-fence defines the first and ignores the rest
(version order), as it ignores anything older than what it knows; each one's re-check rows
apply.

Definitions carry the geometry as GeoJSON and the change time `ts` (epoch seconds): the
time of the fence_changed / fence_deleted events, the same on every replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import shapely.geometry

from exchanges.batch import pack
from exchanges.binding_diff import Diff
from exchanges.contract import InvalidMessage
from exchanges.fence_binding import FenceBinding
from exchanges.fence_def import FenceDef, InvalidFence, check_fence_key, check_geometry
from exchanges.fence_options import check_options, encode_options
from exchanges.worker_batch import WorkerBatch

DEFINE, REBIND, DROP, INSPECT = "define", "rebind", "drop", "inspect"
# `geofence worker add / remove` (deploy/worker_ops.py), requests with a reply like INSPECT:
# to x-geo, route with the stored worker ring of this version; to x-fence, the state of the
# fences a ring gives to other workers (EXPORT), that state taken in (IMPORT), and those
# fences forgotten once the ring is in force (FORGET).
RING, EXPORT, IMPORT, FORGET = "ring", "export", "import", "forget"
# A spatial query over the objects' last known positions (exchanges/x_geo/queries.py): to each
# region's x-geo, answered like INSPECT with that region's rows.
QUERY = "query"
# A drain barrier: published by `geofence worker` to each region's x-geo.in while x-ingress is
# paused; x-geo forwards it, behind every position it routed, to each of its workers; a
# worker that reaches it has applied everything its region sent before, and says so to the
# queue named in `reply` (gf-fences) with its `barrier` id, region and positions still held.
BARRIER = "barrier"


@dataclass(frozen=True, eq=False)
class Define:
    fence: FenceDef
    ts: float
    bits: int = 0
    ranges: npt.NDArray[np.uint64] | None = None  # only on x-geo.control
    interior: npt.NDArray[np.bool_] | None = None
    diff: Diff | None = None  # a rebind: the ranges that changed since base_version
    base_version: int = 0
    recheck: WorkerBatch | None = None  # only on x-fence.in: the region's re-check rows
    # the regions the change was sent to (each forwards it to the worker, which keeps the
    # replaced version's geometry until all have: see fence.x_fence.core, "Fence changes"), and on
    # x-fence.in the region that forwarded this copy
    regions: tuple[str, ...] = ()
    region: str = ""

    def binding(self) -> FenceBinding | None:
        """The x-geo binding, or None when the fence does not touch the region."""
        if self.ranges is None or self.interior is None or not len(self.ranges):
            return None
        return FenceBinding(self.fence.fence_id, self.fence.version, self.ranges, self.interior,
                            self.fence.cross_box())


@dataclass(frozen=True)
class Drop:
    fence_id: str
    version: int
    ts: float


def fence_json(fence: FenceDef) -> dict[str, Any]:
    return {"id": fence.fence_id, "version": fence.version, "name": fence.name, **encode_options(fence),
            "geometry": dict(shapely.geometry.mapping(fence.geometry))}


def define_for_region(fence: FenceDef, ts: float, bits: int, ranges: npt.NDArray[np.uint64],
                      interior: npt.NDArray[np.bool_], regions: Sequence[str] = ()) -> bytes:
    return pack(DEFINE, fence=fence_json(fence), ts=ts, bits=bits, regions=list(regions),
                ranges=np.ascontiguousarray(ranges, "<u8").tobytes(),
                interior=np.ascontiguousarray(interior, np.uint8).tobytes())


def rebind_for_region(fence: FenceDef, ts: float, bits: int, base_version: int, d: Diff,
                      regions: Sequence[str] = ()) -> bytes:
    return pack(REBIND, fence=fence_json(fence), ts=ts, bits=bits, base_version=base_version,
                regions=list(regions),
                add=np.ascontiguousarray(d.add, "<u8").tobytes(),
                add_interior=np.ascontiguousarray(d.add_interior, np.uint8).tobytes(),
                remove=np.ascontiguousarray(d.remove, "<u8").tobytes(), digest=d.digest)


def define_for_worker(d: Define, recheck: WorkerBatch | None = None, region: str = "") -> bytes:
    extra: dict[str, Any] = {"regions": list(d.regions), "region": region} if region else {}
    if recheck is not None and len(recheck.positions):
        extra["recheck"] = recheck.to_wire()
    return pack(DEFINE, fence=fence_json(d.fence), ts=d.ts, **extra)


def drop_message(d: Drop) -> bytes:
    return pack(DROP, fence_id=d.fence_id, version=d.version, ts=d.ts)


def parse(msg: dict[str, Any]) -> Define | Drop:
    """A control message decoded by `exchanges.batch.unpack`; InvalidMessage says why not."""
    try:
        kind = msg["kind"]
        if kind == DEFINE:
            return _define(msg)
        if kind == REBIND:
            return _rebind(msg)
        if kind == DROP:
            return Drop(check_fence_key(msg["fence_id"]), _version(msg["version"]), _ts(msg["ts"]))
    except InvalidFence as exc:
        raise InvalidMessage(f"bad {msg.get('kind')} message: {exc}") from None
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise InvalidMessage(f"bad {msg.get('kind')} message: {type(exc).__name__}: {exc}") from None
    raise InvalidMessage(f"unknown control message kind {kind!r}")


def _fence(f: dict[str, Any]) -> FenceDef:
    geometry = check_geometry(f["geometry"])
    return FenceDef(fence_id=check_fence_key(f["id"]), version=_version(f["version"]), geometry=geometry,
                    name=str(f.get("name", "")), **check_options(f, geometry, strict=True))


def _flags(raw: Any, n: int, what: str) -> npt.NDArray[np.bool_]:
    flags = np.frombuffer(raw, np.uint8).astype(bool)
    if flags.size != n:
        raise ValueError(f"{n} {what} but {flags.size} interior flags")
    return flags


def _regions(msg: dict[str, Any]) -> tuple[str, ...]:
    raw = msg.get("regions", [])
    if not isinstance(raw, list) or len(raw) > 256 or not all(
            isinstance(r, str) and 0 < len(r) <= 64 for r in raw):
        raise ValueError("regions: a list of region names expected")
    return tuple(raw)


def _define(msg: dict[str, Any]) -> Define:
    fence = _fence(msg["fence"])
    regions = _regions(msg)
    if "ranges" not in msg:
        recheck = None
        if msg.get("recheck") is not None:
            recheck = WorkerBatch.from_wire(msg["recheck"])
            if (recheck.fences != [fence.fence_id] or (recheck.rechecks() != 0).any()
                    or (recheck.fence_versions() != fence.version).any()
                    or (np.diff(recheck.ptr) > 1).any()):
                raise ValueError(f"re-check rows that are not all of fence {fence.fence_id} v{fence.version}")
        region = msg.get("region", "")
        if not isinstance(region, str) or len(region) > 64:
            raise ValueError("region: a region name expected")
        return Define(fence, _ts(msg["ts"]), recheck=recheck, regions=regions, region=region)
    ranges = _ranges(msg["ranges"], "ranges")
    return Define(fence, _ts(msg["ts"]), int(msg["bits"]), ranges,
                  _flags(msg["interior"], len(ranges), "ranges"), regions=regions)


def _ranges(raw: Any, what: str) -> npt.NDArray[np.uint64]:
    if not isinstance(raw, bytes):
        raise TypeError(f"{what}: bytes expected, got {type(raw).__name__}")
    if len(raw) % 16:
        raise ValueError(f"{what}: not a whole number of [first, last] uint64 pairs")
    r = np.frombuffer(raw, "<u8").astype(np.uint64).reshape(-1, 2)
    if len(r) and (r[:, 1] < r[:, 0]).any():
        raise ValueError(f"{what}: a range ends before it starts")
    return r


def _rebind(msg: dict[str, Any]) -> Define:
    fence = _fence(msg["fence"])
    add = _ranges(msg["add"], "add")
    add_interior = _flags(msg["add_interior"], len(add), "ranges to add")
    digest = msg["digest"]
    if not isinstance(digest, bytes) or len(digest) != 16:
        raise ValueError("digest: 16 bytes expected")
    base = _version(msg["base_version"])
    if base >= fence.version:
        raise ValueError(f"base_version {base} is not older than version {fence.version}")
    d = Diff(add, add_interior, _ranges(msg["remove"], "remove"), digest)
    return Define(fence, _ts(msg["ts"]), int(msg["bits"]), diff=d, base_version=base, regions=_regions(msg))


def _version(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"version {v!r} is not a positive integer")
    return v


def _ts(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v):
        raise ValueError(f"ts {v!r} is not a finite number")
    return float(v)
