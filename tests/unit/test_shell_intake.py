"""exchanges/shell/ without a broker: the intake / settle machinery (batches, suspects, the
prefetch under confirm lag, a failing batch) with small fakes of aio-pika's queue and messages
(the configuration: test_shell_config.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, cast

import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from exchanges import shell
from exchanges import topology as t
from exchanges.shell import Counters, Intake

# --------------------------------------------------------------------------- intake and settle


class FakeMessage:
    def __init__(self, n: int, deliveries: int = 0) -> None:
        self.n = n
        self.acks: list[bool] = []
        self.headers: dict[str, Any] = {"x-delivery-count": deliveries} if deliveries else {}
        self.body = b"m%d" % n
        self.content_type = "application/json"
        self.message_id = None
        self.routing_key = "rk"

    async def ack(self, multiple: bool = False) -> None:
        self.acks.append(multiple)

    def __repr__(self) -> str:
        return f"FakeMessage({self.n})"


class FakeQueue:
    name = "x-fence.w0"

    def __init__(self) -> None:
        self.callback: Callable[[Any], Awaitable[None]] | None = None
        self.consume_kwargs: dict[str, Any] = {}
        self.cancelled: list[str] = []
        self.consumers = 0

    async def consume(self, callback: Callable[[Any], Awaitable[None]], **kwargs: Any) -> str:
        self.callback = callback
        self.consume_kwargs = kwargs
        self.consumers += 1
        return f"ctag-{self.consumers}"

    async def cancel(self, tag: str) -> None:
        self.cancelled.append(tag)

    async def deliver(self, *messages: FakeMessage) -> None:
        assert self.callback is not None, "not consuming"
        for m in messages:
            await self.callback(m)


async def started(max_batch: int) -> tuple[Intake, FakeQueue]:
    q = FakeQueue()
    intake = Intake(cast(AbstractQueue, q), max_batch)
    await intake.start()
    return intake, q


def batches(intake: Intake) -> AsyncGenerator[list[AbstractIncomingMessage], None]:
    return cast(AsyncGenerator[list[AbstractIncomingMessage], None], intake.batches())


def numbers(batch: list[AbstractIncomingMessage]) -> list[int]:
    return [cast(FakeMessage, m).n for m in batch]


async def test_intake_consumes_exclusively() -> None:
    _, q = await started(10)
    assert q.callback is not None
    assert q.consume_kwargs == {"exclusive": True}


async def test_intake_batches_what_arrived_up_to_max_batch_in_order() -> None:
    intake, q = await started(4)
    await q.deliver(*(FakeMessage(i) for i in range(10)))
    it = batches(intake)
    assert numbers(await anext(it)) == [0, 1, 2, 3]
    assert numbers(await anext(it)) == [4, 5, 6, 7]
    assert numbers(await anext(it)) == [8, 9]
    await q.deliver(FakeMessage(10))
    assert numbers(await anext(it)) == [10]
    await it.aclose()


async def test_intake_waits_for_a_message_then_hands_it_out() -> None:
    intake, q = await started(100)
    it = batches(intake)
    pending = asyncio.ensure_future(anext(it))
    for _ in range(5):  # let the iterator reach its wait on the empty buffer
        await asyncio.sleep(0)
    assert not pending.done()
    await q.deliver(FakeMessage(1), FakeMessage(2))
    assert numbers(await asyncio.wait_for(pending, 5)) == [1, 2]
    await it.aclose()


async def test_intake_stop_drains_the_buffer_then_ends() -> None:
    intake, q = await started(3)
    await q.deliver(*(FakeMessage(i) for i in range(5)))
    await intake.stop()
    assert q.cancelled == ["ctag-1"]
    got = [numbers(b) async for b in intake.batches()]
    assert got == [[0, 1, 2], [3, 4]]


async def test_intake_stop_wakes_a_waiting_consumer() -> None:
    intake, _ = await started(10)
    got: list[list[int]] = []

    async def consume() -> None:
        async for b in intake.batches():
            got.append(numbers(b))

    task = asyncio.ensure_future(consume())
    for _ in range(5):
        await asyncio.sleep(0)
    assert not task.done()
    await intake.stop()
    await asyncio.wait_for(task, 5)
    assert got == []


async def test_intake_stop_before_start_does_not_cancel() -> None:
    q = FakeQueue()
    intake = Intake(cast(AbstractQueue, q), 10)
    await intake.stop()
    assert q.cancelled == []
    assert [b async for b in intake.batches()] == []


async def test_intake_stop_survives_a_failing_cancel() -> None:
    intake, q = await started(10)

    async def broken(tag: str) -> None:
        raise ConnectionError("broker gone")

    q.cancel = broken  # type: ignore[method-assign]
    await q.deliver(FakeMessage(1))
    await intake.stop()
    assert [numbers(b) async for b in intake.batches()] == [[1]]


def as_messages(ms: list[FakeMessage]) -> list[AbstractIncomingMessage]:
    return cast(list[AbstractIncomingMessage], ms)


async def test_settle_acks_only_the_last_message_with_multiple() -> None:
    ms = [FakeMessage(i) for i in range(4)]
    ran = False
    async with shell.settle(as_messages(ms)):
        ran = True
        assert all(m.acks == [] for m in ms)  # not before the block is done
    assert ran
    assert [m.acks for m in ms] == [[], [], [], [True]]


async def test_settle_acks_nothing_when_the_block_raises() -> None:
    ms = [FakeMessage(i) for i in range(3)]
    with pytest.raises(ConnectionError):
        async with shell.settle(as_messages(ms)):
            raise ConnectionError("broker gone")
    assert all(m.acks == [] for m in ms)


async def test_settle_with_no_messages_does_nothing() -> None:
    async with shell.settle([]):
        pass


async def test_intake_and_settle_together() -> None:
    intake, q = await started(2)
    ms = [FakeMessage(i) for i in range(5)]
    await q.deliver(*ms)
    await intake.stop()
    async for batch in intake.batches():
        async with shell.settle(batch):
            pass
    assert [m.acks for m in ms] == [[], [True], [], [True], [True]]


# --------------------------------------------------------------------------- suspects


async def started_managed(max_batch: int, prefetch: int) -> tuple[Intake, FakeQueue, list[int]]:
    q = FakeQueue()
    qos: list[int] = []

    async def set_prefetch(n: int) -> None:
        qos.append(n)

    intake = Intake(cast(AbstractQueue, q), max_batch, prefetch=prefetch, set_prefetch=set_prefetch)
    await intake.start()
    return intake, q, qos


async def next_after(it: AsyncGenerator[list[AbstractIncomingMessage], None], q: FakeQueue,
                     *messages: FakeMessage) -> list[int]:
    """The next batch when `messages` arrive once the caller asked for it (the buffer empty)."""
    pending = asyncio.ensure_future(anext(it))
    for _ in range(5):  # let the iterator reach its wait on the empty buffer
        await asyncio.sleep(0)
    await q.deliver(*messages)
    return numbers(await pending)


async def test_a_managed_intake_starts_at_prefetch_one_and_opens_at_the_first_normal_message() -> None:
    intake, q, qos = await started_managed(10, 500)
    assert qos == [1]
    await q.deliver(FakeMessage(0, deliveries=3), FakeMessage(1, deliveries=2))
    it = batches(intake)
    assert [numbers(await anext(it)) for _ in range(2)] == [[0], [1]]
    assert qos == [1]  # suspects keep it at one
    await q.deliver(FakeMessage(2, deliveries=1))  # delivered once before: not a suspect
    assert numbers(await anext(it)) == [2]
    assert qos == [1] and q.cancelled == ["ctag-1"]  # cancelled; the next consumer once [2] is settled
    assert await next_after(it, q, FakeMessage(3, deliveries=4)) == [3]
    assert qos == [1, 500] and q.consumers == 2
    assert await next_after(it, q, FakeMessage(4, deliveries=4)) == [4]
    assert qos == [1, 500] and q.consumers == 2  # opened once
    await intake.stop()


async def test_one_consumer_holds_messages_at_a_time() -> None:
    """The opening (prefetch 1 to the full prefetch) cancels the consumer and creates the next
    only once everything the old one delivered was handed out: a crash can never leave two
    consumers holding messages (the queue would give them back consumer by consumer, out of
    order)."""
    intake, q, qos = await started_managed(2, 1000)
    await q.deliver(FakeMessage(0))
    it = batches(intake)
    assert numbers(await anext(it)) == [0]  # consumer 1 cancelled before it is handed out
    assert q.cancelled == ["ctag-1"] and q.consumers == 1
    await q.deliver(FakeMessage(1))  # a delivery read before the cancel-ok: still consumer 1's
    assert numbers(await anext(it)) == [1]
    assert q.consumers == 1  # not before the buffer is empty
    pending = asyncio.ensure_future(anext(it))
    for _ in range(5):
        await asyncio.sleep(0)
    assert q.consumers == 2 and qos == [1, 1000]
    await q.deliver(*(FakeMessage(i) for i in range(2, 7)))
    assert numbers(await pending) == [2, 3]
    assert numbers(await anext(it)) == [4, 5]
    assert numbers(await anext(it)) == [6]
    assert q.cancelled == ["ctag-1"] and q.consumers == 2 and qos == [1, 1000]  # opened once, kept
    await intake.stop()


async def test_a_delivery_before_start_returns_is_handed_out_after_the_cancel() -> None:
    """A session's loop asks for batches while its intake starts, and the first delivery can
    come in the read that brings the consume-ok: it waits until the consumer it came to was
    cancelled, so that consumer (prefetch 1) has nothing else on its way when it goes (a
    message on its way to a cancelled consumer comes back behind the others)."""
    q = FakeQueue()
    first = FakeMessage(0, deliveries=1)
    consume = q.consume

    async def consume_and_deliver(callback: Callable[[Any], Awaitable[None]], **kwargs: Any) -> str:
        tag = await consume(callback, **kwargs)
        if q.consumers == 1:
            await callback(first)
            for _ in range(5):  # the loop runs before the consume-ok's caller resumes
                await asyncio.sleep(0)
        return tag

    q.consume = consume_and_deliver  # type: ignore[method-assign]

    async def set_prefetch(n: int) -> None:
        pass

    intake = Intake(cast(AbstractQueue, q), 10, prefetch=100, set_prefetch=set_prefetch)
    it = batches(intake)
    pending = asyncio.ensure_future(anext(it))
    await asyncio.sleep(0)
    await intake.start()
    assert numbers(await pending) == [0]
    assert q.cancelled == ["ctag-1"] and first.acks == []  # cancelled while [0] was unsettled
    await intake.stop()


async def test_a_returned_message_behind_a_first_delivery_is_counted() -> None:
    intake, q = await started(10)
    first, returned = FakeMessage(0), FakeMessage(1, deliveries=1)
    returned.redelivered = True  # type: ignore[attr-defined]
    early = FakeMessage(2, deliveries=1)
    early.redelivered = True  # type: ignore[attr-defined]
    await q.deliver(early, first)
    assert intake.late_returns == 0  # returns first, then first deliveries: in order
    await q.deliver(returned)
    assert intake.late_returns == 1
    await intake.stop()


async def test_suspects_are_handed_out_alone_and_others_batched_around_them() -> None:
    intake, q, _ = await started_managed(10, 100)
    await q.deliver(FakeMessage(0, 2), FakeMessage(1, 5), FakeMessage(2, 1), FakeMessage(3),
                    FakeMessage(4, 2), FakeMessage(5), FakeMessage(6))
    await intake.stop()
    got = [numbers(b) async for b in intake.batches()]
    assert got == [[0], [1], [2, 3], [4], [5, 6]]
    assert intake.suspects == 3


class FakeExchange:
    name = "dead-letters"


async def test_a_failing_batch_ends_the_sidecar_without_settling(monkeypatch: pytest.MonkeyPatch) -> None:
    intake, q = await started(10)
    ms = [FakeMessage(i) for i in range(2)] + [FakeMessage(2, deliveries=1)]
    await q.deliver(*ms)
    await intake.stop()

    async def handle(batch: list[AbstractIncomingMessage]) -> None:
        raise ValueError("a bug")

    sent: list[shell.Out] = []

    async def publish_all(outs: list[shell.Out], counters: Counters, deadline: float | None = None) -> None:
        sent.extend(outs)

    monkeypatch.setattr(shell.publish, "publish_all", publish_all)  # where run_batches looks it up
    with pytest.raises(shell.SidecarFault, match="a bug"):
        await shell.run_batches(intake, handle, Counters(), cast(Any, FakeExchange()))
    assert all(m.acks == [] for m in ms) and sent == []


async def test_a_suspect_failing_alone_is_dead_lettered_with_the_error_then_the_sidecar_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    intake, q, _ = await started_managed(10, 100)
    m = FakeMessage(7, deliveries=2)
    await q.deliver(m)
    await intake.stop()
    sent: list[shell.Out] = []

    async def publish_all(outs: list[shell.Out], counters: Counters, deadline: float | None = None) -> None:
        sent.extend(outs)

    monkeypatch.setattr(shell.publish, "publish_all", publish_all)  # where run_batches looks it up

    async def handle(batch: list[AbstractIncomingMessage]) -> None:
        raise KeyError("boom")

    counters = Counters()
    with pytest.raises(shell.SidecarFault):
        await shell.run_batches(intake, handle, counters, cast(Any, FakeExchange()))
    assert len(sent) == 1 and sent[0].body == b"m7"
    headers = dict(sent[0].headers or {})
    assert headers[t.REASON_HEADER].startswith("internal error on delivery 3: KeyError('boom')")
    assert headers["x-geofence-source"] == q.name
    assert m.acks == [False]  # settled after the dead letter was confirmed
    assert sum(counters.dead_lettered.values()) == 1


async def test_a_lost_broker_is_not_a_fault() -> None:
    intake, q = await started(10)
    ms = [FakeMessage(0, deliveries=5)]
    await q.deliver(*ms)
    await intake.stop()

    async def handle(batch: list[AbstractIncomingMessage]) -> None:
        raise ConnectionError("reset")

    with pytest.raises(ConnectionError):
        await shell.run_batches(intake, handle, Counters(), cast(Any, FakeExchange()))
    assert ms[0].acks == []


# --------------------------------------------------------------------------- back-pressure


async def test_the_prefetch_never_changes_once_opened_whatever_the_load() -> None:
    """Back-pressure is the pipeline's: a consumer switched under load would have deliveries
    on their way to the old one given back behind newer ones (exchanges/shell/intake.py)."""
    intake, q, qos = await started_managed(3, 1000)
    await q.deliver(FakeMessage(0))
    it = batches(intake)
    assert numbers(await anext(it)) == [0]
    assert await next_after(it, q, FakeMessage(1)) == [1]
    for i in range(2, 40, 3):
        await q.deliver(*(FakeMessage(k) for k in range(i, i + 3)))
        assert numbers(await anext(it)) == [i, i + 1, i + 2]
    assert qos == [1, 1000] and q.consumers == 2 and q.cancelled == ["ctag-1"]
    assert not hasattr(intake, "confirm_lag")
    await intake.stop()


async def test_a_release_hands_out_nothing_more_and_keeps_the_consumer() -> None:
    """x-ingress giving partitions away: what was not handed out stays unacked (it goes back to
    the queue with the connection, in order) and the consumer is not cancelled first, so
    nothing newer reaches another consumer before it."""
    intake, q = await started(2)
    it = batches(intake)
    await q.deliver(*(FakeMessage(i) for i in range(5)))
    assert numbers(await anext(it)) == [0, 1]
    intake.release_on_stop = True
    await intake.stop()
    await q.deliver(FakeMessage(5))  # still on its way when the release came
    with pytest.raises(StopAsyncIteration):
        await anext(it)
    assert q.cancelled == [] and intake.received == 5


async def test_a_release_while_a_batch_is_being_gathered_ends_the_batches_quietly() -> None:
    """The release lands in the yield that lets deliveries already read land (seen in the CI's
    fault run: x-ingress-2 ended on IndexError when `ingress add` moved its partitions, so the
    move waited for it in vain): the batches end, nothing is handed out, nothing raises."""
    intake, q = await started(4)
    it = batches(intake)
    await q.deliver(*(FakeMessage(i) for i in range(3)))
    intake.release_on_stop = True
    gathering = asyncio.ensure_future(anext(it))
    await asyncio.sleep(0)  # the generator is now in its own yield, its buffer not yet read
    await intake.stop()
    with pytest.raises(StopAsyncIteration):
        await gathering
    assert intake.received == 3 and q.cancelled == []
