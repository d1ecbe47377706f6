"""The bugs the fuzzing of the wire contracts found (issue 5: tests/unit/test_fuzz_decoders.py
and its siblings), each pinned by a test of its own once fixed; six of them killed a sidecar.

Positions come as a tenant's (`positions.<tenant>.<id>`, a gateway's batch with its tenant as the
routing key) and go through the pipeline to that tenant's fence; the fence API's caller is a
member of a tenant (its memberships stubbed: `member`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator
from typing import Any, cast
from unittest import mock

import msgpack
import numpy as np
import orjson
import pytest
from aio_pika.abc import AbstractIncomingMessage
from shapely.geometry import Polygon

from exchanges import control, shell
from exchanges import topology as t
from exchanges.batch import PositionBatch, RegionBatch, unpack
from exchanges.contract import InvalidMessage
from exchanges.fence_def import FenceDef, InvalidFence
from exchanges.x_geo.core import XGeo
from fence import tenants
from fence.rpc import RpcServer
from fence.service import ApiError, Caller
from fence.spec import from_feature
from tests.faults.fuzz_inputs import nested
from tests.unit.fuzz_contract import (
    TS,
    assert_reason,
)
from tests.unit.fuzz_fence_api import HTTP, Verifier, no_fences, service
from tests.unit.fuzz_sidecars import (
    FULL,
    RING,
    WORKERS,
    Msg,
    captured,
    drained,
    fence_sidecar,
    geo_sidecar,
    incoming,
    ingress_sidecar,
    tenant_fence,
    to,
)
from tests.unit.fuzz_wire import SQUARE

TENANT = "acme"
TENANT_FULL, TENANT_FENCE = tenant_fence(TENANT)  # acme:f-all, around 0,0


@contextlib.contextmanager
def member(role: str = "editor") -> Iterator[Caller]:
    """The fence API's callers are members of TENANT (fence/tenants.py stubbed: no PostgreSQL);
    the Caller the API makes of the test token's uid."""
    with mock.patch.object(tenants, "memberships", mock.AsyncMock(return_value={TENANT: role})):
        yield Caller("uid-1", tenant=TENANT, role=role)


def _through_the_pipeline(messages: list[Msg], gateway: bool = False) -> list[shell.Out]:
    """x-ingress, x-geo, x-fence handlers in turn, each fed what the one before published:
    every dead letter and event of the three. The fence is TENANT's, around 0,0."""
    sc, dlx, regions = ingress_sidecar()
    with captured() as outs:
        decode = sc.decode_gateway if gateway else sc.decode_mqtt
        asyncio.run(drained(sc, sc.handle(incoming(messages), decode, "in")))
    geo, geo_dlx, fence_in = geo_sidecar(TENANT_FULL)
    with captured() as geo_outs:
        asyncio.run(geo.handle_positions(incoming([Msg(o.body) for o in outs
                                                   if any(to(o, r) for r in regions.values())])))
    worker = geo.core.worker_of(TENANT_FULL.fence_id)
    xf, _, _ = fence_sidecar(worker, TENANT_FENCE)  # the x-fence of the fence's worker
    with captured() as xf_outs:
        asyncio.run(drained(xf, xf.handle_inputs(incoming([Msg(o.body, o.routing_key) for o in geo_outs
                                               if to(o, fence_in) and o.routing_key == worker]))))
    return [o for o in outs if to(o, dlx)] + [o for o in geo_outs if to(o, geo_dlx)] + list(xf_outs)


@pytest.mark.parametrize("depth", [17, 1019, 1020, 1021, 1022, 1023])
def test_deep_extra_fields_are_refused_at_x_ingress_and_the_others_go_on(depth: int) -> None:
    """Bug 1, fixed: an extra field nested 1,019-1,023 deep passed x-ingress and then broke
    (or killed) x-geo or x-fence; deeper than 16 is now refused at the door."""
    body = b'{"lon":0.5,"lat":0.5,"ts":1700000000,"x":' + b"[" * depth + b"]" * depth + b"}"
    good = Msg(b'{"lon":0.5,"lat":0.5,"ts":1700000001}', "positions.acme.dev-2")
    outs = _through_the_pipeline([Msg(body, "positions.acme.dev-1"), good])
    dead = [o for o in outs if o.exchange.name == "dead-letters"]
    assert len(dead) == 1 and "nested deeper than 16" in (dead[0].headers or {})[t.REASON_HEADER]
    assert any(orjson.loads(o.body)["object_id"] == "dev-2" for o in outs
               if o.exchange.name == "fence.events")


def test_a_tenants_fence_sees_its_tenants_objects_only() -> None:
    """The same object id in two tenants is two objects, and a fence sees its own tenant's:
    one ENTER, under the fence's tenant, with the routing key a device of that tenant may bind."""
    body = b'{"lon":0.5,"lat":0.5,"ts":1700000001}'
    outs = _through_the_pipeline([Msg(body, "positions.acme.dev-2"), Msg(body, "positions.other.dev-2"),
                                  Msg(body, "positions.dev-3")])  # the contract before tenants
    dead = [o for o in outs if o.exchange.name == "dead-letters"]
    assert [(o.headers or {})["x-geofence-routing-key"] for o in dead] == ["positions.dev-3"]
    assert "is not positions.<tenant>.<object_id>" in (dead[0].headers or {})[t.REASON_HEADER]
    events = [o for o in outs if o.exchange.name == "fence.events"]
    assert [(o.routing_key, orjson.loads(o.body)["tenant"], orjson.loads(o.body)["object_id"])
            for o in events] == [("fence-events.acme.f-all.enter.dev-2", "acme", "dev-2")]


@pytest.mark.parametrize("extra", ["nested 1,019", "nested 1,020", "nested 1,021", "int key"])
def test_gateway_extra_fields_too_deep_or_with_other_keys_are_refused_alone(extra: str) -> None:
    """Bug 1 (gateway), fixed: the bad position is refused, the other goes on."""
    bad: dict[Any, Any] = {"id": "a", "lon": 0.5, "lat": 0.5, "ts": TS}
    if extra == "int key":
        bad[1] = "x"
    else:
        bad["x"] = nested(int(extra.split()[1].replace(",", "")))
    body = msgpack.packb({"positions": [bad, {"id": "b", "lon": 0.5, "lat": 0.5, "ts": TS + 1}]})
    outs = _through_the_pipeline([Msg(body, TENANT, "application/msgpack")], gateway=True)
    dead = [o for o in outs if o.exchange.name == "dead-letters"]
    assert len(dead) == 1 and "1 of 2 positions refused" in (dead[0].headers or {})[t.REASON_HEADER]
    assert any(orjson.loads(o.body)["object_id"] == "b" for o in outs if o.exchange.name == "fence.events")


@pytest.mark.parametrize("key", ["", "positions.acme.b", "Acme"])
def test_a_gateway_batch_whose_routing_key_is_not_a_tenant_is_refused_whole(key: str) -> None:
    """"" is what the retired fanout ingress.batches delivers (the contract before tenants)."""
    body = msgpack.packb({"positions": [{"id": "b", "lon": 0.5, "lat": 0.5, "ts": TS + 1}]})
    outs = _through_the_pipeline([Msg(body, key, "application/msgpack")], gateway=True)
    dead = [o for o in outs if o.exchange.name == "dead-letters"]
    assert len(dead) == 1
    assert f"routing key {key!r} is not a tenant" in (dead[0].headers or {})[t.REASON_HEADER]
    assert not [o for o in outs if o.exchange.name == "fence.events"]


def test_a_batch_through_the_retired_exchange_is_refused_whatever_its_key() -> None:
    """ingress.batches is a fanout: a key there is the publisher's say-so, not a permission's,
    so a batch that came through it is refused even under a key that is a tenant."""
    body = msgpack.packb({"positions": [{"id": "b", "lon": 0.5, "lat": 0.5, "ts": TS + 1}]})
    retired = Msg(body, "acme", "application/msgpack", exchange=t.RETIRED_BATCHES_EXCHANGE)
    outs = _through_the_pipeline([retired], gateway=True)
    dead = [o for o in outs if o.exchange.name == "dead-letters"]
    assert len(dead) == 1 and "carries no tenant" in (dead[0].headers or {})[t.REASON_HEADER]
    assert not [o for o in outs if o.exchange.name == "fence.events"]
    outs = _through_the_pipeline([Msg(body, "acme", "application/msgpack", exchange=t.GATEWAY_EXCHANGE)],
                                 gateway=True)
    assert [o for o in outs if o.exchange.name == "fence.events"]  # the same batch on ingress.gateway


BAD_RING = [[9.5, 47.1], [9.51, 47.1], [9.51, 47.11], [9.5, 47.1]]


@pytest.mark.parametrize("where", ["coordinate", "timeout_s"])
def test_known_bug_huge_integers_in_a_fence(where: str) -> None:
    """Bug 2 (fixed): a coordinate or timeout_s that is an integer beyond float range (JSON
    allows it; the HTTP API parses with the json module) raised OverflowError in fence/spec.py."""
    f: dict[str, Any] = {"type": "Feature", "id": "f-1", "properties": {},
                         "geometry": {"type": "Polygon", "coordinates": [[list(p) for p in BAD_RING]]}}
    if where == "coordinate":
        f["geometry"]["coordinates"][0][1][0] = 10**400
    else:
        f["properties"]["timeout_s"] = 10**400
    with pytest.raises(InvalidFence):
        from_feature(f)


def test_known_bug_huge_integers_are_a_500_over_http() -> None:
    """Bug 2 over HTTP (fixed): POST /fences with timeout_s = 10**400 was a 500."""
    body = b'{"type": "Feature", "id": "f-1", "properties": {"timeout_s": 1' + b"0" * 400 + b"}, " \
        b'"geometry": {"type": "Polygon", "coordinates": ' + orjson.dumps([BAD_RING]) + b"}}"
    with member():
        r = HTTP.post("/fences", content=body, headers={"Authorization": "Bearer good",
                                                        "Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]


@pytest.mark.parametrize("where", ["name", "after", "events"])
def test_known_bug_nul_characters_reach_postgresql(where: str) -> None:
    """Bug 10 (fixed): strings with a NUL character reached PostgreSQL, which refuses them
    (CharacterNotInRepertoireError): a 500 for a fence name with \\u0000 (POST /fences, AMQP
    create), GET /fences?after=%00, and the unchecked fence id of GET /fences/{id}/events."""
    if where == "name":
        with pytest.raises(InvalidFence):
            from_feature({"type": "Feature", "id": "f-1", "properties": {"name": "a\x00b"},
                          "geometry": {"type": "Polygon", "coordinates": [BAD_RING]}})
        return
    with no_fences(), member() as caller, pytest.raises(ApiError) as info:
        if where == "after":
            asyncio.run(service().list(caller, after="a\x00b"))
        else:
            asyncio.run(service().events(caller, "a\x00b"))
    assert info.value.status == 422
    assert_reason(info.value.message)


def test_known_bug_chunked_body_over_the_limit() -> None:
    """Bug 11 (fixed): the 4 MiB body limit (413) read only Content-Length: a chunked body of
    any size was read whole and parsed."""
    def chunks() -> Iterator[bytes]:
        yield b'{"type": "Feature", "id": "f-1", "properties": {"name": "'
        for _ in range(5):
            yield b"x" * (1 << 20)
        yield b'"}, "geometry": {}}'

    r = HTTP.post("/fences", content=chunks(), headers={"Authorization": "Bearer good",
                                                        "Content-Type": "application/json"})
    assert r.status_code == 413, (r.status_code, r.text[:200])


@pytest.mark.parametrize("wrong", ["string coordinates", "boolean coordinates", "properties []", "id 5",
                                   "id ''"])
def test_known_bug_wrong_types_coerced(wrong: str) -> None:
    """Bug 3 (fixed): wrong types were coerced instead of refused: coordinates given as strings
    ('9.5') or booleans, properties that are [] / 0 / false / '' (taken as no properties), and in
    FenceService.create an id that is a number or true (str() made it a fence id) or empty / 0 /
    false (a generated id)."""
    f: dict[str, Any] = {"type": "Feature", "id": "f-1", "properties": {},
                         "geometry": {"type": "Polygon", "coordinates": [BAD_RING]}}
    if wrong == "string coordinates":
        f["geometry"]["coordinates"] = [[[str(x), str(y)] for x, y in BAD_RING]]
    elif wrong == "boolean coordinates":
        f["geometry"]["coordinates"] = [[[True, False], [True, True], [False, True], [True, False]]]
    elif wrong == "properties []":
        f["properties"] = []
    else:
        f["id"] = 5 if wrong == "id 5" else ""
        with member() as caller, pytest.raises(ApiError) as info:
            asyncio.run(service().create(caller, f))
        assert info.value.status == 422, info.value.message
        return
    with pytest.raises(InvalidFence):
        from_feature(f)


def test_x_geo_refuses_ids_that_are_not_strings() -> None:
    """Bug 4, fixed: object ids that are not strings are refused by PositionBatch.from_wire
    (they crashed XGeo.route outside the handler's try)."""
    sc, dlx, _ = geo_sidecar()
    pb = PositionBatch(["a", "b"], np.zeros(2), np.zeros(2), np.full(2, TS), np.zeros(2, np.uint64))
    wire = {"v": 1, "kind": "positions", **RegionBatch(pb, np.zeros(2, bool), np.zeros(2)).to_wire()}
    wire["batch"]["ids"] = [[1], [2]]
    with captured() as outs:
        asyncio.run(sc.handle_positions(incoming([Msg(msgpack.packb(wire, use_bin_type=True))])))
    assert [o.exchange.name for o in outs] == [dlx.name]


def test_x_fence_refuses_ids_that_are_not_strings() -> None:
    """Bug 4 (x-fence), fixed: bytes ids are refused (orjson could not encode the event)."""
    geo = XGeo("a", list(WORKERS), RING)
    geo.add_binding(FULL)
    pb = PositionBatch(["a"], np.zeros(1), np.zeros(1), np.full(1, TS), np.zeros(1, np.uint64))
    part = next(iter(geo.route(pb).values())).to_wire()
    part["positions"]["ids"] = [b"a"]
    wire = {"v": 1, "kind": "positions", "parts": [part]}
    sc, dlx, _ = fence_sidecar()
    with captured() as outs:
        msgs = incoming([Msg(msgpack.packb(wire, use_bin_type=True), "w0")])
        asyncio.run(drained(sc, sc.handle_inputs(msgs)))
    assert [o.exchange.name for o in outs] == [dlx.name]


def test_x_fence_refuses_a_message_without_parts() -> None:
    """Bug 9, fixed: a positions message without parts is dead-lettered (WorkerBatch.concat
    raised outside the handler's try)."""
    sc, dlx, _ = fence_sidecar()
    with captured() as outs:
        no_parts = msgpack.packb({"v": 1, "kind": "positions", "parts": []})
        asyncio.run(drained(sc, sc.handle_inputs(incoming([Msg(no_parts)]))))
    assert [o.exchange.name for o in outs] == [dlx.name]


def test_x_fence_refuses_parts_for_another_worker() -> None:
    """Bug 9, fixed: parts for another worker are dead-lettered."""
    geo = XGeo("a", list(WORKERS), RING)
    geo.add_binding(FULL)
    pb = PositionBatch(["a"], np.zeros(1), np.zeros(1), np.full(1, TS), np.zeros(1, np.uint64))
    part = next(iter(geo.route(pb, notice=np.ones(1, bool)).values())).to_wire()
    bodies = [msgpack.packb({"v": 1, "kind": "positions", "parts": [{**part, "worker": w}]})
              for w in ("w0", "elsewhere")]
    sc, dlx, _ = fence_sidecar()
    with captured() as outs:
        asyncio.run(drained(sc, sc.handle_inputs(incoming([Msg(b, "w0") for b in bodies]))))
    assert [o.exchange.name for o in outs] == [dlx.name]


def test_control_refuses_infinite_bits() -> None:
    """Bug 5, fixed: bits = inf is an InvalidMessage, not an OverflowError."""
    fence = FenceDef(fence_id="f-1", version=1, geometry=SQUARE, timeout_s=300.0, name="n")
    msg = unpack(control.define_for_region(fence, TS, 20, np.zeros((0, 2), np.uint64), np.zeros(0, bool)))
    msg["bits"] = math.inf
    with pytest.raises(InvalidMessage):
        control.parse(msg)


@pytest.mark.parametrize("op", [[], {}])
def test_known_bug_rpc_op_unhashable(op: Any) -> None:
    """Bug 6 (fixed): an AMQP fence API request whose op is a list or an object: `op not in OPS`
    raised TypeError (unhashable) outside RpcServer.answer's try: the fence-api process stopped,
    and the request came back to it after every restart."""
    server = RpcServer(service(), Verifier(), shell.Counters())
    reply, bad = asyncio.run(server.answer(cast(AbstractIncomingMessage, Msg(orjson.dumps({"op": op})))))
    assert reply["status"] == 400 and bad


def test_known_bug_replace_with_properties_not_an_object() -> None:
    """Bug 7 (fixed): PUT /fences/{id} (and the AMQP replace) with a Feature whose properties are
    a string, number or list: FenceService.replace called .get on them, AttributeError: a 500."""
    f = {"type": "Feature", "properties": "x", "geometry": {"type": "Polygon", "coordinates": [BAD_RING]}}
    with member() as caller, pytest.raises(ApiError) as info:
        asyncio.run(service().replace(caller, "f-1", f))
    assert info.value.status == 422, info.value.message


def test_known_bug_rpc_list_bbox_not_a_string() -> None:
    """Bug 8 (fixed): the AMQP `list` op with a bbox that is not a string (a list, a number):
    parse_bbox called .split on it, AttributeError, answered 500 'internal error'."""
    server = RpcServer(service(), Verifier(), shell.Counters())
    body = orjson.dumps({"op": "list", "token": "good", "bbox": [9, 47, 10, 48]})
    with no_fences(), member():
        reply, _ = asyncio.run(server.answer(cast(AbstractIncomingMessage, Msg(body))))
    assert reply["status"] == 422, reply


def test_an_unclosed_ring_is_closed_not_refused() -> None:
    """A leniency, not a refusal: an unclosed ring is taken as closed (shapely closes it)."""
    spec = from_feature({"type": "Feature", "id": "f-1", "properties": {},
                         "geometry": {"type": "Polygon", "coordinates": [BAD_RING[:-1]]}})
    assert Polygon(spec.geometry.exterior).equals(Polygon(BAD_RING))


def test_a_replayed_batch_of_the_retired_exchange_is_refused_again() -> None:
    """A dead letter keeps the exchange its message was first published to
    (x-geofence-exchange), which a replay (through a private exchange, with the original key)
    carries on: a batch of ingress.batches is not accepted as its key's tenant's on replay."""
    body = msgpack.packb({"positions": [{"id": "b", "lon": 0.5, "lat": 0.5, "ts": TS + 1}]})
    retired = Msg(body, "acme", "application/msgpack", exchange=t.RETIRED_BATCHES_EXCHANGE)
    dead = [o for o in _through_the_pipeline([retired], gateway=True) if o.exchange.name == "dead-letters"]
    first = (dead[0].headers or {})[t.FIRST_EXCHANGE_HEADER]
    assert first == t.RETIRED_BATCHES_EXCHANGE
    replayed = Msg(body, "acme", "application/msgpack", headers={t.FIRST_EXCHANGE_HEADER: first.encode()},
                   exchange="replay.x-ingress.batches")
    outs = _through_the_pipeline([replayed], gateway=True)
    assert not [o for o in outs if o.exchange.name == "fence.events"]
    assert [o for o in outs if o.exchange.name == "dead-letters"]
