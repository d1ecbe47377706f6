"""What the live map shows, as plain data: the objects' last positions, how many objects each
fence holds, the recent events, and the frames that bring a browser up to date. No I/O: the
shell (fence/map_feed.py) feeds it samples, events and counts and sends the frames it makes.

Trade-off: one frame for every browser. Every 500 ms the view makes one delta frame (objects
that moved since the last one, at most `frame_objects` of them; fences whose count changed; the
events, at most `frame_events`; the rates) and the shell encodes it once and offers it to every
open map. A browser that has not taken the previous frame loses it and is sent a snapshot
instead (everything, at most `snapshot_objects` objects) when it is ready again. Per-browser
filtering (its viewport) would spare bandwidth but cost an encoding per browser per frame; a
full delta frame (2,500 objects) is ~90 kB of JSON, sent uncompressed: permessage-deflate
would compress it once per map (a zlib pass each), which is the cost this design avoids.

Counts are the workers' (asked every few seconds), not sums of the events: the feed sees a
sample of the events when they come faster than a map could show them, and a sum of a sample
would drift. The events make the flashes and the panel.

Tenants: the state holds the pipeline's qualified names (`<tenant>:<name>`, exchanges/tenancy.py).
A tenant's map sees its own tenant only: `scoped` makes a tenant's frame out of the one frame
(its objects, fences' counts and events, their names as the tenant gives them, and the
tenant's own figures from `tenant_stats` in place of the platform's), so the shell encodes one
frame per tenant with a map open per tick, not one per map. The platform-wide figures
(positions/s, events/s, events left out of the frame, objects still pending) are an operator's
and never reach a tenant's map. The caps (`frame_objects`, `frame_events`, `snapshot_objects`)
are the platform's: a tenant's share of a capped frame is what the cap left of it (its other
moves wait for the next frames, as anyone's do).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from exchanges.fence_events import qualified_ids
from exchanges.tenancy import SEP, is_tenant, tenant_of

FRAME_EVERY_S = 0.5  # frames per second per map: 2, whatever the load
FRAME_OBJECTS = 2_500  # 5,000 objects a second per map: each of 10,000 moving ones every 2 s
FRAME_EVENTS = 200
SNAPSHOT_OBJECTS = 50_000
RECENT_EVENTS = 50  # events a new map gets in its snapshot
STALE_S = 120.0  # an object not seen this long leaves the map
RATE_WINDOW_S = 10.0
DEGREES = 5  # ~1 m: enough for a map, and the JSON stays short (~35 bytes an object)
# what a tenant's frame never carries: the whole platform's figures (an operator's)
PLATFORM_ONLY = ("events_skipped", "pending")


@dataclass(frozen=True)
class MapEvent:
    event: str
    fence_id: str
    object_id: str
    ts: float
    reason: str

    def to_json(self) -> list[Any]:
        return [self.event, self.fence_id, self.object_id, self.ts, self.reason]


def parse_events(batch: Any) -> list[MapEvent]:
    """Events on the wire (a JSON array of exchanges/fence_events.Event.to_json) as map events;
    ValueError when they are not."""
    if not isinstance(batch, list):
        raise ValueError("events come as a JSON array")
    out = []
    for e in batch:
        try:
            fence_id, object_id = qualified_ids(e) if isinstance(e, dict) else (e["fence_id"], "")
            out.append(MapEvent(str(e["event"]), str(fence_id), str(object_id), float(e["ts"]),
                                str(e["reason"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not an event: {str(e)[:80]}") from exc
    return out


class MapView:
    def __init__(self, frame_objects: int = FRAME_OBJECTS, frame_events: int = FRAME_EVENTS,
                 snapshot_objects: int = SNAPSHOT_OBJECTS, stale_s: float = STALE_S) -> None:
        self.frame_objects, self.frame_events = frame_objects, frame_events
        self.snapshot_objects, self.stale_s = snapshot_objects, stale_s
        # object -> (lon, lat, ts, seen): insertion order is the order last seen (re-inserted on
        # every update), so the stale ones are at the front
        self._objects: dict[str, tuple[float, float, float, float]] = {}
        self._moved: dict[str, None] = {}  # objects to put in the next frame, oldest first
        self._gone: list[str] = []
        self._counts: dict[str, int] = {}
        self._changed: set[str] = set()
        self._events: list[MapEvent] = []
        self._events_skipped = 0  # events over frame_events in the pending frame
        self._recent: deque[MapEvent] = deque(maxlen=RECENT_EVENTS)
        self._recent_of: dict[str, deque[MapEvent]] = {}  # tenant -> its recent events
        self._objects_of: dict[str, int] = {}  # tenant -> its objects on the map
        self._positions_in: deque[tuple[float, int]] = deque()  # (when, positions) for the rate
        self._events_in: deque[tuple[float, int]] = deque()
        self.frames = 0

    # -- inputs ----------------------------------------------------------------------------

    def add_sample(self, ids: Sequence[str], lon: npt.NDArray[np.float64], lat: npt.NDArray[np.float64],
                   ts: npt.NDArray[np.float64], positions: int, now: float) -> None:
        """One x-ingress sample: each object's latest position, and how many positions it saw."""
        objects, moved = self._objects, self._moved
        for oid, x, y, t in zip(ids, np.round(lon, DEGREES).tolist(), np.round(lat, DEGREES).tolist(),
                                ts.tolist(), strict=True):
            old = objects.pop(oid, None)
            if old is not None and old[2] > t:  # an older sample (another x-ingress, late): keep
                objects[oid] = old
                continue
            if old is None:
                tenant = tenant_of(oid)
                self._objects_of[tenant] = self._objects_of.get(tenant, 0) + 1
            objects[oid] = (x, y, t, now)
            moved.pop(oid, None)
            moved[oid] = None
        self._positions_in.append((now, positions))

    def add_events(self, events: Iterable[MapEvent], seen: int, now: float) -> None:
        """Events for the flashes and the panel; `seen`: how many the feed counted in all (it may
        hand over only a sample of them)."""
        room = self.frame_events - len(self._events)
        taken = 0
        recent_of = self._recent_of
        for e in events:
            self._recent.append(e)
            tenant = tenant_of(e.fence_id)
            mine = recent_of.get(tenant)
            if mine is None:
                mine = recent_of[tenant] = deque(maxlen=RECENT_EVENTS)
            mine.append(e)
            if taken < room:
                self._events.append(e)
                taken += 1
        self._events_skipped += max(0, seen - taken)  # the frame says how many it leaves out
        self._events_in.append((now, seen))

    def set_counts(self, counts: Mapping[str, int]) -> None:
        """The workers' counts (every fence with anyone inside; a fence left out holds nobody)."""
        for f in self._counts.keys() - counts.keys():
            self._changed.add(f)
        for f, n in counts.items():
            if self._counts.get(f) != n:
                self._changed.add(f)
        self._counts = dict(counts)

    # -- outputs ---------------------------------------------------------------------------

    def frame(self, now: float) -> dict[str, Any] | None:
        """The delta since the last frame; None when nothing changed."""
        self._expire(now)
        moved = self._moved
        take = list(moved)[:self.frame_objects] if len(moved) > self.frame_objects else list(moved)
        for oid in take:
            del moved[oid]
        if not (take or self._gone or self._changed or self._events):
            return None
        self.frames += 1
        out = {"type": "delta", "t": now, "objects": self._columns(take), "gone": self._gone,
               "counts": {f: self._counts.get(f, 0) for f in sorted(self._changed)},
               "events": [e.to_json() for e in self._events], "events_skipped": self._events_skipped,
               "pending": len(moved), "stats": self.stats(now)}
        self._gone, self._changed, self._events, self._events_skipped = [], set(), [], 0
        return out

    def snapshot(self, now: float, tenant: str | None = None) -> dict[str, Any]:
        """Everything a map needs to start (or to start again after it lost a frame); with
        `tenant`, only what is that tenant's (its most recently seen objects, its recent
        events), names still qualified: `scoped` makes it the tenant's frame."""
        self._expire(now)
        if tenant is None:
            ids = list(self._objects)[-self.snapshot_objects:]  # the most recently seen
            return {"type": "snapshot", "t": now, "objects": self._columns(ids), "counts": dict(self._counts),
                    "events": [e.to_json() for e in self._recent], "stats": self.stats(now)}
        prefix = _prefix(tenant)
        ids = [k for k in self._objects if k.startswith(prefix)][-self.snapshot_objects:]
        return {"type": "snapshot", "t": now, "objects": self._columns(ids),
                "counts": {f: n for f, n in self._counts.items() if f.startswith(prefix)},
                "events": [e.to_json() for e in self._recent_of.get(tenant, ())],
                "stats": self.tenant_stats([tenant])[tenant]}

    def stats(self, now: float) -> dict[str, Any]:
        return {"objects": len(self._objects), "fences_occupied": sum(1 for n in self._counts.values() if n),
                "inside": sum(self._counts.values()),
                "positions_per_s": self._rate(self._positions_in, now),
                "events_per_s": self._rate(self._events_in, now)}

    def tenant_stats(self, tenants: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Each tenant's own figures: its objects on the map, its fences holding someone and how
        many they hold (no rates: those are the platform's)."""
        out: dict[str, dict[str, Any]] = {t: {"objects": self._objects_of.get(t, 0), "fences_occupied": 0,
                                              "inside": 0} for t in tenants}
        if out:
            for f, n in self._counts.items():
                mine = out.get(tenant_of(f))
                if mine is not None and n:
                    mine["fences_occupied"] += 1
                    mine["inside"] += n
        return out

    def position(self, object_id: str) -> tuple[float, float, float] | None:
        got = self._objects.get(object_id)
        return None if got is None else got[:3]

    def __len__(self) -> int:
        return len(self._objects)

    # -- inside ----------------------------------------------------------------------------

    def _columns(self, ids: list[str]) -> dict[str, list[Any]]:
        objs = self._objects
        rows = [objs[i] for i in ids]
        return {"ids": ids, "lon": [r[0] for r in rows], "lat": [r[1] for r in rows]}

    def _expire(self, now: float) -> None:
        objects, cutoff = self._objects, now - self.stale_s
        while objects:
            oid = next(iter(objects))
            if objects[oid][3] >= cutoff:
                break
            del objects[oid]
            self._moved.pop(oid, None)
            self._gone.append(oid)
            tenant = tenant_of(oid)
            left = self._objects_of.get(tenant, 0) - 1
            if left > 0:
                self._objects_of[tenant] = left
            else:
                self._objects_of.pop(tenant, None)

    @staticmethod
    def _rate(window: deque[tuple[float, int]], now: float) -> float:
        while window and window[0][0] < now - RATE_WINDOW_S:
            window.popleft()
        if not window:
            return 0.0
        return round(sum(n for _, n in window) / RATE_WINDOW_S, 1)


# --------------------------------------------------------------------------- a tenant's frames


def _prefix(tenant: str) -> str:
    if not is_tenant(tenant):  # NO_TENANT or a malformed id would match the wrong names
        raise ValueError(f"not a tenant id: {tenant!r}")
    return f"{tenant}{SEP}"


def scoped(frame: Mapping[str, Any], tenant: str, stats: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A frame of MapView (a delta, a snapshot, or a stats heartbeat; names qualified) as
    `tenant`'s map sees it: only the tenant's objects, gone objects, fences' counts and events,
    each named as the tenant names it (unqualified); the platform-wide figures (PLATFORM_ONLY)
    left out; `stats` (the tenant's, `MapView.tenant_stats`) in place of the frame's, which
    are the whole platform's and are dropped when none are given. Pure: the frame is not
    changed. ValueError for a `tenant` that is no tenant id."""
    prefix = _prefix(tenant)
    n = len(prefix)
    out = {k: v for k, v in frame.items()
           if k not in ("objects", "gone", "counts", "events", "stats", *PLATFORM_ONLY)}
    cols = frame.get("objects")
    if cols is not None:
        keep = [i for i, oid in enumerate(cols["ids"]) if oid.startswith(prefix)]
        out["objects"] = {"ids": [cols["ids"][i][n:] for i in keep], "lon": [cols["lon"][i] for i in keep],
                          "lat": [cols["lat"][i] for i in keep]}
    if "gone" in frame:
        out["gone"] = [oid[n:] for oid in frame["gone"] if oid.startswith(prefix)]
    if "counts" in frame:
        out["counts"] = {f[n:]: k for f, k in frame["counts"].items() if f.startswith(prefix)}
    if "events" in frame:  # [event, fence, object, ts, reason]: the fence's tenant and the object's
        out["events"] = [[e[0], e[1][n:], e[2][n:], *e[3:]] for e in frame["events"]
                         if e[1].startswith(prefix) and e[2].startswith(prefix)]
    if stats is not None:
        out["stats"] = dict(stats)
    return out


def has_news(frame: Mapping[str, Any]) -> bool:
    """Whether a (scoped) delta tells a map anything: an object moved or gone, a count, an event."""
    cols = frame.get("objects")
    return bool((cols and cols["ids"]) or frame.get("gone") or frame.get("counts") or frame.get("events"))
