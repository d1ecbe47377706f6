"""A tenant's applications on the live broker (issue 36): each is its own RabbitMQ user
(`geofence app add NAME --tenant T`), reading its own tenant's events only (fence.events keys
`fence-events.<tenant>.`, fence.tenant-batches key `<tenant>`), through its own queues only."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Iterator

import aio_pika
import aiormq
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from deploy.settings import ConnectionSettings
from exchanges import topology as t
from exchanges.tenancy import qualify
from tests.integration.clients import (
    DEADLINE,
    Login,
    add_login,
    api,
    publish,
    q,
    remove_login,
)

# --------------------------------------------------------------------------- a tenant's applications


@pytest.fixture
def second_app(stack: ConnectionSettings, app_user: Login) -> Iterator[Login]:
    """Another application of the same tenant, removed afterwards (its queues with it)."""
    made = add_login("app", app_user.tenant)
    try:
        yield made
    finally:
        remove_login(stack, "app", made)


async def refusal(stack: ConnectionSettings, login: Login, vhost: str,
                  action: Callable[[AbstractChannel], Awaitable[object]]) -> str:
    """Run `action` on a fresh channel as `login`; it must be refused (ACCESS_REFUSED closes the
    channel); the broker's words."""
    async with await aio_pika.connect(url_of(stack, login, vhost), timeout=DEADLINE) as connection:
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused) as info:
            await action(channel)
    return str(info.value)


def url_of(stack: ConnectionSettings, login: Login, vhost: str) -> str:
    base = stack["amqp"][vhost]
    return f"amqp://{q(login.user)}:{q(login.password)}@{base.split('@', 1)[1]}"


def app_queue(login: Login, what: str) -> str:
    return f"{t.app_queue_prefix(login.user)}{what}-{uuid.uuid4().hex[:8]}"


async def test_an_application_reads_its_tenants_events_only(stack: ConnectionSettings, app_user: Login,
                                                           other_tenant: str) -> None:
    """Its own queues on fence.events (its tenant's fences, kinds, objects, proximity events)
    and on fence.tenant-batches (key: its tenant); another tenant's events, published first
    under keys its bindings' patterns would otherwise match, never arrive."""
    tenant = app_user.tenant
    fence, obj = f"f-{uuid.uuid4().hex[:8]}", f"o-{uuid.uuid4().hex[:8]}"
    app_url = url_of(stack, app_user, t.FENCES_VHOST)
    async with await aio_pika.connect(app_url, timeout=DEADLINE) as connection:
        channel = await connection.channel()
        events = await channel.declare_queue(app_queue(app_user, "events"), exclusive=True)
        for key in (f"fence-events.{tenant}.#", f"roam-events.{tenant}.#",
                    t.event_binding_key(qualify(tenant, fence)),
                    t.event_binding_key(object_id=obj, tenant=tenant)):
            await events.bind(t.EVENTS_EXCHANGE, key)
        batches = await channel.declare_queue(app_queue(app_user, "batches"), exclusive=True)
        await batches.bind(t.TENANT_BATCHES_EXCHANGE, tenant)

        # valid bodies of the contract (exchanges/schemas/): the suite's wire tap checks them
        theirs = {"schema": 1, "event": "enter", "tenant": other_tenant, "fence_id": fence, "object_id": obj,
                  "ts": 1.7e9, "reason": "entered", "event_id": uuid.uuid4().hex}
        ours = {**theirs, "tenant": tenant}
        their_roam = {"schema": 1, "event": "nearby", "tenant": other_tenant, "subscription": fence,
                      "subscriber": "car-1", "object": obj, "distance_m": 12.5, "ts": 1.7e9,
                      "event_id": uuid.uuid4().hex}  # the subscription named as the fence: `first` finds it
        our_roam = {**their_roam, "tenant": tenant}
        sent = [(t.EVENTS_EXCHANGE, t.event_routing_key(qualify(other_tenant, fence), "enter",
                                                        qualify(other_tenant, obj)), theirs),
                (t.EVENTS_EXCHANGE, t.roam_event_routing_key(qualify(other_tenant, fence), "nearby",
                                                             qualify(other_tenant, obj)), their_roam),
                (t.TENANT_BATCHES_EXCHANGE, other_tenant, [theirs]),
                (t.EVENTS_EXCHANGE,
                 t.event_routing_key(qualify(tenant, fence), "enter", qualify(tenant, obj)), ours),
                (t.EVENTS_EXCHANGE, t.roam_event_routing_key(qualify(tenant, fence), "nearby",
                                                             qualify(tenant, obj)), our_roam),
                (t.TENANT_BATCHES_EXCHANGE, tenant, [ours])]
        for exchange, key, body in sent:  # as x-fence publishes them
            await publish(stack, t.FENCE_USER, t.FENCES_VHOST, exchange, key, json.dumps(body).encode())

        async def first(queue: aio_pika.abc.AbstractQueue, n: int) -> list[tuple[str, object]]:
            """The first n messages about this test's fence (the tenant's other events, of
            other tests, may come through the same bindings)."""
            got: list[tuple[str, object]] = []
            async with queue.iterator(timeout=DEADLINE) as it:
                async for m in it:
                    await m.ack()
                    body = json.loads(m.body)
                    if fence in m.body.decode():
                        got.append((m.routing_key or "", body))
                    if len(got) == n:
                        break
            return got

        # one copy per message however many of its bindings match; in order: nothing of theirs first
        assert await first(events, 2) == [(sent[3][1], ours), (sent[4][1], our_roam)]
        assert await first(batches, 1) == [(tenant, [ours])]


async def test_an_application_binds_nothing_of_another_tenant(stack: ConnectionSettings, app_user: Login,
                                                              other_tenant: str) -> None:
    tenant = app_user.tenant
    mine = app_queue(app_user, "q")
    app_url = url_of(stack, app_user, t.FENCES_VHOST)
    async with await aio_pika.connect(app_url, timeout=DEADLINE) as connection:
        await (await connection.channel()).declare_queue(mine, exclusive=True)  # kept while we try
        cases = [(t.EVENTS_EXCHANGE, "#", "topic '#'"),  # every tenant's events
                 (t.EVENTS_EXCHANGE, "fence-events.#", "topic 'fence-events.#'"),
                 (t.EVENTS_EXCHANGE, "fence-events.*.#", "topic 'fence-events.*.#'"),
                 (t.EVENTS_EXCHANGE, f"fence-events.{other_tenant}.#",
                  f"topic 'fence-events.{other_tenant}.#'"),
                 (t.EVENTS_EXCHANGE, f"roam-events.{other_tenant}.#",
                  f"topic 'roam-events.{other_tenant}.#'"),
                 (t.EVENTS_EXCHANGE, t.event_binding_key(qualify(other_tenant, "depot")),
                  f"topic 'fence-events.{other_tenant}.depot.*.*'"),
                 (t.EVENTS_EXCHANGE, f"#.{tenant}.#", "topic '#."),
                 (t.TENANT_BATCHES_EXCHANGE, other_tenant, f"topic '{other_tenant}'"),
                 (t.TENANT_BATCHES_EXCHANGE, "#", "topic '#'"),
                 (t.TENANT_BATCHES_EXCHANGE, "*", "topic '*'"),
                 (t.EVENT_BATCHES_EXCHANGE, "", f"exchange '{t.EVENT_BATCHES_EXCHANGE}'")]  # the platform's
        for exchange, key, words in cases:
            async def bind(ch: AbstractChannel, exchange: str = exchange, key: str = key) -> None:
                await (await ch.get_queue(mine, ensure=False)).bind(exchange, key)

            said = await refusal(stack, app_user, t.FENCES_VHOST, bind)
            assert f"access to {words}" in said and f"exchange '{exchange}'" in said, (exchange, key, said)
        bindings = api(stack, f"api/queues/{q(t.FENCES_VHOST)}/{q(mine)}/bindings")
        assert [b["source"] for b in bindings] == [""]  # the default exchange's only: nothing was bound


async def test_an_application_neither_makes_nor_reads_another_applications_queues(
        stack: ConnectionSettings, app_user: Login, second_app: Login, other_tenant: str) -> None:
    tenant = app_user.tenant
    theirs = app_queue(second_app, "inbox")
    second_url = url_of(stack, second_app, t.FENCES_VHOST)
    async with await aio_pika.connect(second_url, timeout=DEADLINE) as connection:
        queue = await (await connection.channel()).declare_queue(theirs, auto_delete=False, durable=False)
        await queue.bind(t.EVENTS_EXCHANGE, f"fence-events.{tenant}.#")  # the other application may
        for name in (app_queue(second_app, "mine-now"), f"{t.APP_QUEUE_PREFIX}{other_tenant}.x.q",
                     f"{t.APP_QUEUE_PREFIX}{tenant}.q", f"plain-{uuid.uuid4().hex[:8]}", t.ARCHIVE_QUEUE):
            async def declare(ch: AbstractChannel, name: str = name) -> None:
                await ch.declare_queue(name, auto_delete=True)

            said = await refusal(stack, app_user, t.FENCES_VHOST, declare)
            assert f"access to queue '{name}'" in said, said

        async def ignore(message: AbstractIncomingMessage) -> None:
            pass

        async def consume(ch: AbstractChannel) -> None:
            await (await ch.get_queue(theirs, ensure=False)).consume(ignore)

        async def rebind(ch: AbstractChannel) -> None:
            mine_too = f"fence-events.{tenant}.#"  # a key of its own tenant: the queue is what is refused
            await (await ch.get_queue(theirs, ensure=False)).bind(t.EVENTS_EXCHANGE, mine_too)

        async def purge(ch: AbstractChannel) -> None:
            await (await ch.get_queue(theirs, ensure=False)).purge()

        async def publish_event(ch: AbstractChannel) -> None:  # (a confirming channel: refused at once)
            ex = await ch.get_exchange(t.EVENTS_EXCHANGE, ensure=False)
            await ex.publish(aio_pika.Message(b"{}"), f"fence-events.{tenant}.f.enter.o", timeout=DEADLINE)

        for action in (consume, rebind, purge):
            said = await refusal(stack, app_user, t.FENCES_VHOST, action)
            assert f"access to queue '{theirs}'" in said, (action.__name__, said)
        said = await refusal(stack, app_user, t.FENCES_VHOST, publish_event)
        assert f"access to exchange '{t.EVENTS_EXCHANGE}'" in said, said
        await queue.delete(if_unused=False, if_empty=False)
