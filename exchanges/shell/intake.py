"""Consuming: `Intake` (one queue, handed out in batches; suspects one at a time; order
across a crash: see the class), `run_batches` (the loop of one input queue) and `settle`.

Invariants:
- A message is settled in one place (`settle`), after everything it caused is confirmed by
  the broker. One channel per consumed queue and one batch in flight per channel, so the
  batch's messages are exactly the channel's unacked deliveries up to the last one: a single
  `ack(multiple=True)` settles the batch (one frame instead of thousands).
- A batch that fails for a reason that is not the broker's ends the process unsettled
  (`SidecarFault`, crash-only): the input comes back, a suspect alone, and a suspect that
  fails alone is dead-lettered with the error as its reason.

`run_batches` publishes through `publish.publish_all` looked up on the module at the call
(a test replacing it patches exchanges.shell.publish, not the package's re-export).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import SimpleNamespace
from typing import Any

from aio_pika.abc import AbstractExchange, AbstractIncomingMessage, AbstractQueue
from pamqp.commands import Basic

from exchanges.contract import InvalidMessage
from exchanges.shell import publish
from exchanges.shell.amqp_frames import Delivery
from exchanges.shell.bulk_consumer import BulkQueue, BulkQueues
from exchanges.shell.connections import BROKER_GONE
from exchanges.shell.counters import Counters
from exchanges.shell.pipeline import Pipeline

log = logging.getLogger("geofence")


SUSPECT_DELIVERIES = 2  # x-delivery-count: unsettled this many times before (crashes, cuts)


def delivery_count(message: AbstractIncomingMessage | Delivery) -> int:
    """How many times the broker handed this message out before without a settlement
    (a quorum queue's x-delivery-count; 0 for a first delivery)."""
    if type(message) is Delivery:
        return message.delivery_count
    raw = (message.headers or {}).get("x-delivery-count", 0)
    return raw if isinstance(raw, int) else 0


class Intake:
    """Consumes one queue and hands out batches: everything that has arrived, up to
    `max_batch`. Under low load that is one message (no added latency); under load the
    messages that arrived while the previous batch was processed (throughput).

    Suspects: a message delivered SUSPECT_DELIVERIES times or more without a settlement
    was in flight during two crashes (or cuts); it may be what crashed the sidecar. Suspects
    are handed out one at a time, and while they come the channel's prefetch is 1, so a
    suspect that kills the process again spends only its own deliveries: the broker
    dead-letters it at the delivery limit (policy), and the messages behind it keep theirs.
    With `set_prefetch`, a session starts at prefetch 1 and opens to `prefetch` at the first
    message that is not a suspect (suspects, being returned messages, come first).

    Order across a crash (the routing roles need their queue's order: an object's positions,
    a region's handover notices). A quorum queue gives back a dead consumer's unacked
    messages in order, ahead of the rest, when it drops that consumer; two things break it:
    - a new consumer taking messages before the broker dropped the dead one (it takes newer
      messages first): `start` waits until the queue has no consumer (the instance lock
      already says no live one holds it);
    - several consumers of one process holding messages when it dies: the queue gives each
      consumer's back in turn, in the order of their tags, not of delivery. A prefetch
      change needs a new consumer (RabbitMQ applies basic.qos to consumers created after
      it), so the old one is cancelled and the new one created only once everything the old
      one delivered was handed out and settled: one consumer holds messages at any time."""

    def __init__(self, queue: AbstractQueue, max_batch: int, exclusive: bool = True, prefetch: int = 0,
                 set_prefetch: Callable[[int], Awaitable[None]] | None = None) -> None:
        self.queue = queue
        self.max_batch = max_batch
        self.exclusive = exclusive
        self.prefetch = prefetch
        self._set_prefetch = set_prefetch
        self._opened = set_prefetch is None
        self._buf: deque[AbstractIncomingMessage] = deque()
        self._ready = asyncio.Event()
        self._tag: str | None = None
        self._stopping = False
        self.suspects = 0
        self.backlog = 0  # messages ready in the queue when the session started
        self.received = 0
        self.cancelled = asyncio.Event()  # the broker cancelled the consumer (queue deleted)
        self.current_prefetch = prefetch if set_prefetch is None else 1
        self._want: int | None = None  # a prefetch for the next consumer (see the class)
        self._fresh_seen: set[str | None] = set()  # queues a first delivery came from this session
        self.late_returns = 0  # returned messages that came behind a first delivery
        self.pipeline: Pipeline | None = None  # batches in flight (run_batches): settled before a switch
        # set once `start` holds the consumer's tag (or `stop` came first): until then `batches`
        # hands nothing out, as the opening's cancel needs that tag (see _switch_consumer)
        self._started = asyncio.Event()
        # `stop` releases instead of draining: what was not handed out stays unacked and goes
        # back to the queue, in order, when the connection closes (the consumer is not
        # cancelled first, so no newer message reaches anyone before it): x-ingress giving a
        # partition to another instance (ingress/sidecar.py)
        self.release_on_stop = False
        self._released = False

    @classmethod
    def on(cls, queue: AbstractQueue | BulkQueue | BulkQueues, max_batch: int, prefetch: int,
           exclusive: bool = True) -> Intake:
        """An intake that manages its channel's prefetch (see the class). On a BulkQueue
        (exchanges/shell/bulk_consumer.py) deliveries come in bulk, without aio-pika."""
        if isinstance(queue, (BulkQueue, BulkQueues)):
            return cls(queue, max_batch, exclusive, prefetch, queue.set_qos)  # type: ignore[arg-type]

        async def set_prefetch(n: int) -> None:
            await queue.channel.set_qos(prefetch_count=n)
        return cls(queue, max_batch, exclusive, prefetch, set_prefetch)

    # Back-pressure is the pipeline's (exchanges/shell/pipeline.py: at most `depth` batches in
    # flight, so at most `prefetch` messages held here); the prefetch itself never changes
    # while a session consumes. It used to shrink while confirms lagged, by a new consumer: a
    # quorum queue's deliveries already on their way to the cancelled consumer are then given
    # back by the channel and come again behind newer ones (seen under load, issue 39: an
    # object's older positions routed after its newer ones, events wrong). The one switch
    # left, prefetch 1 to `prefetch` at the first message that is not a suspect, is safe: the
    # old consumer holds that message unacked, so with a prefetch of 1 nothing else is on its
    # way to it when it is cancelled.

    async def _switch_consumer(self) -> None:
        """Between batches: the opening (see above). The consumer is cancelled first, then
        created again with the new prefetch once what it delivered was handed out (and, the
        caller settling each batch before asking for the next, settled)."""
        if self._want is None or self._stopping or self._set_prefetch is None:
            return
        if self.pipeline is not None:
            await self.pipeline.drain()
        if self._tag is not None:
            await self.queue.cancel(self._tag)
            self._tag = None
            await asyncio.sleep(0)  # deliveries read before the cancel-ok land in the buffer
        if not self._buf:
            want, self._want = self._want, None
            await self._set_prefetch(want)
            self._tag = await self._consume()

    @property
    def caught_up(self) -> bool:
        """The backlog found at the start was received, and nothing waits in the buffer."""
        return self.received >= self.backlog and not self._buf

    # How long `start` waits for the broker to drop a dead predecessor's consumer. It drops
    # it as soon as it sees the connection gone, which the instance lock already waited for.
    # The input queues of single-instance roles have a single active consumer besides
    # (deploy/rabbitmq/definitions.py SHARED_INPUT_QUEUES): there the broker itself holds a
    # new consumer back until the last one's messages are returned, and a consumer whose
    # cluster node died stops being counted at once.
    PREDECESSOR_WAIT_S = 30.0

    async def start(self) -> None:
        declared = getattr(self.queue, "declaration_result", None)
        if self.exclusive:
            declared = await self._without_predecessor() or declared
        self.backlog = int(getattr(declared, "message_count", 0) or 0)
        if self._set_prefetch is not None:
            await self._set_prefetch(1)
        # exclusive (the default): a second instance of a routing role would break per-object
        # ordering; services whose requests are independent (the fence API) share their queue
        self._tag = await self._consume()
        self._started.set()
        channel = getattr(self.queue, "channel", None)
        if isinstance(self.queue, (BulkQueue, BulkQueues)):
            self.queue.bulk.cancel_callbacks.add(self._cancelled_by_broker)
        elif channel is not None:  # a real queue (the unit tests' fake has none)
            underlay = await channel.get_underlay_channel()
            underlay.on_consumer_cancel_callbacks.add(self._on_cancel)

    async def _without_predecessor(self) -> Any:
        """Polls the queue (passive declares) until it has no consumer, or PREDECESSOR_WAIT_S
        passed (then it says so and goes on); the last declare-ok (None without a channel)."""
        channel = getattr(self.queue, "channel", None)
        if channel is None:  # the unit tests' fake queue
            return None
        started = time.monotonic()
        names = getattr(self.queue, "names", None) or [self.queue.name]  # BulkQueues: every one
        while True:
            found = [(await channel.declare_queue(name, passive=True)).declaration_result for name in names]
            declared = found[0] if len(found) == 1 else SimpleNamespace(
                message_count=sum(int(getattr(d, "message_count", 0) or 0) for d in found),
                consumer_count=sum(int(getattr(d, "consumer_count", 0) or 0) for d in found))
            consumers = int(getattr(declared, "consumer_count", 0) or 0)
            waited = time.monotonic() - started
            if not consumers:
                if waited > 0.05:
                    log.info("%s: the previous consumer was dropped after %.2fs; consuming", self.queue.name,
                             waited)
                return declared
            if waited > self.PREDECESSOR_WAIT_S:
                log.warning("%s still has %d consumer(s) after %.0fs: consuming anyway (the order of its "
                            "returned messages is not guaranteed)", self.queue.name, consumers, waited)
                return declared
            await asyncio.sleep(0.05)

    async def _consume(self) -> str:
        if isinstance(self.queue, (BulkQueue, BulkQueues)):
            return await self.queue.consume_many(self._accept, self.exclusive)
        return await self.queue.consume(self._on_message, exclusive=self.exclusive)

    async def _on_cancel(self, frame: Basic.Cancel) -> None:
        self._cancelled_by_broker(frame)

    def _cancelled_by_broker(self, frame: Basic.Cancel) -> None:
        if self._tag is not None and frame.consumer_tag in self._tag.split():  # BulkQueues: several
            log.warning("the broker cancelled the consumer of %s", self.queue.name)
            self.cancelled.set()

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        self._accept([message])

    def _accept(self, messages: Sequence[Any]) -> None:
        """Deliveries in the order the broker sent them: one (aio-pika) or a read's worth
        (a BulkQueue)."""
        if self._released:  # left unacked: they go back with the connection
            return
        self.received += len(messages)
        self._buf.extend(messages)
        self._ready.set()
        several = self.queue if isinstance(self.queue, BulkQueues) else None  # order: each queue's own
        for message in messages:
            source = several.source_of(message) if several is not None else None
            if getattr(message, "redelivered", False):
                if source in self._fresh_seen:
                    self.late_returns += 1
                    if self.late_returns == 1:
                        log.warning("%s: a returned message came behind a first delivery (the broker gave "
                                    "back a dead consumer's messages late): order is not guaranteed here",
                                    self.queue.name)
            else:
                self._fresh_seen.add(source)
            if not self._opened and delivery_count(message) < SUSPECT_DELIVERIES:
                self._opened = True
                self.current_prefetch = self.prefetch
                self._want = self.prefetch  # applied between batches (see _switch_consumer)

    async def stop(self) -> None:
        self._stopping = True
        self._ready.set()
        self._started.set()
        if self.release_on_stop:
            self._released = True
            self._buf.clear()
            return
        if self._tag is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.queue.cancel(self._tag), 5)

    async def batches(self) -> AsyncIterator[list[AbstractIncomingMessage]]:
        # A session's loops run while its intakes start (lifecycle.run_session), and the first
        # delivery can land before `start` has the consumer's tag: handed out then, it was
        # settled before the opening could cancel that consumer, which by then had the next
        # message on its way; the broker gave that one back behind the dead predecessor's
        # returned messages (seen after kill -9 of x-ingress: positions routed out of order).
        await self._started.wait()
        while True:
            if self._released:
                return
            await self._switch_consumer()
            if not self._buf:
                if self._stopping:
                    return
                self._ready.clear()
                await self._ready.wait()
                continue
            await asyncio.sleep(0)  # let deliveries already read from the socket land
            if self._released or not self._buf:  # a release (stop) may have cleared it meanwhile
                continue
            if delivery_count(self._buf[0]) >= SUSPECT_DELIVERIES:
                self.suspects += 1
                yield [self._buf.popleft()]
                continue
            n = 1
            limit = min(len(self._buf), self.max_batch)
            while n < limit and delivery_count(self._buf[n]) < SUSPECT_DELIVERIES:
                n += 1
            yield [self._buf.popleft() for _ in range(n)]


def reason_of(exc: Exception, what: str) -> str:
    """The dead-letter reason for an input a role could not decode."""
    return exc.reason if isinstance(exc, InvalidMessage) else f"malformed {what}: {exc}"


class SidecarFault(RuntimeError):
    """A batch failed for a reason that is not the broker's: the process ends (crash-only:
    its state is rebuilt from durable sources at the restart) and the input comes back."""


async def run_batches(intake: Intake, handle: Callable[[list[AbstractIncomingMessage]], Awaitable[Any]],
                      counters: Counters, dead_letters: AbstractExchange | None = None,
                      pipeline: Pipeline | None = None) -> None:
    """The loop of one input queue: each batch handled, then settled.

    Without a `pipeline`, `handle` does everything (publishes confirmed, state journaled) and
    the batch is settled here before the next one is taken. With one, `handle` sends its
    publishes (shell.send) and hands them to `pipeline.add` with what runs once they are
    confirmed and the batch's messages, which the pipeline acks after that, in order, while
    the next batches are handled (exchanges/shell/pipeline.py). It calls `add` itself, under
    the lock that orders its state's changes, so the tails run in the order of those changes.

    A handler that raises (a bug, not bad input: bad input is dead-lettered by the handler)
    ends the process unsettled. Its messages come back, and once they are suspects (see
    Intake) one at a time: a suspect the handler fails on alone is the culprit, and goes to
    `dead_letters` with the error as its reason before the process ends. A suspect is handled
    with nothing else in flight (the pipeline drained before and after it)."""
    intake.pipeline = pipeline
    culprit: list[AbstractIncomingMessage] | None = None  # the batch a failure is known to be
    try:
        async for messages in intake.batches():
            counters.batch(len(messages))
            if pipeline is None:
                culprit = messages
                async with settle(messages):
                    await handle(messages)
            else:
                alone = delivery_count(messages[0]) >= SUSPECT_DELIVERIES
                if alone:
                    await pipeline.drain()
                    culprit = messages
                await handle(messages)  # settled by the pipeline
                if alone:
                    await pipeline.drain()
            culprit = None
        if pipeline is not None:
            await pipeline.drain()
    except BROKER_GONE:
        raise
    except Exception as exc:
        if isinstance(exc, ExceptionGroup) and exc.subgroup(BROKER_GONE) is not None:
            raise
        where = f"a batch of {len(culprit)}" if culprit is not None else "a batch"
        log.error("%s from %s failed: %r", where, intake.queue.name, exc, exc_info=exc)
        m = culprit[0] if culprit else None
        if culprit is not None and m is not None and len(culprit) == 1 and \
                delivery_count(m) >= SUSPECT_DELIVERIES and dead_letters is not None:
            reason = (f"internal error on delivery {delivery_count(m) + 1}: {exc!r} "
                      "(the sidecar failed on this message alone)")
            source = intake.queue.source_of(m) if isinstance(intake.queue, BulkQueues) else intake.queue.name
            await publish.publish_all([publish.dead_letter(dead_letters, m, reason, source, counters)],
                                      counters)
            await m.ack()
        raise SidecarFault(f"{intake.queue.name}: {exc!r}") from exc


@contextlib.asynccontextmanager
async def settle(messages: Sequence[AbstractIncomingMessage]) -> AsyncIterator[None]:
    """Ack in one place: after the block (and everything it published) succeeded. If the
    broker went away nothing is acked: the messages come back to the next session."""
    yield
    if messages:
        try:
            await messages[-1].ack(multiple=True)
        except Exception as exc:  # the channel or connection went away under the ack
            raise ConnectionError(f"ack failed: {exc!r}") from exc
