"""The broker modes of bench/e2e.py: the workload through the running pipeline (`geofence up`):
gateway batches over AMQP, or one MQTT message per update, events read back from
`fence.events`, compared with the shapely reference, latency per event from the publish of
the update that caused it to the event's receipt.

Fences go in through the production path (fence.manager: covering, PostgreSQL, control
messages) with ids unique to the run, and are removed at the end; objects get run-unique ids
too, so runs never see each other's state. Timestamps are the workload's rounds shifted to
now (the fences' timeout is a week, so nothing times out during a run).
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import aio_pika
import msgpack
import numpy as np
import orjson
import workload as wl

from deploy.local_stack import ConnectionSettings, Settings, load_connection_settings
from exchanges import topology as t
from fence.manager import FenceManager
from fence.spec import FenceSpec

TIMEOUT_S = 7 * 86400.0
DRAIN_DEADLINE_S = 180.0


@dataclass
class BrokerRun:
    mode: str
    fences: int
    objects: int
    updates: int
    rate: float | None  # updates/s asked for (None: as fast as possible)
    setup_s: float = 0.0
    publish_s: float = 0.0  # first publish -> last publish confirmed
    total_s: float = 0.0  # first publish -> last expected event received
    events: list[wl.EventTuple] = field(default_factory=list)
    latency_ms: np.ndarray = field(default_factory=lambda: np.empty(0))
    reference: list[wl.EventTuple] = field(default_factory=list)  # renamed, shifted to now

    @property
    def updates_per_s(self) -> float:
        return self.updates / self.total_s if self.total_s else 0.0

    def pct(self, q: float) -> float:
        return float(np.percentile(self.latency_ms, q)) if self.latency_ms.size else float("nan")


def renamed(fences: Sequence[wl.Fence], stream: wl.Stream, run: str) -> tuple[list[wl.Fence], wl.Stream]:
    fs = [dataclasses.replace(f, fence_id=f"b{run}-{f.fence_id}") for f in fences]
    st = dataclasses.replace(stream, object_ids=[f"b{run}-{o}" for o in stream.object_ids])
    return fs, st


def update_index(stream: wl.Stream) -> dict[tuple[str, float], int]:
    """(object id, ts) -> position in the stream (an object has one update per ts)."""
    names = stream.object_ids
    return {(names[o], ts): i for i, (o, ts) in enumerate(zip(stream.obj.tolist(), stream.ts.tolist(),
                                                            strict=True))}


# --------------------------------------------------------------------------- fences


async def put_fences(conn: ConnectionSettings, fences: Sequence[wl.Fence], parallel: int = 4) -> None:
    settings = Settings.from_env()
    amqp = conn["users"][t.MANAGER_USER][t.region_vhost(settings.regions[0])]

    async def worker(part: Sequence[wl.Fence]) -> None:
        async with FenceManager(amqp, conn["postgres"]["dsn"], settings.regions, settings.workers) as m:
            for f in part:
                await m.put(FenceSpec(f.fence_id, f.geometry, timeout_s=TIMEOUT_S), create=True)
            await m.applied(timeout=300)

    await asyncio.gather(*(worker(fences[i::parallel]) for i in range(parallel)))


async def remove_fences(conn: ConnectionSettings, fences: Sequence[wl.Fence], parallel: int = 4) -> None:
    settings = Settings.from_env()
    amqp = conn["users"][t.MANAGER_USER][t.region_vhost(settings.regions[0])]

    async def worker(part: Sequence[wl.Fence]) -> None:
        async with FenceManager(amqp, conn["postgres"]["dsn"], settings.regions, settings.workers) as m:
            for f in part:
                await m.remove(f.fence_id)

    await asyncio.gather(*(worker(fences[i::parallel]) for i in range(parallel)))


# --------------------------------------------------------------------------- events


class EventSink:
    """fence.events -> the run's events with their receipt time."""

    def __init__(self, conn: ConnectionSettings, prefix: str) -> None:
        self.url, self.prefix = conn["amqp"][t.FENCES_VHOST], prefix
        self.got: list[tuple[wl.EventTuple, float]] = []
        self.arrived = asyncio.Event()
        self.want = 0

    async def start(self) -> None:
        self.conn = await aio_pika.connect(self.url)
        ch = await self.conn.channel()
        await ch.set_qos(prefetch_count=5000)
        self.queue = await ch.declare_queue("", exclusive=True)
        await self.queue.bind(t.EVENTS_EXCHANGE, "#")
        await self.queue.consume(self._on_event, no_ack=True)

    async def _on_event(self, m: aio_pika.abc.AbstractIncomingMessage) -> None:
        e = orjson.loads(m.body)
        # this run's fences and objects: a fence defined here also sees objects of earlier
        # runs still inside it (not timed out), and says so (ENTER at its definition)
        if e["fence_id"].startswith(self.prefix) and e["object_id"].startswith(self.prefix):
            self.got.append(((e["event"], e["fence_id"], e["object_id"], e["ts"], e["reason"]), time.time()))
            if self.want and len(self.got) >= self.want:
                self.arrived.set()

    async def wait(self, n: int, deadline: float) -> bool:
        self.want = n
        if len(self.got) >= n:
            return True
        try:
            await asyncio.wait_for(self.arrived.wait(), deadline)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        await self.conn.close()


# --------------------------------------------------------------------------- intakes


def gateway_bodies(stream: wl.Stream, batch: int) -> list[tuple[int, int, bytes]]:
    """(first update, end, msgpack body) per gateway message."""
    out = []
    for c in stream.chunks(batch):
        cols = zip(c.ids, c.lon.tolist(), c.lat.tolist(), c.ts.tolist(), strict=True)
        positions = [{"id": i, "lon": lo, "lat": la, "ts": ts} for i, lo, la, ts in cols]
        out.append((c.start, c.start + len(c), msgpack.packb({"positions": positions})))
    return out


async def publish_gateway(conn: ConnectionSettings, bodies: Sequence[tuple[int, int, bytes]],
                          sent_at: np.ndarray, rate: float | None, window: int = 16) -> None:
    """Gateway batches with confirms, `window` in flight; paced to `rate` updates/s if given."""
    url = conn["users"][t.GATEWAY_USER][t.INGRESS_VHOST]
    async with await aio_pika.connect(url) as c:
        ch = await c.channel(publisher_confirms=True, on_return_raises=True)
        ex = await ch.get_exchange(t.BATCHES_EXCHANGE, ensure=False)
        sem = asyncio.Semaphore(window)
        start = time.perf_counter()

        async def one(lo: int, hi: int, body: bytes) -> None:
            try:
                sent_at[lo:hi] = time.time()
                await ex.publish(aio_pika.Message(body, content_type="application/msgpack",
                                                  delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "")
            finally:
                sem.release()

        tasks = []
        for lo, hi, body in bodies:
            if rate:
                ahead = lo / rate - (time.perf_counter() - start)
                if ahead > 0:
                    await asyncio.sleep(ahead)  # pacing the load, not synchronising
            await sem.acquire()
            tasks.append(asyncio.create_task(one(lo, hi, body)))
        await asyncio.gather(*tasks)


def _mqtt_publisher(args: tuple[dict[str, object], list[int], list[str], list[bytes], float | None,
                                float, mp.Queue]) -> None:  # type: ignore[type-arg]
    """One paho client (a process): its objects' updates in stream order, QoS 1."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    cfg, index, topics, payloads, rate, t_start, out = args
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-{uuid.uuid4().hex[:8]}",
                         protocol=mqtt.MQTTv311)
    client.username_pw_set(str(cfg["username"]), str(cfg["password"]))
    client.max_inflight_messages_set(2000)
    client.max_queued_messages_set(0)
    client.connect(str(cfg["host"]), int(str(cfg["port"])), keepalive=60)
    client.loop_start()
    sent = np.empty(len(index))
    infos = []
    while time.time() < t_start:
        time.sleep(0.001)
    start = time.perf_counter()
    for k, (i, topic, payload) in enumerate(zip(index, topics, payloads, strict=True)):
        if rate:
            ahead = i / rate - (time.perf_counter() - start)
            if ahead > 0:
                time.sleep(ahead)
        sent[k] = time.time()
        infos.append(client.publish(topic, payload, qos=1))
    for info in infos:
        info.wait_for_publish(timeout=120)
    client.disconnect()
    client.loop_stop()
    out.put((index, sent))


def publish_mqtt(conn: ConnectionSettings, stream: wl.Stream, sent_at: np.ndarray, rate: float | None,
                 clients: int) -> None:
    cfg = {"host": conn["mqtt"]["host"], "port": conn["mqtt"]["port"],
           "username": f"{t.INGRESS_VHOST}:{t.ADMIN_USER}", "password": conn["mqtt"]["password"]}
    names = stream.object_ids
    part = stream.obj % clients  # an object always goes through the same client (its order)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    t_start = time.time() + 1.0
    jobs = []
    for p in range(clients):
        idx = np.flatnonzero(part == p).tolist()
        topics = [f"positions/{names[stream.obj[i]]}" for i in idx]
        payloads = [orjson.dumps({"lon": float(stream.lon[i]), "lat": float(stream.lat[i]),
                                  "ts": float(stream.ts[i])}) for i in idx]
        jobs.append(ctx.Process(target=_mqtt_publisher,
                                args=((cfg, idx, topics, payloads, rate, t_start, out),)))
    for j in jobs:
        j.start()
    for _ in jobs:
        idx, sent = out.get(timeout=600)
        sent_at[np.asarray(idx, dtype=np.int64)] = sent
    for j in jobs:
        j.join(timeout=60)


# --------------------------------------------------------------------------- a run


async def run(mode: str, fences: Sequence[wl.Fence], stream: wl.Stream, reference: Sequence[wl.EventTuple],
              batch: int, rate: float | None, clients: int = 2, say: object = print) -> BrokerRun:
    conn = load_connection_settings()
    run_id = uuid.uuid4().hex[:6]
    fs, st = renamed(fences, stream, run_id)
    shift = time.time() - float(stream.ts.min())  # the rounds, now
    st = dataclasses.replace(st, ts=st.ts + shift)
    rename_f = {f.fence_id: g.fence_id for f, g in zip(fences, fs, strict=True)}
    rename_o = dict(zip(stream.object_ids, st.object_ids, strict=True))
    ref = sorted((e, rename_f[f], rename_o[o], ts + shift, r) for e, f, o, ts, r in reference)
    result = BrokerRun(mode, len(fs), len(st.object_ids), len(st), rate)

    t0 = time.perf_counter()
    await put_fences(conn, fs)
    result.setup_s = time.perf_counter() - t0
    sink = EventSink(conn, f"b{run_id}-")
    await sink.start()
    sent_at = np.zeros(len(st))
    try:
        bodies = gateway_bodies(st, batch) if mode == "amqp" else []
        t0 = time.perf_counter()
        if mode == "amqp":
            await publish_gateway(conn, bodies, sent_at, rate)
        else:
            await asyncio.to_thread(publish_mqtt, conn, st, sent_at, rate, clients)
            t0 = float(sent_at.min()) - time.time() + time.perf_counter()
        result.publish_s = time.perf_counter() - t0
        complete = await sink.wait(len(ref), DRAIN_DEADLINE_S)
        last = max((r for _, r in sink.got), default=time.time())
        result.total_s = max(last - (time.time() - (time.perf_counter() - t0)), result.publish_s)
        if not complete:
            print(f"  ! {len(sink.got)} of {len(ref)} events within {DRAIN_DEADLINE_S:g}s", file=sys.stderr)
    finally:
        await sink.close()
        await remove_fences(conn, fs)
    result.events = [e for e, _ in sink.got]
    where = update_index(st)
    lat = [(recv - sent_at[where[(e[2], e[3])]]) * 1000.0 for e, recv in sink.got if (e[2], e[3]) in where]
    result.latency_ms = np.asarray(lat)
    result.reference = ref
    return result
