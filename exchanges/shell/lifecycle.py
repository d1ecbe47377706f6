"""A sidecar's life: `run_sidecar` (recover, then serve, then close), `serve` (sessions until
stopped, reconnecting), `run_session` (the tasks of one session), `periodic` and the signal
handlers.

Invariants:
- The broker going away ends the session; unacked input is redelivered to the next one.
  `serve` reconnects with capped exponential backoff, for ever, until SIGTERM.
- SIGTERM: stop consuming, finish the batches in hand (DRAIN_S deadline), close channels then
  connections.
- A sidecar that took over from another instance (connections.TookOver) ends without
  `close` and with EXIT_TOOK_OVER: its state is stale, to be recovered at the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from aio_pika.abc import AbstractConnection, AbstractExchange, AbstractIncomingMessage
from prometheus_client.registry import Collector

from exchanges import topology as t
from exchanges.backoff import Backoff
from exchanges.health import WAITING
from exchanges.shell.bulk_consumer import BulkConnection
from exchanges.shell.config import SidecarConfig
from exchanges.shell.connections import (
    BROKER_GONE,
    InstanceLocked,
    TookOver,
    connection_lost,
    open_channel,
    open_connection,
)
from exchanges.shell.counters import Counters
from exchanges.shell.intake import Intake, run_batches
from exchanges.shell.metrics import metrics_server, registry_of

log = logging.getLogger("geofence")

Session = Callable[[asyncio.Event], Awaitable[None]]
EXIT_TOOK_OVER = 75  # EX_TEMPFAIL: restart me (systemd's Restart=on-failure does)


class Sidecar(Protocol):
    """What `run_sidecar` needs of the object `make(config)` gives: a role's sidecar
    (exchanges/x_geo/sidecar.py, fence/x_fence/sidecar.py; ingress/sidecar.py and fence/archive.py,
    which start it themselves, have the same shape)."""

    @property
    def counters(self) -> Counters: ...

    async def recover(self, stop: asyncio.Event) -> bool:
        """Its state rebuilt from durable sources, before the first session; False when `stop`
        came first (then it ends without serving)."""
        ...

    async def session(self, stop: asyncio.Event) -> None:
        """One session (a `Session`): returns when `stop` is set, raises when the broker goes."""
        ...

    async def close(self) -> None:
        """At a clean stop, after the last session (not after a takeover: the state is stale)."""
        ...


async def run_sidecar(config: SidecarConfig, instances: Sequence[str], role: str,
                      make: Callable[[SidecarConfig], Sidecar]) -> int:
    """`main` of a sidecar that recovers its state, then serves: `make(config)` gives a
    `Sidecar`."""
    if config.instance not in instances:
        log.error("%s %r is not one of %s", role, config.instance, list(instances))
        return 2
    stop = asyncio.Event()
    install_signal_handlers(stop)
    log.info("%s", config.describe())
    sidecar = make(config)
    if not await sidecar.recover(stop):
        return 0
    try:
        await serve(config, sidecar.session, stop, sidecar.counters, getattr(sidecar, "gauges", None))
    except TookOver as exc:  # its state is stale: no close (an x-fence would snapshot it)
        log.error("%s", exc)
        return EXIT_TOOK_OVER
    await sidecar.close()
    log.info("stopped: %s", sidecar.counters.line())
    return 0


async def serve(config: SidecarConfig, session: Session, stop: asyncio.Event,
                counters: Counters | None = None,
                extra: Callable[[], Mapping[str, float]] | None = None,
                collectors: Sequence[Collector] = ()) -> None:
    """Run sessions until `stop`; a session ends by raising when the broker goes away. With
    `counters`, they are served as Prometheus metrics on config.metrics_listen meanwhile
    (`extra`: more gauges, read at each scrape; `collectors`: a role's own families)."""
    if counters is None or not config.metrics_listen:
        await _serve(config, session, stop, counters)
        return
    counters.bump("reconnects", 0)  # a counter is there from the start, at zero
    registry = registry_of(counters, config.role, extra)
    for collector in collectors:
        registry.register(collector)
    async with metrics_server(config.metrics_listen, registry):
        await _serve(config, session, stop, counters)


EXIT_STALLED = 70  # EX_SOFTWARE: a session that would not end; the supervisor restarts the process
WATCH_EVERY_S = 1.0
STALLED_END_S = 30.0  # how long a stalled session has to end once cancelled


class SessionStalled(ConnectionError):
    """The session consumed nothing for `stall_s` (see SidecarConfig.stall_s): ended like a
    lost connection, and a new one connects."""


async def _serve(config: SidecarConfig, session: Session, stop: asyncio.Event, counters: Counters | None
                 ) -> None:
    # capped low: a broker that is back (a restart, a cluster node's peer) is found within 2 s
    backoff = Backoff(cap=2.0)
    while not stop.is_set():
        started = time.monotonic()
        lost: BaseException | None = None
        try:
            await _watched(session(stop), stop, counters, config.stall_s)
        except* BROKER_GONE as group:
            lost = group.exceptions[0]
        if counters is not None:
            counters.gauge("standby", 1 if isinstance(lost, InstanceLocked) else 0)
        if lost is None or stop.is_set():
            continue
        if counters is not None:
            counters.bump("reconnects")
        if time.monotonic() - started > 30:
            backoff.reset()
        delay = backoff.next()
        log.warning("broker unavailable (%s: %s); reconnecting in %.1fs", type(lost).__name__, lost, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)


async def _watched(session: Awaitable[None], stop: asyncio.Event, counters: Counters | None,
                   stall_s: float) -> None:
    """Run a session and watch it: one that has not consumed for `stall_s` (gauge `consuming`
    0, no WAITING gauge at 1) is cancelled and ends as SessionStalled, so `_serve` connects
    again; one that does not end within STALLED_END_S of that is stuck for good, and the
    process exits (EXIT_STALLED) for its supervisor to restart it (systemd's Restart=).
    A role that lost its consumer is down, whether or not its /metrics still answers."""
    task = asyncio.ensure_future(session)
    if counters is None:
        await task
        return
    idle_since = time.monotonic()
    try:
        while not task.done():
            await asyncio.wait([task], timeout=WATCH_EVERY_S)
            now = time.monotonic()
            g = counters.gauges
            if g.get("consuming") == 1 or any(g.get(w) == 1 for w in WAITING) or stop.is_set():
                idle_since = now
            elif now - idle_since > stall_s:
                log.error("the session has consumed nothing for %.0fs (stalled): ending it", now - idle_since)
                counters.bump("stalls")
                task.cancel()
                done, _ = await asyncio.wait([task], timeout=STALLED_END_S)
                if not done:
                    log.critical("the stalled session did not end within %.0fs: exiting (%d) for a restart",
                                 STALLED_END_S, EXIT_STALLED)
                    logging.shutdown()
                    os._exit(EXIT_STALLED)
                raise SessionStalled(f"no input consumed for {stall_s:g}s")
        task.result()
    finally:
        if not task.done():  # this one cancelled (a stop), or the stalled session still running
            task.cancel()
            await asyncio.wait([task], timeout=STALLED_END_S)


async def run_session(stop: asyncio.Event, conns: Sequence[AbstractConnection | BulkConnection],
                      intakes: Sequence[Intake], loops: Sequence[Coroutine[Any, Any, None]],
                      background: Sequence[Coroutine[Any, Any, None]], drain_s: float,
                      prepare: Coroutine[Any, Any, None] | None = None,
                      counters: Counters | None = None) -> None:
    """Own every task of a session (TaskGroup). Ends when `stop` is set (consumers
    cancelled, loops drained within `drain_s`) or raises when a connection closes.

    With `prepare` (a role's state rebuilt: x-fence's journal replayed), only the first intake
    consumes while it runs (the role's control queue, so that `inspect` answers; the
    connection's heartbeats go on as the loop is free) and the others start once it is done.
    `counters` gets the gauge `consuming`: 1 while every intake consumes, 0 from the moment
    the session starts to end (the health of the role: exchanges/shell/metrics.py, the
    GeofenceRoleDown alert, `geofence status`)."""
    if counters is not None:
        counters.gauge("consuming", 0)
    try:
        async with asyncio.TaskGroup() as tg:
            loop_tasks = [tg.create_task(c) for c in loops]
            others: list[asyncio.Task[Any]] = [tg.create_task(c) for c in background]
            watcher = tg.create_task(connection_lost(conns))
            stopper = tg.create_task(stop.wait())
            others += [watcher, stopper]
            for intake in intakes[:1] if prepare is not None else intakes:
                await intake.start()
            cancelled = tg.create_task(_cancelled(intakes))
            others.append(cancelled)
            ready = True
            if prepare is not None:
                prep = tg.create_task(prepare)
                others.append(prep)
                await asyncio.wait([watcher, stopper, prep, cancelled], return_when=asyncio.FIRST_COMPLETED)
                ready = (prep.done() and not prep.cancelled() and prep.exception() is None
                         and not stop.is_set())
                if ready:
                    for intake in intakes[1:]:
                        await intake.start()
            if ready:
                if counters is not None:
                    counters.gauge("consuming", 1)
                await asyncio.wait([watcher, stopper, *loop_tasks, cancelled],
                                   return_when=asyncio.FIRST_COMPLETED)
            if counters is not None:
                counters.gauge("consuming", 0)
            if stop.is_set():
                for intake in intakes:
                    await intake.stop()
                _, pending = await asyncio.wait(loop_tasks, timeout=drain_s) if loop_tasks else ((), ())
                if pending:
                    log.warning("drain deadline (%gs) passed with %d loops busy; their unacked "
                                "messages will be redelivered", drain_s, len(pending))
                for task in (*pending, *others):
                    task.cancel()
    finally:
        if counters is not None:
            counters.gauge("consuming", 0)


async def _cancelled(intakes: Sequence[Intake]) -> None:
    """Raises when the broker cancels one of the consumers: the session starts again."""
    waits = [asyncio.ensure_future(i.cancelled.wait()) for i in intakes]
    if not waits:
        await asyncio.Event().wait()  # nothing to watch: wait to be cancelled with the session
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    raise ConnectionError("the broker cancelled a consumer (its queue was deleted or moved)")


def install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def periodic(stop: asyncio.Event, every: float, action: Callable[[], Awaitable[None] | None]
                   ) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
        if stop.is_set():
            return
        result = action()
        if result is not None:
            await result


async def consume_queue(stop: asyncio.Event, config: SidecarConfig, vhost: str, queue: str,
                        handle: Callable[[list[AbstractIncomingMessage]], Awaitable[Any]], counters: Counters,
                        line: Callable[[], str],
                        dead_letters: Callable[[AbstractExchange], None]) -> None:
    """The session of a role that consumes one queue in batches and publishes nothing but its
    dead letters (the events archiver, the webhooks sidecar): `dead_letters` is handed the
    vhost's dead-letter exchange before the first batch; `line` is logged every 30 s."""
    async with contextlib.AsyncExitStack() as stack:
        conn = await open_connection(config, vhost, stack)
        out = await open_channel(conn, stack)
        dlx = await out.get_exchange(t.DEAD_LETTER_EXCHANGE, ensure=False)
        dead_letters(dlx)
        ch = await open_channel(conn, stack)
        intake = Intake.on(await ch.get_queue(queue), config.batch_max, config.prefetch)
        log.info("consuming %s", queue)
        await run_session(stop, [conn], [intake], [run_batches(intake, handle, counters, dlx)],
                          [periodic(stop, 30, lambda: log.info("%s", line()))], config.drain_s,
                          counters=counters)
