"""Owner alerts on sensor health (fence/venues/sensor_alerts.py): silent past twice the
reporting interval, low battery with a margin to clear, each raised once while it lasts."""

from __future__ import annotations

from fence.venues import sensor_alerts as sa

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
