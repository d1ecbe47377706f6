"""The benchmarks' event sink checks distinct events: delivery is at least once, so an event_id
received twice is a raw duplicate, counted and dropped before the comparison with the
reference (bench/broker_modes.py EventSink, bench/tenant.py run_events_with_ids)."""

from __future__ import annotations

from types import SimpleNamespace

import orjson

from bench import tenant as tn
from bench.broker_modes import EventSink
from exchanges import topology as t


def _event(fence: str, obj: str, ts: float, event_id: str | None,
           tenant: str = tn.TENANT) -> dict[str, object]:
    wire: dict[str, object] = {"event": "ENTER", "fence_id": fence, "object_id": obj, "ts": ts,
                               "reason": "entered", "tenant": tenant}
    if event_id is not None:
        wire["event_id"] = event_id
    return wire


def _sink() -> EventSink:
    return EventSink({"amqp": {t.FENCES_VHOST: "amqp://unused"}}, "brun-")  # type: ignore[typeddict-item]


async def test_a_redelivered_event_is_counted_and_dropped() -> None:
    sink = _sink()
    first = [_event("brun-f1", "brun-o1", 1.0, "e1"), _event("brun-f1", "brun-o2", 2.0, "e2")]
    await sink._on_events(SimpleNamespace(body=orjson.dumps(first)))  # type: ignore[arg-type]
    again = [first[1], _event("brun-f2", "brun-o2", 3.0, "e3")]
    await sink._on_events(SimpleNamespace(body=orjson.dumps(again)))  # type: ignore[arg-type]
    assert [e[3] for e, _ in sink.got] == [1.0, 2.0, 3.0]
    assert sink.duplicates == 1


async def test_events_of_other_runs_and_tenants_are_passed_over() -> None:
    sink = _sink()
    batch = [_event("other-f1", "brun-o1", 1.0, "e1"), _event("brun-f1", "brun-o1", 2.0, "e2", tenant="acme"),
             _event("brun-f1", "brun-o1", 3.0, "e3")]
    await sink._on_events(SimpleNamespace(body=orjson.dumps(batch)))  # type: ignore[arg-type]
    assert [e[3] for e, _ in sink.got] == [3.0]
    assert sink.duplicates == 0


def test_an_event_without_an_id_is_kept_each_time() -> None:
    got = tn.run_events_with_ids([_event("brun-f1", "brun-o1", 1.0, None)] * 2, "brun-")
    assert [i for _, i in got] == [None, None]
    assert tn.run_events([_event("brun-f1", "brun-o1", 1.0, "x")], "brun-")[0][1] == tn.qualified("brun-f1")
