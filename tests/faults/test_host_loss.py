"""Lose a host for good and lose nothing (issue 38): the fault table's rows where a machine is
gone with its disk, under the same load and verdict as every other row (tests/faults/run.py:
events identical to the ground truth after dedupe by id, the raw duplicates counted, every
planted bad input dead-lettered, nothing else).

- A worker's host lost: its x-fence process killed with `kill -9` and its state directory
  deleted, not restarted: the worker's backup (the next worker's process, which follows its
  journal stream) takes it over with its state. The host is replaced afterwards (the process
  started again on an empty disk: it rebuilds its standbys from the streams, and its worker
  is handed back to it).
- A backup lost, then its master: with two workers each process backs the other up, so w1's
  host lost is w0's backup lost (and w1 taken over by w0's process meanwhile); w1's host is
  replaced empty (its standbys rebuilt from the streams, w1 handed back to it), then w0's
  host is lost: the replacement takes w0 over.

Both in one run: w1's host lost is the first row, w0's afterwards the second.

The recovery of each: from the kill to the lost worker's queues consumed again and an event
of its fences, caused by a position published after the kill, received.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import Iterator

import httpx
import pytest

from exchanges.replica_log import backed_by
from tests.faults.run import Fault, FaultRun, Workload, execute
from tests.faults.stack import Stack, sidecar_queues
from tests.faults.timing import poll_until, say
from tests.faults.verdict import failure_message

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", autouse=True)
def healthy_afterwards(fault_stack: Stack) -> Iterator[None]:
    """A run that broke off may leave a host lost: started again for the next module (the
    session's teardown runs `geofence up` at the very end)."""
    yield
    if fault_stack.dead():
        fault_stack.restore()


def state_dir(stack: Stack, name: str) -> str:
    return str(stack.settings.state_dir / "state" / name)


async def lose_host(run: FaultRun, name: str, workers: list[str]) -> Fault:
    """`name` killed with kill -9 and its state directory deleted; not started again. Its
    recovery: the queues of `workers` (what it ran) consumed again, by another process, and
    an event of the first of them flowing."""
    f = run._begin(f"{name}'s host lost (kill -9, state deleted)", "kill")
    await asyncio.to_thread(run.stack.kill9, name)
    gone = state_dir(run.stack, name)
    await asyncio.to_thread(shutil.rmtree, gone, True)
    f.note = f"{gone} deleted"
    queues = [q for w in workers for q in sidecar_queues(run.stack.topology, f"x-fence-{w}")]
    run._measure(f, queues, f"worker:{workers[0]}")
    return f


def gauges(stack: Stack, name: str) -> dict[str, float]:
    """The x-fence process's slot gauges from its /metrics ({} while it does not answer)."""
    port = stack.settings.metrics_ports()[name]
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return {}
    found = re.findall(r"^geofence_(slots_\w+|standby_\w+)\{[^}]*\} (\S+)$", text, re.M)
    return {k: float(v) for k, v in found}


async def replace_host(run: FaultRun, name: str) -> None:
    """The lost host replaced: its process started on an empty state directory, then until
    it stands by for every worker it backs up with their state built (what the runbook has
    the operator wait for before the next loss: docs/operations.md)."""
    started = time.monotonic()
    pid = await asyncio.to_thread(run.stack.launch, name)
    copies = int(os.environ.get("GEOFENCE_FENCE_BACKUPS", "1"))
    slots = 1 + len(backed_by(name.removeprefix("x-fence-"), list(run.stack.settings.workers), copies))

    async def ready() -> bool:
        g = await asyncio.to_thread(gauges, run.stack, name)
        return (g.get("slots_serving", 0) + g.get("slots_standing_by", 0) == slots
                and g.get("standby_shadows_ready") == g.get("slots_standing_by"))

    ok = await poll_until(ready, 120)
    say(f"{run.title}: {name} started again on an empty disk (pid {pid}); "
        + (f"standing by, state built, after {time.monotonic() - started:.1f}s" if ok
           else f"NOT ready after 120s: {gauges(run.stack, name)}"))
    assert ok, f"{name} replaced did not stand by with its workers' state built"


def workers(stack: Stack) -> list[str]:
    ws = sorted(stack.settings.workers)
    assert len(ws) >= 2, f"host loss needs two workers at least, the stack has {ws}"
    return ws


async def test_a_workers_host_lost_then_its_backups_master(fault_stack: Stack, workload: Workload,
                                                          fault_seed: int) -> None:
    """The issue's two rows in one run (one stream, half the suite's time): w1's host lost is a
    worker's host lost (kill -9, state deleted, under load) and w0's backup lost while w0
    lives; then w0's host, its master, once w1's replacement stands by."""
    w0, w1 = workers(fault_stack)[:2]
    title = f"x-fence-{w1}'s host lost (kill -9 + state deleted; {w0}'s backup), replaced, then {w0}'s"
    run = FaultRun(fault_stack, workload, title, fault_seed + 11)

    async def inject(run: FaultRun) -> None:
        first, second = run.moments(2, 0.15, 0.6)
        await run.reach(first)
        await lose_host(run, f"x-fence-{w1}", [w1])  # a worker's host, and w0's backup
        await run.recovered()
        await replace_host(run, f"x-fence-{w1}")
        await run.reach(second)
        await lose_host(run, f"x-fence-{w0}", [w0])  # then the master
        await run.recovered()
        await replace_host(run, f"x-fence-{w0}")

    out = await execute(run, inject)
    assert not out.problems, failure_message(out)
