"""fence/archive.py `event_row`: an event body (fence/state.Event.to_json) as a fence_event row, or
InvalidMessage with the reason it goes to dead-letters with."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exchanges.contract import InvalidMessage
from exchanges.fence_events import ENTER, KINDS, LEAVE, REASONS, Event, event_id
from fence import store
from fence.archive import MAX_TS, event_row, event_rows

TS = 1_700_000_000.125
GOOD: dict[str, Any] = {"event": "enter", "fence_id": "yard-1", "object_id": "truck-7", "ts": TS,
                        "reason": "entered", "event_id": "0123456789abcdef0123456789abcdef"}
DELETE = object()


def body(**change: Any) -> bytes:
    e = dict(GOOD)
    for k, v in change.items():
        if v is DELETE:
            del e[k]
        else:
            e[k] = v
    return orjson.dumps(e)


def refusal(raw: bytes) -> str:
    with pytest.raises(InvalidMessage) as info:
        event_row(raw)
    assert info.value.reason == str(info.value)
    return info.value.reason


# --------------------------------------------------------------------------- good events


def test_a_good_event_is_a_row_in_column_order() -> None:
    row = event_row(body())
    assert row == ("0123456789abcdef0123456789abcdef", "yard-1", "truck-7", "enter", "entered", TS,
                   None, None)
    assert store.EVENT_COLUMNS == ("event_id", "fence_id", "object_id", "event", "reason", "ts")
    assert row[:6] == tuple(GOOD[k] for k in store.EVENT_COLUMNS)


def test_integer_ts_becomes_a_float() -> None:
    row = event_row(body(ts=1_700_000_000))
    assert row[5] == 1_700_000_000.0 and type(row[5]) is float


@pytest.mark.parametrize("ts", [0, 1.5, 2**31, MAX_TS - 1])
def test_any_number_from_1970_to_9999_is_a_ts(ts: float) -> None:
    assert event_row(body(ts=ts))[5] == float(ts)


def test_an_integer_beyond_64_bits_is_read_as_a_float_and_refused_as_past_9999() -> None:
    raw = body().replace(b'"ts":1700000000.125', b'"ts":123456789012345678901234567890')
    assert raw != body()
    assert refusal(raw) == "event ts 1.2345678901234568e+29: epoch seconds from 1970 to 9999 expected"


def test_extra_fields_are_ignored() -> None:
    assert event_row(body(extra=[1, 2], version=3)) == event_row(body())


def test_ids_up_to_200_characters_and_any_text() -> None:
    row = event_row(body(event_id="e" * 200, fence_id="Zaun-ä", object_id="🚚"))
    assert row[:3] == ("e" * 200, "Zaun-ä", "🚚")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("reason", REASONS)
def test_every_kind_and_reason(kind: str, reason: str) -> None:
    assert event_row(body(event=kind, reason=reason))[3:5] == (kind, reason)


def test_body_as_other_buffers() -> None:
    raw = body()
    assert event_row(bytearray(raw)) == event_row(raw)  # type: ignore[arg-type]
    assert event_row(memoryview(raw)) == event_row(raw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- real events


def real_event(kind: str, reason: str, ts: float, fence_id: str = "yard-1", object_id: str = "truck-7",
               version: int = 3) -> Event:
    eid = event_id(fence_id, version, object_id, kind, reason, ts)
    return Event(kind, fence_id, object_id, ts, reason, eid)


@pytest.mark.parametrize(("kind", "reason"), [
    (ENTER, "entered"), (LEAVE, "exited"), (LEAVE, "timeout"), (ENTER, "fence_changed"),
    (LEAVE, "fence_changed"), (LEAVE, "fence_deleted"),
])
def test_real_events_round_trip(kind: str, reason: str) -> None:
    e = real_event(kind, reason, TS)
    row = event_row(orjson.dumps(e.to_json()))
    assert row == (e.event_id, e.fence_id, e.object_id, e.event, e.reason, e.ts, None, None)
    assert len(row[0]) == 32


@given(ts=st.floats(min_value=0.0, max_value=MAX_TS, exclude_max=True),
       fence_id=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", fullmatch=True),
       object_id=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}", fullmatch=True),
       kind=st.sampled_from(KINDS), reason=st.sampled_from(REASONS))
def test_any_real_event_round_trips_exactly(ts: float, fence_id: str, object_id: str, kind: str,
                                            reason: str) -> None:
    e = real_event(kind, reason, ts, fence_id, object_id)
    row = event_row(orjson.dumps(e.to_json()))
    assert row[:6] == (e.event_id, fence_id, object_id, kind, reason, ts)
    assert math.copysign(1.0, row[5]) == math.copysign(1.0, ts)  # -0.0 stays -0.0


@pytest.mark.parametrize("ts", [math.nan, math.inf, -math.inf])
def test_a_real_event_with_a_non_finite_ts_is_refused(ts: float) -> None:
    # orjson writes a non-finite float as null
    e = real_event(ENTER, "entered", ts)
    assert refusal(orjson.dumps(e.to_json())) == "event ts None: epoch seconds expected"


# --------------------------------------------------------------------------- bad events


@pytest.mark.parametrize("raw", [b"", b"{", b"\xff\xfe", b"{'event': 'enter'}", b"NaN", b'{"ts": 1e999}',
                                 body() + b"x", b'"\\ud800"'])
def test_not_json(raw: bytes) -> None:
    assert refusal(raw).startswith("event is not JSON: ")


@pytest.mark.parametrize("raw", [b"[]", b'["enter"]', b'"enter"', b"1", b"null", b"true"])
def test_not_an_object(raw: bytes) -> None:
    assert refusal(raw) == "event is not a JSON object"


@pytest.mark.parametrize("missing", store.EVENT_COLUMNS)
def test_each_missing_field_is_named(missing: str) -> None:
    assert refusal(body(**{missing: DELETE})) == f"event lacks {missing}"


def test_all_missing_fields_are_named_in_column_order() -> None:
    assert refusal(b"{}") == "event lacks event_id, fence_id, object_id, event, reason, ts"
    assert refusal(body(ts=DELETE, fence_id=DELETE)) == "event lacks fence_id, ts"


@pytest.mark.parametrize("field", ["event_id", "fence_id", "object_id"])
@pytest.mark.parametrize("value", ["", "x" * 201, None, 7, ["a"], {"id": "a"}, True])
def test_bad_ids(field: str, value: Any) -> None:
    assert refusal(body(**{field: value})) == (
        f"event {field} {value!r}: a string of 1-200 characters, no NUL, expected")


@pytest.mark.parametrize("kind", ["ENTER", "Leave", "inside", "", None, 0, ["enter"], True])
def test_bad_kind(kind: Any) -> None:
    assert refusal(body(event=kind)) == f"event kind {kind!r}: enter, leave or cross expected"


@pytest.mark.parametrize("reason", ["exit", "Entered", "", None, 1, ["entered"], {"r": "entered"}])
def test_bad_reason(reason: Any) -> None:
    assert refusal(body(reason=reason)) == (
        f"event reason {reason!r}: one of entered, exited, timeout, fence_changed, fence_deleted, expired, "
        "dwelled, crossed, fence_expired")


@pytest.mark.parametrize("ts", [True, False, None, "1700000000", [TS], {"s": TS}])
def test_bad_ts(ts: Any) -> None:
    assert refusal(body(ts=ts)) == f"event ts {ts!r}: epoch seconds expected"


@pytest.mark.parametrize("ts", [-1.0, -1e9, MAX_TS, 1e300])
def test_a_ts_outside_the_archives_months_is_refused(ts: float) -> None:
    # a month's table is fence_event_YYYY_MM: 1970 to 9999
    assert refusal(body(ts=ts)) == f"event ts {ts!r}: epoch seconds from 1970 to 9999 expected"


def test_the_first_problem_is_the_reason() -> None:
    assert refusal(body(event_id="", event="x", ts=None)).startswith("event event_id ''")
    assert refusal(body(event="x", reason="y", ts=None)).startswith("event kind 'x'")
    assert refusal(body(reason="y", ts=None)).startswith("event reason 'y'")


def test_nul_in_an_id_is_refused() -> None:
    refusal(body(object_id="truck\u00007"))


# --------------------------------------------------------------------------- batch messages


def test_a_batch_message_is_its_events_rows_in_order() -> None:
    other = {**GOOD, "object_id": "truck-8", "event_id": "f" * 32}
    rows, bad = event_rows(orjson.dumps([GOOD, other]))
    assert [r[2] for r in rows] == ["truck-7", "truck-8"] and bad == []


def test_one_event_object_is_a_batch_of_one() -> None:
    assert event_rows(body()) == ([event_row(body())], [])


def test_an_empty_batch_has_no_rows() -> None:
    assert event_rows(b"[]") == ([], [])


def test_bad_events_of_a_batch_are_named_and_the_good_ones_kept() -> None:
    rows, bad = event_rows(orjson.dumps([GOOD, {**GOOD, "event": "hover"}, 7]))
    assert len(rows) == 1
    assert bad == ["event 1 of 3: event kind 'hover': enter, leave or cross expected",
                   "event 2 of 3: event is not a JSON object"]


@pytest.mark.parametrize("raw", [b"7", b'"x"', b"null", b"[", b"\xff"])
def test_a_message_neither_array_nor_event_is_refused(raw: bytes) -> None:
    with pytest.raises(InvalidMessage):
        event_rows(raw)


def test_a_visit_is_stored_with_the_event_and_checked() -> None:
    leave = body(event="leave", reason="exited", visit_id="a1b2c3d4e5f60718293a4b5c", inside_s=42.5)
    assert event_row(leave)[6:] == ("a1b2c3d4e5f60718293a4b5c", 42.5)
    assert event_row(body(visit_id="a1b2c3d4e5f60718293a4b5c"))[6:] == ("a1b2c3d4e5f60718293a4b5c", None)
    assert "visit_id" in refusal(body(visit_id="NOT HEX"))
    assert "visit_id" in refusal(body(visit_id=7))
    assert "inside_s" in refusal(body(inside_s=3.0))  # an ENTER has no time inside
    for bad in (-1.0, True, "5"):
        assert "inside_s" in refusal(body(event="leave", reason="exited", inside_s=bad))
