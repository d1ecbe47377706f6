"""`geofence region add / remove`: an x-geo region added or removed while positions flow.

Add (a split of region R at a Hilbert index; `--balance` takes the median of R's bound
ranges): the region's vhost, exchanges, queues, users' permissions, federation upstream and
policies (the topology plan `geofence up` runs, for the stack's new region list), its x-geo
started and consuming, the federation link from its vhost to gf-fences running; then the
bindings moved in the re-split's two safe steps (fence/region_moves.py): grow (the new region
binds its part of every fence there, R keeps all), the worldmap stored (version + 1, only if
nobody stored one meanwhile) and taken by every live x-ingress, shrink (R lets go of the part
it gave away).

Remove (a join into region R): grow (R binds the leaving region's part of every fence too), a
worldmap where the leaving region owns nothing but is still listed (x-ingress sends it the
handover notices of objects that leave it, as for any crossing), shrink (the leaving region
unbinds all); its queues drained; a worldmap without it; its x-geo stopped; the topology
without it (federation upstream cleared, vhost deleted) last.

Each step is confirmed before the next (control messages confirmed and applied by every
x-geo, maps taken by every x-ingress), so a position routed with either map finds its fences
at every moment: no event lost, none reported twice. An operation cut short (a crash, a
timeout) is finished by running the same command again: every step is idempotent.

Residual race (as for the nightly re-split): a fence changed through the API between the
grow and the map's storing is cut with the old map, so until the shrink (which re-grows such
fences first) its part in the new region is not bound.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import asyncpg
import numpy as np

from deploy import monitoring, sidecars, stack
from deploy.processes import Say, StackError
from deploy.rabbitmq import apply as rabbit
from deploy.rabbitmq.plan import api_path, ctl
from deploy.settings import (
    Secrets,
    Settings,
    postgres_dsn,
    read_live_topology,
    sidecar_amqp_url,
    write_live_topology,
)
from exchanges import routing_store
from exchanges import topology as t
from exchanges.worldmap import Worldmap
from fence import region_moves as moves
from fence import store
from fence.manager import FenceManager

INGRESS_ALIVE_S = 60.0  # an x-ingress that checked in within this long must take the map
CHUNK = 100  # fences rebound in one transaction, their defines confirmed together
CONCURRENCY = 4  # chunks in flight (the fence manager's PostgreSQL pool)


class RegionError(StackError):
    """A region operation cannot be done (bad names, nothing to split) or did not finish."""


@dataclass
class Outcome:
    action: str  # add | remove
    region: str
    other: str  # the region split or joined into
    worldmap_before: int = 0
    worldmap_after: int = 0
    fences_grown: int = 0
    fences_shrunk: int = 0
    ranges_moved: int = 0
    skipped: int = 0  # fences changed by the API meanwhile (their own change's bindings stand)
    moved_share: float = 0.0  # of the curve
    seconds: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        how = f"split from {self.other}" if self.action == "add" else f"joined into {self.other}"
        return (f"SUMMARY region {self.action} {self.region} ({how}) OK: worldmap v{self.worldmap_before} -> "
                f"v{self.worldmap_after}, {percent(self.moved_share)} of the curve moved, "
                f"{self.fences_grown:,} fences grown / {self.fences_shrunk:,} shrunk "
                f"({self.ranges_moved:,} ranges), {self.skipped} skipped; "
                f"{sum(self.seconds.values()):.1f} s ("
                + ", ".join(f"{k} {v:.1f}" for k, v in self.seconds.items()) + ")")


def live(settings: Settings) -> Settings:
    """`settings` with the regions and workers the stack runs now (an earlier change may
    have been made since they were read)."""
    found = read_live_topology(settings.state_dir)
    if found is None:
        return settings
    return replace(settings, regions=found["regions"], workers=found["workers"],
                   placement=found.get("placement", ()), ingress=found.get("ingress", ()))


def percent(share: float) -> str:
    return f"{share * 100:.3g}%"


class Timed(Protocol):
    seconds: dict[str, float]


class Timer:
    """Adds the seconds since the last lap to `outcome.seconds[name]`."""

    def __init__(self, outcome: Timed) -> None:
        self.outcome, self.started = outcome, time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.outcome.seconds[name] = self.outcome.seconds.get(name, 0.0) + now - self.started
        self.started = now


# --------------------------------------------------------------------------- the store


LIVE_BINDINGS = ("SELECT r.fence_id, r.region, r.version, r.bits, r.ranges, r.interior FROM fence_range r "
                 "JOIN fence f ON f.id = r.fence_id AND f.deleted_at IS NULL AND f.version = r.version "
                 "WHERE r.region = ANY($1) ORDER BY r.fence_id")


async def bound(dsn: str, regions: Sequence[str]) -> list[moves.Bound]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(LIVE_BINDINGS, list(regions))
    finally:
        await conn.close()
    return [moves.Bound(r["fence_id"], r["region"], int(r["version"]), int(r["bits"]),
                        np.frombuffer(r["ranges"], "<u8").astype(np.uint64).reshape(-1, 2),
                        np.frombuffer(r["interior"], np.uint8).astype(bool)) for r in rows]


async def place(dsn: str, region: str, endpoint: tuple[str, int] | None) -> None:
    """Record where the region's vhost is (None: on the pipeline's own broker)."""
    conn = await asyncpg.connect(dsn)
    try:
        if endpoint is None:
            await conn.execute("DELETE FROM region_broker WHERE region = $1", region)
        else:
            await conn.execute("INSERT INTO region_broker (region, host, port) VALUES ($1, $2, $3) "
                               "ON CONFLICT (region) DO UPDATE SET host = EXCLUDED.host, "
                               "port = EXCLUDED.port", region, *endpoint)
    finally:
        await conn.close()


async def store_map(dsn: str, new: Worldmap, base: int) -> None:
    """Store `new` if the newest stored map is still `base` (nobody re-split meanwhile)."""
    conn = await routing_store.connect(dsn)
    try:
        latest = await routing_store.latest_worldmap_version(conn)
        if latest >= new.version:
            stored = await routing_store.latest_worldmap(conn)
            if stored is not None and stored.to_json() == new.to_json():
                return  # stored by an earlier run of this command
        if latest != base or not await store.save_worldmap(conn, new):
            raise RegionError(f"the worldmap changed meanwhile (version {latest}, expected {base}): "
                              "run the command again")
    finally:
        await conn.close()


async def settled(dsn: str, version: int, timeout: float, say: Say) -> None:
    """Until every live x-ingress routes with `version` (they check every 2 s)."""
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + timeout
        while True:
            seen = await store.routing_versions(conn, INGRESS_ALIVE_S)
            behind = sorted(i for i, v in seen.items() if v < version)
            if not behind:
                names = ", ".join(sorted(seen)) or "none"
                say(f"worldmap version {version}: taken by every x-ingress ({names})")
                return
            if time.monotonic() > deadline:
                raise RegionError(f"x-ingress {', '.join(behind)} still routes with an older worldmap after "
                                  f"{timeout:g}s: run the command again once it does")
            await asyncio.sleep(0.3)  # polls a table the x-ingress write every 2 s
    finally:
        await conn.close()


# --------------------------------------------------------------------------- the broker


def federation_running(settings: Settings, pw: Secrets, region: str) -> bool:
    links = rabbit.management(settings, pw).get("api/federation-links")
    return any(lk.get("vhost") == t.FENCES_VHOST and lk.get("exchange") == t.FENCE_IN_EXCHANGE
               and lk.get("upstream") == t.upstream_name(t.region_vhost(region))
               and lk.get("status") == "running" for lk in links)


def consumed(settings: Settings, pw: Secrets, region: str) -> bool:
    mgmt = rabbit.management(settings, pw, settings.broker_of(region))
    vhost = t.region_vhost(region)
    return all(mgmt.get(api_path("queues", vhost, q)).get("consumers")
               for q in (t.GEO_POSITIONS_QUEUE, t.GEO_CONTROL_QUEUE))


def backlog(settings: Settings, pw: Secrets, region: str) -> int:
    """Messages still in the region's vhost: its x-geo's queues and the federation link's."""
    mgmt = rabbit.management(settings, pw, settings.broker_of(region))
    queues = mgmt.get(api_path("queues", t.region_vhost(region)) + "?columns=name,messages")
    return sum(int(q.get("messages") or 0) for q in queues if q["name"] != t.DEAD_LETTER_QUEUE)


async def until(check: Callable[[], bool], what: str, timeout: float,
                error: type[StackError] = StackError) -> None:
    """Polls `check` (blocking: in a thread) until it holds; `error` after `timeout`."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise error(f"{what}: not after {timeout:g}s")
        await asyncio.sleep(0.25)


# --------------------------------------------------------------------------- rebinding


async def rebind_all(manager: FenceManager, rebinds: Iterable[moves.Rebind], outcome: Outcome,
                     counter: str) -> None:
    """Every rebind stored and sent (CHUNK fences a transaction, CONCURRENCY chunks at a
    time), then applied by every x-geo."""
    todo = list(rebinds)
    sem = asyncio.Semaphore(CONCURRENCY)

    async def chunk(part: list[moves.Rebind]) -> None:
        async with sem:
            done = await manager.rebind_many([(rb.fence_id, rb.version, rb.bits, rb.per_region)
                                              for rb in part])
        for rb, ok in zip(part, done, strict=True):
            if ok:
                setattr(outcome, counter, getattr(outcome, counter) + 1)
                outcome.ranges_moved += rb.ranges
            else:
                outcome.skipped += 1

    await asyncio.gather(*(chunk(todo[i:i + CHUNK]) for i in range(0, len(todo), CHUNK)))
    await manager.applied(timeout=120.0)


def manager_for(settings: Settings, pw: Secrets, dsn: str, regions: tuple[str, ...]) -> FenceManager:
    url = sidecar_amqp_url(settings, t.MANAGER_USER, pw.users[t.MANAGER_USER], "geofence-region")
    return FenceManager(url, dsn, regions, settings.workers, follow_worldmap=False)


# --------------------------------------------------------------------------- add


async def begin(settings: Settings, pw: Secrets, action: str, name: str, other: str
                ) -> tuple[Settings, str, Outcome, Worldmap]:
    """The stack's regions now, its DSN, the outcome to fill and the worldmap in force."""
    settings = live(settings)
    dsn = postgres_dsn(settings, pw.postgres_password)
    wm = await routing_store.read_worldmap(dsn)
    if wm is None:
        raise RegionError("no worldmap stored: run `geofence up`")
    return settings, dsn, Outcome(action, name, other, worldmap_before=wm.version), wm


async def add(settings: Settings, pw: Secrets, name: str, split_from: str, at: int | None, say: Say,
              settle_timeout: float = 60.0, broker: int = 1) -> Outcome:
    """`broker` 2: the region's vhost on the second RabbitMQ node (started if it is not)."""
    settings, dsn, out, wm = await begin(settings, pw, "add", name, split_from)
    if broker not in (1, 2):
        raise RegionError("a region goes on broker 1 (the pipeline's own) or 2 (the second node)")
    if name in settings.regions and settings.broker_of(name) != broker:
        raise RegionError(f"region {name} is on broker {settings.broker_of(name)}: remove it first")
    clock = Timer(out)
    if split_from not in wm.regions or split_from == name:
        raise RegionError(f"no region {split_from!r} to split (regions: {', '.join(wm.regions)})")
    try:
        t.Topology(regions=(*settings.regions, name) if name not in settings.regions else settings.regions,
                   workers=settings.workers)  # the name is valid
    except ValueError as exc:
        raise RegionError(str(exc)) from None
    old = await bound(dsn, [split_from])
    resume = name in wm.regions and len(wm.intervals(name)) > 0  # an add cut short after its map
    if resume:
        new = wm
        say(f"region add {name}: it owns part of the curve already (worldmap v{wm.version}): finishing")
    else:
        try:
            if at is None:
                sample = np.concatenate([b.ranges[:, 0] for b in old]) if old else np.empty(0, np.uint64)
                at = wm.balanced_cut(split_from, sample)
            new = wm.split(split_from, at, name)
        except ValueError as exc:
            raise RegionError(str(exc)) from None
        out.moved_share = moves.moved_share(wm, new)
        say(f"region add {name}: splitting {split_from} at Hilbert index {at:,} "
            f"({percent(out.moved_share)} of the curve; {len(old):,} fences bound on {split_from})")

    # 1. the broker and the process
    if name not in settings.regions:
        placement = (*settings.placement, (name, broker)) if broker != 1 else None
        settings = write_live_topology(settings, (*settings.regions, name), settings.workers, placement)
    if broker != 1:  # the second node, and where its region is for x-ingress and the fence service
        await asyncio.to_thread(stack.start_services, settings, pw, say)
        await place(dsn, name, (settings.host, settings.broker_amqp_port(broker)))
    await asyncio.to_thread(rabbit.apply, settings, pw, say)
    monitoring.write_config(settings)
    await asyncio.to_thread(sidecars.start, settings, pw, sidecars.Sidecar("x-geo", name), say)
    await until(lambda: consumed(settings, pw, name), f"x-geo {name} consuming", sidecars.READY_TIMEOUT_S,
                RegionError)
    await until(lambda: federation_running(settings, pw, name),
                f"federation link from {t.region_vhost(name)}", sidecars.READY_TIMEOUT_S, RegionError)
    clock.lap("topology")

    async with manager_for(settings, pw, dsn, (*wm.regions, name)) as manager:
        if not resume:
            # 2. grow: the new region binds its part (R keeps all)
            await rebind_all(manager, moves.split_grow(old, new, name), out, "fences_grown")
            clock.lap("grow")
            # 3. the map, taken by every x-ingress
            await store_map(dsn, new, wm.version)
        out.worldmap_after = new.version
        await settled(dsn, new.version, settle_timeout, say)
        clock.lap("switch")
        # 4. shrink, after growing what the API changed meanwhile (cut with the old map)
        fresh = await bound(dsn, [split_from, name])
        have = {b.fence_id for b in fresh if b.region == name}
        mine = [b for b in fresh if b.region == split_from]
        regrow = [rb for rb in moves.split_grow(mine, new, name) if rb.fence_id not in have]
        if regrow:
            await rebind_all(manager, regrow, out, "fences_grown")
        await rebind_all(manager, moves.split_shrink(mine, new), out, "fences_shrunk")
        clock.lap("shrink")
    return out


# --------------------------------------------------------------------------- remove


async def remove(settings: Settings, pw: Secrets, name: str, into: str, say: Say,
                 settle_timeout: float = 60.0, drain_timeout: float = 120.0) -> Outcome:
    settings, dsn, out, wm = await begin(settings, pw, "remove", name, into)
    clock = Timer(out)
    if into not in wm.regions or into == name:
        raise RegionError(f"no region {into!r} to join {name!r} into (regions: {', '.join(wm.regions)})")
    if name in wm.regions:
        mid = wm.vacate(name, into) if len(wm.intervals(name)) else wm
        out.moved_share = moves.moved_share(wm, mid)
        say(f"region remove {name}: joining it into {into} ({percent(out.moved_share)} of the curve)")
        async with manager_for(settings, pw, dsn, wm.regions) as manager:
            # 1. grow: `into` binds the leaving region's part too
            async def grow() -> list[moves.Bound]:
                rows = await bound(dsn, [name, into])
                leaving = [b for b in rows if b.region == name]
                staying = {b.fence_id: b for b in rows if b.region == into}
                await rebind_all(manager, moves.join_grow(leaving, staying, into, wm, mid), out,
                                 "fences_grown")
                return leaving

            await grow()
            clock.lap("grow")
            # 2. the map where it owns nothing (still listed: handover notices reach it)
            if mid is not wm:
                await store_map(dsn, mid, wm.version)
            await settled(dsn, mid.version, settle_timeout, say)
            clock.lap("switch")
            # 3. shrink, after growing what the API changed meanwhile
            leaving = await grow()
            await rebind_all(manager, moves.join_shrink(leaving), out, "fences_shrunk")
            clock.lap("shrink")
        # 4. what is queued there goes through, then the map without it
        await until(lambda: backlog(settings, pw, name) == 0, f"the queues of {t.region_vhost(name)} drained",
                    drain_timeout, RegionError)
        final = mid.drop(name)
        await store_map(dsn, final, mid.version)
        out.worldmap_after = final.version
        await settled(dsn, final.version, settle_timeout, say)
        await until(lambda: backlog(settings, pw, name) == 0, f"the queues of {t.region_vhost(name)} drained",
                    drain_timeout, RegionError)
        clock.lap("drain")
    else:
        out.worldmap_after = wm.version
    # 5. the process, then the broker's part
    placed_on = settings.broker_of(name)
    await asyncio.to_thread(sidecars.stop, settings, f"x-geo-{name}", say, "region removed")
    if name in settings.regions:
        settings = write_live_topology(settings, tuple(r for r in settings.regions if r != name),
                                       settings.workers)
    monitoring.write_config(settings)
    await asyncio.to_thread(rabbit.apply, settings, pw, say)  # clears its federation upstream
    node = placed_on  # the region's node, recorded before the topology forgot it
    mgmt = rabbit.management(settings, pw, node)
    vhost = t.region_vhost(name)
    if mgmt.exists(api_path("vhosts", vhost)):
        await asyncio.to_thread(rabbit.run_steps, [rabbit.on_node(ctl("delete_vhost", vhost), node)], mgmt,
                                tuple(rabbit.passwords(pw).values()), say)
    await place(dsn, name, None)
    clock.lap("topology")
    return out

