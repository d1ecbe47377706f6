"""An object's own TTL (issue 20): a position may carry `ttl` (seconds); an object silent past
the TTL of its latest position LEAVEs every fence it is in with reason `expired`, dated last
seen + TTL, unless the fence's own timeout comes first (then `timeout`, as before). x-ingress
refuses a bad `ttl`; the TTL survives the journal, a snapshot of the older format (no TTL),
and a worker handover."""

from __future__ import annotations

import json

import numpy as np
import pytest
from shapely.geometry import box

from exchanges.batch import PositionBatch
from exchanges.fence_def import FenceDef
from exchanges.fence_events import EXPIRED, TIMEOUT
from exchanges.hash_ring import HashRing
from exchanges.worker_batch import WorkerBatch
from fence.reference import visit_problems
from fence.x_fence import codec
from fence.x_fence.core import XFence
from ingress.positions import decode_batch

INSIDE = (0.5, 0.5)


def seen(x: XFence, oid: str, ts: float, ttl: float | None = None, fences: tuple[str, ...] = ("F", "G"),
         where: tuple[float, float] = INSIDE) -> list:  # type: ignore[type-arg]
    """One position of `oid` routed to the worker with `fences` as candidates."""
    extra = [{"ttl": ttl}] if ttl is not None else []
    pos = PositionBatch([oid], np.array([where[0]]), np.array([where[1]]), np.array([ts]),
                        np.zeros(1, np.uint64), extra)
    wb = WorkerBatch(x.worker, pos, np.array([0, len(fences)], np.int64), list(fences),
                     np.arange(len(fences), dtype=np.int32), np.zeros(len(fences), bool))
    return x.route(wb)


def worker(timeout_f: float = 300.0, timeout_g: float = 20.0) -> XFence:
    x = XFence("w0")
    x.define(FenceDef(fence_id="F", version=1, geometry=box(0, 0, 1, 1), timeout_s=timeout_f), 0.0)
    x.define(FenceDef(fence_id="G", version=1, geometry=box(0, 0, 1, 1), timeout_s=timeout_g), 0.0)
    return x


def test_an_object_past_its_ttl_leaves_every_fence_expired_unless_the_timeout_comes_first() -> None:
    x = worker()
    entered = seen(x, "o", 100.0, ttl=30.0)
    assert sorted(e.fence_id for e in entered) == ["F", "G"]
    assert x.expire(100.0 + 19.0) == []
    first = x.expire(100.0 + 21.0)  # G's timeout (20 s) comes before the TTL (30 s)
    assert [(e.fence_id, e.reason, e.ts) for e in first] == [("G", TIMEOUT, 120.0)]
    assert x.expire(100.0 + 29.0) == []
    left = x.expire(100.0 + 31.0)
    assert [(e.event, e.fence_id, e.reason, e.ts, e.inside_s) for e in left] == [
        ("leave", "F", EXPIRED, 130.0, 30.0)]
    assert visit_problems(entered + first + left) == []
    assert x.fences_of("o") == []


def test_the_latest_position_says_the_ttl() -> None:
    x = worker(timeout_g=1e6)
    seen(x, "o", 100.0, ttl=30.0)
    seen(x, "o", 110.0)  # no ttl: none any more
    assert x.expire(141.0) == []
    assert [(e.fence_id, e.reason, e.ts) for e in x.expire(411.0)] == [("F", TIMEOUT, 410.0)]
    y = worker(timeout_g=1e6)
    seen(y, "o", 100.0)
    seen(y, "o", 110.0, ttl=5.0)  # a TTL from now on
    assert [(e.fence_id, e.reason, e.ts) for e in y.expire(116.0)] == [("F", EXPIRED, 115.0),
                                                                       ("G", EXPIRED, 115.0)]
    z = worker(timeout_g=1e6)
    seen(z, "o", 100.0, ttl=5.0)
    seen(z, "o", 90.0, ttl=1000.0)  # stale: changes nothing, its TTL neither
    assert [e.reason for e in z.expire(106.0)] == [EXPIRED, EXPIRED]


def test_no_ttl_keeps_the_timeouts() -> None:
    x = worker()
    seen(x, "o", 100.0)
    assert [(e.fence_id, e.reason) for e in x.expire(121.0)] == [("G", TIMEOUT)]
    assert x.expire(399.0) == []
    assert [(e.fence_id, e.reason) for e in x.expire(401.0)] == [("F", TIMEOUT)]


def test_the_ttl_survives_the_journal_an_old_snapshot_and_a_handover() -> None:
    x = worker(timeout_g=1e6)
    snap = x.snapshot()
    seen(x, "o", 100.0, ttl=30.0)
    record = x.changes(0)
    replayed = XFence.restore(snap)
    assert record is not None
    replayed.apply(record)
    assert [e.reason for e in replayed.expire(131.0)] == [EXPIRED, EXPIRED]

    data = x.state()  # the same state as the previous format wrote it
    data["format"] = 1
    del data["ttl"]
    old = XFence.restore(data)
    assert old.expire(131.0) == [] and [e.reason for e in old.expire(1e9)] == [TIMEOUT, TIMEOUT]

    b = XFence("w1")
    data = x.export(HashRing(["w1"]))
    assert b.take(data, HashRing(["w1"])) == 2
    assert [e.reason for e in b.expire(131.0)] == [EXPIRED, EXPIRED]
    assert XFence("w1").take({k: v for k, v in data.items() if k != "ttl"} | {"format": 1},
                             HashRing(["w1"])) == 2  # an export of the previous format
    with pytest.raises(ValueError, match="format"):
        XFence.restore({**x.state(), "format": codec.FORMAT + 1})


@pytest.mark.parametrize("ttl", [0, -5, 604_801, True, "30", None, [30]])
def test_x_ingress_refuses_a_bad_ttl(ttl: object) -> None:
    body = {"positions": [{"id": "o", "lon": 9.5, "lat": 47.1, "ts": 1.7e9, "ttl": ttl},
                          {"id": "p", "lon": 9.5, "lat": 47.1, "ts": 1.7e9, "ttl": 60}]}
    got = decode_batch(json.dumps(body).encode(), "application/json")
    assert got.batch.ids == ["p"] and got.batch.extra == [{"ttl": 60}]
    assert len(got.refused) == 1 and "ttl" in got.refused[0][1]
