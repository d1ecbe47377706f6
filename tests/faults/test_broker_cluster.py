"""One RabbitMQ node of three lost under load, then back (issue 38): the stack is made a cluster
of three nodes (`geofence up --broker-nodes 3`: two nodes join the first, every quorum queue
and stream gets a member on each, the sidecars are spread over the nodes and fail over between
them), the fault suite's stream runs, node 2 is killed (kill -9 of its Erlang VM: its
connections, its queue members and the queue leaders it held are gone at once), the pipeline
recovers without it (a node lost for good: its return is not waited for), and later it is
started again (it rejoins, its members catch up). After the event-id dedupe the events must be
exactly the shapely ground truth; the recovery of each step is in the suite's table. Then the
stack goes back to one node (`geofence up --broker-nodes 1`), as the rest of the suite wants it.

The suite's own clients (the paced publisher, the event collector, the queue probes) stay on
node 1: what is measured is the pipeline's loss of a node, not the test's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import aio_pika
import pytest

from deploy import broker_cluster, exposure
from tests.faults.run import FaultRun, Workload, execute
from tests.faults.stack import Stack
from tests.faults.timing import say
from tests.faults.verdict import failure_message
from tests.security.attacks import refused
from tests.security.mqtt import Mqtt

pytestmark = pytest.mark.timeout(900)
KILLED = 2  # a node that holds queue leaders and sidecar connections (not node 1: see broker_cluster)


def _shape(stack: Stack, nodes: int) -> None:
    stack.settings = dataclasses.replace(stack.settings, broker_nodes=nodes)
    stack.up()


async def _host_defaults_of_the_other_nodes(stack: Stack) -> None:
    """Nodes 2 and 3 have node 1's host defaults (the attack table's rows, tests/security/
    test_host_defaults.py, run against node 1): no anonymous MQTT, no guest, every port of
    theirs (AMQP, MQTT, management, Prometheus, the Erlang distribution) on loopback only."""
    s = stack.settings
    for node in range(2, s.broker_nodes + 1):
        mqtt_port = s.node_port(s.mqtt_port, node)
        conn = {**stack.conn, "mqtt": {**stack.conn["mqtt"], "port": mqtt_port}}
        try:
            await asyncio.to_thread(Mqtt, conn, "", None, f"anon-{uuid.uuid4().hex[:8]}")  # type: ignore[arg-type]
            anonymous = "accepted"
        except AssertionError:
            anonymous = "refused"
        amqp_port = s.node_port(s.amqp_port, node)
        guest = await refused(aio_pika.connect(f"amqp://guest:guest@{s.host}:{amqp_port}/", timeout=10))
        bases = (s.amqp_port, s.mqtt_port, s.management_port, s.rabbitmq_metrics_port)
        ports = [s.node_port(base, node) for base in bases] + [broker_cluster.DIST_PORT[node]]
        listening = {x.port for x in exposure.listeners()} & set(ports)
        assert anonymous == "refused" and guest.startswith("refused"), (node, anonymous, guest)
        assert listening == set(ports) and not exposure.exposed(ports), (node, sorted(listening), ports)


async def test_one_broker_node_of_three_killed_then_back(fault_stack: Stack, workload: Workload,
                                                         fault_seed: int) -> None:
    stack = fault_stack
    await asyncio.to_thread(_shape, stack, 3)
    try:
        members = await asyncio.to_thread(broker_cluster.members, 1)
        assert len(members) == 3, f"the cluster has {members}"
        await _host_defaults_of_the_other_nodes(stack)
        run = FaultRun(stack, workload, f"RabbitMQ node {KILLED} of 3 killed (kill -9), then started again",
                       fault_seed + 11)

        async def inject(run: FaultRun) -> None:
            kill_at, back_at = run.moments(2, 0.1, 0.6)
            await run.reach(kill_at)
            await run.kill_broker_node(KILLED)
            await run.recovered()  # with the node still down: what a node lost for good costs
            await run.reach(back_at)
            await run.start_broker_node(KILLED)
            await run.recovered()

        out = await execute(run, inject)
    finally:
        say("back to one RabbitMQ node")
        await asyncio.to_thread(_shape, stack, 1)
    assert not out.problems, failure_message(out)
    faults = [f for f in run.faults if f.kind == "broker"]
    assert len(faults) == 2 and all(f.recovery_s is not None for f in faults), faults
    assert await asyncio.to_thread(broker_cluster.members, 1) == [broker_cluster.first_node()]
