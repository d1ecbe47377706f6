"""The local stack is really up: each service answers a real client.

Every wait has a deadline (an Event, a queue or asyncio.timeout); nothing sleeps to
synchronise.
"""

from __future__ import annotations

import asyncio
import base64
import json
import queue
import subprocess
import sys
import threading
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import aiomcache
import asyncpg
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from deploy.processes import load_state
from deploy.settings import ConnectionSettings, Settings, load_connection_settings
from exchanges.login_guard import client_id_for

DEADLINE = 15.0  # seconds, for any single wait


def geofence(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("geofence")
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "deploy.cli"]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=300)


async def test_amqp_publish_with_confirms_and_consume(stack: ConnectionSettings) -> None:
    connection = await aio_pika.connect(stack["amqp"]["/"], timeout=DEADLINE)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue_ = await channel.declare_queue(f"test.stack.{uuid.uuid4().hex}", durable=True)
        try:
            body = uuid.uuid4().bytes
            confirmation = await channel.default_exchange.publish(
                aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=queue_.name, timeout=DEADLINE)
            assert confirmation is not None  # a nack or a timeout would have raised
            async with asyncio.timeout(DEADLINE), queue_.iterator() as messages:
                async for message in messages:
                    async with message.process():
                        assert message.body == body
                    break
        finally:
            await queue_.delete(if_unused=False, if_empty=False)


def test_mqtt_subscriber_receives_its_own_publish(stack: ConnectionSettings) -> None:
    cfg = stack["mqtt"]
    topic = f"test/stack/{uuid.uuid4().hex}"
    connected, subscribed = threading.Event(), threading.Event()
    received: queue.Queue[bytes] = queue.Queue()
    codes: list[Any] = []

    def on_connect(client: mqtt.Client, userdata: Any, flags: Any, reason: Any,
                   properties: Any) -> None:
        codes.append(reason)
        connected.set()

    me = cfg["username"].split(":", 1)[-1]
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311,
                         client_id=client_id_for(me, f"test-{uuid.uuid4().hex[:8]}"))
    client.username_pw_set(cfg["username"], cfg["password"])
    client.on_connect = on_connect
    client.on_subscribe = lambda *args: subscribed.set()
    client.on_message = lambda c, u, msg: received.put(bytes(msg.payload))
    client.connect(cfg["host"], cfg["port"], keepalive=30)
    client.loop_start()
    try:
        assert connected.wait(DEADLINE), "no CONNACK"
        assert not codes[0].is_failure, f"MQTT login refused: {codes[0]}"
        client.subscribe(topic, qos=1)
        assert subscribed.wait(DEADLINE), "no SUBACK"
        payload = uuid.uuid4().hex.encode()
        client.publish(topic, payload, qos=1).wait_for_publish(DEADLINE)
        assert received.get(timeout=DEADLINE) == payload
    finally:
        client.disconnect()
        client.loop_stop()


async def test_postgres_query(stack: ConnectionSettings) -> None:
    conn = await asyncpg.connect(stack["postgres"]["dsn"], timeout=DEADLINE)
    try:
        row = await conn.fetchrow(
            "SELECT current_user AS who, current_database() AS db, 6 * 7 AS n")
        assert row is not None
        assert (row["who"], row["db"], row["n"]) == ("geofence", "geofence", 42)
        owner = await conn.fetchval("SELECT pg_get_userbyid(datdba) FROM pg_database "
                                    "WHERE datname = current_database()")
        assert owner == "geofence"
    finally:
        await conn.close()


async def test_memcached_set_get(stack: ConnectionSettings) -> None:
    client = aiomcache.Client(stack["memcached"]["host"], stack["memcached"]["port"])
    try:
        key, value = f"test-{uuid.uuid4().hex}".encode(), uuid.uuid4().bytes
        async with asyncio.timeout(DEADLINE):
            assert await client.set(key, value, exptime=60)
            assert await client.get(key) == value
            await client.delete(key)
    finally:
        await client.close()


def test_plugins_enabled_and_listening(stack: ConnectionSettings) -> None:
    listed = subprocess.run(["rabbitmq-plugins", "list", "-e", "-m"], capture_output=True,
                            text=True, timeout=120, check=True, cwd="/").stdout.split()
    for plugin in ("rabbitmq_mqtt", "rabbitmq_federation", "rabbitmq_management",
                   "rabbitmq_shovel", "rabbitmq_prometheus"):
        assert plugin in listed
    overview = _management_get(stack, "api/overview")
    protocols = {listener["protocol"] for listener in overview["listeners"]}
    assert {"amqp", "mqtt", "http"} <= protocols


def _management_get(stack: ConnectionSettings, path: str) -> Any:
    auth = base64.b64encode(f"geofence:{stack['mqtt']['password']}".encode()).decode()
    request = urllib.request.Request(stack["management"]["url"] + path,
                                     headers={"Authorization": f"Basic {auth}"})
    with urllib.request.urlopen(request, timeout=DEADLINE) as response:
        return json.load(response)


def test_second_up_is_harmless(stack: ConnectionSettings) -> None:
    state_file = Settings.from_env().state_file
    before = load_state(state_file)
    done = geofence("up")
    assert done.returncode == 0, done.stderr
    assert load_state(state_file) == before  # same services, same pids, same start times
    assert "starting" not in done.stdout


def test_status_json_matches_load_connection_settings(stack: ConnectionSettings) -> None:
    done = geofence("status", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == load_connection_settings() == stack


def test_human_status_masks_passwords(stack: ConnectionSettings) -> None:
    done = geofence("status")
    assert done.returncode == 0, done.stdout + done.stderr
    pg_password = urlsplit(stack["postgres"]["dsn"]).password
    for password in (stack["mqtt"]["password"], pg_password):
        assert password and password not in done.stdout
    assert "****" in done.stdout
    for service in ("rabbitmq", "mqtt", "management", "postgres", "memcached"):
        assert service in done.stdout
