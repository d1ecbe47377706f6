"""The broker modes of bench/e2e.py: the workload through the running pipeline (`geofence up`):
gateway batches over AMQP, or one MQTT message per update, events read back from
`fence.event-batches`, compared with the shapely reference, latency per event from the publish
of the update that caused it to the event's receipt.

Everything is the benchmarks' tenant's (bench/tenant.py): fences go in through the production
path (fence.manager: covering, PostgreSQL, control messages) with ids unique to the run,
qualified `bench:b<run>-<id>`, and are removed at the end; objects get run-unique names too
(`b<run>-<id>`, `bench:b<run>-<id>` inside the pipeline), so runs never see each other's state.
The positions go through a gateway user of the tenant made for the run (removed at the end):
batches to `ingress.gateway` with the tenant as routing key, or MQTT `positions/bench/<id>`.
The events carry the tenant and the names unqualified; they are qualified again before the
comparison, against a reference named as the pipeline names things. Timestamps are the
workload's rounds shifted to now (the fences' timeout is a week, so nothing times out during a
run).

Two things keep runs from measuring each other (or anyone's earlier runs):
- before publishing, `wait_idle` waits (at most IDLE_TIMEOUT_S) until the pipeline's queues
  have been empty for IDLE_SETTLE_S: a backlog left by an earlier run, or the ENTER events of
  this run's fence definitions, is not timed as this run's;
- after the run (untimed, events no longer read), `park` moves every object of the run to a
  spot outside the workload's box, once into every region, so each crossing's handover notice
  tells every x-fence worker: objects stay known to x-fence (recent for a week), and without
  this every later run's fences, defined over the same box, ENTER (and at their removal
  LEAVE) all of them: tens of thousands of events per run that the later run would time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing as mp
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

import aio_pika
import msgpack
import numpy as np
import orjson

import hilbert_c as hk
from bench import mqtt_load, report
from bench import tenant as tn
from bench import workload as wl
from deploy.rabbitmq import apply as rabbit
from deploy.settings import ConnectionSettings, Settings, load_connection_settings, load_secrets
from exchanges import routing_store
from exchanges import topology as t
from exchanges.fence_binding import INDEX_BITS
from exchanges.tenancy import qualify
from exchanges.worldmap import AREA
from fence import store
from fence.manager import FenceManager
from fence.spec import FenceSpec

TIMEOUT_S = 7 * 86400.0
DRAIN_DEADLINE_S = 180.0
GRACE_S = 1.0  # listening on after the last expected event
TICK_S = 0.5
IDLE_TIMEOUT_S = 300.0  # longest wait for the pipeline to drain before a run
IDLE_SETTLE_S = 6.0  # empty queues for this long: the management figures lag up to 5 s
PARK_MARGIN_M = 2_000.0  # parking spots are this far outside the workload's box

ProgressFn = Callable[[str, int, int], None]  # (phase, done, total): fences, publish, events


@dataclass
class Status:
    """Where a run is, for a progress display: `count()` of `total` in `phase`."""

    phase: str = "fences"
    total: int = 0
    count: Callable[[], int] = lambda: 0

    def to(self, progress: ProgressFn) -> Callable[[], None]:
        """A call that tells progress where the run is now."""
        return lambda: progress(self.phase, self.count(), self.total)


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
    idle_wait_s: float = 0.0  # waiting for the pipeline to drain before publishing
    backlog: int = 0  # the largest pipeline backlog seen then (messages; -1: unknown)
    parked: int = 0  # parking updates sent after the run
    arrivals: np.ndarray = field(default_factory=lambda: np.empty(0))  # each event's receipt (time.time())
    duplicates: int = 0  # raw deliveries of an event_id already received (dropped before the check)

    @property
    def updates_per_s(self) -> float:
        return self.updates / self.total_s if self.total_s else 0.0

    def pct(self, q: float) -> float:
        return report.pct(self.latency_ms, q)


def run_prefix(run: str) -> str:
    """The names of a run's fences and objects start with this (unqualified)."""
    return f"b{run}-"


def renamed(fences: Sequence[wl.Fence], stream: wl.Stream, run: str) -> tuple[list[wl.Fence], wl.Stream]:
    """The run's fences, ids qualified as stored (`bench:b<run>-<id>`), and its stream, objects
    named as published (`b<run>-<id>`: x-ingress qualifies them by the gateway's tenant)."""
    fs = [dataclasses.replace(f, fence_id=tn.qualified(f"{run_prefix(run)}{f.fence_id}")) for f in fences]
    st = dataclasses.replace(stream, object_ids=[f"{run_prefix(run)}{o}" for o in stream.object_ids])
    return fs, st


def update_index(stream: wl.Stream, tenant: str = "") -> dict[tuple[str, float], int]:
    """(object id, ts) -> position in the stream (an object has one update per ts); the object
    ids qualified by `tenant` (as the events name them once qualified again)."""
    names = [qualify(tenant, o) for o in stream.object_ids]
    return {(names[o], ts): i for i, (o, ts) in enumerate(zip(stream.obj.tolist(), stream.ts.tolist(),
                                                            strict=True))}


# --------------------------------------------------------------------------- fences


def fence_manager(conn: ConnectionSettings, settings: Settings | None = None) -> FenceManager:
    """A FenceManager of the local stack (settings: Settings.from_env()), as the fence-manager
    user on the first region's vhost."""
    settings = settings or Settings.from_env()
    amqp = conn["users"][t.MANAGER_USER][t.region_vhost(settings.regions[0])]
    return FenceManager(amqp, conn["postgres"]["dsn"], settings.regions, settings.workers)


async def in_parallel(conn: ConnectionSettings, fences: Sequence[wl.Fence], parallel: int,
                      job: Callable[[FenceManager, Sequence[wl.Fence]], Awaitable[None]]) -> None:
    """job(manager, part) for `parallel` parts of the fences at once, each with a manager of its own."""
    settings = Settings.from_env()

    async def worker(part: Sequence[wl.Fence]) -> None:
        async with fence_manager(conn, settings) as m:
            await job(m, part)

    await asyncio.gather(*(worker(fences[i::parallel]) for i in range(parallel)))


async def put_fences(conn: ConnectionSettings, fences: Sequence[wl.Fence], parallel: int = 4,
                     done: list[int] | None = None) -> None:
    """done[0] counts the fences stored (for a progress display). Their ids are qualified: the
    benchmarks' tenant is created first if it is missing."""
    done = done if done is not None else [0]
    await tn.ensure_tenant(conn["postgres"]["dsn"])

    async def put(m: FenceManager, part: Sequence[wl.Fence]) -> None:
        for f in part:
            await m.put(FenceSpec(fence_id=f.fence_id, geometry=f.geometry, timeout_s=TIMEOUT_S), create=True)
            done[0] += 1
        await m.applied(timeout=300)

    await in_parallel(conn, fences, parallel, put)


async def remove_stored(m: FenceManager, ids: Iterable[str], owner: str | None = None) -> None:
    """Remove these fences, passing over those not stored (never put: a run failed early; or
    already removed)."""
    for fid in ids:
        with contextlib.suppress(store.UnknownFence):
            await m.remove(fid, owner=owner)


async def remove_fences(conn: ConnectionSettings, fences: Sequence[wl.Fence], parallel: int = 4) -> None:
    async def remove(m: FenceManager, part: Sequence[wl.Fence]) -> None:
        await remove_stored(m, [f.fence_id for f in part])

    await in_parallel(conn, fences, parallel, remove)


# --------------------------------------------------------------------------- events


class EventSink:
    """fence.event-batches (every event, one message per x-fence batch: the consumer of
    everything, as Tile38's PSUBSCRIBE * is) -> the run's events with their receipt time, the
    ids qualified again by the events' tenant (bench/tenant.py). Delivery is at least once:
    an event_id seen before is a raw duplicate, counted and dropped (as a consumer does), so
    that the check against the reference is of distinct events."""

    def __init__(self, conn: ConnectionSettings, prefix: str) -> None:
        self.url, self.prefix = conn["amqp"][t.FENCES_VHOST], prefix
        self.got: list[tuple[wl.EventTuple, float]] = []
        self.ids: set[str] = set()
        self.duplicates = 0
        self.arrived = asyncio.Event()
        self.want = 0
        self.conn: aio_pika.abc.AbstractConnection | None = None

    async def start(self) -> None:
        self.conn = await aio_pika.connect(self.url)
        ch = await self.conn.channel()
        await ch.set_qos(prefetch_count=5000)
        self.queue = await ch.declare_queue("", exclusive=True)
        await self.queue.bind(t.EVENT_BATCHES_EXCHANGE, "")
        await self.queue.consume(self._on_events, no_ack=True)

    async def _on_events(self, m: aio_pika.abc.AbstractIncomingMessage) -> None:
        now, prefix = time.time(), self.prefix
        # this run's fences and objects: a fence defined here also sees objects of earlier
        # runs still inside it (not timed out), and says so (ENTER at its definition)
        for e, event_id in tn.run_events_with_ids(orjson.loads(m.body), prefix):
            if event_id is not None:
                if event_id in self.ids:
                    self.duplicates += 1
                    continue
                self.ids.add(event_id)
            self.got.append((e, now))
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
        if self.conn is not None:
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
                          sent_at: np.ndarray, rate: float | None, window: int = 16,
                          confirmed: list[int] | None = None, gateway: tn.Gateway | None = None) -> None:
    """Gateway batches with confirms, `window` in flight; paced to `rate` updates/s if given.
    confirmed[0] counts the updates confirmed (for a progress display). `gateway`: the run's
    gateway user (bench/tenant.py; None: one made for this call and removed after it)."""
    confirmed = confirmed if confirmed is not None else [0]
    async with tn.run_gateway(gateway) as gw, await aio_pika.connect(gw.amqp_url) as c:
        ch = await c.channel(publisher_confirms=True, on_return_raises=True)
        ex = await ch.get_exchange(t.GATEWAY_EXCHANGE, ensure=False)
        key = gw.routing_key
        sem = asyncio.Semaphore(window)
        start = time.perf_counter()

        async def one(lo: int, hi: int, body: bytes) -> None:
            try:
                sent_at[lo:hi] = time.time()
                await ex.publish(aio_pika.Message(body, content_type="application/msgpack",
                                                  delivery_mode=aio_pika.DeliveryMode.PERSISTENT), key)
                confirmed[0] += hi - lo
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
                                float, mp.Queue, object, bool]) -> None:  # type: ignore[type-arg]
    """One MQTT client (a process): its objects' updates in stream order, QoS 1; adds what it
    has handed over to the shared counter `sent_count` (every 256 messages with paho). The
    lean publisher (bench/mqtt_load.py) unless `paho`."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    from exchanges.login_guard import client_id_for

    cfg, index, topics, payloads, rate, t_start, out, sent_count, paho = args
    user = str(cfg["username"]).split(":", 1)[-1]
    me = client_id_for(user, f"bench-{uuid.uuid4().hex[:8]}")
    if not paho:
        sent_lean = mqtt_load.run(cfg, me, index, topics, payloads, rate, t_start)
        with sent_count.get_lock():  # type: ignore[attr-defined]
            sent_count.value += len(index)  # type: ignore[attr-defined]
        out.put((index, sent_lean))
        return
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=me, protocol=mqtt.MQTTv311)
    client.username_pw_set(str(cfg["username"]), str(cfg["password"]))
    if cfg.get("ca"):  # MQTTS (bench.e2e --tls)
        client.tls_set(ca_certs=str(cfg["ca"]))
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
        if k % 256 == 255:
            with sent_count.get_lock():  # type: ignore[attr-defined]
                sent_count.value += 256  # type: ignore[attr-defined]
    with sent_count.get_lock():  # type: ignore[attr-defined]
        sent_count.value += len(index) % 256  # type: ignore[attr-defined]
    for info in infos:
        info.wait_for_publish(timeout=120)
    client.disconnect()
    client.loop_stop()
    out.put((index, sent))


def publish_mqtt(gateway: tn.Gateway, stream: wl.Stream, sent_at: np.ndarray, rate: float | None,
                 clients: int, sent_count: object | None = None, paho: bool = False) -> None:
    """Every update as MQTT `positions/<tenant>/<object>`, logged in as the run's gateway user
    (bench/tenant.py: it may publish any of its tenant's objects). sent_count: a
    multiprocessing Value("q") of the fork context counting the updates handed to the clients
    (for a progress display), or None."""
    publish_mqtt_as(gateway.mqtt(), f"{t.POSITIONS_TOPIC_PREFIX}/{tn.TENANT}", stream, sent_at, rate, clients,
                    sent_count, paho)


def publish_mqtt_as(cfg: dict[str, object], prefix: str, stream: wl.Stream, sent_at: np.ndarray,
                    rate: float | None, clients: int, sent_count: object | None = None,
                    paho: bool = False) -> None:
    """publish_mqtt with a paho login of its own (`cfg` as Gateway.mqtt() has it) on topics
    `<prefix>/<object>` (bench/mqtt_baseline.py: the bare broker's run)."""
    names = stream.object_ids
    part = stream.obj % clients  # an object always goes through the same client (its order)
    ctx = mp.get_context("fork")
    sent_count = sent_count if sent_count is not None else ctx.Value("q", 0)
    out = ctx.Queue()
    t_start = time.time() + 1.0
    jobs = []
    for p in range(clients):
        idx = np.flatnonzero(part == p).tolist()
        topics = [f"{prefix}/{names[stream.obj[i]]}" for i in idx]
        payloads = [orjson.dumps({"lon": float(stream.lon[i]), "lat": float(stream.lat[i]),
                                  "ts": float(stream.ts[i])}) for i in idx]
        jobs.append(ctx.Process(target=_mqtt_publisher,
                                args=((cfg, idx, topics, payloads, rate, t_start, out, sent_count, paho),)))
    for j in jobs:
        j.start()
    for _ in jobs:
        idx, sent = out.get(timeout=600)
        sent_at[np.asarray(idx, dtype=np.int64)] = sent
    for j in jobs:
        j.join(timeout=60)


# --------------------------------------------------------------------------- between runs


PIPELINE_QUEUES = ("x-", "federation:")  # the sidecars' queues and the federation links'


def pipeline_backlog() -> int:
    """Messages (ready and unacknowledged) in the pipeline's queues, from the management API."""
    settings = Settings.from_env()
    mgmt = rabbit.management(settings, load_secrets(settings))
    queues = mgmt.get("api/queues?columns=vhost,name,messages,type")
    return sum(int(q.get("messages") or 0) for q in queues  # a stream keeps what it was sent: no backlog
               if str(q.get("name", "")).startswith(PIPELINE_QUEUES) and q.get("type") != "stream")


async def wait_idle(timeout: float = IDLE_TIMEOUT_S, settle: float = IDLE_SETTLE_S,
                    backlog: list[int] | None = None) -> tuple[float, int]:
    """Until the pipeline's queues were empty for `settle` seconds, at most `timeout`:
    (seconds waited, the largest backlog seen; -1 without the management API).
    backlog[0] is the last figure (for a progress display)."""
    backlog = backlog if backlog is not None else [0]
    t0 = time.perf_counter()
    quiet_since: float | None = None
    most = 0
    while True:
        try:
            n = await asyncio.to_thread(pipeline_backlog)
        except Exception as exc:  # no management API: go on without waiting
            report.warn(f"pipeline backlog unknown ({type(exc).__name__}: {exc})")
            return time.perf_counter() - t0, -1
        backlog[0], most = n, max(most, n)
        now = time.perf_counter()
        if n:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        if (quiet_since is not None and now - quiet_since >= settle) or now - t0 >= timeout:
            return now - t0, most
        await asyncio.sleep(0.5)


async def parking_spots(conn: ConnectionSettings, box: wl.Box = wl.DEFAULT_BOX,
                        margin_m: float = PARK_MARGIN_M) -> list[tuple[float, float]]:
    """One point per region of the stored worldmap, in the local stack's AREA and margin_m
    outside the box (so outside every fence of the workload), the farthest from the box."""
    wm = await routing_store.read_worldmap(conn["postgres"]["dsn"])
    if wm is None:
        return []
    x0, y0, x1, y1 = AREA
    lon, lat = (a.ravel() for a in np.meshgrid(np.linspace(x0, x1, 61), np.linspace(y0, y1, 61)))
    b0, c0, b1, c1 = box.bounds
    dx = np.maximum(np.maximum(b0 - lon, lon - b1), 0.0) * box.m_per_deg_lon
    dy = np.maximum(np.maximum(c0 - lat, lat - c1), 0.0) * box.m_per_deg_lat
    away = np.hypot(dx, dy)
    gx, gy = hk.lonlat_to_grid(lon, lat, INDEX_BITS)
    region = wm.region_index(hk.encode_many(gx, gy, INDEX_BITS))
    spots = []
    for r in range(len(wm.regions)):
        ok = np.flatnonzero((region == r) & (away >= margin_m))
        if ok.size:
            best = ok[np.argmax(away[ok])]
            spots.append((float(lon[best]), float(lat[best])))
    return spots


async def park(conn: ConnectionSettings, st: wl.Stream, batch: int, gateway: tn.Gateway | None = None) -> int:
    """Every object of the run to every parking spot in turn (gateway batches, after its last
    update): the last move crosses a region border, so its notice reaches every worker.
    Returns the updates sent. `gateway`: as publish_gateway's."""
    spots = await parking_spots(conn)
    if not spots:
        return 0
    n = len(st.object_ids)
    after = float(st.ts.max())
    lon = np.repeat([s[0] for s in spots], n)
    lat = np.repeat([s[1] for s in spots], n)
    ts = np.repeat(after + 1.0 + np.arange(len(spots)), n)
    moves = wl.Stream(st.object_ids, np.tile(np.arange(n, dtype=np.int32), len(spots)), lon, lat, ts)
    await publish_gateway(conn, gateway_bodies(moves, batch), np.zeros(len(moves)), None, gateway=gateway)
    return len(moves)


# --------------------------------------------------------------------------- a run


async def run(mode: str, fences: Sequence[wl.Fence], stream: wl.Stream, reference: Sequence[wl.EventTuple],
              batch: int, rate: float | None, clients: int = 2, say: object = print,
              progress: ProgressFn | None = None, idle: bool = True, parking: bool = True,
              run_id: str | None = None, paho: bool = False) -> BrokerRun:
    """One run: fences in, (idle: the pipeline drained,) the stream through `mode` ("amqp" or
    "mqtt") at `rate` updates/s (None: as fast as possible), events read back and timed,
    (parking: the objects parked,) the fences removed, also when the run fails. progress, if
    given, is called every TICK_S with (phase, done, total). `run_id` (default: a fresh one)
    names the run's fences and objects `b<run_id>-<id>` (`bench:b<run_id>-<id>` qualified).
    The positions go through a gateway user made for the run (bench/tenant.py), removed
    after it; over MQTT from the lean publisher (bench/mqtt_load.py) unless `paho`."""
    async with tn.run_gateway() as gw:
        return await _run(gw, mode, fences, stream, reference, batch, rate, clients, progress, idle, parking,
                          run_id, paho)


async def _run(gw: tn.Gateway, mode: str, fences: Sequence[wl.Fence], stream: wl.Stream,
               reference: Sequence[wl.EventTuple], batch: int, rate: float | None, clients: int,
               progress: ProgressFn | None, idle: bool, parking: bool, run_id: str | None,
               paho: bool = False) -> BrokerRun:
    conn = load_connection_settings()
    run_id = run_id or uuid.uuid4().hex[:6]
    fs, st = renamed(fences, stream, run_id)
    # the reference named as the events are once qualified again: bench:b<run>-<id>
    rename_f = {f.fence_id: g.fence_id for f, g in zip(fences, fs, strict=True)}
    rename_o = {o: tn.qualified(n) for o, n in zip(stream.object_ids, st.object_ids, strict=True)}
    ref: list[wl.EventTuple] = []
    result = BrokerRun(mode, len(fs), len(st.object_ids), len(st), rate)

    stored, confirmed = [0], [0]
    status = Status("fences", len(fs), lambda: stored[0])
    ticker = asyncio.create_task(report.every(TICK_S, status.to(progress))) if progress else None
    sink = EventSink(conn, run_prefix(run_id))
    sent_at = np.zeros(len(st))
    try:
        t0 = time.perf_counter()
        await put_fences(conn, fs, done=stored)
        result.setup_s = time.perf_counter() - t0
        # the rounds from now: the positions come after their fences exist (a fence's events
        # are never dated before its creation)
        shift = time.time() - float(stream.ts.min())
        st = dataclasses.replace(st, ts=st.ts + shift)
        ref = sorted((e, rename_f[f], rename_o[o], ts + shift, r) for e, f, o, ts, r in reference)
        await sink.start()
        bodies = gateway_bodies(st, batch) if mode == "amqp" else []
        if idle:
            backlog = [0]
            status.phase, status.total, status.count = "drain", 0, lambda: backlog[0]
            result.idle_wait_s, result.backlog = await wait_idle(backlog=backlog)
        status.phase, status.total = "publish", len(st)
        t0 = time.perf_counter()
        if mode == "amqp":
            status.count = lambda: confirmed[0]
            await publish_gateway(conn, bodies, sent_at, rate, confirmed=confirmed, gateway=gw)
        else:
            sent_count = mp.get_context("fork").Value("q", 0)
            status.count = lambda: int(sent_count.value)
            await asyncio.to_thread(publish_mqtt, gw, st, sent_at, rate, clients, sent_count, paho)
            t0 = float(sent_at.min()) - time.time() + time.perf_counter()
        result.publish_s = time.perf_counter() - t0
        status.phase, status.total, status.count = "events", len(ref), lambda: len(sink.got)
        complete = await sink.wait(len(ref), DRAIN_DEADLINE_S)
        last = max((r for _, r in sink.got), default=time.time())
        result.total_s = max(last - (time.time() - (time.perf_counter() - t0)), result.publish_s)
        if not complete:
            report.warn(f"{len(sink.got)} of {len(ref)} events within {DRAIN_DEADLINE_S:g}s")
        else:
            await asyncio.sleep(GRACE_S)  # an unexpected event (a duplicate) arriving late is seen
    finally:
        await sink.close()
        try:
            if parking and sink.conn is not None:  # the fences are still there: parking LEAVEs
                status.phase, status.total, status.count = "parking", 0, lambda: 0
                try:
                    result.parked = await park(conn, st, 1000, gw)
                except Exception as exc:  # the fences go anyway
                    report.warn(f"parking failed ({type(exc).__name__}: {exc})")
            status.phase = "cleanup"
            await remove_fences(conn, fs)
        finally:
            if ticker:
                ticker.cancel()
    result.events = [e for e, _ in sink.got]
    result.duplicates = sink.duplicates
    result.arrivals = np.array([recv for _, recv in sink.got], np.float64)
    where = update_index(st, tn.TENANT)
    lat = [(recv - sent_at[where[(e[2], e[3])]]) * 1000.0 for e, recv in sink.got if (e[2], e[3]) in where]
    result.latency_ms = np.asarray(lat)
    result.reference = ref
    return result
