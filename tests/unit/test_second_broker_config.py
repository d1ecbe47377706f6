"""A second RabbitMQ node (issue 21): the settings that place a region on it, the topology
split between the two nodes (the second holds the placed region's vhost and every user; the
first everything else and the federation upstream that reads from the second), the steps
that name the second node, the URLs every client builds for a placed region."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.rabbitmq import apply as ap
from deploy.rabbitmq import definitions as d
from deploy.rabbitmq.plan import Ctl, Http
from deploy.services import broker2_env, broker2_node
from deploy.settings import Secrets, Settings, SettingsError, amqp_url, sidecar_amqp_url, write_live_topology
from exchanges import topology as t
from exchanges.shell.config import SidecarConfig
from fence.manager import _vhost_url

PW = Secrets("admin-pw", "pg-pw", {u: f"{u}-pw" for u in d.SIDECAR_USERS})


def placed(tmp_path: Path) -> Settings:
    s = Settings.from_env({"GEOFENCE_STATE_DIR": str(tmp_path)})
    write_live_topology(s, ("a", "b", "c"), s.workers, (("c", 2),))
    return Settings.from_env({"GEOFENCE_STATE_DIR": str(tmp_path)})


def test_brokers_setting_and_placement(tmp_path: Path) -> None:
    assert Settings().broker_count == 1 and Settings.from_env({"GEOFENCE_BROKERS": "2"}).broker_count == 2
    with pytest.raises(SettingsError, match="GEOFENCE_BROKERS"):
        Settings.from_env({"GEOFENCE_BROKERS": "3"})
    s = placed(tmp_path)
    assert s.placement == (("c", 2),) and s.broker_count == 2
    assert s.broker_of("c") == 2 and s.broker_of("a") == 1
    assert s.vhost_port("gf-region-c") == 5673 and s.vhost_port("gf-region-a") == 5672
    assert s.vhost_port(t.FENCES_VHOST) == 5672
    ports = s.ports()
    assert ports["amqp (broker 2)"] == 5673 and ports["management (broker 2)"] == 15673
    assert len(set(ports.values())) == len(ports)
    assert amqp_url(s, "pw", "gf-region-c").endswith("@127.0.0.1:5673/gf-region-c")
    assert ":5673/?name=x-geo-c" in sidecar_amqp_url(s, "x-geo", "pw", "x-geo-c", 2)
    gone = write_live_topology(s, ("a", "b"), s.workers)  # a region removed loses its place
    assert gone.placement == () and gone.broker_count == 1


def test_the_topology_is_split_between_the_two_nodes(tmp_path: Path) -> None:
    s = placed(tmp_path)
    (b1, first), (b2, second) = ap.per_broker(s, PW)
    assert (b1, b2) == (1, 2)
    assert second.vhosts == ("gf-region-c",) and "gf-region-c" not in first.vhosts
    assert {u.name for u in second.users} == {u.name for u in first.users}  # every user on both
    assert all(p.vhost == "gf-region-c" for p in (*second.permissions, *second.queues, *second.exchanges,
                                                   *second.bindings, *second.policies))
    assert not second.parameters  # the federation upstream lives where the link ends
    up = {p.name: p.value for p in first.parameters if p.component == "federation-upstream"}
    assert up["gf-region-c"]["uri"].endswith("@127.0.0.1:5673/gf-region-c")
    assert up["gf-region-a"]["uri"].endswith("@127.0.0.1:5672/gf-region-a")
    assert ap.per_broker(Settings(), PW)[0][1].vhosts == d.build(t.Topology(), d.Endpoint("127.0.0.1", 5672),
                                                                 "x").vhosts


def test_steps_for_the_second_node_name_it() -> None:
    step = Ctl(("rabbitmqctl", "add_vhost", "gf-region-c"))
    assert ap.on_node(step, 2) == Ctl(("rabbitmqctl", "-n", broker2_node(), "add_vhost", "gf-region-c"))
    assert ap.on_node(step, 1) == step
    http = Http("PUT", "api/vhosts/x", None)
    assert ap.on_node(http, 2) is http


def test_the_second_node_runs_apart(tmp_path: Path) -> None:
    s = Settings.from_env({"GEOFENCE_STATE_DIR": str(tmp_path), "GEOFENCE_BROKERS": "2"})
    env = broker2_env(s)
    assert env["RABBITMQ_NODENAME"] == broker2_node() and env["RABBITMQ_NODE_PORT"] == "5673"
    erl = env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
    assert env["RABBITMQ_MNESIA_BASE"].startswith(str(tmp_path)) and "15673" in erl
    assert "rabbitmq_mqtt tcp_listeners" not in erl and "ssl_listeners" not in erl  # no MQTT, no TLS


def test_clients_reach_a_placed_region_on_its_node() -> None:
    cfg = SidecarConfig.from_env("x-ingress", "", {"GEOFENCE_AMQP_URL": "amqp://u:p@127.0.0.1:5672/?name=x-ingress",
                                                   "GEOFENCE_POSTGRES_URL": "postgresql://g@h/db"})
    assert cfg.amqp_for("gf-region-c", ("127.0.0.1", 5673)).startswith("amqp://u:p@127.0.0.1:5673/gf-region-c?")
    assert cfg.amqp_for("gf-region-a").startswith("amqp://u:p@127.0.0.1:5672/gf-region-a?")
    assert _vhost_url("amqp://m:p@127.0.0.1:5672/gf-fences", "gf-region-c", ("10.0.0.2", 5673)) == \
        "amqp://m:p@10.0.0.2:5673/gf-region-c"
