"""`geofence dlq list | replay` on the local stack: messages the x-ingress sidecar (or the
broker) dead-letters are listed without being removed, and replayed to the queue they came
from, where they fail again and come back with `x-geofence-replays` = 1.

The dead-letters queues are shared with everything else running on the stack, so every test
finds its own messages by a fresh marker (in the reason, or the message id), never by counts
alone, and removes them at the end. Every wait has a deadline.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import aio_pika
import pytest

from deploy.settings import ConnectionSettings
from exchanges import ingress_partitions
from exchanges import topology as t
from tests.integration.clients import DEADLINE, Login, geofence, poll, publish

pytestmark = pytest.mark.integration

INGRESS = t.INGRESS_VHOST
DEAD_LETTER_DEADLINE = 30.0  # a sidecar dead-letters within a batch; generous for a busy machine


def dlq(*args: str) -> Any:
    return geofence("dlq", *args)


def listed(vhost: str, *filters: str) -> list[dict[str, Any]]:
    """`geofence dlq list --json` of one vhost: one object per message."""
    done = dlq("list", "--json", "--vhost", vhost, *filters)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


async def until_listed(vhost: str, *filters: str, want: Callable[[list[dict[str, Any]]], object],
                       what: str) -> list[dict[str, Any]]:
    """Poll `dlq list` until `want(rows)` holds; the rows then."""
    rows: list[dict[str, Any]] = []

    def check() -> bool:
        nonlocal rows
        rows = listed(vhost, *filters)
        return bool(want(rows))

    await poll(check, what, DEAD_LETTER_DEADLINE)
    return rows


async def dead_letter_count(stack: ConnectionSettings, vhost: str) -> int:
    async with await aio_pika.connect(stack["amqp"][vhost], timeout=DEADLINE) as conn:
        ch = await conn.channel()
        q = await ch.declare_queue(t.DEAD_LETTER_QUEUE, passive=True)
        return int(q.declaration_result.message_count or 0)


async def remove(stack: ConnectionSettings, vhost: str, message_ids: Sequence[str]) -> int:
    """Ack (remove) this test's messages from the vhost's dead-letters queue; the others go
    back when the channel closes. Returns how many were removed."""
    removed = 0
    async with await aio_pika.connect(stack["amqp"][vhost], timeout=DEADLINE) as conn:
        ch = await conn.channel()
        q = await ch.declare_queue(t.DEAD_LETTER_QUEUE, passive=True)
        for _ in range(int(q.declaration_result.message_count or 0)):
            m = await q.get(no_ack=False, fail=False)
            if m is None:
                break
            if m.message_id in message_ids:
                await m.ack()
                removed += 1
        await ch.close()
    return removed


@pytest.fixture
async def cleanup(stack: ConnectionSettings) -> AsyncIterator[list[str]]:
    """Message ids to remove from gf-ingress's dead-letters queue after the test."""
    ids: list[str] = []
    yield ids
    await remove(stack, INGRESS, ids)


def batch(*positions: dict[str, Any]) -> bytes:
    return json.dumps({"positions": list(positions)}).encode()


# --------------------------------------------------------------------------- sidecar dead letters


async def test_list_then_replay_a_gateway_batch(stack: ConnectionSettings, cleanup: list[str],
                                                 gateway: Login) -> None:
    """A tenant's gateway publishes to ingress.gateway with its tenant as the routing key."""
    marker = uuid.uuid4().hex
    bad_json = b"{not json " + marker.encode()
    bad_id = batch({"id": f"dlq test {marker}", "lon": 9.5, "lat": 47.1, "ts": time.time()})
    json_id = await publish(stack, gateway, INGRESS, t.GATEWAY_EXCHANGE, gateway.tenant, bad_json)
    marked_id = await publish(stack, gateway, INGRESS, t.GATEWAY_EXCHANGE, gateway.tenant, bad_id)
    cleanup += [json_id, marked_id]

    rows = await until_listed(INGRESS, what="x-ingress to dead-letter both batches",
                              want=lambda rows: {json_id, marked_id} <= {r["message_id"] for r in rows})
    by_id = {r["message_id"]: r for r in rows}
    bad = by_id[json_id]
    assert bad["kind"] == "sidecar" and bad["source"] == t.BATCHES_QUEUE
    assert bad["routing_key"] == gateway.tenant
    assert bad["reason"].startswith("malformed JSON"), bad
    assert bad["size"] == len(bad_json) and bad["preview"] == bad_json.decode()
    assert bad["replays"] == 0 and bad["replayable"] is True
    assert bad["headers"]["x-geofence-source"] == t.BATCHES_QUEUE
    marked = by_id[marked_id]
    assert marked["reason"].startswith("1 of 1 positions refused: position 0: id 'dlq test "), marked
    assert marker in marked["reason"] and marked["source"] == t.BATCHES_QUEUE

    # list removes nothing (the command checks the queue's length too: exit 1 if shorter)
    before = await dead_letter_count(stack, INGRESS)
    done = dlq("list", "--vhost", INGRESS)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    assert await dead_letter_count(stack, INGRESS) >= before
    lines = done.stdout.splitlines()
    assert lines[0].split()[:6] == ["VHOST", "SOURCE", "KIND", "SIZE", "TIME", "MESSAGE-ID"]
    assert any(json_id in line and t.BATCHES_QUEUE in line and "malformed JSON" in line for line in lines)
    summary = next(line for line in lines if line.startswith(f"{INGRESS}: "))
    assert "dead letters: " in summary and "'malformed JSON'" in summary, summary
    assert {r["message_id"] for r in listed(INGRESS, "--reason", marker)} == {json_id, marked_id} - {json_id}

    # a dry run changes nothing
    done = dlq("replay", "--vhost", INGRESS, "--reason", marker, "--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"would replay  {INGRESS}  {t.BATCHES_QUEUE}  {marked_id}" in done.stdout
    assert "would replay 1 dead letter" in done.stdout
    assert [r["replays"] for r in listed(INGRESS, "--reason", marker)] == [0]

    # replay the marked one only: it leaves the DLQ, x-ingress refuses it again, it comes back
    done = dlq("replay", "--vhost", INGRESS, "--reason", marker)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"replayed  {INGRESS}  {t.BATCHES_QUEUE}  {marked_id}" in done.stdout
    assert (f"{INGRESS}: replayed 1 of 1 matching dead letters (1 to {t.BATCHES_QUEUE})"
            in done.stdout.splitlines())
    again = await until_listed(INGRESS, "--reason", marker, what="the replayed batch dead-lettered again",
                               want=lambda rows: any(r["replays"] == 1 for r in rows))
    assert len(again) == 1, again  # the original copy left the DLQ: one copy, replayed once
    (back,) = again
    assert back["message_id"] == marked_id and back["source"] == t.BATCHES_QUEUE
    # the replay kept the routing key (the tenant): refused for the same reason, not for its key
    assert back["routing_key"] == gateway.tenant
    assert back["reason"] == marked["reason"] and back["last_reason"] == marked["reason"]
    assert back["headers"]["x-geofence-replays"] == 1
    assert back["replayed_at"] is not None and abs(back["replayed_at"] - time.time()) < DEAD_LETTER_DEADLINE
    # the unmatched one is untouched
    (still,) = listed(INGRESS, "--message-id", json_id)
    assert still["replays"] == 0 and still["reason"] == bad["reason"]
    assert await remove(stack, INGRESS, [json_id, marked_id]) == 2


async def test_a_replayed_mqtt_position_keeps_its_routing_key(stack: ConnectionSettings,
                                                              cleanup: list[str], tenant: str) -> None:
    """x-ingress reads the tenant and the object id from the routing key
    (positions.<tenant>.<object_id>): a replay that lost it would come back refused for its
    routing key, not for its latitude."""
    obj = f"dlq-{uuid.uuid4().hex[:10]}"
    key = f"positions.{tenant}.{obj}"
    body = json.dumps({"lon": 9.5, "lat": 91, "ts": time.time()}).encode()
    mid = await publish(stack, t.ADMIN_USER, INGRESS, t.MQTT_TOPIC_EXCHANGE, key, body)
    cleanup.append(mid)
    (first,) = await until_listed(INGRESS, "--message-id", mid, want=len,
                                  what="the bad position dead-lettered")
    partition = ingress_partitions.queue_name(ingress_partitions.partition_of_key(key))  # the object's
    assert first["source"] == partition and first["routing_key"] == key
    assert first["reason"].startswith("lat 91 is outside"), first

    done = dlq("replay", "--vhost", INGRESS, "--message-id", mid)
    assert done.returncode == 0, done.stdout + done.stderr
    (back,) = await until_listed(INGRESS, "--message-id", mid, what="the position dead-lettered again",
                                 want=lambda rows: rows and rows[0]["replays"] == 1)
    assert back["routing_key"] == key
    assert back["reason"] == first["reason"]


async def test_a_replayed_batch_of_no_tenant_is_refused_again(stack: ConnectionSettings, cleanup: list[str],
                                                              tenant: str) -> None:
    """A batch on the retired fanout ingress.batches carries no tenant (its routing key is the
    publisher's say-so, whatever it looks like): dead-lettered with the reason, and a replay
    (which reaches x-ingress through another exchange, the key kept) is refused again rather
    than taken as the tenant its key names."""
    obj = f"dlq-{uuid.uuid4().hex[:10]}"
    body = batch({"id": obj, "lon": 9.5, "lat": 47.1, "ts": time.time()})
    mid = await publish(stack, t.ADMIN_USER, INGRESS, t.RETIRED_BATCHES_EXCHANGE, tenant, body)
    cleanup.append(mid)
    (first,) = await until_listed(INGRESS, "--message-id", mid, want=len, what="the batch dead-lettered")
    assert first["source"] == t.BATCHES_QUEUE and first["routing_key"] == tenant
    assert first["reason"].startswith(f"{t.RETIRED_BATCHES_EXCHANGE} carries no tenant"), first

    done = dlq("replay", "--vhost", INGRESS, "--message-id", mid)
    assert done.returncode == 0, done.stdout + done.stderr
    (back,) = await until_listed(INGRESS, "--message-id", mid, what="the replayed batch dead-lettered again",
                                 want=lambda rows: rows and rows[0]["replays"] == 1)
    assert back["reason"] == first["reason"] and back["routing_key"] == tenant
    seen = geofence("inspect", "object", obj, "--tenant", tenant, "--json")
    assert seen.returncode == 0 and json.loads(seen.stdout)["latest"] == {}  # no region ever had it


# --------------------------------------------------------------------------- refusals


async def test_a_dead_letter_without_a_source_is_refused_and_stays(stack: ConnectionSettings,
                                                                   cleanup: list[str]) -> None:
    marker = uuid.uuid4().hex
    mid = uuid.uuid4().hex
    async with await aio_pika.connect(stack["amqp"][INGRESS], timeout=DEADLINE) as conn:
        ch = await conn.channel(publisher_confirms=True)
        dlx = await ch.get_exchange(t.DEAD_LETTER_EXCHANGE)
        await dlx.publish(aio_pika.Message(b"orphan", message_id=mid, headers={
            t.REASON_HEADER: f"no source {marker}"}, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
            routing_key="", mandatory=True, timeout=DEADLINE)
    cleanup.append(mid)
    (row,) = listed(INGRESS, "--reason", marker)
    assert row["message_id"] == mid and row["source"] is None and row["replayable"] is False

    done = dlq("replay", "--vhost", INGRESS, "--reason", marker)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"NOT replayed  {INGRESS}  -  {mid}" in done.stdout
    assert "no known source queue" in done.stdout and "it stays in dead-letters" in done.stdout
    assert "replayed 0 dead letters; 1 could not be replayed (still in dead-letters)" in done.stdout
    (row,) = listed(INGRESS, "--reason", marker)
    assert row["message_id"] == mid and row["replays"] == 0


async def test_a_vhost_outside_the_topology_is_bad_usage() -> None:
    done = dlq("list", "--vhost", "gf-nowhere")
    assert done.returncode == 2
    assert "'gf-nowhere': not a vhost of the topology" in done.stderr


# --------------------------------------------------------------------------- broker dead letters


async def test_a_delivery_limit_dead_letter_is_replayed_to_its_quorum_queue(stack: ConnectionSettings,
                                                                           cleanup: list[str]) -> None:
    """As the sidecar input queues will be: a quorum queue with a delivery limit, dead-lettering
    to the vhost's dead-letters exchange. A private one here, bound to amq.direct, so that the
    message has a routing key of its own that the replay must keep."""
    name = f"dlq-test-{uuid.uuid4().hex[:10]}"
    key = f"dlq-test.{uuid.uuid4().hex[:10]}"
    mid = uuid.uuid4().hex
    async with await aio_pika.connect(stack["amqp"][INGRESS], timeout=DEADLINE) as conn:
        ch = await conn.channel(publisher_confirms=True)
        q = await ch.declare_queue(name, durable=True, arguments={
            "x-queue-type": "quorum", "x-delivery-limit": 1, "x-expires": 600_000,
            "x-dead-letter-exchange": t.DEAD_LETTER_EXCHANGE})
        try:
            await q.bind("amq.direct", key)
            direct = await ch.get_exchange("amq.direct")
            poison = aio_pika.Message(b'{"poison": true}', message_id=mid, content_type="application/json",
                                      headers={"app": "kept"}, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            await direct.publish(poison, routing_key=key, mandatory=True, timeout=DEADLINE)
            cleanup.append(mid)
            for _ in range(5):  # delivered, returned, until the broker gives up on it
                m = await q.get(no_ack=False, fail=False)
                if m is None:
                    break
                await m.nack(requeue=True)
            rows = await until_listed(INGRESS, "--source", name, want=len,
                                      what="the broker to dead-letter it")
            (row,) = rows
            assert row["kind"] == "broker" and row["message_id"] == mid
            assert row["reason"] == f"delivery_limit (by the broker, from {name})"
            assert row["routing_key"] == key and row["exchange"] == "amq.direct"
            assert row["time"] is not None and row["headers"]["app"] == "kept"

            done = dlq("replay", "--vhost", INGRESS, "--source", name)
            assert done.returncode == 0, done.stdout + done.stderr
            assert f"{INGRESS}: replayed 1 of 1 matching dead letters (1 to {name})" in done.stdout
            assert listed(INGRESS, "--source", name) == []
            back = await q.get(no_ack=False, fail=False, timeout=DEADLINE)
            assert back is not None and back.message_id == mid and back.body == b'{"poison": true}'
            assert back.routing_key == key and back.content_type == "application/json"
            headers = dict(back.headers or {})
            assert headers["app"] == "kept" and headers["x-geofence-replays"] == 1
            assert headers["x-geofence-last-reason"] == row["reason"]
            assert not [h for h in headers if h.startswith(("x-death", "x-first-death", "x-geofence-reason",
                                                            "x-geofence-source"))], headers
            await back.ack()
        finally:
            await q.delete(if_unused=False, if_empty=False)
