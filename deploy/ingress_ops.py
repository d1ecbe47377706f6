"""`geofence ingress list / add / remove`: x-ingress instances while positions flow.

Each instance consumes the partition queues the stored partition map gives it
(exchanges/ingress_partitions.py; PostgreSQL's ingress_assignment, a new version per change):

1. add: the new instance's process (x-ingress-N) starts; with no partition yet it consumes
   nothing. A new map is stored (`assign`: the new instance takes its share from the most
   loaded instances, nothing else moves).
2. Every instance reads the map within a second. One whose share changes ends its session
   releasing its partitions: what it holds and has not handed out stays unacked and goes back
   to its queue with the connection, in order, ahead of the rest (Intake.release_on_stop). A
   new owner consumes a partition only once no other consumer is on it, so an object's
   positions are never routed by two instances at once, and never out of order.
3. Done when every instance reports the new version (worldmap_seen.partitions_version) and
   every partition queue has its consumer again. remove is the same with a map without the
   instance, whose process is stopped once it consumes nothing.

The first instance (x-ingress) stays: it takes the gateway batches (handing on the positions
of partitions it does not own) and holds the proximity router (the others hand it the
positions of tenants with a proximity subscription). A failure mid-way leaves a stored map
that the instances follow (`geofence ingress list` shows it, and whether each took it); an
instance added but given no partition consumes nothing, and `remove` takes it away.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from deploy import sidecars
from deploy.processes import Say, StackError
from deploy.rabbitmq import apply as rabbit
from deploy.rabbitmq.plan import api_path
from deploy.region_ops import live, until
from deploy.settings import Secrets, Settings, connection_settings, write_live_topology
from exchanges import ingress_partitions as ip
from exchanges import routing_store
from exchanges import topology as t

FIRST = ip.FIRST_INSTANCE
ALIVE_S = 5.0  # an instance that wrote worldmap_seen within this is alive
MOVE_TIMEOUT_S = 90.0


class IngressError(StackError):
    pass


def instance_name(number: str) -> str:
    return f"{FIRST}-{number}" if number else FIRST


@dataclass
class Outcome:
    action: str
    instance: str
    version: int = 0
    moved: list[int] = field(default_factory=list)
    seconds: float = 0.0
    owners: dict[int, str] = field(default_factory=dict)

    def line(self) -> str:
        shares = {n: len(ip.owned_by(self.owners, n)) for n in sorted(set(self.owners.values()))}
        return (f"SUMMARY: ingress {self.action} {self.instance}: {len(self.moved)} of {ip.PARTITIONS} "
                f"partitions moved in {self.seconds:.1f} s (partition map version {self.version}); "
                + ", ".join(f"{n} {k}" for n, k in shares.items()))


async def _connect(settings: Settings, pw: Secrets) -> asyncpg.Connection:
    return await routing_store.connect(connection_settings(settings, pw)["postgres"]["dsn"])


async def current(settings: Settings, pw: Secrets) -> tuple[int, dict[int, str]]:
    conn = await _connect(settings, pw)
    try:
        return await routing_store.assignment_or_first(conn)
    finally:
        await conn.close()


async def reported(settings: Settings, pw: Secrets) -> dict[str, dict[str, Any]]:
    """What each x-ingress instance wrote last: its partition map version (-1: not consuming)
    and how long ago."""
    conn = await _connect(settings, pw)
    try:
        rows = await conn.fetch("SELECT instance, partitions_version, paused_for, "
                                "extract(epoch FROM now() - seen_at) AS age FROM worldmap_seen")
    finally:
        await conn.close()
    return {r["instance"]: {"version": int(r["partitions_version"]), "age_s": float(r["age"]),
                            "paused_for": r["paused_for"]} for r in rows}


def partitions_consumed(settings: Settings, pw: Secrets) -> bool:
    mgmt = rabbit.management(settings, pw)
    return all(int(mgmt.get(api_path("queues", t.INGRESS_VHOST, q)).get("consumers") or 0) >= 1
               for q in t.PARTITION_QUEUES)


async def _until_moved(settings: Settings, pw: Secrets, version: int, instances: list[str]) -> None:
    deadline = time.monotonic() + MOVE_TIMEOUT_S
    while True:
        seen = await reported(settings, pw)
        behind = [n for n in instances if seen.get(n, {}).get("version", -1) < version
                  or seen.get(n, {}).get("age_s", 1e9) > ALIVE_S]
        if not behind:
            break
        if time.monotonic() > deadline:
            raise IngressError(f"x-ingress {', '.join(behind)} did not take partition map version {version} "
                               f"within {MOVE_TIMEOUT_S:g}s (is it running? `geofence ingress list`)")
        await asyncio.sleep(0.2)  # each instance writes its row every second
    await until(lambda: partitions_consumed(settings, pw), "every partition queue consumed again",
                max(1.0, deadline - time.monotonic()), IngressError)


async def _move(settings: Settings, pw: Secrets, out: Outcome, instances: list[str], say: Say) -> None:
    before_version, before = await current(settings, pw)
    after = ip.assign(instances, before)
    out.moved, out.owners = ip.moved(before, after), after
    started = time.monotonic()
    conn = await _connect(settings, pw)
    try:
        out.version = await routing_store.store_assignment(conn, after)
    finally:
        await conn.close()
    say(f"partition map version {out.version} stored (was {before_version}): partitions "
        f"{','.join(map(str, out.moved)) or 'none'} move")
    await _until_moved(settings, pw, out.version, instances)
    out.seconds = time.monotonic() - started


async def add(settings: Settings, pw: Secrets, say: Say) -> Outcome:
    settings = live(settings)
    if 1 + len(settings.ingress) >= ip.PARTITIONS:
        raise IngressError(f"{1 + len(settings.ingress)} x-ingress instances already: one per partition "
                           f"({ip.PARTITIONS}) at most")
    number = str(max((int(n) for n in settings.ingress), default=1) + 1)
    name = instance_name(number)
    out = Outcome("add", name)
    settings = write_live_topology(settings, settings.regions, settings.workers,
                                   ingress=(*settings.ingress, number))
    await asyncio.to_thread(sidecars.start, settings, pw, sidecars.Sidecar("x-ingress", number), say)
    deadline = time.monotonic() + sidecars.READY_TIMEOUT_S
    while (await reported(settings, pw)).get(name, {}).get("age_s", 1e9) > ALIVE_S:  # it runs
        if time.monotonic() > deadline:
            raise IngressError(f"{name} did not start within {sidecars.READY_TIMEOUT_S:g}s: see "
                               f"{sidecars.log_path(settings, name)}")
        await asyncio.sleep(0.2)
    await _move(settings, pw, out, [FIRST, *(instance_name(n) for n in settings.ingress)], say)
    return out


async def remove(settings: Settings, pw: Secrets, name: str, say: Say) -> Outcome:
    settings = live(settings)
    if name == FIRST:
        raise IngressError(f"{FIRST} stays: it takes the gateway batches and holds the proximity router")
    number = name.removeprefix(f"{FIRST}-")
    if number not in settings.ingress:
        raise IngressError(f"no x-ingress instance {name!r} (`geofence ingress list`)")
    out = Outcome("remove", name)
    rest = tuple(n for n in settings.ingress if n != number)
    await _move(settings, pw, out, [FIRST, *(instance_name(n) for n in rest)], say)
    await asyncio.to_thread(sidecars.stop, settings, name, say, "removed (`geofence ingress remove`)")
    write_live_topology(settings, settings.regions, settings.workers, ingress=rest)
    conn = await _connect(settings, pw)
    try:
        await conn.execute("DELETE FROM worldmap_seen WHERE instance = $1", name)
    finally:
        await conn.close()
    return out


async def gather(settings: Settings, pw: Secrets) -> dict[str, Any]:
    settings = live(settings)
    version, owners = await current(settings, pw)
    seen = await reported(settings, pw)
    running = sidecars.running(settings)
    rows = []
    for name in [FIRST, *(instance_name(n) for n in settings.ingress)]:
        s = seen.get(name, {})
        rows.append({"instance": name, "running": bool(running.get(name)),
                     "partitions": ip.owned_by(owners, name),
                     "map_version": s.get("version"), "seen_s_ago": None if not s else round(s["age_s"], 1),
                     "up": bool(running.get(name)) and bool(s) and s["age_s"] <= ALIVE_S})
    return {"partition_map_version": version, "partitions": ip.PARTITIONS, "instances": rows}


def human(data: dict[str, Any]) -> str:
    lines = [f"partition map version {data['partition_map_version']} ({data['partitions']} partitions)",
             f"{'INSTANCE':<14} {'UP':<4} {'MAP':>4}  PARTITIONS"]
    for r in data["instances"]:
        version = "-" if r["map_version"] is None else str(r["map_version"])
        lines.append(f"{r['instance']:<14} {'yes' if r['up'] else 'NO':<4} {version:>4}  "
                     + (",".join(map(str, r["partitions"])) or "-"))
    return "\n".join(lines)
