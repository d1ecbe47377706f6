"""The local stack without services: settings, masking, connection settings (deploy.settings), the
state file (deploy.processes), plugin and PostgreSQL set-up text (deploy.services), the status table
(deploy.stack)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from deploy.broker_host import PLUGINS
from deploy.processes import (
    ProcessId,
    ServiceRecord,
    StackError,
    is_ours,
    load_state,
    parse_proc_stat,
    process_identity,
    record_for_running,
    save_state,
)
from deploy.services import missing_plugins, pg_conf_text, pg_setup_sql, rabbitmq_env
from deploy.settings import (
    Secrets,
    Settings,
    SettingsError,
    StackNotSetUpError,
    amqp_url,
    connection_settings,
    ensure_secrets,
    load_connection_settings,
    load_secrets,
)
from deploy.stack import format_status, status
from exchanges.settings import mask

PW = Secrets(rabbitmq_password="rabbit-Secret_1", postgres_password="pg-Secret_2")

# ---------------------------------------------------------------- settings


def test_defaults_without_environment() -> None:
    s = Settings.from_env({"PATH": "/usr/bin", "HOME": "/root"})
    assert s == Settings()
    assert s.state_dir == Path("/var/lib/geofence")
    assert (s.amqp_port, s.mqtt_port, s.management_port) == (5672, 1883, 15672)
    assert (s.pg_port, s.memcached_port, s.host) == (55432, 11211, "127.0.0.1")


def test_known_keys_are_parsed() -> None:
    s = Settings.from_env({"GEOFENCE_STATE_DIR": "/srv/gf", "GEOFENCE_PG_PORT": "6543",
                           "GEOFENCE_START_TIMEOUT": "7.5", "GEOFENCE_HOST": "127.0.0.2"})
    assert s.state_dir == Path("/srv/gf")
    assert s.pg_port == 6543
    assert s.start_timeout == 7.5
    assert s.host == "127.0.0.2"
    assert s.pg_data == Path("/srv/gf/pg/data")
    assert s.state_file == Path("/srv/gf/state.json")


def test_unknown_key_is_rejected_with_a_suggestion() -> None:
    suggestion = r"GEOFENCE_PG_PROT \(did you mean GEOFENCE_PG_PORT\?\)"
    with pytest.raises(SettingsError, match=suggestion):
        Settings.from_env({"GEOFENCE_PG_PROT": "6543"})


def test_unknown_key_message_lists_the_known_keys() -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"GEOFENCE_WHATEVER": "1"})
    message = str(info.value)
    assert "GEOFENCE_WHATEVER" in message
    assert "GEOFENCE_STATE_DIR" in message and "GEOFENCE_AMQP_PORT" in message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("GEOFENCE_AMQP_PORT", "amqp"),
        ("GEOFENCE_AMQP_PORT", "0"),
        ("GEOFENCE_MQTT_PORT", "70000"),
        ("GEOFENCE_STATE_DIR", "relative/dir"),
        ("GEOFENCE_HOST", "localhost"),
        ("GEOFENCE_START_TIMEOUT", "-1"),
    ],
)
def test_bad_values_are_rejected_naming_the_key(key: str, value: str) -> None:
    with pytest.raises(SettingsError, match=key):
        Settings.from_env({key: value})


def test_two_services_on_one_port_are_rejected() -> None:
    with pytest.raises(SettingsError, match="one port"):
        Settings.from_env({"GEOFENCE_PG_PORT": "5672"})
    with pytest.raises(SettingsError, match="one port"):  # a sidecar's /metrics among them
        Settings.from_env({"GEOFENCE_PROMETHEUS_PORT": "9473"})


def test_settings_are_frozen() -> None:
    s = Settings()
    with pytest.raises(AttributeError):
        s.pg_port = 1  # type: ignore[misc]


# ---------------------------------------------------------------- connection settings and masking


def test_connection_settings_shape() -> None:
    conn = connection_settings(Settings(), PW)
    assert conn == {
        "amqp": {v: f"amqp://geofence:rabbit-Secret_1@127.0.0.1:5672/{v.replace('/', '%2F')}"
                 for v in ("/", "gf-ingress", "gf-region-a", "gf-region-b", "gf-fences")},
        "users": {},  # sidecar users: see test_topology_stack.py
        "amqp_nodes": [["127.0.0.1", 5672]],
        "mqtt": {"host": "127.0.0.1", "port": 1883, "username": "/:geofence",
                 "password": "rabbit-Secret_1", "ingress_vhost": "gf-ingress",
                 "nodes": [["127.0.0.1", 1883]]},
        "postgres": {"dsn": "postgresql://geofence:pg-Secret_2@127.0.0.1:55432/geofence"
                            "?sslmode=verify-full&sslrootcert=/var/lib/geofence/tls/ca.pem"},
        "memcached": {"host": "127.0.0.1", "port": 11211},
        "management": {"url": "http://127.0.0.1:15672/"},
        "api": "http://127.0.0.1:8080",
        "metrics": {name: f"http://127.0.0.1:{port}/metrics" for name, port in (
            # the single roles, a block of 16 for the workers, then the regions (a worker or a
            # region added live is appended: no running sidecar's port moves)
            ("x-ingress", 9470), ("fence-archiver", 9471), ("api", 9472), ("venue-sensors", 9473),
            ("fence-webhooks", 9474), ("x-fence-w0", 9475), ("x-fence-w1", 9476), ("x-geo-a", 9491),
            ("x-geo-b", 9492))},
        "rabbitmq_metrics": "http://127.0.0.1:15692/metrics",
        "prometheus": "http://127.0.0.1:9090",
        "firebase": {"project": "demo-geofence", "auth_emulator_host": "127.0.0.1:9099"},
        "state_dir": "/var/lib/geofence",
    }
    assert json.loads(json.dumps(conn)) == conn


def test_passwords_are_url_quoted() -> None:
    url = amqp_url(Settings(), "a/b@c:d")
    assert url == "amqp://geofence:a%2Fb%40c%3Ad@127.0.0.1:5672/%2F"


def test_mask_hides_plain_and_quoted_secrets() -> None:
    text = "pw=a/b@c and url=amqp://u:a%2Fb%40c@h/ and other"
    assert mask(text, ["a/b@c"]) == "pw=**** and url=amqp://u:****@h/ and other"
    assert mask("nothing here", ["", "zzz"]) == "nothing here"


def test_human_status_masks_every_password(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, host="127.0.0.1", amqp_port=1, mqtt_port=2,
                        management_port=3, pg_port=4, memcached_port=5)
    table = format_status(status(settings, PW))
    assert "rabbit-Secret_1" not in table and "pg-Secret_2" not in table
    assert "amqp://geofence:****@127.0.0.1:1/%2F" in table
    assert "postgresql://geofence:****@127.0.0.1:4/geofence" in table
    assert not status(settings, PW).all_running  # nothing listens on ports 1-5


def test_load_connection_settings_reads_the_state_dir(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    with pytest.raises(StackNotSetUpError, match="geofence up"):
        load_connection_settings(settings)
    pw = ensure_secrets(settings)
    assert stat.S_IMODE(os.stat(settings.secrets_file).st_mode) == 0o600
    assert ensure_secrets(settings) == pw  # generated once
    assert load_connection_settings(settings) == connection_settings(settings, pw)


def test_damaged_secrets_file_is_reported(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    settings.secrets_file.write_text("{not json")
    with pytest.raises(StackError, match="not JSON"):
        load_secrets(settings)


# ---------------------------------------------------------------- state file logic

A = ProcessId(pid=100, start_ticks=5000)


def lookup_alive(pid: int) -> ProcessId | None:
    return A if pid == A.pid else None


def lookup_reused(pid: int) -> ProcessId | None:
    return ProcessId(pid, 9999)  # same pid, a later process


def lookup_gone(pid: int) -> ProcessId | None:
    return None


def test_state_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    assert load_state(path) == {}
    state = {"rabbitmq": ServiceRecord(True, A), "memcached": ServiceRecord(False)}
    save_state(path, state)
    assert load_state(path) == state
    assert json.loads(path.read_text())["services"]["memcached"] == {
        "started_by_us": False, "pid": None, "start_ticks": None}


def test_damaged_state_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"services": 3}')
    with pytest.raises(StackError, match="damaged"):
        load_state(path)


def test_ours_only_while_that_very_process_runs() -> None:
    ours = ServiceRecord(True, A)
    assert is_ours(ours, lookup_alive)
    assert not is_ours(ours, lookup_gone)
    assert not is_ours(ours, lookup_reused)  # pid reused: never stop a stranger
    assert not is_ours(ServiceRecord(False), lookup_alive)
    assert not is_ours(None, lookup_alive)


def test_running_service_keeps_our_record_or_is_foreign() -> None:
    ours = ServiceRecord(True, A)
    assert record_for_running(ours, lookup_alive) == ours  # second `up`: as before
    assert record_for_running(ours, lookup_reused) == ServiceRecord(False)
    assert record_for_running(None, lookup_alive) == ServiceRecord(False)


def test_parse_proc_stat_handles_odd_command_names() -> None:
    rest = " ".join(str(n) for n in range(4, 53))  # field n holds n; start time is field 22
    assert parse_proc_stat(f"42 (we ird) (name)) S {rest}") == ("S", 22)
    own = process_identity(os.getpid())
    assert own is not None and own.pid == os.getpid()
    assert process_identity(2**22 + 1) is None


def test_missing_plugins_reads_the_erlang_list() -> None:
    assert missing_plugins(
        "[rabbitmq_federation,rabbitmq_management,rabbitmq_mqtt,rabbitmq_shovel,\n"
        " rabbitmq_prometheus,rabbitmq_auth_backend_http,rabbitmq_consistent_hash_exchange].\n") == []
    assert missing_plugins("[rabbitmq_management].") == [
        "rabbitmq_mqtt", "rabbitmq_federation", "rabbitmq_shovel", "rabbitmq_prometheus",
        "rabbitmq_auth_backend_http", "rabbitmq_consistent_hash_exchange"]
    assert missing_plugins("") == list(PLUGINS)


def test_pg_setup_sql_quotes_the_password() -> None:
    sql = pg_setup_sql("it's")
    assert "PASSWORD 'it''s'" in sql
    assert "\\gexec" in sql


def test_pg_conf_follows_the_settings(tmp_path: Path) -> None:
    conf = pg_conf_text(Settings(state_dir=tmp_path, pg_port=6000))
    assert "port = 6000" in conf
    assert f"unix_socket_directories = '{tmp_path}/pg/run'" in conf
    assert "listen_addresses = '127.0.0.1'" in conf


def test_rabbitmq_listeners_follow_the_settings() -> None:
    env = rabbitmq_env(Settings(amqp_port=5673, mqtt_port=1884, management_port=15673))
    assert env["RABBITMQ_NODE_PORT"] == "5673"
    assert '{"127.0.0.1",1884}' in env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
    assert "{port,15673}" in env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
