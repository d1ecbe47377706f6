"""The webhooks' pure fan-out (fence/webhooks/fanout.py) and their place in the topology: which
endpoint gets which event in which lane, the webhook-id of a request and its retry, what a
message that is not events is told, and what the sidecar's RabbitMQ user may touch."""

from __future__ import annotations

import orjson
import pytest

from deploy.rabbitmq import definitions as d
from exchanges import topology as t
from exchanges.topology import Topology
from fence.webhooks import endpoints as ep
from fence.webhooks.fanout import LANES, Head, NotEvents, decode, fan_out, lane_of, message_id, request_body
from tests.unit.test_topology_definitions import DEFAULT, may


def event(n: int, tenant: str = "fleet", obj: str = "van-1", fence: str = "depot", kind: str = "enter",
          **more: object) -> dict[str, object]:
    return {"schema": 1, "event": kind, "tenant": tenant, "fence_id": fence, "object_id": obj,
            "ts": 1_700_000_000.0 + n, "reason": "entered", "event_id": f"{n:032x}", **more}


def endpoint(eid: str, tenant: str = "fleet", **body: object) -> ep.Endpoint:
    return ep.from_request({"url": "https://h.example.com/in", **body}, eid, tenant, "whsec_x")


def test_each_endpoint_gets_the_events_it_wants_of_its_own_tenant_only() -> None:
    every, depot_only = endpoint("wh-a"), endpoint("wh-b", fences=["depot"], kinds=["leave"])
    other = endpoint("wh-c", tenant="rival")
    events = [event(1), event(2, kind="leave"), event(3, fence="yard", kind="leave"),
              event(4, tenant="rival"), event(5, obj="anon-" + "0" * 24, shared=True),
              {**event(6), "tenant": ""}]
    rows = fan_out(events, {"fleet": [every, depot_only], "rival": [other]})
    got = {(r.endpoint_id, r.event_id) for r in rows}
    assert got == {("wh-a", f"{1:032x}"), ("wh-a", f"{2:032x}"), ("wh-a", f"{3:032x}"),
                   ("wh-b", f"{2:032x}"), ("wh-c", f"{4:032x}")}
    assert all(orjson.loads(r.body)["event_id"] == r.event_id for r in rows)


def test_a_disabled_endpoint_gets_nothing_and_proximity_events_have_their_object_lane() -> None:
    off = ep.Endpoint("wh-d", "fleet", "https://h.example.com", enabled=False)
    assert fan_out([event(1)], {"fleet": [off]}) == []
    near = {"schema": 1, "event": "nearby", "tenant": "fleet", "subscription": "meet", "subscriber": "van-1",
            "object": "van-9", "distance_m": 3.0, "ts": 1.0, "event_id": "a" * 32}
    (row,) = fan_out([near], {"fleet": [endpoint("wh-a", kinds=["nearby"])]})
    assert row.lane == lane_of("van-9") and 0 <= row.lane < LANES
    assert fan_out([near], {"fleet": [endpoint("wh-a", fences=["depot"])]}) == []  # not a fence's event


def test_one_objects_events_share_a_lane() -> None:
    rows = fan_out([event(i, obj="van-7") for i in range(20)], {"fleet": [endpoint("wh-a")]})
    assert {r.lane for r in rows} == {lane_of("van-7")}
    assert len({lane_of(f"van-{i}") for i in range(100)}) == LANES  # objects spread over every lane


def test_decode_takes_a_batch_or_one_event_and_says_what_is_wrong() -> None:
    good, bad = decode(orjson.dumps([event(1), {"event_id": "x"}, 7]))
    assert [e["event_id"] for e in good] == [f"{1:032x}"]
    assert bad == ["event 1 of 3: event_id: 32 hex digits expected", "event 2 of 3: not a JSON object"]
    assert decode(orjson.dumps(event(2)))[0][0]["ts"] == 1_700_000_002.0
    leave_first = [event(9, kind="leave"), event(3), event(5), event(5, kind="leave")]
    assert [(e["ts"], e["event"]) for e in decode(orjson.dumps(leave_first))[0]] == [
        (1_700_000_003.0, "enter"), (1_700_000_005.0, "enter"), (1_700_000_005.0, "leave"),
        (1_700_000_009.0, "leave")]  # in time order, one instant's events as they came
    for body, why in ((b"{", "not JSON"), (b"42", "neither a JSON array")):
        with pytest.raises(NotEvents, match=why):
            decode(body)
    _, bad = decode(orjson.dumps([{**event(1), "ts": "soon"}, {**event(2), "object_id": None}]))
    assert bad[0].endswith("ts: epoch seconds expected") and "object_id" in bad[1]


def test_a_retry_is_the_same_request_under_the_same_id() -> None:
    rows = [(1, "a" * 32, None), (2, "b" * 32, None), (3, "c" * 32, None)]
    seqs, mid, new = Head(rows).next_request("wh-a", 2)
    assert (seqs, new) == ([1, 2], True) and mid == message_id("wh-a", ["a" * 32, "b" * 32])
    # pinned: the same rows and id again, though a third is waiting and the batch would take it
    pinned = [(1, "a" * 32, mid), (2, "b" * 32, mid), (3, "c" * 32, None)]
    assert Head(pinned).next_request("wh-a", 3) == ([1, 2], mid, False)
    assert Head([]).next_request("wh-a", 3) == ([], "", False)
    assert message_id("wh-a", ["a" * 32]) != message_id("wh-b", ["a" * 32])
    assert message_id("wh-a", ["a" * 32]) == message_id("wh-a", ["a" * 32])  # again after a purge


def test_the_body_is_the_event_or_an_array() -> None:
    one = orjson.dumps(event(1))
    assert request_body([one], 1) == one
    assert orjson.loads(request_body([one, one], 10)) == [event(1), event(1)]
    assert orjson.loads(request_body([one], 10)) == [event(1)]  # a batch endpoint always gets an array


def test_the_webhooks_queue_and_user() -> None:
    assert d.Binding(t.FENCES_VHOST, t.EVENT_BATCHES_EXCHANGE, t.WEBHOOKS_QUEUE, "") in DEFAULT.bindings
    assert d.Binding(t.FENCES_VHOST, t.EVENTS_EXCHANGE, t.WEBHOOKS_QUEUE, "roam-events.#") in DEFAULT.bindings
    assert t.WEBHOOKS_QUEUE in d.input_queues(Topology(), t.FENCES_VHOST)
    assert may(DEFAULT, t.WEBHOOKS_USER, "gf-fences", "read", "fence.webhooks")
    assert may(DEFAULT, t.WEBHOOKS_USER, "gf-fences", "write", "dead-letters")
    assert not may(DEFAULT, t.WEBHOOKS_USER, "gf-fences", "read", "fence.archive")
    assert not may(DEFAULT, t.WEBHOOKS_USER, "gf-fences", "write", "fence.events")
    assert not may(DEFAULT, t.WEBHOOKS_USER, "gf-fences", "configure", "fence.webhooks")


def test_an_endpoints_timeout_and_retry_window_are_bounded() -> None:
    e = endpoint("wh-a", timeout_s=2, retry_for_s=60)
    assert (e.timeout_s, e.retry_for_s, e.local_ok) == (2.0, 60.0, False)
    for bad in ({"timeout_s": 0}, {"timeout_s": 31}, {"retry_for_s": 0.5}, {"retry_for_s": 10**7},
                {"timeout_s": True}):
        with pytest.raises(ep.InvalidEndpoint):
            endpoint("wh-a", **bad)
