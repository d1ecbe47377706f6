"""Scaling out and in while positions flow (issue 21): the fault suite's stream (50,000
updates over 500 fences across the regions' border, shapely ground truth) runs while a third
x-geo region is added by splitting the busiest one where the run's fences are (`geofence
region add c --split-from R --balance`) and, later, removed again (`region remove c --into
R`). The deduped events must be exactly the ground truth (nothing lost, nothing reported
twice), objects crossing the moving boundary included; the archive holds them once.
"""

from __future__ import annotations

import contextlib

import pytest

from deploy import region_ops
from exchanges import routing_store
from tests.faults.run import FaultRun, Workload, execute
from tests.faults.stack import Stack
from tests.faults.verdict import failure_message

pytestmark = pytest.mark.timeout(600)
NEW = "c"
RATE = 1_500.0  # updates/s: the stream lasts ~35 s, so both changes happen while it flows


async def test_region_added_and_removed_live(fault_stack: Stack, workload: Workload, fault_seed: int) -> None:
    stack = fault_stack
    dsn = stack.conn["postgres"]["dsn"]
    wm = await routing_store.read_worldmap(dsn)
    assert wm is not None and NEW not in wm.regions, f"region {NEW} exists already: {wm}"
    run = FaultRun(stack, workload, f"region {NEW} added live, then removed live", fault_seed + 3, RATE)
    split: list[str] = []

    async def inject(run: FaultRun) -> None:
        region, at = run.busiest_split()
        split.append(region)
        add_at, remove_at = run.moments(2, 0.08, 0.55)
        await run.reach(add_at)
        await run.scale(f"region add {NEW} --split-from {split[0]} --at {at}", lambda: _line(
            region_ops.add(stack.settings, stack.pw, NEW, split[0], at, run.log)))
        await run.reach(remove_at)
        await run.scale(f"region remove {NEW} --into {split[0]}", lambda: _line(
            region_ops.remove(stack.settings, stack.pw, NEW, split[0], run.log)))

    try:
        out = await execute(run, inject)
    finally:  # a run that broke off leaves no third region behind
        now = await routing_store.read_worldmap(dsn)
        if now is not None and NEW in now.regions and split:
            with contextlib.suppress(Exception):
                await region_ops.remove(stack.settings, stack.pw, NEW, split[0], run.log)
    assert not out.problems, failure_message(out)
    scaled = [f for f in run.faults if f.kind == "scale"]
    assert len(scaled) == 2 and all(f.note.startswith("SUMMARY region") for f in scaled), scaled
    final = await routing_store.read_worldmap(dsn)
    assert final is not None and final.regions == wm.regions
    # the curve is shared as before (the join put back exactly what the split took)
    assert final.to_json()["intervals"] == wm.to_json()["intervals"]
    crossed = sum(1 for e in run.reference if e[4] in ("entered", "exited"))
    run.log(f"{crossed:,} events of objects moving through the fences, split at the median")


async def _line(op: object) -> str:
    outcome = await op  # type: ignore[misc]
    assert isinstance(outcome, region_ops.Outcome)
    return outcome.line()
