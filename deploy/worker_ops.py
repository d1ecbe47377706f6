"""`geofence worker add / remove / hot`: an x-fence worker added or removed, or a hot fence
given N masters, while positions flow.

The ring moves the fences whose owner changes (about 1/N of them for a worker added with
weight 1); each moved fence's state (who is inside since when, its timers, a change in
transition) goes from its old worker to its new one before a position reaches the new one:

1. add: the worker's queues and bindings (the topology plan, for the stack's new worker
   list) and its process, consuming.
2. Fence changes blocked (the worldmap lock, held exclusively: an API change waits a few
   seconds), x-ingress paused (`ingress_pause`, a lease: a controller that dies lets it
   lapse) until every live x-ingress says it has stopped consuming; positions wait in its
   queues, nothing is dropped.
3. Drained: every x-geo has applied its fence changes (an inspect behind them on its
   control queue), then a barrier goes through each region's x-geo.in; each x-geo forwards
   it behind everything it routed to each of its workers, and each worker answers once it
   has applied everything before it. So no position is between two workers.
4. Each old worker exports the fences the new ring gives away (a copy), each worker of the
   new ring takes its share (journaled), the ring is stored (version + 1), every x-geo routes
   with it, the old workers forget what they gave away (journaled), the pause is lifted.
5. remove: the worker's process stopped, its queues deleted, the topology without it.

`hot FENCE --masters N` is the same handover for a ring that differs only in its hot fences
(exchanges/hash_ring.py): the fence's objects spread over N workers, each master's share of
who is inside handed to it; `--masters 1` gathers them on one worker again.

A failure before the ring is stored undoes the handover: the workers that took fences
forget them (the old ring keeps them where they were), x-geo keeps the old ring, the pause
is lifted. Running the same command again finishes or redoes it: every step is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import asyncpg

from deploy import monitoring, sidecars
from deploy.inspect_cmd import ask
from deploy.processes import Say, StackError
from deploy.rabbitmq import apply as rabbit
from deploy.rabbitmq.management import Management, ManagementError
from deploy.rabbitmq.plan import Http, Step, api_path
from deploy.region_ops import Timer, live, percent, until
from deploy.settings import Secrets, Settings, connection_settings, write_live_topology
from exchanges import control, routing_store
from exchanges import topology as t
from exchanges.batch import CONTENT_TYPE, pack
from exchanges.fence_def import check_fence_key
from exchanges.hash_ring import MAX_MASTERS, HashRing
from fence import store

PAUSE_LEASE_S = 120.0  # x-ingress resumes by itself after this if the controller is gone
INGRESS_ALIVE_S = 60.0
RPC_S = 60.0


class WorkerError(StackError):
    """A worker operation cannot be done, or did not finish (it was undone)."""


@dataclass
class Outcome:
    action: str  # add | remove | hot
    worker: str  # (hot: the fence)
    weight: int = 1
    ring_before: int = 0
    ring_after: int = 0
    fences: int = 0
    moved: int = 0
    pairs_moved: int = 0
    paused_s: float = 0.0  # x-ingress not consuming
    blocked_s: float = 0.0  # fence changes waiting
    held_at_barrier: int = 0
    masters: tuple[str, str] = ("", "")  # hot: the fences' masters before, after (described)
    seconds: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        laps = ", ".join(f"{k} {v:.1f}" for k, v in self.seconds.items())
        took = (f"x-ingress paused {self.paused_s:.1f} s, fence changes blocked {self.blocked_s:.1f} s; "
                f"{sum(self.seconds.values()):.1f} s ({laps})")
        if self.action == "hot":
            before, after = self.masters
            return (f"SUMMARY worker hot {self.worker} OK: masters {before} -> {after}, ring "
                    f"v{self.ring_before} -> v{self.ring_after}, {self.pairs_moved:,} objects inside "
                    "handed over; " + took)
        share = self.moved / self.fences if self.fences else 0.0
        return (f"SUMMARY worker {self.action} {self.worker} OK: ring v{self.ring_before} -> "
                f"v{self.ring_after}, {self.moved:,} of {self.fences:,} fences moved ({percent(share)}), "
                f"{self.pairs_moved:,} objects inside them handed over; " + took)


# --------------------------------------------------------------------------- the pause


async def pause(conn: asyncpg.Connection, reason: str) -> str:
    """Ask x-ingress to pause; the pause's token (x-ingress reports the token it honours)."""
    token = uuid.uuid4().hex
    await conn.execute("INSERT INTO ingress_pause (id, token, until, reason) "
                       "VALUES (1, $1, now() + make_interval(secs => $2), $3) ON CONFLICT (id) DO UPDATE "
                       "SET token = EXCLUDED.token, until = EXCLUDED.until, reason = EXCLUDED.reason",
                       token, PAUSE_LEASE_S, reason)
    return token


async def unpause(conn: asyncpg.Connection) -> None:
    await conn.execute("DELETE FROM ingress_pause")


async def until_paused(conn: asyncpg.Connection, token: str, timeout: float) -> list[str]:
    """Until every x-ingress seen in INGRESS_ALIVE_S says it stopped consuming for `token`."""
    deadline = time.monotonic() + timeout
    while True:
        rows = await conn.fetch("SELECT instance, paused_for FROM worldmap_seen "
                                "WHERE seen_at > now() - make_interval(secs => $1)", INGRESS_ALIVE_S)
        busy = sorted(r["instance"] for r in rows if r["paused_for"] != token)
        if not busy:
            return sorted(r["instance"] for r in rows)
        if time.monotonic() > deadline:
            raise WorkerError(f"x-ingress {', '.join(busy)} did not pause within {timeout:g}s")
        await asyncio.sleep(0.2)  # polls the table each x-ingress writes every second


# --------------------------------------------------------------------------- the drain


async def drained(urls: dict[str, str], regions: Sequence[str], workers: Sequence[str], timeout: float
                  ) -> int:
    """Every x-geo's fence changes applied, then a barrier through each region to each of
    its workers, answered (see the module's docstring); the positions the workers still hold
    for a gate."""
    for region in regions:  # behind every fence change queued there
        await ask(urls[t.region_vhost(region)], t.GEO_CONTROL_EXCHANGE, "", {"limit": 0}, timeout=timeout)
    barrier = uuid.uuid4().hex
    conn = await aio_pika.connect(urls[t.FENCES_VHOST], timeout=10)
    try:
        ch = await conn.channel()
        replies = await ch.declare_queue("", exclusive=True, auto_delete=True)
        for region in regions:
            rconn = await aio_pika.connect(urls[t.region_vhost(region)], timeout=10)
            try:
                rch = await rconn.channel(publisher_confirms=True)
                ex = await rch.get_exchange(t.GEO_IN_EXCHANGE, ensure=False)
                await ex.publish(aio_pika.Message(pack(control.BARRIER, barrier=barrier, reply=replies.name),
                                                  content_type=CONTENT_TYPE), "")
            finally:
                await rconn.close()
        want = {(r, w) for r in regions for w in workers}
        held = 0
        async with replies.iterator(timeout=timeout) as it:
            async for message in it:
                async with message.process():
                    answer = json.loads(message.body)
                    if answer.get("barrier") == barrier:
                        want.discard((answer["region"], answer["worker"]))
                        held = max(held, int(answer.get("held_now", 0)))
                if not want:
                    return held
    except TimeoutError:
        raise WorkerError(f"the drain barrier did not come through within {timeout:g}s") from None
    finally:
        await conn.close()
    raise WorkerError("the drain barrier's reply queue closed")


# --------------------------------------------------------------------------- the handover


async def rpc(urls: dict[str, str], worker: str, kind: str, request: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = await ask(urls[t.FENCES_VHOST], t.FENCE_CONTROL_EXCHANGE, worker, request,
                                       timeout=RPC_S, kind=kind)
    if "error" in answer:
        raise WorkerError(f"worker {worker}: {kind}: {answer['error']}")
    return answer


async def store_ring(conn: asyncpg.Connection, ring: HashRing, base: int) -> int:
    async with conn.transaction():
        latest = int(await conn.fetchval("SELECT coalesce(max(version), 0) FROM worker_ring"))
        if latest != base:
            raise WorkerError(f"the worker ring changed meanwhile (version {latest}, expected {base})")
        await conn.execute("INSERT INTO worker_ring (version, body) VALUES ($1, $2)", base + 1,
                           ring.to_dict())
    return base + 1


async def hand_over(settings: Settings, pw: Secrets, old: tuple[int, HashRing], new: HashRing, out: Outcome,
                    say: Say) -> None:
    """Steps 2-4 of the module's docstring."""
    conn_settings = connection_settings(settings, pw)
    urls = conn_settings["amqp"]
    dsn = conn_settings["postgres"]["dsn"]
    version, ring = old
    regions = list(settings.regions)
    clock = Timer(out)
    lock = await routing_store.connect(dsn)
    conn = await routing_store.connect(dsn)
    blocked_at = paused_at = 0.0
    taken: list[str] = []
    switched = False
    tx = lock.transaction()
    try:
        await tx.start()
        await lock.execute("SELECT pg_advisory_xact_lock($1)", store.WORLDMAP_LOCK)  # fence changes wait
        blocked_at = time.monotonic()
        token = await pause(conn, f"worker {out.action} {out.worker}")
        paused_at = time.monotonic()
        ingresses = await until_paused(conn, token, 30.0)
        say(f"x-ingress paused ({', '.join(ingresses) or 'none running'}); fence changes blocked")
        out.held_at_barrier = await drained(urls, regions, ring.nodes, RPC_S)
        clock.lap("pause+drain")
        say(f"drained: every x-geo and worker applied what came before the pause "
            f"({out.held_at_barrier} positions held for a gate)")
        spec = new.to_dict()
        joining = [w for w in new.nodes if w not in ring.nodes]
        gates_from = ring.nodes[0] if joining else None  # notices reach every worker: one has them all
        exports = {w: await rpc(urls, w, control.EXPORT, {"ring": spec, "gates": w == gates_from})
                   for w in ring.nodes}
        for e in exports.values():
            out.moved += int(e["fences"])
            out.pairs_moved += int(e["pairs"])
        for w in new.nodes:
            for src, e in exports.items():
                gains = any(w in new.masters(f) for f in e["names"])
                if gains or (src == gates_from and w in joining):
                    await rpc(urls, w, control.IMPORT, {"ring": spec, "state": e["state"]})
                    taken.append(w)
        clock.lap("export+import")
        out.ring_after = await store_ring(conn, new, version)
        for region in regions:
            answer = await ask(urls[t.region_vhost(region)], t.GEO_CONTROL_EXCHANGE, "",
                               {"version": out.ring_after}, timeout=RPC_S, kind=control.RING)
            if answer.get("ring") != out.ring_after:
                raise WorkerError(f"x-geo {region} did not take ring version {out.ring_after}: {answer}")
        switched = True
        for w in ring.nodes:
            await rpc(urls, w, control.FORGET, {"ring": spec, "version": out.ring_after})
        clock.lap("switch")
    except BaseException:
        if not switched and out.ring_after:  # stored, not taken everywhere: the controller's to finish
            say("the new ring is stored but not every x-geo took it: run the command again")
        elif not switched:
            spec_old = ring.to_dict()
            for w in set(taken):  # undo: they let go of what they took
                with contextlib.suppress(Exception):
                    await rpc(urls, w, control.FORGET, {"ring": spec_old, "version": version})
        raise
    finally:
        with contextlib.suppress(Exception):
            await unpause(conn)
        out.paused_s = time.monotonic() - paused_at if paused_at else 0.0
        with contextlib.suppress(Exception):
            await tx.rollback()
        out.blocked_s = time.monotonic() - blocked_at if blocked_at else 0.0
        await lock.close()
        await conn.close()


async def current_ring(settings: Settings, pw: Secrets) -> tuple[int, HashRing, int]:
    """The ring in force (stored, else GEOFENCE_WORKERS') and how many live fences there are."""
    conn = await routing_store.connect(connection_settings(settings, pw)["postgres"]["dsn"])
    try:
        version, ring = await routing_store.ring_or(conn, settings.workers)
        fences = int(await conn.fetchval("SELECT count(*) FROM fence WHERE deleted_at IS NULL"))
    finally:
        await conn.close()
    return version, ring, fences


def queues_consumed(settings: Settings, pw: Secrets, worker: str) -> bool:
    mgmt = rabbit.management(settings, pw)
    return all(mgmt.get(api_path("queues", t.FENCES_VHOST, q)).get("consumers")
               for q in (t.fence_queue(worker), t.fence_control_queue(worker)))


async def messages_in(url: str, queue: str) -> int:
    """The messages a queue with no consumer holds, as the broker has it now (a passive
    declare; the management API's figures lag by seconds)."""
    conn = await aio_pika.connect(url, timeout=10)
    try:
        ch = await conn.channel()
        q = await ch.declare_queue(queue, passive=True)
        return int(q.declaration_result.message_count or 0)
    finally:
        await conn.close()


# --------------------------------------------------------------------------- add / remove


async def add(settings: Settings, pw: Secrets, name: str, weight: int, say: Say) -> Outcome:
    settings = live(settings)
    out = Outcome("add", name, weight)
    clock = Timer(out)
    version, ring, out.fences = await current_ring(settings, pw)
    out.ring_before = out.ring_after = version
    if weight < 1:
        raise WorkerError("a worker's weight is a positive integer")
    if ring.weights.get(name) == weight:
        raise WorkerError(f"worker {name} is on the ring already (weight {weight})")
    new = ring.with_weights({**ring.weights, name: weight})  # (or a new weight)
    try:
        t.Topology(regions=settings.regions, workers=(*settings.workers, name)
                   if name not in settings.workers else settings.workers)
    except ValueError as exc:
        raise WorkerError(str(exc)) from None
    say(f"worker add {name} (weight {weight}): the ring would give it {percent(new.shares()[name])} "
        "of the fences")
    if name not in settings.workers:
        settings = write_live_topology(settings, settings.regions, (*settings.workers, name))
    await asyncio.to_thread(rabbit.apply, settings, pw, say)
    monitoring.write_config(settings)
    await asyncio.to_thread(sidecars.start, settings, pw, sidecars.Sidecar("x-fence", name), say)
    await until(lambda: queues_consumed(settings, pw, name), f"x-fence {name} consuming",
                sidecars.READY_TIMEOUT_S, WorkerError)
    clock.lap("topology")
    await hand_over(settings, pw, (version, ring), new, out, say)
    return out


async def remove(settings: Settings, pw: Secrets, name: str, say: Say) -> Outcome:
    settings = live(settings)
    out = Outcome("remove", name)
    clock = Timer(out)
    version, ring, out.fences = await current_ring(settings, pw)
    out.ring_before = out.ring_after = version
    if name in ring.nodes:
        if len(ring.nodes) == 1:
            raise WorkerError(f"{name} is the only worker")
        out.weight = ring.weights[name]
        new = ring.with_weights({w: k for w, k in ring.weights.items() if w != name})
        say(f"worker remove {name}: its {percent(ring.shares()[name])} of the fences go to "
            f"{', '.join(new.nodes)}")
        await hand_over(settings, pw, (version, ring), new, out, say)
    elif name not in settings.workers:
        raise WorkerError(f"no worker {name} (workers: {', '.join(ring.nodes)})")
    # its process, then its queues (empty: the ring sends it nothing any more), then the rest
    await asyncio.to_thread(sidecars.stop, settings, f"x-fence-{name}", say, "worker removed")
    if name in settings.workers:
        settings = write_live_topology(settings, settings.regions,
                                       tuple(w for w in settings.workers if w != name))
    monitoring.write_config(settings)
    mgmt = rabbit.management(settings, pw)
    steps: list[Step] = []
    for q in (t.fence_queue(name), t.fence_control_queue(name)):
        path = api_path("queues", t.FENCES_VHOST, q)
        if not mgmt.exists(path):
            continue
        left = await messages_in(connection_settings(settings, pw)["amqp"][t.FENCES_VHOST], q)
        if left:  # (quorum queues have no if-empty delete: counted, as the broker has it now)
            raise WorkerError(f"queue {q} still holds {left} messages: not deleted (`geofence dlq` or "
                              f"start x-fence-{name} again to see what they are)")
        steps.append(Http("DELETE", path, None))
    # its journal stream: what it held was handed over (its backups follow their new workers')
    journal = api_path("queues", t.FENCES_VHOST, t.fence_journal_queue(name))
    if mgmt.exists(journal):
        steps.append(Http("DELETE", journal, None))
    if steps:
        await asyncio.to_thread(rabbit.run_steps, steps, mgmt, tuple(rabbit.passwords(pw).values()), say)
    await asyncio.to_thread(rabbit.apply, settings, pw, say)
    clock.lap("topology")
    return out


def _masters(ring: HashRing, fence_ids: Sequence[str]) -> str:
    if len(fence_ids) == 1:
        m = ring.masters(fence_ids[0])
        return f"{len(m)} ({', '.join(m)})"
    counts = sorted({len(ring.masters(f)) for f in fence_ids})
    return "/".join(map(str, counts))


async def hot(settings: Settings, pw: Secrets, fence_ids: Sequence[str], masters: int, say: Say) -> Outcome:
    """Give live fences `masters` masters each (1: one again), their objects handed over
    live, in one handover."""
    settings = live(settings)
    if not fence_ids:
        raise WorkerError("name the fence(s) to make hot")
    shown = ", ".join(fence_ids[:3]) + (f" (+{len(fence_ids) - 3})" if len(fence_ids) > 3 else "")
    out = Outcome("hot", shown)
    for fence_id in fence_ids:
        check_fence_key(fence_id)
    if not 1 <= masters <= MAX_MASTERS:
        raise WorkerError(f"--masters {masters}: between 1 and {MAX_MASTERS}")
    version, ring, out.fences = await current_ring(settings, pw)
    out.ring_before = out.ring_after = version
    conn = await routing_store.connect(connection_settings(settings, pw)["postgres"]["dsn"])
    try:
        alive = {r["id"] for r in await conn.fetch("SELECT id FROM fence WHERE id = any($1::text[]) "
                                                   "AND deleted_at IS NULL", list(fence_ids))}
    finally:
        await conn.close()
    missing = [f for f in fence_ids if f not in alive]
    if masters > 1 and missing:  # (one master again is allowed for a deleted fence)
        raise WorkerError(f"no live fence {', '.join(map(repr, missing))}")
    new = ring
    for fence_id in fence_ids:
        new = new.with_hot(fence_id, masters)
    out.masters = (_masters(ring, fence_ids), _masters(new, fence_ids))
    if new == ring:
        raise WorkerError(f"{shown}: {masters} master{'s' if masters > 1 else ''} already")
    if masters > len(ring.nodes):
        say(f"{masters} masters asked, {len(ring.nodes)} workers: every worker is a master")
    say(f"worker hot {shown}: masters {out.masters[0]} -> {out.masters[1]}")
    await hand_over(settings, pw, (version, ring), new, out, say)
    return out


# --------------------------------------------------------------------------- a worker's host lost


def lock_owner(mgmt: Management, worker: str) -> str | None:
    """The name of the process (its connections' client-provided name) holding the worker's
    instance lock, or None when no process holds it."""
    path = api_path("queues", t.FENCES_VHOST, t.fence_lock(worker))
    try:
        queue = mgmt.get(path)
    except ManagementError as exc:
        if exc.status == 404:
            return None
        raise
    owner = (queue.get("owner_pid_details") or {}).get("name")
    if not owner:
        return None
    conn = mgmt.get(api_path("connections", owner))
    return str((conn.get("client_properties") or {}).get("connection_name") or owner)


async def lost(settings: Settings, pw: Secrets, worker: str, say: Callable[[str], None],
               timeout: float = 60.0) -> str:
    """The process running `worker` declared lost (hung, or its host gone while the broker has
    not noticed): every connection of that process closed, so its instance locks go and each
    of its workers is taken over by a standby that follows its journal stream (fence/x_fence/
    slots.py). Returns once another process runs `worker`: the summary line."""
    mgmt = rabbit.management(settings, pw)
    started = time.monotonic()
    process = await asyncio.to_thread(lock_owner, mgmt, worker)
    if process is None:
        say(f"no process holds worker {worker}: a standby takes it over by itself")
    else:
        conns = await asyncio.to_thread(mgmt.get, "api/connections?columns=name,client_properties,user")
        mine = [c["name"] for c in conns if c.get("user") == t.FENCE_USER
                and (c.get("client_properties") or {}).get("connection_name") == process]
        for name in mine:
            await asyncio.to_thread(mgmt.request, "DELETE", api_path("connections", name))
        say(f"closed {len(mine)} connection(s) of {process}, which ran worker {worker}")
    while time.monotonic() - started < timeout:
        now = await asyncio.to_thread(lock_owner, mgmt, worker)
        if now is not None and now != process:
            return (f"SUMMARY worker {worker}: taken over by {now} in "
                    f"{time.monotonic() - started:.1f}s (its state from x-fence.{worker}.journal)")
        await asyncio.sleep(0.2)
    raise WorkerError(f"no standby took worker {worker} over within {timeout:g}s: is an x-fence "
                      f"process that backs it up running (GEOFENCE_FENCE_BACKUPS)?")
