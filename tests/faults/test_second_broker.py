"""A region on a second broker (issue 21): a second, independent RabbitMQ node is started on
this machine (its own node name, ports and data dir; not a cluster member), region c is split
off the busiest region onto it (`geofence region add c --split-from R --broker 2`) while the
fault suite's stream flows, so c's positions reach the fence vhost on the first broker through
federation over AMQP/TCP; mid-stream that second node is stopped and started again. After the
event-id dedupe the events must be exactly the shapely ground truth; the recovery time is in
the suite's table. Then c is joined back and the second node stopped.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from deploy import region_ops, services
from deploy.inspect_cmd import ask
from deploy.settings import connection_settings
from exchanges import routing_store
from exchanges import topology as t
from tests.faults.run import FaultRun, Workload, execute
from tests.faults.stack import Stack
from tests.faults.verdict import failure_message

pytestmark = pytest.mark.timeout(900)
NEW = "c"
RATE = 1_200.0  # updates/s: the stream (~30 s) outlasts the add (~20 s), so the restart is mid-stream


async def test_a_region_on_a_second_broker_survives_that_broker_restarting(
        fault_stack: Stack, workload: Workload, fault_seed: int) -> None:
    stack = fault_stack
    dsn = stack.conn["postgres"]["dsn"]
    wm = await routing_store.read_worldmap(dsn)
    assert wm is not None and NEW not in wm.regions, f"region {NEW} exists already"
    run = FaultRun(stack, workload, f"region {NEW} on a second broker, that broker restarted", fault_seed + 5,
                   RATE)
    split: list[str] = []

    async def inject(run: FaultRun) -> None:
        region, at = run.busiest_split()
        split.append(region)
        add_at, restart_at = run.moments(2, 0.03, 0.4)
        await run.reach(add_at)

        async def add() -> str:
            out = await region_ops.add(stack.settings, stack.pw, NEW, split[0], at, run.log, broker=2)
            return out.line()

        await run.scale(f"region add {NEW} --split-from {split[0]} --broker 2", add)
        await run.reach(restart_at)
        await run.restart_second_broker(region_ops.live(stack.settings), stack.pw, NEW)

    try:
        out = await execute(run, inject)
        settings = region_ops.live(stack.settings)
        url = connection_settings(settings, stack.pw)["amqp"][t.region_vhost(NEW)]
        answer = await ask(url, t.GEO_CONTROL_EXCHANGE, "", {"limit": 0})
        positions = int(answer["counters"]["positions"])
        run.log(f"x-geo {NEW} on the second broker routed {positions:,} positions")
    finally:  # region c joined back, the second node stopped
        now = await routing_store.read_worldmap(dsn)
        if now is not None and NEW in now.regions and split:
            with contextlib.suppress(Exception):
                await region_ops.remove(stack.settings, stack.pw, NEW, split[0], run.log)
        settings = region_ops.live(stack.settings)
        if services.broker2_running(settings):
            with contextlib.suppress(Exception):
                proc = await asyncio.to_thread(services.broker2_await, settings)
                await asyncio.to_thread(services.broker2_stop, settings, proc)
    assert not out.problems, failure_message(out)
    assert positions > 0, f"no position went through region {NEW} on the second broker"
    broker = [f for f in run.faults if f.kind == "broker"]
    assert len(broker) == 1 and broker[0].recovery_s is not None, broker
