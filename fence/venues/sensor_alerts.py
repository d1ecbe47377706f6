"""Owner alerts on sensor health (no I/O): which alerts to raise and which to clear.

- silent: no report for more than SILENT_INTERVALS times the sensor's reporting interval (a
  sensor never heard from counts from when it was registered). Cleared by the next report. A
  report is a counter report or a v2 event report new to the platform (venue_store.py keeps
  `sensor.last_report_at`); `is_silent` is the rule, for the alerts and the owner's view alike.
- low_battery: the last status said less than the sensor's low_battery_mv. Cleared once a
  status says at least low_battery_mv + BATTERY_CLEAR_MV, so a battery hovering at the
  threshold (voltage sags under load) does not raise and clear it every status.

An alert is raised once while its condition lasts (the store keeps at most one open alert per
sensor and kind), and its push goes to the hive owner's devices; the owner's sensor view shows
the open alerts too.
"""

from __future__ import annotations

from dataclasses import dataclass

SILENT, LOW_BATTERY = "silent", "low_battery"
SILENT_INTERVALS = 2
BATTERY_CLEAR_MV = 100


@dataclass(frozen=True)
class SensorHealth:
    sensor_id: str
    hive_id: str
    hive_name: str
    owner_uid: str | None
    report_interval_min: int
    low_battery_mv: int
    registered_at: float
    last_report_at: float | None
    battery_mv: int | None  # of the last status


def _silent_for(h: SensorHealth, now: float) -> float:
    return now - (h.last_report_at if h.last_report_at is not None else h.registered_at)


def is_silent(report_interval_min: int, registered_at: float, last_report_at: float | None,
              now: float) -> bool:
    """No report for more than SILENT_INTERVALS reporting intervals (never heard from: since it
    was registered)."""
    since = last_report_at if last_report_at is not None else registered_at
    return now - since > SILENT_INTERVALS * 60.0 * report_interval_min


def decide(h: SensorHealth, open_kinds: set[str], now: float) -> tuple[list[tuple[str, str]], list[str]]:
    """(alerts to raise as (kind, detail), kinds to clear) for a sensor whose open alerts are
    `open_kinds`."""
    raise_: list[tuple[str, str]] = []
    clear: list[str] = []
    silent = is_silent(h.report_interval_min, h.registered_at, h.last_report_at, now)
    if silent and SILENT not in open_kinds:
        minutes = int(_silent_for(h, now) // 60)
        since = "since it was registered" if h.last_report_at is None else "since its last report"
        raise_.append((SILENT, f"no report for {minutes} min {since} (expected every "
                               f"{h.report_interval_min} min)"))
    elif not silent and SILENT in open_kinds:
        clear.append(SILENT)
    if h.battery_mv is not None:
        if h.battery_mv < h.low_battery_mv and LOW_BATTERY not in open_kinds:
            raise_.append((LOW_BATTERY, f"battery {h.battery_mv} mV (below {h.low_battery_mv} mV)"))
        elif h.battery_mv >= h.low_battery_mv + BATTERY_CLEAR_MV and LOW_BATTERY in open_kinds:
            clear.append(LOW_BATTERY)
    return raise_, clear


def message_text(h: SensorHealth, kind: str, detail: str) -> tuple[str, str]:
    what = "is silent" if kind == SILENT else "has a low battery"
    return f"Sensor {h.sensor_id} at {h.hive_name} {what}", detail
