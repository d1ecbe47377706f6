"""The local stack's part in the topology, without services: GEOFENCE_REGIONS /
GEOFENCE_WORKERS, the sidecar users' passwords in the secrets file, the connection settings
`geofence status --json` prints for them."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from deploy.rabbitmq import definitions as d
from deploy.settings import (
    Secrets,
    Settings,
    SettingsError,
    connection_settings,
    ensure_secrets,
    load_secrets,
)
from deploy.stack import format_status, status
from exchanges import topology as t


def test_regions_and_workers_default_and_parse() -> None:
    assert Settings().topology == t.Topology()
    s = Settings.from_env({"GEOFENCE_REGIONS": "a, b,eu-1", "GEOFENCE_WORKERS": "w0"})
    assert s.topology.regions == ("a", "b", "eu-1") and s.topology.workers == ("w0",)
    assert "gf-region-eu-1" in s.topology.vhosts


@pytest.mark.parametrize(("key", "value"), [
    ("GEOFENCE_REGIONS", "a,,b"), ("GEOFENCE_REGIONS", "a.b"), ("GEOFENCE_WORKERS", "w0,w0"),
    ("GEOFENCE_WORKERS", ""),
])
def test_bad_regions_or_workers_are_rejected(key: str, value: str) -> None:
    with pytest.raises(SettingsError, match="GEOFENCE_"):
        Settings.from_env({key: value})


def test_secrets_gain_the_sidecar_users_once_and_keep_the_old_passwords(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    settings.secrets_file.write_text(json.dumps({"rabbitmq_password": "r", "postgres_password": "p"}))
    old = load_secrets(settings)
    assert old.users == {}
    pw = ensure_secrets(settings)
    assert (pw.rabbitmq_password, pw.postgres_password) == ("r", "p")
    assert set(pw.users) == set(d.SIDECAR_USERS)
    assert len(set(pw.users.values())) == len(d.SIDECAR_USERS)
    assert stat.S_IMODE(os.stat(settings.secrets_file).st_mode) == 0o600
    assert ensure_secrets(settings) == pw  # generated once
    assert set(pw.values()) >= set(pw.users.values())  # masked in human output
    assert not list(tmp_path.glob("*.tmp"))


def test_fresh_secrets_hold_every_password(tmp_path: Path) -> None:
    pw = ensure_secrets(Settings(state_dir=tmp_path))
    assert set(pw.users) == set(d.SIDECAR_USERS)


def test_connection_settings_list_every_vhost_and_sidecar_user() -> None:
    users = {u: f"pw-{u}" for u in d.SIDECAR_USERS}
    pw = Secrets("admin/pw", "pg", users)
    conn = connection_settings(Settings(), pw)
    assert conn["amqp"] == {
        "/": "amqp://geofence:admin%2Fpw@127.0.0.1:5672/%2F",
        "gf-ingress": "amqp://geofence:admin%2Fpw@127.0.0.1:5672/gf-ingress",
        "gf-region-a": "amqp://geofence:admin%2Fpw@127.0.0.1:5672/gf-region-a",
        "gf-region-b": "amqp://geofence:admin%2Fpw@127.0.0.1:5672/gf-region-b",
        "gf-fences": "amqp://geofence:admin%2Fpw@127.0.0.1:5672/gf-fences",
    }
    assert conn["users"]["x-ingress"] == {
        "gf-ingress": "amqp://x-ingress:pw-x-ingress@127.0.0.1:5672/gf-ingress",
        "gf-region-a": "amqp://x-ingress:pw-x-ingress@127.0.0.1:5672/gf-region-a",
        "gf-region-b": "amqp://x-ingress:pw-x-ingress@127.0.0.1:5672/gf-region-b",
        "gf-fences": "amqp://x-ingress:pw-x-ingress@127.0.0.1:5672/gf-fences",  # proximity rows
    }
    # the shared gateway user is retired: gateways are a tenant's users (`geofence gateway add`)
    assert "gateway" not in conn["users"]
    assert set(conn["users"]) == set(d.SIDECAR_USERS)
    assert conn["mqtt"]["ingress_vhost"] == "gf-ingress"
    other = connection_settings(Settings(regions=("z",)), pw)
    assert set(other["amqp"]) == {"/", "gf-ingress", "gf-region-z", "gf-fences"}
    assert set(other["users"]["x-geo"]) == {"gf-region-z"}


def test_an_older_secrets_file_keeps_the_retired_users_passwords_but_lists_no_url(tmp_path: Path) -> None:
    """A secrets file from before tenants holds the shared gateway user's password: kept (the
    file is never pruned), but no connection URL is given for a user the topology retired."""
    settings = Settings(state_dir=tmp_path)
    users = {u: f"pw-{u}" for u in (*d.SIDECAR_USERS, *d.RETIRED_USERS)}
    settings.secrets_file.write_text(json.dumps({"rabbitmq_password": "r", "postgres_password": "p",
                                                 "users": users}))
    pw = ensure_secrets(settings)
    assert pw.users == users  # nothing missing, nothing generated, nothing dropped
    conn = connection_settings(settings, pw)
    assert set(conn["users"]) == set(d.SIDECAR_USERS)
    assert not set(conn["users"]) & set(d.RETIRED_USERS)


def test_human_status_masks_the_sidecar_passwords(tmp_path: Path) -> None:
    pw = Secrets("r-Secret", "p-Secret", {u: f"{u}-Secret" for u in d.SIDECAR_USERS})
    settings = Settings(state_dir=tmp_path, amqp_port=1, mqtt_port=2, management_port=3,
                        pg_port=4, memcached_port=5)
    table = format_status(status(settings, pw))
    assert "Secret" not in table
