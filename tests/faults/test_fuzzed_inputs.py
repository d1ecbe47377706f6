"""10,000 fuzzed inputs against the live stack (issue 5, "bad input gets a clear error and
loses nothing"): what tests/unit/test_fuzz_decoders.py checks on the decoders, here through
RabbitMQ, the sidecars, the fence API and PostgreSQL.

The inputs come from tests/faults/fuzz_inputs.py with one fixed seed (the same inputs every
run; the run's ids start with a fresh marker):

- MQTT: payloads published QoS 1 by a registered device on its own topic `positions/<id>`
  (a device may publish nowhere else, so the ids and topics are fuzzed over AMQP);
- AMQP amq.topic (gf-ingress): payloads under fuzzed routing keys `positions.<id>`, mandatory
  (a key no binding takes comes back to the publisher: returned, not lost);
- AMQP gateway batches to `ingress.batches`, JSON or msgpack (content types fuzzed too);
- the HTTP fence API: GeoJSON Features broken in one way each, raw bytes, fuzzed paths;
- the AMQP fence API (`fence.api`, direct reply-to): fuzzed requests.

The pure decoders (ingress/positions.py) predict, for each position input, whether it must be
dead-lettered; a request of the AMQP API is dead-lettered when it is not a JSON object naming a
known op. Every AMQP message carries the run marker in a header (the sidecars copy the original
headers into the dead letter); MQTT ones are known by the device's routing key. Private queues
bound to the `dead-letters` exchanges of gf-ingress and gf-fences see every dead letter; a
sentinel (a malformed message) published last on each stream marks the end: once the
sentinels are dead-lettered, everything published before them on their stream has been
handled (each input queue is handled in order). Then: exactly the predicted dead letters, each
with a reason; every HTTP answer a 2xx or a 4xx with a reason (never a 5xx, the connection
never refused); every AMQP request answered below 500; every sidecar alive; a valid position
still gives its ENTER event. At the end the run's messages are taken out of the shared
`dead-letters` queues (others' are left there), so reruns are independent.

The inputs include those of the bugs this fuzzing found (the unit file names each, fixed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aio_pika
import asyncpg
import httpx
import orjson
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from deploy import firebase_emulator as fe
from deploy import sidecars
from deploy.settings import ConnectionSettings, Settings
from exchanges import topology as t
from exchanges.shell.config import MAX_FUTURE_S
from fence import store
from fence.manager import FenceManager
from ingress.positions import Refused, decode_batch, decode_mqtt_many
from tests.faults import report
from tests.faults.fuzz_inputs import RPC_OPS, Fuzzer
from tests.integration.clients import Device, MqttDevice, api, geofence, q

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# the inputs are the same on every run (a failure replays); FUZZ_SEED=N explores others
SEED = int(os.environ.get("FUZZ_SEED", "20240505"))
COUNTS = {"mqtt": 3_500, "topic": 1_500, "gateway": 2_500, "http": 1_500, "rpc": 1_000}
RUN_HEADER = "x-geofence-fuzz-run"  # on every AMQP message of a run: the run's marker
STREAM_HEADER = "x-geofence-fuzz-stream"
DEADLINE_S = 240.0  # for all the dead letters of the run to be seen
HTTP_CONCURRENCY = 4
VADUZ = (9.5209, 47.1410)


def text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


# --------------------------------------------------------------------------- the inputs


@dataclass
class Inputs:
    """The run's inputs and what the contract says of them."""

    mqtt: list[bytes] = field(default_factory=list)
    topic: list[tuple[str, bytes]] = field(default_factory=list)
    gateway: list[tuple[bytes, str | None]] = field(default_factory=list)
    http: list[tuple[str, str, bytes, str]] = field(default_factory=list)  # method, path, body, expectation
    rpc: list[bytes] = field(default_factory=list)
    dead: Counter[str] = field(default_factory=Counter)  # per stream, messages to be dead-lettered
    unroutable: int = 0  # topic messages no binding takes (returned to the publisher)
    updates: int = 0  # valid positions among the inputs

    @property
    def total(self) -> int:
        return len(self.mqtt) + len(self.topic) + len(self.gateway) + len(self.http) + len(self.rpc)


def make_inputs(run: str, token: str, device_id: str) -> Inputs:
    """The same inputs for every run but the ids: positions' objects start with fz<run>, HTTP
    fences with fh<run>, AMQP API fences with fr<run>."""
    z = Fuzzer(random.Random(SEED), id_prefix=f"fz{run}")
    out = Inputs()
    # x-ingress refuses a ts more than its skew ahead of when it takes the position (the fuzzer's
    # ts fall anywhere in 2000-2100: none within the minutes between now and when it is taken)
    latest = (time.time(), MAX_FUTURE_S)
    for _ in range(COUNTS["mqtt"]):
        body = z.mqtt_payload()
        out.mqtt.append(body)
        d = decode_mqtt_many([(f"positions.{device_id}", body)], latest)
        out.dead["mqtt"] += bool(d.refused)
        out.updates += len(d.batch)
    for _ in range(COUNTS["topic"]):
        key = z.routing_key().encode()[:255].decode(errors="ignore")  # an AMQP short string
        body = z.mqtt_payload()
        out.topic.append((key, body))
        words = key.split(".")
        if len(words) != 2 or words[0] != "positions":  # x-ingress.positions is bound with positions.*
            out.unroutable += 1
            continue
        d = decode_mqtt_many([(key, body)], latest)
        out.dead["topic"] += bool(d.refused)
        out.updates += len(d.batch)
    for _ in range(COUNTS["gateway"]):
        body, ct = z.gateway_batch()
        out.gateway.append((body, ct))
        try:
            decoded = decode_batch(body, ct, latest)
        except Refused:
            out.dead["gateway"] += 1
            continue
        out.dead["gateway"] += bool(decoded.refused)  # the good positions go on, the message to DLQ too
        out.updates += len(decoded.batch)
    # HTTP: what to expect of a request depends on the others only through the fence ids valid
    # creations use (the requests run concurrently, in no set order): a fence id created once and
    # named by no other request gives 201; a request naming a fence that may exist, anything but
    # a 5xx; the rest a 4xx (refused, or no such fence)
    z = Fuzzer(random.Random(SEED + 1), id_prefix=f"fh{run}")
    r = z.rng
    planned: list[tuple[str, str, bytes, str | None, bool]] = []  # method, path, body, fence id, valid
    for _ in range(COUNTS["http"]):
        fid = z.object_id() if r.random() < 0.5 else z.bad_id()
        path_id = "/fences/" + quote(fid, safe="")
        k = r.randint(0, 5)
        if k == 0 and "/" not in fid and fid.strip("."):
            planned.append((r.choice(["GET", "DELETE"]), path_id, b"", fid, False))
        elif k <= 1:
            junk = z.raw(60) if r.random() < 0.5 else z.mqtt_payload()
            planned.append(("POST", "/fences", junk, None, False))
        else:
            feature, broken = z.feature()
            body = orjson.dumps(feature, option=orjson.OPT_NON_STR_KEYS) if _json_ready(feature) else b"{oops"
            if k == 2 and "/" not in fid and fid.strip("."):
                planned.append(("PUT", path_id, body, fid, broken is None))
            else:
                planned.append(("POST", "/fences", body, feature["id"] if broken is None else None,
                                broken is None))
    created = Counter(f for m, _, _, f, valid in planned if m == "POST" and valid)
    named = Counter(f for m, _, _, f, _ in planned if m != "POST")
    for m, path, data, f, valid in planned:
        if m == "POST" and valid:
            expect = "201" if created[f] == 1 and not named[f] else "any"
        elif m != "POST" and f in created and (valid or m != "PUT"):
            expect = "any"
        else:
            expect = "4xx"
        out.http.append((m, path, data, expect))
    z = Fuzzer(random.Random(SEED + 2), id_prefix=f"fr{run}", token=token)
    for _ in range(COUNTS["rpc"]):
        body = z.rpc_request()
        out.rpc.append(body)
        try:
            request = orjson.loads(body)
            malformed = not isinstance(request, dict) or request.get("op") not in RPC_OPS
        except orjson.JSONDecodeError:
            malformed = True
        out.dead["rpc"] += malformed
    return out


def _json_ready(v: Any) -> bool:
    """orjson writes NaN as null and refuses integers over 64 bits: such a body goes broken."""
    if isinstance(v, float):
        return v == v and abs(v) != float("inf")
    if isinstance(v, dict):
        return all(_json_ready(x) for x in v.values())
    if isinstance(v, list):
        return all(_json_ready(x) for x in v)
    if isinstance(v, bytes):
        return False
    return not isinstance(v, int) or -(2**63) <= v < 2**64


# --------------------------------------------------------------------------- dead letters


@dataclass
class Seen:
    """Dead letters of the run, per stream, from a private queue on a dead-letters exchange."""

    by_stream: Counter[str] = field(default_factory=Counter)
    no_reason: list[str] = field(default_factory=list)
    sentinels: set[str] = field(default_factory=set)
    sources: Counter[str] = field(default_factory=Counter)
    downstream: list[str] = field(default_factory=list)  # what they are (source, reason)


class DeadLetters:
    """An exclusive queue bound to a vhost's `dead-letters` exchange: a copy of every dead
    letter from now on (the shared `dead-letters` queue gets its own copy)."""

    def __init__(self, url: str, run: str, device: str, seen: Seen) -> None:
        self.url, self.run, self.device, self.seen = url, run, device, seen

    async def __aenter__(self) -> DeadLetters:
        self.conn = await aio_pika.connect(self.url, timeout=30)
        ch = await self.conn.channel()
        await ch.set_qos(prefetch_count=2000)
        self.queue = await ch.declare_queue("", exclusive=True, auto_delete=True)
        await self.queue.bind(t.DEAD_LETTER_EXCHANGE, "")
        await self.queue.consume(self.on_message)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.close()

    async def on_message(self, m: AbstractIncomingMessage) -> None:
        stream = classify(m, self.run, self.device)
        if stream is not None:
            reason = text((m.headers or {}).get(t.REASON_HEADER, ""))
            if stream.startswith("sentinel-"):
                self.seen.sentinels.add(stream)
            else:
                self.seen.by_stream[stream] += 1
                self.seen.sources[text((m.headers or {}).get("x-geofence-source", ""))] += 1
                if stream == "downstream":
                    self.seen.downstream.append(
                        f"{text((m.headers or {}).get('x-geofence-source', '?'))}: {reason[:300]}")
                if not reason.strip():
                    self.seen.no_reason.append(f"{stream}: {m.body[:100]!r}")
        await m.ack()


def classify(m: AbstractIncomingMessage, run: str, device: str) -> str | None:
    """The run's stream of a dead letter, or None if it is not the run's. What the sidecars
    after x-ingress dead-letter of the run (its object / fence ids in the body) is
    "downstream": there should be none."""
    h = m.headers or {}
    if RUN_HEADER in h:
        return text(h.get(STREAM_HEADER, "?")) if text(h[RUN_HEADER]) == run else None
    if text(h.get("x-geofence-routing-key", "")) == f"positions.{device}":
        return "sentinel-mqtt" if m.body == sentinel(run, "mqtt") else "mqtt"
    if any(marker.encode() in m.body for marker in (f"fz{run}", f"fh{run}", f"fr{run}", device)):
        return "downstream"
    return None


def sentinel(run: str, stream: str) -> bytes:
    return f"fuzz sentinel {run} {stream}".encode()  # not JSON: dead-lettered


EARLIER = re.compile(rb"fuzz-[0-9a-f]{10}|f[zhr][0-9a-f]{8}")  # a run's device and its ids


def earlier_run(m: AbstractIncomingMessage) -> bool:
    """A dead letter of an earlier fuzz run (one that stopped before taking its own out)."""
    h = m.headers or {}
    return RUN_HEADER in h or text(h.get("x-geofence-routing-key", "")).startswith("positions.fuzz-") \
        or EARLIER.search(m.body) is not None


async def drain_own(url: str, run: str, device: str) -> int:
    """Ack the run's messages (and earlier fuzz runs' left behind) out of the shared
    dead-letters queue; others' go back untouched. Returns how many of the run's were taken."""
    taken = 0
    async with await aio_pika.connect(url, timeout=30) as conn:
        ch = await conn.channel()
        queue = await ch.declare_queue(t.DEAD_LETTER_QUEUE, passive=True)
        ready = queue.declaration_result.message_count or 0
        held: list[AbstractIncomingMessage] = []
        for _ in range(ready):
            m = await queue.get(no_ack=False, fail=False, timeout=30)
            if m is None:
                break
            if classify(m, run, device) is not None:
                await m.ack()
                taken += 1
            elif earlier_run(m):
                await m.ack()
            else:
                held.append(m)  # unacked until the end, so that get() moves on
        for m in held:
            await m.nack(requeue=True)
    return taken


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def fuzz_device(stack: ConnectionSettings) -> Iterator[Device]:
    """A device user of the run, removed afterwards."""
    made = Device(f"fuzz-{uuid.uuid4().hex[:10]}", uuid.uuid4().hex)
    done = geofence("device", "add", made.object_id, "--password-stdin", stdin=made.password + "\n")
    assert done.returncode == 0, done.stderr
    try:
        yield made
    finally:
        if api(stack, f"api/users/{q(made.object_id)}") is not None:
            geofence("device", "remove", made.object_id)


@pytest.fixture
def token(stack: ConnectionSettings) -> str:
    """A Firebase ID token of a fresh user (the Auth emulator of the stack)."""
    host, port = stack["firebase"]["auth_emulator_host"].rsplit(":", 1)
    if not fe.running(host, int(port)):
        pytest.fail("the Firebase Auth emulator is not running: `geofence up` starts it", pytrace=False)
    email = f"fuzz-{uuid.uuid4().hex[:12]}@example.org"
    _, tok = fe.sign_up(host, int(port), stack["firebase"]["project"], email, uuid.uuid4().hex)
    return tok


# --------------------------------------------------------------------------- publishing


def publish_mqtt(dev: MqttDevice, device_id: str, payloads: list[bytes]) -> None:
    """QoS 1, every PUBACK awaited (each payload is in x-ingress.positions then)."""
    for body in payloads:
        dev.client.publish(f"positions/{device_id}", body, qos=1)
    for _ in payloads:
        assert dev.expect("puback") is not None


async def publish_amqp(ch: AbstractChannel, exchange: str, messages: list[tuple[str, bytes, str | None]],
                       run: str, stream: str) -> int:
    """Persistent, mandatory, confirmed; returns how many came back unroutable."""
    ex = await ch.get_exchange(exchange, ensure=False)
    returned = 0

    async def one(i: int, key: str, body: bytes, ct: str | None) -> None:
        nonlocal returned
        msg = aio_pika.Message(body, content_type=ct, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                               headers={RUN_HEADER: run, STREAM_HEADER: stream, "x-geofence-fuzz-n": i})
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


@contextlib.asynccontextmanager
async def events_of(stack: ConnectionSettings, fence_id: str) -> AsyncIterator[AbstractQueue]:
    async with await aio_pika.connect(stack["amqp"][t.FENCES_VHOST], timeout=30) as conn:
        ch = await conn.channel()
        queue = await ch.declare_queue("", exclusive=True)
        await queue.bind(t.EVENTS_EXCHANGE, t.event_binding_key(fence_id))
        yield queue


async def consumed(stack: ConnectionSettings, deadline: float = 120.0) -> None:
    """Every input queue the run feeds has its consumer (the stack may be coming back from a
    restart, e.g. by another fault test)."""
    queues = [(t.INGRESS_VHOST, t.POSITIONS_QUEUE), (t.INGRESS_VHOST, t.BATCHES_QUEUE),
              (t.FENCES_VHOST, t.API_QUEUE)]
    end = time.monotonic() + deadline
    for vhost, name in queues:
        while True:
            async with await aio_pika.connect(stack["amqp"][vhost], timeout=30) as conn:
                ch = await conn.channel()
                declared = await ch.declare_queue(name, passive=True)
                if declared.declaration_result.consumer_count:
                    break
            if time.monotonic() > end:
                raise AssertionError(f"{vhost} {name} has no consumer: is the stack up (`geofence up`)?")
            await asyncio.sleep(0.5)


LEFTOVER = r"^f[zhr][0-9a-f]{8}"  # fence ids of the runs (fz / fh / fr + the run's marker)


async def remove_leftovers(stack: ConnectionSettings, settings: Settings) -> int:
    """Fences an earlier run made and could not delete (it stopped half-way): removed."""
    conn = await asyncpg.connect(stack["postgres"]["dsn"])
    try:
        ids = [r["id"] for r in await conn.fetch(
            "SELECT id FROM fence WHERE deleted_at IS NULL AND id ~ $1", LEFTOVER)]
    finally:
        await conn.close()
    if ids:
        url = stack["users"][t.MANAGER_USER][t.region_vhost(settings.regions[0])]
        async with FenceManager(url, stack["postgres"]["dsn"], settings.regions, settings.workers) as manager:
            for fid in ids:
                with contextlib.suppress(store.UnknownFence):
                    await manager.remove(fid)
    return len(ids)


async def until(check: Any, what: str, deadline: float) -> None:
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline:g}s waiting for {what}")
        await asyncio.sleep(0.1)


# --------------------------------------------------------------------------- the test


async def test_ten_thousand_fuzzed_inputs(stack: ConnectionSettings, fuzz_device: Device, token: str) -> None:
    run = uuid.uuid4().hex[:8]
    settings = Settings.from_env()
    dead = [n for n, ok in sidecars.running(settings).items() if not ok]
    assert not dead, f"sidecars not running before the run: {dead} (`geofence up` starts them)"
    inputs = make_inputs(run, token, fuzz_device.object_id)
    assert inputs.total == sum(COUNTS.values()) >= 10_000
    await consumed(stack)
    await remove_leftovers(stack, settings)
    seen_ingress, seen_fences, seen_regions = Seen(), Seen(), Seen()
    http, rpc = HttpResults(), RpcResults()
    fences_made: list[str] = []
    ok = False
    try:
        async with contextlib.AsyncExitStack() as watches:
            for vhost, seen in ((t.INGRESS_VHOST, seen_ingress), (t.FENCES_VHOST, seen_fences),
                                *((t.region_vhost(r), seen_regions) for r in settings.regions)):
                await watches.enter_async_context(
                    DeadLetters(stack["amqp"][vhost], run, fuzz_device.object_id, seen))
            device = MqttDevice(stack, fuzz_device)
            try:
                await asyncio.to_thread(publish_mqtt, device, fuzz_device.object_id, inputs.mqtt)
                async with await aio_pika.connect(stack["amqp"][t.INGRESS_VHOST], timeout=30) as conn:
                    ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
                    returned = await publish_amqp(ch, t.MQTT_TOPIC_EXCHANGE,
                                                  [(k, b, None) for k, b in inputs.topic], run, "topic")
                    await publish_amqp(ch, t.BATCHES_EXCHANGE, [("", b, ct) for b, ct in inputs.gateway], run,
                                       "gateway")
                    # sentinels: malformed, published after everything of their stream was confirmed
                    await publish_amqp(ch, t.MQTT_TOPIC_EXCHANGE,
                                       [(f"positions.{fuzz_device.object_id}", sentinel(run, "topic"), None)],
                                       run, "sentinel-topic")
                    await publish_amqp(ch, t.BATCHES_EXCHANGE, [("", sentinel(run, "gateway"), None)], run,
                                       "sentinel-gateway")
                await asyncio.to_thread(publish_mqtt, device, fuzz_device.object_id, [sentinel(run, "mqtt")])
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(http_requests(stack["api"] or "", token, inputs.http, http))
                    tg.create_task(rpc_requests(stack["amqp"][t.FENCES_VHOST], run, inputs.rpc, rpc))

                ingress_sentinels = {"sentinel-mqtt", "sentinel-topic", "sentinel-gateway"}
                await until(lambda: ingress_sentinels <= seen_ingress.sentinels
                            and "sentinel-rpc" in seen_fences.sentinels, "the sentinels in dead-letters",
                            DEADLINE_S)

                # what the contract predicts, exactly
                assert returned == inputs.unroutable, (returned, inputs.unroutable)
                got = seen_ingress.by_stream + seen_fences.by_stream + seen_regions.by_stream
                want = +inputs.dead
                downstream = seen_regions.downstream + seen_fences.downstream + seen_ingress.downstream
                assert got == want, \
                    f"dead letters per stream {dict(got)}, predicted {dict(want)}; downstream: " + \
                    "\n".join(downstream)
                assert not seen_ingress.no_reason and not seen_fences.no_reason, \
                    (seen_ingress.no_reason + seen_fences.no_reason)[:5]
                assert not http.problems, \
                    f"{len(http.problems)} HTTP answers wrong: " + "\n".join(http.problems[:10])
                bad_rpc = {i: a for i, a in rpc.replies.items() if not isinstance(a.get("status"), int)
                           or a["status"] >= 500 or (a["status"] >= 400 and not a.get("error"))}
                assert not bad_rpc, f"{len(bad_rpc)} AMQP API answers wrong: " + "; ".join(
                    f"{inputs.rpc[int(i)][:120]!r} -> {a}" for i, a in list(bad_rpc.items())[:8])

                # nothing died, the API still serves, a valid position still gives its event
                dead = [n for n, alive in sidecars.running(settings).items() if not alive]
                assert not dead, f"sidecars dead after the fuzzed inputs: {dead}"
                async with httpx.AsyncClient(base_url=stack["api"] or "", timeout=30) as client:
                    assert (await client.get("/health")).status_code == 200
                fid = await still_routes(stack, settings, token, run)
                fences_made.append(fid)
            finally:
                device.close()
        ok = True
    finally:
        with contextlib.suppress(Exception):
            await delete_fences(stack, token, http.created + rpc.created + fences_made)
        drained = 0
        for vhost in settings.topology.vhosts:
            with contextlib.suppress(Exception):
                drained += await drain_own(stack["amqp"][vhost], run, fuzz_device.object_id)
        dlq = sum(sum(s.by_stream.values()) for s in (seen_ingress, seen_fences, seen_regions))
        report.record(report.Row(fault="10,000 fuzzed inputs", injected=inputs.total, updates=inputs.updates,
                                 expected=0, received=0, duplicates=0, dlq=dlq, ok=ok))
    # the shared queues held the same dead letters (and the 4 sentinels): all taken out again
    assert drained == dlq + 4, \
        f"{drained} of the run's messages taken out of dead-letters, {dlq + 4} expected"


async def still_routes(stack: ConnectionSettings, settings: Settings, token: str, run: str) -> str:
    """A fence made over HTTP, applied by every x-geo, then a position inside it of an object
    new to the pipeline (the fuzzed device's own positions reach 2100: x-fence takes an object's
    positions in time order, so a position of now from it is rightly too old): its ENTER event
    comes out of fence.events."""
    fid, object_id = f"fz{run}-check", f"fz{run}-check"
    lon, lat = VADUZ
    d = 0.002
    feature = {"type": "Feature", "id": fid, "properties": {"name": "fuzz check", "timeout_s": 600},
               "geometry": {"type": "Polygon", "coordinates": [[[lon - d, lat - d], [lon + d, lat - d],
                                                                 [lon + d, lat + d], [lon - d, lat + d],
                                                                 [lon - d, lat - d]]]}}
    async with httpx.AsyncClient(base_url=stack["api"] or "", timeout=30) as client:
        r = await client.post("/fences", json=feature, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 201, r.text
    manager_url = stack["users"][t.MANAGER_USER][t.region_vhost(settings.regions[0])]
    dsn = stack["postgres"]["dsn"]
    async with FenceManager(manager_url, dsn, settings.regions, settings.workers) as manager:
        await manager.applied()  # every x-geo has the fence: a position from now on is routed by it
    async with events_of(stack, fid) as queue:
        ts = time.time()
        async with await aio_pika.connect(stack["amqp"][t.INGRESS_VHOST], timeout=30) as conn:
            ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
            ex = await ch.get_exchange(t.MQTT_TOPIC_EXCHANGE, ensure=False)
            await ex.publish(aio_pika.Message(orjson.dumps({"lon": lon, "lat": lat, "ts": ts})),
                             f"positions.{object_id}", mandatory=True, timeout=30)
        async with queue.iterator(timeout=60) as it:
            async for m in it:
                await m.ack()
                e = orjson.loads(m.body)
                if e["object_id"] == object_id:
                    assert (e["event"], e["reason"], e["ts"]) == ("enter", "entered", ts), e
                    return fid
    raise AssertionError("no ENTER event for a valid position after the fuzzed inputs")


async def delete_fences(stack: ConnectionSettings, token: str, fence_ids: list[str]) -> None:
    async with httpx.AsyncClient(base_url=stack["api"] or "", timeout=30) as client:
        for fid in dict.fromkeys(fence_ids):
            await client.delete(f"/fences/{fid}", headers={"Authorization": f"Bearer {token}"})
