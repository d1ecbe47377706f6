"""The first broker as a cluster of three nodes (issue 38), without services: the setting and
where it is recorded, the nodes' ports and environment, which node each process connects to
and in which order it fails over, and the failover of a connection itself."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from deploy import broker_cluster, sidecars
from deploy.settings import (
    Secrets,
    Settings,
    SettingsError,
    connection_settings,
    read_live_topology,
    write_live_topology,
)
from exchanges import shell
from exchanges.settings import ConfigError
from exchanges.shell import connections
from exchanges.shell.config import parse_nodes

PW = Secrets(rabbitmq_password="rabbit-Secret_1", postgres_password="pg-Secret_2",
             users={u: f"pw-{u}" for u in ("x-ingress", "x-geo", "x-fence", "fence-archiver", "api",
                                           "venue-sensors")})


def test_the_setting_takes_one_or_three_nodes() -> None:
    assert Settings().broker_nodes == 1
    assert Settings.from_env({"GEOFENCE_BROKER_NODES": "3"}).broker_nodes == 3
    for bad in ("2", "0", "three"):
        with pytest.raises(SettingsError, match="GEOFENCE_BROKER_NODES"):
            Settings.from_env({"GEOFENCE_BROKER_NODES": bad})


def test_the_node_count_is_recorded_with_the_topology(tmp_path: Path) -> None:
    s = replace(Settings(state_dir=tmp_path), broker_nodes=3)
    write_live_topology(s, s.regions, s.workers)
    assert read_live_topology(tmp_path) == {"regions": s.regions, "workers": s.workers, "broker_nodes": 3,
                                            "ingress": ()}
    assert Settings.from_env({"GEOFENCE_STATE_DIR": str(tmp_path)}).broker_nodes == 3
    # the environment wins over the record
    env = {"GEOFENCE_STATE_DIR": str(tmp_path), "GEOFENCE_BROKER_NODES": "1"}
    assert Settings.from_env(env).broker_nodes == 1
    write_live_topology(replace(s, broker_nodes=1), s.regions, s.workers)
    assert "broker_nodes" not in (read_live_topology(tmp_path) or {})


def test_each_node_has_its_own_ports() -> None:
    s = replace(Settings(), broker_nodes=3)
    ports = s.ports()
    assert ports["amqp (node 2)"] == 5772 and ports["amqp (node 3)"] == 5872
    assert ports["mqtt (node 2)"] == 1983 and ports["management (node 3)"] == 15872
    s.check_ports_distinct()
    assert "amqp (node 2)" not in Settings().ports()
    conn = connection_settings(s, PW)
    assert conn["amqp_nodes"] == [["127.0.0.1", 5672], ["127.0.0.1", 5772], ["127.0.0.1", 5872]]
    assert conn["mqtt"]["nodes"] == [["127.0.0.1", 1883], ["127.0.0.1", 1983], ["127.0.0.1", 2083]]


def test_a_node_runs_with_its_ports_dirs_and_the_login_guard() -> None:
    s = replace(Settings(), broker_nodes=3)
    env = broker_cluster.node_environment(s, 3)
    assert env["RABBITMQ_NODENAME"].startswith("geofence-n3@")
    assert env["RABBITMQ_NODE_PORT"] == "5872" and env["RABBITMQ_DIST_PORT"] == "25675"
    assert env["RABBITMQ_MNESIA_BASE"] == "/var/lib/geofence/rabbitmq-n3/mnesia"
    erl = env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
    assert '{"127.0.0.1",2083}' in erl and "rabbit_auth_backend_http" in erl
    assert "allow_anonymous false" in erl  # the host defaults, as on node 1
    assert broker_cluster.wanted(3)(s)


def test_a_node_left_with_its_data_is_started_to_be_retired(tmp_path: Path) -> None:
    """A cluster stopped whole (a reboot) while it had three nodes: node 1 waits for its
    peers' tables, so `up --broker-nodes 1` starts them too, then retires them."""
    one = replace(Settings(), state_dir=tmp_path)
    assert not broker_cluster.wanted(2)(one)
    broker_cluster.node_dir(one, 2).mkdir(parents=True)
    assert broker_cluster.wanted(2)(one) and not broker_cluster.wanted(3)(one)


def test_processes_are_spread_over_the_nodes_and_fail_over_in_turn() -> None:
    s = replace(Settings(), broker_nodes=3)
    places = {sc.name: sidecars.cluster_place(s, sc) for sc in sidecars.sidecars(s.topology)}
    firsts = {name: node for name, (node, _) in places.items()}
    assert set(firsts.values()) == {1, 2, 3}
    assert firsts["api"] == 1  # its fence manager has one URL
    for name, (node, others) in places.items():
        ports = [p for _, p in others]
        assert len(ports) == 2 and s.node_port(s.amqp_port, node) not in ports, (name, others)
    sc = next(sc for sc in sidecars.sidecars(s.topology) if firsts[sc.name] == 2)
    env = sidecars.environment(s, PW, sc)
    assert ":5772/" in env["GEOFENCE_AMQP_URL"]
    assert env["GEOFENCE_AMQP_NODES"] == "127.0.0.1:5872,127.0.0.1:5672"
    one = sidecars.environment(Settings(), PW, sc)
    assert ":5672/" in one["GEOFENCE_AMQP_URL"] and "GEOFENCE_AMQP_NODES" not in one


def test_the_other_nodes_parse() -> None:
    assert parse_nodes("K", "127.0.0.1:5772, h2:5872") == (("127.0.0.1", 5772), ("h2", 5872))
    for bad in ("h", "h:", ":5672", "h:0", "h:70000", "h:x"):
        with pytest.raises(ConfigError, match="K="):
            parse_nodes("K", bad)


def _config(**kw: Any) -> shell.SidecarConfig:
    env = {"GEOFENCE_AMQP_URL": "amqp://u:p@127.0.0.1:5772/?name=x", "GEOFENCE_POSTGRES_URL": "postgresql://h/d",
           **kw}
    return shell.SidecarConfig.from_env("x-ingress", "", env)


async def test_a_connection_goes_to_the_next_node_and_stays_there(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(GEOFENCE_AMQP_NODES="127.0.0.1:5872,127.0.0.1:5672")
    assert config.amqp_endpoints == (("127.0.0.1", 5772), ("127.0.0.1", 5872), ("127.0.0.1", 5672))
    down = {5772}
    tried: list[int] = []

    class Conn:
        is_closed = False

        async def close(self) -> None:
            pass

    async def connect(url: str, timeout: float) -> Conn:
        port = int(url.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        tried.append(port)
        if port in down:
            raise ConnectionRefusedError(f"port {port}")
        return Conn()

    monkeypatch.setattr(connections.aio_pika, "connect", connect)
    monkeypatch.setattr(connections, "_node_of", {})
    async with contextlib.AsyncExitStack() as stack:
        await connections.open_connection(config, "gf-ingress", stack)
    assert tried == [5772, 5872]
    tried.clear()
    down.clear()  # node 1 is back: the process stays where it went until that node fails
    async with contextlib.AsyncExitStack() as stack:
        await connections.open_connection(config, "gf-ingress", stack)
    assert tried == [5872]
    down.update({5772, 5872, 5672})
    with pytest.raises(ConnectionRefusedError):
        async with contextlib.AsyncExitStack() as stack:
            await connections.open_connection(config, "gf-ingress", stack)
    # without other nodes: one try, as before
    tried.clear()
    with pytest.raises(ConnectionRefusedError):
        async with contextlib.AsyncExitStack() as stack:
            await connections.open_connection(_config(), "gf-ingress", stack)
    assert tried == [5772]
