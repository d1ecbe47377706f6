"""Presence-sensor frames (BRIEF s.5), decoded a batch at a time with numpy structured dtypes:
one `np.frombuffer` per kind and byte order, checks and conversions on whole columns.

Topics (MQTT `/`, AMQP `.` on amq.topic of gf-ingress), one device user per sensor:

    sensors/<sensor_id>/counter      legacy counter report: a frame of 15..59 bytes whose first
                                     15 carry data (the rest is padding the firmware sends)
    sensors/<sensor_id>/v2/counter   v2 counter report, 15 bytes
    sensors/<sensor_id>/v2/event     one or more 8-byte event reports, back to back
    sensors/<sensor_id>/v2/status    status, 20 bytes
    commands/sensor/<sensor_id>      configuration, 12 bytes (the platform publishes it)

Legacy counter report (byte order: a per-sensor parameter, `sensor.byte_order`, little-endian
unless the firmware says otherwise; every 16-bit field in that order):

    diff_in u16 | diff_out u16 | total_in u16 | total_out u16 | year u8 (21 = 2021) | month u8 |
    day u8 | hour u8 | minute u8 | second u8 | report_type u8

diff_in / diff_out are broken in the firmware (they repeat the totals): decoded, kept in the
raw frame, never used. The date is the hive's local time (no time zone in the frame).

v2 counter report (our layout of the proposed v2; little-endian):

    version u8 (2) | counter u16 (message counter, +1 per report, wraps at 65536) | total_in u16 |
    total_out u16 | year u8 | month u8 | day u8 | hour u8 | minute u8 | second u8 |
    report_type u8 | tz i8 (the local time's offset from UTC in quarter hours: +4 = UTC+01:00)

report_type: 0xFF five events counted, 0x20 the 30-minute timeout, 0x21 start-up (v2; a legacy
start-up report is the one whose totals are all zero).

v2 event report (8 bytes, little-endian): event_type u8 (0 exit, 1 entry, 2 status) |
distance_mm u16 | reserved u8 | timestamp u32 (UTC seconds).

v2 status (20 bytes, little-endian): startup_time u32 (UTC seconds) | battery u16 (mV) |
sensor_state u16 | discarded_events u16 | gprs_signal u16 | firmware_version u32 |
configuration_id u32.

Configuration (12 bytes, little-endian, platform -> sensor): threshold_cm u16 |
reporting_interval_min u16 | status_interval_min u16 | event_threshold u16 | configuration_id u32.

A frame that cannot be decoded is refused with its reason (the shell dead-letters it); the
others of the batch go on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

LEGACY_DATA_BYTES = 15
LEGACY_MAX_FRAME = 59
V2_COUNTER_BYTES = 15
EVENT_BYTES = 8
STATUS_BYTES = 20
CONFIG_BYTES = 12
V2 = 2

REPORT_EVENTS = 0xFF  # five events counted
REPORT_TIMEOUT = 0x20  # the 30-minute timeout
REPORT_STARTUP = 0x21  # v2 start-up
REPORT_TYPES = (REPORT_EVENTS, REPORT_TIMEOUT, REPORT_STARTUP)
EXIT, ENTRY, STATUS_EVENT = 0, 1, 2

BYTE_ORDERS = ("little", "big")


def _legacy_dtype(order: str) -> np.dtype[np.void]:
    e = "<" if order == "little" else ">"
    return np.dtype([("diff_in", e + "u2"), ("diff_out", e + "u2"), ("total_in", e + "u2"),
                     ("total_out", e + "u2"), ("year", "u1"), ("month", "u1"), ("day", "u1"),
                     ("hour", "u1"), ("minute", "u1"), ("second", "u1"), ("report_type", "u1")])


LEGACY = {order: _legacy_dtype(order) for order in BYTE_ORDERS}
V2_COUNTER = np.dtype([("version", "u1"), ("counter", "<u2"), ("total_in", "<u2"), ("total_out", "<u2"),
                       ("year", "u1"), ("month", "u1"), ("day", "u1"), ("hour", "u1"), ("minute", "u1"),
                       ("second", "u1"), ("report_type", "u1"), ("tz", "i1")])
EVENT = np.dtype([("event_type", "u1"), ("distance_mm", "<u2"), ("reserved", "u1"), ("timestamp", "<u4")])
STATUS = np.dtype([("startup_time", "<u4"), ("battery", "<u2"), ("sensor_state", "<u2"),
                   ("discarded_events", "<u2"), ("gprs_signal", "<u2"), ("firmware_version", "<u4"),
                   ("configuration_id", "<u4")])
CONFIG = np.dtype([("threshold_cm", "<u2"), ("reporting_interval_min", "<u2"), ("status_interval_min", "<u2"),
                   ("event_threshold", "<u2"), ("configuration_id", "<u4")])
assert LEGACY["little"].itemsize == LEGACY_DATA_BYTES and V2_COUNTER.itemsize == V2_COUNTER_BYTES
assert EVENT.itemsize == EVENT_BYTES and STATUS.itemsize == STATUS_BYTES and CONFIG.itemsize == CONFIG_BYTES
STATUS_FIELDS: tuple[str, ...] = STATUS.names or ()
CONFIG_FIELDS: tuple[str, ...] = CONFIG.names or ()

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

# A device date outside these years is impossible for this platform (the firmware's year is
# two digits: 21 = 2021).
MIN_YEAR, MAX_YEAR = 20, 99


@dataclass
class CounterReports:
    """Decoded counter reports, one row per accepted frame (`index`: its place in the input).
    `local_s` is the device's date read as if it were UTC (seconds): the local wall time; the
    caller turns it into an instant with the time zone (v2: `tz_min`; legacy: the hive's)."""

    index: I64
    total_in: I64
    total_out: I64
    report_type: I64
    local_s: F64
    counter: I64  # the v2 message counter; -1 for legacy reports
    tz_min: I64  # v2: the offset from UTC in minutes; legacy: 0 (unknown: the hive's zone applies)
    version: I64  # 1 legacy, 2 v2
    refused: list[tuple[int, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.index.size)

    @property
    def startup(self) -> npt.NDArray[np.bool_]:
        """A start-up report: 0x21 (v2), or every total zero (legacy)."""
        out: npt.NDArray[np.bool_] = (self.report_type == REPORT_STARTUP) | (
            (self.version == 1) & (self.total_in == 0) & (self.total_out == 0))
        return out


@dataclass
class EventReports:
    """Decoded v2 event reports: `frame` is the input frame each came from (a frame may carry
    several), `slot` its place in that frame."""

    frame: I64
    slot: I64
    event_type: I64
    distance_mm: I64
    timestamp: I64
    refused: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class StatusReports:
    index: I64
    startup_time: I64
    battery: I64
    sensor_state: I64
    discarded_events: I64
    gprs_signal: I64
    firmware_version: I64
    configuration_id: I64
    refused: list[tuple[int, str]] = field(default_factory=list)


def _sizes(frames: Sequence[bytes]) -> I64:
    return np.fromiter(map(len, frames), np.int64, len(frames))


def _local_seconds(rows: np.ndarray) -> tuple[F64, npt.NDArray[np.bool_]]:
    """The date fields as seconds since 1970 of the wall clock, and which rows are real dates
    (month 1-12, a day the month has, hour < 24, minute and second < 60)."""
    year = rows["year"].astype(np.int64)
    month = rows["month"].astype(np.int64)
    day = rows["day"].astype(np.int64)
    ok = ((year >= MIN_YEAR) & (year <= MAX_YEAR) & (month >= 1) & (month <= 12) & (day >= 1)
          & (rows["hour"] < 24) & (rows["minute"] < 60) & (rows["second"] < 60))
    months = (2000 + year - 1970) * 12 + np.clip(month, 1, 12) - 1
    first = months.astype("datetime64[M]").astype("datetime64[D]")
    after = (months + 1).astype("datetime64[M]").astype("datetime64[D]")
    ok &= day <= (after - first).astype(np.int64)
    days = first.astype(np.int64) + day - 1
    seconds = (days * 86400 + rows["hour"].astype(np.int64) * 3600 + rows["minute"].astype(np.int64) * 60
               + rows["second"].astype(np.int64))
    return seconds.astype(np.float64), ok


def _join(frames: Sequence[bytes], take: I64, width: int) -> bytes:
    return b"".join([frames[i][:width] for i in take.tolist()])


def decode_counters(frames: Sequence[bytes], versions: Sequence[int],
                    byte_orders: Sequence[str]) -> CounterReports:
    """Counter reports: frame i is legacy (versions[i] == 1, in byte_orders[i]) or v2."""
    n = len(frames)
    sizes = _sizes(frames)
    ver = np.fromiter(versions, np.int64, n)
    refused: list[tuple[int, str]] = []
    parts: list[dict[str, np.ndarray]] = []
    for order in BYTE_ORDERS:
        legacy = np.flatnonzero((ver == 1) & np.fromiter((o == order for o in byte_orders), bool, n))
        if legacy.size:
            fits = (sizes[legacy] >= LEGACY_DATA_BYTES) & (sizes[legacy] <= LEGACY_MAX_FRAME)
            for i in legacy[~fits].tolist():
                refused.append((i, f"legacy counter report of {sizes[i]} bytes (15 to 59 expected)"))
            take = legacy[fits]
            rows = np.frombuffer(_join(frames, take, LEGACY_DATA_BYTES), LEGACY[order])
            parts.append(_counter_columns(take, rows, 1, refused))
    v2 = np.flatnonzero(ver == V2)
    if v2.size:
        fits = sizes[v2] == V2_COUNTER_BYTES
        for i in v2[~fits].tolist():
            refused.append((i, f"v2 counter report of {sizes[i]} bytes ({V2_COUNTER_BYTES} expected)"))
        take = v2[fits]
        rows = np.frombuffer(_join(frames, take, V2_COUNTER_BYTES), V2_COUNTER)
        parts.append(_counter_columns(take, rows, V2, refused))
    for i in np.flatnonzero((ver != 1) & (ver != V2)).tolist():
        refused.append((i, f"unknown counter report version {ver[i]}"))
    if not parts:
        e = np.empty(0, np.int64)
        return CounterReports(e, e, e, e, np.empty(0), e, e, e, sorted(refused))
    cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order_ = np.argsort(cols["index"], kind="stable")
    return CounterReports(**{k: v[order_] for k, v in cols.items()}, refused=sorted(refused))


def _counter_columns(take: I64, rows: np.ndarray, version: int,
                     refused: list[tuple[int, str]]) -> dict[str, np.ndarray]:
    local_s, ok = _local_seconds(rows)
    rt = rows["report_type"].astype(np.int64)
    known = np.isin(rt, REPORT_TYPES if version == V2 else (REPORT_EVENTS, REPORT_TIMEOUT))
    if version == V2:
        ok_version = rows["version"] == V2
        tz = rows["tz"].astype(np.int64)
        ok_tz = (tz >= -48) & (tz <= 56)  # UTC-12:00 .. UTC+14:00
        counter = rows["counter"].astype(np.int64)
    else:
        ok_version = np.ones(take.size, bool)
        tz = np.zeros(take.size, np.int64)
        ok_tz = ok_version
        counter = np.full(take.size, -1, np.int64)
    good = ok & known & ok_version & ok_tz
    for j in np.flatnonzero(~good).tolist():
        r = rows[j]
        if not ok_version[j]:
            why = f"v2 counter report with version byte {int(r['version'])}"
        elif not ok[j]:
            why = (f"impossible date {int(r['year']):02d}-{int(r['month']):02d}-{int(r['day']):02d} "
                   f"{int(r['hour']):02d}:{int(r['minute']):02d}:{int(r['second']):02d}")
        elif not known[j]:
            why = f"unknown report type 0x{int(r['report_type']):02X}"
        else:
            why = f"time zone offset {int(r['tz'])} quarter hours out of range"
        refused.append((int(take[j]), why))
    return {"index": take[good], "total_in": rows["total_in"][good].astype(np.int64),
            "total_out": rows["total_out"][good].astype(np.int64), "report_type": rt[good],
            "local_s": local_s[good], "counter": counter[good], "tz_min": tz[good] * 15,
            "version": np.full(int(good.sum()), version, np.int64)}


def decode_events(frames: Sequence[bytes]) -> EventReports:
    """v2 event reports: each frame a whole number (>= 1) of 8-byte reports."""
    sizes = _sizes(frames)
    fits = (sizes > 0) & (sizes % EVENT_BYTES == 0)
    refused = [(i, f"event frame of {sizes[i]} bytes (a multiple of {EVENT_BYTES} expected)")
               for i in np.flatnonzero(~fits).tolist()]
    take = np.flatnonzero(fits)
    rows = np.frombuffer(b"".join([frames[i] for i in take.tolist()]), EVENT)
    counts = sizes[take] // EVENT_BYTES
    frame = np.repeat(take, counts)
    slot = np.arange(frame.size) - np.repeat(np.cumsum(counts) - counts, counts)
    et = rows["event_type"].astype(np.int64)
    good = et <= STATUS_EVENT
    bad_frames = np.unique(frame[~good])
    for i in bad_frames.tolist():
        k = int(np.flatnonzero((frame == i) & ~good)[0])
        refused.append((i, f"unknown event type {et[k]} (slot {slot[k]})"))
    keep = ~np.isin(frame, bad_frames)  # a frame is refused whole: nothing of it is half-applied
    return EventReports(frame[keep], slot[keep], et[keep], rows["distance_mm"][keep].astype(np.int64),
                        rows["timestamp"][keep].astype(np.int64), sorted(refused))


def decode_status(frames: Sequence[bytes]) -> StatusReports:
    sizes = _sizes(frames)
    fits = sizes == STATUS_BYTES
    refused = [(i, f"status of {sizes[i]} bytes ({STATUS_BYTES} expected)")
               for i in np.flatnonzero(~fits).tolist()]
    take = np.flatnonzero(fits)
    rows = np.frombuffer(b"".join([frames[i] for i in take.tolist()]), STATUS)
    cols = {name: rows[name].astype(np.int64) for name in STATUS_FIELDS}
    return StatusReports(take, refused=refused, **cols)


@dataclass(frozen=True)
class SensorConfig:
    """What the platform sends a sensor on commands/sensor/<sensor_id>."""

    threshold_cm: int
    reporting_interval_min: int
    status_interval_min: int
    event_threshold: int
    configuration_id: int

    def __post_init__(self) -> None:
        for name in CONFIG_FIELDS:
            v = getattr(self, name)
            top = 0xFFFFFFFF if name == "configuration_id" else 0xFFFF
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= top:
                raise ValueError(f"{name} must be an integer in [0, {top}], not {v!r}")
        if self.reporting_interval_min < 1 or self.status_interval_min < 1 or self.event_threshold < 1:
            raise ValueError("reporting_interval_min, status_interval_min and event_threshold must be >= 1")

    def encode(self) -> bytes:
        row = np.zeros(1, CONFIG)
        for name in CONFIG_FIELDS:
            row[name] = getattr(self, name)
        return row.tobytes()

    @classmethod
    def decode(cls, frame: bytes) -> SensorConfig:
        if len(frame) != CONFIG_BYTES:
            raise ValueError(f"configuration of {len(frame)} bytes ({CONFIG_BYTES} expected)")
        row = np.frombuffer(frame, CONFIG)[0]
        return cls(**{name: int(row[name]) for name in CONFIG_FIELDS})


def encode_legacy(total_in: int, total_out: int, local: tuple[int, int, int, int, int, int], report_type: int,
                  byte_order: str = "little", frame_bytes: int = LEGACY_MAX_FRAME) -> bytes:
    """A legacy counter report as the firmware sends it (diff fields repeating the totals, as
    the broken firmware does; padded with zeros to `frame_bytes`). For the simulator and tests."""
    row = np.zeros(1, LEGACY[byte_order])
    year, month, day, hour, minute, second = local
    for k, v in (("diff_in", total_in), ("diff_out", total_out), ("total_in", total_in),
                 ("total_out", total_out), ("year", year % 100), ("month", month), ("day", day),
                 ("hour", hour), ("minute", minute), ("second", second), ("report_type", report_type)):
        row[k] = v
    return row.tobytes().ljust(frame_bytes, b"\0")


def encode_v2(counter: int, total_in: int, total_out: int, local: tuple[int, int, int, int, int, int],
              report_type: int, tz_quarters: int) -> bytes:
    row = np.zeros(1, V2_COUNTER)
    year, month, day, hour, minute, second = local
    for k, v in (("version", V2), ("counter", counter % 65536), ("total_in", total_in),
                 ("total_out", total_out), ("year", year % 100), ("month", month), ("day", day),
                 ("hour", hour), ("minute", minute), ("second", second), ("report_type", report_type),
                 ("tz", tz_quarters)):
        row[k] = v
    return row.tobytes()


def encode_events(rows: Sequence[tuple[int, int, int]]) -> bytes:
    """(event_type, distance_mm, timestamp) reports back to back."""
    out = np.zeros(len(rows), EVENT)
    for j, (et, dist, ts) in enumerate(rows):
        out[j] = (et, dist, 0, ts)
    return out.tobytes()


def encode_status(startup_time: int, battery: int, sensor_state: int, discarded_events: int, gprs_signal: int,
                  firmware_version: int, configuration_id: int) -> bytes:
    row = np.zeros(1, STATUS)
    row[0] = (startup_time, battery, sensor_state, discarded_events, gprs_signal, firmware_version,
              configuration_id)
    return row.tobytes()
