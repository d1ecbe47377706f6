"""The broker's host defaults without a broker: the listeners read from /proc/net (deploy/
exposure.py), the users `up` fixes (deploy/rabbitmq/apply.host_default_steps) and the nodes'
environment (deploy/services.py, deploy/broker_host.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy import broker_host, exposure, services
from deploy.rabbitmq import apply as ap
from deploy.rabbitmq import device_bulk
from deploy.rabbitmq.credentials import USER_LIMITS
from deploy.rabbitmq.plan import Http
from deploy.settings import Settings
from exchanges import topology as t

TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1111 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 00000000:6468 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0100007F:1628 0100007F:D3A2 01 00000000:00000000 00:00000000 00000000     0        0 3 1
   3: 0F02000A:22B3 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1
"""
TCP6 = """  sl  local_address                         remote_address                        st
   0: 00000000000000000000000001000000:1111 00000000000000000000000000000000:0000 0A
   1: 00000000000000000000000000000000:1111 00000000000000000000000000000000:0000 0A
   2: 0000000000000000FFFF00000100007F:0050 00000000000000000000000000000000:0000 0A
"""


def test_listeners_are_read_as_the_kernel_writes_them(tmp_path: Path) -> None:
    (tmp_path / "tcp").write_text(TCP)
    (tmp_path / "tcp6").write_text(TCP6)
    found = {(x.address, x.port, x.exposed) for x in exposure.listeners(tmp_path)}
    assert found == {("127.0.0.1", 4369, False), ("0.0.0.0", 25704, True), ("10.0.2.15", 8883, True),
                     ("::1", 4369, False), ("::", 4369, True), ("127.0.0.1", 80, False)}
    # 5672 is a connection (state 01), not a listener
    assert exposure.exposed([4369, 5672, 8883], tmp_path) == {4369, 8883}


def _user(name: str, tags: list[str], password: str = "s3cret") -> dict[str, object]:
    return {"name": name, "tags": tags, "password_hash": device_bulk.password_hash(password),
            "hashing_algorithm": device_bulk.HASHING}


def test_up_removes_the_default_guest_and_gives_client_users_their_limits() -> None:
    users = [_user("guest", ["administrator"], "guest"), _user("geofence", ["administrator"]),
             _user("x-fence", []), _user("t1.van-1", [t.DEVICE_TAG]), _user("t1.gw", [t.GATEWAY_TAG]),
             _user("s-1", [t.SENSOR_TAG]), _user("t1.crm", [t.APP_TAG])]
    limits = [{"user": "t1.van-1", "value": USER_LIMITS[t.DEVICE_TAG]},
              {"user": "t1.gw", "value": {"max-connections": 1000}}]
    steps = ap.host_default_steps(users, limits)
    assert Http("DELETE", "api/users/guest", None) in steps
    puts = {(s.path, s.body["value"]) for s in steps if isinstance(s, Http) and s.method == "PUT" and s.body}
    assert puts == {(f"api/user-limits/{user}/{name}", value)
                    for user, conns, chans in (("t1.gw", 16, 128), ("s-1", 2, 8), ("t1.crm", 16, 128))
                    for name, value in (("max-connections", conns), ("max-channels", chans))}
    assert len(steps) == 7  # nothing for the platform's users nor for the device already right


def test_a_guest_whose_password_was_changed_is_kept() -> None:
    assert ap.host_default_steps([_user("guest", ["administrator"], "not-guest")], []) == []


@pytest.mark.parametrize("loopback", [True, False])
def test_every_node_carries_the_host_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              loopback: bool) -> None:
    monkeypatch.setattr(broker_host, "host_name_is_loopback", lambda: loopback)
    s = Settings.from_env({"GEOFENCE_STATE_DIR": str(tmp_path), "GEOFENCE_BROKERS": "2"})
    for env in (services.rabbitmq_env(s), services.broker2_env(s)):
        args = env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
        assert "-rabbitmq_mqtt allow_anonymous false" in args
        assert f"-rabbit max_message_size {broker_host.MAX_MESSAGE_SIZE}" in args
        assert ("-kernel inet_dist_use_interface {127,0,0,1}" in args) is loopback
        assert (env.get("ERL_EPMD_ADDRESS") == "127.0.0.1") is loopback
    assert services.broker2_env(s)["RABBITMQ_DIST_PORT"] == "25673"
