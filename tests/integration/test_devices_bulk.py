"""`geofence device add --tenant T --file` / `remove --file` on the live broker: a tenant's
devices by the thousand, with exactly the rights `geofence device add` gives one, idempotent."""

from __future__ import annotations

import csv
import io
import json
import uuid
from pathlib import Path

from deploy.rabbitmq.definitions import regex_escape
from deploy.settings import ConnectionSettings
from exchanges import topology as t
from tests.integration.clients import Device, Login, MqttDevice, api, geofence, q

Rights = tuple[list[tuple[str, ...]], list[tuple[str, ...]], list[str]]


def rights(stack: ConnectionSettings, dev: Device) -> Rights:
    """(permissions, topic permissions, tags) of a device's user, with its user name (plain or
    as a regex) replaced by USER and its object id by ID."""
    user = dev.user

    def plain(v: str) -> str:
        return v.replace(user, "USER").replace(regex_escape(user), "USER").replace(dev.object_id, "ID")

    perms = [(p["vhost"], plain(p["configure"]), plain(p["write"]), plain(p["read"]))
             for p in api(stack, f"api/users/{q(user)}/permissions")]
    topics = [(p["vhost"], p["exchange"], plain(p["write"]), plain(p["read"]))
              for p in api(stack, f"api/users/{q(user)}/topic-permissions")]
    tags = api(stack, f"api/users/{q(user)}")["tags"]
    return sorted(perms), sorted(topics), sorted(tags if isinstance(tags, list) else tags.split(","))


def test_a_file_of_devices_gets_the_rights_of_device_add_and_a_second_run_changes_nothing(
        stack: ConnectionSettings, device: Device, tenant: str, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    ids = [f"bulk-{run}-{i}" for i in range(300)]
    ids_file = tmp_path / "ids.txt"
    ids_file.write_text("# the fleet\n" + "\n".join(ids) + "\n\n" + ids[0] + "\n")
    creds = tmp_path / "creds.csv"
    made = [Device(i, "", tenant) for i in ids]
    try:
        done = geofence("device", "add", "--tenant", tenant, "--file", str(ids_file), "--out", str(creds))
        assert done.returncode == 0, done.stderr
        assert "300 devices added, 0 were there already" in done.stderr
        assert oct(creds.stat().st_mode & 0o777) == "0o600"
        rows = list(csv.DictReader(io.StringIO(creds.read_text())))
        assert [r["object_id"] for r in rows] == ids and all(len(r["password"]) >= 24 for r in rows)
        assert not any(r["password"] in done.stdout + done.stderr for r in rows)
        assert [(r["tenant"], r["mqtt_login"], r["client_id"], r["topic"]) for r in rows[:2]] == [
            (tenant, f"{t.INGRESS_VHOST}:{d.user}", d.user, d.topic) for d in made[:2]]

        # the same rights as one `geofence device add` (the fixture's device, of the same tenant)
        assert rights(stack, made[7]) == rights(stack, device)
        # and they work: it logs in over MQTT with its password and publishes its positions
        dev = MqttDevice(stack, Device(ids[7], rows[7]["password"], tenant))
        try:
            body = json.dumps({"lon": 9.5, "lat": 47.1, "ts": 1.7e9})
            info = dev.client.publish(made[7].topic, body, qos=1)
            assert dev.expect("puback") == info.mid
        finally:
            dev.close()

        again = geofence("device", "add", "--tenant", tenant, "--file", str(ids_file))
        assert again.returncode == 0, again.stderr
        assert "0 devices added, 300 were there already" in again.stderr
        assert all(r["password"] == "" for r in csv.DictReader(io.StringIO(again.stdout)))
        still = MqttDevice(stack, Device(ids[7], rows[7]["password"], tenant))  # its password was kept
        still.close()
        listed = geofence("device", "list", "--tenant", tenant)
        assert {d.user for d in made} <= set(listed.stdout.split())
    finally:
        removed = geofence("device", "remove", "--tenant", tenant, "--file", str(ids_file))
        assert removed.returncode == 0, removed.stderr
    assert all(api(stack, f"api/users/{q(d.user)}") is None for d in made[:5] + made[-5:])


def test_a_bad_line_or_a_non_device_user_refuses_the_whole_file(stack: ConnectionSettings, tenant: str,
                                                                 gateway: Login, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    ok = Device(f"ok-{run}", "", tenant)
    bad = tmp_path / "bad.txt"
    bad.write_text(f"{ok.object_id}\nnot ok\n")
    done = geofence("device", "add", "--tenant", tenant, "--file", str(bad))
    assert done.returncode == 2 and "line 2" in done.stderr and "nothing done" in done.stderr
    assert api(stack, f"api/users/{q(ok.user)}") is None
    other = tmp_path / "other.txt"
    other.write_text(f"{ok.object_id}\nfederation\n")  # the name of a sidecar user of the topology
    done = geofence("device", "add", "--tenant", tenant, "--file", str(other))
    assert done.returncode == 2 and "federation" in done.stderr
    assert api(stack, f"api/users/{q(ok.user)}") is None
    # the tenant's gateway is a user `<tenant>.<name>` too: not a device, so the file is refused
    clash = tmp_path / "clash.txt"
    clash.write_text(f"{ok.object_id}\n{gateway.name}\n")
    done = geofence("device", "add", "--tenant", tenant, "--file", str(clash))
    assert done.returncode == 1 and "not devices" in done.stderr and gateway.user in done.stderr, done.stderr
    assert api(stack, f"api/users/{q(ok.user)}") is None
    assert t.GATEWAY_TAG in str(api(stack, f"api/users/{q(gateway.user)}")["tags"])  # untouched
