"""A small client of RabbitMQ's management HTTP API (urllib, basic auth)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from deploy.processes import ServiceUnreachable, StackError


class ManagementError(StackError):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ManagementUnreachable(ManagementError, ServiceUnreachable):
    """No answer from the management API (RabbitMQ down, or another port)."""


@dataclass(frozen=True)
class Management:
    url: str  # "http://host:port/"
    user: str
    password: str
    timeout: float = 10.0

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """`path` is relative to the management URL ("api/..."); returns the JSON answer,
        or None for an empty one. Raises ManagementError on an HTTP error or no answer."""
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Basic {token}"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise ManagementError(f"{method} {self.url}{path}: HTTP {exc.code} {detail}",
                                  exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ManagementUnreachable(f"{method} {self.url}{path}: {exc}") from None
        return json.loads(raw) if raw.strip() else None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def exists(self, path: str) -> bool:
        try:
            self.get(path)
        except ManagementError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def delete(self, path: str, missing_ok: bool = True) -> bool:
        """True if something was deleted."""
        try:
            self.request("DELETE", path)
        except ManagementError as exc:
            if missing_ok and exc.status == 404:
                return False
            raise
        return True
