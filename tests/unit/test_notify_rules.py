"""When users are told a place crossed their threshold (fence/venues/notify_rules.py): once per
crossing (hysteresis), a cool-down, quiet hours in the hive's local time, below as well as
above, and each device's FCM budget."""

from __future__ import annotations

from datetime import UTC, datetime, time

from fence.venues import notify_rules as nr

T0 = datetime(2026, 1, 9, 15, 0, tzinfo=UTC).timestamp()  # 16:00 in Vaduz


def above(threshold: int = 40, **kw: object) -> nr.Definition:
    return nr.Definition(1, "u", "h", threshold, "above", **kw)  # type: ignore[arg-type]


def run(d: nr.Definition, counts: list[tuple[float, int]], tz: str = "Europe/Vaduz") -> list[str]:
    state = nr.DefState()
    return [nr.decide(d, state, n, tz, at) for at, n in counts]


def test_once_per_crossing_then_armed_again_past_the_hysteresis() -> None:
    d = above(40)  # hysteresis 4
    got = run(d, [(T0, 30), (T0 + 60, 40), (T0 + 120, 41), (T0 + 180, 38), (T0 + 240, 42),
                  (T0 + 2000, 36), (T0 + 2060, 40)])
    assert got == [nr.NOTHING, nr.SEND, nr.NOTHING, nr.NOTHING, nr.NOTHING, nr.NOTHING, nr.SEND]


def test_a_crossing_in_the_cooldown_waits_and_fires_after_it() -> None:
    d = above(10)  # hysteresis 1
    got = run(d, [(T0, 10), (T0 + 60, 9), (T0 + 120, 11), (T0 + 600, 12), (T0 + nr.COOLDOWN_S + 1, 12)])
    assert got == [nr.SEND, nr.NOTHING, nr.WAIT, nr.WAIT, nr.SEND]


def test_below_mirrors_above() -> None:
    d = nr.Definition(2, "u", "h", 20, "below")
    got = run(d, [(T0, 30), (T0 + 60, 20), (T0 + 120, 21), (T0 + 180, 22), (T0 + 2000, 19)])
    assert got == [nr.NOTHING, nr.SEND, nr.NOTHING, nr.NOTHING, nr.SEND]


def test_quiet_hours_in_local_time_drop_the_crossing() -> None:
    d = above(10, quiet_start=time(22, 0), quiet_end=time(8, 0))
    night = datetime(2026, 1, 9, 22, 30, tzinfo=UTC).timestamp()  # 23:30 in Vaduz
    morning = datetime(2026, 1, 10, 7, 30, tzinfo=UTC).timestamp()  # 08:30 in Vaduz
    assert nr.in_quiet_hours(d, "Europe/Vaduz", night) and not nr.in_quiet_hours(d, "Europe/Vaduz", morning)
    assert nr.in_quiet_hours(d, "UTC", morning - 3600)  # 06:30 UTC: quiet where the hive is UTC
    got = run(d, [(night, 12), (morning, 13), (morning + 60, 8), (morning + 120, 12)])
    assert got == [nr.QUIET, nr.NOTHING, nr.NOTHING, nr.SEND]  # dropped at night, not sent at 8:30


def test_each_device_gets_a_burst_then_one_every_few_minutes() -> None:
    b = nr.TokenBucket()
    assert all(b.take("t", T0) for _ in range(nr.BURST))
    assert not b.take("t", T0 + 1) and b.take("other", T0 + 1)
    assert b.take("t", T0 + nr.REFILL_S + 1) and not b.take("t", T0 + nr.REFILL_S + 2)


def test_the_message_says_what_crossed() -> None:
    title, body = nr.message_text("Café Zürich", 45, 60, above(40))
    assert title == "Café Zürich is getting busy" and body == "45 people there now (75% full), 40 or more."
    title, body = nr.message_text("Bar", 3, None, nr.Definition(1, "u", "h", 5, "below"))
    assert title == "Bar is quiet now" and body == "3 people there now, 5 or fewer."
