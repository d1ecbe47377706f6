"""The x-geo sidecar of one region: position batches (and handover notices) from x-ingress
routed to the x-fence workers through x-fence.in (federated to gf-fences), and the fence
changes of x-geo.control applied to the range index and forwarded to the fence's worker.

Recovery: at start the bindings of the region are read from PostgreSQL (fence_range, see
exchanges/routing_store.py) and `recover`ed; control messages queued meanwhile are applied after, and the
version order makes replays harmless.

One lock orders "change the index + forward the definition" against "route + publish": a
position routed by a new binding can never overtake that fence's definition on x-fence.in.
Per worker, what one batch routed goes out as one message, in queue order; handover
notices travel in line with the positions (x-ingress puts them in the same message), so an
object's exit from this region reaches its workers between the right positions.

Batches are pipelined (exchanges/shell/pipeline.py): a batch is routed and its messages written
as soon as it comes, its confirms and its ack follow in order while the next ones are routed
(issue 39: one confirm round trip per batch was most of this hop's time under load). A drain
barrier's batch, and every control message, first waits for the batches before it to be
confirmed, and goes alone, as before.

Live changes: the workers are the stored ring's (`worker_ring`, read at `recover`, and again
when `geofence worker` asks with a RING control message, once the moved fences' state is on
their new workers); a drain barrier in the positions queue is forwarded behind everything
routed to each worker; a fence defined again at the same version with other ranges (a region
change moving its ranges) is re-bound here without re-checking anyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage

from exchanges import binding_diff, control, routing_store, shell
from exchanges import topology as t
from exchanges.batch import CONTENT_TYPE, PositionBatch, RegionBatch, pack, unpack
from exchanges.binding_diff import DiffMismatch
from exchanges.contract import BAD_INPUT, InvalidMessage
from exchanges.fence_binding import FenceBinding
from exchanges.hash_ring import HashRing
from exchanges.x_geo import queries
from exchanges.x_geo.core import XGeo

log = logging.getLogger("geofence")
POSITIONS, HANDOVER = "positions", "handover"


class GeoSidecar:
    def __init__(self, config: shell.SidecarConfig) -> None:
        self.config = config
        self.region = config.instance
        self.instance_lock = shell.InstanceLock(t.GEO_LOCK)
        self.ring = HashRing(list(config.workers))  # the stored ring replaces it at `recover`
        self.ring_version = 0
        self.core = XGeo(self.region, list(config.workers), self.ring, announce_unknown=True)
        self.counters = shell.Counters()
        self.lock = asyncio.Lock()
        # batches routed (the objects' memory moved on) and not confirmed: if a session ends
        # with some, the memory goes (their objects go to every worker once, as after a restart)
        self.unconfirmed = 0
        self.pipeline = shell.Pipeline()

    async def recover(self, stop: asyncio.Event) -> bool:
        bindings = await routing_store.read_until_stopped(
            self.config.postgres_url, lambda conn: routing_store.region_bindings(conn, self.region),
            "fence bindings", stop)
        if bindings is None:
            return False
        ring = await routing_store.read_until_stopped(
            self.config.postgres_url, lambda conn: routing_store.ring_or(conn, self.config.workers),
            "worker ring", stop)
        if ring is None:
            return False
        self.ring_version, self.ring = ring
        self.core.set_ring(self.ring.nodes, self.ring)
        self.core.recover(bindings)
        log.info("recovered %d fence bindings of region %s", len(bindings), self.region)
        return True

    async def close(self) -> None:
        """Nothing to keep at a stop: the bindings are recovered from the store at the start."""

    # -- session -----------------------------------------------------------------------------

    async def session(self, stop: asyncio.Event) -> None:
        cfg = self.config
        if self.unconfirmed:
            self.core.forget_objects()
            self.unconfirmed = 0
            log.warning("a session ended with a batch routed and not confirmed: objects forgotten")
        async with contextlib.AsyncExitStack() as stack:
            conn = await shell.open_connection(cfg, t.region_vhost(self.region), stack)
            await self.instance_lock.acquire(conn, stack)
            self.out_ch: AbstractChannel = await shell.open_channel(conn, stack, confirms=cfg.persistence)
            self.fence_in: AbstractExchange = await self.out_ch.get_exchange(t.FENCE_IN_EXCHANGE,
                                                                             ensure=False)
            self.dlx = await self.out_ch.get_exchange(t.DEAD_LETTER_EXCHANGE, ensure=False)
            pos_ch = await shell.open_channel(conn, stack)
            ctl_ch = await shell.open_channel(conn, stack)
            positions = shell.Intake.on(await pos_ch.get_queue(t.GEO_POSITIONS_QUEUE), cfg.batch_max,
                                        cfg.prefetch)
            controls = shell.Intake.on(await ctl_ch.get_queue(t.GEO_CONTROL_QUEUE), 64, 64)
            log.info("region %s: consuming %s and %s", self.region, t.GEO_POSITIONS_QUEUE,
                     t.GEO_CONTROL_QUEUE)
            try:
                await shell.run_session(
                    stop, [conn], [positions, controls],
                    [shell.run_batches(positions, self.handle_positions, self.counters, self.dlx,
                                       self.pipeline),
                     shell.run_batches(controls, self.handle_controls, self.counters, self.dlx)],
                    [shell.periodic(stop, 30, lambda: log.info("%s", self.counters.line()))], cfg.drain_s,
                    counters=self.counters)
            finally:
                await self.pipeline.close()  # what was not confirmed comes back

    # -- positions ---------------------------------------------------------------------------

    async def handle_positions(self, messages: Sequence[AbstractIncomingMessage]) -> None:
        outs: list[shell.Out] = []
        batches: list[RegionBatch] = []
        barriers: list[bytes] = []
        for m in messages:
            try:
                msg = unpack(m.body)
                if msg["kind"] == control.BARRIER:  # behind what is routed here (see control)
                    barriers.append(pack(control.BARRIER, barrier=str(msg["barrier"]),
                                         reply=str(msg["reply"]), region=self.region))
                    continue
                if msg["kind"] == POSITIONS:
                    rb = RegionBatch.from_wire(msg)
                elif msg["kind"] == HANDOVER:  # notices apart (wire of the first pipeline version)
                    b = PositionBatch.from_wire(msg["batch"])
                    rb = RegionBatch(b, np.ones(len(b), bool), np.zeros(len(b)))
                else:
                    raise InvalidMessage(f"unknown message kind {msg['kind']!r} on {t.GEO_POSITIONS_QUEUE}")
                self.core.validate(rb.batch)
            except BAD_INPUT as exc:
                outs.append(shell.dead_letter(self.dlx, m, shell.reason_of(exc, "batch"),
                                              t.GEO_POSITIONS_QUEUE, self.counters))
                continue
            batches.append(rb)
        async with self.lock:
            if barriers:  # behind everything routed before, confirmed: this batch goes alone
                await self.pipeline.drain()
            if batches:  # the whole intake in queue order: one route, one message per worker
                batch = PositionBatch.concat([rb.batch for rb in batches])
                self.counters.positions += len(batch)
                self.counters.observe_ages("position_age_seconds", np.concatenate(
                    [rb.batch.ts[~rb.notice] for rb in batches]))
                self.unconfirmed += 1
                announced = [rb.announced for rb in batches]
                routed = self.core.route(batch, notice=np.concatenate([rb.notice for rb in batches]),
                                         gate=np.concatenate([rb.gate for rb in batches]),
                                         announced=None if all(a is None for a in announced) else
                                         np.concatenate([rb.announcements() for rb in batches]))
                outs += [shell.Out(self.fence_in, worker, pack(POSITIONS, parts=[wb.to_wire()]), CONTENT_TYPE)
                         for worker, wb in routed.items()]
            routed_here = bool(batches)

            async def confirmed() -> None:
                if routed_here:
                    self.unconfirmed -= 1  # confirmed: the workers got what the memory says

            if barriers:  # once the positions are confirmed: behind them on every link
                await shell.publish_all(outs, self.counters)
                await confirmed()
                await shell.publish_all([shell.Out(self.fence_in, w, b, CONTENT_TYPE)
                                         for b in barriers for w in self.ring.nodes], self.counters)
                await self.pipeline.add(None, None, messages)
                await self.pipeline.drain()
                return
            # pipelined (exchanges/shell/pipeline.py): the next batch is routed while these
            # confirms come; the ack follows them, in order
            sent = await shell.send(outs, self.counters, retry=self.pipeline.serial)
            await self.pipeline.add(sent, confirmed, messages)

    # -- control -----------------------------------------------------------------------------

    async def handle_controls(self, messages: Sequence[AbstractIncomingMessage]) -> None:
        for m in messages:  # rare and ordered: one at a time
            outs: list[shell.Out] = []
            async with self.lock:
                await self.pipeline.drain()  # a change (or an answer) sees every batch before it confirmed
                try:
                    msg = unpack(m.body)
                    if msg["kind"] == control.INSPECT:
                        out = shell.reply(self.out_ch, m, self.inspect(msg))
                        outs += [out] if out else []
                    elif msg["kind"] == control.QUERY:
                        out = shell.reply(self.out_ch, m, self.answer(msg))
                        outs += [out] if out else []
                    elif msg["kind"] == control.RING:
                        out = shell.reply(self.out_ch, m, await self.take_ring(int(msg["version"])))
                        outs += [out] if out else []
                    else:
                        outs += await self.apply(control.parse(msg))
                except BAD_INPUT as exc:
                    outs.append(shell.dead_letter(self.dlx, m, shell.reason_of(exc, "control"),
                                                  t.GEO_CONTROL_QUEUE, self.counters))
                await shell.publish_all(outs, self.counters)

    async def apply(self, change: control.Define | control.Drop) -> list[shell.Out]:
        if isinstance(change, control.Drop):
            was_bound = change.fence_id in self.core.fences()
            self.core.remove_bindings([(change.fence_id, change.version)])
            log.info("fence %s v%d dropped", change.fence_id, change.version)
            if not was_bound:
                return []
            return [shell.Out(self.fence_in, worker, control.drop_message(change), CONTENT_TYPE)
                    for worker in self.core.masters_of(change.fence_id)]
        fid, version = change.fence.fence_id, change.fence.version
        known = self.core.known_version(fid)
        if known is not None and version < known:
            return []  # stale: a newer version is applied already
        binding = None
        if known != version:  # (the same version again: applied already, forwarded below)
            binding = change.binding() if change.diff is None else await self.rebound(change)
        elif change.diff is None and change.ranges is not None \
                and self.core.rebind(fid, version, change.binding()):
            self.counters.bump("moved_bindings")  # the same fence, other ranges here (see XGeo.rebind)
            log.info("fence %s v%d: ranges here moved (%d now)", fid, version,
                     len(change.ranges) if change.ranges is not None else 0)
        # the fence's worker hears of every change through every region it was sent to, with
        # the latest positions here to decide who is inside (XGeo.change)
        rechecks = self.core.change(fid, version, binding)
        if rechecks is None:
            return []
        n = sum(len(r.positions) for r in rechecks.values())
        log.info("fence %s v%d %s; %d objects re-checked%s", fid, version,
                 "applied already" if known == version else
                 "unbound here" if binding is None else f"bound: {len(binding.ranges)} ranges", n,
                 f" by {len(rechecks)} masters" if len(rechecks) > 1 else "")
        self.counters.bump("rechecks", n)
        return [shell.Out(self.fence_in, worker, control.define_for_worker(change, recheck, self.region),
                          CONTENT_TYPE) for worker, recheck in rechecks.items()]

    async def rebound(self, change: control.Define) -> FenceBinding | None:
        """The new binding from a rebind's diff, or from the store when the diff does not fit
        what this region has (a missed or reordered change): then bound with the message's
        version, so that the next diff (based on it) is not mistaken for a stale one."""
        assert change.diff is not None
        fid, version = change.fence.fence_id, change.fence.version
        have = self.core.binding(fid)
        try:
            if have is None or have.version != change.base_version:
                raise DiffMismatch(f"region has version {have.version if have else None}, the diff "
                                   f"is against {change.base_version}")
            ranges, interior = binding_diff.apply(have.ranges, have.interior, change.diff)
            self.counters.bump("rebinds")
            return FenceBinding(fid, version, ranges, interior, change.fence.cross_box())
        except DiffMismatch as exc:
            self.counters.bump("rebinds_from_store")
            log.warning("fence %s v%d: %s; reading its bindings from the store", fid, version, exc)
            conn = await routing_store.connect(self.config.postgres_url)
            try:
                stored = await routing_store.region_binding(conn, self.region, fid)
            finally:
                await conn.close()
            return None if stored is None else FenceBinding(fid, version, stored.ranges, stored.interior,
                                                            change.fence.cross_box())

    async def take_ring(self, version: int) -> dict[str, Any]:
        """Route with the stored worker ring `version` (`geofence worker add / remove`, once
        the moved fences' state is on their new workers; x-ingress is paused meanwhile)."""
        if version == self.ring_version:
            return {"ring": version, "gained": {}}
        conn = await routing_store.connect(self.config.postgres_url)
        try:
            found = await routing_store.latest_ring(conn)
        finally:
            await conn.close()
        if found is None or found[0] != version:
            return {"error": f"worker ring version {version} is not the newest stored "
                             f"({found[0] if found else 'none'})"}
        self.ring_version, self.ring = found
        gained = self.core.set_ring(self.ring.nodes, self.ring)
        log.info("worker ring version %d: workers %s; fences moved %s", version, ", ".join(self.ring.nodes),
                 gained or "none")
        return {"ring": version, "gained": gained}

    def answer(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A spatial query over this region's latest positions (the caller merges the
        regions' answers); a bad query is answered with what is wrong with it."""
        try:
            q = queries.parse(msg)
        except queries.InvalidQuery as exc:
            return {"region": self.region, "error": str(exc)}
        self.counters.bump("queries")
        return {"region": self.region, "objects": self.core.query(q)}

    def gauges(self) -> dict[str, float]:
        """Levels for /metrics, read at each scrape."""
        s = self.core.stats()
        return {"objects_tracked": float(s["objects"]), "fences_bound": float(s["fences"]),  # type: ignore[arg-type]
                "ranges_bound": float(s["ranges"])}  # type: ignore[arg-type]

    def inspect(self, msg: dict[str, Any]) -> dict[str, Any]:
        fences = self.core.fences()
        out: dict[str, Any] = {"region": self.region, "stats": self.core.stats(),
                               "counters": self.counters.to_json(), "ring": self.ring.to_dict(),
                               "ring_version": self.ring_version}
        limit = int(msg.get("limit", 100))  # 0: a barrier (fence.manager.applied), answer fast
        out["fences"] = {f: self.core.worker_of(f) for f in fences[:limit]}
        out["fences_total"] = len(fences)
        if limit:
            objects = self.core.objects()
            out["objects"] = dict(list(objects.items())[:limit])
        object_id = msg.get("object_id")
        if object_id is not None:
            out["object"] = {"id": str(object_id), "latest": self.core.latest(str(object_id))}
        return out



async def main(config: shell.SidecarConfig) -> int:
    return await shell.run_sidecar(config, config.regions, "region (GEOFENCE_REGIONS)", GeoSidecar)
