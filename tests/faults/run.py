"""One fault run (issue 5, "Nothing lost, nothing duplicated") against the live stack, as two
tenants sharing it (tests/faults/tenants.py).

`make_workload()`: the scripted stream (bench/workload.py), its fences and objects split
between the two tenants, and its shapely ground truth per tenant (each tenant's objects
against its own fences). `FaultRun`: that workload renamed for one run (objects published as
`b<run>-<id>` by their tenant's own gateway user under its tenant's key; the fences, stored
once a session, in session_fences.py), the test's consumers and the paced publisher
started, faults injected by the test (`kill`, `restart_broker`, `cut`)
while it streams, the recovery of each measured, then the last events awaited and the
verdict (verdict.py). `execute()` is a whole test: the run, the test's faults, the verdict,
the row of the suite's table.

Recovery time of a fault = from the moment it was injected until the pipeline flows again:
the sidecar's input queues (every input queue for a broker restart) have a consumer again and
an event caused by a position published after the fault, and that the restarted part had to
handle (its region for x-geo, its fences for x-fence), has come out at the end (for the
archiver: a fence_event row archived after the kill). A sidecar that has not consumed again
CONSUMER_DEADLINE_S after the fault's end (it hangs, or it exited) is started again by the
harness, as systemd's Restart=on-failure would, so that the rest of the run still tells
whether anything was lost; the run fails on it, with the sidecar's last log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import asyncpg
import msgpack
import numpy as np
import numpy.typing as npt

import hilbert_c as hk
from bench import broker_modes as bm
from bench import workload as wl
from deploy import region_ops, services, sidecars
from deploy.rabbitmq.apply import management
from deploy.settings import Secrets, Settings
from exchanges import routing_store
from exchanges import topology as t
from exchanges.fence_binding import INDEX_BITS
from exchanges.tenancy import qualify
from fence.reference import EventTuple
from tests.faults import report
from tests.faults import tenants as ft
from tests.faults.clients import Body, DeadLetter, DeadLetterWatch, EventCollector, Publisher
from tests.faults.proxy import TcpProxy
from tests.faults.session_fences import SESSION_FENCES
from tests.faults.stack import QueueProbe, Stack, sidecar_queues
from tests.faults.timing import (
    CONSUMER_DEADLINE_S,
    FLOW_DEADLINE_S,
    GRACE_S,
    POLL_S,
    QUIET_LONG_S,
    QUIET_S,
    SETTLE_DEADLINE_S,
    poll_until,
    say,
)
from tests.faults.verdict import Outcome, judge, walled_candidates

HOLD_AT = 0.9  # of the stream: new positions wait there until every planned fault is in
FLOW_MARGIN = 2_500  # updates the stream goes on for after each fault (1 s at RATE)

# The workload: 500 fences (32-gons of 150-500 m) in a 6 km box across the border between the
# default worldmap's two regions, 500 objects walking 20 m steps: ~13k events for 36k updates.
BOX = wl.Box(9.59, 47.18, 6_000.0)
RADIUS_M = (150.0, 500.0)
FENCES = 500
OBJECTS = 500
UPDATES = 36_000
BATCH = 200  # positions per gateway message
RATE = 2_500.0  # updates/s
WORKLOAD_SEED = 5
BAD_INPUTS = 5  # gateway batches of invalid positions mixed into every stream


# --------------------------------------------------------------------------- the workload


@dataclass(frozen=True)
class Workload:
    fences: list[wl.Fence]
    stream: wl.Stream
    reference: list[EventTuple]  # names unqualified: each tenant's objects against its own fences
    split: ft.Split  # the tenant of each fence and object


def make_workload() -> Workload:
    """Two tenants, each with its own copy of the fences (the same names in both) and half the
    objects: every object meets the fences it met before tenants, so the events are the same
    ones, while each fence lies over the other tenant's objects too, which x-fence's wall
    keeps out (the runs count what crossed: nothing may)."""
    base = wl.make_fences(FENCES, WORKLOAD_SEED, BOX, RADIUS_M)
    stream = wl.random_walk(OBJECTS, UPDATES, WORKLOAD_SEED, BOX)
    split = ft.Split.copies(len(base), len(stream.object_ids))
    fences = ft.copied(base)
    return Workload(fences, stream, split.reference(fences, stream), split)


# --------------------------------------------------------------------------- a run


@dataclass
class Fault:
    label: str
    kind: str  # kill | broker | cut | scale
    at_update: int  # updates published before it was injected
    started: float  # time.monotonic()
    started_wall: float  # time.time()
    done: float = 0.0  # time.monotonic() when the fault's action was over (the broker up again)
    recovery_s: float | None = None
    note: str = ""
    revived: dict[str, str] = field(default_factory=dict)  # sidecars the harness started again: how
    evidence: dict[str, list[str]] = field(default_factory=dict)  # their last log lines


class FaultRun:
    """One run: the workload renamed for the run (fences and objects unique to it, times
    shifted to now; each fence and object its tenant's), its fences stored through the
    production path, a gateway user per tenant, the test's consumers, the paced publisher;
    `inject_*` inject faults while it streams; `finish()` waits for the last events and
    returns the verdict; `close()` parks the objects, removes the fences, the gateway users
    and the consumers' queues."""

    def __init__(self, stack: Stack, work: Workload, title: str, seed: int, rate: float = RATE,
                 window: int = 8) -> None:
        """`window`: gateway bodies in flight (1: x-ingress gets them in stream order, even
        across reconnects, which proximity events depend on: their pairs interleave objects)."""
        self.stack, self.title, self.seed, self.rate, self.window = stack, title, seed, rate, window
        self.batch, self.bad_inputs = BATCH, BAD_INPUTS  # the verdict judges by these too
        self.rng = np.random.default_rng(seed)
        self.run_id = f"{ft.RUN_GATEWAY_PREFIX}{uuid.uuid4().hex[:6]}"
        self.prefix = p = f"b{self.run_id}-"  # the run's objects (the fences are the session's)
        self.split = split = work.split
        self.tenants = split.tenants
        # fences stored qualified; objects published by name (x-ingress qualifies them by the
        # gateway's tenant), `object_keys` as the pipeline and the events (qualified) name them
        self.fences = [dataclasses.replace(f, fence_id=qualify(x, SESSION_FENCES.prefix + f.fence_id))
                       for f, x in zip(work.fences, split.fence_tenant, strict=True)]
        self.stream = dataclasses.replace(work.stream, object_ids=[p + o for o in work.stream.object_ids])
        self.object_keys = ft.qualified(split.object_tenant, self.stream.object_ids)
        self.owner = dict(zip(self.stream.object_ids, split.object_tenant, strict=True))  # name -> tenant
        rename_o = dict(zip(work.stream.object_ids, self.object_keys, strict=True))
        tenant_of_o = dict(zip(work.stream.object_ids, split.object_tenant, strict=True))
        # a reference event's fence is its object's tenant's (the same name may be every tenant's)
        self.reference = [(e, qualify(tenant_of_o[o], SESSION_FENCES.prefix + f), rename_o[o], ts, r)
                          for e, f, o, ts, r in work.reference]
        self.gateways: list[ft.TenantGateway] = []
        self._bad_at: list[int] = []
        self._shift_to_now()
        self.faults: list[Fault] = []
        self.dead_letters: list[DeadLetter] = []
        self.probe = QueueProbe(stack)
        q = f"fault-suite.{self.run_id}"
        self.collector = EventCollector(stack.conn, f"{q}.events", SESSION_FENCES.prefix, p, self.owner)
        self.dlq = [DeadLetterWatch(stack.conn, v, f"{q}.dead-letters", self.prefix, self.dead_letters)
                    for v in stack.topology.vhosts]
        self.publisher = Publisher({}, self.bodies, rate, window)  # the gateways come in start()
        self._publishing: asyncio.Task[None] | None = None
        self._recoveries: list[asyncio.Task[None]] = []
        self.planned: int | None = None  # faults the test will inject (moments())
        self._fences_stored = False
        self.region_of_update: npt.NDArray[np.int64] = np.zeros(len(self.stream), np.int64)
        self.regions: tuple[str, ...] = ()
        self.started = 0.0
        self.pipeline_queues: list[tuple[str, str]] = []
        self.walled_before: int | None = None  # x-fence's walled candidates at the start (all workers)

    def _shift_to_now(self) -> None:
        """The stream's times (and the reference's) from now on: a run's positions come
        after its fences exist (a fence's events are never dated before its creation)."""
        shift = time.time() - float(self.stream.ts.min())
        self.stream = dataclasses.replace(self.stream, ts=self.stream.ts + shift)
        self.reference = [(e, f, o, ts + shift, r) for e, f, o, ts, r in self.reference]
        keys = self.object_keys  # (qualified object, ts) -> update, as the events name them
        pairs = zip(self.stream.obj.tolist(), self.stream.ts.tolist(), strict=True)
        self.where = {(keys[o], ts): i for i, (o, ts) in enumerate(pairs)}
        self.start_ts, self.end_ts = float(self.stream.ts.min()), float(self.stream.ts.max())
        self.bodies = self._bodies()

    def _bodies(self) -> list[Body]:
        bodies = ft.tenant_bodies(self.stream, self.batch, self.split.object_tenant)
        if not self._bad_at:  # drawn once: the seed's moments stay the same
            drawn = self.rng.choice(np.arange(1, len(bodies)), self.bad_inputs, replace=False)
            self._bad_at = sorted(drawn.tolist())
        at = self._bad_at
        for k, i in enumerate(reversed(at)):  # bad inputs between good batches: no valid position
            n = self.bad_inputs - 1 - k
            lo = bodies[i].lo
            data = msgpack.packb({"positions": [{"id": f"{self.prefix}bad{n}", "lon": BOX.lon, "lat": 91.0,
                                                 "ts": float(self.stream.ts[lo])}]})
            bodies.insert(i, Body(lo, lo, data, key=self.tenants[n % len(self.tenants)], bad=n))
        return bodies

    # -- set-up -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Consumers first (nothing is missed), then the tenants' gateways and fences, then the
        stream."""
        fs, os_ = self.split.fence_tenant, self.split.object_tenant
        events = Counter(e[1].partition(":")[0] for e in self.reference)
        per = ", ".join(f"{x}: {fs.count(x)} fences, {os_.count(x)} objects, {events[x]:,} events"
                        for x in self.tenants)
        say(f"{self.title}: run {self.run_id}, seed {self.seed}, {len(self.fences)} fences, "
            f"{len(self.stream):,} updates at {self.rate:,.0f}/s, {len(self.reference):,} events expected "
            f"({per})")
        dead = self.stack.dead()
        assert not dead, f"sidecars not running before the run: {', '.join(dead)}; run `geofence up`"
        await self.collector.start()
        for w in self.dlq:
            await w.start()
        wm = await routing_store.read_worldmap(self.stack.conn["postgres"]["dsn"])
        assert wm is not None, "no worldmap stored: run `geofence up`"
        self.regions = wm.regions
        gx, gy = hk.lonlat_to_grid(self.stream.lon, self.stream.lat, INDEX_BITS)
        self.region_of_update = wm.region_index(hk.encode_many(gx, gy, INDEX_BITS))
        self.pipeline_queues = await self._pipeline_queues()
        await ft.ensure_tenants(self.stack.conn["postgres"]["dsn"], self.tenants)
        for tenant in self.tenants:  # each tenant's positions through its own gateway user
            self.gateways.append(await asyncio.to_thread(ft.add_gateway, self.stack.settings, self.stack.pw,
                                                         tenant, self.run_id))
        self.walled_before = await walled_candidates(self.stack)
        self._fences_stored = True
        await SESSION_FENCES.ensure(self.stack.conn, self.fences)
        self._shift_to_now()  # the stream starts once the fences are stored
        urls = {gw.routing_key: gw.amqp_url for gw in self.gateways}
        self.publisher = Publisher(urls, self.bodies, self.rate, self.window)

    async def _pipeline_queues(self) -> list[tuple[str, str]]:
        """The queues a position passes through on its way to an event: the sidecars'
        position inputs and the federation links' queues (in the upstream vhosts)."""
        inputs = {*t.PARTITION_QUEUES, t.POSITIONS_QUEUE, t.BATCHES_QUEUE, t.GEO_POSITIONS_QUEUE,
                  *(t.fence_queue(w) for w in self.stack.settings.workers)}
        qs = [(v, q) for v, q in sidecars.input_queues(self.stack.topology) if q in inputs]
        mgmt = management(self.stack.settings, self.stack.pw)
        listed = await asyncio.to_thread(mgmt.get, "api/queues?columns=vhost,name")
        vhosts = self.stack.topology.vhosts
        qs += [(str(q["vhost"]), str(q["name"])) for q in listed
               if str(q.get("name", "")).startswith("federation:") and q["vhost"] in vhosts]
        return qs

    def stream_now(self, hold_at: float = HOLD_AT) -> None:
        """Start publishing. While planned faults are not all injected, the stream waits at
        `hold_at` of its length, and after each fault goes on for FLOW_MARGIN updates only
        (enough for the recovery to be seen): every fault lands mid-stream however long the
        ones before took."""
        self.publisher.set_limit(int(hold_at * len(self.stream)))
        self.started = time.monotonic()
        self._publishing = asyncio.create_task(self.publisher.run(), name="publisher")

    def release(self) -> None:
        self.publisher.set_limit(None)

    def _after_fault(self) -> None:
        if self.planned is not None and len(self.faults) >= self.planned:
            self.release()
        elif self.publisher.limit is not None:
            self.publisher.set_limit(max(self.publisher.limit, self.publisher.sent_updates + FLOW_MARGIN))

    def moments(self, n: int, lo: float = 0.08, hi: float = 0.8) -> list[int]:
        """n random moments of the stream (update counts), sorted, from the run's RNG; plans
        n faults (the stream is held back until the last one is in, see stream_now)."""
        self.planned = n
        return sorted(int(x) for x in self.rng.uniform(lo * len(self.stream), hi * len(self.stream), n))

    async def reach(self, update: int) -> None:
        ok = await poll_until(self._sent(update), 300)
        assert ok, f"the publisher did not reach update {update:,} ({self.publisher.errors[-3:]})"

    def _sent(self, update: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            if self._publishing is not None and self._publishing.done():
                self._publishing.result()  # raises what killed it
                return True
            return self.publisher.sent_updates >= update
        return check

    # -- faults -------------------------------------------------------------------------------

    def _begin(self, label: str, kind: str) -> Fault:
        f = Fault(label, kind, self.publisher.sent_updates, time.monotonic(), time.time())
        self.faults.append(f)
        say(f"{self.title}: {label} at update {f.at_update:,}")
        return f

    async def recovered(self) -> None:
        """Until every fault injected so far has recovered (or given up)."""
        await asyncio.gather(*self._recoveries)

    def _measure(self, f: Fault, queues: Sequence[tuple[str, str]], scope: str) -> None:
        """The recovery is measured in the background: the next fault may land meanwhile.
        The sidecars have CONSUMER_DEADLINE_S from the end of the fault's action."""
        f.done = time.monotonic()
        self._after_fault()
        self._recoveries.append(asyncio.create_task(self._recovered(f, queues, scope),
                                                    name=f"recovery of {f.label}"))

    async def kill(self, name: str) -> Fault:
        """kill -9 the sidecar and restart it at once; its recovery is measured meanwhile."""
        f = self._begin(f"kill -9 {name}", "kill")
        await asyncio.to_thread(self.stack.kill9, name)
        await asyncio.to_thread(self.stack.launch, name)
        self._measure(f, sidecar_queues(self.stack.topology, name), self._scope(name))
        return f

    async def restart_broker(self) -> Fault:
        """RabbitMQ stopped (`rabbitmqctl stop`) and started again; until every input queue
        has its consumer and events flow again."""
        f = self._begin("RabbitMQ stop + start", "broker")
        await asyncio.to_thread(self.stack.stop_broker)
        down_s = time.monotonic() - f.started
        await asyncio.to_thread(self.stack.start_broker)
        f.note = f"stop {down_s:.1f}s, start {time.monotonic() - f.started - down_s:.1f}s"
        self._measure(f, self._every_queue(), "any")
        return f

    async def kill_broker_node(self, node: int) -> Fault:
        """kill -9 of one node of the first broker's cluster (its Erlang VM: no goodbye to
        its peers or clients); until every input queue has its consumer and events flow through
        every region and worker."""
        nodes = self.stack.settings.broker_nodes
        proc = await asyncio.to_thread(self.stack.broker_node_process, node)
        f = self._begin(f"RabbitMQ node {node} of {nodes} killed (kill -9)", "broker")
        await asyncio.to_thread(self.stack.kill_broker_node, node, proc)
        self._measure(f, self._every_queue(), "every")
        return f

    async def start_broker_node(self, node: int) -> Fault:
        """The killed node started again: it rejoins and its queue members catch up, while
        events flow on."""
        f = self._begin(f"RabbitMQ node {node} started again", "broker")
        await asyncio.to_thread(self.stack.start_broker_node, node)
        f.note = f"back in {time.monotonic() - f.started:.1f}s"
        self._measure(f, self._every_queue(), "every")
        return f

    def _every_queue(self) -> list[tuple[str, str]]:
        return [(v, q) for n in self.stack.names for v, q in sidecar_queues(self.stack.topology, n)]

    async def cut(self, proxy: TcpProxy, names: Sequence[str]) -> Fault:
        f = self._begin("TCP cut", "cut")
        n = await asyncio.to_thread(proxy.cut)
        f.note = f"{n} connections cut"
        queues = [(v, q) for name in names for v, q in sidecar_queues(self.stack.topology, name)]
        self._measure(f, queues, "any")
        return f

    def log(self, line: str) -> None:
        """A live operation's progress, said under the run's title."""
        say(f"{self.title}: {line}")

    def busiest_split(self) -> tuple[str, int]:
        """The region where most of this run's updates are, and their median Hilbert index
        there: a split at it sends about half of them through a new region, and the walkers
        cross the new boundary."""
        counts = [int((self.region_of_update == i).sum()) for i in range(len(self.regions))]
        r = max(range(len(counts)), key=counts.__getitem__)
        gx, gy = hk.lonlat_to_grid(self.stream.lon, self.stream.lat, INDEX_BITS)
        h = np.sort(hk.encode_many(gx, gy, INDEX_BITS)[self.region_of_update == r])
        return self.regions[r], int(h[len(h) // 2])

    async def scale(self, label: str, op: Callable[[], Awaitable[str]]) -> Fault:
        """A live topology change (`geofence region add`, ...) while the stream flows: `op`
        returns its summary line; its "recovery" is the first event after it."""
        f = self._begin(label, "scale")
        f.note = await op()
        say(f"{self.title}: {f.note}")
        self._measure(f, [], "any")
        return f

    async def restart_second_broker(self, settings: Settings, pw: Secrets, region: str) -> Fault:
        """The second RabbitMQ node (the one `region` is placed on) stopped and started again;
        its recovery: until the region's x-geo consumes again and an event flows."""
        f = self._begin("second RabbitMQ stop + start", "broker")
        proc = await asyncio.to_thread(services.broker2_await, settings)  # its process, as running
        await asyncio.to_thread(services.broker2_stop, settings, proc)
        down_s = time.monotonic() - f.started
        await asyncio.to_thread(services.broker2_launch, settings)
        await asyncio.to_thread(services.broker2_await, settings)
        up_s = time.monotonic() - f.started - down_s
        ok = await poll_until(lambda: asyncio.to_thread(region_ops.consumed, settings, pw, region),
                              CONSUMER_DEADLINE_S)
        back = f"{time.monotonic() - f.started:.1f}s after the stop" if ok else "NOT within the deadline"
        f.note = f"stop {down_s:.1f}s, start {up_s:.1f}s, x-geo {region} consuming again {back}"
        self._measure(f, [], "any")
        return f

    def _scope(self, name: str) -> str:
        if name.startswith("x-geo-"):
            return "region:" + name.removeprefix("x-geo-")
        if name.startswith("x-fence-"):
            return "worker:" + name.removeprefix("x-fence-")
        if name == "fence-archiver":
            return "archive"
        return "any"

    async def _recovered(self, f: Fault, queues: Sequence[tuple[str, str]], scope: str) -> None:
        """Until the queues have consumers and an event in scope flows; a sidecar that has
        not reconnected by itself at CONSUMER_DEADLINE_S is restarted by the harness (noted:
        the run fails on it), so the rest of the run still tells whether anything was lost."""
        async def consuming() -> bool:
            return not await self.probe.consumed(queues)

        async def consuming_in_time() -> bool:
            while not await consuming():
                if time.monotonic() > self._consumer_deadline(f):
                    return False
                await asyncio.sleep(POLL_S)
            return True

        if not await consuming_in_time():
            missing = await self.probe.consumed(queues)
            owners = [n for n in self.stack.names
                      if {f"{v}/{q}" for v, q in sidecar_queues(self.stack.topology, n)} & set(missing)]
            f.evidence = {n: self.stack.log_evidence(n) for n in owners}
            f.revived = await self.stack.revive(0, owners)
            f.note += (f"{'; ' if f.note else ''}no consumer on {', '.join(missing)} after "
                       f"{CONSUMER_DEADLINE_S:g}s: started again "
                       f"{', '.join(f'{n} ({how})' for n, how in f.revived.items()) or 'nothing'}")
            say(f"{self.title}: {f.label}: {f.note}")
            if not await poll_until(consuming, CONSUMER_DEADLINE_S):
                f.note += f"; still no consumer on {', '.join(await self.probe.consumed(queues))}"
                return
        consumer_s = time.monotonic() - f.started
        if scope == "archive":
            ok = await poll_until(self._archived_after(f.started_wall), FLOW_DEADLINE_S)
        else:
            ok = await poll_until(self._event_after(f.at_update, scope), FLOW_DEADLINE_S)
        f.recovery_s = time.monotonic() - f.started
        f.note += f"{'; ' if f.note else ''}consumer back after {consumer_s:.1f}s"
        if not ok:
            f.note += f", no new event within {FLOW_DEADLINE_S:g}s more"
        say(f"{self.title}: {f.label}: recovered in {f.recovery_s:.1f}s ({f.note})")

    def _consumer_deadline(self, f: Fault) -> float:
        """When `f`'s sidecars must consume again: CONSUMER_DEADLINE_S after the end of `f`, or
        of a fault injected since that takes the broker from every sidecar (a restart, a cut;
        one still under way: not before it ends). A worker killed and rebuilding its state when
        the broker goes away gets what every sidecar gets after a broker restart."""
        now = time.monotonic()
        ends = [f.done] + [g.done or now for g in self.faults
                           if g is not f and g.kind in ("broker", "cut") and g.started >= f.started]
        return max(ends) + CONSUMER_DEADLINE_S

    def _event_after(self, update: int, scope: str) -> Callable[[], Awaitable[bool]]:
        """An event caused by a position published after the fault, in scope, was received."""
        seen = [0]
        kind, _, which = scope.partition(":")
        region = self.regions.index(which) if kind == "region" else -1
        # "every": an event through each region and each worker (a broker node's loss touches
        # whichever sidecars were connected to it)
        todo = ({("region", r) for r in range(len(self.regions))}
                | {("worker", w) for w in self.stack.ring.nodes})

        async def check() -> bool:
            ds = self.collector.deliveries
            for d in ds[seen[0]:]:
                i = self.where.get((d.event[2], d.event[3]))
                if i is None or i < update:
                    continue
                if kind == "every":
                    todo.difference_update({("region", self.region_of_update[i]),
                                            ("worker", self.stack.ring.node_for(d.event[1]))})
                    if todo:
                        continue
                if kind == "region" and self.region_of_update[i] != region:
                    continue
                if kind == "worker" and self.stack.ring.node_for(d.event[1]) != which:
                    continue
                return True
            seen[0] = len(ds)
            return False
        return check

    def _archived_after(self, wall: float) -> Callable[[], Awaitable[bool]]:
        """An event was archived (in a transaction begun) after `wall`: the archiver writes
        again (whatever backlog it works through)."""
        async def check() -> bool:
            try:
                c = await asyncpg.connect(self.stack.conn["postgres"]["dsn"])
                try:
                    n = await c.fetchval("SELECT EXISTS (SELECT 1 FROM fence_event "
                                         "WHERE archived_at > to_timestamp($1))", wall)
                finally:
                    await c.close()
            except (OSError, asyncpg.PostgresError):
                return False
            return bool(n)
        return check

    # -- the end ------------------------------------------------------------------------------

    async def finish(self) -> Outcome:
        """Every position confirmed, then the last events (or quiet), then the verdict."""
        self.release()
        assert self._publishing is not None, "stream_now() first"
        await asyncio.wait_for(self._publishing, SETTLE_DEADLINE_S + 120)
        published_s = time.monotonic() - self.started
        await asyncio.gather(*self._recoveries)
        await self._settle(time.monotonic())
        events_s = time.monotonic() - self.started
        out = await judge(self)
        out.info.insert(0, f"published in {published_s:.1f}s (reconnects {self.publisher.reconnects}, "
                           f"bodies republished {self.publisher.republished}), events settled at "
                           f"{events_s:.1f}s")
        return out

    async def _settle(self, published: float) -> None:
        """Until every event came, or nothing more is coming: quiet since the last event and
        the last position confirmed (after a broker restart the stream's last positions went in
        at once 17 s after the last event: CI ended the run before their events came)."""
        want = len(self.reference)
        end = time.monotonic() + SETTLE_DEADLINE_S
        while time.monotonic() < end:
            quiet = time.monotonic() - max(self.collector.last_at, published)
            if len(self.collector.distinct) >= want and quiet >= GRACE_S:
                return
            if quiet >= QUIET_S and await self.probe.in_flight(self.pipeline_queues) == 0:
                return
            if quiet >= QUIET_LONG_S:  # the pipeline is busy with others' work, not ours
                return
            await asyncio.sleep(POLL_S)
        ago = time.monotonic() - self.collector.last_at
        say(f"{self.title}: no end of events after {SETTLE_DEADLINE_S:g}s: {len(self.collector.distinct):,} "
            f"of {want:,}, the last {ago:.0f}s ago, {await self.probe.ready(self.pipeline_queues)} "
            "messages ready in the pipeline")

    async def close(self) -> None:
        """Stop publishing, park the run's objects (the fences stay), remove the test's queues."""
        for task in [*self._recoveries, self._publishing]:
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        try:
            revived = await self.stack.revive(5)  # the clean-up (and the next run) need every sidecar
            if revived:
                say(f"{self.title}: started {', '.join(f'{n} ({h})' for n, h in revived.items())} again "
                    "before cleaning up")
            if self._fences_stored:
                try:
                    for gw in self.gateways:
                        await bm.park(self.stack.conn, self._objects_of(gw.tenant), 1000, gw)
                except Exception as exc:  # their later moves are no other run's events
                    say(f"{self.title}: parking failed ({type(exc).__name__}: {exc})")
        finally:
            for gw in self.gateways:
                try:
                    await asyncio.to_thread(ft.remove_gateway, self.stack.settings, self.stack.pw, gw)
                except Exception as exc:  # the next session removes it (remove_leftover_gateways)
                    say(f"{self.title}: gateway {gw.user} not removed ({type(exc).__name__}: {exc})")
            await self.collector.stop()
            for w in self.dlq:
                await w.stop()
            await self.probe.close()

    def _objects_of(self, tenant: str) -> wl.Stream:
        """The tenant's objects (as published), one update each at the stream's end: what
        bench's park() moves (it moves every object of the stream it is given)."""
        names = [o for o, x in self.owner.items() if x == tenant]
        n = len(names)
        z = np.zeros(n)
        return wl.Stream(names, np.arange(n, dtype=np.int32), z, z, np.full(n, self.end_ts))


# --------------------------------------------------------------------------- a whole test


async def execute(run: FaultRun, inject: Callable[[FaultRun], Awaitable[None]]) -> Outcome:
    """Start the run, stream, `inject(run)` the faults, finish; the row goes into the suite's
    table whatever happens (a run that broke off is a row marked NO)."""
    out: Outcome | None = None
    try:
        await run.start()
        run.stream_now()
        await inject(run)
        run.release()  # every fault is in: the rest of the stream goes on
        out = await run.finish()
    finally:
        if out is None:
            report.record(report.Row(
                run.title, len(run.faults), run.publisher.sent_updates, len(run.reference),
                len(run.collector.distinct), run.collector.duplicates,
                sum(1 for d in run.dead_letters if d.ours),
                tuple(float("nan") if f.recovery_s is None else f.recovery_s for f in run.faults),
                crossed=len(run.collector.crossed), ok=False))
        await run.close()
    report.record(out.row)
    for line in out.info:
        say(f"{run.title}: {line}")
    return out
