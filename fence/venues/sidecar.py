"""The sensor sidecar (`geofence venue-sensors`): presence-sensor frames in, hive occupancy out.

    MQTT sensors/<sensor_id>/<kind> -> amq.topic (gf-ingress) --"sensors.#"--> venue.sensors
      -> decode, derive counts (sensor_core.py, counting.py), add them to the hives' days
         (occupancy.py)
      -> PostgreSQL, one transaction per batch (venue_store.py): reports, events, statuses,
         the sensors' counting state, hive_status, closed days
      -> each hive whose live figure moved: venue.occupancy (AMQP, key hive-occupancy.<hive>)
         and amq.topic (MQTT hive-occupancy/<hive>), a JSON status, persistent, confirmed
      -> ack (after the commit and the confirms)
    venue.occupancy --"hive-occupancy.#"--> venue.notify -> the notifier (notifier.py): users'
      thresholds, push notifications (push.py: FCM with GOOGLE_APPLICATION_CREDENTIALS, else
      logged as local), on its own queue so a slow push service never holds up the counting;
      and every minute the sensors' health: owner alerts for silent sensors and low batteries

Bad frames (wrong length, impossible date, unknown type, version or sensor) go to the vhost's
dead-letters with the reason; the rest of the batch goes on. A batch delivered again after a
crash counts nothing twice: the counting state committed with the reports remembers them (a
report older than the last one counted is `late`: counting.py), and the v2 events already in
sensor_event are looked up before the batch is counted (one query, under the lock of the one
sidecar that writes them), so the live figure adds exactly the event rows the batch stores.

The receive time of a frame is when the sidecar takes its batch (the MQTT plugin stamps none):
under a backlog it is late, and a report more than counting.MAX_SKEW_S behind it is placed at
it (counted all the same, at a later instant).

Sensors registered after the start are read from PostgreSQL when a frame names one not known,
and every sensor every SENSOR_RELOAD_S (settings changed, sensors removed); the day turns for every hive
at its reset time (checked every ROLL_EVERY_S).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import orjson
from aio_pika.abc import AbstractIncomingMessage

from exchanges import routing_store, settings_registry, shell
from exchanges import topology as t
from exchanges.fence_events import qualified_ids
from fence.venues import push, venue_store
from fence.venues.notifier import WATCH_EVERY_S, Notifier
from fence.venues.occupancy import DayCounts, HiveOccupancy, occupancy_message
from fence.venues.reads import VenueCache, publish_status
from fence.venues.sensor_core import KINDS, Frame, Processed, SensorCore

log = logging.getLogger("geofence")
SENSOR_RELOAD_S = 30.0
ROLL_EVERY_S = 60.0
JSON = "application/json"


def frame_of(routing_key: str, body: bytes, received_at: float) -> Frame | str:
    """The frame a message carries, or why it is none (its routing key is not a sensor topic)."""
    parts = routing_key.split(".")
    if len(parts) < 3 or parts[0] != t.SENSORS_TOPIC_PREFIX or not parts[1]:
        return f"not a sensor topic: {routing_key!r} (sensors/<sensor_id>/<kind> expected)"
    kind = "/".join(parts[2:])
    if kind not in KINDS:
        return f"unknown sensor topic kind {kind!r} (known: {', '.join(KINDS)})"
    return Frame(parts[1], kind, body, received_at)


class SensorSidecar:
    def __init__(self, config: shell.SidecarConfig, sender: push.Sender | None = None) -> None:
        self.config = config
        self.counters = shell.Counters()
        self.notifier = Notifier(sender or push.LocalSender(), self.counters)
        # the counting's and the notifier's own PostgreSQL connections (they run side by side)
        self.db = routing_store.StoreConnection(config.postgres_url)
        self.notify_db = routing_store.StoreConnection(config.postgres_url)
        self.core = SensorCore()
        self.hives: dict[str, HiveOccupancy] = {}
        self.instance_lock = shell.InstanceLock(t.VENUES_LOCK)
        self.lock = asyncio.Lock()  # the hives, the core and the PostgreSQL connection: one user at a time
        self.cache = VenueCache(config.memcached_url) if config.memcached_url else None
        self._events_queue: Any = None  # venue.fence-events of the session (bound per hive fence)
        self._bound: set[str] = set()

    async def recover(self, stop: asyncio.Event) -> bool:
        got = await routing_store.read_until_stopped(self.config.postgres_url, venue_store.load, "sensors",
                                                     stop)
        if got is None:
            return False
        self._apply_load(got)
        await self._load_phones(list(self.hives))
        log.info("%d sensors of %d hives (%d with a fence)", len(self.core.sensors), len(self.hives),
                 sum(1 for h in self.hives.values() if h.fence_id))
        return True

    async def _load_phones(self, hive_ids: list[str]) -> None:
        """The app figure of these hives from the events archive (the live events correct it)."""
        rows = await self.db.run(lambda conn: venue_store.phones(conn, hive_ids), "read the hives' phones")
        for hive_id, object_id, inside, ts in rows:
            self.hives[hive_id].phone(object_id, inside, ts)

    def _apply_load(self, got: tuple[dict, dict, dict], complete: bool = True) -> None:  # type: ignore[type-arg]
        """What the store says; `complete`: every sensor (those it lacks were removed)."""
        sensors, counts, hives = got
        if complete:
            for sid in set(self.core.sensors) - set(sensors):
                self.core.remove_sensor(sid)
        for sid, info in sensors.items():
            self.core.add_sensor(info)
            if sid not in self.core.state and sid in counts:
                self.core.restore(sid, counts[sid])
        for hid, h in hives.items():
            mine = self.hives.get(hid)
            if mine is None:
                self.hives[hid] = h
            else:  # the live counts are ours; the hive's settings are the store's
                if mine.fence_id != h.fence_id:
                    mine.phones.clear()  # another fence: its phones are read again below
                mine.tz, mine.reset_hour, mine.capacity = h.tz, h.reset_hour, h.capacity
                mine.fence_id = h.fence_id

    async def _reload(self) -> None:
        async with self.lock:
            moved = await self._reload_locked()
        if moved:
            await shell.publish_all(self._occupancy_outs(moved), self.counters)
            await self._cache(moved)

    async def _reload_locked(self) -> list[HiveOccupancy]:
        """Sensors and hives from the store; a hive with a new fence gets its phones from the
        archive, stored at once. Returns those hives (their figure to publish)."""
        before = {hid: h.fence_id for hid, h in self.hives.items()}
        self._apply_load(await self.db.run(venue_store.load, "read the sensors and hives"))
        changed = [hid for hid, h in self.hives.items() if h.fence_id and before.get(hid) != h.fence_id]
        await self._bind_fences()  # first: what happens from now on is queued, what came before archived
        if not changed:
            return []
        await self._load_phones(changed)
        moved = [self.hives[hid] for hid in changed]
        now = time.time()
        for h in moved:
            h.touch(now)
        await self._store(Processed(), moved, [])
        return moved

    async def _bind_fences(self) -> None:
        """venue.fence-events gets the events of every hive's fence (bound on amq.topic, where
        fence.events is federated), its presence events too (the phones of a tenant the fence
        counts from: pseudonyms, counted alike); a fence no hive has any more is unbound."""
        queue = self._events_queue
        if queue is None:
            return
        want = {h.fence_id for h in self.hives.values() if h.fence_id}
        for fid in sorted(want - self._bound):  # its own tenant's phones, and the counted ones'
            await queue.bind(t.MQTT_TOPIC_EXCHANGE, t.event_binding_key(fid))
            await queue.bind(t.MQTT_TOPIC_EXCHANGE, t.presence_binding_key(fid))
            self._bound.add(fid)
        for fid in sorted(self._bound - want):
            await queue.unbind(t.MQTT_TOPIC_EXCHANGE, t.event_binding_key(fid))
            await queue.unbind(t.MQTT_TOPIC_EXCHANGE, t.presence_binding_key(fid))
            self._bound.discard(fid)

    async def session(self, stop: asyncio.Event) -> None:
        self.db.stop = self.notify_db.stop = stop
        cfg = self.config
        async with contextlib.AsyncExitStack() as stack:
            conn = await shell.open_connection(cfg, t.INGRESS_VHOST, stack)
            await self.instance_lock.acquire(conn, stack)
            out = await shell.open_channel(conn, stack, confirms=cfg.persistence)
            self.dlx = await out.get_exchange(t.DEAD_LETTER_EXCHANGE, ensure=False)
            self.occupancy_x = await out.get_exchange(t.OCCUPANCY_EXCHANGE, ensure=False)
            self.mqtt_x = await out.get_exchange(t.MQTT_TOPIC_EXCHANGE, ensure=False)
            ch = await shell.open_channel(conn, stack)
            intake = shell.Intake.on(await ch.get_queue(t.SENSORS_QUEUE), cfg.batch_max, cfg.prefetch)
            nch = await shell.open_channel(conn, stack)
            notify = shell.Intake.on(await nch.get_queue(t.NOTIFY_QUEUE), 500, 1000)
            ech = await shell.open_channel(conn, stack)
            self._events_queue = await ech.get_queue(t.HIVE_EVENTS_QUEUE)
            self._bound = set()  # bindings are durable: binding again is a no-op
            async with self.lock:
                await self._bind_fences()
            phones = shell.Intake.on(self._events_queue, cfg.batch_max, cfg.prefetch)
            log.info("consuming %s, %s and %s", t.SENSORS_QUEUE, t.NOTIFY_QUEUE, t.HIVE_EVENTS_QUEUE)
            await shell.run_session(
                stop, [conn], [intake, notify, phones],
                [shell.run_batches(intake, self.handle, self.counters, self.dlx),
                 shell.run_batches(notify, self.handle_notify, self.counters, self.dlx),
                 shell.run_batches(phones, self.handle_phones, self.counters, self.dlx)],
                [shell.periodic(stop, ROLL_EVERY_S, self.roll),
                 shell.periodic(stop, SENSOR_RELOAD_S, self._reload),
                 shell.periodic(stop, WATCH_EVERY_S, self.watch_sensors),
                 shell.periodic(stop, 30, lambda: log.info("%s", self.counters.line()))], cfg.drain_s,
                counters=self.counters)

    # -- a batch -------------------------------------------------------------------------------

    async def handle(self, messages: Sequence[AbstractIncomingMessage]) -> None:
        now = time.time()
        frames: list[Frame] = []
        of: list[AbstractIncomingMessage] = []
        outs: list[shell.Out] = []
        for m in messages:
            f = frame_of(m.routing_key or "", m.body, now)
            if isinstance(f, str):
                outs.append(shell.dead_letter(self.dlx, m, f, t.SENSORS_QUEUE, self.counters))
            else:
                frames.append(f)
                of.append(m)
        async with self.lock:
            unknown = {f.sensor_id for f in frames} - set(self.core.sensors)
            if unknown:  # registered since the last reload? (an unknown one costs a query a batch)
                got = await self.db.run(lambda conn: venue_store.load(conn, sorted(unknown)),
                                        "read the new sensors")
                self._apply_load(got, complete=False)
            done = self.core.process(frames)
            if done.events:  # an event frame delivered before counts no more (its rows are stored)
                events = done.events
                done.uncount(await self.db.run(lambda conn: venue_store.stored_events(conn, events),
                                               "look up the stored sensor events"))
            moved = self._count(done)
            closed = [(h.hive_id, d) for h in self.hives.values() for d in h.take_closed()]
            new = await self._store(done, moved, closed)
        for i, why in done.refused:
            outs.append(shell.dead_letter(self.dlx, of[i], why, t.SENSORS_QUEUE, self.counters))
        self.counters.bump("reports", len(done.counts))
        self.counters.bump("reports_new", new)
        self.counters.bump("sensor_events", len(done.events))
        self.counters.bump("statuses", len(done.statuses))
        outs += self._occupancy_outs(moved)
        await shell.publish_all(outs, self.counters)
        await self._cache(moved)

    def _count(self, done: Processed) -> list[HiveOccupancy]:
        moved: dict[str, HiveOccupancy] = {}
        for r in done.counts:
            h = self.hives.get(r.hive_id)
            if h is not None and h.add(r.at, r.entries, r.exits):
                moved[h.hive_id] = h
        for e in done.counted_events():
            h = self.hives.get(e.hive_id)
            if h is not None and h.add(e.at, int(e.event_type == 1), int(e.event_type == 0)):
                moved[h.hive_id] = h
        return list(moved.values())

    async def handle_phones(self, messages: Sequence[AbstractIncomingMessage]) -> None:
        """ENTER / LEAVE events of hives' fences (one event a message, as fence.events has them):
        app users' phones inside each hive, the second occupancy figure."""
        outs: list[shell.Out] = []
        now = time.time()
        async with self.lock:
            by_fence: dict[str, list[HiveOccupancy]] = {}
            for h in self.hives.values():
                if h.fence_id:
                    by_fence.setdefault(h.fence_id, []).append(h)
            moved: dict[str, HiveOccupancy] = {}
            for m in messages:
                try:
                    e = orjson.loads(m.body)
                    kind = e["event"]
                    if not isinstance(e["fence_id"], str) or not isinstance(e["object_id"], str):
                        raise TypeError("fence_id and object_id must be strings")
                    fence_id, object_id = qualified_ids(e)
                    ts = float(e["ts"])
                    if kind not in ("enter", "leave"):
                        raise ValueError(f"event kind {kind!r}")
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
                    outs.append(shell.dead_letter(self.dlx, m, f"not a fence event: {exc!r}",
                                                  t.HIVE_EVENTS_QUEUE, self.counters))
                    continue
                for h in by_fence.get(fence_id, []):
                    if h.phone(object_id, kind == "enter", ts):
                        h.touch(now)
                        moved[h.hive_id] = h
            if moved:
                await self._store(Processed(), list(moved.values()), [])
        self.counters.bump("fence_events", len(messages))
        outs += self._occupancy_outs(list(moved.values()))
        await shell.publish_all(outs, self.counters)
        await self._cache(list(moved.values()))

    async def handle_notify(self, messages: Sequence[AbstractIncomingMessage]) -> None:
        outs: list[shell.Out] = []

        def dead_letter(m: AbstractIncomingMessage, why: str) -> None:
            outs.append(shell.dead_letter(self.dlx, m, why, t.NOTIFY_QUEUE, self.counters))

        await self.notify_db.run(lambda conn: self.notifier.handle(conn, messages, dead_letter),
                                 "send notifications")
        await shell.publish_all(outs, self.counters)

    def gauges(self) -> dict[str, float]:
        """Levels for /metrics, read at each scrape."""
        return {"hives": float(len(self.hives)), "sensors": float(len(self.core.sensors)),
                "sensors_silent": float(self.notifier.open_alerts.get("silent", 0)),
                "sensors_low_battery": float(self.notifier.open_alerts.get("low_battery", 0))}

    async def watch_sensors(self) -> None:
        """Owner alerts: silent sensors, low batteries (notifier.py)."""
        now = time.time()
        await self.notify_db.run(lambda conn: self.notifier.watch_sensors(conn, now), "watch the sensors")

    async def roll(self) -> None:
        """The day turned at some hives: close it (residual recorded) and publish the zero."""
        now = time.time()
        async with self.lock:
            moved = [h for h in self.hives.values() if h.roll(now)]
            closed = [(h.hive_id, d) for h in self.hives.values() for d in h.take_closed()]
            if not closed and not moved:
                return
            await self._store(Processed(), moved, closed)
        await shell.publish_all(self._occupancy_outs(moved), self.counters)
        await self._cache(moved)

    async def _cache(self, hives: Sequence[HiveOccupancy]) -> None:
        """The public reads' copy (fence/venues/reads.py), after the commit."""
        if self.cache is not None:
            now = time.time()
            for h in hives:
                await publish_status(self.cache, h.hive_id, live_status(h, now))

    def _occupancy_outs(self, hives: Sequence[HiveOccupancy]) -> list[shell.Out]:
        outs = []
        for h in hives:
            body = orjson.dumps(occupancy_message(h, time.time()))
            key = t.occupancy_routing_key(h.hive_id)
            outs += [shell.Out(self.occupancy_x, key, body, JSON, mandatory=False),
                     shell.Out(self.mqtt_x, key, body, JSON, mandatory=False)]
        return outs

    # -- PostgreSQL ----------------------------------------------------------------------------

    async def _store(self, done: Processed, moved: Sequence[HiveOccupancy],
                     closed: Sequence[tuple[str, DayCounts]]) -> int:
        """The batch committed, retried while PostgreSQL is away; raises (the batch stays
        unacked and comes back) only when the sidecar is stopping."""
        states = {r.sensor_id: self.core.state[r.sensor_id] for r in done.counts}
        pruned = False
        while True:
            try:
                return await self.db.run(_batch_writer(done, moved, closed, states),
                                         f"store {len(done.counts)} sensor reports")
            except asyncpg.ForeignKeyViolationError as exc:
                # a hive or sensor deleted since it was read: forget it, store the rest (once)
                if pruned:
                    raise
                pruned = True
                log.warning("a hive or sensor went from the store (%s): storing without it", exc)
                done, moved, closed, states = await self._without_deleted(done, moved, closed, states)

    async def _without_deleted(self, done: Processed, moved: Sequence[HiveOccupancy],
                               closed: Sequence[tuple[str, DayCounts]], states: dict[str, Any]) -> tuple[
            Processed, list[HiveOccupancy], list[tuple[str, DayCounts]], dict[str, Any]]:
        async def present(conn: asyncpg.Connection) -> tuple[set[str], set[str]]:
            hives = await conn.fetch("SELECT id FROM hive WHERE id = ANY($1::text[])", list(self.hives))
            sensors = await conn.fetch("SELECT id FROM sensor WHERE id = ANY($1::text[])",
                                       list(self.core.sensors))
            return {r["id"] for r in hives}, {r["id"] for r in sensors}

        hives, sensors = await self.db.run(present, "read which hives and sensors remain")
        for hid in set(self.hives) - hives:
            del self.hives[hid]
        for sid in set(self.core.sensors) - sensors:
            self.core.remove_sensor(sid)
        kept = Processed([r for r in done.counts if r.sensor_id in sensors],
                         [e for e in done.events if e.sensor_id in sensors],
                         [s for s in done.statuses if s.sensor_id in sensors], done.refused)
        return (kept, [h for h in moved if h.hive_id in hives], [c for c in closed if c[0] in hives],
                {k: v for k, v in states.items() if k in sensors})

    async def close(self) -> None:
        await self.db.close()
        await self.notify_db.close()
        if self.cache is not None:
            await self.cache.close()


def _batch_writer(done: Processed, moved: Sequence[HiveOccupancy], closed: Sequence[tuple[str, DayCounts]],
                  states: dict[str, Any]) -> Callable[[asyncpg.Connection], Awaitable[int]]:
    """venue_store.store_batch of these rows, for StoreConnection.run."""
    def write(conn: asyncpg.Connection) -> Awaitable[int]:
        return venue_store.store_batch(conn, done.counts, done.events, done.statuses, states, moved, closed)
    return write


def live_status(h: HiveOccupancy, now: float) -> dict[str, object]:
    """A hive's status as the public reads show it (reads.status_json's shape)."""
    st = h.status()
    return {"day": st["day"], "entries": st["entries"], "exits": st["exits"], "occupancy": st["occupancy"],
            "raw": st["raw"], "app_occupancy": h.app_occupancy if h.fence_id else None,
            "percent": st["percent"], "updated_at": now}


async def main(config: shell.SidecarConfig) -> int:
    sender, said = push.configured_sender(settings_registry.read("GOOGLE_APPLICATION_CREDENTIALS"))
    log.info("%s", said)
    return await shell.run_sidecar(config, ("",), "venue-sensors", lambda c: SensorSidecar(c, sender))
