"""Fixtures of the integration tests: the topology, the test tenants (a session's own, made
with `geofence tenant add`), their Firebase members, their credentials (device, gateway and
application users), MQTT devices."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from deploy import firebase_emulator as fe
from deploy.settings import ConnectionSettings, Settings
from exchanges.topology import Topology
from tests.integration.clients import (
    Account,
    Device,
    Firebase,
    Login,
    MqttDevice,
    add_device,
    add_login,
    api,
    geofence,
    member,
    q,
    remove_login,
)
from tests.integration.spark_support import (  # noqa: F401  (fixtures)
    occupancy_db,
    pg_schema,
    spark,
    spark_config,
)
from tests.integration.wire_tap import WireTap


@pytest.fixture(scope="session")
def topology() -> Topology:
    """The regions and workers the stack was set up with (GEOFENCE_REGIONS, _WORKERS)."""
    return Settings.from_env().topology


# --------------------------------------------------------------------------- tenants


def make_tenant(prefix: str) -> str:
    """A new tenant with a unique id (`geofence tenant add`)."""
    tenant = f"{prefix}-{uuid.uuid4().hex[:12]}"
    done = geofence("tenant", "add", tenant, "--name", f"integration tests ({prefix})")
    assert done.returncode == 0, done.stdout + done.stderr
    return tenant


def drop_tenant(tenant: str) -> None:
    """Remove a test tenant if it holds nothing any more (the store refuses a tenant that keeps
    fences, even deleted ones, or subscriptions: their events stay readable; such a tenant
    is left in place)."""
    geofence("tenant", "remove", tenant)


@pytest.fixture(scope="session")
def tenant(stack: ConnectionSettings) -> Iterator[str]:
    """The session's tenant: the fences, objects and credentials of the tests are its own."""
    made = make_tenant("it")
    try:
        yield made
    finally:
        drop_tenant(made)


@pytest.fixture(scope="session")
def other_tenant(stack: ConnectionSettings) -> Iterator[str]:
    """A second tenant, to show what one tenant cannot see or do of another's."""
    made = make_tenant("it-other")
    try:
        yield made
    finally:
        drop_tenant(made)


# --------------------------------------------------------------------------- Firebase members


@pytest.fixture(scope="session")
def firebase(stack: ConnectionSettings) -> Firebase:
    """The stack's Auth emulator: (host, port, project)."""
    host, port = stack["firebase"]["auth_emulator_host"].rsplit(":", 1)
    if not fe.running(host, int(port)):
        pytest.fail("the Firebase Auth emulator is not running: `geofence up` starts it", pytrace=False)
    return host, int(port), stack["firebase"]["project"]


@pytest.fixture(scope="session")
def editor(firebase: Firebase, tenant: str) -> Account:
    """A Firebase user, editor of the session's tenant (its only tenant)."""
    return member(firebase, tenant, "editor")


@pytest.fixture(scope="session")
def viewer(firebase: Firebase, tenant: str) -> Account:
    """A Firebase user, viewer of the session's tenant."""
    return member(firebase, tenant, "viewer")


@pytest.fixture(scope="session")
def outsider(firebase: Firebase, other_tenant: str) -> Account:
    """A Firebase user, editor of the other tenant only."""
    return member(firebase, other_tenant, "editor")


# --------------------------------------------------------------------------- credentials


@pytest.fixture
def device(stack: ConnectionSettings, tenant: str) -> Iterator[Device]:
    """A fresh device user of the session's tenant, removed afterwards."""
    made = add_device(tenant)
    try:
        yield made
    finally:
        if api(stack, f"api/users/{q(made.user)}") is not None:
            removed = geofence("device", "remove", made.object_id, "--tenant", tenant)
            assert removed.returncode == 0, removed.stderr


@pytest.fixture
def mqtt_device(stack: ConnectionSettings, device: Device) -> Iterator[MqttDevice]:
    client = MqttDevice(stack, device)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def gateway(stack: ConnectionSettings, tenant: str) -> Iterator[Login]:
    """The session's tenant's gateway user (publishes to ingress.gateway under its tenant)."""
    made = add_login("gateway", tenant)
    try:
        yield made
    finally:
        remove_login(stack, "gateway", made)


@pytest.fixture(scope="session")
def other_gateway(stack: ConnectionSettings, other_tenant: str) -> Iterator[Login]:
    """The other tenant's gateway user."""
    made = add_login("gateway", other_tenant)
    try:
        yield made
    finally:
        remove_login(stack, "gateway", made)


@pytest.fixture(scope="session")
def app_user(stack: ConnectionSettings, tenant: str) -> Iterator[Login]:
    """The session's tenant's application user (gf-fences: the AMQP fence API, its own queues
    `app.<tenant>.<name>.*` on its tenant's events)."""
    made = add_login("app", tenant)
    try:
        yield made
    finally:
        remove_login(stack, "app", made)


# --------------------------------------------------------------------------- the wire contract

_TAPS: list[WireTap] = []


@pytest.fixture(scope="package", autouse=True)
def wire_tap(stack: ConnectionSettings) -> Iterator[WireTap]:
    """Every message the platform publishes while the integration tests run, validated against
    the published schemas (tests/integration/wire_tap.py); one that is not valid fails the
    package's last test (at its teardown, with the messages). The fault suite, later, is not
    tapped: its load is measured."""
    tap = WireTap(stack)
    tap.start()
    _TAPS.append(tap)
    yield tap
    tap.stop()
    assert tap.invalid_count == 0, f"{tap.summary()}:\n" + "\n".join(tap.invalid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for tap in _TAPS:
        terminalreporter.write_line(tap.summary())
