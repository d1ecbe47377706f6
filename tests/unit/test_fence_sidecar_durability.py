"""x-fence's shell around its journal: a session that ends with a batch routed but not
journaled (its publish cut off) starts the next one from the journal, so the redelivered
batch gives its events again with the same ids; a stop then snapshots nothing unacked."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from unittest import mock

import numpy as np
import orjson
import pytest
from aio_pika.abc import AbstractIncomingMessage
from shapely.geometry import box

from exchanges import control, shell
from exchanges.batch import PositionBatch, pack
from exchanges.fence_binding import FenceBinding
from exchanges.fence_def import FenceDef
from exchanges.hash_ring import HashRing
from exchanges.x_geo.core import XGeo
from fence.x_fence.sidecar import FenceSidecar

TS = 1_700_000_000.0
FENCE = FenceDef(fence_id="f-1", version=1, geometry=box(-20.0, -10.0, 20.0, 10.0), timeout_s=300.0,
                 name="near 0,0")
HALF = 1 << 51  # Hilbert indices below are inside f-1's (interior) binding, above outside
BINDING = FenceBinding("f-1", 1, np.array([[0, HALF - 1]], np.uint64), np.array([True]))


@dataclass
class Msg:
    body: bytes
    routing_key: str = "w0"
    content_type: str = "application/msgpack"
    headers: dict[str, Any] | None = None
    message_id: str | None = None
    acked: bool = False

    async def ack(self, multiple: bool = False) -> None:
        self.acked = True


@dataclass(frozen=True)
class Exchange:
    name: str


@contextlib.contextmanager
def publishing(fail: bool = False) -> Iterator[list[shell.Out]]:
    """shell.publish_all into a list; with `fail`, the connection drops under the publish."""
    outs: list[shell.Out] = []

    async def publish_all(o: Sequence[shell.Out | shell.Plains], counters: shell.Counters,
                          deadline: float | None = None, retry: bool = True) -> None:
        outs.extend(m for x in o for m in (x.outs() if isinstance(x, shell.Plains) else [x]))
        if fail:
            raise ConnectionError("connection reset under the publish")

    # the sidecar's own calls and its pipeline's (shell.send looks up publish.publish_all)
    with mock.patch.object(shell, "publish_all", publish_all), \
            mock.patch.object(shell.publish, "publish_all", publish_all):
        yield outs


async def settled(sc: FenceSidecar, handled: Awaitable[None]) -> None:
    """A step handed to the pipeline, then its tail (confirms, journal record, ack); a tail
    that fails closes the pipeline, as a session's end does."""
    await handled
    try:
        await sc.pipeline.drain()
    except BaseException:
        await sc.pipeline.close()
        raise


def sidecar(journal_dir: Path) -> FenceSidecar:
    config = shell.SidecarConfig("x-fence", "w0", "amqp://t@localhost/", "postgresql://t@localhost/",
                                 ("a",), ("w0",), journal_dir=str(journal_dir))
    with mock.patch("fence.x_fence.sidecar.HashRing", lambda workers: HashRing(list(workers))):
        sc = FenceSidecar(config)
    sc.dlx, sc.events, sc.event_batches, sc.tenant_batches = (
        cast(Any, Exchange(n)) for n in ("dead-letters", "fence.events", "fence.event-batches",
                                         "fence.tenant-batches"))
    return sc


def positions(geo: XGeo, ts: float, h: int) -> list[AbstractIncomingMessage]:
    pb = PositionBatch(["car-1"], np.zeros(1), np.zeros(1), np.full(1, ts), np.full(1, h, np.uint64))
    parts = [wb.to_wire() for wb in geo.route(pb).values()]
    assert parts, "x-geo routed the position to the worker"
    return cast(list[AbstractIncomingMessage], [Msg(pack("positions", parts=parts))])


def events(outs: list[shell.Out]) -> list[tuple[str, str, float]]:
    got = [orjson.loads(o.body) for o in outs if o.exchange.name == "fence.events"]
    return [(e["event_id"], e["event"], e["ts"]) for e in got]


@pytest.fixture
def geo() -> XGeo:
    g = XGeo("a", ["w0"], HashRing(["w0"]))
    g.add_binding(BINDING)
    return g


async def started(journal_dir: Path) -> FenceSidecar:
    """A worker as its first session leaves it after `_prepare` (recovered: no PostgreSQL here)."""
    sc = sidecar(journal_dir)
    sc.core.define(FENCE, TS - 100)
    sc.recovered = True
    with publishing():
        await sc._prepare(asyncio.Event())
    assert sc.ready and sc.started
    return sc


async def test_a_batch_cut_off_before_its_record_is_routed_again_from_the_journal(
        tmp_path: Path, geo: XGeo) -> None:
    sc = await started(tmp_path)
    with publishing() as outs:
        await settled(sc, sc.handle_inputs(positions(geo, TS, 5)))
    assert [e[1] for e in events(outs)] == ["enter"]
    leave = positions(geo, TS + 1, HALF + 5)
    with publishing(fail=True) as cut, pytest.raises(ConnectionError):
        await settled(sc, sc.handle_inputs(leave))
    first = events(cut)
    assert [e[1] for e in first] == ["leave"] and sc.unpersisted
    await sc._reload()  # what the next session does first
    assert not sc.unpersisted and sc.core.fences_of("car-1") == ["f-1"]
    with publishing():
        await sc._start_journal()
    with publishing() as again:
        await settled(sc, sc.handle_inputs(leave))  # the redelivery
    assert events(again) == first  # the same event, with the same id
    assert sc.core.fences_of("car-1") == []


async def test_without_the_reload_the_redelivered_batch_would_give_nothing(tmp_path: Path, geo: XGeo) -> None:
    """What the reload is for: the core kept the cut-off batch's effects."""
    sc = await started(tmp_path)
    with publishing():
        await settled(sc, sc.handle_inputs(positions(geo, TS, 5)))
    leave = positions(geo, TS + 1, HALF + 5)
    with publishing(fail=True), pytest.raises(ConnectionError):
        await settled(sc, sc.handle_inputs(leave))
    with publishing() as again:
        await settled(sc, sc.handle_inputs(leave))
    assert events(again) == []


async def test_a_stop_after_a_cut_off_batch_snapshots_nothing_unacked(tmp_path: Path, geo: XGeo) -> None:
    sc = await started(tmp_path)
    with publishing():
        await settled(sc, sc.handle_inputs(positions(geo, TS, 5)))
    with publishing(fail=True), pytest.raises(ConnectionError):
        await settled(sc, sc.handle_inputs(positions(geo, TS + 1, HALF + 5)))
    await sc.close()
    restarted = sidecar(tmp_path)
    restarted._load()
    assert restarted.core.fences_of("car-1") == ["f-1"]  # the acked state: still inside


async def test_a_clean_stop_snapshots_and_the_next_start_has_the_same_state(tmp_path: Path,
                                                                           geo: XGeo) -> None:
    sc = await started(tmp_path)
    with publishing():
        await settled(sc, sc.handle_inputs(positions(geo, TS, 5)))
    assert not sc.unpersisted
    await sc.close()
    restarted = sidecar(tmp_path)
    where = restarted._load()
    assert where.endswith("+ 0 journal records"), where  # a snapshot, no journal to replay
    assert restarted.core.fences_of("car-1") == ["f-1"]


async def test_expire_cut_off_before_its_record_is_reloaded(tmp_path: Path, geo: XGeo) -> None:
    sc = await started(tmp_path)
    with publishing():
        await settled(sc, sc.handle_inputs(positions(geo, TS, 5)))
    sc.stream_ts = TS + 400  # message time past the fence's timeout (300 s)
    with publishing(fail=True) as cut, pytest.raises(ConnectionError):
        await settled(sc, sc.expire())
    assert [e[1] for e in events(cut)] == ["leave"] and sc.unpersisted
    await sc._reload()
    assert sc.core.fences_of("car-1") == ["f-1"]


async def test_inspect_metrics_and_the_loop_answer_while_the_journal_replays(tmp_path: Path,
                                                                             geo: XGeo) -> None:
    """A slow replay (issue 34: a far jump's records replayed for minutes) must not stop the
    worker from answering: the replay runs in a thread; `inspect` and /metrics say how far it
    is and touch nothing of the state; a handover is refused until it is done."""
    sc = await started(tmp_path)
    with publishing():
        for k in range(6):
            await settled(sc, sc.handle_inputs(positions(geo, TS + k, 5 if k % 2 == 0 else HALF + 5)))
    again = sidecar(tmp_path)
    again.recovered, again.unpersisted = True, 1  # what a session that ended mid-batch leaves
    gate, entered = threading.Event(), threading.Event()
    real_apply = again.core.__class__.apply

    def slow_apply(core: Any, record: dict[str, Any]) -> None:
        entered.set()
        assert gate.wait(10), "the test never let the replay go on"
        real_apply(core, record)

    with mock.patch.object(again.core.__class__, "apply", slow_apply):
        prepared = asyncio.create_task(again._prepare(asyncio.Event()))
        # the loop runs while the replay thread waits (polled, with a deadline)
        assert await asyncio.to_thread(entered.wait, 10), "the replay never started"
        seen = again.inspect({"fences": True, "object_id": "car-1"})
        assert seen["recovering"] == {"replayed": 0, "records": 6} and "stats" not in seen
        assert again.gauges() == {"journal_replayed": 0, "journal_to_replay": 6}
        assert again.counters.gauges["recovering"] == 1
        refused = await again.hand_over({"kind": "export", "ring": HashRing(["w0"]).to_dict()})
        assert "rebuilding its state" in refused["error"]
        again.stream_ts = TS + 10_000  # the timer runs meanwhile (a session's periodic task): it
        timer = asyncio.create_task(again.expire())  # must not touch the state, nor its journal
        gate.set()
        with publishing() as during:
            await prepared
            await timer
            await again.pipeline.drain()  # before the fix: AssertionError('start() first') here
        assert events(during) == [] and again.ready
    assert again.counters.gauges["recovering"] == 0 and not again.recovering
    assert again.inspect({"object_id": "car-1"})["object"]["fences"] == []  # the last step: outside
    assert again.gauges()["objects_tracked"] == 1


async def test_a_batch_cut_off_between_two_of_its_steps_is_reloaded(tmp_path: Path, geo: XGeo) -> None:
    """The loop is given back between a batch's steps (and a run of proximity rows' slices): a
    session that ends at such a point has applied part of the batch, and the next session starts
    from the journal (unpersisted counted before the first step)."""
    sc = await started(tmp_path)
    # positions, a fence change (a step of its own), positions again
    drop = Msg(control.drop_message(control.Drop("f-unknown", 1, TS)))
    steps = cast(list[AbstractIncomingMessage],
                 [*positions(geo, TS, 5), drop, *positions(geo, TS + 1, HALF + 5)])
    with publishing():
        task = asyncio.create_task(sc.handle_inputs(steps))
        await asyncio.sleep(0)  # the first step applied, the task waits at the yield
        assert sc.core.fences_of("car-1") == ["f-1"] and not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert sc.unpersisted == 1  # so the next session reloads (see _prepare)
    await sc._reload()
    assert sc.core.fences_of("car-1") == [] and sc.core.last_seen("car-1") is None  # the journal's state
