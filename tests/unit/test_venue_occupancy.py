"""A hive's occupancy (fence/venues/occupancy.py): the business day by time zone and reset
hour, the live figure clamped at zero with the raw one kept, the residual recorded on the
closed day, late counts kept off today's figure; the sensor topics the sidecar accepts; and
the phones of a hive's fence, a tenant's fence seeing that tenant's phones only."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, date, datetime
from typing import Any, cast

import orjson

from exchanges import topology as t
from exchanges.fence_events import Event
from fence.venues.occupancy import HiveOccupancy, business_day
from fence.venues.sidecar import SensorSidecar, frame_of
from tests.unit.fuzz_sidecars import SIDECAR, Exchange, Msg, captured, incoming


def at(y: int, mo: int, d: int, h: int, mi: int = 0) -> float:
    return datetime(y, mo, d, h, mi, tzinfo=UTC).timestamp()


def test_the_business_day_turns_at_the_reset_hour_of_the_hives_zone() -> None:
    # Vaduz is UTC+1 in winter: 02:30 UTC is 03:30 local, still the day before at a 04:00 reset
    assert business_day(at(2026, 1, 10, 2, 30), "Europe/Vaduz", 4) == date(2026, 1, 9)
    assert business_day(at(2026, 1, 10, 3, 0), "Europe/Vaduz", 4) == date(2026, 1, 10)
    assert business_day(at(2026, 7, 10, 2, 0), "Europe/Vaduz", 4) == date(2026, 7, 10)  # UTC+2 in summer
    assert business_day(at(2026, 1, 10, 23, 30), "America/New_York", 0) == date(2026, 1, 10)
    assert business_day(at(2026, 1, 10, 4, 59), "America/New_York", 0) == date(2026, 1, 9)


def test_live_occupancy_is_clamped_and_the_raw_figure_kept() -> None:
    h = HiveOccupancy("h", "UTC", 4, capacity=50)
    assert h.add(at(2026, 1, 10, 12), 3, 0)
    assert h.add(at(2026, 1, 10, 13), 0, 5)  # exits ran ahead: the door missed two people coming in
    s = h.status()
    assert (s["entries"], s["exits"], s["raw"], s["occupancy"], s["percent"]) == (3, 5, -2, 0, 0.0)
    assert not h.add(at(2026, 1, 10, 14), 0, 0)  # nothing counted: nothing moved


def test_the_day_closes_with_its_residual_and_the_next_starts_from_zero() -> None:
    h = HiveOccupancy("h", "UTC", 4)
    h.add(at(2026, 1, 10, 20), 40, 33)  # 7 the sensor never saw leave
    assert h.roll(at(2026, 1, 11, 3, 59)) is False  # not yet
    assert h.roll(at(2026, 1, 11, 4, 0)) is True
    closed = h.take_closed()
    assert [(d.day, d.entries, d.exits, d.raw) for d in closed] == [(date(2026, 1, 10), 40, 33, 7)]
    assert h.status()["occupancy"] == 0 and h.status()["day"] == "2026-01-11"
    # a count of the new day without a roll first closes the old day as well
    h2 = HiveOccupancy("h2", "UTC", 4)
    h2.add(at(2026, 1, 10, 20), 5, 1)
    assert h2.add(at(2026, 1, 11, 9), 2, 0)
    assert [(d.day, d.raw) for d in h2.take_closed()] == [(date(2026, 1, 10), 4)]
    assert (h2.status()["entries"], h2.status()["occupancy"]) == (2, 2)


def test_a_late_count_goes_to_its_own_closed_day() -> None:
    h = HiveOccupancy("h", "UTC", 4)
    h.add(at(2026, 1, 11, 12), 10, 2)
    assert h.add(at(2026, 1, 10, 22), 3, 1) is False  # a sensor's backlog from yesterday evening
    assert (h.status()["entries"], h.status()["exits"]) == (10, 2)
    assert [(d.day, d.entries, d.exits) for d in h.take_closed()] == [(date(2026, 1, 10), 3, 1)]


def test_sensor_topics() -> None:
    f = frame_of("sensors.s-1.v2.counter", b"x", 5.0)
    assert not isinstance(f, str) and (f.sensor_id, f.kind, f.received_at) == ("s-1", "v2/counter", 5.0)
    assert not isinstance(frame_of("sensors.s-1.counter", b"x", 0.0), str)
    assert frame_of("sensors.s-1.v3.counter", b"", 0.0) == \
        "unknown sensor topic kind 'v3/counter' (known: counter, v2/counter, v2/event, v2/status)"
    assert "not a sensor topic" in str(frame_of("positions.s-1", b"", 0.0))
    assert "not a sensor topic" in str(frame_of("positions.acme.s-1", b"", 0.0))
    assert "not a sensor topic" in str(frame_of("sensors..counter", b"", 0.0))


def test_phones_inside_the_fence_by_the_newest_event_of_each() -> None:
    h = HiveOccupancy("h", "UTC", 4, fence_id="f")
    assert h.phone("p1", True, 100.0) and h.phone("p2", True, 101.0)
    assert not h.phone("p1", True, 102.0)  # again inside: no change
    assert h.phone("p1", False, 103.0) and h.app_occupancy == 1
    assert not h.phone("p1", True, 99.0)  # an older ENTER (a late or replayed event) changes nothing
    assert h.app_occupancy == 1 and h.status()["app_occupancy"] == 1
    h.roll(103.0 + h.PHONES_KEPT_S + 1)  # a LEAVE a day old is forgotten
    assert "p1" not in h.phones and "p2" in h.phones


def test_busyness_against_the_usual_figure() -> None:
    from fence.venues.occupancy import busyness

    assert busyness(30, 10.0, 4) == "busier than usual"
    assert busyness(12, 10.0, 4) == "as busy as usual"  # within max(2, 25 %)
    assert busyness(13, 10.0, 4) == "busier than usual"
    assert busyness(2, 1.0, 4) == "as busy as usual"  # a couple of people is no news
    assert busyness(50, 100.0, 4) == "less busy than usual"
    assert busyness(80, 100.0, 4) == "as busy as usual"
    assert busyness(30, 10.0, 0) is None  # no profile yet


def test_the_usual_figure_is_the_business_days_weekday_at_the_local_hour() -> None:
    from fence.venues.occupancy import usual_now

    hours = {f"{w}-{h}": [float(10 * w + h), None, 3] for w in range(1, 8) for h in range(24)}
    profile = {"reset_hour": 4, "as_of": "2026-06-11", "hours": hours}
    # Saturday 13 June 2026, 01:30 in Vaduz (UTC+2): still Friday's business day, hour 1
    sat = datetime(2026, 6, 12, 23, 30, tzinfo=UTC).timestamp()
    got = usual_now(profile, "Europe/Vaduz", sat)
    assert got is not None and (got["weekday"], got["hour"], got["occupancy"]) == (5, 1, 51.0)
    noon = datetime(2026, 6, 13, 10, 0, tzinfo=UTC).timestamp()  # Saturday 12:00
    got = usual_now(profile, "Europe/Vaduz", noon)
    assert got is not None and (got["weekday"], got["hour"], got["samples"]) == (6, 12, 3)
    assert usual_now({"reset_hour": 4, "hours": {}}, "UTC", noon) is None
    assert usual_now({}, "UTC", noon) is None


def _event(fence_id: str, object_id: str, kind: str = "enter", ts: float = 100.0) -> Msg:
    """An event as x-fence publishes it on fence.events (qualified ids in, `tenant` on the wire)."""
    body = orjson.dumps(Event(kind, fence_id, object_id, ts, "entered", f"e-{object_id}").to_json())
    return Msg(body, t.event_routing_key(fence_id, kind, object_id))


def test_a_hives_phones_are_its_fences_tenants_own() -> None:
    """A hive on tenant acme's fence f: acme's phones in it count; another tenant's fence f
    and the platform's f are other fences, whatever their objects are called."""
    sc = SensorSidecar(dataclasses.replace(SIDECAR, role="venue-sensors"))
    sc.dlx, sc.occupancy_x, sc.mqtt_x = (cast(Any, Exchange(n)) for n in ("dead-letters", "venue.occupancy",
                                                                         "amq.topic"))
    sc.hives["h"] = HiveOccupancy("h", "UTC", 4, fence_id="acme:f")

    async def stored(*args: Any) -> int:
        return 0

    sc._store = stored  # type: ignore[method-assign]
    # the binding of the hive's fence gets acme's events of f only
    assert t.event_binding_key("acme:f") == "fence-events.acme.f.*.*"
    msgs = [_event("acme:f", "acme:p1"), _event("other:f", "other:p1"), _event("f", "p1"),
            _event("other:f", "other:p2"), _event("acme:f", "acme:p2"),
            _event("acme:f", "acme:p1", "leave", 101.0)]
    assert [m.routing_key for m in msgs][:3] == [
        "fence-events.acme.f.enter.p1", "fence-events.other.f.enter.p1", "fence-events._.f.enter.p1"]
    with captured() as outs:
        asyncio.run(sc.handle_phones(incoming(msgs)))
    h = sc.hives["h"]
    assert h.phones == {"acme:p1": (False, 101.0), "acme:p2": (True, 100.0)}
    assert h.app_occupancy == 1
    assert not [o for o in outs if o.exchange.name == "dead-letters"]
    assert sorted(o.exchange.name for o in outs) == ["amq.topic", "venue.occupancy"]  # the hive's figure
