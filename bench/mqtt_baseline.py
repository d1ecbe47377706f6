"""The bare broker's MQTT ingest: the reference `bench.e2e --mode mqtt` is compared with in the
same run (issue 39: the pipeline's MQTT path at >= 80% of it).

The same publishers as the pipeline's run (bench/broker_modes.publish_mqtt_as: MQTT clients in
processes, lean or paho, QoS 1, one message per update, an object always through one client) publish the
same stream into RabbitMQ's MQTT plugin, amq.topic and one durable quorum queue, whose only
consumer acks what it gets (the bulk consumer, exchanges/shell/bulk_consumer.py: one multiple
ack per read of the socket). What that takes is the broker's own cost of the path, on this
machine, now; the pipeline cannot beat it, since every position of it takes the same path
first. In vhost "/", as the stack's administrator, on topics `bench/<run>/<object>`; the
queue goes after the run.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
import uuid
from dataclasses import dataclass

import aio_pika
import numpy as np

from bench import workload as wl
from bench.broker_modes import publish_mqtt_as
from deploy.settings import ConnectionSettings, load_connection_settings
from exchanges.shell.amqp_frames import Delivery
from exchanges.shell.bulk_consumer import BulkConnection, open_bulk

PREFETCH = 4000
PATH = "QoS 1 -> MQTT plugin -> amq.topic -> a quorum queue -> a consumer that only acks (bulk)"
DEADLINE_S = 600.0


@dataclass
class BareRun:
    updates: int
    received: int
    seconds: float  # from the first update sent to the last one received

    @property
    def updates_per_s(self) -> float:
        return self.received / self.seconds if self.seconds > 0 else 0.0


async def run(stream: wl.Stream, clients: int, publisher: str = "lean") -> BareRun:
    """The run; `publisher` "lean" (bench/mqtt_load.py) or "paho"."""
    conn = load_connection_settings()
    paho = publisher == "paho"
    run_id = uuid.uuid4().hex[:8]
    queue, key = f"bench.mqtt-bare.{run_id}", f"bench.{run_id}.#"
    url = conn["amqp"]["/"]
    async with await aio_pika.connect(url) as admin:
        ch = await admin.channel()
        q = await ch.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
        await q.bind("amq.topic", key)
        bulk = await open_bulk(url, 10)
        try:
            return await _measure(conn, bulk, queue, run_id, stream, clients, paho)
        finally:
            await bulk.close()
            await ch.queue_delete(queue)


async def _measure(conn: ConnectionSettings, bulk: BulkConnection, queue: str, run_id: str,
                   stream: wl.Stream, clients: int, paho: bool) -> BareRun:
    ch = await bulk.channel()
    await ch.qos(PREFETCH)
    got = [0]
    last_at = [0.0]
    newest: list[Delivery | None] = [None]
    arrived = asyncio.Event()

    def take(ds: list[Delivery]) -> None:
        got[0] += len(ds)
        last_at[0] = time.time()
        newest[0] = ds[-1]
        arrived.set()

    await ch.consume(queue, take)
    m = conn["mqtt"]
    cfg: dict[str, object] = {"host": m["host"], "port": m["port"], "username": m["username"],
                              "password": m["password"]}
    sent_at = np.zeros(len(stream))
    publishing = asyncio.create_task(asyncio.to_thread(
        publish_mqtt_as, cfg, f"bench/{run_id}", stream, sent_at, None, clients,
        mp.get_context("fork").Value("q", 0), paho))
    end = time.monotonic() + DEADLINE_S
    while got[0] < len(stream) and time.monotonic() < end:
        arrived.clear()
        with_ack = newest[0]
        if with_ack is not None:
            newest[0] = None
            await with_ack.ack(multiple=True)
        if publishing.done() and publishing.exception() is not None:
            raise publishing.exception()  # type: ignore[misc]
        try:
            await asyncio.wait_for(arrived.wait(), 5)
        except TimeoutError:
            if publishing.done():
                break
    if newest[0] is not None:
        await newest[0].ack(multiple=True)
    await publishing
    first = float(sent_at[sent_at > 0].min()) if (sent_at > 0).any() else time.time()
    return BareRun(len(stream), got[0], last_at[0] - first)
