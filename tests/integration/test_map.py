"""The live map against the running stack, behind sign-in (fence/page_data.py).

Its websocket: refused before any frame without a sign-in, with a bad or expired token, from a
foreign Origin, for a user in no tenant; a tenant member's map gets its tenant's objects only,
named as the tenant names them (two tenants publish the same object id), and no platform-wide
figure; an operator's map gets both, qualified; frames at most two a second; an object's
position through x-ingress's sample (`/map/objects/{id}`, scoped the same way); the tap queues
and their policy. The page in a real browser while a short demo runs (two tenants: the fleet's
municipalities and cars, the venue app's points of interest and phones): the sign-in form and
nothing else first, then a member of the fleet sees the fleet's fences drawn, its cars moving,
an ENTER in the panel, search, and none of the venue app's fences or phones; no console error;
a session that ends (a 401) asks for the sign-in again. Screenshots: test-output/map-signin.png
(the form), test-output/map.png (the fleet's signed-in map). And, on this checkout's app alone,
markup in a fence's name, a tenant's name and an event shown as text, never run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, cast
from unittest import mock

import asyncpg
import httpx
import numpy as np
import pytest
import websocket  # websocket-client
from selenium.webdriver.common.by import By
from shapely.geometry import box

from deploy import firebase_emulator as fe
from deploy.settings import ConnectionSettings
from exchanges import topology as t
from exchanges.fence_def import FenceDef
from exchanges.shell import Counters
from fence import api_models as am
from fence import page_models as pm
from fence import pages, store, tenants
from fence.api import create_app
from fence.auth import Reason, Unauthenticated, User
from fence.map_feed import MapFeed
from fence.map_view import FRAME_EVERY_S, MapEvent, MapView
from fence.page_data import NOT_ALLOWED, NOT_SIGNED_IN, SIGN_IN_S, add_page_data
from fence.service import FenceService
from tests.integration.browser import Account, account, chromium, console_errors, member, screenshot, sign_in
from tests.integration.clients import DEADLINE, api, geofence, moving, poll
from tests.integration.test_pages import INK
from tests.integration.test_pages_no_vendor import serving
from tests.model_check import described

pytestmark = pytest.mark.integration
WAIT = 60.0
FLEET, VENUES = "fleet", "venue-app"  # the demo's tenants (deploy/demo_cmd.py)
NOW = datetime.now(UTC)


def ws_url(stack: ConnectionSettings) -> str:
    assert stack["api"]
    return str(stack["api"]).replace("http://", "ws://") + "/map/ws"


class MapSocket:
    """A map's websocket in a thread, signed in with `first` (its first message): every
    message, decoded, with when it came; and how the server closed it."""

    def __init__(self, url: str, first: dict[str, Any] | None, **options: Any) -> None:
        self.ws = websocket.create_connection(url, timeout=DEADLINE, **options)
        if first is not None:
            self.ws.send(json.dumps(first))
        self.messages: list[tuple[float, dict[str, Any]]] = []
        self.close_code: int | None = None
        self.close_reason = ""
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while True:
                opcode, data = self.ws.recv_data()
                if opcode == websocket.ABNF.OPCODE_CLOSE:
                    self.close_code = int.from_bytes(data[:2], "big") if len(data) >= 2 else 1005
                    self.close_reason = data[2:].decode(errors="replace")
                    return
                self.messages.append((time.monotonic(), json.loads(data)))
        except websocket.WebSocketConnectionClosedException:
            return
        except BaseException as exc:  # the test sees it
            self.error = exc

    def refused(self, within: float = DEADLINE) -> tuple[int | None, str]:
        """How the server closed the socket (waiting up to `within`), nothing received before."""
        self.thread.join(within)
        assert not self.thread.is_alive(), "the server did not close the socket"
        assert self.messages == [], f"frames before the refusal: {str(self.messages)[:300]}"
        return self.close_code, self.close_reason

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()
        self.thread.join(DEADLINE)


async def opened(url: str, first: dict[str, Any] | None, **options: Any) -> MapSocket:
    return await asyncio.to_thread(MapSocket, url, first, **options)




def position_in(msg: dict[str, Any], object_id: str) -> tuple[float, float] | None:
    cols = msg.get("objects") or {"ids": []}
    if object_id not in cols["ids"]:
        return None
    i = cols["ids"].index(object_id)
    return cols["lon"][i], cols["lat"][i]


@dataclass(frozen=True)
class Two:
    """Two fresh tenants (no fences: removed afterwards), a member of the first, and a user in
    no tenant."""

    a: str
    b: str
    member: Account
    lonely: Account


@pytest.fixture
async def two(stack: ConnectionSettings) -> AsyncIterator[Two]:
    run = uuid.uuid4().hex[:8]
    a, b = f"map-{run}-a", f"map-{run}-b"
    pg = await asyncpg.connect(stack["postgres"]["dsn"])
    try:
        for tenant in (a, b):
            await tenants.add_tenant(pg, tenant, "the map test's")
        with account(stack) as mine, account(stack) as lonely, member(a, mine.uid):
            yield Two(a, b, mine, lonely)
    finally:
        for tenant in (a, b):
            await tenants.remove_tenant(pg, tenant)
        await pg.close()


async def test_the_map_socket_refuses_before_any_frame(stack: ConnectionSettings, two: Two) -> None:
    url = ws_url(stack)
    expired = fe.expired_token(two.member.token)
    cases: list[tuple[str, dict[str, Any] | None, dict[str, Any], int, str]] = [
        ("a foreign page", {"token": two.member.token}, {"origin": "http://evil.example"}, NOT_ALLOWED,
         "origin"),
        ("another scheme", {"token": two.member.token},
         {"origin": str(stack["api"]).replace("http://", "https://")}, NOT_ALLOWED, "origin"),
        ("no token", {}, {}, NOT_SIGNED_IN, "sign in first"),
        ("a bad token", {"token": "garbage"}, {}, NOT_SIGNED_IN, "token"),
        ("an expired token", {"token": expired}, {}, NOT_SIGNED_IN, "token"),
        ("in no tenant", {"token": two.lonely.token}, {}, NOT_ALLOWED, "member of no tenant"),
        ("not a member", {"token": two.member.token, "tenant": two.b}, {}, NOT_ALLOWED, "not a member"),
    ]
    for what, first, options, code, words in cases:
        sock = await opened(url, first, **options)
        try:
            got, reason = await asyncio.to_thread(sock.refused)
        finally:
            await asyncio.to_thread(sock.close)
        assert (got, words in reason) == (code, True), (what, got, reason)
    # no sign-in message at all: closed once SIGN_IN_S have passed, nothing sent before
    sock = await opened(url, None)
    try:
        started = time.monotonic()
        got, reason = await asyncio.to_thread(sock.refused, SIGN_IN_S + DEADLINE)
        assert got == NOT_SIGNED_IN and "no sign-in within" in reason
        assert time.monotonic() - started >= SIGN_IN_S - 1
    finally:
        await asyncio.to_thread(sock.close)


async def test_the_map_data_routes_need_a_sign_in(stack: ConnectionSettings, two: Two) -> None:
    async with httpx.AsyncClient(base_url=str(stack["api"]), timeout=DEADLINE) as http:
        for path in ("/map/fences", "/map/objects/car-1", "/ops/data"):
            r = await http.get(path)
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer"), path
        r = await http.get("/map/fences", headers=two.lonely.headers())
        assert r.status_code == 403 and "member of no tenant" in r.json()["error"]
        r = await http.get("/map/fences", headers=two.member.headers())
        assert r.status_code == 200 and r.json()["features"] == []  # a tenant without fences
        r = await http.get("/ops/data", headers=two.member.headers())
        assert r.status_code == 403 and "operators" in r.json()["error"]
        for page in ("/map", "/ops", "/venues/x"):  # the pages hold no data: public
            assert (await http.get(page)).status_code == 200


async def test_a_members_map_shows_its_tenants_objects_only(stack: ConnectionSettings, two: Two) -> None:
    oid = f"car-{uuid.uuid4().hex[:8]}"  # the same id in both tenants: two objects
    stop = asyncio.Event()
    url = ws_url(stack)
    with account(stack, operator=True) as operator:
        mine = await opened(url, {"token": two.member.token})  # websocket-client sends our Origin
        everyone = await opened(url, {"token": operator.token, "tenant": None}, suppress_origin=True)
        senders = [asyncio.create_task(moving(stack, two.a, oid, stop, lat=47.02)),
                   asyncio.create_task(moving(stack, two.b, oid, stop, lat=47.03))]
        try:
            await poll(lambda: bool(mine.messages), "the first message", WAIT)
            assert mine.messages[0][1]["type"] == "snapshot"
            assert {"objects", "counts", "events", "stats"} <= mine.messages[0][1].keys()
            # the member's object reaches its map through x-ingress's sample, named as it was
            await poll(lambda: sum(position_in(m, oid) is not None for _, m in mine.messages) >= 3,
                       f"{oid} on the member's map three times", WAIT)
            seen = [p for _, m in mine.messages if (p := position_in(m, oid)) is not None]
            assert len(set(seen)) >= 2, seen  # it moved
            assert all(abs(lat - 47.02) < 1e-6 and 9.40 - 1e-6 <= lon < 9.41 for lon, lat in seen), seen
            # the operator's map: both tenants' objects, qualified
            await poll(lambda: all(any(position_in(m, f"{x}:{oid}") for _, m in everyone.messages)
                                   for x in (two.a, two.b)), "both objects on the operator's map", WAIT)
            assert all(position_in(m, oid) is None for _, m in everyone.messages)
            assert any("positions_per_s" in (m.get("stats") or {}) for _, m in everyone.messages)
            # the member never got the other tenant's object, a qualified name, or a platform figure
            for _, m in mine.messages:
                text = json.dumps(m)
                assert two.b not in text and two.a not in text, text[:300]
                assert all(":" not in i for i in (m.get("objects") or {"ids": []})["ids"])
                assert all(":" not in f for f in m.get("counts") or {})
                assert not {"positions_per_s", "events_per_s"} & (m.get("stats") or {}).keys()
                assert not {"events_skipped", "pending"} & m.keys()
            async with httpx.AsyncClient(base_url=str(stack["api"]), timeout=DEADLINE) as http:
                r = await http.get(f"/map/objects/{oid}", headers=two.member.headers())
                assert r.status_code == 200 and r.json()["object_id"] == oid and r.json()["lat"] == 47.02
                described(pm.MapObject, r.json())
                assert (await http.get(f"/map/objects/nobody-{oid}", headers=two.member.headers())
                        ).status_code == 404
                r = await http.get(f"/map/objects/{two.b}:{oid}", headers=operator.headers())
                assert r.status_code == 200 and r.json()["lat"] == 47.03 and r.json()["tenant"] == two.b
                described(pm.MapObject, r.json())
            # the tap queues exist, exclusive, under the gf-map-taps policy
            taps: list[dict[str, Any]] = []

            def tapped() -> bool:
                listed = [q for v in (t.INGRESS_VHOST, t.FENCES_VHOST)
                          for q in api(stack, f"api/queues/{v}") or []]
                taps[:] = [q for q in listed if q["name"].startswith(t.MAP_TAP_QUEUE_PREFIX)]
                return ({q["name"].rsplit(".", 1)[1] for q in taps} >= {"positions", "events"}
                        and all(q.get("policy") == t.MAP_TAPS_POLICY for q in taps))

            await poll(tapped, "the map's tap queues under their policy", DEADLINE)
            assert all(q["exclusive"] and not q["durable"] for q in taps), taps
            # the rate: over 6 s of traffic at 5 positions/s, no more than 2 messages a second
            start = time.monotonic()
            n0 = len(mine.messages)
            await asyncio.sleep(6.0)  # a measuring window, not a synchronisation
            window = [m for at, m in mine.messages[n0:] if at >= start]
            assert 1 <= len(window) <= 6.0 / FRAME_EVERY_S + 1, len(window)
            assert all(m["type"] in ("delta", "stats") for m in window)
            assert mine.error is None and everyone.error is None
            assert mine.close_code is None and everyone.close_code is None
        finally:
            stop.set()
            for sender in senders:
                await sender
            await asyncio.to_thread(mine.close)
            await asyncio.to_thread(everyone.close)


async def test_the_map_page_signs_in_and_shows_the_fleet_only(stack: ConnectionSettings) -> None:
    script = Path(sys.executable).with_name("geofence")
    demo = await asyncio.create_subprocess_exec(
        str(script), "demo", "--vehicles", "30", "--duration", "40", "--rate", "2", "--quiet",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    lines: list[str] = []

    async def read() -> None:
        assert demo.stdout is not None
        async for line in demo.stdout:
            lines.append(line.decode(errors="replace"))

    reader = asyncio.create_task(read())
    try:
        with account(stack) as fleet_user, account(stack, operator=True) as operator:
            await poll(lambda: geofence_tenant_exists(FLEET), "the demo's tenants", WAIT)
            with member(FLEET, fleet_user.uid), chromium() as driver:
                await page_flow(stack, driver, fleet_user, operator, lambda: run_prefix(lines))
        await asyncio.wait_for(demo.wait(), 120)
        await asyncio.wait_for(reader, DEADLINE)
        out = "".join(lines)
        assert demo.returncode == 0, out[-3000:]
        summary = next(line for line in out.splitlines() if line.startswith("SUMMARY"))
        assert summary.startswith("SUMMARY OK"), summary
        assert "/map" in out  # the demo says where to look
    finally:
        if demo.returncode is None:
            demo.kill()
            await demo.wait()
        reader.cancel()


# what the map holds, for a failure's message: its state (not the socket), the socket's
# readyState, some objects, its status line
MAP_STATE = """
const s = gfMap.state;
return [Object.fromEntries(Object.entries(s).filter(([k]) => k !== "ws")), s.ws && s.ws.readyState,
        [...gfMap.objects.keys()].slice(0, 20), document.getElementById("status").textContent];
"""


def run_prefix(lines: list[str]) -> str | None:
    """This demo run's object id prefix (`d<run>-`), from its "Moving:" line once printed."""
    for line in lines:
        if line.startswith("Moving:") and (found := re.search(r"\(ids (d[0-9a-f]+-)\.\.\.\)", line)):
            return found.group(1)
    return None


def geofence_tenant_exists(tenant: str) -> bool:
    listed = geofence("tenant", "list", "--json")
    return listed.returncode == 0 and tenant in {x["id"] for x in json.loads(listed.stdout)}


async def page_flow(stack: ConnectionSettings, driver: Any, who: Account, operator: Account,
                    prefix_of_run: Callable[[], str | None]) -> None:
    await asyncio.to_thread(driver.get, f"{stack['api']}/map")
    # before sign-in: the form, nothing else (no map, no search, no request for data)
    await poll(lambda: driver.find_element(By.ID, "signin").is_displayed(), "the sign-in form")
    for hidden in ("content", "search", "signout", "tenant-box"):
        assert not driver.find_element(By.ID, hidden).is_displayed(), hidden
    assert driver.find_element(By.ID, "status").text == "signed out"
    assert driver.execute_script("return gfMap.fences.size + gfMap.objects.size") == 0
    path = screenshot(driver, "map-signin")
    assert path.stat().st_size > 5_000
    assert console_errors(driver) == []
    sign_in(driver, who, "wrong-" + who.password)
    await poll(lambda: "sign-in failed" in driver.find_element(By.ID, "signin-error").text,
               "a wrong password refused")
    refused = console_errors(driver)  # the browser logs the refusal (400): that one only
    assert len(refused) == 1 and "accounts:signInWithPassword" in refused[0], refused
    sign_in(driver, who)
    cars = "return [...gfMap.objects.keys()].filter(k => k.includes('-car-'))"
    await poll(lambda: driver.execute_script("return gfMap.fences.size") >= 11, "the fleet's fences", WAIT)
    assert not driver.find_element(By.ID, "signin").is_displayed()
    assert not driver.find_element(By.ID, "tenant-box").is_displayed()  # one tenant: nothing to choose
    entered = "return [...document.querySelectorAll('#events li')].filter(li => " \
              "li.querySelector('.enter') && li.textContent.includes('-car-')).length"
    enters_before = driver.execute_script(entered)
    # this run's vehicles by their ids (earlier runs' may still be on the map, not yet stale);
    # the demo stores its fences and venues through the production path before its vehicles set
    # off: on a loaded machine that alone can take most of a minute
    await poll(lambda: prefix_of_run() is not None, "the demo's vehicles setting off", 2 * WAIT)
    prefix = prefix_of_run()
    assert prefix is not None
    ours = cars.replace("k.includes('-car-')", f"k.startsWith('{prefix}') && k.includes('-car-')")
    try:
        await poll(lambda: bool(driver.execute_script(ours)), "this demo's vehicles", WAIT)
    except AssertionError as exc:  # what the map had: its state, its objects, its status line
        seen = driver.execute_script(MAP_STATE)
        raise AssertionError(f"{exc}; the map: {json.dumps(seen, default=str)[:1500]}") from None
    # the fleet's fences are drawn (the overlay canvas has ink): its municipalities, by the names
    # the fleet gives them, and none of the venue app's points of interest
    canvases = driver.find_elements(By.CSS_SELECTOR, ".leaflet-overlay-pane canvas")
    assert canvases and driver.execute_script(INK, canvases[0]) > 10_000
    ids = set(driver.execute_script("return [...gfMap.fences.keys()]"))
    assert {"li-vaduz", "li-schaan", "li-eschen"} <= ids
    assert all(i.startswith("li-") for i in ids), sorted(ids)
    # a marker moves within a few seconds
    demo_objects = sorted(driver.execute_script(ours))
    where = "return gfMap.objects.get(arguments[0]).getLatLng()"
    before = {o: driver.execute_script(where, o) for o in demo_objects[:10]}

    def moved() -> bool:
        return any(driver.execute_script(where, o) != ll for o, ll in before.items()
                   if driver.execute_script("return gfMap.objects.has(arguments[0])", o))

    await poll(moved, "a demo vehicle's marker moving", 10.0)
    # an ENTER in the panel
    await poll(lambda: driver.execute_script(entered) > enters_before, "an ENTER in the events panel", WAIT)
    first = driver.find_element(By.CSS_SELECTOR, "#events li").text
    assert "ENTER" in first or "LEAVE" in first
    # nothing of the venue app: its phones (half the demo's moving objects), its fences, its tenant
    objects = driver.execute_script("return [...gfMap.objects.keys()]")
    assert objects and not [o for o in objects if "-phone-" in o or ":" in o], objects[:20]
    panel = driver.find_element(By.ID, "events").text
    assert "-phone-" not in panel and "poi-" not in panel and VENUES not in panel
    # the counts: some fence holds someone, and the tiles say so (the workers' counts come every
    # 2 s, after the ENTER that the panel shows); no platform-wide rate
    def inside() -> int:
        text = driver.find_element(By.ID, "s-inside").text.replace(",", "")
        return int(text) if text.isdigit() else 0

    await poll(lambda: inside() > 0, "someone inside a fence on the tiles", WAIT)
    assert not driver.find_element(By.ID, "t-positions").is_displayed()
    assert f"live · {len(ids)} fences of {FLEET}" in driver.find_element(By.ID, "status").text
    # search: a fence by id zooms to it and says how many are inside
    box = driver.find_element(By.ID, "search-q")
    box.send_keys("li-vaduz")
    driver.find_element(By.CSS_SELECTOR, "#search button").click()
    await poll(lambda: "inside" in driver.find_element(By.ID, "search-result").text, "the search result",
               DEADLINE)
    box.clear()
    driver.execute_script("gfMap.map.setView([47.15, 9.54], 12)")  # the country, for the shot
    frames = driver.execute_script("return gfMap.state.frames")
    await poll(lambda: driver.execute_script("return gfMap.state.frames") >= frames + 2,
               "two more frames on the picture", DEADLINE)
    path = screenshot(driver, "map")
    assert path.stat().st_size > 20_000
    assert console_errors(driver) == []
    # the same fences over HTTP: the fleet's, unqualified; the operator's, every tenant's qualified
    async with httpx.AsyncClient(base_url=str(stack["api"]), timeout=DEADLINE) as http:
        page = (await http.get("/map/fences", headers=who.headers())).json()
        described(am.FencePage, page)
        mine = page["features"]
        assert {f["id"] for f in mine} == ids and {f["properties"]["tenant"] for f in mine} == {FLEET}
        every = (await http.get("/map/fences", headers=operator.headers())).json()["features"]
        listed = {f["id"] for f in every}
        assert {f"{FLEET}:{i}" for i in ids} <= listed and any(i.startswith(f"{VENUES}:poi-") for i in listed)
    # a session that ends: the next request's 401 brings the sign-in form back, the map emptied
    driver.execute_script("sessionStorage.setItem('geofence-token', 'expired'); location.reload()")
    await poll(lambda: driver.find_element(By.ID, "signin").is_displayed(), "the sign-in form again")
    assert "sign in again" in driver.find_element(By.ID, "signin-error").text
    assert not driver.find_element(By.ID, "content").is_displayed()
    assert driver.execute_script("return gfMap.fences.size + gfMap.objects.size") == 0
    assert all("401" in e for e in console_errors(driver))  # the refused request, logged


# --------------------------------------------------------------------------- strings as text

MARKUP = '<img src=x onerror="window.gfPwned=1">'


class _Verifier:
    async def verify(self, authorization: str | None) -> User:
        if authorization != "Bearer member-token":
            raise Unauthenticated(Reason.INVALID, "not the test token")
        return User("uid-markup", None, {})


class _Pool:
    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[None]:
        yield None


class _Manager:
    pool = _Pool()
    workers: ClassVar[list[str]] = []


def test_the_map_page_puts_the_servers_strings_in_as_text() -> None:
    """A tenant's names are its users' to choose: a fence name, a tenant's name, an event's
    reason holding markup are shown as text on the map (tooltip, tenant selector, panel), never
    run. This checkout's app served here with a fake verifier, store and feed (no stack)."""
    now = time.time()
    fence = store.FenceRecord(FenceDef(fence_id="t1:yard", version=1, geometry=box(9.50, 47.10, 9.52, 47.12),
                                       timeout_s=300.0, name=MARKUP), "uid-markup", NOW, NOW)

    async def find_fences(conn: Any, tenant: str | None, bbox: Any, limit: int, after: str) -> list[Any]:
        return [fence] if tenant == "t1" and after < fence.fence.fence_id else []

    async def memberships(conn: Any, uid: str) -> dict[str, str]:
        return {"t1": "viewer", "t2": "viewer"}

    async def member_tenants(conn: Any, uid: str) -> list[dict[str, str]]:
        return [{"tenant": "t1", "name": MARKUP, "role": "viewer"},
                {"tenant": "t2", "name": "", "role": "viewer"}]

    view = MapView()
    view.add_sample(["t1:car-1"], np.array([9.51]), np.array([47.11]), np.array([now]), 1, now)
    view.add_events([MapEvent("enter", "t1:yard", "t1:car-1", now, MARKUP)], 1, now)
    feed = MapFeed(cast(Any, None), cast(Any, _Manager()), Counters(), view)
    app = create_app(FenceService(cast(Any, _Manager())), _Verifier())
    pages.add_pages(app, {"project": "demo-geofence", "api_key": "local-emulator", "emulator": None})
    add_page_data(app, None, feed)
    with mock.patch.object(store, "find_fences", find_fences), \
            mock.patch.object(tenants, "memberships", memberships), \
            mock.patch.object(tenants, "member_tenants", member_tenants), \
            serving(app) as url, chromium() as driver:
        driver.get(f"{url}/map#tenant=t1&token=member-token")
        end = time.monotonic() + WAIT
        while driver.execute_script("return gfMap.state.frames") < 1 and time.monotonic() < end:
            time.sleep(0.2)
        assert driver.execute_script("return gfMap.fences.size") == 1
        assert "token" not in driver.execute_script("return location.hash")  # out of the address bar
        labels = [o.text for o in driver.find_elements(By.CSS_SELECTOR, "#tenant option")]
        assert labels == [f"t1 · {MARKUP}", "t2"], labels
        driver.execute_script("const f = gfMap.fences.get('yard'); f.layer.openTooltip(f.layer.getBounds()"
                              ".getCenter())")
        tip = driver.find_element(By.CSS_SELECTOR, ".leaflet-tooltip").text
        assert tip == f"yard · {MARKUP}: 1 inside" or tip == f"yard · {MARKUP}: 0 inside", tip
        assert MARKUP in driver.find_element(By.ID, "events").text
        assert driver.find_elements(By.CSS_SELECTOR, "img:not(.leaflet-tile)") == []
        assert driver.execute_script("return window.gfPwned") is None
        assert [e for e in console_errors(driver) if "gfPwned" in e] == []
