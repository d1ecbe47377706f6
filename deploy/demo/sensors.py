"""A seeded simulator of people-counting sensors at venue doors: the ground truth of the tests,
the venue benchmark and the demo.

People arrive by hour of the day and day of the week (a restaurant's lunch and dinner, a bar's
evening, a shop's afternoon), stay a while and leave; the door sensor counts each arrival as
an entry and each departure as an exit, and its firmware does what the real one does
(BRIEF s.5): totals since start-up, wrapping at the firmware's modulus, a report after 5
events (0xFF) or 30 minutes (0x20), an all-zero start-up report (v2: 0x21, counter from 0),
no resend of a lost report, a GPRS clock that can be off. On top, the faults: lost reports,
duplicated deliveries, restarts (events counted since the last report sent are gone with the
device's memory), skewed clocks.

The truth kept per sensor: every event, and those the protocol cannot make known (counted by
the device but lost in its memory at a restart, or in reports lost before one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from zoneinfo import ZoneInfo

import numpy as np

from fence.venues import counting
from fence.venues import sensor_frames as sf

# relative arrival intensity by hour (0-23), by venue kind
PROFILES: dict[str, list[float]] = {
    "restaurant": [0, 0, 0, 0, 0, 0, 0, 0.1, 0.2, 0.2, 0.4, 1.5, 3.0, 2.0, 0.6, 0.3, 0.4, 1.0, 2.5, 3.0, 2.0,
                   0.8, 0.2, 0.05],
    "bar": [0.6, 0.3, 0.1, 0, 0, 0, 0, 0, 0, 0, 0.1, 0.2, 0.4, 0.4, 0.3, 0.4, 0.8, 1.5, 2.2, 2.8, 3.0, 3.0,
            2.5, 1.5],
    "shop": [0, 0, 0, 0, 0, 0, 0, 0, 0.3, 1.0, 1.6, 1.8, 1.7, 1.6, 1.8, 2.2, 2.4, 2.4, 2.0, 1.2, 0.2, 0,
             0, 0],
}
PROFILES["steady"] = [1.0] * 24  # the live demo: the same all day
WEEKDAY = [0.9, 0.9, 1.0, 1.0, 1.2, 1.5, 0.8]  # Monday .. Sunday


@dataclass
class Faults:
    loss: float = 0.0  # probability that a report is lost (never resent)
    duplicate: float = 0.0  # probability that a delivered report is delivered twice
    restarts_per_day: float = 0.0
    lose_startup: float = 0.0  # probability that a restart's start-up report is lost too
    skew_s: float = 0.0  # the device clock's offset (GPRS time gone wrong)


@dataclass
class Sent:
    """One frame as the platform receives it."""

    sensor_id: str
    topic: str  # "counter" (legacy) or "v2/counter"
    frame: bytes
    received_at: float


@dataclass
class Truth:
    entries: int = 0
    exits: int = 0
    unknowable_in: int = 0  # counted by the device, then lost at a restart before being reported
    unknowable_out: int = 0
    unreported_in: int = 0  # counted after the last report the platform received, at the end
    unreported_out: int = 0
    restarts: int = 0
    lost_reports: int = 0
    lost_startups: int = 0  # start-up reports lost after a restart (counting.py: not always knowable)
    events: list[tuple[float, int]] = field(default_factory=list)  # (instant, 1 entry / 0 exit)


@dataclass
class SimSensor:
    sensor_id: str
    kind: str
    version: int = 1  # 1 legacy, 2 v2
    byte_order: str = "little"
    modulus: int = counting.OBSERVED_MODULUS
    tz: str = "Europe/Vaduz"
    scale: float = 30.0  # arrivals per hour at intensity 1
    faults: Faults = field(default_factory=Faults)
    stay_s: tuple[float, float] = (300.0, 5400.0)  # how long a guest stays (uniform)


def _local(instant: float, offset_s: float) -> tuple[int, int, int, int, int, int]:
    d = datetime.fromtimestamp(instant + offset_s, UTC)
    return d.year, d.month, d.day, d.hour, d.minute, d.second


def tz_offset_s(tz: str, instant: float) -> float:
    """The zone's offset from UTC at `instant` (seconds; zones change on the hour)."""
    return _offset_at_hour(tz, math.floor(instant / 3600.0))


@lru_cache(maxsize=65536)
def _offset_at_hour(tz: str, hour: int) -> float:
    off = datetime.fromtimestamp(hour * 3600.0, ZoneInfo(tz)).utcoffset()
    return off.total_seconds() if off is not None else 0.0


def simulate(sensor: SimSensor, start: float, hours: float, seed: int) -> tuple[list[Sent], Truth]:
    """The frames the platform receives from `sensor` over `hours` from `start` (UTC seconds;
    the sensor powers on at `start`), and the truth."""
    rng = np.random.default_rng(seed)
    truth = Truth()
    end = start + hours * 3600.0
    # arrivals: a Poisson process by hour; each person stays 5-90 minutes (exits after `end` are not seen)
    t, arrivals = start, []
    while t < end:
        hour_start = math.floor(t / 3600.0) * 3600.0
        local = datetime.fromtimestamp(t + tz_offset_s(sensor.tz, t), UTC)
        rate = PROFILES[sensor.kind][local.hour] * WEEKDAY[local.weekday()] * sensor.scale / 3600.0
        nxt = min(hour_start + 3600.0, end)
        if rate > 0:
            k = rng.poisson(rate * (nxt - t))
            arrivals += sorted(rng.uniform(t, nxt, k).tolist())
        t = nxt
    stays = rng.uniform(*sensor.stay_s, len(arrivals)).tolist()
    events = sorted([(a, 1) for a in arrivals] + [(a + s, 0) for a, s in zip(arrivals, stays, strict=True)
                                                   if a + s < end])
    n_restarts = rng.poisson(sensor.faults.restarts_per_day * hours / 24.0)
    restarts = sorted(rng.uniform(min(start + 60.0, end), end, n_restarts).tolist())
    out: list[Sent] = []
    dev = _Device(sensor, rng, out, truth)
    dev.send(start, sf.REPORT_STARTUP if sensor.version == 2 else sf.REPORT_EVENTS, startup=True)
    e_i = r_i = 0
    while True:
        next_event = events[e_i][0] if e_i < len(events) else math.inf
        next_restart = restarts[r_i] if r_i < len(restarts) else math.inf
        at = min(next_event, next_restart, dev.last_send + 1800.0)
        if at >= end:
            break
        if at == next_restart:
            r_i += 1
            dev.restart(at)
        elif at == next_event:
            kind = events[e_i][1]
            e_i += 1
            truth.events.append((at, kind))
            dev.count(at, kind)
        else:
            dev.send(at, sf.REPORT_TIMEOUT)
    truth.unreported_in, truth.unreported_out = dev.pend_in, dev.pend_out
    return out, truth


class _Device:
    """The firmware: totals since start-up (mod modulus), a report every 5 events or 30
    minutes; and what the platform receives of it."""

    def __init__(self, sensor: SimSensor, rng: np.random.Generator, out: list[Sent], truth: Truth) -> None:
        self.s, self.rng, self.out, self.truth = sensor, rng, out, truth
        self.tot_in = self.tot_out = 0
        self.pend_in = self.pend_out = 0  # counted since the last report the platform received
        self.counter = 0
        self.last_send = -math.inf
        self.since_send = 0
        self.received = False  # the platform got a report from it
        self.last_received = -math.inf
        self.topic = "counter" if sensor.version == 1 else "v2/counter"

    def count(self, at: float, kind: int) -> None:
        if kind:
            self.tot_in = (self.tot_in + 1) % self.s.modulus
            self.pend_in += 1
        else:
            self.tot_out = (self.tot_out + 1) % self.s.modulus
            self.pend_out += 1
        self.since_send += 1
        if self.since_send >= counting.EVENTS_PER_REPORT:
            self.send(at, sf.REPORT_EVENTS)

    def restart(self, at: float) -> None:
        # the device forgets: what it counted since the last report received is unknowable
        self.truth.unknowable_in += self.pend_in
        self.truth.unknowable_out += self.pend_out
        self.pend_in = self.pend_out = 0
        self.tot_in = self.tot_out = 0
        self.counter = 0
        self.truth.restarts += 1
        self.send(at, sf.REPORT_STARTUP if self.s.version == 2 else sf.REPORT_EVENTS, startup=True)

    def send(self, at: float, report_type: int, startup: bool = False) -> None:
        s, f = self.s, self.s.faults
        offset = tz_offset_s(s.tz, at)
        local = _local(at + f.skew_s, offset)
        if s.version == 1:
            frame = sf.encode_legacy(self.tot_in, self.tot_out, local, report_type, s.byte_order)
        else:
            frame = sf.encode_v2(self.counter, self.tot_in, self.tot_out, local, report_type,
                                 int(offset // 900))
        self.counter += 1
        self.last_send = at
        self.since_send = 0
        if self.rng.random() < (f.lose_startup if startup and self.truth.restarts else f.loss):
            self.truth.lost_reports += 1
            if startup:
                self.truth.lost_startups += 1
            return
        # one MQTT connection, QoS 1, one message in flight: reports arrive in the order sent,
        # and a duplicate (the PUBACK lost, the message sent again) right behind its original
        received_at = max(at + float(self.rng.uniform(0.05, 2.0)), self.last_received + 1e-3)
        self.out.append(Sent(s.sensor_id, self.topic, frame, received_at))
        if self.rng.random() < f.duplicate:
            received_at += 5e-4
            self.out.append(Sent(s.sensor_id, self.topic, frame, received_at))
        self.last_received = received_at
        if self.received:
            self.truth.entries += self.pend_in
            self.truth.exits += self.pend_out
        else:  # the platform's first report is its baseline: what came before is not counted
            self.truth.unknowable_in += self.pend_in
            self.truth.unknowable_out += self.pend_out
        self.received = True
        self.pend_in = self.pend_out = 0
