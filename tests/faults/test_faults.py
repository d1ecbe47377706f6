"""Nothing lost, nothing duplicated (issue 5): a scripted stream of 50,000 position updates
over 500 fences with a shapely ground truth, through the live stack while faults are
injected at random moments (seeded: the seed is printed; FAULT_SEED=<seed> replays them):

- every sidecar kind killed with `kill -9` and restarted by the harness;
- RabbitMQ stopped and started again mid-stream, twice;
- the sidecars' AMQP connections cut by a TCP proxy, several times.

The workload is two tenants sharing the stack (tests/faults/tenants.py): the fences and the
objects split between them, each tenant's positions published by its own gateway user under
its own key, the ground truth per tenant (each tenant's objects against its own fences).

Each run asserts that the events a consumer deduping on event_id received are exactly the
ground truth (none lost, none invented), that no event pairs a fence with another tenant's
object (on the wire or in the archive: the table's x-tenant column), that every planted bad
input is in a dead-letter queue with its reason and nothing else of the run is, that no
sidecar is left dead, and that the archive (fence_event) holds exactly the distinct events;
the raw duplicate count and the recovery time of every fault go into the table printed at the
end of the session.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.proxy import Proxied
from tests.faults.run import FaultRun, Workload, execute
from tests.faults.stack import Stack
from tests.faults.verdict import failure_message

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", autouse=True)
def healthy_afterwards(fault_stack: Stack) -> Iterator[None]:
    """The stack as `geofence up` leaves it as soon as these tests are done (the session's
    teardown does it again at the very end)."""
    yield
    fault_stack.restore()


async def test_kill_each_sidecar(fault_stack: Stack, workload: Workload, fault_seed: int) -> None:
    stack = fault_stack
    names = ["x-ingress", *(f"x-geo-{r}" for r in stack.settings.regions),
             *(f"x-fence-{w}" for w in stack.settings.workers), "fence-archiver"]
    run = FaultRun(stack, workload, f"kill -9 each sidecar ({len(names)})", fault_seed)

    async def inject(run: FaultRun) -> None:
        order = [names[i] for i in run.rng.permutation(len(names))]
        for name, at in zip(order, run.moments(len(names)), strict=True):
            await run.reach(at)
            await run.kill(name)

    out = await execute(run, inject)
    assert not out.problems, failure_message(out)


async def test_broker_restart(fault_stack: Stack, workload: Workload, fault_seed: int) -> None:
    run = FaultRun(fault_stack, workload, "RabbitMQ stop + start (x2)", fault_seed + 1)

    async def inject(run: FaultRun) -> None:
        for at in run.moments(2, 0.1, 0.6):
            await run.reach(at)
            await run.restart_broker()
            await run.recovered()  # one outage at a time

    out = await execute(run, inject)
    assert not out.problems, failure_message(out)


async def test_tcp_cuts(fault_stack: Stack, workload: Workload, fault_seed: int) -> None:
    stack = fault_stack
    names = ["x-ingress", *(f"x-geo-{r}" for r in stack.settings.regions),
             *(f"x-fence-{w}" for w in stack.settings.workers), "fence-archiver"]
    cuts = 3
    proxied = Proxied(stack, names)
    run = FaultRun(stack, workload, f"TCP cuts x{cuts} ({len(names)} sidecars proxied)", fault_seed + 2)

    async def inject(run: FaultRun) -> None:
        for at in run.moments(cuts):
            await run.reach(at)
            await run.cut(proxied.proxy, names)
            await run.recovered()  # the next cut finds connections to cut

    try:
        await proxied.start()
        out = await execute(run, inject)
    finally:
        await proxied.restore()
    assert proxied.proxy.accepted > len(names), "the sidecars did not connect through the proxy"
    assert not out.problems, failure_message(out)
