"""A hive's occupancy from its sensors' counts (no I/O).

Occupancy = entries - exits since the hive's daily reset (`reset_hour` in its time zone:
04:00 by default, after the last guests of a bar and before the first of a bakery, as
people-counting products do). The day a count belongs to is the local date of (its instant
- reset_hour): a report at 02:00 belongs to the day before.

Shown live clamped at zero (exits run ahead of entries when a door sensor misses people coming
in); the raw difference is kept beside it. At the end of the day the figure is corrected:
whatever is left (`residual` = entries - exits at the reset, people the sensor missed going
out, or entries it counted twice) is recorded on the closed day and the next day starts from
zero; the raw entries and exits stay as counted.

A count for a day already closed (a late report, a sensor's backlog after an outage) goes to
that day's record, never to today's live figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo

from exchanges.wire_schemas import SCHEMA_VERSION


@lru_cache(maxsize=256)
def _zone(tz: str) -> ZoneInfo:
    return ZoneInfo(tz)


def business_day(at: float, tz: str, reset_hour: int) -> date:
    """The day an instant counts for at a hive whose day starts at `reset_hour` local time."""
    local = datetime.fromtimestamp(at, UTC).astimezone(_zone(tz))
    return (local - timedelta(hours=reset_hour)).date()


@dataclass
class DayCounts:
    day: date
    entries: int = 0
    exits: int = 0

    @property
    def raw(self) -> int:
        return self.entries - self.exits

    @property
    def occupancy(self) -> int:
        return max(0, self.raw)


@dataclass
class HiveOccupancy:
    hive_id: str
    tz: str = "UTC"
    reset_hour: int = 4
    capacity: int | None = None
    today: DayCounts | None = None
    fence_id: str | None = None  # its polygon in the fence store (phones inside: `phones`)
    closed: dict[date, DayCounts] = field(default_factory=dict)  # days changed since the last take
    # app users' phones (our own ENTER / LEAVE events of the hive's fence): object -> (inside,
    # the time of the event that said so); an event older than the one known changes nothing
    phones: dict[str, tuple[bool, float]] = field(default_factory=dict)

    @property
    def app_occupancy(self) -> int:
        return sum(1 for inside, _ in self.phones.values() if inside)

    def phone(self, object_id: str, inside: bool, ts: float) -> bool:
        """An ENTER (inside) or LEAVE of the hive's fence; True when the app figure changed."""
        known = self.phones.get(object_id)
        if known is not None and ts < known[1]:
            return False
        before = self.app_occupancy
        if inside:
            self.phones[object_id] = (True, ts)
        else:
            self.phones[object_id] = (False, ts)
        return self.app_occupancy != before

    def add(self, at: float, entries: int, exits: int) -> bool:
        """Counts at an instant; True when the live figure (today's) changed."""
        if not entries and not exits:
            return False
        day = business_day(at, self.tz, self.reset_hour)
        if self.today is None or day > self.today.day:
            if self.today is not None:
                self.closed[self.today.day] = self.today  # the residual stays on the closed day
            self.today = DayCounts(day)
        if day < self.today.day:
            past = self.closed.setdefault(day, DayCounts(day))
            past.entries += entries
            past.exits += exits
            return False
        self.today.entries += entries
        self.today.exits += exits
        return True

    def touch(self, now: float) -> None:
        """Today exists (a hive whose first figure is the app's, before any sensor count)."""
        if self.today is None:
            self.today = DayCounts(business_day(now, self.tz, self.reset_hour))

    PHONES_KEPT_S = 86_400.0  # a phone's LEAVE is remembered this long (late events of it)

    def roll(self, now: float) -> bool:
        """At `now`: if the day turned, close today (its residual recorded) and start from zero.
        True when the live figure changed."""
        gone = [o for o, (inside, ts) in self.phones.items() if not inside and ts < now - self.PHONES_KEPT_S]
        for oid in gone:
            del self.phones[oid]
        day = business_day(now, self.tz, self.reset_hour)
        if self.today is None or day <= self.today.day:
            return False
        self.closed[self.today.day] = self.today
        changed = self.today.occupancy != 0
        self.today = DayCounts(day)
        return changed

    def take_closed(self) -> list[DayCounts]:
        out = sorted(self.closed.values(), key=lambda d: d.day)
        self.closed.clear()
        return out

    def status(self) -> dict[str, object]:
        d = self.today
        return {"hive_id": self.hive_id, "day": d.day.isoformat() if d else None,
                "entries": d.entries if d else 0, "exits": d.exits if d else 0,
                "occupancy": d.occupancy if d else 0, "raw": d.raw if d else 0,
                "capacity": self.capacity, "app_occupancy": self.app_occupancy,
                "percent": round(100.0 * d.occupancy / self.capacity, 1) if d and self.capacity else None}


def occupancy_message(h: HiveOccupancy, at: float) -> dict[str, object]:
    """What the sensor sidecar publishes when a hive's counts change
    (exchanges/schemas/hive-occupancy.schema.json)."""
    return {"schema": SCHEMA_VERSION, **h.status(), "at": at, "source": "sensors"}


BUSY_MARGIN = (2.0, 0.25)  # people, share of the usual figure: whichever is larger


def busyness(occupancy: float, usual: float, samples: int) -> str | None:
    """How the live figure compares with the usual one for this weekday and hour (the nightly
    profile, spark_jobs/venue_core.py), as "popular times" says it: 'busier than usual' when
    it is above by more than max(2 people, 25 %), 'less busy than usual' when below by as
    much, else 'as busy as usual'; None without a profile."""
    if samples <= 0:
        return None
    margin = max(BUSY_MARGIN[0], BUSY_MARGIN[1] * usual)
    if occupancy >= usual + margin:
        return "busier than usual"
    if occupancy <= usual - margin:
        return "less busy than usual"
    return "as busy as usual"


def usual_now(profile: dict[str, Any], tz: str, now: float) -> dict[str, Any] | None:
    """The profile's figure for the business day's weekday and the local hour at `now`.
    `profile`: {"reset_hour": h, "as_of": "YYYY-MM-DD", "hours": {"<weekday>-<hour>":
    [occupancy, phones, samples]}} as reads.py caches it."""
    hours = profile.get("hours")
    reset_hour = profile.get("reset_hour")
    if not isinstance(hours, dict) or not isinstance(reset_hour, int):
        return None
    local = datetime.fromtimestamp(now, UTC).astimezone(_zone(tz))
    weekday = business_day(now, tz, reset_hour).isoweekday()
    got = hours.get(f"{weekday}-{local.hour}")
    if not got:
        return None
    occupancy, phones, samples = got
    return {"occupancy": round(float(occupancy), 1),
            "phones": None if phones is None else round(float(phones), 1),
            "samples": int(samples), "as_of": profile.get("as_of"), "weekday": weekday, "hour": local.hour}
