"""Control messages: how a fence change travels manager -> x-geo -> x-fence (pure codecs).

    manager --x-geo.control (every region)--> x-geo: "define" {fence, ts, bits, ranges, interior}
                                                     "drop" {fence_id, version, ts}
    x-geo --x-fence.in (key = the fence's worker)--> x-fence: "define" {fence, ts} / "drop"

Every region gets every change: a region the fence does not touch (empty ranges) unbinds
it, so a fence that moves from one region to another leaves the first. Only the regions
that bind the fence forward its definition to x-fence, on the very path its positions take
(x-fence.in, federated): so x-fence always has the definition before the first position
routed by that binding. Several regions forward the same version; x-fence keeps the first
and ignores the rest (version order), as it ignores anything older than what it knows.

Definitions carry the geometry as GeoJSON and the change time `ts` (epoch seconds): the
time of the fence_changed / fence_deleted events, the same on every replay.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import shapely.geometry

from exchanges.batch import pack
from exchanges.contract import InvalidMessage
from exchanges.x_geo import FenceBinding
from fence.spec import FenceSpec, InvalidFence, check_fence_id, check_geometry, check_timeout
from fence.state import FenceDef

DEFINE, DROP, INSPECT = "define", "drop", "inspect"


@dataclass(frozen=True, eq=False)
class Define:
    fence: FenceDef
    ts: float
    bits: int = 0
    ranges: npt.NDArray[np.uint64] | None = None  # only on x-geo.control
    interior: npt.NDArray[np.bool_] | None = None

    def binding(self) -> FenceBinding | None:
        """The x-geo binding, or None when the fence does not touch the region."""
        if self.ranges is None or self.interior is None or not len(self.ranges):
            return None
        return FenceBinding(self.fence.fence_id, self.fence.version, self.ranges, self.interior)


@dataclass(frozen=True)
class Drop:
    fence_id: str
    version: int
    ts: float


def fence_json(fence: FenceDef) -> dict[str, Any]:
    return {"id": fence.fence_id, "version": fence.version, "name": fence.name,
            "timeout_s": fence.timeout_s, "geometry": dict(shapely.geometry.mapping(fence.geometry))}


def fence_def(spec: FenceSpec, version: int) -> FenceDef:
    return FenceDef(spec.fence_id, version, spec.geometry, spec.timeout_s, spec.name)


def define_for_region(fence: FenceDef, ts: float, bits: int, ranges: npt.NDArray[np.uint64],
                      interior: npt.NDArray[np.bool_]) -> bytes:
    return pack(DEFINE, fence=fence_json(fence), ts=ts, bits=bits,
                ranges=np.ascontiguousarray(ranges, "<u8").tobytes(),
                interior=np.ascontiguousarray(interior, np.uint8).tobytes())


def define_for_worker(d: Define) -> bytes:
    return pack(DEFINE, fence=fence_json(d.fence), ts=d.ts)


def drop_message(d: Drop) -> bytes:
    return pack(DROP, fence_id=d.fence_id, version=d.version, ts=d.ts)


def parse(msg: dict[str, Any]) -> Define | Drop:
    """A control message decoded by `exchanges.batch.unpack`; InvalidMessage says why not."""
    try:
        kind = msg["kind"]
        if kind == DEFINE:
            return _define(msg)
        if kind == DROP:
            return Drop(check_fence_id(msg["fence_id"]), _version(msg["version"]), _ts(msg["ts"]))
    except InvalidFence as exc:
        raise InvalidMessage(f"bad {msg.get('kind')} message: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidMessage(f"bad {msg.get('kind')} message: {type(exc).__name__}: {exc}") from None
    raise InvalidMessage(f"unknown control message kind {kind!r}")


def _define(msg: dict[str, Any]) -> Define:
    f = msg["fence"]
    fence = FenceDef(check_fence_id(f["id"]), _version(f["version"]), check_geometry(f["geometry"]),
                     check_timeout(f["timeout_s"]), str(f.get("name", "")))
    if "ranges" not in msg:
        return Define(fence, _ts(msg["ts"]))
    ranges = np.frombuffer(msg["ranges"], "<u8").astype(np.uint64).reshape(-1, 2)
    interior = np.frombuffer(msg["interior"], np.uint8).astype(bool)
    if interior.size != len(ranges):
        raise ValueError(f"{len(ranges)} ranges but {interior.size} interior flags")
    if len(ranges) and (ranges[:, 1] < ranges[:, 0]).any():
        raise ValueError("a range ends before it starts")
    return Define(fence, _ts(msg["ts"]), int(msg["bits"]), ranges, interior)


def _version(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"version {v!r} is not a positive integer")
    return v


def _ts(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v):
        raise ValueError(f"ts {v!r} is not a finite number")
    return float(v)
