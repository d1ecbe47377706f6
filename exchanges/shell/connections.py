"""Connections to the broker: opening connections and channels on a session's exit stack,
the single-instance lock of a routing role, watching for a lost connection, and the
reconnect/retry `Backoff` (exchanges/backoff.py).

Invariants:
- Everything opened is registered on the session's `AsyncExitStack` and closed with it, in
  reverse order (channels before their connection), quietly and within 5 s each: a broker
  that went away does not hang the end of a session.
- The broker going away ends the session: `connection_lost` raises, and every error in
  `BROKER_GONE` is the broker's, not a fault of the sidecar (`lifecycle.serve` reconnects;
  unacked input is redelivered to the next session).
- A routing role runs one instance at a time (`InstanceLock`, an exclusive queue owned by
  the session's connection); an instance that got the lock after standing by ends
  (`TookOver`): what it holds in memory is stale.

Trade-off: channels use publisher confirms (a returned mandatory message raises), except
with GEOFENCE_PERSISTENCE=off (benchmarks only).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection

from exchanges.shell.bulk_consumer import BulkConnection, open_bulk
from exchanges.shell.config import SidecarConfig

log = logging.getLogger("geofence")

BROKER_GONE = (aiormq.exceptions.AMQPConnectionError, aiormq.exceptions.ChannelInvalidStateError,
               ConnectionError, OSError)


CONNECT_S = 10.0  # one node's connect timeout
FAILOVER_CONNECT_S = 3.0  # one node's, with other nodes of its cluster to try next
# the node of a cluster each AMQP URL last connected to: a process stays on the node it failed
# over to (its connections move back only when that node fails in turn)
_node_of: dict[str, int] = {}


async def open_connection(config: SidecarConfig, vhost: str, stack: contextlib.AsyncExitStack,
                          endpoint: tuple[str, int] | None = None) -> AbstractConnection:
    """A connection to `vhost` (on `endpoint` when it lives on another broker), closed with
    the stack. With the other nodes of a cluster (GEOFENCE_AMQP_NODES), the node last reached
    first, then the next ones; the last node's error when none answers."""
    conn: AbstractConnection
    if endpoint is not None or not config.amqp_nodes:
        conn = await aio_pika.connect(config.amqp_for(vhost, endpoint), timeout=CONNECT_S)
    else:
        conn = await _connect_any(config, vhost)
    stack.push_async_callback(_close_quietly, conn)
    return conn


async def open_bulk_connection(config: SidecarConfig, vhost: str, stack: contextlib.AsyncExitStack,
                               endpoint: tuple[str, int] | None = None) -> BulkConnection:
    """A consuming connection that reads deliveries in bulk (exchanges/shell/bulk_consumer.py)
    to `vhost`, closed with the stack; in a cluster, on the node this process's aio-pika
    connections reached last (open_connection first)."""
    if endpoint is None and config.amqp_nodes:
        endpoint = config.amqp_endpoints[_node_of.get(config.amqp_url, 0)]
    conn = await open_bulk(config.amqp_for(vhost, endpoint), CONNECT_S)
    stack.push_async_callback(conn.close)
    return conn


async def _connect_any(config: SidecarConfig, vhost: str) -> AbstractConnection:
    nodes = config.amqp_endpoints
    first = _node_of.get(config.amqp_url, 0)
    for i in range(len(nodes)):
        k = (first + i) % len(nodes)
        try:
            conn = await aio_pika.connect(config.amqp_for(vhost, nodes[k]), timeout=FAILOVER_CONNECT_S)
        except (*BROKER_GONE, TimeoutError) as exc:
            if i == len(nodes) - 1:
                raise
            log.warning("%s: RabbitMQ node %s:%d unreachable (%s): trying %s:%d", config.name, *nodes[k],
                        type(exc).__name__, *nodes[(k + 1) % len(nodes)])
            continue
        if k != first:
            log.warning("%s: connected to RabbitMQ node %s:%d of its cluster", config.name, *nodes[k])
        _node_of[config.amqp_url] = k
        return conn
    raise AssertionError("unreachable: a cluster has a node")


async def _close_quietly(closable: AbstractConnection | AbstractChannel) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(closable.close(), 5)


async def open_channel(conn: AbstractConnection, stack: contextlib.AsyncExitStack,
                       prefetch: int = 0, confirms: bool = True) -> AbstractChannel:
    """A channel with publisher confirms (returned mandatory messages raise). Without
    confirms (GEOFENCE_PERSISTENCE=off, benchmarks only) what it publishes is transient. A
    connection the broker closed meanwhile is a ConnectionError (aiormq says RuntimeError: the
    session ends and the next one reconnects, instead of the process dying)."""
    try:
        ch = await conn.channel(publisher_confirms=confirms, on_return_raises=confirms)
    except RuntimeError as exc:
        if not str(exc).endswith(" closed"):  # aiormq's "<Connection ...> closed"
            raise
        raise ConnectionError(f"the connection closed while a channel was opened: {exc}") from exc
    stack.push_async_callback(_close_quietly, ch)
    if prefetch:
        await ch.set_qos(prefetch_count=prefetch)
    return ch


class InstanceLocked(ConnectionError):
    """Another instance of this role holds its lock: this one stands by (retries)."""


class TookOver(Exception):
    """This process was locked out, then got the lock: another instance ran meanwhile, so
    what it holds in memory is stale. It ends, to be restarted and recover (crash-only)."""


class InstanceLock:
    """The single-instance guard of a routing role (two x-ingress, or two x-geo of a region,
    or two x-fence of a worker, would each see part of an object's positions). An exclusive
    queue is the lock: owned by the session's connection, deleted by the broker with it.
    Exclusive consumers alone are no guard: a role consumes several queues, and a prefetch
    change consumes again (a gap another instance can take)."""

    def __init__(self, name: str, stand_by: bool = True) -> None:
        self.name = name
        self.locked_out = False
        # False: a lock held by another is TookOver at once (a worker's slot, which stands by
        # outside its sessions: fence/x_fence/slots.py), not InstanceLocked retried in them
        self.stand_by = stand_by

    async def acquire(self, conn: AbstractConnection, stack: contextlib.AsyncExitStack) -> None:
        ch = await open_channel(conn, stack)  # its own: a refused declare closes the channel
        try:
            await ch.declare_queue(self.name, exclusive=True, auto_delete=True, durable=False)
        except aiormq.exceptions.ChannelLockedResource as exc:
            if not self.stand_by:
                raise TookOver(f"{self.name} is held by another instance") from exc
            if not self.locked_out:
                log.error("another instance holds %s: standing by until it goes", self.name)
            self.locked_out = True
            raise InstanceLocked(f"{self.name} is held by another instance") from exc
        if self.locked_out:
            raise TookOver(f"got {self.name} after another instance held it: restarting to recover")


async def connection_lost(conns: Sequence[AbstractConnection | BulkConnection]) -> None:
    """Returns (raising) when any of the connections closes. Through the close callbacks:
    aio-pika's `closed()` does not resolve when the broker closes the connection."""
    lost = asyncio.Event()
    for c in conns:
        c.close_callbacks.add(lambda *_: lost.set())
        if c.is_closed:
            lost.set()
    await lost.wait()
    raise ConnectionError("broker connection closed")
