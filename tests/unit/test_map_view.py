"""The live map's pure parts: x-ingress's sample (ingress/map_tap.py), the map's state and frames
(fence/map_view.py), a map's one-frame mailbox (fence/map_feed.MapClient), the roads layer
(deploy/demo/map_roads.py) and the map's settings."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.demo.map_roads import roads_geojson
from deploy.demo.osm_extract import HIGHWAY_CLASSES, road_network
from deploy.settings import Settings, SettingsError
from exchanges.batch import PositionBatch, pack, unpack
from exchanges.shell import ConfigError
from fence.api_server import ApiConfig
from fence.map_feed import RESYNC_S, ClientGone, MapClient
from fence.map_view import MapEvent, MapView, parse_events
from fence.x_fence.sidecar import MAP_EVENTS
from ingress.map_tap import MapSampler


def batch(rows: list[tuple[str, float, float, float]]) -> PositionBatch:
    ids = [r[0] for r in rows]
    cols = np.array([r[1:] for r in rows], dtype=np.float64).reshape(-1, 3)
    return PositionBatch(ids, cols[:, 0].copy(), cols[:, 1].copy(), cols[:, 2].copy(),
                         np.zeros(len(ids), np.uint64), [{"speed": 3}] * len(ids))


# --------------------------------------------------------------------------- x-ingress's sample


def test_sample_keeps_each_objects_last_position_and_drops_the_attributes() -> None:
    s = MapSampler()
    assert s.take() is None
    s.note(batch([("a", 1.0, 2.0, 10.0), ("b", 3.0, 4.0, 10.0)]))
    s.note(PositionBatch.empty())
    s.note(batch([("a", 1.5, 2.5, 11.0)]))
    got = s.take()
    assert got is not None and (got.moved, got.positions) == (2, 3)
    rows = {i: (x, y, t) for i, x, y, t in zip(got.batch.ids, got.batch.lon, got.batch.lat, got.batch.ts,
                                                 strict=True)}
    assert rows == {"a": (1.5, 2.5, 11.0), "b": (3.0, 4.0, 10.0)}
    assert got.batch.extra == []
    assert s.take() is None  # a new window
    wire = unpack(pack("map", **got.to_wire()))
    back = PositionBatch.from_wire(wire["batch"])
    assert back.ids == got.batch.ids and wire["moved"] == 2 and wire["positions"] == 3


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.integers(1, 50))
def test_over_the_limit_every_object_gets_its_turn(n: int, limit: int) -> None:
    s = MapSampler(limit)
    ids = [f"o{i}" for i in range(n)]
    seen: set[str] = set()
    turns = -(-n // limit)
    for k in range(turns):
        s.note(batch([(o, float(k), 0.0, float(k)) for o in ids]))
        got = s.take()
        assert got is not None and got.moved == n and len(got.batch) <= limit
        assert all(x == float(k) for x in got.batch.lon)  # the latest, never an older one
        seen.update(got.batch.ids)
    assert seen == set(ids)


def test_sampler_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        MapSampler(0)


# --------------------------------------------------------------------------- the map's state


def sample(view: MapView, rows: list[tuple[str, float, float, float]], now: float,
           positions: int = 0) -> None:
    b = batch(rows)
    view.add_sample(b.ids, b.lon, b.lat, b.ts, positions or len(rows), now)


def test_first_frame_then_deltas_with_only_what_changed() -> None:
    v = MapView()
    assert v.frame(0.0) is None
    sample(v, [("a", 9.5, 47.1, 1.0), ("b", 9.6, 47.2, 1.0)], now=1.0)
    v.set_counts({"f1": 2})
    f = v.frame(1.5)
    assert f is not None and f["type"] == "delta"
    assert f["objects"] == {"ids": ["a", "b"], "lon": [9.5, 9.6], "lat": [47.1, 47.2]}
    assert f["counts"] == {"f1": 2} and f["gone"] == [] and f["events"] == []
    assert v.frame(2.0) is None  # nothing new
    sample(v, [("b", 9.61, 47.21, 2.0)], now=2.5)
    v.set_counts({"f1": 2})  # unchanged: not sent again
    f = v.frame(3.0)
    assert f is not None and f["objects"]["ids"] == ["b"] and f["counts"] == {}
    v.set_counts({"f2": 1})  # f1 left out: it holds nobody now
    f = v.frame(3.5)
    assert f is not None and f["counts"] == {"f1": 0, "f2": 1} and f["objects"]["ids"] == []


def test_an_older_sample_does_not_move_an_object_back() -> None:
    v = MapView()
    sample(v, [("a", 2.0, 2.0, 20.0)], now=1.0)
    sample(v, [("a", 1.0, 1.0, 10.0)], now=1.1)  # another x-ingress, late
    assert v.position("a") == (2.0, 2.0, 20.0)


def test_coordinates_are_rounded_for_the_wire() -> None:
    v = MapView()
    sample(v, [("a", 9.123456789, 47.987654321, 1.0)], now=1.0)
    assert v.position("a") == (9.12346, 47.98765, 1.0)


def test_frames_are_capped_and_the_rest_waits_its_turn_oldest_first() -> None:
    v = MapView(frame_objects=3)
    sample(v, [(f"o{i}", float(i), 0.0, 1.0) for i in range(7)], now=1.0)
    sent = []
    for k in range(3):
        f = v.frame(2.0 + k)
        assert f is not None and len(f["objects"]["ids"]) <= 3
        sent += f["objects"]["ids"]
        if k == 0:
            assert f["pending"] == 4
    assert sent == [f"o{i}" for i in range(7)]


def test_stale_objects_leave_the_map() -> None:
    v = MapView(stale_s=10.0)
    sample(v, [("a", 1.0, 1.0, 1.0)], now=0.0)
    sample(v, [("b", 1.0, 1.0, 1.0)], now=5.0)
    v.frame(6.0)
    f = v.frame(12.0)
    assert f is not None and f["gone"] == ["a"] and len(v) == 1
    sample(v, [("b", 1.0, 1.0, 2.0)], now=14.0)  # seen again: its clock starts again
    assert v.frame(20.0) is not None and len(v) == 1


def test_events_are_capped_per_frame_and_the_rest_counted() -> None:
    v = MapView(frame_events=2)
    evs = [MapEvent("enter", "f", f"o{i}", float(i), "entered") for i in range(5)]
    v.add_events(evs, seen=40, now=1.0)
    f = v.frame(1.0)
    assert f is not None and f["events"] == [e.to_json() for e in evs[:2]] and f["events_skipped"] == 38
    snap = v.snapshot(1.5)
    assert snap["events"] == [e.to_json() for e in evs]  # the recent ones, for a new map
    assert v.frame(2.0) is None


def test_snapshot_has_everything_and_the_rates() -> None:
    v = MapView(snapshot_objects=2)
    sample(v, [("a", 1.0, 1.0, 1.0), ("b", 2.0, 2.0, 1.0), ("c", 3.0, 3.0, 1.0)], now=1.0, positions=50)
    v.set_counts({"f": 3, "g": 0})
    v.add_events([], seen=20, now=1.0)
    s = v.snapshot(2.0)
    assert s["type"] == "snapshot" and s["objects"]["ids"] == ["b", "c"]  # the most recently seen
    assert s["counts"] == {"f": 3, "g": 0}
    assert s["stats"] == {"objects": 3, "fences_occupied": 1, "inside": 3, "positions_per_s": 5.0,
                          "events_per_s": 2.0}
    assert v.stats(100.0)["positions_per_s"] == 0.0  # out of the window
    json.dumps(s)  # plain data


def test_parse_events() -> None:
    wire = [{"event": "enter", "fence_id": "f", "object_id": "o", "ts": 1.5, "reason": "entered",
             "event_id": "x"}]
    assert parse_events(wire) == [MapEvent("enter", "f", "o", 1.5, "entered")]
    for bad in ({"event": "enter"}, [{"event": "enter"}], [{"event": "e", "fence_id": "f", "object_id": "o",
                                                            "ts": "soon", "reason": "r"}], [3]):
        with pytest.raises(ValueError):
            parse_events(bad)


# --------------------------------------------------------------------------- a map's mailbox


async def test_a_map_gets_a_snapshot_first_then_the_newest_frame() -> None:
    c = MapClient()
    assert await c.next(lambda: b"snap") == b"snap"
    c.offer(b"d1")
    assert await c.next(lambda: b"snap") == b"d1"
    waiting = asyncio.ensure_future(c.next(lambda: b"snap"))
    await asyncio.sleep(0)
    assert not waiting.done()  # nothing new: it waits
    c.offer(b"d2")
    assert await asyncio.wait_for(waiting, 1) == b"d2"
    assert (c.sent, c.dropped) == (3, 0)


async def test_a_slow_map_loses_frames_and_is_resynced_at_most_every_few_seconds() -> None:
    c = MapClient()
    await c.next(lambda: b"snap")
    c.offer(b"d1")
    c.offer(b"d2")  # d1 was never taken
    assert c.dropped == 1
    # a snapshot was sent less than RESYNC_S ago: the newest delta instead
    assert await c.next(lambda: b"snap2") == b"d2"
    c.last_snapshot -= RESYNC_S
    c.offer(b"d3")
    c.offer(b"d4")
    assert await c.next(lambda: b"snap3") == b"snap3"


async def test_a_closed_feed_ends_the_map() -> None:
    c = MapClient()
    c.close()
    with pytest.raises(ClientGone):
        await c.next(lambda: b"snap")


# --------------------------------------------------------------------------- roads, settings


def test_roads_layer_draws_each_road_once_by_class() -> None:
    net = road_network()
    features = cast(list[Any], roads_geojson(net)["features"])
    ranks = [f["properties"]["rank"] for f in features]
    classes = {f["properties"]["highway"] for f in features}
    assert ranks == sorted(ranks) and classes <= set(HIGHWAY_CLASSES)
    segments = sum(len(f["geometry"]["coordinates"]) for f in features)
    pairs = {(min(a, b), max(a, b)) for a, b in zip(net.src.tolist(), net.dst.tolist(), strict=True)}
    assert segments == len(pairs)
    x0, y0, x1, y1 = net.bbox
    for f in features:
        for line in f["geometry"]["coordinates"]:
            assert len(line) == 2 and all(x0 - 1e-4 <= x <= x1 + 1e-4 and y0 - 1e-4 <= y <= y1 + 1e-4
                                          for x, y in line)


def test_tile_url_settings() -> None:
    env = {"GEOFENCE_AMQP_URL": "amqp://u:p@h/", "GEOFENCE_POSTGRES_URL": "postgresql://u:p@h/db"}
    ok = "https://tile.example.org/{z}/{x}/{y}.png"
    assert ApiConfig.from_env({**env, "GEOFENCE_MAP_TILES": ok}).map_tiles == ok
    roads = ApiConfig.from_env({**env, "GEOFENCE_MAP_ROADS": "/x/roads.geojson"}).map_roads
    assert roads == "/x/roads.geojson"
    for bad in ("tile.example.org/{z}/{x}/{y}.png", "https://tile.example.org/{z}/{x}.png"):
        with pytest.raises(ConfigError, match="GEOFENCE_MAP_TILES"):
            ApiConfig.from_env({**env, "GEOFENCE_MAP_TILES": bad})
        with pytest.raises(SettingsError, match="GEOFENCE_MAP_TILES"):
            Settings.from_env({"GEOFENCE_MAP_TILES": bad})
    assert Settings.from_env({"GEOFENCE_MAP_TILES": ok}).map_tiles == ok
    assert Settings.from_env({}).map_tiles is None



def worker_with_events(n: int) -> object:
    """An x-fence sidecar's map-sample state after it published `n` events (FenceSidecar.event_outs
    on a stand-in for the sidecar: the code the worker runs, without a broker)."""
    from types import SimpleNamespace

    from exchanges.fence_events import Event, event_id
    from exchanges.shell import Counters
    from fence.x_fence.sidecar import FenceSidecar

    fake = SimpleNamespace(counters=Counters(), events="events", event_batches="batches",
                           tenant_batches="tenant-batches", worker="w0",
                           map_tail=deque(maxlen=MAP_EVENTS), map_seen=0, map_out=None)
    for at in range(0, n, 700):  # in batches, as they come
        events = [Event("enter" if i % 3 else "leave", f"f-{i % 7}", f"o-{i}", 1000.0 + i, "entered",
                        event_id(f"f-{i % 7}", 1, f"o-{i}", "enter", "entered", 1000.0 + i))
                  for i in range(at, min(n, at + 700))]
        FenceSidecar.event_outs(fake, events)  # type: ignore[arg-type]
    return fake


@pytest.mark.parametrize("n", [1, 199, 200, 201, 2500])
async def test_a_workers_event_sample_is_its_newest_events_and_their_count(n: int) -> None:
    from fence.x_fence.sidecar import FenceSidecar

    published: list[bytes] = []

    class Exchange:
        async def publish(self, message: Any, routing_key: str, mandatory: bool = True) -> None:
            assert not mandatory and routing_key == ""
            published.append(message.body)

    fake = worker_with_events(n)
    fake.map_out = Exchange()  # type: ignore[attr-defined]
    await FenceSidecar.send_map_sample(fake)  # type: ignore[arg-type]
    await FenceSidecar.send_map_sample(fake)  # type: ignore[arg-type]  # nothing new: nothing sent
    assert len(published) == 1
    msg = json.loads(published[0])
    events = parse_events(msg["events"])
    assert msg["seen"] == n and len(events) == min(n, MAP_EVENTS)
    assert [e.object_id for e in events] == [f"o-{i}" for i in range(max(0, n - MAP_EVENTS), n)]
    v = MapView()
    v.add_events(events, msg["seen"], now=1.0)
    f = v.frame(1.0)
    assert f is not None and len(f["events"]) == min(n, MAP_EVENTS)
    assert f["events_skipped"] == n - len(f["events"])


async def test_x_ingress_samples_only_while_a_map_listens() -> None:
    """IngressSidecar.send_map_sample on a stand-in: a returned sample (no queue bound) stops the
    sampling and probes instead; a probe that is routed starts it again."""
    from types import SimpleNamespace

    import aiormq

    from exchanges.shell import Counters
    from ingress.sidecar import IngressSidecar

    sent: list[dict[str, Any]] = []
    bound = {"yes": False}
    fake = SimpleNamespace(map_sampler=MapSampler(), map_listening=True, counters=Counters())

    class Exchange:
        async def publish(self, message: Any, routing_key: str, mandatory: bool = False) -> None:
            assert mandatory
            sent.append(unpack(message.body))
            if not bound["yes"]:
                raise aiormq.exceptions.DeliveryError(None, None)  # type: ignore[arg-type]  # returned

    fake.map_out = Exchange()
    tick = IngressSidecar.send_map_sample
    fake.map_sampler.note(batch([("a", 1.0, 2.0, 3.0)]))
    await tick(fake)  # type: ignore[arg-type]
    assert len(sent[-1]["batch"]["ids"]) == 1 and not fake.map_listening  # nobody bound: returned
    await tick(fake)  # type: ignore[arg-type]
    assert sent[-1]["batch"]["ids"] == [] and not fake.map_listening  # a probe, returned too
    bound["yes"] = True  # a map opens
    await tick(fake)  # type: ignore[arg-type]
    assert sent[-1]["batch"]["ids"] == [] and fake.map_listening  # the probe was routed
    fake.map_sampler.note(batch([("b", 1.0, 2.0, 3.0)]))  # the sidecar notes batches again
    await tick(fake)  # type: ignore[arg-type]
    assert sent[-1]["batch"]["ids"] == ["b"] and sent[-1]["positions"] == 1 and fake.map_listening
    counts = fake.counters.to_json()
    assert counts["map_samples"] == 2 and counts["map_probes"] == 2
