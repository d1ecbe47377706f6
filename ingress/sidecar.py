"""The x-ingress sidecar: device positions (MQTT) and gateway batches (AMQP) in gf-ingress,
decoded and validated, routed by the worldmap to the x-geo region vhosts, shovel-style
(its own connection per region vhost, publisher confirms, reconnect with backoff).

Per batch: decode every message (refusals to dead-letters with the reason), one core call
(Hilbert indices and regions for the whole batch), one message per region and one handover
notice per region objects left, sent; the batch's confirms are awaited and its input acked
by the pipeline (exchanges/shell/pipeline.py), in order, while the next batches are routed.
When those confirms lag (a region's queue full or its x-geo slow), the pipeline's depth stops the
intake: the backlog waits in the broker, at most the prefetch here. The worldmap is
read from PostgreSQL at start and re-read when a newer version appears (no restart).

Fences that follow an object (fence/follow.py) need that object's positions: the objects
followed are re-read with the worldmap, and the positions of a batch that belong to them go,
as one more confirmed message, to fence.follow (gf-ingress), where the fence service reads
them. A set lookup per position, and only while some fence follows something.

The live map's sample (ingress/map_tap.py): once a second, the latest position of each object
that moved goes to fence.map-positions, transient and unconfirmed on a channel of its own (a
lost sample is replaced by the next one; the pipeline never waits for the map). Only while a
map is open: the sample is published mandatory (with a confirm, awaited by the sampling task
alone), and when the broker returns it (no queue bound: no map open anywhere) x-ingress stops
sampling and sends, once a second, an empty probe instead, until a probe is routed. A map
opening waits up to two seconds for its first positions; no map open costs no sampling.

Live changes. The regions it connects to are the worldmap's, not a fixed list: a newer map
naming a region it has no connection to (`geofence region add`) waits while the session ends
drained and the next one connects to it; a map without a region (`region remove`) lets that
connection go the same way. A pause (`geofence worker add / remove`: a token with a lease in
PostgreSQL) ends the session drained too, and the next one waits until the pause is lifted;
the store watcher reports which pause it honours, so the controller knows nothing is routed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg
import numpy as np
import numpy.typing as npt
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from exchanges import ingress_partitions, routing_store, shell
from exchanges import topology as t
from exchanges.batch import CONTENT_TYPE, PositionBatch, pack
from exchanges.hash_ring import HashRing
from exchanges.worldmap import Worldmap
from ingress import partition_split
from ingress.core import XIngress
from ingress.map_tap import MapSampler
from ingress.positions import Decoded, Refused, decode_batch, decode_mqtt_many, tenant_from_routing_key
from ingress.proximity import Proximity

log = logging.getLogger("geofence")
WORLDMAP_POLL_S = 1.0
MIN_QUEUE_PREFETCH = 256  # per partition queue
GATEWAY_BATCH_MESSAGES = 64  # gateway messages hold up to 50,000 positions each
POSITIONS = "positions"
FOLLOW = "follow"
MAP = "map"
MAP_EVERY_S = 1.0
CHANGES_EVERY_S = 0.2  # proximity subscription changes read by watch_store, applied in the stream
NO_SAMPLE = {"batch": PositionBatch.empty().to_wire(), "moved": 0, "positions": 0}  # a probe


class IngressSidecar:
    def __init__(self, config: shell.SidecarConfig, core: XIngress) -> None:
        self.config = config
        self.core = core
        self.instance_lock = shell.InstanceLock(t.ingress_lock(config.instance))
        # Instances (exchanges/ingress_partitions.py): the first, x-ingress, holds the proximity
        # router and takes the gateway batches; each consumes the partitions the stored map
        # gives it. A newer map waits in `new_partitions` while the session ends, releasing
        # the partitions it loses (ingress/partition_split.py, Intake.release_on_stop).
        self.primary = not config.instance
        self.partitions: tuple[int, dict[int, str]] = (0, ingress_partitions.first_only())
        self.new_partitions: tuple[int, dict[int, str]] | None = None
        self.owned = np.ones(ingress_partitions.PARTITIONS, bool)
        # The partitions whose gateway positions the first instance routes itself, not through
        # the partition's queue: those it owns and whose queue holds nothing older of theirs.
        # A partition it gains (or holds after a restart of a partitioned stack) may still have
        # hand-ons queued (its own, the last owner's returned ones): it goes on handing on there,
        # and sends a marker first; once its own last hand-on there has come back through its
        # intake (queues are FIFO: everything before it was routed), it routes them itself
        # again, so an object's positions stay in order (`settle_local`). Its hand-ons carry
        # this process's token and a sequence number per partition.
        self.local = self.owned.copy()
        self.token = uuid.uuid4().hex[:12]
        self.sent_seq = np.zeros(ingress_partitions.PARTITIONS, np.int64)  # its last hand-on to each
        self.seen_seq = np.zeros(ingress_partitions.PARTITIONS, np.int64)  # ... and the last come back
        self.partition_of = ingress_partitions.PartitionOf()
        self.prox_tenants: frozenset[str] = frozenset()  # not the first: whose positions go to the router
        self.intakes: list[shell.Intake] = []  # the session's
        self.counters = shell.Counters()
        self.followed: frozenset[str] = frozenset()  # objects some fence follows
        # batches routed (the objects' memory moved on) and not confirmed yet: if a session
        # ends with some, the memory goes (each object is announced again, as after a restart)
        self.unconfirmed = 0
        self.map_sampler = MapSampler()
        self.map_out: AbstractExchange | None = None
        self.map_listening = True  # a map is open (the last sample or probe was routed)
        # Regions come and go live (`geofence region add / remove`): a stored worldmap naming
        # a region this session has no connection to waits in `pending` while the session
        # ends cleanly (drained) and the next one connects to it; one whose regions this
        # session no longer needs ends it as well, dropping the region's connection.
        self.pending: Worldmap | None = None
        self.connected: frozenset[str] = frozenset()
        self.connected_endpoints: dict[str, tuple[str, int] | None] = {}
        self.regions_changed = asyncio.Event()  # (or a pause: the session ends all the same)
        # A worker handover pauses x-ingress (PostgreSQL's ingress_pause, a lease): the
        # session ends drained and the next one waits; `consuming` says whether one runs.
        self.paused: str | None = None  # the pause's token
        self.consuming = False
        # regions whose vhost is on another broker (region_broker): connected to there; a
        # change of one that is connected ends the session as a new region does
        self.endpoints: dict[str, tuple[str, int]] = {}
        # batches in flight (exchanges/shell/pipeline.py): routed and sent as they come, each
        # batch's proximity record written and its input acked in order once confirmed
        self.pipeline = shell.Pipeline()
        # proximity subscriptions (ingress/proximity.py): the router and its journal
        journal = config.journal_dir if config.persistence and self.primary else None
        self.proximity = Proximity(HashRing(list(config.workers)), journal, self.counters, self.pipeline)

    async def recover(self, stop: asyncio.Event) -> bool:
        """The proximity router from its journal, under the stored worker ring (`main` read the
        worldmap the core is built on, shell.Sidecar)."""
        ring = await routing_store.read_until_stopped(
            self.config.postgres_url, lambda conn: routing_store.ring_or(conn, self.config.workers),
            "worker ring", stop)
        if ring is None:
            return False
        found = await routing_store.read_until_stopped(
            self.config.postgres_url, routing_store.assignment_or_first, "partition map", stop)
        if found is None:
            return False
        self.adopt_partitions(found)
        if found[0] > 0:  # partitioned before: queues may hold hand-ons (see __init__)
            self.local[:] = False
        self.proximity.ring_version = ring[0]
        self.proximity.stream.set_ring(ring[1])
        await asyncio.to_thread(self.proximity.load)
        return True

    async def close(self) -> None:
        """The positions' region memory is not kept (a restart announces each object again);
        the proximity router's is, as a snapshot (unless a batch was cut off routed and not
        journaled: then the journal holds the state, and the batch comes again)."""
        clean = self.unconfirmed == 0 and self.proximity.unwritten == 0
        await asyncio.to_thread(self.proximity.close, clean)

    # -- session -----------------------------------------------------------------------------

    async def session(self, stop: asyncio.Event) -> None:
        cfg = self.config
        self.counters.gauge("paused", 1 if self.paused else 0)  # not consuming on purpose (lifecycle)
        try:
            while self.paused and not stop.is_set():  # see __init__; watch_store lifts it
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2)
        finally:
            self.counters.gauge("paused", 0)
        if stop.is_set():
            return
        if self.new_partitions is not None:
            self.adopt_partitions(self.new_partitions)
        if self.unconfirmed or self.proximity.unwritten:
            self.core.forget_objects()
            self.unconfirmed = 0
            log.warning("a session ended with batches routed and not confirmed: objects forgotten")
            self.counters.gauge("recovering", 1)
            try:
                await asyncio.to_thread(self.proximity.load)  # the router as journaled
            finally:
                self.counters.gauge("recovering", 0)
        async with contextlib.AsyncExitStack() as stack:
            ingress = await shell.open_connection(cfg, t.INGRESS_VHOST, stack)
            version, owners = self.partitions
            await self.instance_lock.acquire(ingress, stack)
            wanted = {*self.core.worldmap.regions, *(self.pending.regions if self.pending else ())}
            self.regions_changed.clear()
            regions = {r: await shell.open_connection(cfg, t.region_vhost(r), stack, self.endpoints.get(r))
                       for r in sorted(wanted)}
            self.connected_endpoints = {r: self.endpoints.get(r) for r in regions}
            out_ch = await shell.open_channel(ingress, stack, confirms=cfg.persistence)
            self.dlx = await out_ch.get_exchange(t.DEAD_LETTER_EXCHANGE, ensure=False)
            self.follow = await out_ch.get_exchange(t.FOLLOW_EXCHANGE, ensure=False)
            self.handoff = out_ch.default_exchange  # partitions' and the router's hand-ons
            if self.primary:
                await self.send_markers()
            self.geo_in: dict[str, AbstractExchange] = {}
            for region, conn in regions.items():
                ch = await shell.open_channel(conn, stack, confirms=cfg.persistence)
                self.geo_in[region] = await ch.get_exchange(t.GEO_IN_EXCHANGE, ensure=False)
            fences = await shell.open_connection(cfg, t.FENCES_VHOST, stack)  # proximity rows
            if self.primary:
                fence_ch = await shell.open_channel(fences, stack, confirms=cfg.persistence)
                fence_in = await fence_ch.get_exchange(t.FENCE_IN_EXCHANGE, ensure=False)
                await self.proximity.start_session(fence_in)
            map_ch = await shell.open_channel(ingress, stack)  # samples: see above
            self.map_out = await map_ch.get_exchange(t.MAP_POSITIONS_EXCHANGE, ensure=False)
            declares = await shell.open_channel(ingress, stack)  # the intakes' passive declares
            bulk = await shell.open_bulk_connection(cfg, t.INGRESS_VHOST, stack)  # deliveries in bulk
            # the partitions it owns (and, the first, the retired topic's queue) as one intake:
            # prefetch is per consumer, so the intake's share is spread over them
            mine = [ingress_partitions.queue_name(p) for p in ingress_partitions.owned_by(owners, cfg.name)]
            mqtt_queues = [await declares.get_queue(q) for q in (*mine, *([t.POSITIONS_QUEUE] if self.primary
                                                                         else []))]
            intakes: list[shell.Intake] = []
            loops = []
            if mqtt_queues:
                share = max(MIN_QUEUE_PREFETCH, cfg.prefetch // len(mqtt_queues))
                mqtt = shell.Intake.on(shell.BulkQueues(mqtt_queues, await bulk.channel(), mqtt_source),
                                       cfg.batch_max, share)
                intakes.append(mqtt)
                loops.append(shell.run_batches(
                    mqtt, lambda ms: self.handle(ms, self.decode_mqtt, mqtt_source), self.counters, self.dlx,
                    self.pipeline))
            if self.primary:
                gateway = shell.Intake.on(shell.BulkQueue(await declares.get_queue(t.BATCHES_QUEUE),
                                                          await bulk.channel()),
                                          GATEWAY_BATCH_MESSAGES, 4 * GATEWAY_BATCH_MESSAGES)
                handed = shell.Intake.on(shell.BulkQueue(await declares.get_queue(t.PROXIMITY_QUEUE),
                                                         await bulk.channel()), cfg.batch_max, cfg.prefetch)
                intakes += [gateway, handed]
                loops += [shell.run_batches(gateway, lambda ms: self.handle(ms, self.decode_gateway,
                                                                            t.BATCHES_QUEUE),
                                            self.counters, self.dlx, self.pipeline),
                          shell.run_batches(handed, self.handle_proximity, self.counters, self.dlx,
                                            self.pipeline)]
            self.connected = frozenset(regions)
            if self.pending is not None:
                self.adopt(self.pending)
            log.info("consuming %s; regions %s; partition map version %d", ", ".join(
                i.queue.name for i in intakes) or "nothing", ", ".join(sorted(regions)), version)
            ending = asyncio.Event()  # stop, the regions changed, a pause: this session drains and ends
            self.consuming = True
            try:
                self.intakes = intakes
                await shell.run_session(
                    ending, [ingress, bulk, fences, *regions.values()], intakes, loops,
                    [shell.periodic(ending, 30, lambda: log.info("%s", self.counters.line())),
                     shell.periodic(ending, MAP_EVERY_S, self.send_map_sample),
                     *([shell.periodic(ending, CHANGES_EVERY_S, self.proximity.apply_changes),
                        shell.periodic(ending, 1.0, self.settle_local)] if self.primary else []),
                     _first_of(stop, self.regions_changed, ending)],
                    cfg.drain_s, counters=self.counters)
            finally:
                self.consuming = False
                await self.pipeline.close()  # what was not confirmed comes back
        if not stop.is_set():
            log.info("%s", "paused (a worker handover): consuming stopped" if self.paused else
                     "partitions released: consuming by the new map" if self.new_partitions else
                     "regions changed: connecting again to " + ", ".join(sorted(
                         {*self.core.worldmap.regions, *(self.pending.regions if self.pending else ())})))

    def adopt_partitions(self, found: tuple[int, dict[int, str]]) -> None:
        """The partition map this instance consumes by from its next session on; the objects'
        memory goes when the partitions it owns change (each announced again, as after a
        restart: an object it had may have moved on at another instance meanwhile)."""
        self.new_partitions = None
        owned = np.array([found[1].get(p) == self.config.name for p in range(ingress_partitions.PARTITIONS)])
        if not np.array_equal(owned, self.owned):
            self.core.forget_objects()
            log.info("partition map version %d: %d partitions here (%s)", found[0], int(owned.sum()),
                     ",".join(str(p) for p in np.flatnonzero(owned)) or "none")
        self.local &= owned & self.owned  # gained ones wait (see __init__)
        self.partitions, self.owned = found, owned

    def settle_local(self) -> None:
        """The first instance: partitions it owns whose queues hold nothing older of theirs
        route their gateway positions here again (see __init__)."""
        waiting = self.owned & ~self.local
        if not waiting.any():
            return
        done = waiting & (self.sent_seq > 0) & (self.seen_seq >= self.sent_seq)
        if done.any():
            self.local |= done
            log.info("partitions %s: their queues caught up; gateway positions routed here again",
                     ",".join(map(str, np.flatnonzero(done))))

    def offer_partitions(self, found: tuple[int, dict[int, str]]) -> None:
        """A newer stored partition map (watch_store): taken at once when this instance's share
        is unchanged, else by the next session, this one ending with its share released: what
        it holds and has not handed out goes back to the queues, for the new owners, in order."""
        mine = {p for p, n in found[1].items() if n == self.config.name}
        if mine == set(np.flatnonzero(self.owned).tolist()) or not self.consuming:
            self.adopt_partitions(found)
            return
        self.new_partitions = found
        for intake in self.intakes:
            intake.release_on_stop = True
        log.info("partition map version %d stored: this instance's share changes; releasing", found[0])
        self.regions_changed.set()

    def offer(self, wm: Worldmap) -> None:
        """A newer stored worldmap (watch_store): taken at once when this session reaches
        every region it names, else when the next one does (see __init__)."""
        if set(wm.regions) <= self.connected:
            self.adopt(wm)
        else:
            self.pending = wm
            self.regions_changed.set()

    def adopt(self, wm: Worldmap) -> None:
        self.pending = None
        if self.core.set_worldmap(wm):
            log.info("worldmap version %d loaded: regions %s", wm.version, ", ".join(wm.regions))
        if self.connected - set(self.core.worldmap.regions):  # a region removed: drop its connection
            self.regions_changed.set()

    def hand_on(self, queue: str, batch: PositionBatch, partition: int | None = None) -> shell.Out:
        """Positions for a partition's queue (numbered, see __init__), or for the router's."""
        seq = 0
        if partition is not None:
            self.sent_seq[partition] += 1
            seq = int(self.sent_seq[partition])
        body = pack(partition_split.HANDED_ON, batch=batch.to_wire(), origin=self.token, seq=seq)
        return shell.Out(self.handoff, queue, body, CONTENT_TYPE)

    async def send_markers(self) -> None:
        """The first instance, at a session's start: an empty hand-on to each partition it owns
        and does not route itself yet (see __init__), confirmed before it consumes."""
        waiting = np.flatnonzero(self.owned & ~self.local).tolist()
        if waiting:
            await shell.publish_all([self.hand_on(ingress_partitions.queue_name(p), PositionBatch.empty(), p)
                                     for p in waiting], self.counters)

    async def handle_proximity(self, messages: list[AbstractIncomingMessage]) -> None:
        """The first instance: positions the others handed on, through the proximity router."""
        async with self.proximity.lock:
            batches: list[PositionBatch] = []
            outs: list[shell.Out] = []
            for m in messages:
                try:
                    batches.append(partition_split.read_handed_on(m.body)[0])
                except ValueError as exc:
                    outs.append(shell.dead_letter(self.dlx, m, f"a hand-on that cannot be read: {exc}",
                                                  t.PROXIMITY_QUEUE, self.counters))
            rows, entry = self.proximity.rows_outs(PositionBatch.concat(batches)) if batches else ([], None)
            sent = await shell.send([*outs, *rows], self.counters, retry=self.pipeline.serial)

            async def confirmed() -> None:
                if entry is not None:
                    await self.proximity.write(entry)

            await self.pipeline.add(sent, confirmed, messages)

    async def send_map_sample(self) -> None:
        """Once a second: the sample while a map is open, else a probe (see the docstring)."""
        if self.map_out is None:
            return
        sample = self.map_sampler.take()
        real = sample is not None and self.map_listening
        body = pack(MAP, **(sample.to_wire() if sample is not None and real else NO_SAMPLE))
        # returned (False): no map open anywhere
        listening = await shell.publish_sample(self.map_out, body, CONTENT_TYPE, mandatory=True)
        if listening != self.map_listening:
            log.info("live map: %s", "a map is open: sampling positions" if listening
                     else "no map open: sampling stopped")
            self.map_listening = listening
        self.counters.bump("map_samples" if real else "map_probes")

    # -- one batch ---------------------------------------------------------------------------

    def decode_mqtt(self, messages: Sequence[AbstractIncomingMessage]
                    ) -> tuple[PositionBatch, list[tuple[int, str]], npt.NDArray[np.bool_] | None]:
        """Devices' positions, and the positions another instance handed on to this one's
        partitions (ingress/partition_split.py), in their order; which are hand-ons (their
        proximity rows were routed where they came in, see `handle`), None for none."""
        latest = (time.time(), self.config.max_future_s)
        if not any(map(partition_split.handed_on, messages)):  # the common case
            decoded = decode_mqtt_many([(m.routing_key or "", m.body) for m in messages], latest)
            return decoded.batch, decoded.refused, None
        batches: list[PositionBatch] = []
        handed_rows: list[npt.NDArray[np.bool_]] = []
        refused: list[tuple[int, str]] = []
        for handed, a, b in partition_split.runs(messages, partition_split.handed_on):
            if handed:
                for i in range(a, b):
                    try:
                        part, origin, seq = partition_split.read_handed_on(messages[i].body)
                        batches.append(part)
                        handed_rows.append(np.ones(len(part), bool))
                        p = ingress_partitions.partition_of_queue(messages[i].routing_key or "")
                        if origin == self.token and p is not None:  # one of its own back (see __init__)
                            self.seen_seq[p] = max(int(self.seen_seq[p]), seq)
                    except ValueError as exc:
                        refused.append((i, f"a hand-on that cannot be read: {exc}"))
            else:
                d = decode_mqtt_many([(m.routing_key or "", m.body) for m in messages[a:b]], latest)
                batches.append(d.batch)
                handed_rows.append(np.zeros(len(d.batch), bool))
                refused += [(a + i, reason) for i, reason in d.refused]
        return PositionBatch.concat(batches), refused, np.concatenate(handed_rows)

    def decode_gateway(self, messages: Sequence[AbstractIncomingMessage]
                       ) -> tuple[PositionBatch, list[tuple[int, str]], None]:
        batches, refused = [], []
        latest = (time.time(), self.config.max_future_s)
        for i, m in enumerate(messages):
            try:
                first = (m.headers or {}).get(t.FIRST_EXCHANGE_HEADER)  # a replay's first exchange
                first = first.decode(errors="replace") if isinstance(first, bytes) else first
                if t.RETIRED_BATCHES_EXCHANGE in (first, m.exchange):  # a key there is the publisher's say-so
                    raise Refused(f"{t.RETIRED_BATCHES_EXCHANGE} carries no tenant: a gateway publishes its "
                                  f"batches to {t.GATEWAY_EXCHANGE} with its tenant as the routing key "
                                  "(`geofence gateway add NAME --tenant T`)")
                tenant = tenant_from_routing_key(m.routing_key or "")
                d: Decoded = decode_batch(m.body, m.content_type, latest, tenant)
            except Refused as exc:
                refused.append((i, str(exc)))
                continue
            batches.append(d.batch)
            if d.refused:  # the good positions go on; the message keeps a record of the rest
                reasons = "; ".join(r for _, r in d.refused[:20])
                more = f" (and {len(d.refused) - 20} more)" if len(d.refused) > 20 else ""
                refused.append((i, f"{len(d.refused)} of {len(d.refused) + len(d.batch)} positions "
                                   f"refused: {reasons}{more}"))
        return PositionBatch.concat(batches), refused, None

    async def handle(self, messages: Sequence[AbstractIncomingMessage], decode: Any,
                     source: str | Callable[[AbstractIncomingMessage], str]) -> None:
        """One batch routed and sent, handed to the pipeline, under the lock that orders the
        proximity router's changes (a batch's, a subscription change's) and their records."""
        async with self.proximity.lock:
            batch, refused, handed_rows = decode(messages)  # a failure here is a bug: see shell.run_batches
            # The proximity router judges positions in the order they came in: a hand-on's were
            # routed there when its gateway batch came, whole, before it was split; they are
            # not routed again when they come back through a partition's queue.
            near = batch if handed_rows is None else batch.take(np.flatnonzero(~handed_rows))
            handed: list[shell.Out] = []
            if decode == self.decode_gateway and not self.local.all():  # to partitions' queues (see __init__)
                batch, others = partition_split.split(batch, self.partition_of(batch.ids), self.local)
                handed = [self.hand_on(ingress_partitions.queue_name(p), part, p)
                          for p, part in others.items()]
                self.counters.bump("handed_on", sum(map(len, others.values())))
            self.counters.observe_ages("position_age_seconds", batch.ts)
            self.unconfirmed += 1
            routed = self.core.route(batch)
            outs = [shell.dead_letter(self.dlx, messages[i], reason, source if isinstance(source, str)
                                      else source(messages[i]), self.counters) for i, reason in refused]
            outs += handed
            for region, rb in routed.regions.items():  # notices in line with positions: one message
                outs.append(shell.Out(self.geo_in[region], "", pack(POSITIONS, **rb.to_wire()), CONTENT_TYPE))
            if self.primary:
                rows, entry = self.proximity.rows_outs(near)
                outs += rows
            else:  # the router is the first instance's: its share handed on
                entry = None
                share = partition_split.of_tenants(near, self.prox_tenants)
                if len(share):
                    outs.append(self.hand_on(t.PROXIMITY_QUEUE, share))
            followed = self.followed
            if followed:
                tapped = [i for i, oid in enumerate(batch.ids) if oid in followed]
                if tapped:
                    outs.append(shell.Out(self.follow, "", pack(FOLLOW, batch=batch.take(tapped).to_wire()),
                                          CONTENT_TYPE))
            if self.map_listening:
                self.map_sampler.note(batch)
            if self.primary and decode == self.decode_mqtt:
                self.settle_local()
            sent = await shell.send(outs, self.counters, retry=self.pipeline.serial)

            async def confirmed() -> None:
                if entry is not None:
                    await self.proximity.write(entry)
                self.unconfirmed -= 1
                self.counters.positions += len(batch)

            await self.pipeline.add(sent, confirmed, messages)


def mqtt_source(message: AbstractIncomingMessage) -> str:
    """The queue an MQTT position came from: its object's partition, as RabbitMQ's consistent-hash
    exchange chose it from the routing key, or the retired topic's queue (positions.<id>)."""
    key = message.routing_key or ""
    if ingress_partitions.partition_of_queue(key) is not None:  # a hand-on: keyed by its queue
        return key
    if key.count(".") == 2 and key.startswith(ingress_partitions.ROUTING_PREFIX + "."):
        return ingress_partitions.queue_name(ingress_partitions.partition_of_key(key))
    return t.POSITIONS_QUEUE


async def watch_store(pg_url: str, sidecar: IngressSidecar, stop: asyncio.Event,
                      instance: str = "x-ingress") -> None:
    """Re-read the worldmap when a newer version is stored, and the followed objects, and say
    which map this instance routes with (a re-split waits for that); PostgreSQL being away
    only delays that (routing goes on with what is in hand)."""
    core = sidecar.core
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), WORLDMAP_POLL_S)
        if stop.is_set():
            return
        try:
            conn = await routing_store.connect(pg_url)
            try:
                if sidecar.primary:
                    await watch_proximity(conn, sidecar)  # before the pause: a ring stored for it first
                else:
                    sidecar.prox_tenants = await routing_store.subscribed_tenants(conn)
                found = await routing_store.assignment_or_first(conn)
                if found[0] > max(sidecar.partitions[0], sidecar.new_partitions[0] if sidecar.new_partitions
                                  else 0):
                    sidecar.offer_partitions(found)
                paused = await routing_store.ingress_pause(conn)
                if paused != sidecar.paused:
                    log.info("%s", "pause asked (a worker handover): draining" if paused else "pause lifted")
                    if paused and not sidecar.paused:
                        sidecar.regions_changed.set()
                    sidecar.paused = paused
                endpoints = await routing_store.region_endpoints(conn)
                if endpoints != sidecar.endpoints:
                    sidecar.endpoints = endpoints
                    moved = [r for r, e in sidecar.connected_endpoints.items() if endpoints.get(r) != e]
                    if moved:
                        log.info("region %s now on another broker: connecting again", ", ".join(moved))
                        sidecar.regions_changed.set()
                newest = max(core.worldmap.version, sidecar.pending.version if sidecar.pending else 0)
                if await routing_store.latest_worldmap_version(conn) > newest:
                    wm = await routing_store.latest_worldmap(conn)
                    if wm is not None:
                        sidecar.offer(wm)
                await routing_store.record_worldmap_seen(
                    conn, instance, core.worldmap.version,
                    sidecar.paused if sidecar.paused and not sidecar.consuming else None,
                    sidecar.partitions[0] if sidecar.consuming else -1)
                followed = frozenset(await routing_store.followed_objects(conn))
                if followed != sidecar.followed:
                    log.info("%d objects followed by fences", len(followed))
                    sidecar.followed = followed
            finally:
                await conn.close()
        except (OSError, asyncpg.PostgresError) as exc:
            log.warning("store check failed (%s); keeping worldmap version %d", exc, core.worldmap.version)


async def watch_proximity(conn: asyncpg.Connection, sidecar: IngressSidecar) -> None:
    """A newer worker ring (taken by the next session, with a sync: a handover pauses x-ingress
    first), and the subscription changes not read yet (applied in the stream, CHANGES_EVERY_S)."""
    prox = sidecar.proximity
    found = await routing_store.latest_ring(conn)
    if found is not None and found[0] > max(prox.ring_version, prox.new_ring[0] if prox.new_ring else 0):
        prox.new_ring = found
        if sidecar.consuming and not sidecar.paused:
            log.info("proximity: worker ring version %d stored: starting a new session for it", found[0])
            sidecar.regions_changed.set()
    after = max(prox.cursor, prox.pending[-1][0] if prox.pending else 0)
    prox.pending += await routing_store.roam_changes(conn, after)


async def _first_of(stop: asyncio.Event, changed: asyncio.Event, ending: asyncio.Event) -> None:
    """Sets `ending` when the sidecar stops or its regions changed."""
    waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(changed.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    ending.set()


async def main(config: shell.SidecarConfig) -> int:
    stop = asyncio.Event()
    shell.install_signal_handlers(stop)
    log.info("%s", config.describe())
    wm = await routing_store.read_until_stopped(config.postgres_url, routing_store.latest_worldmap,
                                                "worldmap", stop)
    if wm is None:
        return 0
    core = XIngress(wm)
    sidecar = IngressSidecar(config, core)
    found = await routing_store.read_until_stopped(config.postgres_url, routing_store.region_endpoints,
                                                   "region brokers", stop)
    sidecar.endpoints = found or {}
    if not await sidecar.recover(stop):
        return 0
    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(watch_store(config.postgres_url, sidecar, stop, config.name))
            await shell.serve(config, sidecar.session, stop, sidecar.counters)
    finally:
        await sidecar.close()
    log.info("stopped: %s", sidecar.counters.line())
    return 0
