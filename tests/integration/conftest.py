"""Fixtures of the integration tests: the topology, device users, MQTT devices."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from deploy.settings import ConnectionSettings, Settings
from exchanges.topology import Topology
from tests.integration.clients import Device, MqttDevice, api, geofence, q
from tests.integration.spark_support import (  # noqa: F401  (fixtures)
    occupancy_db,
    pg_schema,
    spark,
    spark_config,
)


@pytest.fixture(scope="session")
def topology() -> Topology:
    """The regions and workers the stack was set up with (GEOFENCE_REGIONS, _WORKERS)."""
    return Settings.from_env().topology


@pytest.fixture
def device(stack: ConnectionSettings) -> Iterator[Device]:
    """A fresh device user, removed afterwards."""
    made = Device(f"t-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex)
    done = geofence("device", "add", made.object_id, "--password-stdin", stdin=made.password + "\n")
    assert done.returncode == 0, done.stderr
    assert made.password not in done.stdout + done.stderr
    try:
        yield made
    finally:
        if api(stack, f"api/users/{q(made.object_id)}") is not None:
            removed = geofence("device", "remove", made.object_id)
            assert removed.returncode == 0, removed.stderr


@pytest.fixture
def mqtt_device(stack: ConnectionSettings, device: Device) -> Iterator[MqttDevice]:
    client = MqttDevice(stack, device)
    try:
        yield client
    finally:
        client.close()
