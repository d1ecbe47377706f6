"""The API's pages in a real browser (tests/integration/browser.py: chromium + selenium).

/ops while positions flow: the figures come from Prometheus (the live stack's), the updates/s
tile shows the traffic, every process is listed up, both charts are drawn (uPlot canvases with
something on them), the console has no error. A screenshot is kept in test-output/ops.png."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

import aio_pika
import pytest
from selenium.webdriver.common.by import By

from deploy.settings import ConnectionSettings
from exchanges import topology as t
from tests.integration.browser import chromium, console_errors, screenshot
from tests.integration.clients import DEADLINE

pytestmark = pytest.mark.integration
WAIT = 60.0
NONE = "\u2013"  # what a tile shows before it has a figure (an en dash)
INK = """const c = arguments[0];
const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n;"""


async def traffic(stack: ConnectionSettings, stop: asyncio.Event) -> int:
    """Positions of a few objects (outside every fence) at ~50/s until `stop`."""
    sent = 0
    async with await aio_pika.connect(stack["amqp"][t.INGRESS_VHOST], timeout=DEADLINE) as conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange(t.MQTT_TOPIC_EXCHANGE)
        run = uuid.uuid4().hex[:6]
        while not stop.is_set():
            for k in range(5):
                body = json.dumps({"lon": 9.40 + 0.001 * k, "lat": 47.02, "ts": time.time()}).encode()
                await ex.publish(aio_pika.Message(body), f"positions.ops-{run}-{k}")
                sent += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)
    return sent


async def test_the_ops_page_shows_the_live_pipeline(stack: ConnectionSettings) -> None:
    stop = asyncio.Event()
    sender = asyncio.create_task(traffic(stack, stop))
    try:
        with chromium() as driver:
            await asyncio.to_thread(driver.get, f"{stack['api']}/ops")
            end = time.monotonic() + WAIT
            updates = NONE
            while time.monotonic() < end:
                updates = driver.find_element(By.ID, "updates").text
                if updates not in (NONE, "0.0", ""):
                    break
                await asyncio.sleep(0.5)
            assert updates not in (NONE, "0.0", ""), "the updates/s tile never showed the traffic"
            assert float(updates.replace(",", "")) > 0
            rows = driver.find_elements(By.CSS_SELECTOR, "#processes tbody tr")
            listed = {r.find_elements(By.TAG_NAME, "td")[0].text: r.find_elements(By.TAG_NAME, "td")[1].text
                      for r in rows}
            assert set(listed) == set(stack["metrics"]) and set(listed.values()) == {"up"}, listed
            for chart in ("chart-rates", "chart-latency"):
                canvases = driver.find_elements(By.CSS_SELECTOR, f"#{chart} canvas")
                assert canvases, f"{chart}: no canvas"
                drawn = driver.execute_script(INK, canvases[0])
                assert drawn > 100, f"{chart}: nothing drawn"
            queues = driver.find_elements(By.CSS_SELECTOR, "#queues tbody tr td")
            assert queues and queues[0].get_attribute("class") != "empty", "no queue depths"
            assert "up" in driver.find_element(By.ID, "status").text
            path = screenshot(driver, "ops")
            assert path.stat().st_size > 10_000
            assert console_errors(driver) == []
    finally:
        stop.set()
        assert await sender > 0
