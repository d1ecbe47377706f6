"""Owner alerts on sensor health (fence/venues/sensor_alerts.py): silent past twice the
reporting interval, low battery with a margin to clear, each raised once while it lasts."""

from __future__ import annotations

from fence.venues import counting
from fence.venues import sensor_alerts as sa
from fence.venues.sensor_core import COUNTER, V2_EVENT, Frame, SensorCore, SensorInfo
from fence.venues.venue_store import last_reports

NOW = 1_790_000_000.0


def health(last_report_ago: float | None = 60.0, battery: int | None = 3700, interval: int = 30,
           registered_ago: float = 86_400.0) -> sa.SensorHealth:
    return sa.SensorHealth("s1", "h1", "The Bar", "owner", interval, 3400, NOW - registered_ago,
                           None if last_report_ago is None else NOW - last_report_ago, battery)


def test_a_healthy_sensor_raises_nothing() -> None:
    assert sa.decide(health(), set(), NOW) == ([], [])


def test_silent_past_twice_the_interval_once_then_cleared_by_a_report() -> None:
    assert sa.decide(health(last_report_ago=3600), set(), NOW) == ([], [])  # exactly 2 x 30 min
    up, down = sa.decide(health(last_report_ago=3601), set(), NOW)
    assert [k for k, _ in up] == [sa.SILENT] and "60 min since its last report" in up[0][1] and down == []
    assert sa.decide(health(last_report_ago=7200), {sa.SILENT}, NOW) == ([], [])  # already open
    assert sa.decide(health(last_report_ago=10), {sa.SILENT}, NOW) == ([], [sa.SILENT])


def test_a_sensor_never_heard_from_counts_from_its_registration() -> None:
    assert sa.decide(health(None, None, registered_ago=600), set(), NOW) == ([], [])
    up, _ = sa.decide(health(None, None, registered_ago=4000), set(), NOW)
    assert up and "since it was registered" in up[0][1]


def test_low_battery_with_a_margin_before_it_clears() -> None:
    up, _ = sa.decide(health(battery=3399), set(), NOW)
    assert up == [(sa.LOW_BATTERY, "battery 3399 mV (below 3400 mV)")]
    assert sa.decide(health(battery=3400), set(), NOW) == ([], [])
    assert sa.decide(health(battery=3450), {sa.LOW_BATTERY}, NOW) == ([], [])  # within the margin
    assert sa.decide(health(battery=3500), {sa.LOW_BATTERY}, NOW) == ([], [sa.LOW_BATTERY])
    assert sa.decide(health(battery=None), {sa.LOW_BATTERY}, NOW) == ([], [])  # no status: unknown


def test_both_at_once_and_the_message() -> None:
    h = health(last_report_ago=5000, battery=3000)
    up, _ = sa.decide(h, set(), NOW)
    assert [k for k, _ in up] == [sa.SILENT, sa.LOW_BATTERY]
    assert sa.message_text(h, sa.SILENT, up[0][1])[0] == "Sensor s1 at The Bar is silent"
    assert sa.message_text(h, sa.LOW_BATTERY, up[1][1])[0] == "Sensor s1 at The Bar has a low battery"


def test_the_owners_view_and_the_alerts_share_the_rule() -> None:
    """Issue 34: a sensor never heard from is not silent a minute after installation (the
    owner's view, owner_store.sensors, said so at once): since its registration, as the alerts."""
    assert not sa.is_silent(30, NOW - 60, None, NOW)
    assert sa.is_silent(30, NOW - 3601, None, NOW) and not sa.is_silent(30, NOW - 3600, None, NOW)
    assert not sa.is_silent(30, NOW - 86_400, NOW - 600, NOW)
    assert sa.is_silent(30, NOW - 86_400, NOW - 3601, NOW)


def test_event_reports_are_reports_and_late_or_duplicate_ones_are_not_news() -> None:
    """Issue 34: last_report_at (what `silent` is judged by) moves with every report new to the
    platform: a counter report, or a v2 event report, not a late or duplicate delivery."""
    core = SensorCore({s: SensorInfo(s, "h1") for s in ("events", "counter")})
    ts = int(NOW) - 10
    frame = bytes.fromhex("01b00400") + ts.to_bytes(4, "little")  # one entry, 1200 mm
    done = core.process([Frame("events", V2_EVENT, frame, NOW), Frame("events", V2_EVENT, frame, NOW + 5)])
    assert last_reports(done.counts, done.events) == {"events": NOW}  # the second: a duplicate
    done.uncount({("events", ts, 1, 1200, 0)})
    assert last_reports(done.counts, done.events) == {}  # stored before: a replay says nothing of now
    legacy = [bytes.fromhex(h) for h in ("0a000a000a000a001a0b1c0a0000ff", "09000a0009000a001a0b1c090000ff")]
    done = core.process([Frame("counter", COUNTER, frame, NOW + k * 9) for k, frame in enumerate(legacy)])
    assert [r.rule for r in done.counts] == [counting.FIRST, counting.LATE]
    assert last_reports(done.counts, done.events) == {"counter": NOW}
