"""Entries and exits from sensor totals (fence/venues/counting.py): each rule on its own, then
random simulated days (deploy/demo/sensors.py, the ground truth) with wraps, restarts, lost
and duplicated reports and skewed clocks: the counts equal the truth wherever the protocol
makes it knowable, and what it does not is accounted for."""

from __future__ import annotations

import random

import pytest

from deploy.demo.sensors import Faults, SimSensor, simulate
from fence.venues import counting as c
from fence.venues.sensor_core import CountRow, Frame, SensorCore, SensorInfo

T0 = 1_790_000_000.0


def feed(reports: list[c.Report], modulus: int = c.OBSERVED_MODULUS
         ) -> tuple[list[c.Derived], c.SensorCounts]:
    state = c.SensorCounts(modulus=modulus)
    return [c.derive(state, r) for r in reports], state


def legacy(tin: int, tout: int, at: float, rt: int = 0xFF) -> c.Report:
    return c.Report(tin, tout, T0 + at, T0 + at + 0.5, tin == tout == 0, -1, rt)


def v2(counter: int, tin: int, tout: int, at: float, startup: bool = False) -> c.Report:
    return c.Report(tin, tout, T0 + at, T0 + at + 0.5, startup, counter, 0x21 if startup else 0xFF)


def rules(ds: list[c.Derived]) -> list[tuple[str, int, int]]:
    return [(d.rule, d.entries, d.exits) for d in ds]


def totals(rows: list[CountRow]) -> tuple[int, int]:
    return sum(r.entries for r in rows), sum(r.exits for r in rows)


def test_the_first_report_is_a_baseline_then_differences_count() -> None:
    ds, s = feed([legacy(100, 90, 0), legacy(103, 92, 60), legacy(103, 92, 1800, 0x20),
                  legacy(104, 96, 1900)])
    assert rules(ds) == [(c.FIRST, 0, 0), (c.INCREASE, 3, 2), (c.SAME, 0, 0), (c.INCREASE, 1, 4)]
    assert (s.entries, s.exits, s.reports) == (4, 6, 4)


def test_a_duplicate_counts_once_even_after_later_reports() -> None:
    a, b = legacy(10, 5, 0), legacy(13, 7, 60)
    ds, s = feed([a, b, b, legacy(15, 10, 120), b])
    assert rules(ds) == [(c.FIRST, 0, 0), (c.INCREASE, 3, 2), (c.DUPLICATE, 0, 0), (c.INCREASE, 2, 3),
                         (c.DUPLICATE, 0, 0)]
    assert s.duplicates == 2 and (s.entries, s.exits) == (5, 5)


def test_a_wrap_at_the_observed_modulus() -> None:
    ds, s = feed([legacy(65520, 300, 0), legacy(3, 302, 120)])  # 65520 .. 65523, 0, 1, 2, 3
    assert rules(ds)[1] == (c.WRAP_TIME, 7, 2) and s.wraps == 1


def test_a_total_at_or_above_the_modulus_raises_it_to_the_documented_one() -> None:
    ds, s = feed([legacy(65520, 0, 0), legacy(65530, 0, 30), legacy(4, 0, 60)])
    assert s.modulus == c.DOCUMENTED_MODULUS and s.modulus_raised == 1
    assert rules(ds)[2] == (c.WRAP_TIME, 10, 0)  # 65530 .. 65535, 0 .. 4


def test_a_decrease_too_big_for_a_wrap_in_the_time_between_is_a_restart_whose_startup_was_lost() -> None:
    ds, s = feed([legacy(5000, 4000, 0), legacy(12, 9, 60)])
    assert rules(ds)[1] == (c.RESTART_IMPLAUSIBLE, 12, 9) and ds[1].unknowable and s.restarts == 1
    # the same decrease after long enough for a wrap: 2 events/s in 9 hours covers it
    ds, _ = feed([legacy(65000, 4000, 0), legacy(12, 4001, 9 * 3600)])
    assert rules(ds)[1] == (c.WRAP_TIME, 536, 1)


def test_a_startup_report_restarts_the_count() -> None:
    ds, s = feed([legacy(50, 40, 0), legacy(0, 0, 100), legacy(2, 1, 200), legacy(0, 0, 1900, 0x20)])
    assert rules(ds) == [(c.FIRST, 0, 0), (c.RESTART_STARTUP, 0, 0), (c.INCREASE, 2, 1),
                         (c.RESTART_STARTUP, 0, 0)]
    assert ds[1].unknowable and s.restarts == 2


def test_a_quiet_door_sending_zeros_after_zeros_is_not_restarting() -> None:
    ds, s = feed([legacy(0, 0, 0), legacy(0, 0, 1800, 0x20), legacy(0, 0, 3600, 0x20)])
    assert [d.rule for d in ds] == [c.FIRST, c.SAME, c.SAME] and s.restarts == 0


def test_v2_the_counter_tells_a_wrap_from_a_restart_and_counts_gaps() -> None:
    ds, s = feed([v2(7, 65522, 10, 0), v2(8, 2, 12, 1)])  # the next message: a wrap however far
    assert rules(ds)[1] == (c.WRAP_COUNTER, 4, 2)
    ds, s = feed([v2(500, 3000, 2000, 0), v2(3, 12, 9, 60)])  # the counter went back: a restart
    assert rules(ds)[1] == (c.RESTART_COUNTER, 12, 9) and ds[1].unknowable
    ds, s = feed([v2(10, 100, 100, 0), v2(14, 110, 105, 60), v2(15, 112, 105, 120)])
    assert [d.gap for d in ds] == [0, 3, 0] and s.gaps == 3 and rules(ds)[1] == (c.INCREASE, 10, 5)
    ds, s = feed([v2(10, 100, 100, 0), v2(0, 0, 0, 60, startup=True), v2(1, 3, 1, 120)])
    assert rules(ds)[1:] == [(c.RESTART_STARTUP, 0, 0), (c.INCREASE, 3, 1)] and s.gaps == 0


def test_legacy_lost_reports_are_estimated_from_a_jump() -> None:
    ds, s = feed([legacy(10, 10, 0), legacy(15, 10, 30), legacy(27, 13, 90)])  # 15 events: 2 reports lost
    assert [d.lost_reports for d in ds] == [0, 0, 2] and s.lost_reports == 2


def test_a_skewed_device_clock_gives_way_to_the_receive_time_and_time_never_goes_back() -> None:
    state = c.SensorCounts()
    c.derive(state, c.Report(1, 1, T0, T0, False))
    d = c.derive(state, c.Report(2, 1, T0 + 7200, T0 + 60, False))  # the device is 2 h ahead
    assert d.skewed and d.at == T0 + 60 and state.skewed == 1
    d = c.derive(state, c.Report(3, 1, T0 + 7230, T0 + 90, False))  # still ahead: in order, at its receipt
    assert d.skewed and (d.rule, d.entries, d.at) == (c.INCREASE, 1, T0 + 90) and state.skewed == 2
    # a delivery held up past MAX_SKEW_S is placed at its receive time; the next report, made
    # before that instant but within MAX_SKEW_S of its own receipt, is placed no earlier
    state = c.SensorCounts()
    c.derive(state, c.Report(1, 1, T0, T0, False))
    d = c.derive(state, c.Report(2, 1, T0 + 30, T0 + 400, False))
    assert d.skewed and d.at == T0 + 400
    d = c.derive(state, c.Report(3, 1, T0 + 200, T0 + 401, False))  # 201 s behind: within MAX_SKEW_S
    assert not d.skewed and (d.rule, d.entries) == (c.INCREASE, 1)
    assert d.at == T0 + 400  # not before the previous report's instant


def test_a_device_clock_set_back_makes_its_reports_late_until_it_passes_the_last_time_counted() -> None:
    """The order is the device's (counting.py, "Order"): a clock set back (it was 2 h ahead)
    gives reports older than the last one counted; they count nothing and move nothing, and
    the first report past that time counts the whole difference: no event lost or doubled."""
    state = c.SensorCounts()
    c.derive(state, c.Report(1, 1, T0, T0, False))
    c.derive(state, c.Report(2, 1, T0 + 7200, T0 + 60, False))  # 2 h ahead
    d = c.derive(state, c.Report(3, 1, T0 + 30, T0 + 90, False))  # set right
    assert (d.rule, d.entries, d.exits) == (c.LATE, 0, 0) and state.late == 1
    d = c.derive(state, c.Report(9, 4, T0 + 7260, T0 + 7260, False))
    assert (d.rule, d.entries, d.exits) == (c.INCREASE, 7, 3) and (state.entries, state.exits) == (8, 3)


def test_the_state_survives_a_round_trip() -> None:
    _, s = feed([v2(7, 100, 10, 0), v2(8, 100, 10, 0), v2(9, 104, 11, 10)])
    back = c.SensorCounts.from_json(s.to_json())
    assert back.to_json() == s.to_json()
    assert c.derive(back, v2(9, 104, 11, 10)).rule == c.DUPLICATE  # its memory of recent reports too


FAULTS = {
    "clean": Faults(),
    "lossy": Faults(loss=0.25, duplicate=0.15, restarts_per_day=3.0),
    "skewed": Faults(loss=0.3, duplicate=0.2, restarts_per_day=4.0, skew_s=3600.0),
    "startups lost": Faults(loss=0.1, restarts_per_day=2.0, lose_startup=0.5),
}


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("faults", list(FAULTS))
@pytest.mark.parametrize("seed", range(4))
def test_simulated_days_count_what_the_protocol_makes_knowable(version: int, faults: str, seed: int) -> None:
    busy = seed % 2 == 1  # a busy door wraps its totals within the three days
    sensor = SimSensor("s1", ("restaurant", "bar", "shop")[seed % 3], version=version,
                       modulus=(65524, 65536)[seed % 2], scale=3000.0 if busy else 60.0,
                       faults=FAULTS[faults])
    sent, truth = simulate(sensor, T0, 40.0, seed)
    core = SensorCore({"s1": SensorInfo("s1", "h1", tz=sensor.tz, modulus=c.OBSERVED_MODULUS)})
    got = core.process([Frame(x.sensor_id, x.topic, x.frame, x.received_at) for x in sent])
    assert got.refused == []
    entries, exits = sum(r.entries for r in got.counts), sum(r.exits for r in got.counts)
    assert (entries, exits) == (truth.entries, truth.exits)
    # the truth's own books: every event is counted, unknowable (a restart took it), or not reported yet
    true_in = sum(1 for _, k in truth.events if k)
    assert truth.entries + truth.unknowable_in + truth.unreported_in == true_in
    assert truth.exits + truth.unknowable_out + truth.unreported_out == len(truth.events) - true_in
    state = core.state["s1"]
    if busy and faults == "clean":  # restarts keep the totals from reaching the modulus
        assert state.wraps >= 1 and state.modulus == sensor.modulus
        assert state.modulus_raised == (sensor.modulus == c.DOCUMENTED_MODULUS)
    assert all(type(v) is int for k, v in state.to_json().items() if k not in ("at", "device_at", "recent"))
    if truth.restarts:
        assert state.restarts >= 1 and any(r.unknowable for r in got.counts)
    if FAULTS[faults].skew_s:
        assert state.skewed > 0


def test_a_late_report_counts_nothing_and_moves_nothing() -> None:
    """Issue 34: a report older than the last one counted (a broker requeue, `geofence dlq
    replay`) is `late`: 0 / 0, and the next report is judged against the last one counted."""
    ds, s = feed([legacy(31222, 16, 0), legacy(31221, 12, -1), legacy(31230, 20, 300)])
    assert rules(ds) == [(c.FIRST, 0, 0), (c.LATE, 0, 0), (c.INCREASE, 8, 4)]
    assert (s.late, s.restarts, s.entries, s.exits) == (1, 0, 8, 4)
    # v2: the counter went back with an older device time
    ds, s = feed([v2(3, 2, 13, 0), v2(2, 1, 9, -60), v2(4, 2, 15, 60)])
    assert rules(ds) == [(c.FIRST, 0, 0), (c.LATE, 0, 0), (c.INCREASE, 0, 2)] and s.restarts == 0
    # a start-up report delivered again after its memory (16 reports) is gone: late, no restart
    reports = [v2(0, 0, 0, 0, startup=True)] + [v2(k, k, k, 60.0 * k) for k in range(1, 20)]
    ds, s = feed([*reports, reports[0], v2(20, 25, 20, 1200)])
    assert rules(ds[-2:]) == [(c.LATE, 0, 0), (c.INCREASE, 6, 1)]
    assert (s.entries, s.exits, s.restarts) == (25, 20, 0)


def test_the_v2_counter_is_decided_before_the_totals() -> None:
    """Issue 34: a restart whose 0x21 was lost with totals above the old ones is no increase."""
    ds, s = feed([v2(3, 1, 2, 0), v2(1, 1, 4, 600)])
    assert rules(ds)[1] == (c.RESTART_COUNTER, 1, 4) and ds[1].unknowable and s.restarts == 1
    # a counter above 32768 that started again: more messages on than the time allows
    ds, _ = feed([v2(40000, 2, 1, 0), v2(1, 3, 2, 600)])
    assert rules(ds)[1] == (c.RESTART_COUNTER, 3, 2)
    # the same jump over a long enough time: the counter came round, messages lost
    ds, _ = feed([v2(40000, 2, 1, 0), v2(1, 900, 800, 30 * 86400)])
    assert rules(ds)[1] == (c.INCREASE, 898, 799) and ds[1].gap == 25536


def test_the_counter_is_a_serial_number() -> None:
    assert c.counter_after(0, 65535) and c.counter_after(3, 65530) and c.counter_after(32767, 0)
    assert not c.counter_after(5, 5) and not c.counter_after(32768, 0) and not c.counter_after(65535, 0)
    assert not c.counter_after(65534, 2)
    assert c.plausible_messages(0) == c.MESSAGE_SLACK and c.plausible_messages(600) == 480 + c.MESSAGE_SLACK


def test_a_state_stored_before_device_at_orders_by_its_instant() -> None:
    _, s = feed([legacy(100, 90, 0)])
    old = s.to_json()
    del old["device_at"], old["late"]
    back = c.SensorCounts.from_json(old)
    assert back.device_at == back.at == T0 and back.late == 0
    assert c.derive(back, legacy(99, 80, -5)).rule == c.LATE


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("faults", list(FAULTS))
def test_reports_delivered_again_later_count_nothing_twice(version: int, faults: str) -> None:
    """Simulated days with every fifth report delivered again later (a requeue, a replay of
    any earlier report): the counts are the simulator's knowable truth all the same."""
    sensor = SimSensor("s1", "bar", version=version, scale=3000.0, faults=FAULTS[faults])
    sent, truth = simulate(sensor, T0, 40.0, 7)
    rng = random.Random(version)
    frames = [Frame(x.sensor_id, x.topic, x.frame, x.received_at) for x in sent]
    again = []
    for i, f in enumerate(frames):
        again.append(f)
        if i and rng.random() < 0.2:
            old = frames[rng.randrange(i)]
            again.append(Frame(old.sensor_id, old.kind, old.payload, f.received_at + 1e-4))
    core = SensorCore({"s1": SensorInfo("s1", "h1", tz=sensor.tz)})
    got = core.process(again)
    assert totals(got.counts) == (truth.entries, truth.exits)
    state = core.state["s1"]
    assert state.late > 0 and state.late + state.duplicates >= len(again) - len(frames)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("seed", range(3))
def test_the_night_a_clock_goes_back_counts_the_truth(version: int, seed: int) -> None:
    """2026-10-25 in Vaduz (03:00 CEST -> 02:00 CET): a legacy frame's wall clock repeats an
    hour, taken as that hour again, not as late reports."""
    sensor = SimSensor("s1", "bar", version=version, scale=400.0, faults=FAULTS["lossy"])
    sent, truth = simulate(sensor, 1_792_879_200.0, 8.0, seed)  # from 22:00 UTC the evening before
    core = SensorCore({"s1": SensorInfo("s1", "h1", tz=sensor.tz)})
    got = core.process([Frame(x.sensor_id, x.topic, x.frame, x.received_at) for x in sent])
    assert totals(got.counts) == (truth.entries, truth.exits)
    assert c.LATE not in {r.rule for r in got.counts}
    assert all(abs(r.device_at - r.received_at) < 3 for r in got.counts)
