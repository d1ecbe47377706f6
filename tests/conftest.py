"""Shared fixtures. Tests under tests/integration get the `integration` marker and use the
real local stack through the `stack` fixture: a stack that is not up fails them (it never
skips them), since nothing is mocked where a real service can run."""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from deploy.processes import StackError
from deploy.settings import ConnectionSettings, SettingsError, load_connection_settings

INTEGRATION_DIR = Path(__file__).parent / "integration"
HOW_TO_START = "start it with `.venv/bin/geofence up` (or `bash deploy/setup.sh none`)"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)


def _unreachable(conn: ConnectionSettings) -> list[str]:
    endpoints = {
        "rabbitmq (amqp)": _host_port(conn["amqp"]["/"]),
        "rabbitmq (mqtt)": (conn["mqtt"]["host"], conn["mqtt"]["port"]),
        "postgres": _host_port(conn["postgres"]["dsn"]),
        "memcached": (conn["memcached"]["host"], conn["memcached"]["port"]),
    }
    down = []
    for name, (host, port) in endpoints.items():
        try:
            socket.create_connection((host, port), timeout=2).close()
        except OSError as exc:
            down.append(f"{name} at {host}:{port} ({exc})")
    return down


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None, url
    return parts.hostname, parts.port


@pytest.fixture(scope="session")
def stack() -> ConnectionSettings:
    """The local stack's connection settings; fails the test if the stack is not up."""
    try:
        conn = load_connection_settings()
    except (SettingsError, StackError) as exc:
        pytest.fail(f"the local stack is not set up: {exc}; {HOW_TO_START}", pytrace=False)
    down = _unreachable(conn)
    if down:
        pytest.fail(f"the local stack is not reachable: {'; '.join(down)}; {HOW_TO_START}",
                    pytrace=False)
    return conn
