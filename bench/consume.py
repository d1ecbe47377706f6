"""Consuming from a quorum queue: aio-pika (a message object and a task per delivery, as the
sidecars consumed until issue 39) against the bulk consumer (exchanges/shell/bulk_consumer.py:
one parse per socket read). The queue is filled with `--messages` small persistent messages
first (an MQTT position's size and headers), then drained by one consumer that acks every
500 (aio-pika) or every read (bulk); this process's CPU time over the drain, per message.

    .venv/bin/python -m bench.consume [--messages 100000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from bench import report
from deploy.settings import load_connection_settings
from exchanges.shell.amqp_frames import Delivery
from exchanges.shell.bulk_consumer import open_bulk

BODY = b'{"lon": 9.61234567, "lat": 47.1234567, "ts": 1795943463.4909499}'
PREFETCH = 2000


def cpu() -> float:
    t = os.times()
    return t.user + t.system


async def fill(url: str, queue: str, n: int) -> None:
    async with await aio_pika.connect(url) as c:
        ch = await c.channel()
        await ch.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
        pub = await c.channel(publisher_confirms=False)
        for _ in range(n):
            await pub.default_exchange.publish(aio_pika.Message(BODY, delivery_mode=2,
                                                                headers={"x-mqtt-publish-qos": 1}), queue)
        while ((await ch.declare_queue(queue, passive=True)).declaration_result.message_count or 0) < n:
            await asyncio.sleep(0.2)  # the last publishes enqueued (no confirms to wait on)


async def with_aio_pika(url: str, queue: str, n: int) -> tuple[float, float]:
    async with await aio_pika.connect(url) as c:
        ch = await c.channel()
        await ch.set_qos(prefetch_count=PREFETCH)
        q = await ch.declare_queue(queue, passive=True)
        held: list[AbstractIncomingMessage] = []
        got, done = [0], asyncio.Event()

        async def on(m: AbstractIncomingMessage) -> None:
            held.append(m)
            got[0] += 1
            if len(held) >= 500 or got[0] >= n:
                last = held[-1]
                held.clear()
                await last.ack(multiple=True)
            if got[0] >= n:
                done.set()

        t0, c0 = time.perf_counter(), cpu()
        await q.consume(on)
        await done.wait()
        return time.perf_counter() - t0, cpu() - c0


async def with_bulk(url: str, queue: str, n: int) -> tuple[float, float]:
    conn = await open_bulk(url, 10)
    try:
        ch = await conn.channel()
        await ch.qos(PREFETCH)
        got, arrived = [0], asyncio.Event()
        newest: list[Delivery | None] = [None]

        def on(ds: list[Delivery]) -> None:
            got[0] += len(ds)
            newest[0] = ds[-1]
            arrived.set()

        t0, c0 = time.perf_counter(), cpu()
        await ch.consume(queue, on)
        while True:
            await arrived.wait()
            arrived.clear()
            last = newest[0]
            if last is not None:
                await last.ack(multiple=True)
            if got[0] >= n:
                return time.perf_counter() - t0, cpu() - c0
    finally:
        await conn.close()


async def one(kind: str, n: int) -> tuple[float, float]:
    url = load_connection_settings()["amqp"]["/"]
    queue = f"bench.consume.{uuid.uuid4().hex[:8]}"
    await fill(url, queue, n)
    try:
        return await (with_aio_pika(url, queue, n) if kind == "aio-pika" else with_bulk(url, queue, n))
    finally:
        async with await aio_pika.connect(url) as c:
            await (await c.channel()).queue_delete(queue)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.consume", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds of both consumers")
    a = p.parse_args(argv)
    rows, us = [], {"aio-pika": [], "bulk": []}  # type: ignore[var-annotated]
    for r in range(a.rounds):
        for kind in ("aio-pika", "bulk"):
            wall, spent = asyncio.run(one(kind, a.messages))
            us[kind].append(spent / a.messages * 1e6)
            rows.append([f"{kind} (round {r + 1})", f"{a.messages / wall:,.0f}", f"{us[kind][-1]:.1f}"])
    print(report.table(["consumer", "messages/s", "CPU us/message"], rows))
    ratio = min(us["aio-pika"]) / min(us["bulk"])
    print(report.summary([f"aio-pika {min(us['aio-pika']):.1f} us/message", f"bulk {min(us['bulk']):.1f} "
                          f"us/message ({ratio:.1f}x less CPU)"], lead="bench.consume"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
