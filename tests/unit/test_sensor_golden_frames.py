"""Golden frames: presence-sensor frames written byte by byte, by hand, from the documented
layouts (docs/reference.md "Venue occupancy", BRIEF s.5, fence/venues/sensor_frames.py), never through
the project's encoders, then decoded and counted end to end by the pure core
(fence/venues/sensor_core.py -> counting.py) with the exact entries, exits and rules.

Layouts (16-bit fields in the legacy sensor's byte order, little-endian unless `--byte-order
big`; every v2 field little-endian):

    legacy counter   diff_in u16 | diff_out u16 | total_in u16 | total_out u16 | yy | mm | dd |
                     hh | mi | ss | report_type   (15 data bytes, padding up to 59; the hive's
                     local time; diff_* broken in the firmware, ignored)
    v2 counter       version (02) | counter u16 | total_in u16 | total_out u16 | yy | mm | dd |
                     hh | mi | ss | report_type | tz i8 (quarter hours from UTC)
    v2 event         event_type (0 exit, 1 entry, 2 status) | distance_mm u16 | reserved |
                     timestamp u32 (UTC seconds)
    v2 status        startup_time u32 | battery u16 | sensor_state u16 | discarded_events u16 |
                     gprs_signal u16 | firmware_version u32 | configuration_id u32

The hive is in Europe/Vaduz: on 2026-11-28 its clocks read UTC+01:00 (v2 tz byte 04), so the
local 10:00:00 of a legacy frame is 09:00:00 UTC (1795856400).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fence.venues import counting as c
from fence.venues.sensor_core import (
    COUNTER,
    V2_COUNTER,
    V2_EVENT,
    V2_STATUS,
    Frame,
    Processed,
    SensorCore,
    SensorInfo,
)

UTC_0900 = 1_795_856_400.0  # 2026-11-28 09:00:00 UTC = 10:00:00 in Vaduz
PAD = "00" * 44  # a legacy frame padded to the 59 bytes the firmware may send


@dataclass(frozen=True)
class G:
    """A golden frame: its topic kind, its bytes as hex, when the platform took it (seconds
    after UTC_0900), and what it must count."""

    kind: str
    hex: str
    received_s: float
    rule: str
    entries: int = 0
    exits: int = 0


def frame(hex_: str) -> bytes:
    return bytes.fromhex(hex_.replace(" ", ""))


def run(golden: list[G], order: str = "little") -> tuple[Processed, SensorCore]:
    core = SensorCore({"s1": SensorInfo("s1", "h1", tz="Europe/Vaduz", byte_order=order)})
    frames = [Frame("s1", g.kind, frame(g.hex), UTC_0900 + g.received_s) for g in golden]
    return core.process(frames), core


def check(golden: list[G], order: str = "little") -> Processed:
    done, _ = run(golden, order)
    assert done.refused == []
    got = [(r.rule, r.entries, r.exits) for r in done.counts]
    assert got == [(g.rule, g.entries, g.exits) for g in golden if g.kind in (COUNTER, V2_COUNTER)]
    return done


def test_the_golden_bytes_decode_to_the_documented_fields() -> None:
    done, _ = run([
        # diff fields dead/beef (broken firmware), totals 31222 / 16, 26-11-28 10:00:00, 0xFF, padded
        G(COUNTER, "adde efbe f679 1000 1a 0b 1c 0a 00 00 ff" + PAD, 1, c.FIRST),
        G(V2_COUNTER, "02 0300 0200 0d00 1a 0b 1c 0a 00 00 20 04", 2, c.FIRST),
        G(V2_STATUS, "10980a6b e40c 0100 0200 1300 02000100 4d000000", 3, ""),
    ])
    legacy, v2 = done.counts
    assert (legacy.version, legacy.total_in, legacy.total_out, legacy.report_type, legacy.counter) == (
        1, 31222, 16, 0xFF, -1)
    assert legacy.device_at == UTC_0900 and len(legacy.raw) == 59
    assert (v2.version, v2.counter, v2.total_in, v2.total_out, v2.report_type) == (2, 3, 2, 13, 0x20)
    assert v2.device_at == UTC_0900
    (status,) = done.statuses
    assert status.values == {"startup_time": 1_795_856_400, "battery": 3300, "sensor_state": 1,
                             "discarded_events": 2, "gprs_signal": 19, "firmware_version": 0x00010002,
                             "configuration_id": 77}


def test_a_late_legacy_report_counts_nothing_and_the_next_counts_from_the_last_one_counted() -> None:
    """Issue 34: totals (31222, 16), then a report dated a second earlier with (31221, 12)
    arrives after it (a requeue, a replay): it is late, not a restart adding 31,221 entries."""
    done = check([
        G(COUNTER, "f679 1000 f679 1000 1a 0b 1c 0a 00 00 ff" + PAD, 1, c.FIRST),
        G(COUNTER, "f579 0c00 f579 0c00 1a 0b 1c 09 3b 3b ff" + PAD, 30, c.LATE),  # 09:59:59 local
        G(COUNTER, "fe79 1400 fe79 1400 1a 0b 1c 0a 05 00 ff", 301, c.INCREASE, 8, 4),  # 10:05:00
    ])
    assert done.hives() == {"h1": (8, 4)}
    late = done.counts[1]
    assert (late.total_in, late.total_out, late.at, late.unknowable) == (31221, 12, UTC_0900 - 1, False)


def test_a_late_legacy_report_leaves_the_state_as_it_was() -> None:
    _, core = run([G(COUNTER, "f679 1000 f679 1000 1a 0b 1c 0a 00 00 ff", 1, c.FIRST)])
    before = core.state["s1"].to_json()
    core.process([Frame("s1", COUNTER, bytes.fromhex("f5790c00f5790c001a0b1c093b3bff"), UTC_0900 + 30)])
    after = core.state["s1"].to_json()
    assert after.pop("late") == 1 and after.pop("reports") == 2
    assert after.pop("recent") != before.pop("recent")  # remembered: delivered again, a duplicate
    before.pop("late"), before.pop("reports")
    assert after == before  # totals, instants, counter: untouched


def test_the_same_second_with_a_total_down_is_late_not_a_restart() -> None:
    check([
        G(COUNTER, "f679 1000 f679 1000 1a 0b 1c 0a 00 00 ff", 1, c.FIRST),
        G(COUNTER, "f579 0c00 f579 0c00 1a 0b 1c 0a 00 00 ff", 2, c.LATE),
        G(COUNTER, "fb79 1100 fb79 1100 1a 0b 1c 0a 00 00 ff", 3, c.INCREASE, 5, 1),  # same second, up
    ])


def test_a_late_v2_report_counts_nothing() -> None:
    """Issue 34: counter 3 (2, 13), then counter 2 (1, 9) arriving after it, then counter 4
    (2, 15): late, then 0 / 2 (not restart:counter 1 / 9 then 1 / 6)."""
    check([
        G(V2_COUNTER, "02 0300 0200 0d00 1a 0b 1c 0a 00 00 ff 04", 1, c.FIRST),
        G(V2_COUNTER, "02 0200 0100 0900 1a 0b 1c 09 3b 00 ff 04", 2, c.LATE),  # 09:59:00 local
        G(V2_COUNTER, "02 0400 0200 0f00 1a 0b 1c 0a 01 00 ff 04", 61, c.INCREASE, 0, 2),
    ])


def test_a_v2_report_of_the_same_second_is_ordered_by_its_counter() -> None:
    check([
        G(V2_COUNTER, "02 0300 0200 0d00 1a 0b 1c 0a 00 00 ff 04", 1, c.FIRST),
        G(V2_COUNTER, "02 0200 0100 0900 1a 0b 1c 0a 00 00 ff 04", 2, c.LATE),
        G(V2_COUNTER, "02 0400 0300 0d00 1a 0b 1c 0a 00 00 ff 04", 3, c.INCREASE, 1, 0),
    ])


def test_a_v2_restart_whose_startup_was_lost_is_told_by_the_counter_before_the_totals() -> None:
    """Issue 34: counter 3 (1, 2), then counter 1 (1, 4) ten minutes later: the counter went
    back, so the sensor started again: restart:counter counting 1 / 4 (not increase 0 / 2)."""
    done = check([
        G(V2_COUNTER, "02 0300 0100 0200 1a 0b 1c 0a 00 00 ff 04", 1, c.FIRST),
        G(V2_COUNTER, "02 0100 0100 0400 1a 0b 1c 0a 0a 00 ff 04", 601, c.RESTART_COUNTER, 1, 4),
    ])
    assert done.counts[1].unknowable


def test_a_v2_counter_above_half_that_started_again_is_a_restart() -> None:
    """Counter 40000 (2, 1), its 0x21 lost, counter 1 (3, 2) ten minutes later: 25,537 messages
    on in serial arithmetic, more than 600 s allow: it started again."""
    check([
        G(V2_COUNTER, "02 409c 0200 0100 1a 0b 1c 0a 00 00 20 04", 1, c.FIRST),
        G(V2_COUNTER, "02 0100 0300 0200 1a 0b 1c 0a 0a 00 ff 04", 601, c.RESTART_COUNTER, 3, 2),
    ])


def test_the_v2_counter_wraps_as_a_serial_number() -> None:
    # 65535 -> 0: the very next message; the totals wrap at the observed modulus (65523 -> 0)
    check([
        G(V2_COUNTER, "02 ffff f2ff 0a00 1a 0b 1c 0a 00 00 ff 04", 1, c.FIRST),
        G(V2_COUNTER, "02 0000 0200 0c00 1a 0b 1c 0a 00 01 ff 04", 2, c.WRAP_COUNTER, 4, 2),
    ])
    # 65530 -> 3: eight messages lost on the way round, not a counter gone back
    done = check([
        G(V2_COUNTER, "02 faff 6400 6400 1a 0b 1c 0a 00 00 ff 04", 1, c.FIRST),
        G(V2_COUNTER, "02 0300 6e00 6800 1a 0b 1c 0a 01 00 ff 04", 61, c.INCREASE, 10, 4),
    ])
    assert done.counts[1].gap == 8
    # a late report from before the counter came round (65534 after 2) is still late
    check([
        G(V2_COUNTER, "02 0200 0500 0500 1a 0b 1c 0a 00 00 ff 04", 1, c.FIRST),
        G(V2_COUNTER, "02 feff 0300 0400 1a 0b 1c 09 3b 00 ff 04", 2, c.LATE),
    ])


def test_a_v2_startup_report_restarts_and_a_late_one_does_not() -> None:
    done = check([
        G(V2_COUNTER, "02 0900 6400 5a00 1a 0b 1c 0a 00 00 ff 04", 1, c.FIRST),
        G(V2_COUNTER, "02 0000 0000 0000 1a 0b 1c 0a 05 00 21 04", 301, c.RESTART_STARTUP),
        G(V2_COUNTER, "02 0100 0300 0100 1a 0b 1c 0a 06 00 ff 04", 361, c.INCREASE, 3, 1),
        # a start-up report from before (a replay): late, it does not start the count again
        G(V2_COUNTER, "02 0000 0000 0000 1a 0b 1c 09 00 00 21 04", 400, c.LATE),
        G(V2_COUNTER, "02 0200 0400 0100 1a 0b 1c 0a 07 00 ff 04", 421, c.INCREASE, 1, 0),
    ])
    assert done.counts[1].unknowable and done.hives() == {"h1": (4, 1)}


def test_legacy_wraps_restarts_and_the_big_endian_byte_order() -> None:
    # observed modulus: 65520 -> 65523, 0 .. 3 is 7 entries
    check([
        G(COUNTER, "f0ff 2c01 f0ff 2c01 1a 0b 1c 0a 00 00 ff", 1, c.FIRST),
        G(COUNTER, "0300 2e01 0300 2e01 1a 0b 1c 0a 02 00 ff", 121, c.WRAP_TIME, 7, 2),
    ])
    # a total of 65535 proves the documented modulus: 65535 -> 0 .. 4 is 5
    done, core = run([
        G(COUNTER, "ffff 0000 ffff 0000 1a 0b 1c 0a 00 00 ff", 1, c.FIRST),
        G(COUNTER, "0400 0000 0400 0000 1a 0b 1c 0a 01 00 ff", 61, c.WRAP_TIME, 5, 0),
    ])
    assert [(r.rule, r.entries) for r in done.counts] == [(c.FIRST, 0), (c.WRAP_TIME, 5)]
    assert core.state["s1"].modulus == c.DOCUMENTED_MODULUS
    # all zeros: a restart; then the totals count from zero
    check([
        G(COUNTER, "3200 2800 3200 2800 1a 0b 1c 0a 00 00 ff", 1, c.FIRST),
        G(COUNTER, "0000 0000 0000 0000 1a 0b 1c 0a 05 00 ff", 301, c.RESTART_STARTUP),
        G(COUNTER, "0200 0100 0200 0100 1a 0b 1c 0a 06 00 ff", 361, c.INCREASE, 2, 1),
    ])
    # big-endian firmware: 0x0102 / 0x0003, then 0x0110 / 0x0009
    check([
        G(COUNTER, "0102 0003 0102 0003 1a 0b 1c 0a 00 00 ff", 1, c.FIRST),
        G(COUNTER, "0110 0009 0110 0009 1a 0b 1c 0a 01 00 ff", 61, c.INCREASE, 14, 6),
    ], order="big")


# entry at 1200 mm, 09:00:00 UTC; exit at 900 mm, 09:00:05 UTC
EVENTS = "01 b004 00 10980a6b" "00 8403 00 15980a6b"


def test_a_duplicated_v2_event_frame_counts_once() -> None:
    done, _ = run([G(V2_EVENT, EVENTS, 6, ""), G(V2_EVENT, EVENTS, 6.001, "")])
    assert done.refused == []
    assert [(e.event_type, e.distance_mm, e.device_ts, e.slot, e.counted) for e in done.events] == [
        (1, 1200, 1_795_856_400, 0, True), (0, 900, 1_795_856_405, 1, True),
        (1, 1200, 1_795_856_400, 0, False), (0, 900, 1_795_856_405, 1, False)]
    assert done.hives() == {"h1": (1, 1)}


def test_an_event_frame_the_store_has_already_counts_nothing() -> None:
    done, _ = run([G(V2_EVENT, EVENTS, 60, ""), G(V2_EVENT, "01 b004 00 1b980a6b", 61, "")])  # + 09:00:11
    done.uncount({("s1", 1_795_856_400, 1, 1200, 0), ("s1", 1_795_856_405, 0, 900, 1)})
    assert [e.counted for e in done.events] == [False, False, True]
    assert done.hives() == {"h1": (1, 0)} and len(done.counted_events()) == 1


@pytest.mark.parametrize("split", [False, True])
def test_the_hour_a_legacy_clock_goes_back_is_not_late(split: bool) -> None:
    """2026-10-25 in Vaduz: 03:00 CEST goes back to 02:00 CET. A legacy frame carries the wall
    clock only, so 02:10 after 02:50 is the repeated hour (fold 1), not a late report."""
    golden = [
        G(COUNTER, "0a00 0a00 0a00 0a00 1a 0a 19 02 1e 00 ff", 0, c.FIRST),  # 02:30 CEST = 00:30 UTC
        G(COUNTER, "0f00 0a00 0f00 0a00 1a 0a 19 02 32 00 ff", 0, c.INCREASE, 5, 0),  # 02:50 CEST
        G(COUNTER, "1100 0d00 1100 0d00 1a 0a 19 02 0a 00 ff", 0, c.INCREASE, 2, 3),  # 02:10 CET = 01:10 UTC
        G(COUNTER, "1600 0d00 1600 0d00 1a 0a 19 02 28 00 ff", 0, c.INCREASE, 5, 0),  # 02:40 CET
        G(COUNTER, "1600 0d00 1600 0d00 1a 0a 19 03 05 00 20", 0, c.SAME),  # 03:05 CET = 02:05 UTC
    ]
    utc = [1_792_888_200.0, 1_792_889_400.0, 1_792_890_600.0, 1_792_892_400.0, 1_792_893_900.0]
    core = SensorCore({"s1": SensorInfo("s1", "h1", tz="Europe/Vaduz")})
    frames = [Frame("s1", g.kind, frame(g.hex), u + 2) for g, u in zip(golden, utc, strict=True)]
    counts = ([*core.process(frames[:3]).counts, *core.process(frames[3:]).counts] if split
              else core.process(frames).counts)
    assert [(r.rule, r.entries, r.exits) for r in counts] == [(g.rule, g.entries, g.exits) for g in golden]
    assert [r.device_at for r in counts] == utc
