"""The published contract (exchanges/schemas/, exchanges/wire_schemas.py) held to the code:
every file a valid schema, the AsyncAPI document valid against AsyncAPI 3.0's own JSON Schema
and naming the exchanges the topology declares, the enums equal to the code's, and what the
encoders emit (x-fence's events from the real core, presence and proximity events, a hive's
occupancy, the AMQP API's replies) valid. Positions: what the schema accepts x-ingress accepts,
and what x-ingress accepts the schema accepts."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import workload as wl
from exchanges import topology as t
from exchanges import wire_schemas
from exchanges.fence_events import KINDS, REASONS, Event, presence_json
from fence.rpc import OPS
from fence.venues.occupancy import DayCounts, HiveOccupancy, occupancy_message
from fence.x_fence.roam_events import RoamEvent
from ingress import positions as ip
from tests.wire_contract import SCHEMAS, errors, validator

ROOT = Path(__file__).resolve().parents[2]
ASYNCAPI_SPEC = ROOT / "fence/web/node_modules/@asyncapi/specs/schemas/3.0.0-without-$id.json"


@pytest.mark.parametrize("name", SCHEMAS)
def test_each_file_is_a_draft_7_schema_whose_refs_resolve(name: str) -> None:
    schema = wire_schemas.load(name)
    jsonschema.Draft7Validator.check_schema(schema)
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#" and schema["description"]
    text = json.dumps(schema)
    for ref in {r for r in SCHEMAS if f'"{r}"' in text}:
        assert ref in SCHEMAS


def test_a_name_that_is_not_a_file_is_no_schema() -> None:
    for bad in ("../settings.py", "event.schema", "/etc/passwd", "asyncapi.json/.."):
        with pytest.raises(KeyError):
            wire_schemas.load(bad)


def test_the_asyncapi_document_is_valid_and_names_the_topologys_exchanges() -> None:
    assert ASYNCAPI_SPEC.exists(), f"{ASYNCAPI_SPEC} is missing: run `bash deploy/setup.sh` (npm ci)"
    doc = wire_schemas.load(wire_schemas.ASYNCAPI)
    spec = json.loads(ASYNCAPI_SPEC.read_text())
    problems = [f"{list(e.absolute_path)}: {e.message[:200]}"
                for e in jsonschema.Draft7Validator(spec).iter_errors(doc)]
    assert problems == []
    payloads = {m["payload"]["schema"]["$ref"] for m in doc["components"]["messages"].values()}
    assert payloads == set(SCHEMAS)  # every schema is some message's, every message has one
    for name, channel in doc["channels"].items():
        amqp = channel.get("bindings", {}).get("amqp")
        if amqp:
            ex = amqp["exchange"]
            assert t.EXCHANGE_TYPES.get(ex["name"]) == ex["type"], (name, ex)
    for op in doc["operations"].values():
        assert op["channel"]["$ref"].removeprefix("#/channels/") in doc["channels"]


def test_the_enums_are_the_codes() -> None:
    event = wire_schemas.load("event.schema.json")["properties"]
    assert event["reason"]["enum"] == list(REASONS) and event["event"]["enum"] == list(KINDS)
    assert event["schema"]["const"] == wire_schemas.SCHEMA_VERSION
    assert wire_schemas.load("api-request.schema.json")["properties"]["op"]["enum"] == list(OPS)


def test_the_events_of_the_real_core_are_valid() -> None:
    box = wl.Box(9.55, 47.15, 2_000.0)
    fences = wl.make_fences(20, seed=3, box=box, radius_m=(100.0, 300.0))
    stream = wl.random_walk(100, 3_000, seed=3, box=box)
    pipe = wl.CorePipeline()
    pipe.define(fences)
    events: list[Event] = []
    for chunk in stream.chunks(500):
        events += pipe.feed(chunk.batch())
    assert {e.event for e in events} >= {"enter", "leave"} and len(events) > 50
    v = validator("event.schema.json")
    bodies = [e.to_json() for e in events]
    assert [b for b in bodies if not v.is_valid(b)] == []
    assert validator("event-batch.schema.json").is_valid(bodies[:2000])


def test_each_kind_of_event_body_is_valid() -> None:
    def ev(kind: str, reason: str, **kw: Any) -> Event:
        fence, obj = kw.pop("fence", "fleet:depot"), kw.pop("obj", "fleet:van-1")
        return Event(kind, fence, obj, 1.7e9, reason, "a" * 32, **kw)
    cases = [ev("enter", "entered", visit_id="b" * 24),
             ev("leave", "timeout", visit_id="b" * 24, inside_s=120.0),
             ev("enter", "dwelled", visit_id="b" * 24, inside_s=300.0), ev("cross", "crossed"),
             ev("leave", "fence_deleted", fence="depot", obj="van-1", visit_id="c" * 24, inside_s=0.0)]
    for e in cases:
        assert errors("event.schema.json", e.to_json()) == [], e
    shared = ev("enter", "entered", obj="other:van-9", visit_id="d" * 24)
    assert errors("event.schema.json", presence_json(shared)) == []
    # what the schema refuses: an unknown field, a CROSS with a visit, a presence without its pseudonym
    assert errors("event.schema.json", {**cases[0].to_json(), "extra": 1})
    assert errors("event.schema.json", {**cases[3].to_json(), "visit_id": "b" * 24})
    assert errors("event.schema.json", {**presence_json(shared), "object_id": "van-9"})
    assert errors("event.schema.json", {k: v for k, v in cases[0].to_json().items() if k != "schema"})


def test_proximity_and_occupancy_bodies_are_valid() -> None:
    for subscriber in ("fleet:car-1", "@fleet:point-1"):
        e = RoamEvent("nearby", "fleet:meet", subscriber, "fleet:car-2", 199.8765, 1.7e9, "e" * 32)
        assert errors("proximity-event.schema.json", e.to_json()) == []
    h = HiveOccupancy("hive-1", capacity=40)
    assert errors("hive-occupancy.schema.json", occupancy_message(h, 1.7e9)) == []
    h.today = DayCounts(__import__("datetime").date(2026, 11, 29), entries=12, exits=15)
    body = occupancy_message(h, 1.7e9)
    assert body["raw"] == -3 and errors("hive-occupancy.schema.json", body) == []


def test_api_replies_and_requests() -> None:
    assert errors("api-reply.schema.json", {"status": 200, "result": {"fences": []}}) == []
    assert errors("api-reply.schema.json", {"status": 400, "error": "malformed fence API request"}) == []
    assert errors("api-reply.schema.json", {"status": 200, "error": "x"})
    assert errors("api-request.schema.json", {"op": "events", "token": "t", "fence_id": "f", "since": 0.0,
                                              "limit": 10, "cursor": None}) == []
    assert errors("api-request.schema.json", {"op": "drop_tables", "token": "t"})


# -- positions: the schema and x-ingress's decoder agree ------------------------------------------

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
extra_value = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
                           lambda c: st.lists(c, max_size=3)
                           | st.dictionaries(st.text(max_size=5), c, max_size=3),
                           max_leaves=8)
position = st.fixed_dictionaries(
    {"lon": st.one_of(finite.filter(lambda v: abs(v) <= 360), st.sampled_from([-180.0, 180.0, 0.0])),
     "lat": st.one_of(finite.filter(lambda v: abs(v) <= 180), st.sampled_from([-90.0, 90.0])),
     "ts": st.one_of(st.floats(9e8, 4.2e9), st.sampled_from([1.7e12, 946684800.0, 4102444800.0]))},
    optional={"ttl": st.one_of(st.floats(-10, 7e5), st.just(0)), "speed": extra_value, "tags": extra_value})


def _off_the_edge(p: dict[str, Any]) -> bool:
    """Values within the decoder's clamp slack just outside the world: it takes them as the edge."""
    return any(0 < abs(p[k]) - edge < 1e-6 for k, edge in (("lon", 180.0), ("lat", 90.0)))


@settings(max_examples=400, deadline=None)
@given(position)
def test_a_device_position_is_accepted_exactly_when_the_schema_says(p: dict[str, Any]) -> None:
    if _off_the_edge(p):
        return
    valid = validator("position.schema.json").is_valid(p)
    decoded = ip.decode_mqtt("positions.fleet.van-1", json.dumps(p).encode())
    assert valid == (not decoded.refused), (p, decoded.refused)


@settings(max_examples=150, deadline=None)
@given(st.lists(position, min_size=1, max_size=5),
       st.lists(st.sampled_from(["van-1", "a_b", "-bad", "x" * 65]), min_size=5, max_size=5))
def test_a_gateway_batch_position_is_accepted_exactly_when_the_schema_says(ps: list[dict[str, Any]],
                                                                          ids: list[str]) -> None:
    items = [{**p, "id": i} for p, i in zip(ps, ids, strict=False) if not _off_the_edge(p)]
    if not items:
        return
    v = validator("gateway-batch.schema.json")
    decoded = ip.decode_batch(json.dumps({"positions": items}).encode(), "application/json", tenant="fleet")
    refused = {i for i, _ in decoded.refused}
    for i, p in enumerate(items):
        assert v.is_valid({"positions": [p]}) == (i not in refused), (p, decoded.refused)


def test_the_position_schema_states_the_decoders_bounds() -> None:
    props = wire_schemas.load("position.schema.json")["properties"]
    assert (props["ts"]["minimum"], props["ts"]["maximum"]) == (ip.TS_MIN, ip.TS_MAX)
    batch = wire_schemas.load("gateway-batch.schema.json")["properties"]["positions"]
    assert batch["maxItems"] == ip.MAX_BATCH
    assert math.isclose(props["ttl"]["maximum"], 604800) and np.isfinite(props["lat"]["maximum"])
