"""The attack table's rows against webhooks (issue 40): an endpoint is its tenant admin's;
another tenant's admin finds none of it (404 for every route, never 403, so an id is not even
confirmed) and cannot remove, enable, rotate or replay it; an editor or a viewer adds none; and
a URL is a public HTTPS callback, never an address on the platform's own network (SSRF): a
private, loopback, link-local, shared or mapped address, plain http and credentials in the URL
are refused with the reason, while a public https address beside them is accepted."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from fence.webhooks import store
from tests.security.attacks import holds, revealed
from tests.security.conftest import World

# a public address, never reached: the endpoint names a fence that does not exist, so it wants
# no event and nothing is ever sent to it
RECEIVER = "https://93.184.216.34/hooks/geofence"
QUIET = {"fences": ["no-such-fence"]}
SSRF = [
    "https://127.0.0.1/hook",
    "https://10.0.0.5/hook",
    "https://192.168.1.1:8443/hook",
    "https://169.254.169.254/latest/meta-data/",
    "https://100.64.0.1/hook",
    "https://[::1]/hook",
    "https://[::ffff:127.0.0.1]/hook",
    "https://0.0.0.0/hook",
    "http://93.184.216.34/hook",
    "https://admin:secret@93.184.216.34/hook",
    "file:///etc/passwd",
]


@pytest.fixture
async def victims_endpoint(world: World) -> AsyncIterator[str]:
    made = await world.http.post("/webhooks", json={"url": RECEIVER, **QUIET, "description": "the victim's"},
                                 headers=world.a_admin.headers())
    assert made.status_code == 201, made.text
    endpoint = str(made.json()["id"])
    try:
        yield endpoint
    finally:
        await world.http.delete(f"/webhooks/{endpoint}", headers=world.a_admin.headers())


def _leaks(world: World, reply: httpx.Response) -> list[str]:
    words = (RECEIVER, "secret", "the victim's")
    return [*revealed(world, reply.text), *(w for w in words if w in reply.text)]


async def test_another_tenants_admin_finds_none_of_the_victims_endpoint(world: World,
                                                                         victims_endpoint: str) -> None:
    assert world.b_admin is not None
    attacker = world.b_admin.headers()
    http, e = world.http, victims_endpoint
    tries = [http.get(f"/webhooks/{e}", headers=attacker),
             http.post(f"/webhooks/{e}/enable", headers=attacker),
             http.post(f"/webhooks/{e}/rotate", headers=attacker),
             http.get(f"/webhooks/{e}/dead", headers=attacker),
             http.post(f"/webhooks/{e}/dead/replay", headers=attacker),
             http.delete(f"/webhooks/{e}", headers=attacker)]
    replies = [await t for t in tries]
    listed = await http.get("/webhooks", headers=attacker)
    leaks = [x for r in [*replies, listed] for x in _leaks(world, r)]
    victim = await http.get(f"/webhooks/{e}", headers=world.a_admin.headers())
    still = victim.status_code == 200 and victim.json()["url"] == RECEIVER
    statuses = [r.status_code for r in replies]
    holds(
        "other tenant's admin",
        "GET, enable, rotate, dead, replay, DELETE /webhooks/<the victim's endpoint>; GET /webhooks",
        f"{statuses}, its list {listed.status_code} without it; leaks {leaks or 'nothing'}",
        f"the victim's admin: {victim.status_code}, the endpoint unchanged: {still}",
        statuses == [404] * 6 and listed.status_code == 200 and e not in listed.text and not leaks and still,
    )


async def test_an_editor_or_a_viewer_adds_no_endpoint(world: World) -> None:
    assert world.b_admin is not None
    body = {"url": RECEIVER, **QUIET}
    editor = await world.http.post("/webhooks", json=body, headers=world.b_editor.headers())
    viewer = await world.http.post("/webhooks", json=body, headers=world.b_viewer.headers())
    admin = await world.http.post("/webhooks", json=body, headers=world.b_admin.headers())
    if admin.status_code == 201:
        await world.http.delete(f"/webhooks/{admin.json()['id']}", headers=world.b_admin.headers())
    holds(
        "a tenant's editor, viewer",
        "POST /webhooks (an HTTPS receiver for the tenant's events)",
        f"editor {editor.status_code}, viewer {viewer.status_code}",
        f"the tenant's admin: {admin.status_code}",
        editor.status_code == 403 and viewer.status_code == 403 and admin.status_code == 201,
    )


async def test_an_endpoint_is_never_an_address_of_the_platforms_network(world: World,
                                                                        victims_endpoint: str) -> None:
    """SSRF by the URL itself (a name that resolves to such an address is refused at every
    connection instead: fence/webhooks/delivery.py, tests/unit/test_webhooks_core.py)."""
    admin = world.a_admin.headers()
    replies = {url: await world.http.post("/webhooks", json={"url": url, **QUIET}, headers=admin)
               for url in SSRF}
    made = [r.json()["id"] for r in replies.values() if r.status_code == 201]
    for endpoint in made:  # (none, when the row holds)
        await world.http.delete(f"/webhooks/{endpoint}", headers=admin)
    reasons = [str(r.json().get("detail", ""))[:40] for r in replies.values() if r.status_code == 422]
    holds(
        "a tenant's admin",
        f"POST /webhooks with {len(SSRF)} URLs: loopback, private, link-local (metadata), shared, "
        "::1, IPv4-mapped, 0.0.0.0, http://, credentials, file://",
        f"{sorted({r.status_code for r in replies.values()})}, e.g. {reasons[:2]}",
        f"a public https receiver beside them: accepted ({victims_endpoint})",
        all(r.status_code == 422 for r in replies.values()) and len(reasons) == len(SSRF),
    )


async def test_another_tenants_admin_reads_none_of_the_victims_notices(world: World,
                                                                      victims_endpoint: str) -> None:
    # the victim's endpoint disabled as the sidecar disables it: its notice stored with it
    conn = await asyncpg.connect(world.stack["postgres"]["dsn"])
    try:
        notice = await store.disable(conn, victims_endpoint, "it answered 410 Gone")
    finally:
        await conn.close()
    assert notice is not None
    assert world.b_admin is not None
    http = world.http
    stolen = await http.get("/notices", params={"after": 0, "limit": 100}, headers=world.b_admin.headers())
    editor = await http.get("/notices", headers=world.b_editor.headers())
    mine = await http.get("/notices", params={"after": notice - 1}, headers=world.a_admin.headers())
    seen = [n["id"] for n in stolen.json()["notices"]] if stolen.status_code == 200 else []
    leaks = [*_leaks(world, stolen), *(["the endpoint id"] if victims_endpoint in stolen.text else [])]
    told = mine.status_code == 200 and [n["subject"] for n in mine.json()["notices"][:1]] == [
        victims_endpoint]
    holds(
        "other tenant's admin",
        "GET /notices (the victim's endpoint just disabled, its notice stored); the attacker's editor too",
        f"{stolen.status_code} with {len(seen)} notice(s), none the victim's: {notice not in seen}; "
        f"leaks {leaks or 'nothing'}; the editor {editor.status_code}",
        f"the victim's admin: {mine.status_code}, told: {told}",
        stolen.status_code == 200 and notice not in seen and not leaks and editor.status_code == 403 and told,
    )
