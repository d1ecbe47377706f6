"""The API's pages in a real browser (tests/integration/browser.py: chromium + selenium).

/ops while positions flow: the sign-in form and nothing else first; a user who is not a
platform operator is refused with the server's reason, in the form; an operator (the Firebase
claim) signs in and sees the figures from Prometheus (the live stack's): the updates/s tile
shows the traffic, every process is listed up, both charts are drawn (uPlot canvases with
something on them), the console has no error but the refusal's. /venues/{id}: an owner (a user of the Auth
emulator) is refused with a wrong password, signs in, and sees the live figures of both
sources, today's chart, the forecast against what happened, the popular-times heatmap, the
sensor and the days, all from real rows. Screenshots in test-output/ (ops.png, venue.png)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import time
import uuid
from typing import Any
from zoneinfo import ZoneInfo

import aio_pika
import asyncpg
import httpx
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By

from deploy import firebase_emulator as fe
from deploy.settings import ConnectionSettings
from exchanges import topology as t
from fence.venues.day_curve import day_bounds
from fence.venues.occupancy import business_day
from tests.integration.browser import account, chromium, console_errors, screenshot, sign_in
from tests.integration.clients import DEADLINE, poll

pytestmark = pytest.mark.integration
WAIT = 60.0
NONE = "\u2013"  # what a tile shows before it has a figure (an en dash)
INK = """const c = arguments[0];
const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n;"""


async def traffic(stack: ConnectionSettings, stop: asyncio.Event) -> int:
    """Positions of a few objects of a tenant of their own (outside every fence) at ~50/s until
    `stop` (x-ingress takes any tenant id a credential may publish for: the administrator's
    any)."""
    sent = 0
    async with await aio_pika.connect(stack["amqp"][t.INGRESS_VHOST], timeout=DEADLINE) as conn:
        ch = await conn.channel(publisher_confirms=True)
        ex = await ch.get_exchange(t.MQTT_TOPIC_EXCHANGE)
        run = uuid.uuid4().hex[:6]
        while not stop.is_set():
            for k in range(5):
                body = json.dumps({"lon": 9.40 + 0.001 * k, "lat": 47.02, "ts": time.time()}).encode()
                await ex.publish(aio_pika.Message(body), f"positions.ops-{run}.ops-{k}")
                sent += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)
    return sent


async def test_the_ops_page_shows_the_live_pipeline(stack: ConnectionSettings) -> None:
    stop = asyncio.Event()
    sender = asyncio.create_task(traffic(stack, stop))
    try:
        with chromium() as driver, account(stack) as user, account(stack, operator=True) as operator:
            await asyncio.to_thread(driver.get, f"{stack['api']}/ops")
            await poll(lambda: driver.find_element(By.ID, "signin").is_displayed(), "the sign-in form")
            assert not driver.find_element(By.ID, "content").is_displayed()
            assert console_errors(driver) == []  # nothing asked for before the sign-in
            sign_in(driver, user)  # not an operator: the server's 403, said in the form
            await poll(lambda: "operators" in driver.find_element(By.ID, "signin-error").text,
                       "the refusal of a user who is not an operator")
            assert not driver.find_element(By.ID, "content").is_displayed()
            refused = console_errors(driver)
            assert len(refused) == 1 and "/ops/data" in refused[0] and "403" in refused[0], refused
            sign_in(driver, operator)
            seen: dict[str, object] = {}

            def shown() -> bool:
                """The traffic in the tile, every process listed up (a process restarted by
                `geofence up` just before is down until its next scrape: the page follows)."""
                try:
                    rows = driver.find_elements(By.CSS_SELECTOR, "#processes tbody tr")
                    seen["updates"] = driver.find_element(By.ID, "updates").text
                    seen["listed"] = {r.find_elements(By.TAG_NAME, "td")[0].text:
                                      r.find_elements(By.TAG_NAME, "td")[1].text for r in rows}
                except StaleElementReferenceException:  # the table redrawn while it was read
                    return False
                return (seen["updates"] not in (NONE, "0.0", "0", "")
                        and seen["listed"] == dict.fromkeys([*stack["metrics"], "broker-guard"], "up"))

            end = time.monotonic() + WAIT
            while not shown() and time.monotonic() < end:
                await asyncio.sleep(0.5)
            assert shown(), seen
            assert float(str(seen["updates"]).replace(",", "")) > 0
            for chart in ("chart-rates", "chart-latency"):
                canvases = driver.find_elements(By.CSS_SELECTOR, f"#{chart} canvas")
                assert canvases, f"{chart}: no canvas"
                drawn = driver.execute_script(INK, canvases[0])
                assert drawn > 100, f"{chart}: nothing drawn"
            queues = driver.find_elements(By.CSS_SELECTOR, "#queues tbody tr td")
            assert queues and queues[0].get_attribute("class") != "empty", "no queue depths"
            assert "up" in driver.find_element(By.ID, "status").text
            hooks = driver.find_elements(By.CSS_SELECTOR, "#webhooks tbody tr td")  # a row per endpoint
            assert hooks and (hooks[0].text.startswith("wh-") or hooks[0].text == "no webhook endpoint"), \
                [h.text for h in hooks]
            path = screenshot(driver, "ops")
            assert path.stat().st_size > 10_000
            assert console_errors(driver) == []
    finally:
        stop.set()
        assert await sender > 0


# zones ~3 hours apart round the clock: one of them always has its afternoon now
ZONES = ("Pacific/Honolulu", "America/Los_Angeles", "America/New_York", "America/Sao_Paulo",
         "Europe/London", "Europe/Vaduz", "Asia/Dubai", "Asia/Kolkata", "Asia/Shanghai", "Asia/Tokyo",
         "Pacific/Auckland")


def afternoon_zone(now: float) -> str:
    """A zone whose local time is 14:00-21:59 at `now`: its business day (from 04:00) has hours
    of reports to draw, whatever hour the suite runs at (in Vaduz at 04:05 the day has just
    begun and today's chart is rightly empty: CI ran the test then)."""
    for tz in ZONES:
        if 14 <= dt.datetime.fromtimestamp(now, ZoneInfo(tz)).hour <= 21:
            return tz
    raise AssertionError(f"no zone of {ZONES} has its afternoon at {now}")


async def seed_venue(pg: Any, hive_id: str, tz: str, now: float) -> None:
    """What the sensor sidecar and a fortnight of nightly runs leave for a bar: today's
    reports and live status, 14 computed days (an evening-shaped curve, both sources), the
    profile and the forecasts, a sensor with a low battery."""
    today = business_day(now, tz, 4)
    sensor = f"{hive_id}-s"
    await pg.execute("INSERT INTO sensor (id, hive_id, last_report_at) VALUES ($1, $2, "
                     "to_timestamp($3))", sensor, hive_id, now - 60)
    await pg.execute("INSERT INTO sensor_status (sensor_id, received_at, startup_time, battery_mv, "
                     "sensor_state, discarded_events, gprs_signal, firmware_version, configuration_id) "
                     "VALUES ($1, now(), 0, 3300, 1, 0, 17, 65537, 0)", sensor)
    start, _ = day_bounds(today, tz, 4)
    reports = [(sensor, start + k * 900.0, *((3 + k % 3, 2 + k % 3) if k < 40 else (2, 3)))
               for k in range(int((now - start) // 900))]  # an afternoon filling up, then emptying
    await pg.executemany(
        "INSERT INTO sensor_report (sensor_id, device_at, received_at, at, version, report_type, counter, "
        "total_in, total_out, entries, exits, rule, gap, lost_reports, unknowable, skewed, raw) VALUES ($1, "
        "to_timestamp($2), to_timestamp($2), to_timestamp($2), 1, 32, -1, $3, $4, $3, $4, 'increase', 0, 0, "
        "false, false, '')", reports)
    entries, exits = sum(r[2] for r in reports), sum(r[3] for r in reports)
    await pg.execute("INSERT INTO hive_status (hive_id, day, entries, exits, occupancy, raw, "
                     "app_occupancy) VALUES ($1, $2, $3, $4, $5, $5, 4)", hive_id, today, entries, exits,
                     max(0, entries - exits))
    shape = [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 5, 8, 9, 6, 5, 6, 9, 14, 20, 24, 22, 15, 6]
    for back in range(1, 15):
        day = today - dt.timedelta(days=back)
        lift = 1.5 if day.isoweekday() in (5, 6) else 1.0
        await pg.execute("INSERT INTO venue_day (hive_id, day, reports, entries, exits, residual, "
                         "correction, factor, complete, run_id) VALUES ($1, $2, 96, 140, 131, 9, 'exits', "
                         "1.0687, true, 't')", hive_id, day)
        await pg.executemany(
            "INSERT INTO venue_hourly (hive_id, day, hour, entries, exits, mean_occupancy, peak_occupancy, "
            "phones_mean, phones_peak) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            [(hive_id, day, h, round(v * lift / 2), round(v * lift / 2.2), v * lift, v * lift + 3, v / 5,
              round(v / 4)) for h, v in enumerate(shape)])
        await pg.executemany(
            "INSERT INTO venue_forecast (hive_id, day, hour, occupancy, phones, seasonal, trend, basis, "
            "samples) VALUES ($1, $2, $3, $4, $5, $4, 1.0, 'weekday', 2)",
            [(hive_id, day + dt.timedelta(days=1), h, v * 1.1, v / 5) for h, v in enumerate(shape)])
    await pg.executemany(
        "INSERT INTO venue_profile (hive_id, weekday, hour, occupancy, phones, samples, as_of) "
        "VALUES ($1, $2, $3, $4, $5, 2, $6)",
        [(hive_id, w, h, v * (1.5 if w in (5, 6) else 1.0), v / 5, today - dt.timedelta(days=1))
         for w in range(1, 8) for h, v in enumerate(shape)])


async def test_the_venue_page_shows_an_owner_their_hive(stack: ConnectionSettings) -> None:
    host, port = stack["firebase"]["auth_emulator_host"].rsplit(":", 1)
    email, password = f"{uuid.uuid4().hex[:10]}@example.org", uuid.uuid4().hex
    _, token = fe.sign_up(host, int(port), stack["firebase"]["project"], email, password)
    hive_id, tz = f"pg-{uuid.uuid4().hex[:8]}", afternoon_zone(time.time())
    async with httpx.AsyncClient(base_url=str(stack["api"]), timeout=DEADLINE) as http:
        made = await http.post("/owner/hives", headers={"Authorization": f"Bearer {token}"}, json={
            "id": hive_id, "name": "The Page Bar", "type": "bar", "lon": 9.52, "lat": 47.14, "tz": tz,
            "capacity": 60})
        assert made.status_code == 201, made.text
    pg = await asyncpg.connect(stack["postgres"]["dsn"])
    try:
        await seed_venue(pg, hive_id, tz, time.time())
        with chromium() as driver:
            await asyncio.to_thread(driver.get, f"{stack['api']}/venues/{hive_id}")
            await poll(lambda: driver.find_element(By.ID, "signin").is_displayed(), "the sign-in form")
            driver.find_element(By.ID, "email").send_keys(email)
            driver.find_element(By.ID, "password").send_keys("wrong-" + password)
            driver.find_element(By.ID, "signin-button").click()
            await poll(lambda: "sign-in failed" in driver.find_element(By.ID, "signin-error").text,
                       "a wrong password refused")
            refused = console_errors(driver)  # the browser logs the refusal (400): that one only
            assert len(refused) == 1 and "accounts:signInWithPassword" in refused[0], refused
            driver.find_element(By.ID, "password").clear()
            driver.find_element(By.ID, "password").send_keys(password)
            driver.find_element(By.ID, "signin-button").click()
            await poll(lambda: driver.find_element(By.ID, "content").is_displayed()
                       and "updated" in driver.find_element(By.ID, "status").text, "the owner's figures")
            assert driver.find_element(By.ID, "title").text == "The Page Bar · bar"
            assert not driver.find_element(By.ID, "signin").is_displayed()
            live = await pg.fetchrow("SELECT occupancy, entries, exits FROM hive_status WHERE hive_id = $1",
                                     hive_id)
            assert driver.find_element(By.ID, "occupancy").text == f"{live['occupancy']} / 60"
            assert driver.find_element(By.ID, "phones").text == "4"
            assert driver.find_element(By.ID, "today-counts").text == f"{live['entries']} / {live['exits']}"
            assert "usual at this hour: " in driver.find_element(By.ID, "usual-k").text
            for chart in ("chart-today", "chart-forecast"):
                canvas = driver.find_element(By.CSS_SELECTOR, f"#{chart} canvas")
                assert driver.execute_script(INK, canvas) > 100, f"{chart}: nothing drawn"
            cells = driver.find_elements(By.CSS_SELECTOR, "#heatmap tbody td")
            assert len(cells) == 7 * 24
            shades = {c.value_of_css_property("background-color") for c in cells}
            assert len(shades) > 10  # the busy evenings darker than the mornings
            sensor_row = [td.text for td in driver.find_elements(By.CSS_SELECTOR, "#sensors tbody td")]
            assert (sensor_row[0], sensor_row[2], sensor_row[3]) == (f"{hive_id}-s", "reporting", "3300 mV")
            days = driver.find_elements(By.CSS_SELECTOR, "#days tbody tr")
            assert len(days) == 14 and "exits x1.069" in days[0].text
            path = screenshot(driver, "venue")
            assert path.stat().st_size > 10_000
            assert console_errors(driver) == [], console_errors(driver)
    finally:
        for table in ("venue_hourly", "venue_day", "venue_profile", "venue_forecast", "hive_status"):
            await pg.execute(f"DELETE FROM {table} WHERE hive_id = $1", hive_id)
        await pg.execute("DELETE FROM sensor_report WHERE sensor_id = $1", f"{hive_id}-s")
        await pg.execute("DELETE FROM sensor_status WHERE sensor_id = $1", f"{hive_id}-s")
        await pg.execute("DELETE FROM sensor WHERE hive_id = $1", hive_id)
        await pg.execute("DELETE FROM hive WHERE id = $1", hive_id)
        await pg.close()
