"""The attack table's rows against the API's edges (issue 37): floods and token spraying (429
with Retry-After, per address, per token, after failed sign-ins), hostile text in a hive or a
fence (a 422 naming the field, never a 500; markup kept as text), a forged operator claim, the
pages' policy headers, and a tenant past its quotas. Each row holds when the attack is refused
and the legitimate request beside it still works.

The floods come from source addresses of their own on the loopback network (127.0.0.2-4): the
limits are per address, so the rest of the suite, on 127.0.0.1, is not slowed by them."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx

from deploy import firebase_emulator as fe
from tests.security.attacks import holds
from tests.security.conftest import World, depot

SPRAY, SPRAY_RATE = 1_000, 200.0  # requests, a second


def client_from(world: World, source: str) -> httpx.AsyncClient:
    """An HTTP client whose connections come from `source` (a loopback address of its own)."""
    assert world.stack["api"]
    return httpx.AsyncClient(base_url=world.stack["api"], timeout=30,
                             transport=httpx.AsyncHTTPTransport(local_address=source))


async def paced(client: httpx.AsyncClient, n: int, rate: float, headers: dict[str, str],
                path: str = "/fences") -> list[httpx.Response]:
    """`n` GETs of `path`, started `rate` a second (each on its own: a flood, not a queue)."""
    start = time.monotonic()

    async def one(i: int) -> httpx.Response:
        await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))  # the flood's pace
        return await client.get(path, headers=headers)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


def summary(answers: list[httpx.Response]) -> str:
    counts = Counter(r.status_code for r in answers)
    return ", ".join(f"{n:,} x {code}" for code, n in sorted(counts.items()))


async def test_token_spraying_is_slowed_to_a_few_tries_a_minute(world: World) -> None:
    async with client_from(world, "127.0.0.2") as spray:
        bad = {"Authorization": f"Bearer garbage-{uuid.uuid4().hex}"}
        answers = await paced(spray, SPRAY, SPRAY_RATE, bad)
    counts = Counter(r.status_code for r in answers)
    throttled = [r for r in answers if r.status_code == 429]
    retry = {r.headers.get("retry-after", "") for r in throttled}
    legit = await world.http.get("/fences", headers=world.a_admin.headers())
    ok = (counts[401] <= 70 and counts[429] >= SPRAY - 70 and set(counts) <= {401, 429}
          and all(v.isdigit() and int(v) >= 1 for v in retry)
          and all("failed sign-ins" in r.json()["error"] for r in throttled) and legit.status_code == 200)
    holds("outsider", f"{SPRAY:,} API requests at {SPRAY_RATE:g}/s with bad tokens", summary(answers),
          f"a member from another address: {legit.status_code}", ok)


async def pipelined(world: World, source: str, path: str, token: str, n: int, conns: int
                    ) -> list[tuple[int, dict[str, str]]]:
    """`n` GETs of `path` on each of `conns` connections from `source`, pipelined (HTTP/1.1):
    as fast as the server answers, which an HTTP client library in this process is not (httpx
    tops out at a few hundred a second). Each answer's status and headers."""
    api = urlsplit(str(world.stack["api"]))
    request = (f"GET {path} HTTP/1.1\r\nHost: {api.netloc}\r\nAuthorization: Bearer {token}\r\n\r\n"
               ).encode()

    async def one() -> list[tuple[int, dict[str, str]]]:
        reader, writer = await asyncio.open_connection(api.hostname, api.port, local_addr=(source, 0))
        try:
            writer.write(request * n)
            await writer.drain()
            out = []
            for _ in range(n):
                status = int((await reader.readline()).split()[1])
                headers = {}
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                await reader.readexactly(int(headers.get("content-length", "0")))
                out.append((status, headers))
            return out
        finally:
            writer.close()

    return [a for answers in await asyncio.gather(*(one() for _ in range(conns))) for a in answers]


async def test_a_flood_with_a_good_token_is_answered_429_with_retry_after(world: World) -> None:
    answers = await pipelined(world, "127.0.0.3", "/health", world.b_viewer.token, 200, 6)
    codes = Counter(status for status, _ in answers)
    throttled = [h for status, h in answers if status == 429]
    legit = await world.http.get("/fences", headers=world.a_admin.headers())
    ok = (codes[429] >= 600 and codes[200] <= 600 and set(codes) <= {200, 429}
          and all(h.get("retry-after", "").isdigit() for h in throttled) and legit.status_code == 200)
    holds("other tenant's member", "1,200 requests as fast as the API answers, one token",
          ", ".join(f"{n:,} x {code}" for code, n in sorted(codes.items())),
          f"another member: {legit.status_code}", ok)


HOSTILE_HIVES: list[tuple[str, str, Any]] = [  # what, the field, its value
    ("a NUL in the name", "name", "Bar\x00"),
    ("a NUL in the id", "id", "bar\x00x"),
    ("the id ../../x", "id", "../../x"),
    ("a 100,000-character name", "name", "n" * 100_000),
    ("a 100,000-character address", "address", "a" * 100_000),
    ("a right-to-left override in the name", "name", "invoice\u202efdp.exe"),
    ("a line break in the address", "address", "Street 1\nX-Forged: yes"),
]


async def test_hostile_text_in_a_hive_is_refused_with_a_reason(world: World) -> None:
    base = {"id": f"sec-hive-{uuid.uuid4().hex[:8]}", "name": "Café <b>Central</b>", "type": "cafe",
            "lon": 9.52, "lat": 47.14}
    headers = world.outsider.headers()  # any signed-in user may own hives
    answers = []
    for what, field, value in HOSTILE_HIVES:
        body = base | {"id": base["id"] + "x", field: value}
        r = await world.http.post("/owner/hives", json=body, headers=headers)
        answers.append((what, field, r))
    legit = await world.http.post("/owner/hives", json=base, headers=headers)
    try:
        shown = (await world.http.get(f"/hives/{base['id']}")).json() if legit.status_code == 201 else {}
        for what, field, r in answers:
            is_json = r.headers.get("content-type", "").startswith(("application/json",
                                                                    "application/problem+json"))
            error = r.json().get("error", "") if is_json else ""
            ok = r.status_code == 422 and error.startswith(field) and len(r.text) < 1_000
            holds("signed-in user", f"POST /owner/hives with {what}", f"{r.status_code}: {error[:60]}",
                  f"a hive with markup in its name: {legit.status_code}, shown as sent: "
                  f"{shown.get('name') == base['name']}", ok and legit.status_code == 201
                  and shown.get("name") == base["name"])
    finally:
        pg = await asyncpg.connect(world.stack["postgres"]["dsn"])  # owners have no DELETE for hives
        try:
            await pg.execute("DELETE FROM hive WHERE id = $1", base["id"])
        finally:
            await pg.close()


async def test_a_forged_operator_claim_is_refused(world: World) -> None:
    forged = fe.forged_token(world.b_editor.token, geofence_operator=True)
    r = await world.http.get("/ops/data", headers={"Authorization": f"Bearer {forged}"})
    legit = await world.http.get("/ops/data", headers=world.operator.headers())
    ok = r.status_code == 401 and "not the user's" in r.json().get("error", "") and legit.status_code == 200
    holds("other tenant's member", "an unsigned (emulator) token claiming geofence_operator",
          f"{r.status_code}: {r.json().get('error', '')[:60]}", f"a real operator: {legit.status_code}", ok)


async def test_every_page_sends_a_strict_policy(world: World) -> None:
    pages = {p: await world.http.get(p) for p in ("/map", "/ops", "/venues/x", "/static/map.js")}
    policies = {p: r.headers.get("content-security-policy", "") for p, r in pages.items()}
    ok = all("script-src 'self'" in c and "unsafe" not in c and "frame-ancestors 'none'" in c
             for c in policies.values()) and all(r.headers.get("x-frame-options") == "DENY" and
                                                  r.headers.get("x-content-type-options") == "nosniff"
                                                  for r in pages.values())
    holds("any page", "frame a page, or run a script injected into it", "CSP: script-src 'self', "
          "frame-ancestors 'none'; X-Frame-Options DENY; nosniff",
          f"the pages: {sorted({r.status_code for r in pages.values()})}",
          ok and all(r.status_code == 200 for r in pages.values()))


async def test_one_tenant_cannot_load_the_routing_plane_past_its_quota(world: World) -> None:
    from tests.integration.clients import geofence  # the operator's command

    held = json.loads(geofence("tenant", "quota", world.b, "--json").stdout)["fences"]["used"]
    done = geofence("tenant", "quota", world.b, "--set", f"fences={held + 3}", "--json")
    assert done.returncode == 0, done.stderr
    headers = world.b_editor.headers()
    made, codes = [], []
    try:
        for i in range(5):
            fence = depot(f"q-{i}", at=(9.5 + i * 0.01, 47.1))
            r = await world.http.post("/fences", json=fence, headers=headers)
            codes.append(r.status_code)
            if r.status_code == 201:
                made.append(f"q-{i}")
        quota = (await world.http.get(f"/tenants/{world.b}/quota", headers=headers)).json()["quota"]
        ok = codes == [201, 201, 201, 403, 403] and quota["fences"] == {"max": held + 3, "used": held + 3,
                                                                       "default": False}
        holds("other tenant's editor", "create 5 fences, 3 short of its tenant's quota", json.dumps(codes),
              f"the first three: {codes[:3]}; its quota read back", ok)
    finally:
        for fid in made:
            await world.http.delete(f"/fences/{fid}", headers=headers)
        geofence("tenant", "quota", world.b, "--set", "fences=default")
