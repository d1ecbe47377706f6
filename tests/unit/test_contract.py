"""Each role's core is what exchanges/contract.py says it is: mypy checks the assignments
below (this file is in mypy's file list), and the tests run each core through its protocol."""

from __future__ import annotations

import numpy as np
from shapely.geometry import box

from exchanges import contract
from exchanges.batch import PositionBatch
from exchanges.fence_binding import FenceBinding
from exchanges.fence_def import FenceDef
from exchanges.fence_events import Event
from exchanges.hash_ring import HashRing
from exchanges.worker_batch import WorkerBatch
from exchanges.worldmap import Worldmap
from exchanges.x_geo.core import XGeo
from fence.x_fence.core import XFence
from ingress.core import Routed, XIngress


class OneWorker(HashRing):
    def __init__(self) -> None:
        super().__init__(["w0"])


def positions(*hs: int) -> PositionBatch:
    n = len(hs)
    return PositionBatch([f"o{i}" for i in range(n)], np.full(n, 9.5), np.full(n, 47.1),
                         np.arange(1.0, n + 1.0), np.array(hs, np.uint64))


def test_x_geo_is_an_exchange_type() -> None:
    geo: contract.ExchangeType[FenceBinding, tuple[str, int], PositionBatch, dict[str, WorkerBatch]] = \
        XGeo("a", ["w0"], OneWorker())
    geo.create()
    geo.add_binding(FenceBinding("f", 1, np.array([[10, 20]], np.uint64), np.array([True])))
    geo.validate(positions(15))
    assert geo.route(positions(15))["w0"].fences == ["f"]
    geo.remove_bindings([("f", 1)])
    left = geo.route(positions(15))  # the worker that had the object hears it left
    assert left["w0"].cand.size == 0
    assert geo.route(positions(15)) == {}
    geo.recover([FenceBinding("f", 2, np.array([[10, 20]], np.uint64), np.array([True]))])
    assert geo.route(positions(15))["w0"].fences == ["f"]


def test_x_ingress_is_a_router() -> None:
    ingress: contract.Router[PositionBatch, Routed] = XIngress(Worldmap.over_area(["a", "b"]))
    batch = PositionBatch(["o"], np.array([9.55]), np.array([47.15]), np.array([1.0]), np.zeros(1, np.uint64))
    assert set(ingress.route(batch).regions) <= {"a", "b"}


def test_x_fence_is_a_stateful_exchange() -> None:
    fence: contract.StatefulExchange[FenceDef, WorkerBatch, list[Event]] = XFence("w0")
    assert fence.define(FenceDef(fence_id="f", version=1, geometry=box(9.0, 47.0, 10.0, 48.0),
                                 timeout_s=60.0), 0.0) == []
    record = fence.changes(0)
    assert record is not None and fence.changes(0) is None
    copy = XFence("w0")
    copy.apply(record)
    assert copy.fences() == ["f"]
    assert fence.drop("f", 1, 1.0) == [] and fence.expire(2.0) == []
    assert fence.snapshot()["worker"] == "w0"
