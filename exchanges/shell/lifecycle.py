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
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from aio_pika.abc import AbstractConnection

from exchanges.shell.config import SidecarConfig
from exchanges.shell.connections import BROKER_GONE, Backoff, TookOver, connection_lost
from exchanges.shell.counters import Counters
from exchanges.shell.intake import Intake
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
                extra: Callable[[], Mapping[str, float]] | None = None) -> None:
    """Run sessions until `stop`; a session ends by raising when the broker goes away. With
    `counters`, they are served as Prometheus metrics on config.metrics_listen meanwhile
    (`extra`: more gauges, read at each scrape)."""
    if counters is None or not config.metrics_listen:
        await _serve(config, session, stop, counters)
        return
    counters.bump("reconnects", 0)  # a counter is there from the start, at zero
    registry = registry_of(counters, config.role, extra)
    async with metrics_server(config.metrics_listen, registry):
        await _serve(config, session, stop, counters)


async def _serve(config: SidecarConfig, session: Session, stop: asyncio.Event, counters: Counters | None
                 ) -> None:
    backoff = Backoff()
    while not stop.is_set():
        started = time.monotonic()
        lost: BaseException | None = None
        try:
            await session(stop)
        except* BROKER_GONE as group:
            lost = group.exceptions[0]
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


async def run_session(stop: asyncio.Event, conns: Sequence[AbstractConnection],
                      intakes: Sequence[Intake], loops: Sequence[Coroutine[Any, Any, None]],
                      background: Sequence[Coroutine[Any, Any, None]], drain_s: float) -> None:
    """Own every task of a session (TaskGroup). Ends when `stop` is set (consumers
    cancelled, loops drained within `drain_s`) or raises when a connection closes."""
    async with asyncio.TaskGroup() as tg:
        loop_tasks = [tg.create_task(c) for c in loops]
        others: list[asyncio.Task[Any]] = [tg.create_task(c) for c in background]
        watcher = tg.create_task(connection_lost(conns))
        stopper = tg.create_task(stop.wait())
        others += [watcher, stopper]
        for intake in intakes:
            await intake.start()
        others.append(tg.create_task(_cancelled(intakes)))
        await asyncio.wait([watcher, stopper, *loop_tasks, others[-1]], return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set():
            for intake in intakes:
                await intake.stop()
            _, pending = await asyncio.wait(loop_tasks, timeout=drain_s) if loop_tasks else ((), ())
            if pending:
                log.warning("drain deadline (%gs) passed with %d loops busy; their unacked "
                            "messages will be redelivered", drain_s, len(pending))
            for task in (*pending, *others):
                task.cancel()


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
