"""The pages when the npm libraries are missing (fence/web/node_modules absent: a checkout where
`npm ci` has not run): the API warns at start, naming the library and the fix, and each page
shows a message in place of its map or charts instead of hanging at "loading..." with a
script error. Then the same pages with the libraries, as the stack has them: no message.

The API's app (fence/api.py) with its pages (fence/pages.py) and their data routes
(fence/page_data.py), served by uvicorn on a free port in a thread, in Debian's chromium
(tests/integration/browser.py). No other service is needed: /map stops before its sign-in
when Leaflet is missing (nothing could be drawn), /ops and /venues/{id} show their sign-in form
(the charts' message is in the page behind it). Screenshots: test-output/map-no-vendor.png,
ops-no-vendor.png."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import uvicorn
from fastapi import FastAPI
from selenium.webdriver.common.by import By

from fence import pages
from fence.api import create_app
from fence.page_data import add_page_data
from tests.integration.browser import chromium, console_errors, screenshot

LOADING = "loading\u2026"
AUTH = {"project": "demo-geofence", "api_key": "local-emulator", "emulator": None}
WAIT = 15.0


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """`app` on http://127.0.0.1:<free port> while the block runs (a thread of its own: the
    browser's calls block)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        end = time.monotonic() + WAIT
        while not server.started:
            assert thread.is_alive() and time.monotonic() < end, "uvicorn did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(WAIT)
        sock.close()


class NoService:
    """The fence service's place: nothing here reaches it (no page is signed in)."""

    manager = SimpleNamespace(pool=None)


def app_with(caplog: pytest.LogCaptureFixture) -> tuple[FastAPI, list[str]]:
    """The API's app as api_server builds it, with its pages and their data routes (no fence
    service, verifier or map feed behind them: the pages do not reach them before a sign-in)."""
    with caplog.at_level(logging.INFO, logger="geofence"):
        app = create_app(cast(Any, NoService()), cast(Any, None))
        pages.add_pages(app, AUTH)
        add_page_data(app, None, None)
    return app, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def settled(driver: Any, element_id: str) -> str:
    """The element's text once it is no longer "loading..." (or after WAIT)."""
    end = time.monotonic() + WAIT
    text = driver.find_element(By.ID, element_id).text
    while text == LOADING and time.monotonic() < end:
        time.sleep(0.2)
        text = driver.find_element(By.ID, element_id).text
    return str(text)


def script_errors(driver: Any) -> list[str]:
    """The console's script errors: not the responses the browser reports about the missing
    files, what this test is about (their 404s, and, the API sending `nosniff`, its refusal to
    run or apply a 404's JSON as a script or a stylesheet)."""
    return [e for e in console_errors(driver) if "Failed to load resource" not in e
            and not ("/vendor/" in e and "strict MIME" in e)]


def test_without_the_npm_libraries_the_api_warns_and_the_pages_say_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "node_modules"
    empty.mkdir()
    monkeypatch.setattr(pages, "VENDOR", {name: empty / name / "dist" for name in pages.VENDOR})
    app, warnings = app_with(caplog)
    seen: dict[str, Any] = {}
    with serving(app) as url, chromium() as driver:
        driver.get(f"{url}/vendor/leaflet/leaflet.js")  # the missing file, as the page asks for it
        driver.get(f"{url}/map")
        seen["map status"] = settled(driver, "status")
        seen["map"] = driver.find_element(By.ID, "map").text
        seen["map errors"] = script_errors(driver)
        screenshot(driver, "map-no-vendor")
        driver.get(f"{url}/ops")
        seen["ops status"] = settled(driver, "status")
        seen["ops sign-in"] = driver.find_element(By.ID, "signin").is_displayed()
        seen["ops charts"] = [driver.execute_script(f"return document.getElementById('{c}').textContent")
                              for c in ("chart-rates", "chart-latency")]
        seen["ops errors"] = script_errors(driver)
        screenshot(driver, "ops-no-vendor")
        driver.get(f"{url}/venues/some-hive")
        settled(driver, "status")
        seen["venue charts"] = [driver.execute_script(f"return document.getElementById('{c}').textContent")
                                for c in ("chart-today", "chart-forecast")]
        seen["venue errors"] = script_errors(driver)
    # the page: a message in place of the map, the status no longer "loading...", no script error
    assert seen["map status"] != LOADING and "Leaflet" in seen["map status"], seen
    assert "Leaflet did not load" in seen["map"] and "npm ci" in seen["map"], seen
    assert "deploy/setup.sh" in seen["map"], seen
    assert seen["map errors"] == [], seen
    for text in (*seen["ops charts"], *seen["venue charts"]):
        assert "uPlot did not load" in text and "npm ci" in text, seen
    assert seen["ops errors"] == [] and seen["venue errors"] == [], seen
    assert seen["ops sign-in"] and "uPlot did not load" in seen["ops status"], seen
    # the log: one warning per missing library at start, with the page it breaks and the fix
    for lib, page in (("leaflet", "/map"), ("uplot", "/ops")):
        said = [w for w in warnings if f"/vendor/{lib}/" in w]
        assert len(said) == 1, warnings
        assert page in said[0] and "npm ci" in said[0] and "deploy/setup.sh" in said[0], said


def test_with_the_npm_libraries_the_pages_draw_and_nothing_is_said(caplog: pytest.LogCaptureFixture) -> None:
    if not all(d.is_dir() for d in pages.VENDOR.values()):
        pytest.fail("fence/web/node_modules is missing: `bash deploy/setup.sh` runs `npm ci` there",
                    pytrace=False)
    app, warnings = app_with(caplog)
    assert warnings == []
    with serving(app) as url, chromium() as driver:
        driver.get(f"{url}/map")
        assert settled(driver, "status") == "signed out"  # the map is made once signed in
        assert driver.find_element(By.ID, "signin").is_displayed()
        assert driver.execute_script("return typeof L.map") == "function"
        assert driver.find_elements(By.CSS_SELECTOR, ".nolib") == []
        assert script_errors(driver) == []
        driver.get(f"{url}/ops")
        assert settled(driver, "status") == "signed out"
        assert driver.find_elements(By.CSS_SELECTOR, ".nolib") == []
        assert driver.execute_script("return typeof uPlot") == "function"
