"""A paho MQTT client for the attack table: log in as a RabbitMQ user, publish with QoS 1 and
subscribe, and say what the broker answered (a PUBACK, a SUBACK's codes, or the connection
closed: RabbitMQ's MQTT plugin closes the connection of a client publishing where its topic
permission does not allow)."""

from __future__ import annotations

import queue
import uuid
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from deploy.settings import ConnectionSettings
from exchanges import topology as t

WAIT_S = 15.0


class Mqtt:
    def __init__(
        self, stack: ConnectionSettings, user: str, password: str | None, client_id: str | None = None
    ) -> None:
        """`password` None: no user name or password in the CONNECT (anonymous)."""
        cfg = stack["mqtt"]
        self.events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id or user,
            clean_session=True,
            protocol=mqtt.MQTTv311,
            reconnect_on_failure=False,
        )
        if password is not None:
            self.client.username_pw_set(f"{t.INGRESS_VHOST}:{user}", password)
        self.client.on_connect = lambda c, u, f, reason, p: self.events.put(("connack", reason))
        self.client.on_disconnect = lambda c, u, f, reason, p: self.events.put(("disconnect", reason))
        self.client.on_subscribe = lambda c, u, mid, codes, p: self.events.put(("suback", codes))
        self.client.on_publish = lambda c, u, mid, reason, p: self.events.put(("puback", mid))
        self.client.on_message = lambda c, u, msg: self.events.put(
            ("message", (msg.topic, bytes(msg.payload)))
        )
        self.client.connect(cfg["host"], cfg["port"], keepalive=30)
        self.client.loop_start()
        kind, reason = self.next()
        if kind != "connack" or reason.is_failure:
            self.client.loop_stop()
            raise AssertionError(f"MQTT login of {user} refused: {kind} {reason}")

    def next(self) -> tuple[str, Any]:
        try:
            return self.events.get(timeout=WAIT_S)
        except queue.Empty:
            return ("nothing", None)

    def publish(self, topic: str, payload: bytes) -> str:
        """'puback' (taken) or what came instead ('disconnect': refused)."""
        self.client.publish(topic, payload, qos=1)
        while True:
            kind, _ = self.next()
            if kind in ("puback", "disconnect", "nothing"):
                return kind

    def subscribe(self, topic: str) -> str:
        """'granted', 'refused' (a SUBACK failure code) or 'disconnect'."""
        self.client.subscribe(topic, qos=1)
        while True:
            kind, value = self.next()
            if kind == "suback":
                return "refused" if any(c.is_failure for c in value) else "granted"
            if kind in ("disconnect", "nothing"):
                return kind

    def message(self) -> tuple[str, bytes] | None:
        while True:
            kind, value = self.next()
            if kind == "message":
                return value  # type: ignore[no-any-return]
            if kind in ("disconnect", "nothing"):
                return None

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def client_id() -> str:
    return f"sec-{uuid.uuid4().hex[:10]}"
