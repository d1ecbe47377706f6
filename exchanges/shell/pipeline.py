"""Batches in flight: `send` (a batch's publishes started, their confirms awaited later) and
`Pipeline` (each batch's tail, run in the order the batches were handled).

A hop that routes a batch, waits for its confirms, journals and acks before it takes the next
one moves one batch per confirm round trip: under a steady stream a backlog builds until the
batches are large, and every message waits for the batch before it (the proximity path went
from 67 ms at 1,000 updates/s to seconds at 3,000). With a pipeline, a batch is routed and its
frames written as soon as it comes; what needs the confirms (the journal record, the ack, the
answers) runs afterwards in a tail, and the tails run one after the other in handling order.

Invariants:
- Order on the wire: a batch's publishes are written (or waiting on their channel's lock, a
  FIFO) when `send` returns, so a later batch's frames on a channel follow them. This holds
  because the publish paths (publish._publish_plain, aiormq's basic_publish) take the channel's
  lock without suspending first.
- Order of effects: tail n runs after tail n-1 finished, so journal records are written in
  handling order and a batch is acked only after everything before it was journaled and acked.
  A tail that fails fails every tail behind it (none of them acks): their input comes back.
- A batch is routed from the state the tails before it leave behind, so the state a journal
  record describes must be taken when the batch is handled (not when its tail runs): a role
  captures its record (and a snapshot, when a rotation is due) in its handler.
- A refused publish (a full queue, no route) cannot be retried in place while later batches
  are already on the wire: it ends the session as a lost connection does (the input comes back
  in order), and for REFUSAL_SERIAL_S the sessions after it go one batch at a time, where a
  refusal is retried with backoff while the input waits (back-pressure, publish.publish_all).

Trade-off: up to `depth` batches' messages are held unacked (the prefetch must cover them),
and a crash or a cut returns all of them, not one batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

from aio_pika.abc import AbstractIncomingMessage

from exchanges.shell import publish
from exchanges.shell.counters import Counters

log = logging.getLogger("geofence")

DEPTH = 8  # batches in flight per pipeline
REFUSAL_SERIAL_S = 60.0

Then = Callable[[], Awaitable[None]]


class PipelineRefused(ConnectionError):
    """A publish refused while later batches were in flight: the session ends (see above)."""


async def send(outs: Sequence[publish.Out | publish.Plains], counters: Counters,
               retry: bool = True) -> asyncio.Future[None]:
    """The publishes started (see the module's order invariant); the future is their confirms.
    With `retry` False a refusal fails it (publish.PublishRefused) instead of being retried."""
    sent = asyncio.ensure_future(publish.publish_all(outs, counters, retry=retry))
    # two turns of the loop: publish_all's first step, then its per-channel tasks' first steps,
    # which take (or queue on) their channel's lock
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return sent


def _discard(fut: asyncio.Future[None] | None) -> None:
    """A future nobody will await: cancelled, or its outcome read (no 'never retrieved')."""
    if fut is None:
        return
    if not fut.done():
        fut.cancel()
    elif not fut.cancelled():
        fut.exception()


class Pipeline:
    """The tails of the batches in flight, run in order (see the module's docstring). One per
    sidecar: it outlives sessions (a refusal's serial period does), `close` ends a session's
    tails."""

    def __init__(self, depth: int = DEPTH) -> None:
        self.depth = depth
        self._tails: deque[asyncio.Future[None]] = deque()
        self._sent: list[asyncio.Future[None]] = []  # the tails' publishes (a tail not started holds one)
        self.serial_until = 0.0  # monotonic: one batch at a time until then (a refusal)

    @property
    def serial(self) -> bool:
        """One batch at a time now: a publish refused is retried in place."""
        return self.depth <= 1 or time.monotonic() < self.serial_until

    @property
    def in_flight(self) -> int:
        return sum(not t.done() for t in self._tails)

    async def add(self, sent: asyncio.Future[None] | None, then: Then | None = None,
                  messages: Sequence[AbstractIncomingMessage] = ()) -> None:
        """A batch handled: `sent` (its publishes, from `send`), then `then` (its journal
        record, answers), then the ack of `messages` (the batch: one multiple ack), all after
        the tails before it. Returns once fewer than `depth` tails are pending (one, serial),
        raising the failure of a tail that failed."""
        prev = self._tails[-1] if self._tails else None
        if sent is not None:
            self._sent = [f for f in self._sent if not f.done()]
            self._sent.append(sent)
        self._tails.append(asyncio.ensure_future(self._tail(prev, sent, then, messages)))
        limit = 1 if self.serial else self.depth
        while self._tails and (len(self._tails) >= limit or self._tails[0].done()):
            await self._tails.popleft()

    async def _tail(self, prev: asyncio.Future[None] | None, sent: asyncio.Future[None] | None,
                    then: Then | None, messages: Sequence[AbstractIncomingMessage]) -> None:
        try:
            if prev is not None:
                await prev
            if sent is not None:
                await sent
        except publish.PublishRefused as exc:
            self.serial_until = time.monotonic() + REFUSAL_SERIAL_S
            log.warning("a publish was refused with batches in flight (%s): the session ends, and "
                        "batches go one at a time for %.0fs", exc, REFUSAL_SERIAL_S)
            raise PipelineRefused(f"publish refused with batches in flight: {exc}") from exc
        except BaseException:
            _discard(sent)
            raise
        if then is not None:
            await then()
        if messages:
            try:
                await messages[-1].ack(multiple=True)
            except Exception as exc:  # the channel or connection went away under the ack
                raise ConnectionError(f"ack failed: {exc!r}") from exc

    async def drain(self) -> None:
        """Every tail run (the first failure raised)."""
        while self._tails:
            await self._tails.popleft()

    async def close(self) -> None:
        """A session's end: the tails not run are cancelled (their input comes back)."""
        tails, self._tails = list(self._tails), deque()
        sent, self._sent = self._sent, []
        for t in (*tails, *sent):
            _discard(t)
        if tails:
            await asyncio.gather(*tails, return_exceptions=True)
