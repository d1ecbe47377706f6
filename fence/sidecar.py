"""The x-fence sidecar of one worker: x-fence.<worker> (positions routed by every x-geo
region, and fence definitions they forward, in one ordered queue) in, ENTER / LEAVE events
out on fence.events (`<fence_id>.<enter|leave>`) and fence.events.mqtt (federated to the
ingress vhost's amq.topic for MQTT subscribers: `fence-events/<fence_id>/<kind>/<object_id>`,
one message per event for the fence's subscribers and the object's).

Recovery: at start the fences this worker owns on the hash ring are read from PostgreSQL.
Who is inside which fence is not persisted yet (the persistence issue adds the journal): a
restarted worker re-learns it from the next positions (an object inside gets a new ENTER),
and positions held for a handover notice (see fence.state.XFence.route) are lost with it.

Timeouts: every second, pairs whose object has been silent for the fence's timeout_s (by
the wall clock against the object's last position time) LEAVE with reason `timeout` and
ts = last seen + timeout_s, so the event and its id do not depend on when the check ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import orjson
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage

from exchanges import shell
from exchanges import topology as t
from exchanges.batch import unpack
from exchanges.contract import InvalidMessage
from exchanges.x_geo import WorkerBatch
from fence import control, store
from fence.hash_ring import HashRing
from fence.state import Event, XFence

log = logging.getLogger("geofence")
EXPIRE_EVERY_S = 1.0
POSITIONS = "positions"


class FenceSidecar:
    def __init__(self, config: shell.SidecarConfig) -> None:
        self.config = config
        self.worker = config.instance
        self.ring = HashRing(list(config.workers))
        self.core = XFence(self.worker)
        self.counters = shell.Counters()
        self.lock = asyncio.Lock()  # the core and the order of what it emits

    async def recover(self, stop: asyncio.Event) -> bool:
        records = await store.read_until_stopped(self.config.postgres_url, store.live_fences, "fences", stop)
        if records is None:
            return False
        mine = [r for r in records if self.ring.node_for(r.fence.fence_id) == self.worker]
        for r in mine:
            self.core.define(r.fence, r.updated_at.timestamp())
        log.info("recovered %d of %d fences (the ones on worker %s)", len(mine), len(records), self.worker)
        return True

    # -- session -----------------------------------------------------------------------------

    async def session(self, stop: asyncio.Event) -> None:
        cfg = self.config
        async with contextlib.AsyncExitStack() as stack:
            conn = await shell.open_connection(cfg, t.FENCES_VHOST, stack)
            self.out_ch: AbstractChannel = await shell.open_channel(conn, stack)
            self.events: AbstractExchange = await self.out_ch.get_exchange(t.EVENTS_EXCHANGE, ensure=False)
            self.events_mqtt = await self.out_ch.get_exchange(t.EVENTS_MQTT_EXCHANGE, ensure=False)
            self.dlx = await self.out_ch.get_exchange(t.DEAD_LETTER_EXCHANGE, ensure=False)
            in_ch = await shell.open_channel(conn, stack, cfg.prefetch)
            ctl_ch = await shell.open_channel(conn, stack, 64)
            inputs = shell.Intake(await in_ch.get_queue(t.fence_queue(self.worker)), cfg.batch_max)
            controls = shell.Intake(await ctl_ch.get_queue(t.fence_control_queue(self.worker)), 64)
            log.info("worker %s: consuming %s and %s", self.worker, t.fence_queue(self.worker),
                     t.fence_control_queue(self.worker))
            await shell.run_session(
                stop, [conn], [inputs, controls],
                [shell.run_batches(inputs, self.handle_inputs, self.counters),
                 shell.run_batches(controls, self.handle_controls, self.counters)],
                [shell.periodic(stop, EXPIRE_EVERY_S, self.expire),
                 shell.periodic(stop, 30, lambda: log.info("%s", self.counters.line()))], cfg.drain_s)

    # -- inputs ------------------------------------------------------------------------------

    async def handle_inputs(self, messages: Sequence[AbstractIncomingMessage]) -> None:
        """Runs of position parts are routed together; definitions apply between them."""
        outs: list[shell.Out] = []
        steps: list[list[WorkerBatch] | control.Define | control.Drop] = []  # in queue order
        for m in messages:
            try:
                msg = unpack(m.body)
                if msg["kind"] == POSITIONS:
                    parts = [WorkerBatch.from_wire(p) for p in msg["parts"]]
                    if steps and isinstance(steps[-1], list):
                        steps[-1] += parts
                    else:
                        steps.append(parts)
                else:
                    steps.append(control.parse(msg))
            except (InvalidMessage, ValueError, KeyError, TypeError) as exc:
                outs.append(shell.dead_letter(self.dlx, m, shell.reason_of(exc, "message"),
                                              t.fence_queue(self.worker), self.counters))
        async with self.lock:
            events: list[Event] = []
            received_at = time.time()
            for step in steps:
                if isinstance(step, list):
                    wb = WorkerBatch.concat(step)
                    self.counters.positions += len(wb.positions)
                    events += self.core.route(wb, received_at)
                elif isinstance(step, control.Define):
                    events += self.core.define(step.fence, step.ts)
                    log.info("fence %s v%d defined", step.fence.fence_id, step.fence.version)
                else:
                    events += self.core.drop(step.fence_id, step.version, step.ts)
                    log.info("fence %s v%d deleted", step.fence_id, step.version)
            await shell.publish_all(outs + self.event_outs(events), self.counters)

    async def expire(self) -> None:
        async with self.lock:
            events = self.core.expire(time.time())
            if events:
                await shell.publish_all(self.event_outs(events), self.counters)

    def event_outs(self, events: Sequence[Event]) -> list[shell.Out]:
        self.counters.events += len(events)
        outs = []
        for e in events:
            body = orjson.dumps(e.to_json())
            outs.append(shell.Out(self.events, t.event_routing_key(e.fence_id, e.event), body,
                                  "application/json", mandatory=False))
            key = t.mqtt_event_routing_key(e.fence_id, e.object_id, e.event)
            outs.append(shell.Out(self.events_mqtt, key, body, "application/json", mandatory=False))
        return outs

    # -- control (inspect) ---------------------------------------------------------------------

    async def handle_controls(self, messages: Sequence[AbstractIncomingMessage]) -> None:
        outs = []
        for m in messages:
            try:
                msg = unpack(m.body)
                if msg["kind"] != control.INSPECT:
                    raise InvalidMessage(f"unknown control kind {msg['kind']!r}")
                out = shell.reply(self.out_ch, m, self.inspect(msg))
                if out is not None:
                    outs.append(out)
            except (InvalidMessage, ValueError, KeyError, TypeError) as exc:
                outs.append(shell.dead_letter(self.dlx, m, shell.reason_of(exc, "control"),
                                              t.fence_control_queue(self.worker), self.counters))
        await shell.publish_all(outs, self.counters)

    def inspect(self, msg: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"worker": self.worker, "stats": self.core.stats(),
                               "counters": self.counters.to_json()}
        fence_id = msg.get("fence_id")
        if fence_id is not None:
            d = self.core.fence(str(fence_id))
            out["fence"] = None if d is None else {
                "id": d.fence_id, "version": d.version, "name": d.name, "timeout_s": d.timeout_s,
                "occupants": self.core.occupants(d.fence_id)}
        object_id = msg.get("object_id")
        if object_id is not None:
            out["object"] = {"id": object_id, "fences": self.core.fences_of(str(object_id))}
        if msg.get("fences"):
            out["fences"] = self.core.fences()
        return out


async def main(config: shell.SidecarConfig) -> int:
    return await shell.run_sidecar(config, config.workers, "worker (GEOFENCE_WORKERS)", FenceSidecar)
