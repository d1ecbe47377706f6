"""Fences that follow an object ("moving subscriptions"): the pure core.

A following fence is a circle of radius_m around its object's latest position. x-ingress
taps the positions of followed objects (exchange fence.follow, one message per batch with
the latest position of each); the fence service (fence/follow_shell.py) feeds them here and
turns the moves this core asks for into ordinary fence changes (store, binding diffs to x-geo,
fence_changed events from x-fence).

Trade-off: a move costs a store transaction and a diff per region, so moves are rate-limited
per fence: at most one per `min_interval_s` (1 s), and none for a shift under `min_move_m`
(a twentieth of the radius, at least 1 m): GPS noise alone does not re-bind anything. The
latest position seen while a fence waits is kept and applied when its interval is over, so
a fence always ends on its object's last position. Moves carry the position's time; the
store refuses a move older than the one the fence stands on, so redeliveries and several
service replicas can never move a fence backwards.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from shapely.geometry import Polygon

from exchanges.fence_def import InvalidFence

EARTH_M_PER_DEG = 111_320.0
SEGMENTS = 32  # vertices of a circle: its area is within 0.7% of the true circle's
MIN_INTERVAL_S = 1.0
MIN_MOVE_M = 1.0


def circle(lon: float, lat: float, radius_m: float, segments: int = SEGMENTS) -> Polygon:
    """A circle of radius_m around (lon, lat), in lon/lat degrees (local equirectangular:
    exact enough for radii up to tens of km away from the poles)."""
    if not (math.isfinite(lon) and math.isfinite(lat) and -180 <= lon <= 180 and -85 <= lat <= 85):
        raise InvalidFence(f"centre ({lon}, {lat}): lon in [-180, 180], lat in [-85, 85]")
    if not (math.isfinite(radius_m) and radius_m > 0):
        raise InvalidFence(f"radius {radius_m!r}: positive metres")
    dlat = radius_m / EARTH_M_PER_DEG
    dlon = dlat / math.cos(math.radians(lat))
    pts = [(max(-180.0, min(180.0, lon + dlon * math.cos(a))), lat + dlat * math.sin(a))
           for a in (2 * math.pi * i / segments for i in range(segments))]
    return Polygon(pts)


def distance_m(lon1: float, lat1: float, lon2: float, lat2: float) -> float:
    k = math.cos(math.radians((lat1 + lat2) / 2))
    return math.hypot((lon2 - lon1) * k, lat2 - lat1) * EARTH_M_PER_DEG


@dataclass(frozen=True)
class Move:
    fence_id: str
    object_id: str
    lon: float
    lat: float
    ts: float  # the position's time


@dataclass
class _Following:
    fence_id: str
    object_id: str
    radius_m: float
    at: tuple[float, float] | None = None  # where the fence stands (centre), if known
    ts: float = -math.inf  # the time of the position it stands on
    moved_at: float = -math.inf  # monotonic time of its last move
    pending: Move | None = None  # the latest position seen while it waited


@dataclass
class FollowCore:
    """Which fences follow which object, and when each should move (no I/O)."""

    min_interval_s: float = MIN_INTERVAL_S
    min_move_m: float = MIN_MOVE_M
    _by_object: dict[str, dict[str, _Following]] = field(default_factory=dict)

    def set_fences(self, fences: Iterable[tuple[str, str, float, tuple[float, float] | None, float | None]]
                   ) -> None:
        """The following fences now (fence_id, object_id, radius_m, centre or None, ts or None),
        from the store; state of fences that stay is kept."""
        old = {f.fence_id: f for fs in self._by_object.values() for f in fs.values()}
        new: dict[str, dict[str, _Following]] = {}
        for fence_id, object_id, radius, centre, ts in fences:
            f = old.get(fence_id)
            if f is None or f.radius_m != radius or f.object_id != object_id:
                f = _Following(fence_id, object_id, radius, centre, -math.inf if ts is None else ts)
            elif ts is not None and ts > f.ts:  # moved elsewhere (another replica): stand there
                f.at, f.ts = centre, ts
                if f.pending is not None and f.pending.ts <= ts:
                    f.pending = None
            new.setdefault(object_id, {})[fence_id] = f
        self._by_object = new

    @property
    def objects(self) -> set[str]:
        return set(self._by_object)

    def fences_of(self, object_id: str) -> list[str]:
        return sorted(self._by_object.get(object_id, {}))

    def observe(self, object_id: str, lon: float, lat: float, ts: float, now: float) -> list[Move]:
        """A position of `object_id`: the moves to make now (the others wait, see `due`)."""
        moves = []
        for f in self._by_object.get(object_id, {}).values():
            if ts <= f.ts or (f.pending is not None and ts <= f.pending.ts):
                continue  # older than what the fence stands on or waits for
            if f.at is not None and distance_m(f.at[0], f.at[1], lon, lat) < max(self.min_move_m,
                                                                                f.radius_m / 20):
                f.pending = None  # back where it stands: nothing to do
                continue
            move = Move(f.fence_id, object_id, lon, lat, ts)
            if now - f.moved_at >= self.min_interval_s:
                moves.append(self._moved(f, move, now))
            else:
                f.pending = move
        return moves

    def due(self, now: float) -> list[Move]:
        """Moves that waited for their interval and may go now."""
        return [self._moved(f, f.pending, now) for fs in self._by_object.values() for f in fs.values()
                if f.pending is not None and now - f.moved_at >= self.min_interval_s]

    def _moved(self, f: _Following, move: Move, now: float) -> Move:
        # A fixed schedule (one slot per interval), not "interval after the last move": with
        # positions once per interval, stamping `now` let every delay push the next move into
        # waiting, and moves skipped positions (bench/moving_fences.py: 9% at 100 fences).
        # Still at most one move per interval on average.
        f.at, f.ts, f.pending = (move.lon, move.lat), move.ts, None
        f.moved_at = now if now - f.moved_at >= 2 * self.min_interval_s else max(
            f.moved_at + self.min_interval_s, now - self.min_interval_s / 2)
        return move

    def failed(self, move: Move) -> None:
        """`move` could not be stored (PostgreSQL away): it waits to go again with `due`,
        unless a newer position waits already."""
        f = self._by_object.get(move.object_id, {}).get(move.fence_id)
        if f is not None and (f.pending is None or f.pending.ts < move.ts):
            f.pending = move

    def forget(self, fence_id: str) -> None:
        for fs in self._by_object.values():
            fs.pop(fence_id, None)
        self._by_object = {o: fs for o, fs in self._by_object.items() if fs}
