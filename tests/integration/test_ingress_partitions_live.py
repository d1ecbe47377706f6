"""RabbitMQ's consistent-hash exchange sends a routing key where exchanges/ingress_partitions.py
says (the gateway path relies on it to keep an object's positions in one partition), and the
topology's partition exchange is the one the MQTT positions go through."""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import aiormq
import pytest

from deploy.settings import ConnectionSettings
from exchanges import ingress_partitions as ip
from exchanges import topology as t
from tests.integration.clients import DEADLINE, Login, api, connect, q

KEYS = 400


async def test_the_broker_picks_the_partition_we_compute(stack: ConnectionSettings) -> None:
    """A private x-consistent-hash exchange bound like x-ingress.partition (16 queues, weight 1,
    in order): every key lands in the queue `partition_of_key` names."""
    tag = uuid.uuid4().hex[:8]
    async with await connect(stack, t.ADMIN_USER, t.INGRESS_VHOST) as conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.declare_exchange(f"test.chx.{tag}", ip.EXCHANGE_TYPE, auto_delete=True)
        queues = []
        for p in range(ip.PARTITIONS):
            queue = await ch.declare_queue(f"test.chx.{tag}.p{p:02d}", exclusive=True)
            await queue.bind(ex, "1")
            queues.append(queue)
        keys = [f"positions.t{i % 7}.obj-{i}{uuid.uuid4().hex[:i % 20]}" for i in range(KEYS)]
        for key in keys:
            await ex.publish(aio_pika.Message(key.encode()), routing_key=key)
        landed: dict[str, int] = {}
        for p, queue in enumerate(queues):
            while True:
                m = await queue.get(no_ack=True, fail=False, timeout=DEADLINE)
                if m is None:
                    break
                landed[m.body.decode()] = p
        await ex.delete()
    assert len(landed) == KEYS
    wrong = {k: (p, ip.partition_of_key(k)) for k, p in landed.items() if p != ip.partition_of_key(k)}
    assert not wrong, f"{len(wrong)} keys elsewhere than computed, e.g. {list(wrong.items())[:3]}"
    assert len(set(landed.values())) == ip.PARTITIONS


async def test_the_topology_binds_the_partitions_in_bucket_order(stack: ConnectionSettings) -> None:
    path = f"api/exchanges/{q(t.INGRESS_VHOST)}/{q(t.PARTITION_EXCHANGE)}"
    info = await asyncio.to_thread(api, stack, path)
    assert info["type"] == ip.EXCHANGE_TYPE and info["durable"]
    out = await asyncio.to_thread(api, stack, f"{path}/bindings/source")
    assert sorted((b["destination"], b["routing_key"]) for b in out) == [(n, "1") for n in ip.queue_names()]
    into = await asyncio.to_thread(api, stack, f"{path}/bindings/destination")
    assert [(b["source"], b["routing_key"]) for b in into] == [
        (t.MQTT_TOPIC_EXCHANGE, t.POSITIONS_TOPIC_PATTERN)]


async def test_no_client_can_pass_a_message_off_as_a_hand_on(stack: ConnectionSettings,
                                                             gateway: Login) -> None:
    """x-ingress reads what comes from the default exchange as its own hand-ons, unchecked
    (ingress/partition_split.py): a gateway (or a device) publishing there is refused."""
    async with await connect(stack, gateway, t.INGRESS_VHOST) as conn:
        ch = await conn.channel(publisher_confirms=True)
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused, match=r"amq\.default"):
            await ch.default_exchange.publish(aio_pika.Message(b"{}"), routing_key=t.PARTITION_QUEUES[0])
