"""Proximity subscriptions under faults (issue 20, "survives restarts and faults like the fence
path"): the fault suite's stream (500 objects walking in a 6 km box, 50,000 updates) with 60 of
its objects subscribed to the others within 300 m, while x-ingress (whose journal holds the
router) and each x-fence worker (whose journal holds the matcher) are killed with `kill -9` at
random moments, then RabbitMQ is restarted. The proximity events a consumer deduping on
event_id received must be exactly the brute-force reference (fence/reference.py `roam_events`,
over the stream in its order: the gateway publishes one body at a time so x-ingress gets them in
that order even across reconnects), each event_id naming one event; the fence events of the same
run are judged as in every fault run.

Two tenants (tests/faults/tenants.py): each subscriber's subscription is its tenant's, matches
the run's objects of that tenant only (a subscription sees its own tenant's objects: the
reference's glob names the tenant), and no proximity event may pair a subscription with another
tenant's object (`crossed`, the table's x-tenant column)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson
import pytest
from aio_pika.abc import AbstractIncomingMessage

from deploy.settings import ConnectionSettings
from exchanges import routing_store
from exchanges import topology as t
from exchanges.subscriptions import Subscription
from exchanges.tenancy import qualify
from fence import store
from fence.reference import RoamTuple, roam_events
from tests.faults import report
from tests.faults.clients import ReconnectingConsumer
from tests.faults.run import FaultRun, Workload, execute
from tests.faults.stack import Stack
from tests.faults.timing import CONSUMER_DEADLINE_S, say
from tests.faults.verdict import failure_message

pytestmark = pytest.mark.timeout(900)
SUBSCRIBERS = 60
RADIUS_M = 300.0
OWNER = "fault-suite"


class RoamCollector(ReconnectingConsumer):
    """fence.events' proximity events of the run's subscriptions (their names start with
    `prefix`, their tenant one of `owner`'s), the subscription and the object qualified again
    by the event's tenant; an event whose object is another tenant's (`owner`: the run's
    objects' tenants, by name) or whose routing key names another tenant goes to `crossed`."""

    def __init__(self, conn: ConnectionSettings, queue: str, prefix: str, owner: Mapping[str, str]) -> None:
        super().__init__(conn["amqp"][t.FENCES_VHOST], queue,
                         [(t.EVENTS_EXCHANGE, f"{t.ROAM_EVENTS_TOPIC_PREFIX}.#")])
        self.prefix, self.owner = prefix, dict(owner)
        self.tenants = frozenset(self.owner.values())
        self.raw_by_id: Counter[str] = Counter()  # deliveries per event_id
        self.distinct: dict[str, RoamTuple] = {}
        self.conflicts: list[str] = []
        self.crossed: dict[str, str] = {}
        self.last_at = time.monotonic()

    def handle(self, message: AbstractIncomingMessage) -> None:
        e = orjson.loads(message.body)
        tenant, sub, obj = e.get("tenant"), str(e["subscription"]), str(e["object"])
        if tenant not in self.tenants or not sub.startswith(self.prefix):
            return
        eid = str(e["event_id"])
        self.raw_by_id[eid] += 1
        self.last_at = time.monotonic()
        ev: RoamTuple = (qualify(tenant, sub), qualify(tenant, obj), str(e["event"]), float(e["ts"]))
        seen = self.distinct.setdefault(eid, ev)
        if seen != ev:
            self.conflicts.append(f"event_id {eid}: {seen} and {ev}")
        whose = self.owner.get(obj, tenant)
        if whose != tenant or (message.routing_key or "").split(".")[1:2] != [tenant]:
            self.crossed.setdefault(eid, f"{ev}: object of {whose}, routing key {message.routing_key}")


@dataclass(frozen=True)
class ReferenceSubscription:
    """A subscription as fence.reference.roam_events takes it: over qualified object ids, its
    glob names its tenant (`<tenant>:<prefix>*`), as the matcher's tenant test and its glob on
    the name do together."""

    id: str
    object: str
    radius_m: float
    match: str
    where: tuple[Any, ...] = ()
    point: tuple[float, float] | None = None


def subscribed_everywhere(ids: set[str]) -> bool:
    done = subprocess.run([sys.executable, "-m", "deploy.cli", "inspect", "proximity", "--json"],
                          capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return False
    return all(p is not None and ids <= set(p["ids"]) for p in json.loads(done.stdout).values())


async def test_proximity_survives_kills_and_a_broker_restart(fault_stack: Stack, workload: Workload,
                                                            fault_seed: int) -> None:
    stack = fault_stack
    names = ["x-ingress", *(f"x-fence-{w}" for w in stack.settings.workers)]
    run = FaultRun(stack, workload, f"proximity: kill -9 {', '.join(names)}, RabbitMQ restart",
                   fault_seed + 7, window=1)
    objects, owner = run.object_keys, run.split.object_tenant
    chosen = sorted(run.rng.choice(len(objects), SUBSCRIBERS, replace=False).tolist())
    subs = [Subscription(qualify(owner[i], f"near-{run.run_id}-{i}"), objects[i], RADIUS_M,
                         match=f"{run.prefix}*") for i in chosen]
    ref_subs = [ReferenceSubscription(s.id, s.object, s.radius_m, f"{s.tenant}:{s.match}") for s in subs]
    collector = RoamCollector(stack.conn, f"fault-suite.{run.run_id}.roam", f"near-{run.run_id}-", run.owner)
    conn = await routing_store.connect(stack.conn["postgres"]["dsn"])
    made: list[str] = []
    try:
        await collector.start()
        for s in subs:
            await store.put_subscription(conn, OWNER, s.to_wire())
            made.append(s.id)
        end = time.monotonic() + CONSUMER_DEADLINE_S
        while not await asyncio.to_thread(subscribed_everywhere, {s.id for s in subs}):
            assert time.monotonic() < end, "the subscriptions never reached every worker"
            await asyncio.sleep(0.2)  # polling the workers' state, with a deadline

        async def inject(run: FaultRun) -> None:
            order = [names[i] for i in run.rng.permutation(len(names))]
            moments = run.moments(len(names) + 1)
            for name, at in zip(order, moments, strict=False):
                await run.reach(at)
                await run.kill(name)
            await run.reach(moments[-1])
            await run.restart_broker()
            await run.recovered()

        out = await execute(run, inject)
        # the reference over the stream as x-ingress got it (run.start shifted its times), the
        # objects as the pipeline names them
        st = run.stream
        want = Counter(roam_events(ref_subs, [objects[i] for i in st.obj.tolist()], st.lon, st.lat, st.ts))
        # the run's end parks every object at one spot (FaultRun.close): events dated after the
        # stream's last update are the parking's, not the stream's
        last_ts = float(st.ts.max())
        end = time.monotonic() + 120
        while True:
            ours = {k: v for k, v in collector.distinct.items() if v[3] <= last_ts}
            if (len(ours) >= sum(want.values()) and time.monotonic() - collector.last_at >= 3) \
                    or time.monotonic() > end:
                break
            await asyncio.sleep(0.5)  # polling a count, with a deadline (the events keep coming)
        got = Counter(ours.values())
        problems = list(out.problems)
        if got != want:
            miss, extra = want - got, got - want
            problems.append(f"proximity events (deduped on event_id) differ from the brute-force reference: "
                            f"{sum(miss.values())} missing (e.g. {list(miss)[:3]}), {sum(extra.values())} "
                            f"unexpected (e.g. {list(extra)[:3]})")
        if collector.crossed:
            problems.append(f"{len(collector.crossed)} proximity events pair a subscription with another "
                            "tenant's object: " + "; ".join(list(collector.crossed.values())[:3]))
        if collector.conflicts:
            problems.append(f"{len(collector.conflicts)} proximity event_ids name two events: "
                            + "; ".join(collector.conflicts[:3]))
        raw = sum(n for k, n in collector.raw_by_id.items() if k in ours)
        say(f"{run.title}: proximity events {sum(want.values()):,} expected, {len(ours):,} distinct "
            f"received, {raw - len(ours):,} duplicated")
        report.record(report.Row(f"{run.title}: its proximity events", len(run.faults), len(run.stream),
                                 sum(want.values()), len(ours), raw - len(ours), 0, out.row.recovery_s,
                                 ok=not problems, crossed=len(collector.crossed)))
        assert not problems, failure_message(out) + "\n" + "\n".join(problems)
    finally:
        await collector.stop()
        for sub_id in made:
            try:
                await store.delete_subscription(conn, sub_id)
            except (store.UnknownSubscription, asyncpg.PostgresError, OSError) as exc:
                say(f"{run.title}: subscription {sub_id} not deleted ({type(exc).__name__})")
        await conn.close()
