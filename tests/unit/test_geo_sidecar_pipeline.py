"""x-geo's batches pipelined (issue 39): the next batch is routed and written while the last
one's confirms are awaited; acks follow the confirms in handling order; a drain barrier and a
control message each wait for every batch before them to be confirmed first; a session that
ends with batches unconfirmed forgets the objects."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any
from unittest import mock

import numpy as np

from exchanges import control, shell
from exchanges.batch import PositionBatch, pack
from ingress.core import XIngress
from tests.unit.fuzz_sidecars import WORLDMAP, Msg, geo_sidecar, incoming


class Acked(Msg):
    log: list[str]
    name: str

    async def ack(self, multiple: bool = False) -> None:
        self.log.append(f"ack {self.name}")


def acked(log: list[str], name: str, body: bytes) -> Acked:
    m = Acked(body)
    m.log, m.name = log, name
    return m


def region_message(log: list[str], lon: float, name: str) -> Msg:
    """One x-ingress message for a region: a position of object `name`."""
    b = PositionBatch([name], np.array([lon]), np.array([0.5]), np.array([1_000.0]), np.zeros(1, np.int64))
    rb = next(iter(XIngress(WORLDMAP, announce_unknown=False).route(b).regions.values()))
    return acked(log, name, pack("positions", **rb.to_wire()))


@contextlib.contextmanager
def slow_confirms(log: list[str]) -> Iterator[list[asyncio.Future[None]]]:
    """Every publish_all (the role's and a pipeline's send) logged; its confirm a future the test sets."""
    pending: list[asyncio.Future[None]] = []

    async def publish_all(o: Sequence[Any], counters: shell.Counters, deadline: float | None = None,
                          retry: bool = True) -> None:
        keys = sorted({x.routing_key for x in o})
        log.append(f"publish {len(o)} to {','.join(keys)}")
        fut = asyncio.get_running_loop().create_future()
        pending.append(fut)
        await fut

    with mock.patch.object(shell, "publish_all", publish_all), \
            mock.patch.object(shell.publish, "publish_all", publish_all):
        yield pending


def confirm(pending: list[asyncio.Future[None]]) -> None:
    for f in pending:
        if not f.done():
            f.set_result(None)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_the_next_batch_is_routed_before_the_last_ones_confirms_and_acks_keep_their_order() -> None:
    sc, _, _ = geo_sidecar()
    log: list[str] = []
    with slow_confirms(log) as pending:
        await sc.handle_positions(incoming([region_message(log, 0.1, "o-001")]))
        await sc.handle_positions(incoming([region_message(log, 0.2, "o-002")]))
        assert [x for x in log if x.startswith("publish")] == [log[0], log[1]] and len(log) == 2
        assert sc.unconfirmed == 2
        pending[1].set_result(None)  # the second confirmed first: nothing acked yet
        await settle()
        assert not any(x.startswith("ack") for x in log)
        pending[0].set_result(None)
        await sc.pipeline.drain()
    assert log[2:] == ["ack o-001", "ack o-002"] and sc.unconfirmed == 0


async def test_a_drain_barrier_waits_for_the_batches_before_it_and_follows_their_confirms() -> None:
    sc, _, _ = geo_sidecar()
    log: list[str] = []
    with slow_confirms(log) as pending:
        await sc.handle_positions(incoming([region_message(log, 0.1, "o-001")]))
        barrier = acked(log, "barrier", pack(control.BARRIER, barrier="b1", reply="r", region="a"))
        handled = asyncio.ensure_future(sc.handle_positions(incoming([barrier])))
        await settle()
        assert len(log) == 1, "the barrier went out before the batch before it was confirmed"
        confirm(pending)
        while not handled.done():
            await settle()
            confirm(pending)
        await handled
    assert log[1] == "ack o-001"
    assert log[-2].startswith("publish 2 to w0,w1") and log[-1] == "ack barrier"  # every worker, then acked


async def test_a_control_message_sees_every_batch_before_it_confirmed() -> None:
    sc, _, _ = geo_sidecar()
    log: list[str] = []
    sc.out_ch = mock.MagicMock()
    with slow_confirms(log) as pending:
        await sc.handle_positions(incoming([region_message(log, 0.1, "o-001")]))
        ask = Msg(pack(control.INSPECT))
        handled = asyncio.ensure_future(sc.handle_controls(incoming([ask])))
        await settle()
        assert not handled.done() and log == [log[0]]
        confirm(pending)
        while not handled.done():
            await settle()
            confirm(pending)
    assert log[1] == "ack o-001"


async def test_a_session_ending_with_batches_unconfirmed_forgets_the_objects() -> None:
    sc, _, _ = geo_sidecar()
    log: list[str] = []
    with slow_confirms(log):
        await sc.handle_positions(incoming([region_message(log, 0.1, "o-001")]))
        await sc.pipeline.close()  # the session's end: nothing acked, the input comes back
    assert sc.unconfirmed == 1 and not any(x.startswith("ack") for x in log)
    forgot = mock.MagicMock()
    sc.core.forget_objects = forgot  # type: ignore[method-assign]
    stop = asyncio.Event()
    stop.set()
    with mock.patch.object(shell, "open_connection", side_effect=ConnectionError("no broker here")), \
            contextlib.suppress(ConnectionError):
        await sc.session(stop)
    forgot.assert_called_once()
    assert sc.unconfirmed == 0
