"""Configurations to sensors: one persistent, confirmed message on gf-ingress amq.topic, key
`commands.sensor.<sensor_id>` (MQTT `commands/sensor/<sensor_id>`). A sensor subscribes with
QoS 1 and a persistent session, so one that is offline finds it when it reconnects."""

from __future__ import annotations

import asyncio

import aio_pika
from aio_pika.abc import AbstractRobustChannel, AbstractRobustConnection

from exchanges import topology as t


class SensorCommands:
    def __init__(self, url: str) -> None:
        self.url = url  # the AMQP URL of gf-ingress
        self._conn: AbstractRobustConnection | None = None
        self._ch: AbstractRobustChannel | None = None
        self._lock = asyncio.Lock()

    async def send(self, sensor_id: str, payload: bytes) -> None:
        """Published and confirmed by the broker, or raises."""
        async with self._lock:
            if self._conn is None or self._conn.is_closed:
                self._conn = await aio_pika.connect_robust(self.url, timeout=10)
                self._ch = await self._conn.channel(publisher_confirms=True)
            assert self._ch is not None
            ex = await self._ch.get_exchange(t.MQTT_TOPIC_EXCHANGE, ensure=False)
        await ex.publish(aio_pika.Message(payload, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                          content_type="application/octet-stream"),
                         routing_key=t.sensor_command_key(sensor_id), timeout=10)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
