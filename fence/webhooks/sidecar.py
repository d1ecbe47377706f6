"""The webhooks sidecar (`geofence fence-webhooks`): two halves joined by PostgreSQL.

The intake consumes fence.webhooks (every worker batch of fence.event-batches, every proximity
event of fence.events) in batches: each event goes to the outbox once per enabled endpoint of
its tenant that wants it (fanout.py), in one INSERT .. ON CONFLICT DO NOTHING, committed before
the batch is acked, so nothing is lost and an event delivered again by the broker is not queued
twice. A message that is not events is dead-lettered with the reason.

The deliverer holds a PostgreSQL advisory lock (one deliverer at a time, whatever the number of
processes: a second one stands by) and runs every lane of every enabled endpoint (lanes.py). It
listens for the API's changes of the endpoints (NOTIFY webhook_endpoints) and reloads them, and
removes old delivered rows.

Trade-off: the outbox costs a row written and updated per event and endpoint, so a slow or dead
receiver never slows the pipeline nor another endpoint (its events wait in PostgreSQL, not in a
queue the broker must hold), at the price of PostgreSQL work per delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Sequence

import asyncpg
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from exchanges import routing_store, settings_registry, shell
from exchanges import topology as t
from exchanges.backoff import Backoff
from exchanges.routing_store import STORE_AWAY
from fence.venues import push
from fence.webhooks import store
from fence.webhooks.delivery import Poster
from fence.webhooks.endpoints import Endpoint
from fence.webhooks.fanout import LANES, NotEvents, decode, fan_out
from fence.webhooks.figures import WebhookFigures
from fence.webhooks.lanes import Lanes
from fence.webhooks.retries import EndpointHealth

log = logging.getLogger("geofence")
LOCK_KEY = 0x67665F776562686B  # pg_advisory_lock key of the deliverer ("gf_webhk")
RELOAD_S = 10.0  # the endpoints are read again this often, besides every NOTIFY
JANITOR_S = 60.0
FIGURES_S = 5.0
POOL_SIZE = 6
DELIVERER_GONE: tuple[type[BaseException], ...] = (*STORE_AWAY, ConnectionError)


class WebhooksSidecar:
    dlx: AbstractExchange  # the vhost's dead letters, once a session is open

    def __init__(self, config: shell.SidecarConfig, sender: push.Sender | None = None) -> None:
        self.config = config
        self.counters = shell.Counters()
        self.figures = WebhookFigures()
        self.db = routing_store.StoreConnection(config.postgres_url)
        self.lanes = Lanes(self.counters, self.figures, Poster(LANES), sender)
        self.by_tenant: dict[str, list[Endpoint]] = {}
        self.loaded_at = float("-inf")
        self.lane_tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.group: asyncio.TaskGroup | None = None

    # ------------------------------------------------------------------ endpoints

    def apply(self, endpoints: list[Endpoint], failing: dict[str, float]) -> None:
        """The endpoints as stored now: the intake's view, the lanes' and the figures'."""
        before = self.lanes.endpoints
        self.lanes.endpoints = {ep.id: ep for ep in endpoints}
        by_tenant: dict[str, list[Endpoint]] = {}
        for ep in endpoints:
            if ep.enabled:
                by_tenant.setdefault(ep.tenant, []).append(ep)
            fig = self.figures.of(ep.id, ep.tenant)
            fig.enabled = ep.enabled
            if ep.id not in self.lanes.health:
                self.lanes.health[ep.id] = EndpointHealth(failing_since=failing.get(ep.id))
            old = before.get(ep.id)
            if old is not None and not old.enabled and ep.enabled:
                self.lanes.health[ep.id] = EndpointHealth()
        self.by_tenant = by_tenant
        self.figures.keep(set(self.lanes.endpoints))
        self.loaded_at = time.monotonic()
        if self.group is not None:
            self._start_lanes(self.group)

    def _start_lanes(self, group: asyncio.TaskGroup) -> None:
        for key, task in list(self.lane_tasks.items()):
            if task.done():
                del self.lane_tasks[key]
        for ep in self.lanes.endpoints.values():
            for lane in range(LANES):
                if ep.enabled and (ep.id, lane) not in self.lane_tasks:
                    self.lane_tasks[(ep.id, lane)] = group.create_task(self.lanes.run(ep.id, lane))
                self.lanes.wake(ep.id, lane)  # a replay or an enable: look again
        kept = {(e, lane) for e in self.lanes.endpoints for lane in range(LANES)}
        for gone in set(self.lanes.wakes) - kept:
            del self.lanes.wakes[gone]

    async def _read_endpoints(self, conn: asyncpg.Connection) -> None:
        self.apply(await store.listed(conn, None), await store.failing_since(conn))

    # ------------------------------------------------------------------ intake

    async def recover(self, stop: asyncio.Event) -> bool:
        return True

    async def session(self, stop: asyncio.Event) -> None:
        self.db.stop = stop
        await shell.consume_queue(stop, self.config, t.FENCES_VHOST, t.WEBHOOKS_QUEUE, self.handle,
                                  self.counters, self.line, self.dead_letters_to)

    def dead_letters_to(self, exchange: AbstractExchange) -> None:
        self.dlx = exchange

    def line(self) -> str:
        c = self.counters
        return (f"received {c.received} msgs, queued {c.other['webhook_queued']} deliveries, delivered "
                f"{c.events} events, failed requests {c.other['webhook_failed_requests']}, given up "
                f"{c.other['webhook_dead']}, dead-lettered {sum(c.dead_lettered.values())}")

    async def handle(self, messages: Sequence[AbstractIncomingMessage]) -> None:
        if time.monotonic() - self.loaded_at > RELOAD_S:
            await self.db.run(self._read_endpoints, "read the webhook endpoints")
        if not self.by_tenant:  # no tenant has an enabled endpoint: nothing to decode (the
            self.counters.bump("webhook_skipped", len(messages))  # archiver checks the bodies)
            return
        events, outs = [], []
        for m in messages:
            try:
                good, bad = decode(m.body)
            except NotEvents as exc:
                outs.append(shell.dead_letter(self.dlx, m, exc.args[0], t.WEBHOOKS_QUEUE, self.counters))
                continue
            if bad:  # the message as it came, with why; its good events are queued below
                more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
                outs.append(shell.dead_letter(self.dlx, m, bad[0] + more, t.WEBHOOKS_QUEUE, self.counters))
            events += good
        rows = fan_out(events, self.by_tenant)
        if rows:
            try:
                new = await self.db.run(lambda c: store.queue(c, rows, time.time()),
                                        f"queue {len(rows)} deliveries")
            except asyncpg.ForeignKeyViolationError:  # an endpoint removed while the rows were written
                await self.db.run(self._read_endpoints, "read the webhook endpoints")
                rows = fan_out(events, self.by_tenant)
                new = await self.db.run(lambda c: store.queue(c, rows, time.time()),
                                        f"queue {len(rows)} deliveries")
            for endpoint_id, lane in set(new):
                self.lanes.wake(endpoint_id, lane)
            self.counters.bump("webhook_queued", len(new))
            self.counters.bump("duplicates", len(rows) - len(new))
        await shell.publish_all(outs, self.counters)

    # ------------------------------------------------------------------ deliverer

    async def deliver(self, stop: asyncio.Event) -> None:
        """Hold the deliverer's lock and run the lanes until `stop`; a lost PostgreSQL
        connection ends the round (the lanes stop) and a new one starts."""
        backoff = Backoff(cap=5.0)
        while not stop.is_set():
            try:
                await self._round(stop)
                backoff.reset()
            except* DELIVERER_GONE as group:
                delay = backoff.next()
                log.warning("webhooks deliverer: PostgreSQL lost (%s); again in %.1fs", group.exceptions[0],
                            delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)

    async def _round(self, stop: asyncio.Event) -> None:
        conn = await routing_store.connect(self.config.postgres_url)
        try:
            while not await conn.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY):
                self.counters.gauge("standby", 1)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 2.0)
                if stop.is_set():
                    return
            self.counters.gauge("standby", 0)
            changed = asyncio.Event()
            await conn.add_listener(store.CHANNEL, lambda *_: changed.set())
            # no reset query on release (a round trip per statement otherwise): the lanes' statements
            # leave no session state (no SET, no LISTEN, no cursor, no advisory lock)
            self.lanes.pool = await asyncpg.create_pool(self.config.postgres_url, min_size=1,
                                                        max_size=POOL_SIZE, reset=_no_reset)
            self.lanes.stopping.clear()
            try:
                async with asyncio.TaskGroup() as group:
                    self.group = group
                    await self._read_endpoints(conn)
                    log.info("delivering to %d webhook endpoint(s)", len(self.lanes.endpoints))
                    group.create_task(self._reloads(conn, changed, stop))
                    group.create_task(self._chores(stop))
            finally:
                self.group = None
                self.lane_tasks.clear()
                await self.lanes.pool.close()
        finally:
            with contextlib.suppress(Exception):
                await conn.close()

    async def _reloads(self, conn: asyncpg.Connection, changed: asyncio.Event, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_first(changed, stop), RELOAD_S)
            changed.clear()
            if conn.is_closed():
                raise ConnectionError("the deliverer's PostgreSQL connection closed")
            await self._read_endpoints(conn)
            for gone in set(self.lanes.poster.clients) - set(self.lanes.endpoints):
                await self.lanes.poster.forget(gone)
        # the lanes end after their request in flight, or are cancelled after the drain time
        # (a request cut short is sent again, under its webhook-id, by the next deliverer)
        self.lanes.stopping.set()
        running = [task for task in self.lane_tasks.values() if not task.done()]
        if running:
            _, late = await asyncio.wait(running, timeout=self.config.drain_s)
            for task in late:
                task.cancel()

    async def _chores(self, stop: asyncio.Event) -> None:
        last_purge = 0.0
        while not stop.is_set():
            backlogs = await self.lanes.db(store.backlogs, "read the backlogs")
            now = time.time()
            for endpoint_id, ep in self.lanes.endpoints.items():
                n, oldest = backlogs.get(endpoint_id, (0, None))
                fig = self.figures.of(endpoint_id, ep.tenant)
                fig.backlog, fig.oldest_s = n, (now - oldest if oldest else 0.0)
            if now - last_purge > JANITOR_S:
                gone = await self.lanes.db(functools.partial(store.purge, now=now), "purge the outbox")
                self.counters.bump("webhook_purged", gone)
                last_purge = now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), FIGURES_S)

    async def close(self) -> None:
        await self.lanes.poster.close()
        await self.db.close()


async def _no_reset(conn: asyncpg.Connection) -> None:
    return None


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def main(config: shell.SidecarConfig) -> int:
    stop = asyncio.Event()
    shell.install_signal_handlers(stop)
    for chatty in ("httpx", "httpcore"):  # a line per request otherwise; failures are logged here
        logging.getLogger(chatty).setLevel(logging.WARNING)
    log.info("%s", config.describe())
    sender, said = push.configured_sender(settings_registry.read("GOOGLE_APPLICATION_CREDENTIALS"))
    log.info("%s (an endpoint disabled is pushed to its tenant's admins)", said)
    sidecar = WebhooksSidecar(config, sender)
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(sidecar.deliver(stop))
            await shell.serve(config, sidecar.session, stop, sidecar.counters,
                              collectors=[sidecar.figures])
    finally:
        await sidecar.close()
    log.info("stopped: %s", sidecar.line())
    return 0
