"""A real browser for the page tests: Debian's chromium and chromedriver (installed by
deploy/setup.sh) driven by selenium, headless, with the flags this machine needs (no GPU, no
background networking: the machine has no internet). Screenshots go to <repo>/test-output/."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

OUTPUT = Path(__file__).resolve().parents[2] / "test-output"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000")


@contextmanager
def chromium() -> Iterator[Any]:
    binary, driver_binary = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver_binary, "chromium / chromedriver missing: `bash deploy/setup.sh` installs them"
    with tempfile.TemporaryDirectory(prefix="gf-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = binary
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(driver_binary), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def console_errors(driver: Any) -> list[str]:
    """The browser console's errors since the last call."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def screenshot(driver: Any, name: str) -> Path:
    """The whole page (the window grown to its height) as <repo>/test-output/<name>.png."""
    OUTPUT.mkdir(exist_ok=True)
    path = OUTPUT / f"{name}.png"
    height = driver.execute_script("return document.documentElement.scrollHeight")
    width = driver.get_window_size()["width"]
    driver.set_window_size(width, min(4000, int(height) + 120))
    driver.save_screenshot(str(path))
    return path
