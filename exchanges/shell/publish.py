"""Publishing: `Out` (one message to publish), `publish_all` (concurrent, every confirm
awaited), `dead_letter` and `reply` (the Outs of a dead-lettered input and of an answer).

Invariants:
- Bad input is never acked silently: the role publishes it to the vhost's `dead-letters`
  exchange with the reason (header x-geofence-reason), confirmed, before the ack; `Counters`
  counts it by reason.
- A publish refused by the broker (a full queue with overflow reject-publish, or an
  unroutable mandatory message while a federation link is down) is retried with backoff while
  the input stays unacked: back-pressure instead of loss. A publish lost with its channel is
  a `ConnectionError` (the broker's, see connections.BROKER_GONE), never a refusal.

Trade-off: `_publish` goes straight to aiormq under aio-pika, with message properties built
once per content type (throughput); without confirms (GEOFENCE_PERSISTENCE=off, benchmarks
only) messages are transient and nothing is retried.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage
from aiormq.abc import ChannelFrame
from pamqp.commands import Basic

from exchanges import topology as t
from exchanges.backoff import Backoff
from exchanges.shell import frames
from exchanges.shell.counters import Counters, reason_key

log = logging.getLogger("geofence")

PERSISTENT = aio_pika.DeliveryMode.PERSISTENT


class PublishRefused(RuntimeError):
    """The broker nacked or returned a publish (full queue, no route)."""


@dataclass(frozen=True)
class Out:
    """One message to publish."""

    exchange: AbstractExchange
    routing_key: str
    body: bytes
    content_type: str = "application/msgpack"
    headers: Mapping[str, Any] | None = None
    mandatory: bool = True
    correlation_id: str | None = None
    message_id: str | None = None


@dataclass(frozen=True, slots=True)
class Plains:
    """Plain messages to one exchange (not mandatory, no headers, no ids), routing keys and
    bodies side by side, one content type: a role's per-event messages, encoded straight into
    frames without an `Out` each."""

    exchange: AbstractExchange
    routing_keys: Sequence[str]
    bodies: Sequence[bytes]
    content_type: str = "application/json"

    def __len__(self) -> int:
        return len(self.bodies)

    def outs(self) -> list[Out]:
        return [Out(self.exchange, k, b, self.content_type, mandatory=False)
                for k, b in zip(self.routing_keys, self.bodies, strict=True)]


async def publish_all(outs: Sequence[Out | Plains], counters: Counters,
                      deadline: float | None = None, retry: bool = True) -> None:
    """Publish and wait for every confirm; nacked or returned ones are retried with backoff
    (the caller holds its input unacked meanwhile), or with `retry` False raise PublishRefused
    (a pipeline's: a retry would come behind later batches, exchanges/shell/pipeline.py).
    Plain messages (`Plains`, and an `Out` that is plain) go out as one write per channel
    (`_publish_plain`), the others one by one through aiormq."""
    pending = list(outs)
    if not pending:
        return
    backoff = Backoff(0.05, 2.0)
    started = time.monotonic()  # to the last confirm, retries included: confirm_wait_seconds
    while pending:
        plain: dict[int, list[Plains]] = {}  # by channel
        other: list[Out] = []
        for o in pending:
            if isinstance(o, Out) and not _plain(o):
                other.append(o)
                continue
            p = o if isinstance(o, Plains) else Plains(o.exchange, (o.routing_key,), (o.body,),
                                                       o.content_type)
            if len(p):
                plain.setdefault(id(p.exchange.channel), []).append(p)  # type: ignore[attr-defined]
        done = await asyncio.gather(*(_publish_plain(g) for g in plain.values()),
                                    *(_publish_one(o) for o in other), return_exceptions=True)
        messages = [(p, j) for g in plain.values() for p in g for j in range(len(p))] + \
                   [(o, -1) for o in other]
        results: list[BaseException | None] = []
        for got in done:
            if isinstance(got, BaseException):
                raise got
            results += got
        failed: list[Out] = []
        for (o, j), r in zip(messages, results, strict=True):
            if isinstance(r, BaseException):
                if not isinstance(r, PublishRefused):
                    raise r
                failed.append(o if isinstance(o, Out) else Out(o.exchange, o.routing_keys[j], o.bodies[j],
                                                               o.content_type, mandatory=False))
        counters.published += len(messages) - len(failed)
        if failed:
            if not retry:
                first = next(r for r in results if isinstance(r, PublishRefused))
                raise PublishRefused(f"{len(failed)} of {len(messages)} publishes refused ({first})")
            counters.retries += len(failed)
            if deadline is not None and time.monotonic() > deadline:
                raise PublishRefused(f"{len(failed)} publishes still refused at the deadline")
            delay = backoff.next()
            log.warning("%d publishes refused by the broker (full queue or no route); retrying in "
                        "%.2fs", len(failed), delay)
            await asyncio.sleep(delay)  # back-pressure: the input stays unacked meanwhile
        pending = list(failed)
    counters.observe("confirm_wait_seconds", time.monotonic() - started)


async def _publish_one(o: Out) -> list[BaseException | None]:
    try:
        await _publish(o)
    except PublishRefused as exc:
        return [exc]
    return [None]


def _plain(o: Out) -> bool:
    return not o.mandatory and o.headers is None and o.correlation_id is None and o.message_id is None


class _Batch:
    """The confirms of one plain batch: a count down to one future (made by the channel, so a
    lost channel fails it), and the broker's refusals by message. aiormq's per-publish future
    costs a future, a done-callback and a closure at each level of its store chain: at 5
    events per update that was 44% of x-fence (py-spy, F=10,000)."""

    __slots__ = ("future", "left", "refused")

    def __init__(self, n: int, future: asyncio.Future[Any]) -> None:
        self.left, self.future = n, future
        self.refused: dict[int, BaseException] = {}

    def settle(self, index: int, exc: BaseException | None) -> None:
        if exc is not None:
            self.refused[index] = exc
        self.left -= 1
        if not self.left and not self.future.done():
            self.future.set_result(None)


class _Confirm:
    """What aiormq's channel finds under a delivery tag of a plain batch: it calls done(),
    set_result(frame) on an ack and set_exception(DeliveryError) on a nack (and cancelled()
    only once done), as it would on its own future."""

    __slots__ = ("batch", "index", "settled")

    def __init__(self, batch: _Batch, index: int) -> None:
        self.batch, self.index, self.settled = batch, index, False

    def done(self) -> bool:
        return self.settled

    def cancelled(self) -> bool:
        return False

    def set_result(self, frame: Any) -> None:
        if not self.settled:
            self.settled = True
            self.batch.settle(self.index, None)

    def set_exception(self, exc: BaseException) -> None:
        if not self.settled:
            self.settled = True
            self.batch.settle(self.index, exc)


async def _publish_plain(group: Sequence[Plains]) -> list[BaseException | None]:
    """Plain messages of one channel as one write: the frames encoded here
    (exchanges/shell/frames.py), delivery tags registered with aiormq's channel under its
    publish lock (so tags stay in step with its own publishes), each with a `_Confirm` of
    one `_Batch`, then the batch awaited. A nack is a PublishRefused for that message; a
    channel lost meanwhile, a ConnectionError for the batch."""
    channel = await group[0].exchange.channel.get_underlay_channel()  # type: ignore[attr-defined]
    confirms = channel.publisher_confirms
    mode = int(PERSISTENT) if confirms else int(aio_pika.DeliveryMode.NOT_PERSISTENT)
    frame_max = channel.connection.connection_tune.frame_max
    number = channel.number
    parts: list[bytes] = []
    for p in group:
        parts += frames.messages(number, p.exchange.name, p.routing_keys, p.bodies, p.content_type, mode,
                                 frame_max)
    n = sum(map(len, group))
    payload = b"".join(parts)
    batch: _Batch | None = None
    try:
        async with channel.lock:
            if channel.is_closed:
                raise ConnectionError("publish on a closed channel")
            if confirms:
                batch = _Batch(n, channel.create_future())
                first = channel.delivery_tag + 1
                channel.delivery_tag += n
                table = channel.confirmations
                for i in range(n):
                    table[first + i] = _Confirm(batch, i)
            drained = channel.create_future()
            try:
                await channel.write_queue.put(ChannelFrame(payload=payload, should_close=False,
                                                           drain_future=drained))
            except BaseException:  # not queued: the broker never sees these tags, take them back
                if batch is not None:
                    for tag in range(first, first + n):
                        channel.confirmations.pop(tag, None)
                    channel.delivery_tag = first - 1
                    batch.future.cancel()
                raise
        await drained
        if batch is None:
            return [None] * n
        await batch.future
        refused = batch.refused
        if not refused:
            return [None] * n
        return [None if i not in refused else PublishRefused(str(refused[i])) for i in range(n)]
    except ConnectionError:
        raise
    except Exception as exc:
        if channel.is_closed or type(exc) is Exception:
            raise ConnectionError(f"publish lost with its channel: {exc!r}") from exc
        raise


async def _publish(o: Out) -> None:
    # Straight to the aiormq channel under aio-pika's exchange, with the message properties
    # built once per content type: aio_pika.Message (and its properties) per message was
    # half of a sidecar's publishing cost (bench: 1.9k -> 4.6k confirmed msgs/s).
    channel = await o.exchange.channel.get_underlay_channel()  # type: ignore[attr-defined]
    try:
        confirm = await channel.basic_publish(o.body, exchange=o.exchange.name, routing_key=o.routing_key,
                                              properties=_properties(o, channel.publisher_confirms),
                                              mandatory=o.mandatory and channel.publisher_confirms)
    except aiormq.exceptions.DeliveryError as exc:  # returned (no route) or nacked
        raise PublishRefused(str(exc)) from None
    except Exception as exc:
        # aiormq fails the confirms a closing channel still awaits with a bare Exception:
        # the broker (or the link to it) went away, not a bug (the input stays unacked)
        if channel.is_closed or type(exc) is Exception:
            raise ConnectionError(f"publish lost with its channel: {exc!r}") from exc
        raise
    if confirm is not None and not isinstance(confirm, Basic.Ack):
        raise PublishRefused(f"broker answered {type(confirm).__name__}")


_PLAIN_PROPERTIES: dict[tuple[str, int], Basic.Properties] = {}  # (content type, mode) -> properties


async def publish_sample(exchange: AbstractExchange, body: bytes, content_type: str, mandatory: bool) -> bool:
    """A transient message outside the pipeline (a live-map sample): True when routed, False
    when returned unroutable (`mandatory`). The broker gone while it is written is a
    `ConnectionError` as for every publish (aiormq fails a write its closing channel still
    holds with a bare Exception), so a sample never ends a role as a bug would."""
    try:
        await exchange.publish(aio_pika.Message(body, content_type=content_type,
                                                delivery_mode=aio_pika.DeliveryMode.NOT_PERSISTENT),
                               "", mandatory=mandatory)
    except aiormq.exceptions.DeliveryError:
        return False
    except ConnectionError:
        raise
    except Exception as exc:
        if type(exc) is Exception:
            raise ConnectionError(f"sample lost with its channel: {exc!r}") from exc
        raise
    return True


def _properties(o: Out, persistent: bool = True) -> Basic.Properties:
    mode = int(PERSISTENT) if persistent else int(aio_pika.DeliveryMode.NOT_PERSISTENT)
    if o.headers is None and o.correlation_id is None and o.message_id is None:
        p = _PLAIN_PROPERTIES.get((o.content_type, mode))
        if p is None:
            p = _PLAIN_PROPERTIES[(o.content_type, mode)] = Basic.Properties(delivery_mode=mode,
                                                                             content_type=o.content_type)
        return p
    return Basic.Properties(delivery_mode=mode, content_type=o.content_type,
                            headers=dict(o.headers) if o.headers else None,
                            correlation_id=o.correlation_id, message_id=o.message_id)


def dead_letter(exchange: AbstractExchange, message: AbstractIncomingMessage, reason: str,
                source: str, counters: Counters) -> Out:
    """The message as it came, to the vhost's dead-letters exchange, with the reason."""
    counters.dead_lettered[reason_key(reason)] += 1
    headers = {**(message.headers or {}), t.REASON_HEADER: reason[:1000],
               "x-geofence-source": source, "x-geofence-routing-key": message.routing_key or "",
               "x-geofence-dead-lettered-at-ms": int(time.time() * 1000)}
    # the exchange it was first published to, kept through replays (a replay comes through a
    # private exchange): x-ingress refuses a batch of the retired ingress.batches, replayed too
    headers.setdefault(t.FIRST_EXCHANGE_HEADER, getattr(message, "exchange", None) or "")
    headers.pop("x-delivery-count", None)  # the broker's, about the queue it came from
    return Out(exchange, source, message.body, message.content_type or "application/octet-stream",
               headers, mandatory=False, message_id=message.message_id)


def reply(channel: AbstractChannel, request: AbstractIncomingMessage, payload: Any) -> Out | None:
    """The answer to a request carrying reply_to (e.g. `geofence inspect`), as JSON."""
    if not request.reply_to:
        return None
    import orjson

    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    return Out(channel.default_exchange, request.reply_to, body, "application/json", None,
               mandatory=False, correlation_id=request.correlation_id)
