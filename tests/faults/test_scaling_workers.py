"""Workers added and removed, and fences made hot, while positions flow (issues 21 and 22), in
one run of the fault suite's stream (50,000 updates, 500 fences, shapely ground truth):
- the run's busiest fences given two masters each (`geofence worker hot ... --masters 2`: each
  fence's objects spread over two workers, each master's share of who is inside handed to it);
- a third x-fence worker added with weight 2 while they are hot (`geofence worker add w-live
  --weight 2`: the ring moves its share of the fences, whose state is handed over while
  x-ingress is paused and the pipeline drained; some of the hot fences' objects move to it);
- the fences back to one master;
- the worker removed again (its fences handed back).
The deduped events must be exactly the ground truth: no second ENTER, no LEAVE lost, for the
objects inside a moved fence too. (The worker's add and remove ran alone in a run of their own
until issue 38: this run does all they did, and the suite stays within CI's time.)
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Awaitable

import pytest

from deploy import worker_ops
from tests.faults.run import FaultRun, Workload, execute
from tests.faults.stack import Stack
from tests.faults.verdict import failure_message

pytestmark = pytest.mark.timeout(600)
NEW = "w-live"
RATE = 1_500.0  # updates/s: both changes happen while the stream flows


class Ops:
    """The run's worker operations, their outcomes kept in order."""

    def __init__(self) -> None:
        self.outcomes: list[worker_ops.Outcome] = []

    async def op(self, coro: Awaitable[worker_ops.Outcome]) -> str:
        outcome = await coro
        self.outcomes.append(outcome)
        return outcome.line()


HOT = 5  # the run's busiest fences made hot


async def test_hot_fences_live(fault_stack: Stack, workload: Workload, fault_seed: int) -> None:
    stack = fault_stack
    _, ring, _ = await worker_ops.current_ring(stack.settings, stack.pw)
    assert NEW not in ring.nodes and not ring.hot, f"the ring is not the stack's default: {ring}"
    run = FaultRun(stack, workload, f"{HOT} busiest fences hot (2 masters), worker {NEW} added (weight 2), "
                   "fences back to 1 master, worker removed, live", fault_seed + 5, RATE)
    busiest = [f for f, _ in Counter(e[1] for e in run.reference).most_common(HOT)]
    ops = Ops()
    log, op, outcomes = run.log, ops.op, ops.outcomes

    async def inject(run: FaultRun) -> None:
        hot_at, add_at, cool_at, remove_at = run.moments(4, 0.08, 0.7)
        await run.reach(hot_at)
        await run.scale(f"{HOT} fences hot", lambda: op(
            worker_ops.hot(stack.settings, stack.pw, busiest, 2, log)))
        await run.reach(add_at)
        await run.scale(f"worker add {NEW} --weight 2 (fences hot)", lambda: op(
            worker_ops.add(stack.settings, stack.pw, NEW, 2, log)))
        await run.reach(cool_at)
        await run.scale(f"{HOT} fences back to 1 master", lambda: op(
            worker_ops.hot(stack.settings, stack.pw, busiest, 1, log)))
        await run.reach(remove_at)
        await run.scale(f"worker remove {NEW}", lambda: op(
            worker_ops.remove(stack.settings, stack.pw, NEW, log)))

    try:
        out = await execute(run, inject)
    finally:  # a run that broke off leaves the ring as it found it
        _, now, _ = await worker_ops.current_ring(stack.settings, stack.pw)
        with contextlib.suppress(Exception):
            if now.hot:
                await worker_ops.hot(stack.settings, stack.pw, list(now.hot), 1, log)
            if NEW in now.nodes:
                await worker_ops.remove(stack.settings, stack.pw, NEW, log)
    assert not out.problems, failure_message(out)
    heated, added, cooled, removed = outcomes
    # objects inside the hot fences were spread over their masters and gathered again
    assert heated.pairs_moved > 0 and cooled.pairs_moved > 0, outcomes
    # the run's fences moved to the new worker and came back, with objects inside them
    assert added.moved > 0 and removed.moved > 0 and added.pairs_moved + removed.pairs_moved > 0, outcomes
    assert added.ring_after == added.ring_before + 1, outcomes
    _, final, _ = await worker_ops.current_ring(stack.settings, stack.pw)
    assert final == ring
