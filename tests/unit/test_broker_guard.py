"""exchanges/broker_guard.py without a broker: the guard's answers to rabbitmq_auth_backend_http
(allow with the user's tags, deny), its reads of the user store (once for a burst of unknown
users, again for a changed password), its HTTP edge (POST only, bounded bodies)."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from exchanges import broker_guard as bg
from exchanges.login_guard import rabbit_hash

SALT = b"\x09\x08\x07\x06"


def stored(password: str, *tags: str) -> bg.StoredUser:
    return bg.StoredUser(rabbit_hash(password, SALT), "rabbit_password_hashing_sha256", tags)


class Store:
    """RabbitMQ's store as export_definitions reads it, counting the reads."""

    def __init__(self, users: dict[str, bg.StoredUser]) -> None:
        self.users, self.reads = dict(users), 0

    async def read(self) -> dict[str, bg.StoredUser]:
        self.reads += 1
        await asyncio.sleep(0.01)  # a read takes a while: logins arriving meanwhile share it
        return dict(self.users)


class Clock:
    """The guard's clock: moved by the test, and by the guard's own waits."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def guard(store: Store, failed_logins: float = 3.0, clock: Clock | None = None) -> bg.Guard:
    clock = clock or Clock()
    return bg.Guard(bg.GuardConfig(failed_logins=failed_logins),
                    bg.UserDirectory(store.read, clock, clock.sleep))


async def test_a_right_password_is_allowed_with_the_users_tags() -> None:
    store = Store({"geofence": stored("adminpw", "administrator"), "t1.van-1": stored("pw", "gf-device")})
    g = guard(store)
    assert await g.login({"username": "geofence", "password": "adminpw"}, 0.0) == "allow administrator"
    assert await g.login({"username": "t1.van-1", "password": "pw", "client_id": "t1.van-1"}, 0.0) \
        == "allow gf-device"
    van = {"username": "t1.van-1", "client_id": "t1.van-1"}
    assert await g.login({**van, "password": "nope"}, 10.0) == "deny"
    assert await g.login({**van, "password": "pw", "client_id": "t1.van-2"}, 20.0) == "deny"
    assert await g.login({"username": "t1.van-1"}, 30.0) == "deny"  # no password: a certificate's login
    assert g.counts["allowed_amqp"] == 1 and g.counts["allowed_mqtt"] == 1 and g.counts["refused"] == 1


async def test_a_burst_of_unknown_users_reads_the_store_once() -> None:
    store, clock = Store({"geofence": stored("adminpw", "administrator")}), Clock()
    g = guard(store, clock=clock)
    logins = (g.login({"username": f"who-{i}", "password": "x"}, clock.now) for i in range(50))
    answers = await asyncio.gather(*logins)
    # the first login's read, and one more for those that came while it was under way
    assert set(answers) == {"deny"} and store.reads == 2
    # a device added just after that read logs in at once: its login waits for the next read
    store.users["t1.new"] = stored("pw", "gf-device")
    started = clock.now
    assert await g.login({"username": "t1.new", "password": "pw"}, clock.now) == "allow gf-device"
    assert store.reads == 3 and clock.now - started <= bg.RETRY_S  # reads RETRY_S apart at least
    assert await g.login({"username": "t1.new", "password": "pw"}, clock.now) == "allow gf-device"
    assert store.reads == 3  # known: no read


async def test_a_changed_password_is_read_again() -> None:
    store, clock = Store({"t1.gw": stored("old", "gf-gateway")}), Clock()
    g = guard(store, clock=clock)
    assert await g.login({"username": "t1.gw", "password": "old"}, clock.now) == "allow gf-gateway"
    store.users["t1.gw"] = stored("new", "gf-gateway")
    # within RETRY_S of the last read, a wrong password is taken as wrong (guesses stay cheap)
    assert await g.login({"username": "t1.gw", "password": "new"}, clock.now) == "deny"
    clock.now += bg.RETRY_S
    assert await g.login({"username": "t1.gw", "password": "new"}, clock.now) == "allow gf-gateway"
    assert store.reads == 2


async def test_a_guessed_name_is_locked_out_and_the_platforms_users_are_not() -> None:
    store = Store({"t1.van-1": stored("pw", "gf-device"), "x-ingress": stored("pw")})
    g = guard(store, failed_logins=3.0)  # bursts of 6
    for user in ("t1.van-1", "x-ingress"):
        for _ in range(6):
            assert await g.login({"username": user, "password": "guess", "client_id": user}, 50.0) == "deny"
    assert await g.login({"username": "t1.van-1", "password": "pw", "client_id": "t1.van-1"}, 50.0) == "deny"
    assert await g.login({"username": "x-ingress", "password": "pw"}, 50.0) == "allow "
    assert g.counts["lockouts"] == 1 and g.counts["failures"] == 12
    assert b"geofence_broker_lockouts_total 1" in g.metrics()


def test_users_are_read_from_a_definitions_document() -> None:
    doc: dict[str, Any] = {"users": [
        {"name": "a", "password_hash": "h", "hashing_algorithm": "alg", "tags": ["administrator"]},
        {"name": "b", "password_hash": "", "hashing_algorithm": "alg", "tags": "x,y"}], "vhosts": []}
    assert bg.users_of(doc) == {"a": bg.StoredUser("h", "alg", ("administrator",)),
                                "b": bg.StoredUser("", "alg", ("x", "y"))}


@pytest.fixture
def client() -> httpx.AsyncClient:
    store = Store({"t1.van-1": stored("pw", "gf-device")})
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=bg.app(guard(store))), base_url="http://guard")


async def test_the_http_edge(client: httpx.AsyncClient) -> None:
    form = {"username": "t1.van-1", "password": "pw", "vhost": "gf-ingress", "client_id": "t1.van-1"}
    async with client:
        ok = await client.post("/auth/user", content=urlencode(form),
                               headers={"content-type": "application/x-www-form-urlencoded"})
        assert (ok.status_code, ok.text) == (200, "allow gf-device")
        assert (await client.get("/auth/user", params=form)).status_code == 405  # a password in a URL: never
        assert (await client.post("/auth/vhost", content="username=x")).text == "deny"
        big = await client.post("/auth/user", content=b"username=" + b"x" * (bg.BODY_MAX + 1))
        assert (big.status_code, big.text) == (413, "deny")
        assert (await client.post("/auth/user", content=b"\xff\xfe")).text == "deny"
        assert b"geofence_broker_logins_total" in (await client.get("/metrics")).content
