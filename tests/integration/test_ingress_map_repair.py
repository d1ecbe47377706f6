"""`geofence up` and a partition map naming an x-ingress instance the stack does not run (an
`ingress add` or `remove` cut short; seen in CI: the fault suite's next `up` waited 60 s for
consumers on x-ingress.p06-p13, which the map gave to an instance no longer run): the
instance's partitions go to those run, nothing else moves, and every partition queue has its
consumer again."""

from __future__ import annotations

import asyncio
import time

from deploy import ingress_ops, sidecars
from deploy.settings import ConnectionSettings, Settings, load_secrets
from exchanges import ingress_partitions as ip
from exchanges import routing_store
from tests.integration.clients import DEADLINE

PHANTOM = f"{ip.FIRST_INSTANCE}-97"


async def test_up_gives_an_instance_not_run_its_partitions_back(stack: ConnectionSettings) -> None:
    settings = Settings.from_env()
    pw = load_secrets(settings)
    dsn = stack["postgres"]["dsn"]
    run = {ip.FIRST_INSTANCE, *(ingress_ops.instance_name(n) for n in settings.ingress)}
    conn = await routing_store.connect(dsn)
    try:
        _, before = await routing_store.assignment_or_first(conn)
        phantom = ip.assign([*run, PHANTOM], before)
        await routing_store.store_assignment(conn, phantom)
        said: list[str] = []
        await sidecars.prepare_database(dsn, settings.regions, said.append, settings.workers, None,
                                        settings.ingress)
        _, after = await routing_store.assignment_or_first(conn)
    finally:
        await conn.close()
    assert set(after.values()) == run, after
    kept = {p for p, n in phantom.items() if n != PHANTOM}
    assert all(after[p] == phantom[p] for p in kept), "a partition of an instance run moved"
    assert [line for line in said if PHANTOM in line], said
    deadline = time.monotonic() + DEADLINE
    while not await asyncio.to_thread(ingress_ops.partitions_consumed, settings, pw):
        assert time.monotonic() < deadline, "a partition queue without a consumer after the repair"
        await asyncio.sleep(0.2)
