"""The attack table's TLS rows (issue 37): every listener that leaves the host speaks TLS with
the stack's certificate (AMQPS, MQTTS, the API's HTTPS, PostgreSQL), a client that does not
trust the stack's CA is refused, and from outside the host's loopback (a network namespace
with an address of its own) the plain listeners are not there at all."""

from __future__ import annotations

import json
import queue
import ssl
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import aio_pika
import asyncpg
import httpx
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from selenium.webdriver.common.by import By

from deploy.settings import Settings
from exchanges import topology as t
from tests.integration.browser import account, chromium, console_errors, member, screenshot, sign_in
from tests.integration.clients import poll
from tests.security.attacks import holds, refused
from tests.security.conftest import DEADLINE, World


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings.from_env()


def _amqps(world: World, settings: Settings, user: str, vhost: str, ca: str | None) -> str:
    query = f"?cafile={quote(ca, safe='/')}" if ca else ""
    return (f"amqps://{quote(user, safe='')}:{quote(world.secrets[user], safe='')}@127.0.0.1:"
            f"{settings.amqps_port}/{quote(vhost, safe='')}{query}")


async def test_amqps_needs_the_stacks_ca(world: World, settings: Settings) -> None:
    gateway = f"{world.b}.gw"

    async def login(ca: str | None) -> None:
        conn = await aio_pika.connect(_amqps(world, settings, gateway, t.INGRESS_VHOST, ca), timeout=DEADLINE)
        await conn.close()

    trusted = await refused(login(str(settings.tls_ca_file)))
    try:
        await login(None)  # the system's CAs only
        untrusted = "accepted"
    except (ssl.SSLError, OSError, aio_pika.exceptions.AMQPError) as exc:
        untrusted = f"refused ({type(exc).__name__})"
    holds("a tenant's gateway", f"AMQPS :{settings.amqps_port} without the stack's CA", untrusted,
          f"with the CA: {trusted}", untrusted.startswith("refused") and trusted == "accepted")


def _mqtts(settings: Settings, user: str, password: str, ca: str | None) -> str:
    events: queue.Queue[Any] = queue.Queue()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=user, protocol=mqtt.MQTTv311,
                         reconnect_on_failure=False)
    client.username_pw_set(f"{t.INGRESS_VHOST}:{user}", password)
    if ca:
        client.tls_set(ca_certs=ca)
    else:
        client.tls_set()  # the system's CAs
    client.on_connect = lambda c, u, f, reason, p: events.put(str(reason))
    try:
        client.connect("127.0.0.1", settings.mqtts_port, keepalive=30)
    except (ssl.SSLError, OSError) as exc:
        return f"refused ({type(exc).__name__})"
    client.loop_start()
    try:
        return f"CONNACK {events.get(timeout=DEADLINE)}"
    except queue.Empty:
        return "no CONNACK"
    finally:
        client.disconnect()
        client.loop_stop()


async def test_mqtts_needs_the_stacks_ca(world: World, settings: Settings) -> None:
    user = f"{world.b}.van-1"
    trusted = _mqtts(settings, user, world.secrets[user], str(settings.tls_ca_file))
    untrusted = _mqtts(settings, user, world.secrets[user], None)
    holds("a tenant's device", f"MQTTS :{settings.mqtts_port} without the stack's CA", untrusted,
          f"with the CA: {trusted}", untrusted.startswith("refused") and trusted == "CONNACK Success")


async def test_the_api_serves_https_with_the_stacks_certificate(world: World, settings: Settings) -> None:
    url = f"https://127.0.0.1:{settings.api_tls_port}/health"
    async with httpx.AsyncClient(verify=str(settings.tls_ca_file), timeout=DEADLINE) as http:
        trusted = (await http.get(url)).status_code
    try:
        async with httpx.AsyncClient(timeout=DEADLINE) as http:  # the system's CAs
            untrusted = f"HTTP {(await http.get(url)).status_code}"
    except httpx.ConnectError as exc:
        untrusted = f"refused ({'certificate' if 'CERTIFICATE' in str(exc) else type(exc).__name__})"
    holds("a browser or application", f"HTTPS :{settings.api_tls_port} without the stack's CA", untrusted,
          f"with the CA: HTTP {trusted}", untrusted.startswith("refused") and trusted == 200)


async def test_postgresql_takes_tls_only_and_checks_its_name(world: World, settings: Settings) -> None:
    dsn = world.stack["postgres"]["dsn"]
    assert "sslmode=verify-full" in dsn
    conn = await asyncpg.connect(dsn, timeout=DEADLINE)
    try:
        row = await conn.fetchrow("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    finally:
        await conn.close()
    plain = dsn.split("?", 1)[0] + "?sslmode=disable"
    try:
        await (await asyncpg.connect(plain, timeout=DEADLINE)).close()
        answer = "accepted"
    except (asyncpg.PostgresError, OSError) as exc:
        answer = f"refused ({type(exc).__name__})"
    holds("a client on the network", "PostgreSQL without TLS (sslmode=disable)", answer,
          f"the stack's own connection: ssl {row['ssl']}, {row['version']}",
          answer.startswith("refused") and row["ssl"] is True)


# --------------------------------------------------------------------------- from outside loopback

PROBE = textwrap.dedent("""
    import json, socket, ssl, sys
    host, ca, plain, tls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    out = {}
    for name, port in plain.items():
        s = socket.socket(); s.settimeout(5)
        try:
            s.connect((host, port)); out[name] = "open"
        except OSError as exc:
            out[name] = type(exc).__name__
        finally:
            s.close()
    ctx = ssl.create_default_context(cafile=ca)
    for name, port in tls.items():
        try:
            with socket.create_connection((host, port), timeout=5) as raw:
                with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                    out[name] = s.version()
        except OSError as exc:
            out[name] = type(exc).__name__
    print(json.dumps(out))
""")


@pytest.fixture
def outside() -> Iterator[tuple[str, str]]:
    """A network namespace joined to this host by a veth pair: (the namespace, this host's
    address as seen from it). The namespace's traffic arrives on that address, not loopback."""
    tag = uuid.uuid4().hex[:6]
    ns, here, there = f"gf-tls-{tag}", f"gft{tag}a", f"gft{tag}b"
    octet = int(tag[:2], 16) % 250 + 1
    host_ip, ns_ip = f"10.254.{octet}.1", f"10.254.{octet}.2"

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    ip("netns", "add", ns)
    try:
        ip("link", "add", here, "type", "veth", "peer", "name", there)
        ip("link", "set", there, "netns", ns)
        ip("addr", "add", f"{host_ip}/30", "dev", here)
        ip("link", "set", here, "up")
        ip("netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/30", "dev", there)
        ip("netns", "exec", ns, "ip", "link", "set", there, "up")
        yield ns, host_ip
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


async def test_from_outside_loopback_only_tls_answers(world: World, settings: Settings,
                                                     outside: tuple[str, str]) -> None:
    ns, host_ip = outside
    plain = {"amqp": settings.amqp_port, "mqtt": settings.mqtt_port, "api http": settings.api_port,
             "management": settings.management_port, "postgres": settings.pg_port,
             "memcached": settings.memcached_port, "epmd": 4369, "erlang dist": 25672,
             "login guard": settings.guard_port, "prometheus": settings.prometheus_port}
    tls = {"amqps": settings.amqps_port, "mqtts": settings.mqtts_port, "api https": settings.api_tls_port}
    done = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", PROBE, host_ip,
                           str(settings.tls_ca_file), json.dumps(plain), json.dumps(tls)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    closed = {k: v for k, v in seen.items() if k in plain}
    spoken = {k: v for k, v in seen.items() if k in tls}
    holds("outsider (another host)", f"connect to every port of {host_ip} from a network namespace",
          f"plain: {sorted(set(closed.values()))}", f"TLS: {spoken}",
          set(closed.values()) == {"ConnectionRefusedError"}
          and all(v in ("TLSv1.3", "TLSv1.2") for v in spoken.values()))


async def test_the_map_over_https_in_a_browser_that_trusts_the_stacks_ca(world: World,
                                                                         settings: Settings) -> None:
    """The pages work over HTTPS: sign-in, the map's websocket (wss://, same origin, as the
    page policy allows), no console error (a policy violation would be one)."""
    base = f"https://127.0.0.1:{settings.api_tls_port}"
    with account(world.stack) as who, member(world.a, who.uid), \
            chromium(trust=settings.tls_ca_file) as driver:
        driver.get(f"{base}/map")
        await poll(lambda: driver.find_element(By.ID, "signin").is_displayed(), "the sign-in form")
        sign_in(driver, who)
        await poll(lambda: driver.find_element(By.ID, "status").text.startswith("live"),
                   "the map live over wss://", DEADLINE)
        status = driver.find_element(By.ID, "status").text
        protocol = driver.execute_script(
            "return location.protocol + ' ' + (gfMap.state.ws ? gfMap.state.ws.url : '')")
        errors = console_errors(driver)
        shot = screenshot(driver, "tls-map-https")
    holds("a tenant's member in a browser", f"GET {base}/map, sign in, the live feed",
          f"{status!r}; {protocol}", f"console errors: {errors}; {shot.name}",
          protocol.startswith("https: wss://") and status.startswith("live") and not errors)
