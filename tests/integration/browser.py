"""A real browser for the page tests: Debian's chromium and chromedriver (installed by
deploy/setup.sh) driven by selenium, headless, with the flags this machine needs (no GPU, no
background networking: the machine has no internet). Screenshots go to <repo>/test-output/.
And the pages' users: Auth emulator accounts (an operator's with its claim), a tenant's
members (`geofence tenant member add`), the sign-in form filled in."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from deploy import firebase_emulator as fe
from deploy.settings import ConnectionSettings
from fence.service import OPERATOR_CLAIM, TENANT_HEADER
from tests.integration.clients import geofence

OUTPUT = Path(__file__).resolve().parents[2] / "test-output"
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000")


def trusting(home: Path, ca: Path) -> None:
    """A home whose NSS database (the one Chromium reads on Linux) trusts `ca` to identify
    servers: the browser trusts the stack's CA the way a user's machine would be told to."""
    certutil = shutil.which("certutil")
    assert certutil, "certutil missing (Debian's libnss3-tools): `bash deploy/setup.sh` installs it"
    db = home / ".pki" / "nssdb"
    db.mkdir(parents=True)
    subprocess.run([certutil, "-d", f"sql:{db}", "-N", "--empty-password"], check=True, capture_output=True)
    subprocess.run([certutil, "-d", f"sql:{db}", "-A", "-n", "geofence local CA", "-t", "C,,", "-i", str(ca)],
                   check=True, capture_output=True)


@contextmanager
def chromium(trust: Path | None = None) -> Iterator[Any]:
    """`trust`: a CA the browser trusts beside the system's (the stack's, for its HTTPS)."""
    binary, driver_binary = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver_binary, "chromium / chromedriver missing: `bash deploy/setup.sh` installs them"
    with tempfile.TemporaryDirectory(prefix="gf-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = binary
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        env = None
        if trust is not None:
            home = Path(profile) / "home"
            trusting(home, trust)
            env = {**os.environ, "HOME": str(home)}
        driver = webdriver.Chrome(service=Service(driver_binary, env=env), options=options)
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


# --------------------------------------------------------------------------- signing in


@dataclass(frozen=True)
class Account:
    """A user of the stack's Auth emulator (email and password; a fresh ID token)."""

    uid: str
    email: str
    password: str
    token: str

    def headers(self, tenant: str | None = None) -> dict[str, str]:
        out = {"Authorization": f"Bearer {self.token}"}
        if tenant is not None:
            out[TENANT_HEADER] = tenant
        return out


@contextmanager
def account(stack: ConnectionSettings, operator: bool = False) -> Iterator[Account]:
    """A new user (a platform operator: the claim, in a token taken after it was set), deleted
    afterwards."""
    host, port = stack["firebase"]["auth_emulator_host"].rsplit(":", 1)
    project = stack["firebase"]["project"]
    email, password = f"page-{uuid.uuid4().hex[:12]}@example.org", uuid.uuid4().hex
    uid, token = fe.sign_up(host, int(port), project, email, password)
    if operator:
        fe.set_claims(host, int(port), project, uid, {OPERATOR_CLAIM: True})
        token = fe.sign_in(host, int(port), project, email, password)
    try:
        yield Account(uid, email, password, token)
    finally:
        with suppress(fe.EmulatorError):
            fe.delete_user(host, int(port), project, uid)


@contextmanager
def member(tenant: str, uid: str, role: str = "viewer") -> Iterator[None]:
    """`uid` a member of `tenant` (`geofence tenant member add`), removed afterwards."""
    added = geofence("tenant", "member", "add", tenant, uid, "--role", role)
    assert added.returncode == 0, added.stderr
    try:
        yield
    finally:
        geofence("tenant", "member", "remove", tenant, uid)


def sign_in(driver: Any, who: Account, password: str | None = None) -> None:
    """Type the account's email and password (or `password`) into the page's sign-in form."""
    for field, value in (("email", who.email), ("password", password or who.password)):
        box = driver.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    driver.find_element(By.ID, "signin-button").click()
