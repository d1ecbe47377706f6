"""Venue occupancy benchmark (issue 19), on the running local stack:

1. decode: presence-sensor frames decoded per second (fence/venues/sensor_frames.py, legacy
   and v2 mixed, in the sensor sidecar's batches of 5,000). Target >= 1,000,000/s.
2. end to end: simulated sensors publish their reports over MQTT as fast as paho takes them;
   reports/s from the first publish until every report is stored (sensor_report) and every
   hive's status counts them (hive_status). Target >= 5,000/s.
3. reads: `GET /hives/{id}` over HTTP against the API (memcached warm), req/s and latency at
   CONCURRENCY requests in flight; and the same read in this process through the API's own
   code (fence/venues/reads.VenueReads) from memcached and from PostgreSQL, side by side.
   Target >= 3,000 req/s, p99 <= 20 ms.

Figures, not tests: `.venv/bin/python -m bench.venues [--sensors 200] [--reports 50000]`.
It creates hives `bv-<run>-<i>` with one sensor each (no RabbitMQ user: the administrator
publishes for them) and removes them at the end.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: again as a module of bench
    import cli  # type: ignore[import-not-found]  # bench/cli.py, in this file's own folder

    cli.run_as_module(__file__)

import argparse
import asyncio
import threading
import time
import uuid
from typing import Any

import asyncpg
import httpx
import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from bench import report
from deploy.demo.sensors import Faults, SimSensor, simulate
from deploy.settings import load_connection_settings
from exchanges.login_guard import client_id_for
from fence.venues import sensor_frames as sf
from fence.venues.reads import VenueCache, VenueReads

DECODE_TARGET, E2E_TARGET, READ_TARGET, READ_P99_MS = 1_000_000, 5_000, 3_000, 20.0
BATCH = 5000
CONCURRENCY = 32
PUBLISHERS = 4


def bench_decode(n: int) -> dict[str, float]:
    rng = np.random.default_rng(1)
    now = time.gmtime()
    local = (now.tm_year, now.tm_mon, now.tm_mday, now.tm_hour, now.tm_min, now.tm_sec)
    frames, versions, orders = [], [], []
    for i in range(n):
        a, b = (int(x) for x in rng.integers(0, 65524, 2))
        if i % 3 == 2:
            frames.append(sf.encode_v2(i, a, b, local, sf.REPORT_EVENTS, 4))
            versions.append(2)
        else:
            frames.append(sf.encode_legacy(a, b, local, sf.REPORT_EVENTS, "little" if i % 2 else "big",
                                           frame_bytes=59))
            versions.append(1)
        orders.append("little" if i % 2 else "big")
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        decoded = 0
        for at in range(0, n, BATCH):
            got = sf.decode_counters(frames[at:at + BATCH], versions[at:at + BATCH], orders[at:at + BATCH])
            decoded += len(got)
        best = max(best, decoded / (time.perf_counter() - t0))
    return {"frames": float(n), "frames/s": best}


class Publishers:
    def __init__(self, conn: Any, run: str) -> None:
        m = dict(conn["mqtt"])
        self.clients = []
        self.acked = 0
        self.lock = threading.Lock()
        up = threading.Semaphore(0)
        for k in range(PUBLISHERS):
            user = m["username"].split(":", 1)[1]
            c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id_for(user, f"bv-{run}-{k}"),
                            protocol=mqtt.MQTTv311)
            c.username_pw_set(f"{m['ingress_vhost']}:{user}", m["password"])
            c.max_inflight_messages_set(1000)
            c.max_queued_messages_set(0)
            c.on_connect = lambda *a: up.release()
            c.on_publish = lambda *a: self._ack()
            c.connect(m["host"], m["port"], keepalive=30)
            c.loop_start()
            self.clients.append(c)
        for _ in self.clients:
            if not up.acquire(timeout=20):
                raise RuntimeError("MQTT connection not accepted")

    def _ack(self) -> None:
        with self.lock:
            self.acked += 1

    def close(self) -> None:
        for c in self.clients:
            c.disconnect()
            c.loop_stop()


async def bench_e2e(pg: asyncpg.Connection, conn: Any, run: str, sensors: int, reports: int
                    ) -> dict[str, float]:
    hours = 24.0
    per_sensor = max(1, reports // sensors)
    sent_all: list[tuple[str, str, bytes]] = []
    truth: dict[str, tuple[int, int]] = {}
    now = time.time()
    for i in range(sensors):
        sid = f"bv-{run}-{i}-s"
        sim = SimSensor(sid, ("restaurant", "bar", "shop")[i % 3], version=1 + i % 2, tz="Europe/Vaduz",
                        scale=per_sensor * 5 / hours / 1.2, faults=Faults(duplicate=0.02))
        sent, t = simulate(sim, now - hours * 3600 - 60, hours, seed=i)
        sent_all += [(sid, s.topic, s.frame) for s in sent]
        truth[sid] = (t.entries, t.exits)
    distinct = len({(s, f) for s, _, f in sent_all})
    pubs = Publishers(conn, run)
    progress = report.Progress("e2e", distinct)
    t0 = time.perf_counter()
    try:
        for k, (sid, topic, frame) in enumerate(sent_all):
            pubs.clients[hash(sid) % PUBLISHERS].publish(f"sensors/{sid}/{topic}", frame, qos=1)
            if k % 2000 == 0:
                progress.show(f"published {k:,}/{len(sent_all):,}")
        published_s = time.perf_counter() - t0
        stored = 0
        while True:
            stored = int(await pg.fetchval("SELECT count(*) FROM sensor_report WHERE sensor_id LIKE $1",
                                           f"bv-{run}-%"))
            progress.update(stored)
            if stored >= distinct:
                break
            if time.perf_counter() - t0 > 600:
                report.warn(f"only {stored:,} of {distinct:,} reports stored after 600 s")
                break
            await asyncio.sleep(0.05)
        stored_s = time.perf_counter() - t0
        want_e = sum(e for e, _ in truth.values())
        while True:  # hive_status counts them (the same transaction; a last check)
            got = await pg.fetchval("SELECT coalesce(sum(entries), 0) FROM hive_status WHERE hive_id LIKE $1",
                                    f"bv-{run}-%")
            got_r = await pg.fetchval("SELECT coalesce(sum(entries), 0) FROM sensor_report "
                                      "WHERE sensor_id LIKE $1", f"bv-{run}-%")
            if got_r == want_e or time.perf_counter() - t0 > 600:
                break
            await asyncio.sleep(0.05)
    finally:
        progress.close()
        pubs.close()
    return {"reports": float(distinct), "published (s)": published_s, "stored (s)": stored_s,
            "reports/s": distinct / stored_s, "entries stored": float(got_r), "entries truth": float(want_e),
            "today's entries in hive_status": float(got)}


async def _get(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, path: str
               ) -> tuple[int, bytes]:
    """One GET on a kept-alive HTTP/1.1 connection (a load generator light enough not to be the
    bottleneck: httpx costs more CPU per request than the server)."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return status, await reader.readexactly(length)


async def bench_reads(conn: Any, pool: asyncpg.Pool, hive_ids: list[str], n: int
                      ) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    lat: list[float] = []
    api = httpx.URL(str(conn["api"]))
    host = f"{api.host}:{api.port}"
    for hid in hive_ids[:50]:  # warm the cache
        async with httpx.AsyncClient(base_url=str(api), timeout=10) as client:
            await client.get(f"/hives/{hid}")

    async def worker(k: int) -> None:
        reader, writer = await asyncio.open_connection(api.host, api.port)
        try:
            for i in range(k, n, CONCURRENCY):
                t = time.perf_counter()
                status, body = await _get(reader, writer, host, f"/hives/{hive_ids[i % len(hive_ids)]}")
                lat.append((time.perf_counter() - t) * 1000)
                if status != 200:
                    raise RuntimeError(f"GET /hives: {status} {body[:100]!r}")
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(CONCURRENCY)))
    dt = time.perf_counter() - t0
    out["HTTP GET /hives/{id} (memcached)"] = {"req/s": n / dt, "p50 (ms)": report.pct(lat, 50),
                                                "p99 (ms)": report.pct(lat, 99)}
    mc = dict(conn["memcached"])
    cache = VenueCache(f"memcache://{mc['host']}:{mc['port']}")
    for label, reads in (("in process, memcached", VenueReads(pool, cache, local_status_s=0.0)),
                         ("in process, PostgreSQL", VenueReads(pool, None, local_status_s=0.0))):
        lat2: list[float] = []
        m = n // 2

        async def reader(k: int, reads: VenueReads = reads, lat2: list[float] = lat2, m: int = m) -> None:
            for i in range(k, m, CONCURRENCY):
                t = time.perf_counter()
                got = await reads.hive(hive_ids[i % len(hive_ids)], time.time())
                lat2.append((time.perf_counter() - t) * 1000)
                if got is None:
                    raise RuntimeError("a hive went missing")

        await reads.hive(hive_ids[0], time.time())
        t0 = time.perf_counter()
        await asyncio.gather(*(reader(k) for k in range(CONCURRENCY)))
        dt = time.perf_counter() - t0
        out[label] = {"req/s": m / dt, "p50 (ms)": report.pct(lat2, 50), "p99 (ms)": report.pct(lat2, 99)}
    await cache.close()
    return out


async def amain(args: argparse.Namespace) -> int:
    conn = load_connection_settings()
    run = uuid.uuid4().hex[:6]
    dec = bench_decode(args.frames)
    print(f"decode: {dec['frames/s']:,.0f} frames/s ({args.frames:,} frames, batches of {BATCH:,}); "
          f"target {DECODE_TARGET:,}/s: {report.times(report.ratio(dec['frames/s'], DECODE_TARGET))}")
    pg = await asyncpg.connect(conn["postgres"]["dsn"])
    pool = await asyncpg.create_pool(conn["postgres"]["dsn"], min_size=2, max_size=8)
    hive_ids = [f"bv-{run}-{i}" for i in range(args.sensors)]
    try:
        await pg.executemany("INSERT INTO hive (id, name, type, lon, lat, tz, capacity) VALUES "
                             "($1, $2, 'bar', $3, $4, 'Europe/Vaduz', 100)",
                             [(h, f"Bench venue {i}", 9.5 + i * 1e-4, 47.1) for i, h in enumerate(hive_ids)])
        await pg.executemany("INSERT INTO sensor (id, hive_id) VALUES ($1, $2)",
                             [(f"{h}-s", h) for h in hive_ids])
        e2e = await bench_e2e(pg, conn, run, args.sensors, args.reports)
        print(report.table(["end to end", ""], [(k, f"{v:,.1f}") for k, v in e2e.items()]))
        reads = await bench_reads(conn, pool, hive_ids, args.requests)
        rows = [(k, f"{v['req/s']:,.0f}", f"{v['p50 (ms)']:.2f}", f"{v['p99 (ms)']:.2f}")
                for k, v in reads.items()]
        print(report.table(["read", "req/s", "p50 (ms)", "p99 (ms)"], rows))
        http = reads["HTTP GET /hives/{id} (memcached)"]
        cached, direct = reads["in process, memcached"], reads["in process, PostgreSQL"]
        exact = e2e["entries stored"] == e2e["entries truth"]
        ok = (dec["frames/s"] >= DECODE_TARGET and e2e["reports/s"] >= E2E_TARGET
              and http["req/s"] >= READ_TARGET and http["p99 (ms)"] <= READ_P99_MS and exact)
        x = report.times
        r = report.ratio
        print(report.summary([
            f"decode {dec['frames/s']:,.0f} frames/s ({x(r(dec['frames/s'], DECODE_TARGET))} target)",
            f"end to end {e2e['reports/s']:,.0f} reports/s ({x(r(e2e['reports/s'], E2E_TARGET))} target), "
            f"entries {'exact' if exact else 'WRONG'}",
            f"GET /hives/{{id}} {http['req/s']:,.0f} req/s p99 {http['p99 (ms)']:.1f} ms "
            f"({x(r(http['req/s'], READ_TARGET))} target)",
            f"memcached vs PostgreSQL in process {cached['req/s']:,.0f} vs {direct['req/s']:,.0f} req/s "
            f"({x(r(cached['req/s'], direct['req/s']))} PostgreSQL)"],
            "OK" if ok else "SHORT"))
    finally:
        await pg.execute("DELETE FROM sensor_report WHERE sensor_id LIKE $1", f"bv-{run}-%")
        await pg.execute("DELETE FROM sensor WHERE id LIKE $1", f"bv-{run}-%")
        await pg.execute("DELETE FROM hive_status WHERE hive_id LIKE $1", f"bv-{run}-%")
        await pg.execute("DELETE FROM hive_day WHERE hive_id LIKE $1", f"bv-{run}-%")
        await pg.execute("DELETE FROM hive WHERE id LIKE $1", f"bv-{run}-%")
        await pg.close()
        await pool.close()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=500_000, help="frames for the decode figure")
    ap.add_argument("--sensors", type=int, default=200)
    ap.add_argument("--reports", type=int, default=50_000, help="reports in all (about)")
    ap.add_argument("--requests", type=int, default=20_000)
    return asyncio.run(amain(ap.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
