"""A tenant's live map (fence/map_view.py `scoped`, `tenant_stats`, a tenant's snapshot; the
feed's one encoding per tenant per tick, fence/map_feed.py): only the tenant's objects, counts
and events, named as the tenant names them, never the platform's figures; and the websocket's
Origin check (fence/page_data.py `same_origin`)."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from typing import Any, ClassVar, cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchanges.shell import Counters
from fence.map_feed import HEARTBEAT_S, MapClient, MapFeed
from fence.map_view import PLATFORM_ONLY, MapEvent, MapView, has_news, scoped
from fence.page_data import same_origin


def sample(view: MapView, rows: list[tuple[str, float, float, float]], now: float) -> None:
    ids = [r[0] for r in rows]
    cols = np.array([r[1:] for r in rows], dtype=np.float64).reshape(-1, 3)
    view.add_sample(ids, cols[:, 0].copy(), cols[:, 1].copy(), cols[:, 2].copy(), len(rows) * 10, now)


def two_tenants(now: float = 1.0) -> MapView:
    """acme and zeta, each with a `car-1`; acme's fence `depot` holds 2, zeta's `depot` 5; a
    platform object `hive-1` (no tenant); events of both."""
    v = MapView()
    sample(v, [("acme:car-1", 9.5, 47.1, 1.0), ("zeta:car-1", 9.6, 47.2, 1.0), ("acme:car-2", 9.7, 47.3, 1.0),
               ("hive-1", 9.8, 47.4, 1.0)], now)
    v.set_counts({"acme:depot": 2, "zeta:depot": 5, "acme:yard": 0})
    v.add_events([MapEvent("enter", "acme:depot", "acme:car-1", 1.0, "entered"),
                  MapEvent("leave", "zeta:depot", "zeta:car-1", 1.0, "exited"),
                  MapEvent("enter", "depot", "hive-1", 1.0, "entered")], seen=30, now=now)
    return v


def test_a_tenants_delta_holds_its_own_names_only_unqualified() -> None:
    v = two_tenants()
    frame = v.frame(1.5)
    assert frame is not None
    before = copy.deepcopy(frame)
    stats = v.tenant_stats(["acme"])["acme"]
    mine = scoped(frame, "acme", stats)
    assert frame == before  # pure: the operators' frame is not changed
    assert mine["type"] == "delta" and mine["t"] == 1.5
    assert mine["objects"] == {"ids": ["car-1", "car-2"], "lon": [9.5, 9.7], "lat": [47.1, 47.3]}
    assert mine["counts"] == {"depot": 2, "yard": 0}
    assert mine["events"] == [["enter", "depot", "car-1", 1.0, "entered"]]
    assert mine["stats"] == {"objects": 2, "fences_occupied": 1, "inside": 2}
    assert not set(PLATFORM_ONLY) & mine.keys()  # events_skipped, pending: the platform's
    assert "positions_per_s" not in json.dumps(mine) and "zeta" not in json.dumps(mine)
    theirs = scoped(frame, "zeta", v.tenant_stats(["zeta"])["zeta"])
    assert theirs["objects"]["ids"] == ["car-1"] and theirs["objects"]["lon"] == [9.6]
    assert theirs["counts"] == {"depot": 5} and theirs["stats"]["inside"] == 5
    assert theirs["events"] == [["leave", "depot", "car-1", 1.0, "exited"]]


def test_without_the_tenants_figures_the_platforms_are_dropped() -> None:
    v = two_tenants()
    frame = v.frame(1.5)
    assert frame is not None and frame["stats"]["objects"] == 4
    assert "stats" not in scoped(frame, "acme")


def test_gone_objects_and_a_tenant_with_nothing_in_a_frame() -> None:
    v = MapView(stale_s=10.0)
    sample(v, [("acme:a", 1.0, 1.0, 1.0), ("zeta:b", 1.0, 1.0, 1.0)], now=0.0)
    v.frame(1.0)
    sample(v, [("zeta:b", 1.0, 1.0, 2.0)], now=5.0)
    v.frame(6.0)
    frame = v.frame(12.0)
    assert frame is not None and frame["gone"] == ["acme:a"]
    assert scoped(frame, "acme")["gone"] == ["a"] and has_news(scoped(frame, "acme"))
    assert scoped(frame, "zeta")["gone"] == [] and not has_news(scoped(frame, "zeta"))
    assert v.tenant_stats(["acme", "zeta", "none"]) == {
        "acme": {"objects": 0, "fences_occupied": 0, "inside": 0},
        "zeta": {"objects": 1, "fences_occupied": 0, "inside": 0},
        "none": {"objects": 0, "fences_occupied": 0, "inside": 0}}


def test_a_tenant_named_as_a_prefix_of_another_sees_only_its_own() -> None:
    v = MapView()
    sample(v, [("ac:x", 1.0, 1.0, 1.0), ("acme:y", 2.0, 2.0, 1.0), ("ac-me:z", 3.0, 3.0, 1.0)], now=1.0)
    frame = v.frame(1.0)
    assert frame is not None
    assert scoped(frame, "ac")["objects"]["ids"] == ["x"]


def test_an_event_across_tenants_reaches_neither() -> None:
    """x-fence never makes one (a fence sees its tenant's objects only); were it to, no map of
    either tenant would name the other's object or fence."""
    frame = {"type": "delta", "events": [["enter", "acme:depot", "zeta:car-1", 1.0, "entered"]]}
    assert scoped(frame, "acme")["events"] == [] and scoped(frame, "zeta")["events"] == []


@pytest.mark.parametrize("bad", ["", "Acme", "a:b", "-x"])
def test_scoping_needs_a_tenant_id(bad: str) -> None:
    with pytest.raises(ValueError, match="not a tenant id"):
        scoped({"type": "delta"}, bad)


def test_a_tenants_snapshot_its_objects_counts_recent_events_and_figures() -> None:
    v = two_tenants()
    whole = v.snapshot(2.0)
    assert len(whole["objects"]["ids"]) == 4 and len(whole["events"]) == 3  # the operators'
    snap = v.snapshot(2.0, "zeta")
    mine = scoped(snap, "zeta", snap["stats"])
    assert mine["type"] == "snapshot"
    assert mine["objects"] == {"ids": ["car-1"], "lon": [9.6], "lat": [47.2]}
    assert mine["counts"] == {"depot": 5}
    assert mine["events"] == [["leave", "depot", "car-1", 1.0, "exited"]]
    assert mine["stats"] == {"objects": 1, "fences_occupied": 1, "inside": 5}


def test_a_tenants_recent_events_are_its_own_whoever_floods() -> None:
    v = MapView()
    v.add_events([MapEvent("enter", "acme:f", "acme:o", 0.0, "entered")], seen=1, now=0.0)
    v.add_events([MapEvent("enter", "zeta:f", f"zeta:o{i}", 1.0, "entered") for i in range(500)], seen=500,
                 now=1.0)
    snap = v.snapshot(2.0, "acme")
    assert [e[2] for e in snap["events"]] == ["acme:o"]  # not pushed out by zeta's 500


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["acme", "zeta", ""]), st.integers(0, 5)), max_size=30))
def test_a_tenants_frame_is_the_frame_filtered_by_its_prefix(rows: list[tuple[str, int]]) -> None:
    v = MapView()
    ids = list(dict.fromkeys(f"{t}:o{k}" if t else f"o{k}" for t, k in rows))
    if ids:
        sample(v, [(i, 1.0, 2.0, 3.0) for i in ids], now=1.0)
    v.set_counts({f"{t}:f{k}" if t else f"f{k}": k for t, k in rows})
    frame = v.frame(1.0)
    for tenant in ("acme", "zeta"):
        mine = scoped(frame or {"objects": {"ids": [], "lon": [], "lat": []}}, tenant)
        assert mine["objects"]["ids"] == [i.split(":", 1)[1] for i in ids if i.startswith(f"{tenant}:")]
        assert all(":" not in k for k in mine.get("counts", {}))
    stats = v.tenant_stats(["acme", "zeta"])
    assert sum(s["objects"] for s in stats.values()) == sum(1 for i in ids if ":" in i)


# --------------------------------------------------------------------------- the feed


class Manager:
    workers: ClassVar[list[str]] = []


def feed_with(view: MapView) -> MapFeed:
    return MapFeed(cast(Any, None), cast(Any, Manager()), Counters(), view)


def mailbox(client: MapClient) -> bytes | None:
    return client._frame


def test_one_encoding_per_tenant_per_tick_and_each_map_its_tenants() -> None:
    v = two_tenants()
    feed = feed_with(v)
    acme1, acme2, zeta, everyone = feed.join("acme"), feed.join("acme"), feed.join("zeta"), feed.join()
    feed.tick(1.5, 100.0)
    assert feed.counters.to_json()["map_frames"] == 3  # acme, zeta, the operators: three encodings
    got = {c: mailbox(c) for c in (acme1, acme2, zeta, everyone)}
    assert got[acme1] is got[acme2]  # the same bytes offered to both of acme's maps
    a, z, e = (json.loads(cast(bytes, got[c])) for c in (acme1, zeta, everyone))
    assert a["objects"]["ids"] == ["car-1", "car-2"] and z["objects"]["ids"] == ["car-1"]
    assert "zeta" not in json.dumps(a) and "acme" not in json.dumps(z)
    assert sorted(e["objects"]["ids"]) == ["acme:car-1", "acme:car-2", "hive-1", "zeta:car-1"]
    assert e["events_skipped"] == 27 and "positions_per_s" in e["stats"]  # the operators' frame as ever


def test_a_tenant_with_nothing_new_gets_only_the_heartbeat() -> None:
    v = MapView()
    feed = feed_with(v)
    acme, zeta = feed.join("acme"), feed.join("zeta")
    feed.tick(1.0, 100.0)  # nothing at all
    assert mailbox(acme) is None and mailbox(zeta) is None
    sample(v, [("zeta:car-1", 1.0, 1.0, 1.0)], now=1.0)
    feed.tick(1.5, 100.5)
    assert mailbox(acme) is None and mailbox(zeta) is not None
    feed.tick(2.0 + HEARTBEAT_S, 100.0 + HEARTBEAT_S)
    beat = json.loads(cast(bytes, mailbox(acme)))
    assert beat == {"type": "stats", "t": 2.0 + HEARTBEAT_S, "live": True,
                    "stats": {"objects": 0, "fences_occupied": 0, "inside": 0}}


async def test_snapshots_per_tenant_encoded_once_per_period() -> None:
    v = two_tenants(time.time())  # the feed's snapshots are of now
    feed = feed_with(v)
    acme, everyone = feed.join("acme"), feed.join()
    first = await acme.next(lambda: feed.snapshot(acme.tenant))
    assert first is feed.snapshot("acme")  # cached: encoded once in the frame period
    snap = json.loads(first)
    assert snap["type"] == "snapshot" and snap["objects"]["ids"] == ["car-1", "car-2"]
    assert snap["live"] is False
    assert snap["counts"] == {"depot": 2, "yard": 0} and "positions_per_s" not in snap["stats"]
    whole = json.loads(await everyone.next(lambda: feed.snapshot(everyone.tenant)))
    assert len(whole["objects"]["ids"]) == 4 and "positions_per_s" in whole["stats"]
    feed.leave(acme)
    assert "acme" not in feed._snapshots  # no map of acme left: its snapshot goes
    await asyncio.sleep(0)


# --------------------------------------------------------------------------- the socket's Origin


@pytest.mark.parametrize(("origin", "scheme", "host", "ok"), [
    (None, "ws", "127.0.0.1:8080", True),  # no Origin: not a browser
    ("http://127.0.0.1:8080", "ws", "127.0.0.1:8080", True),
    ("http://LOCALHOST:8080", "ws", "localhost:8080", True),
    ("https://maps.example.org", "wss", "maps.example.org", True),
    ("https://maps.example.org:443", "wss", "maps.example.org", True),
    ("http://maps.example.org", "ws", "maps.example.org:80", True),
    ("http://[::1]:8080", "ws", "[::1]:8080", True),
    ("http://evil.example", "ws", "127.0.0.1:8080", False),
    ("http://127.0.0.1:8081", "ws", "127.0.0.1:8080", False),
    ("https://127.0.0.1:8080", "ws", "127.0.0.1:8080", False),  # another scheme
    ("http://maps.example.org", "wss", "maps.example.org", False),
    ("http://localhost:8080", "ws", "127.0.0.1:8080", False),
    ("null", "ws", "127.0.0.1:8080", False),
    ("", "ws", "127.0.0.1:8080", False),
    ("file://", "ws", "127.0.0.1:8080", False),
    ("http://127.0.0.1:8080@evil.example", "ws", "127.0.0.1:8080", False),
    ("http://u@127.0.0.1:8080", "ws", "127.0.0.1:8080", False),
    ("http://127.0.0.1:99999", "ws", "127.0.0.1:99999", False),
    ("http://127.0.0.1:8080/map", "ws", "127.0.0.1:8080", False),
    ("http://127.0.0.1:8080", "ws", None, False),
])
def test_same_origin(origin: str | None, scheme: str, host: str | None, ok: bool) -> None:
    assert same_origin(origin, scheme, host) is ok
