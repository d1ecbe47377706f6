"""The sensor sidecar's core (no I/O): a batch of frames in, the counts they carry out.

    frames (sensor id, topic kind, payload, received at)
      -> decoded per kind, vectorised (sensor_frames.py)
      -> device time resolved (legacy: the hive's time zone; v2: the frame's own)
      -> counts derived per sensor, in arrival order (counting.py)
      -> rows for sensor_report, the hives whose occupancy moved, statuses, refusals

Refused (the shell dead-letters them with the reason; the rest of the batch goes on): an
unknown sensor, an unknown topic kind, and every frame sensor_frames refuses.

v2 event reports are one entry or exit each: an event counts once. Its key is the one
sensor_event stores it under (sensor, timestamp, type, distance, slot); an event whose key came
earlier in the batch, or is stored already (the shell asks the store and calls
`Processed.uncount`), is kept as a row but counts nothing (`counted` False): a duplicated frame
(QoS 1 sent again, a broker requeue, `geofence dlq replay`) moves neither the live figure nor
the stored one.

Device time of a legacy report: the hive's wall clock, turned into an instant with its time
zone. In the hour a clock goes back the reading is ambiguous: the first of the two (fold 0),
unless that is before the sensor's last report counted while the second is not and the
totals did not go down (the repeated hour, after the first): then the second (counting.py
takes a report older than the last one as late).

Trade-off: decoding is vectorised per kind; deriving is a loop per report, in arrival order,
because each report's meaning depends on the one before it from the same sensor (a few
microseconds a report: far below the broker's cost per message).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo

from fence.venues import counting
from fence.venues import sensor_frames as sf

COUNTER, V2_COUNTER, V2_EVENT, V2_STATUS = "counter", "v2/counter", "v2/event", "v2/status"
KINDS = (COUNTER, V2_COUNTER, V2_EVENT, V2_STATUS)


@dataclass(frozen=True)
class SensorInfo:
    """What the platform knows of a sensor (table `sensor`)."""

    sensor_id: str
    hive_id: str
    tz: str = "UTC"  # its hive's time zone: legacy frames carry local time without one
    byte_order: str = "little"
    modulus: int = counting.OBSERVED_MODULUS


@dataclass(frozen=True, slots=True)
class Frame:
    sensor_id: str
    kind: str  # one of KINDS (the topic after sensors/<sensor_id>/)
    payload: bytes
    received_at: float


@dataclass(frozen=True, slots=True)
class CountRow:
    """One counter report as stored (sensor_report), with what it counted."""

    index: int  # the frame's place in the batch
    sensor_id: str
    hive_id: str
    version: int
    report_type: int
    total_in: int
    total_out: int
    counter: int
    device_at: float  # the device's instant (UTC), as resolved
    received_at: float
    at: float  # the instant the counts are placed at (counting.py: clock skew)
    entries: int
    exits: int
    rule: str
    gap: int
    lost_reports: int
    unknowable: bool
    skewed: bool
    raw: bytes


@dataclass(frozen=True, slots=True)
class EventRow:
    index: int
    slot: int
    sensor_id: str
    hive_id: str
    event_type: int
    distance_mm: int
    device_ts: int  # the frame's timestamp (UTC seconds)
    at: float  # where it counts (the device's time, or the receive time when skewed)
    received_at: float
    counted: bool = True  # False: a duplicate (earlier in the batch, or stored already)


EventKey = tuple[str, int, int, int, int]


def event_key(e: EventRow) -> EventKey:
    """What sensor_event stores an event under: (sensor, device_ts, event_type, distance_mm, slot)."""
    return (e.sensor_id, e.device_ts, e.event_type, e.distance_mm, e.slot)


@dataclass(frozen=True, slots=True)
class StatusRow:
    index: int
    sensor_id: str
    hive_id: str
    received_at: float
    values: dict[str, int]


@dataclass
class Processed:
    counts: list[CountRow] = field(default_factory=list)
    events: list[EventRow] = field(default_factory=list)
    statuses: list[StatusRow] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)

    def uncount(self, stored: Collection[EventKey]) -> None:
        """The events the store has already (their frame was delivered before): counted no more."""
        if stored:
            self.events = [replace(e, counted=False) if e.counted and event_key(e) in stored else e
                           for e in self.events]

    def counted_events(self) -> list[EventRow]:
        """The entries and exits that count (no status events, no duplicates)."""
        return [e for e in self.events if e.counted and e.event_type in (sf.ENTRY, sf.EXIT)]

    def hives(self) -> dict[str, tuple[int, int]]:
        """Entries and exits per hive in this batch (duplicates, late reports and baselines
        count zero)."""
        out: dict[str, tuple[int, int]] = {}
        for r in self.counts:
            e, x = out.get(r.hive_id, (0, 0))
            out[r.hive_id] = (e + r.entries, x + r.exits)
        for ev in self.counted_events():
            e, x = out.get(ev.hive_id, (0, 0))
            out[ev.hive_id] = (e + (ev.event_type == sf.ENTRY), x + (ev.event_type == sf.EXIT))
        return out


@lru_cache(maxsize=256)
def _zone(tz: str) -> ZoneInfo:
    return ZoneInfo(tz)


def local_to_utc(local_s: float, tz: str, fold: int = 0) -> float:
    """A wall-clock time of zone `tz` (seconds, read as if UTC) as an instant. In the hour a
    clock goes back, the first of the two readings (fold 0) or the second (fold 1)."""
    wall = datetime(1970, 1, 1) + timedelta(seconds=local_s)
    return wall.replace(tzinfo=_zone(tz), fold=fold).timestamp()


def legacy_instant(local_s: float, tz: str, state: counting.SensorCounts, total_in: int, total_out: int,
                   startup: bool) -> float:
    """A legacy report's device time (the module): fold 0, or in the repeated hour fold 1
    when that keeps the sensor's order and its totals did not go down."""
    first = local_to_utc(local_s, tz)
    if first >= state.device_at:
        return first
    second = local_to_utc(local_s, tz, fold=1)
    went_down = total_in < state.total_in or total_out < state.total_out
    if second >= state.device_at and (startup or not went_down):
        return second
    return first


class SensorCore:
    def __init__(self, sensors: Mapping[str, SensorInfo] | None = None) -> None:
        self.sensors: dict[str, SensorInfo] = dict(sensors or {})
        self.state: dict[str, counting.SensorCounts] = {}

    # -- what the store says -------------------------------------------------------------------

    def add_sensor(self, info: SensorInfo) -> None:
        self.sensors[info.sensor_id] = info
        s = self.state.get(info.sensor_id)
        if s is not None and s.modulus < info.modulus:
            s.modulus = info.modulus

    def remove_sensor(self, sensor_id: str) -> None:
        self.sensors.pop(sensor_id, None)
        self.state.pop(sensor_id, None)

    def restore(self, sensor_id: str, counts: dict[str, Any]) -> None:
        self.state[sensor_id] = counting.SensorCounts.from_json(counts)

    def counts_of(self, sensor_id: str) -> counting.SensorCounts:
        s = self.state.get(sensor_id)
        if s is None:
            info = self.sensors[sensor_id]
            s = self.state[sensor_id] = counting.SensorCounts(modulus=info.modulus)
        return s

    # -- a batch -------------------------------------------------------------------------------

    def process(self, frames: Sequence[Frame]) -> Processed:
        out = Processed()
        by_kind: dict[str, list[int]] = {k: [] for k in KINDS}
        for i, f in enumerate(frames):
            if f.sensor_id not in self.sensors:
                out.refused.append((i, f"unknown sensor {f.sensor_id!r}"))
            elif f.kind not in by_kind:
                out.refused.append((i, f"unknown sensor topic {f.kind!r} (known: {', '.join(KINDS)})"))
            else:
                by_kind[f.kind].append(i)
        counters = by_kind[COUNTER] + by_kind[V2_COUNTER]
        if counters:
            counters.sort()
            self._counters(frames, counters, out)
        if by_kind[V2_EVENT]:
            self._events(frames, by_kind[V2_EVENT], out)
        if by_kind[V2_STATUS]:
            self._statuses(frames, by_kind[V2_STATUS], out)
        out.refused.sort()
        return out

    def _counters(self, frames: Sequence[Frame], idx: list[int], out: Processed) -> None:
        infos = [self.sensors[frames[i].sensor_id] for i in idx]
        dec = sf.decode_counters([frames[i].payload for i in idx],
                                 [1 if frames[i].kind == COUNTER else sf.V2 for i in idx],
                                 [info.byte_order for info in infos])
        out.refused += [(idx[j], why) for j, why in dec.refused]
        startup = dec.startup.tolist()
        for k, j in enumerate(dec.index.tolist()):
            i, info = idx[j], infos[j]
            f = frames[i]
            local_s = float(dec.local_s[k])
            version = int(dec.version[k])
            state = self.counts_of(f.sensor_id)
            total_in, total_out = int(dec.total_in[k]), int(dec.total_out[k])
            if version == sf.V2:
                device_at = local_s - int(dec.tz_min[k]) * 60.0
            else:
                device_at = legacy_instant(local_s, info.tz, state, total_in, total_out, bool(startup[k]))
            r = counting.Report(total_in, total_out, device_at, float(f.received_at),
                                bool(startup[k]), int(dec.counter[k]), int(dec.report_type[k]))
            d = counting.derive(state, r)
            out.counts.append(CountRow(i, f.sensor_id, info.hive_id, version, r.report_type, r.total_in,
                                       r.total_out, r.counter, device_at, f.received_at, d.at, d.entries,
                                       d.exits, d.rule, d.gap, d.lost_reports, d.unknowable, d.skewed,
                                       f.payload))

    def _events(self, frames: Sequence[Frame], idx: list[int], out: Processed) -> None:
        dec = sf.decode_events([frames[i].payload for i in idx])
        out.refused += [(idx[j], why) for j, why in dec.refused]
        seen: set[EventKey] = set()
        for j, slot, et, dist, ts in zip(dec.frame.tolist(), dec.slot.tolist(), dec.event_type.tolist(),
                                         dec.distance_mm.tolist(), dec.timestamp.tolist(), strict=True):
            f = frames[idx[j]]
            skewed = abs(ts - f.received_at) > counting.MAX_SKEW_S
            key = (f.sensor_id, ts, et, dist, slot)
            out.events.append(EventRow(idx[j], slot, f.sensor_id, self.sensors[f.sensor_id].hive_id, et, dist,
                                       ts, f.received_at if skewed else float(ts), f.received_at,
                                       counted=key not in seen))
            seen.add(key)

    def _statuses(self, frames: Sequence[Frame], idx: list[int], out: Processed) -> None:
        dec = sf.decode_status([frames[i].payload for i in idx])
        out.refused += [(idx[j], why) for j, why in dec.refused]
        names = sf.STATUS_FIELDS
        for k, j in enumerate(dec.index.tolist()):
            f = frames[idx[j]]
            values = {n: int(getattr(dec, n)[k]) for n in names}
            hive = self.sensors[f.sensor_id].hive_id
            out.statuses.append(StatusRow(idx[j], f.sensor_id, hive, f.received_at, values))

