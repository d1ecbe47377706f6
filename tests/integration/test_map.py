"""The live map against the running stack: its websocket (frames, their rate, an object's
position through x-ingress's sample, the tap queues and their policy) and the page in a real
browser while a short demo runs (fences drawn, a marker moving, an ENTER in the panel, search,
no console error; screenshot test-output/map.png)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import pytest
import websocket  # websocket-client
from selenium.webdriver.common.by import By

from deploy.settings import ConnectionSettings
from exchanges import topology as t
from fence.map_view import FRAME_EVERY_S
from tests.integration.browser import chromium, console_errors, screenshot
from tests.integration.clients import DEADLINE, api, poll
from tests.integration.test_pages import INK

pytestmark = pytest.mark.integration
WAIT = 60.0


class MapSocket:
    """A map's websocket in a thread: every message, decoded, with when it came."""

    def __init__(self, api_url: str) -> None:
        url = api_url.replace("http://", "ws://") + "/map/ws"
        self.ws = websocket.create_connection(url, timeout=DEADLINE)
        self.messages: list[tuple[float, dict[str, Any]]] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while True:
                data = self.ws.recv()
                if not data:
                    return
                self.messages.append((time.monotonic(), json.loads(data)))
        except websocket.WebSocketConnectionClosedException:
            return
        except BaseException as exc:  # the test sees it
            self.error = exc

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()
        self.thread.join(DEADLINE)


async def moving(stack: ConnectionSettings, object_id: str, stop: asyncio.Event) -> list[tuple[float, float]]:
    """Positions of one object, a step east every 0.2 s, until `stop` (outside every fence)."""
    sent = []
    async with await aio_pika.connect(stack["amqp"][t.INGRESS_VHOST], timeout=DEADLINE) as conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange(t.MQTT_TOPIC_EXCHANGE)
        k = 0
        while not stop.is_set():
            lon, lat = 9.40 + 0.0001 * k, 47.02
            body = json.dumps({"lon": lon, "lat": lat, "ts": time.time()}).encode()
            await ex.publish(aio_pika.Message(body), f"positions.{object_id}")
            sent.append((lon, lat))
            k += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
    return sent


def position_in(msg: dict[str, Any], object_id: str) -> tuple[float, float] | None:
    cols = msg.get("objects") or {"ids": []}
    if object_id not in cols["ids"]:
        return None
    i = cols["ids"].index(object_id)
    return cols["lon"][i], cols["lat"][i]


async def test_the_map_socket_sends_a_snapshot_then_at_most_two_frames_a_second(
        stack: ConnectionSettings) -> None:
    oid = f"map-{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    assert stack["api"]
    sock = await asyncio.to_thread(MapSocket, stack["api"])
    sender = asyncio.create_task(moving(stack, oid, stop))
    try:
        await poll(lambda: bool(sock.messages), "the first message", WAIT)
        assert sock.messages[0][1]["type"] == "snapshot"
        assert {"objects", "counts", "events", "stats"} <= sock.messages[0][1].keys()
        # the object's moves reach the map through x-ingress's sample (once a second)
        await poll(lambda: sum(position_in(m, oid) is not None for _, m in sock.messages) >= 3,
                   f"{oid} on the map three times", WAIT)
        seen = [p for _, m in sock.messages if (p := position_in(m, oid)) is not None]
        assert len(set(seen)) >= 2, seen  # it moved
        assert all(abs(lat - 47.02) < 1e-6 and 9.40 - 1e-6 <= lon < 9.41 for lon, lat in seen)
        async with httpx.AsyncClient(base_url=stack["api"], timeout=DEADLINE) as http:
            r = await http.get(f"/map/objects/{oid}")
            assert r.status_code == 200 and r.json()["object_id"] == oid and r.json()["lat"] == 47.02
            assert (await http.get(f"/map/objects/nobody-{oid}")).status_code == 404
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
        n0 = len(sock.messages)
        await asyncio.sleep(6.0)  # a measuring window, not a synchronisation
        window = [m for at, m in sock.messages[n0:] if at >= start]
        assert 1 <= len(window) <= 6.0 / FRAME_EVERY_S + 1, len(window)
        assert all(m["type"] in ("delta", "stats") for m in window)
        assert sock.error is None
    finally:
        stop.set()
        await sender
        await asyncio.to_thread(sock.close)


async def test_the_map_page_shows_the_demo_fleet(stack: ConnectionSettings) -> None:
    script = Path(sys.executable).with_name("geofence")
    demo = await asyncio.create_subprocess_exec(
        str(script), "demo", "--vehicles", "30", "--duration", "40", "--rate", "2", "--quiet",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        with chromium() as driver:
            await asyncio.to_thread(driver.get, f"{stack['api']}/map")
            cars = "return [...gfMap.objects.keys()].filter(k => k.includes('-car-'))"
            await poll(lambda: driver.execute_script("return gfMap.fences.size") >= 11, "the fences", WAIT)
            before_demo = set(driver.execute_script(cars))  # earlier runs' vehicles, not yet stale
            entered = "return [...document.querySelectorAll('#events li')].filter(li => " \
                      "li.querySelector('.enter') && li.textContent.includes('-car-')).length"
            enters_before = driver.execute_script(entered)
            await poll(lambda: bool(set(driver.execute_script(cars)) - before_demo), "this demo's vehicles",
                       WAIT)
            # the fences are drawn (the overlay canvas has ink), and each of the demo's
            # municipalities is among them
            canvases = driver.find_elements(By.CSS_SELECTOR, ".leaflet-overlay-pane canvas")
            assert canvases and driver.execute_script(INK, canvases[0]) > 10_000
            ids = driver.execute_script("return [...gfMap.fences.keys()]")
            assert {"li-vaduz", "li-schaan", "li-eschen"} <= set(ids)
            # a marker moves within a few seconds
            demo_objects = sorted(set(driver.execute_script(cars)) - before_demo)
            where = "return gfMap.objects.get(arguments[0]).getLatLng()"
            before = {o: driver.execute_script(where, o) for o in demo_objects[:10]}

            def moved() -> bool:
                return any(driver.execute_script(where, o) != ll for o, ll in before.items()
                           if driver.execute_script("return gfMap.objects.has(arguments[0])", o))

            await poll(moved, "a demo vehicle's marker moving", 10.0)
            # an ENTER in the panel
            await poll(lambda: driver.execute_script(entered) > enters_before, "an ENTER in the events panel",
                       WAIT)
            first = driver.find_element(By.CSS_SELECTOR, "#events li").text
            assert "ENTER" in first or "LEAVE" in first
            # the counts: some fence holds someone, and the tiles say so
            assert int(driver.find_element(By.ID, "s-inside").text.replace(",", "")) > 0
            assert "live" in driver.find_element(By.ID, "status").text
            # search: a fence by id zooms to it and says how many are inside
            box = driver.find_element(By.ID, "search-q")
            box.send_keys("li-vaduz")
            driver.find_element(By.CSS_SELECTOR, "#search button").click()
            await poll(lambda: "inside" in driver.find_element(By.ID, "search-result").text,
                       "the search result", DEADLINE)
            box.clear()
            driver.execute_script("gfMap.map.setView([47.15, 9.54], 12)")  # the country, for the shot
            frames = driver.execute_script("return gfMap.state.frames")
            await poll(lambda: driver.execute_script("return gfMap.state.frames") >= frames + 2,
                       "two more frames on the picture", DEADLINE)
            path = screenshot(driver, "map")
            assert path.stat().st_size > 20_000
            assert console_errors(driver) == []
        out, _ = await asyncio.wait_for(demo.communicate(), 120)
        assert demo.returncode == 0, out.decode()[-3000:]
        summary = next(line for line in out.decode().splitlines() if line.startswith("SUMMARY"))
        assert summary.startswith("SUMMARY OK"), summary
        assert "/map" in out.decode()  # the demo says where to look
    finally:
        if demo.returncode is None:
            demo.kill()
            await demo.wait()
