"""Presence-sensor frames (BRIEF s.5): every kind decoded in a batch, both byte orders of the
legacy report, and each kind of bad frame refused with its reason while the rest go on."""

from __future__ import annotations

import numpy as np
import pytest

from fence.venues import sensor_frames as sf

WHEN = (2024, 2, 29, 13, 5, 7)  # a leap day


def seconds(y: int, mo: int, d: int, h: int, mi: int, s: int) -> float:
    return float(np.datetime64(f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}", "s").astype(np.int64))


@pytest.mark.parametrize("order", sf.BYTE_ORDERS)
@pytest.mark.parametrize("size", [15, 16, 59])
def test_a_legacy_report_in_either_byte_order_and_any_padding(order: str, size: int) -> None:
    frame = sf.encode_legacy(40000, 513, WHEN, sf.REPORT_TIMEOUT, order, frame_bytes=size)
    assert len(frame) == size
    got = sf.decode_counters([frame], [1], [order])
    assert got.refused == [] and len(got) == 1
    assert (int(got.total_in[0]), int(got.total_out[0]), int(got.report_type[0])) == (40000, 513, 0x20)
    assert float(got.local_s[0]) == seconds(*WHEN)
    assert int(got.counter[0]) == -1 and int(got.version[0]) == 1 and not bool(got.startup[0])


def test_the_byte_order_matters_and_is_the_sensors() -> None:
    big = sf.encode_legacy(0x0102, 0x0304, WHEN, sf.REPORT_EVENTS, "big")
    read_little = sf.decode_counters([big], [1], ["little"])
    assert (int(read_little.total_in[0]), int(read_little.total_out[0])) == (0x0201, 0x0403)
    # the date bytes are single bytes: the same in both orders
    assert float(read_little.local_s[0]) == seconds(*WHEN)


def test_the_broken_diff_fields_are_not_the_counts() -> None:
    frame = bytearray(sf.encode_legacy(7, 9, WHEN, sf.REPORT_EVENTS))
    frame[0:4] = b"\xff\xff\xff\xff"  # diff_in / diff_out: garbage, as the firmware sends them
    got = sf.decode_counters([bytes(frame)], [1], ["little"])
    assert (int(got.total_in[0]), int(got.total_out[0])) == (7, 9)


def test_a_legacy_startup_report_has_every_total_zero() -> None:
    got = sf.decode_counters([sf.encode_legacy(0, 0, WHEN, sf.REPORT_EVENTS),
                              sf.encode_legacy(0, 1, WHEN, sf.REPORT_EVENTS)], [1, 1], ["little"] * 2)
    assert got.startup.tolist() == [True, False]


def test_a_v2_report_carries_its_counter_and_time_zone() -> None:
    frame = sf.encode_v2(65535, 12, 3, (2026, 3, 29, 2, 30, 0), sf.REPORT_STARTUP, 8)  # UTC+02:00
    assert len(frame) == sf.V2_COUNTER_BYTES
    got = sf.decode_counters([frame], [2], ["big"])  # the byte order is a legacy parameter only
    assert got.refused == []
    assert (int(got.counter[0]), int(got.tz_min[0]), int(got.version[0])) == (65535, 120, 2)
    assert got.startup.tolist() == [True]
    assert float(got.local_s[0]) == seconds(2026, 3, 29, 2, 30, 0)


@pytest.mark.parametrize(("frame", "version", "reason"), [
    (b"\0" * 14, 1, "legacy counter report of 14 bytes (15 to 59 expected)"),
    (b"\0" * 60, 1, "legacy counter report of 60 bytes (15 to 59 expected)"),
    (sf.encode_legacy(1, 1, (2023, 2, 29, 0, 0, 0), 0xFF), 1, "impossible date 23-02-29 00:00:00"),
    (sf.encode_legacy(1, 1, (2024, 13, 1, 0, 0, 0), 0xFF), 1, "impossible date 24-13-01 00:00:00"),
    (sf.encode_legacy(1, 1, (2024, 4, 31, 0, 0, 0), 0xFF), 1, "impossible date 24-04-31 00:00:00"),
    (sf.encode_legacy(1, 1, (2024, 1, 0, 0, 0, 0), 0xFF), 1, "impossible date 24-01-00 00:00:00"),
    (sf.encode_legacy(1, 1, (2024, 1, 1, 24, 0, 0), 0xFF), 1, "impossible date 24-01-01 24:00:00"),
    (sf.encode_legacy(1, 1, (2024, 1, 1, 0, 60, 0), 0xFF), 1, "impossible date 24-01-01 00:60:00"),
    (sf.encode_legacy(1, 1, (2019, 1, 1, 0, 0, 0), 0xFF), 1, "impossible date 19-01-01 00:00:00"),
    (sf.encode_legacy(1, 1, WHEN, 0x21), 1, "unknown report type 0x21"),  # v2 only
    (sf.encode_legacy(1, 1, WHEN, 0x33), 1, "unknown report type 0x33"),
    (sf.encode_v2(1, 1, 1, WHEN, 0xFF, 0) + b"\0", 2, "v2 counter report of 16 bytes (15 expected)"),
    (b"\x03" + sf.encode_v2(1, 1, 1, WHEN, 0xFF, 0)[1:], 2, "v2 counter report with version byte 3"),
    (sf.encode_v2(1, 1, 1, WHEN, 0xFF, 57), 2, "time zone offset 57 quarter hours out of range"),
    (sf.encode_v2(1, 1, 1, WHEN, 0x10, 0), 2, "unknown report type 0x10"),
    (sf.encode_v2(1, 1, 1, WHEN, 0xFF, 0), 3, "unknown counter report version 3"),
])
def test_a_bad_counter_frame_is_refused_with_its_reason_and_the_others_decoded(
        frame: bytes, version: int, reason: str) -> None:
    good = sf.encode_legacy(5, 4, WHEN, sf.REPORT_EVENTS)
    got = sf.decode_counters([good, frame, good], [1, version, 1], ["little"] * 3)
    assert got.refused == [(1, reason)]
    assert got.index.tolist() == [0, 2] and got.total_in.tolist() == [5, 5]


def test_event_reports_several_in_a_frame() -> None:
    frames = [sf.encode_events([(sf.ENTRY, 812, 1_790_000_000), (sf.EXIT, 790, 1_790_000_004)]),
              b"\0" * 7, sf.encode_events([(sf.ENTRY, 1, 1), (9, 1, 2)]), b"",
              sf.encode_events([(sf.STATUS_EVENT, 0, 1_790_000_009)])]
    got = sf.decode_events(frames)
    assert got.refused == [(1, "event frame of 7 bytes (a multiple of 8 expected)"),
                           (2, "unknown event type 9 (slot 1)"),
                           (3, "event frame of 0 bytes (a multiple of 8 expected)")]
    assert got.frame.tolist() == [0, 0, 4] and got.slot.tolist() == [0, 1, 0]
    assert got.event_type.tolist() == [1, 0, 2] and got.distance_mm.tolist() == [812, 790, 0]
    assert got.timestamp.tolist() == [1_790_000_000, 1_790_000_004, 1_790_000_009]


def test_status_reports() -> None:
    frames = [sf.encode_status(1_790_000_000, 3650, 1, 17, 21, 0x00020003, 42), b"\0" * 19]
    got = sf.decode_status(frames)
    assert got.refused == [(1, "status of 19 bytes (20 expected)")]
    assert got.index.tolist() == [0]
    assert (got.startup_time[0], got.battery[0], got.sensor_state[0], got.discarded_events[0],
            got.gprs_signal[0], got.firmware_version[0], got.configuration_id[0]) == \
        (1_790_000_000, 3650, 1, 17, 21, 0x00020003, 42)


def test_a_configuration_round_trips_and_is_checked() -> None:
    c = sf.SensorConfig(threshold_cm=120, reporting_interval_min=30, status_interval_min=60,
                        event_threshold=5, configuration_id=0xDEADBEEF)
    raw = c.encode()
    assert len(raw) == sf.CONFIG_BYTES and raw[:2] == (120).to_bytes(2, "little")
    assert sf.SensorConfig.decode(raw) == c
    with pytest.raises(ValueError, match=r"11 bytes \(12 expected\)"):
        sf.SensorConfig.decode(raw[:-1])
    with pytest.raises(ValueError, match="threshold_cm must be an integer"):
        sf.SensorConfig(70000, 30, 60, 5, 1)
    with pytest.raises(ValueError, match=">= 1"):
        sf.SensorConfig(100, 0, 60, 5, 1)


def test_a_large_batch_is_decoded_in_one_pass_per_kind() -> None:
    n = 20_000
    rng = np.random.default_rng(3)
    totals = rng.integers(0, 65524, (n, 2))
    frames = [sf.encode_legacy(int(a), int(b), WHEN, sf.REPORT_EVENTS, frame_bytes=int(k))
              for (a, b), k in zip(totals, rng.integers(15, 60, n), strict=True)]
    got = sf.decode_counters(frames, [1] * n, ["little"] * n)
    assert got.refused == [] and got.total_in.tolist() == totals[:, 0].tolist()
    assert got.total_out.tolist() == totals[:, 1].tolist()
