"""x-ingress instances added, one killed, and removed while positions flow (issue 39), in one run
of the fault suite's stream (gateway batches of two tenants, shapely ground truth):
- `geofence ingress add` twice: three instances, the partitions spread 6/5/5; the first
  instance hands the other partitions' gateway positions on to their queues;
- kill -9 of the third instance under load: its partitions wait in their queues (the harness
  starts it again at once, as systemd would), its unacked positions come back in order;
- `geofence ingress remove` of both: their partitions released to the first instance, which
  routes their positions through their queues until it has caught up with them.
The deduped events must be exactly the ground truth (nothing lost, nothing twice, no position
routed behind a newer one of its object), and each add and remove's time is reported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from deploy import ingress_ops
from deploy.region_ops import live
from exchanges import ingress_partitions as ip
from tests.faults.run import FaultRun, Workload, execute
from tests.faults.stack import Stack
from tests.faults.verdict import failure_message

pytestmark = pytest.mark.timeout(600)
RATE = 1_500.0  # updates/s


async def test_ingress_instances_live(fault_stack: Stack, workload: Workload, fault_seed: int) -> None:
    stack = fault_stack
    assert not live(stack.settings).ingress, "the stack runs added x-ingress instances already"
    run = FaultRun(stack, workload, "x-ingress: 2 instances added, kill -9 of one of three, both removed, "
                   "live", fault_seed + 11, RATE)
    outcomes: list[ingress_ops.Outcome] = []
    log = run.log

    async def op(coro: Awaitable[ingress_ops.Outcome]) -> str:
        outcome = await coro
        outcomes.append(outcome)
        return outcome.line()

    async def inject(run: FaultRun) -> None:
        add2, add3, kill, remove3, remove2 = run.moments(5, 0.08, 0.8)
        await run.reach(add2)
        await run.scale("ingress add (x-ingress-2)", lambda: op(
            ingress_ops.add(stack.settings, stack.pw, log)))
        await run.reach(add3)
        await run.scale("ingress add (x-ingress-3)", lambda: op(
            ingress_ops.add(stack.settings, stack.pw, log)))
        await run.reach(kill)
        await run.kill("x-ingress-3")
        await run.reach(remove3)
        await run.scale("ingress remove x-ingress-3", lambda: op(
            ingress_ops.remove(stack.settings, stack.pw, "x-ingress-3", log)))
        await run.reach(remove2)
        await run.scale("ingress remove x-ingress-2", lambda: op(
            ingress_ops.remove(stack.settings, stack.pw, "x-ingress-2", log)))

    try:
        out = await execute(run, inject)
    finally:  # a run that broke off leaves one instance, as it found the stack: `geofence up` with
        # the suite's settings stops the added ones and gives their partitions back (a `remove`
        # would wait for every other instance, and one may be down)
        if live(stack.settings).ingress:
            await asyncio.to_thread(stack.up)
    assert not out.problems, failure_message(out)
    added2, added3, removed3, removed2 = outcomes
    assert len(added2.moved) == ip.PARTITIONS // 2 and len(added3.moved) == 5, outcomes
    assert set(removed3.moved) == set(ip.owned_by(added3.owners, "x-ingress-3")), outcomes
    assert set(removed2.owners.values()) == {"x-ingress"}, outcomes
    # each move's time is in its SUMMARY line and the suite's table (a figure, not a verdict)
