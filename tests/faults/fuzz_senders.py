"""The live fuzz run's inputs sent (tests/faults/test_fuzzed_inputs.py): MQTT from the run's
device (or the administrator, on a topic no device may publish), AMQP publishes (persistent,
mandatory, confirmed; as the administrator or the tenant's gateway user), HTTP requests to the fence API a few
at a time, AMQP fence API requests with direct reply-to; what came back is collected for the
test to judge (nothing is asserted here but that every AMQP API request is answered).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import httpx
import orjson
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from exchanges import topology as t
from tests.faults.fuzz_dead_letters import DEADLINE_S, NUMBER_HEADER, RUN_HEADER, STREAM_HEADER, sentinel
from tests.integration.clients import MqttDevice

HTTP_CONCURRENCY = 4


def publish_mqtt(dev: MqttDevice, topic: str, payloads: list[bytes]) -> None:
    """QoS 1 on `topic`, every PUBACK awaited (each payload is in x-ingress.positions then)."""
    for body in payloads:
        dev.client.publish(topic, body, qos=1)
    for _ in payloads:
        assert dev.expect("puback") is not None


async def publish_amqp(ch: AbstractChannel, exchange: str, messages: Sequence[tuple[str, bytes, str | None]],
                       run: str, stream: str) -> int:
    """Persistent, mandatory, confirmed; returns how many came back unroutable."""
    ex = await ch.get_exchange(exchange, ensure=False)
    returned = 0

    async def one(i: int, key: str, body: bytes, ct: str | None) -> None:
        nonlocal returned
        msg = aio_pika.Message(body, content_type=ct, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                               headers={RUN_HEADER: run, STREAM_HEADER: stream, NUMBER_HEADER: i})
        try:
            await ex.publish(msg, key, mandatory=True, timeout=60)
        except aio_pika.exceptions.DeliveryError:
            returned += 1

    for at in range(0, len(messages), 200):
        await asyncio.gather(*(one(at + i, k, b, ct) for i, (k, b, ct) in enumerate(messages[at:at + 200])))
    return returned


@dataclass
class HttpResults:
    statuses: Counter[int] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    throttled: int = 0  # 429s (the API's rate limits): the request went again after Retry-After


async def http_requests(base: str, token: str, requests: list[tuple[str, str, bytes, str]],
                        res: HttpResults) -> None:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    todo = list(enumerate(requests))

    async def worker(client: httpx.AsyncClient) -> None:
        while todo:
            i, (method, path, body, expect) = todo.pop(0)
            try:
                r = await client.request(method, path, content=body, headers=headers)
            except httpx.TransportError as exc:
                res.problems.append(f"#{i} {method} {path}: {type(exc).__name__}: {exc}")
                continue
            if r.status_code == 429 and r.headers.get("retry-after", "").isdigit():
                # a client over the API's rate limit does as told: waits, then sends it again
                res.throttled += 1
                todo.append((i, (method, path, body, expect)))
                await asyncio.sleep(int(r.headers["retry-after"]))
                continue
            res.statuses[r.status_code] += 1
            if r.status_code == 201:
                res.created.append(r.json()["id"])
            reason = _reason(r)
            wrong = (expect == "201" and r.status_code != 201) or \
                (expect == "4xx" and not 400 <= r.status_code < 500)
            if r.status_code >= 500 or wrong or (r.status_code >= 400 and not reason):
                res.problems.append(f"#{i} {method} {path} {body[:160]!r}: {r.status_code} {r.text[:200]}")

    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(httpx.AsyncClient(base_url=base, timeout=60))
                   for _ in range(HTTP_CONCURRENCY)]
        await asyncio.gather(*(worker(c) for c in clients))


def _reason(r: httpx.Response) -> str:
    try:
        answer = r.json()
    except ValueError:
        return ""
    return str(answer.get("error") or answer.get("detail") or "") if isinstance(answer, dict) else ""


@dataclass
class RpcResults:
    replies: dict[str, dict[str, Any]] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)


async def rpc_requests(url: str, run: str, bodies: list[bytes], res: RpcResults) -> None:
    """Every request with reply_to (direct reply-to) and a correlation id; all replies awaited."""
    done = asyncio.Event()
    async with await aio_pika.connect(url, timeout=30) as conn:
        ch = await conn.channel(publisher_confirms=True)
        replies = await ch.get_queue("amq.rabbitmq.reply-to", ensure=False)

        async def on_reply(m: AbstractIncomingMessage) -> None:
            answer = orjson.loads(m.body)
            res.replies[m.correlation_id or "?"] = answer
            if answer.get("status") == 201 and isinstance(answer.get("result"), dict):
                res.created.append(str(answer["result"].get("id")))
            if len(res.replies) >= len(bodies):
                done.set()

        await replies.consume(on_reply, no_ack=True)
        ex = await ch.get_exchange(t.API_EXCHANGE, ensure=False)
        for at in range(0, len(bodies), 100):
            await asyncio.gather(*(ex.publish(aio_pika.Message(
                body, reply_to="amq.rabbitmq.reply-to", correlation_id=str(at + i),
                headers={RUN_HEADER: run, STREAM_HEADER: "rpc"}), "", timeout=60)
                for i, body in enumerate(bodies[at:at + 100])))
        try:
            await asyncio.wait_for(done.wait(), DEADLINE_S)
        except TimeoutError:
            missing = sorted(set(map(str, range(len(bodies)))) - set(res.replies), key=int)
            raise AssertionError(f"{len(missing)} fence API requests not answered within {DEADLINE_S:g}s, "
                                 f"e.g. {[bodies[int(i)][:120] for i in missing[:3]]}") from None
        # the sentinel: once its dead letter is seen, every earlier one is (same queue, in order)
        await ex.publish(aio_pika.Message(sentinel(run, "rpc"), headers={RUN_HEADER: run,
                                                                         STREAM_HEADER: "sentinel-rpc"}), "")
