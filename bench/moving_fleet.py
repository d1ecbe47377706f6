"""The fleet of bench/moving_fences.py (also driven by bench/soak.py --moving), on the running
stack (`geofence up`): fences that follow cars (fence i, a circle of RADIUS_M, follows car i),
the cars publishing their positions, and what the benchmarks read of the stack (x-geo's
counters, the api's /health, the CPU of the recorded processes).

Invariants: the fleet's fences are all the OWNER's and the benchmarks' tenant's (bench/tenant.py),
their ids `bench:` + FENCE_PREFIX + a number, each following the tenant's car `bench:` +
CAR_PREFIX + the same number (the cars publish `positions.bench.<car>`: x-ingress qualifies
them by that tenant), so a run that could not clean up leaves fences `remove_leftovers` finds;
a process's CPU figure is taken only while it is the process that was recorded (same pid and
start time: `Stack.alive`), never a restarted one's.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
import httpx
import numpy as np
import orjson

from bench import broker_modes as bm
from bench import tenant as tn
from deploy import sidecars
from deploy.inspect_cmd import ask
from deploy.processes import StackError, load_state
from deploy.settings import ConnectionSettings, Settings
from exchanges import topology as t
from fence.follow import EARTH_M_PER_DEG, circle
from fence.manager import FenceManager
from fence.spec import FenceSpec, Follow

OWNER = "bench-moving"
FENCE_PREFIX, CAR_PREFIX = "bench-mv-", "bench-mv-car-"
CENTRE = (9.52, 47.14)  # Vaduz
SPREAD_M = 2_000.0  # fence centres within +-SPREAD_M of CENTRE
RADIUS_M = 150.0
TIMEOUT_S = 600.0
SPEED_M_S = 15.0  # the cars' speed
TICKS_PER_S = 20  # the cars publish spread over the second, in this many groups
APPLIED_TIMEOUT_S = 300.0


def offset(lon: float, lat: float, east_m: float, north_m: float) -> tuple[float, float]:
    dlat = north_m / EARTH_M_PER_DEG
    return lon + east_m / (EARTH_M_PER_DEG * math.cos(math.radians(lat))), lat + dlat


# --------------------------------------------------------------------------- the stack


@dataclass
class Stack:
    settings: Settings
    conn: ConnectionSettings

    @property
    def dsn(self) -> str:
        return self.conn["postgres"]["dsn"]

    def manager(self) -> FenceManager:
        return bm.fence_manager(self.conn, self.settings)

    async def geo_counters(self) -> dict[str, dict[str, int]]:
        """Each region's x-geo counters (since its start), asked on its control exchange."""
        async def one(region: str) -> tuple[str, dict[str, int]]:
            answer = await ask(self.conn["amqp"][t.region_vhost(region)], t.GEO_CONTROL_EXCHANGE, "",
                               {"limit": 0})
            return region, {k: int(v) for k, v in answer["counters"].items() if isinstance(v, int)}

        return dict(await asyncio.gather(*(one(r) for r in self.settings.regions)))

    async def health(self) -> dict[str, int]:
        """The api process's counters (GET /health)."""
        url = (self.conn["api"] or "http://127.0.0.1:8080") + "/health"
        async with httpx.AsyncClient(timeout=10) as client:
            r = await client.get(url)
            r.raise_for_status()
            counters = r.json().get("counters", {})
        return {k: int(v) for k, v in counters.items() if isinstance(v, int)}

    def records(self) -> dict[str, dict[str, Any]]:
        """name -> {pid, start_ticks} of every recorded sidecar, of RabbitMQ and of PostgreSQL."""
        records = dict(sidecars.load_records(self.settings))
        with contextlib.suppress(OSError, ValueError, StackError):
            for name, svc in load_state(self.settings.state_file).items():
                if svc.process is not None and name in ("rabbitmq", "postgres", "memcached"):
                    records[name] = {"pid": svc.process.pid, "start_ticks": svc.process.start_ticks}
        return records

    def process_stats(self) -> tuple[dict[str, dict[str, Any]], dict[int, tuple[int, int, int]]]:
        """(records, pid -> (parent pid, start ticks, utime + stime)) of every process now."""
        stats = {}
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            with contextlib.suppress(OSError, ValueError, IndexError):
                text = Path(f"/proc/{pid}/stat").read_text()
                fields = text[text.rindex(")") + 2:].split()
                stats[pid] = (int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12]))
        return self.records(), stats

    def alive(self, seen: tuple[dict[str, dict[str, Any]], dict[int, tuple[int, int, int]]] | None = None
              ) -> dict[str, list[int]]:
        """name -> its pids (PostgreSQL: the postmaster and its backends) of every recorded
        process still alive and not restarted since it was recorded (in `seen`, or now)."""
        records, stats = seen or self.process_stats()
        out = {}
        for name, rec in records.items():
            pid = int(rec["pid"])
            if pid not in stats or stats[pid][1] != int(rec["start_ticks"]):
                continue  # gone or restarted: its figure would mean nothing
            out[name] = [pid]
            if name == "postgres":  # a backend per connection
                out[name] += [p for p, (ppid, _, _) in stats.items() if ppid == pid]
        return out

    def cpu_ticks(self) -> dict[str, int]:
        """utime + stime (clock ticks) of every recorded sidecar still alive, of RabbitMQ and of
        PostgreSQL (the postmaster and its backends), and "machine": the busy ticks of all
        cores (/proc/stat)."""
        seen = self.process_stats()
        out = {name: sum(seen[1][p][2] for p in pids) for name, pids in self.alive(seen).items()}
        with contextlib.suppress(OSError, ValueError):
            cpu = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
            out["machine"] = sum(cpu) - cpu[3] - cpu[4]  # all but idle and iowait
        return out


def delta(after: dict[str, int], before: dict[str, int], key: str) -> int:
    return after.get(key, 0) - before.get(key, 0)


def geo_delta(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]], key: str) -> int:
    return sum(delta(after.get(r, {}), before.get(r, {}), key) for r in after)


# --------------------------------------------------------------------------- fences


@dataclass
class Fleet:
    """The fences and their cars: fence i follows car i; `centre` is where fence i stands.
    `ids` are the fences' qualified ids (`bench:bench-mv-NNN`, as stored), `cars` the cars'
    names as they publish them (`bench-mv-car-NNN`, qualified `bench:bench-mv-car-NNN`)."""

    ids: list[str]
    cars: list[str]
    centre: list[tuple[float, float]]

    @classmethod
    def make(cls, n: int, rng: np.random.Generator) -> Fleet:
        width = max(3, len(str(n - 1)))
        east, north = rng.uniform(-SPREAD_M, SPREAD_M, (2, n))
        return cls([tn.qualified(f"{FENCE_PREFIX}{i:0{width}d}") for i in range(n)],
                   [f"{CAR_PREFIX}{i:0{width}d}" for i in range(n)],
                   [offset(*CENTRE, float(e), float(no)) for e, no in zip(east, north, strict=True)])

    def spec(self, i: int) -> FenceSpec:
        lon, lat = self.centre[i]
        follow = Follow(tn.qualified(self.cars[i]), RADIUS_M)
        return FenceSpec(fence_id=self.ids[i], geometry=circle(lon, lat, RADIUS_M), name=f"bench moving {i}",
                         timeout_s=TIMEOUT_S, owner=OWNER, follow=follow)


async def live_rows(pg: asyncpg.Connection, ids: Sequence[str]) -> dict[str, asyncpg.Record]:
    rows = await pg.fetch("SELECT id, version, follow_ts, extract(epoch FROM updated_at)::float8 AS updated "
                          "FROM fence WHERE id = ANY($1::text[]) AND deleted_at IS NULL", list(ids))
    return {r["id"]: r for r in rows}


async def remove_leftovers(pg: asyncpg.Connection, manager: FenceManager) -> int:
    """This benchmark's fences left by a run that could not clean up. The benchmarks' tenant is
    created first if it is missing (the fleet's fences are its own)."""
    await tn.ensure_tenant(pg)
    ids = [r["id"] for r in await pg.fetch("SELECT id FROM fence WHERE deleted_at IS NULL AND owner = $1 "
                                           "AND id LIKE $2", OWNER, tn.qualified(FENCE_PREFIX) + "%")]
    await bm.remove_stored(manager, ids, owner=OWNER)
    return len(ids)


async def bounded(n: int, jobs: Sequence[Callable[[], Any]]) -> list[Any]:
    slots = asyncio.Semaphore(n)

    async def one(job: Callable[[], Any]) -> Any:
        async with slots:
            return await job()

    return await asyncio.gather(*(one(j) for j in jobs))


# --------------------------------------------------------------------------- the cars


class Cars:
    """Publishes one position per car per second, the cars spread over the second."""

    def __init__(self, stack: Stack, fleet: Fleet, rng: np.random.Generator) -> None:
        self.stack, self.fleet = stack, fleet
        n = len(fleet.ids)
        heading = rng.uniform(0, 2 * math.pi, n)
        self.v = np.stack([np.cos(heading), np.sin(heading)], axis=1) * SPEED_M_S  # east, north m/s
        self.first_ts = np.full(n, math.nan)
        self.last_ts = np.full(n, math.nan)  # of the last confirmed position
        self.confirmed = 0
        self.errors: list[str] = []
        self.skipped_ticks = 0  # publishing ticks missed because this process was late
        self.stop = asyncio.Event()

    def where(self, i: int, elapsed: float) -> tuple[float, float]:
        # starts a second ahead of the fence's centre, so the first position moves it
        lon, lat = self.fleet.centre[i]
        d = self.v[i] * (elapsed + 1.0)
        return offset(lon, lat, float(d[0]), float(d[1]))

    async def run(self) -> None:
        n = len(self.fleet.ids)
        groups = [list(range(g, n, TICKS_PER_S)) for g in range(TICKS_PER_S)]
        async with await aio_pika.connect(self.stack.conn["amqp"][t.INGRESS_VHOST], timeout=10) as conn:
            ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
            ex = await ch.get_exchange(t.MQTT_TOPIC_EXCHANGE, ensure=False)
            pending: set[asyncio.Task[None]] = set()

            async def one(i: int, ts: float, lon: float, lat: float) -> None:
                body = orjson.dumps({"lon": lon, "lat": lat, "ts": ts})
                try:
                    await ex.publish(aio_pika.Message(body, content_type="application/json",
                                                      delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                                     f"{t.POSITIONS_TOPIC_PREFIX}.{tn.TENANT}.{self.fleet.cars[i]}",
                                     mandatory=True)
                except Exception as exc:
                    self.errors.append(f"{self.fleet.cars[i]}: {type(exc).__name__}: {exc}")
                    return
                if math.isnan(self.first_ts[i]):
                    self.first_ts[i] = ts
                self.last_ts[i] = max(ts, self.last_ts[i]) if not math.isnan(self.last_ts[i]) else ts
                self.confirmed += 1

            start = time.perf_counter()
            k = 0
            while not self.stop.is_set():
                ahead = start + k / TICKS_PER_S - time.perf_counter()
                if ahead < -1.0 / TICKS_PER_S:  # this process was late: skip, no burst
                    late = int(-ahead * TICKS_PER_S)
                    self.skipped_ticks += late
                    k += late
                elif ahead > 0:
                    with contextlib.suppress(TimeoutError):  # pacing the load, not synchronising
                        await asyncio.wait_for(self.stop.wait(), ahead)
                    if self.stop.is_set():
                        break
                ts = time.time()
                elapsed = time.perf_counter() - start
                for i in groups[k % TICKS_PER_S]:
                    lon, lat = self.where(i, elapsed)
                    task = asyncio.create_task(one(i, ts, lon, lat))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                k += 1
            if pending:
                await asyncio.gather(*pending)
