"""The client package (fence/client_package, `geofence_client`) stays a client: it imports
nothing of the server and no library but httpx and aio-pika (its two dependencies), names the
broker's exchanges as the topology does, and reads the events the pipeline makes (its typed
events against the encoder's own output and the published schemas' fields)."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import orjson
import pytest
from geofence_client import amqp, events, stream
from geofence_client.events import FenceEvent, NotAnEvent, ProximityEvent

from exchanges import topology as t

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fence" / "client_package"
ALLOWED = {"httpx", "aio_pika", "geofence_client"}


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_it_imports_only_the_standard_library_httpx_and_aio_pika() -> None:
    found = {p.name: imported_roots(p) - set(sys.stdlib_module_names) - {"__future__"} - ALLOWED
             for p in (PACKAGE / "geofence_client").glob("*.py")}
    assert found and not any(found.values()), found
    deps = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]["dependencies"]
    assert sorted(d.split(">")[0].split("=")[0] for d in deps) == ["aio-pika", "httpx"]


def test_it_names_the_exchanges_as_the_topology_does() -> None:
    assert amqp.API_EXCHANGE == t.API_EXCHANGE
    assert stream.TENANT_BATCHES_EXCHANGE == t.TENANT_BATCHES_EXCHANGE
    assert stream.EVENTS_EXCHANGE == t.EVENTS_EXCHANGE
    assert stream.ROAM_EVENTS_PREFIX == t.ROAM_EVENTS_TOPIC_PREFIX
    queue = stream.EventStream("amqp://x", "fleet", "dispatch").queue_name
    assert queue == t.app_queue_prefix("fleet.dispatch") + "events"  # what the app's permission allows


def test_events_are_typed_and_later_fields_kept() -> None:
    enter = {"schema": 1, "event": "enter", "tenant": "fleet", "fence_id": "depot", "object_id": "van-1",
             "ts": 10.0, "reason": "entered", "event_id": "a" * 32, "visit_id": "b" * 24,
             "position": {"lon": 9.5, "lat": 47.1, "ts": 10.0, "fields": {"speed": 3}}, "new_field": 1}
    near = {"schema": 1, "event": "nearby", "tenant": "fleet", "subscription": "meet", "subscriber": "van-1",
            "object": "van-2", "distance_m": 12.5, "ts": 11.0, "event_id": "c" * 32}
    got = events.parse(orjson.dumps([enter, near]))
    assert isinstance(got[0], FenceEvent) and isinstance(got[1], ProximityEvent)
    assert got[0].position is not None and got[0].position.fields == {"speed": 3}
    assert got[0].extra == {"new_field": 1} and got[0].visit_id == "b" * 24
    assert got[1].distance_m == 12.5 and got[1].object == "van-2"
    for bad, why in (({"event": "teleport"}, "unknown event kind"), ({"event": "enter"}, "without what"),
                     (7, "object")):
        with pytest.raises(NotAnEvent, match=why):
            events.event_of(bad)


def test_fields_follow_the_published_schemas() -> None:
    for name, kind in (("event.schema.json", FenceEvent), ("proximity-event.schema.json", ProximityEvent)):
        schema = orjson.loads((ROOT / "exchanges" / "schemas" / name).read_bytes())
        fields = set(kind.__dataclass_fields__) - {"extra"}
        assert set(schema["properties"]) == fields, name
