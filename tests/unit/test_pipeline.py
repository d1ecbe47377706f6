"""The shell's pipeline (exchanges/shell/pipeline.py): tails in handling order whatever order
the confirms come in, acks after them, a failure stopping every tail behind it, a refusal
ending the session and turning the pipeline serial, and `send` keeping batches' frames in
order on a channel."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest
from aio_pika.abc import AbstractIncomingMessage

from exchanges import shell
from exchanges.shell import Counters, Pipeline, PipelineRefused, PublishRefused
from tests.unit.test_publish_frames import FakeChannel, FakeExchange, outs


class Msg:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    async def ack(self, multiple: bool = False) -> None:
        self.log.append(f"ack {self.name}")


def msgs(log: list[str], name: str) -> list[AbstractIncomingMessage]:
    return cast(list[AbstractIncomingMessage], [Msg(log, name)])


def future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


def then(log: list[str], name: str) -> Any:
    async def run() -> None:
        log.append(f"then {name}")
    return run


async def test_tails_run_in_handling_order_whatever_order_the_confirms_come_in() -> None:
    p, log = Pipeline(depth=8), []
    sent = [future() for _ in range(4)]
    for i, s in enumerate(sent):
        await p.add(s, then(log, str(i)), msgs(log, str(i)))
    assert p.in_flight == 4 and log == []
    for i in (3, 1, 2):  # later batches confirmed first: nothing runs before batch 0
        sent[i].set_result(None)
    await asyncio.sleep(0.01)
    assert log == []
    sent[0].set_result(None)
    await p.drain()
    assert log == [f"{what} {i}" for i in range(4) for what in ("then", "ack")]


async def test_add_returns_with_fewer_than_depth_tails_pending() -> None:
    p, log = Pipeline(depth=3), []
    sent = [future() for _ in range(3)]
    await p.add(sent[0], then(log, "0"), msgs(log, "0"))
    await p.add(sent[1], then(log, "1"), msgs(log, "1"))
    third = asyncio.ensure_future(p.add(sent[2], then(log, "2"), msgs(log, "2")))
    await asyncio.sleep(0.01)
    assert not third.done(), "a third batch in flight waits for the first tail"
    sent[0].set_result(None)
    await asyncio.wait_for(third, 5)
    assert log == ["then 0", "ack 0"]
    for s in sent[1:]:
        s.set_result(None)
    await p.drain()
    assert log[-2:] == ["then 2", "ack 2"]


async def test_a_serial_pipeline_runs_each_tail_before_add_returns() -> None:
    p, log = Pipeline(depth=1), []
    s = future()
    s.set_result(None)
    await p.add(s, then(log, "0"), msgs(log, "0"))
    assert log == ["then 0", "ack 0"] and p.in_flight == 0


async def test_a_failed_tail_stops_every_tail_behind_it() -> None:
    p, log = Pipeline(depth=8), []
    sent = [future() for _ in range(3)]
    for i, s in enumerate(sent):
        await p.add(s, then(log, str(i)), msgs(log, str(i)))
    sent[2].set_result(None)
    sent[1].set_result(None)
    sent[0].set_exception(ConnectionError("channel lost"))
    with pytest.raises(ConnectionError, match="channel lost"):
        await p.drain()
    await p.close()
    assert log == [], "nothing journaled nor acked behind a failure"


async def test_a_refusal_ends_the_session_and_turns_the_pipeline_serial() -> None:
    p, log = Pipeline(depth=8), []
    assert not p.serial
    refused = future()
    refused.set_exception(PublishRefused("x-fence.w0 is full"))
    await p.add(refused, then(log, "0"), msgs(log, "0"))
    with pytest.raises(PipelineRefused, match="full"):
        await p.drain()
    assert isinstance(PipelineRefused("x"), ConnectionError), "ends the session as a lost connection"
    assert p.serial and log == []


async def test_close_cancels_what_was_not_confirmed() -> None:
    p, log = Pipeline(depth=8), []
    sent = [future() for _ in range(2)]
    for i, s in enumerate(sent):
        await p.add(s, then(log, str(i)), msgs(log, str(i)))
    await p.close()
    assert all(s.cancelled() for s in sent) and log == [] and p.in_flight == 0


async def test_send_keeps_batches_frames_in_order_on_a_channel() -> None:
    ch = FakeChannel()
    ex = FakeExchange(ch)
    counters = Counters()
    first = await shell.send(outs(ex, 3), counters)
    second = await shell.send(outs(ex, 2), counters)
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert len(ch.writes) == 2 and ch.writes[0].count(b"fence-events") == 3
    assert ch.writes[1].count(b"fence-events") == 2 and counters.published == 5
    ch.task.cancel()


async def test_send_without_retry_fails_on_a_refusal() -> None:
    ch = FakeChannel("nack-even")
    sent = await shell.send(outs(FakeExchange(ch), 4), Counters(), retry=False)
    with pytest.raises(PublishRefused, match="2 of 4 publishes refused"):
        await asyncio.wait_for(sent, 5)
    assert len(ch.writes) == 1, "not retried"
    ch.task.cancel()
