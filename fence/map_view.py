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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

FRAME_EVERY_S = 0.5  # frames per second per map: 2, whatever the load
FRAME_OBJECTS = 2_500  # 5,000 objects a second per map: each of 10,000 moving ones every 2 s
FRAME_EVENTS = 200
SNAPSHOT_OBJECTS = 50_000
RECENT_EVENTS = 50  # events a new map gets in its snapshot
STALE_S = 120.0  # an object not seen this long leaves the map
RATE_WINDOW_S = 10.0
DEGREES = 5  # ~1 m: enough for a map, and the JSON stays short (~35 bytes an object)


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
            out.append(MapEvent(str(e["event"]), str(e["fence_id"]), str(e["object_id"]), float(e["ts"]),
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
            objects[oid] = (x, y, t, now)
            moved.pop(oid, None)
            moved[oid] = None
        self._positions_in.append((now, positions))

    def add_events(self, events: Iterable[MapEvent], seen: int, now: float) -> None:
        """Events for the flashes and the panel; `seen`: how many the feed counted in all (it may
        hand over only a sample of them)."""
        room = self.frame_events - len(self._events)
        taken = 0
        for e in events:
            self._recent.append(e)
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

    def snapshot(self, now: float) -> dict[str, Any]:
        """Everything a map needs to start (or to start again after it lost a frame)."""
        self._expire(now)
        ids = list(self._objects)[-self.snapshot_objects:]  # the most recently seen
        return {"type": "snapshot", "t": now, "objects": self._columns(ids), "counts": dict(self._counts),
                "events": [e.to_json() for e in self._recent], "stats": self.stats(now)}

    def stats(self, now: float) -> dict[str, Any]:
        return {"objects": len(self._objects), "fences_occupied": sum(1 for n in self._counts.values() if n),
                "inside": sum(self._counts.values()),
                "positions_per_s": self._rate(self._positions_in, now),
                "events_per_s": self._rate(self._events_in, now)}

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

    @staticmethod
    def _rate(window: deque[tuple[float, int]], now: float) -> float:
        while window and window[0][0] < now - RATE_WINDOW_S:
            window.popleft()
        if not window:
            return 0.0
        return round(sum(n for _, n in window) / RATE_WINDOW_S, 1)
