"""`geofence up` brings devices' topic permissions up to date (deploy.rabbitmq.apply)."""

from __future__ import annotations

from typing import Any

from deploy.rabbitmq import definitions as d
from deploy.rabbitmq.apply import device_permission_steps
from deploy.rabbitmq.plan import Ctl


class Api:
    """The two management API reads device_permission_steps makes."""

    def __init__(self, users: list[dict[str, Any]], topic_permissions: list[dict[str, Any]]) -> None:
        self.answers = {"api/users": users, "api/topic-permissions": topic_permissions}

    def get(self, path: str) -> Any:
        return self.answers[path]


def current(user: str) -> dict[str, Any]:
    p = d.device_topic_permission(user)
    return {"user": p.user, "vhost": p.vhost, "exchange": p.exchange, "write": p.write, "read": p.read}


def test_only_devices_with_an_outdated_permission_get_a_step() -> None:
    old = {**current("dev-old"), "read": "^object-events\\.{username}\\."}  # the first layout
    api = Api([{"name": "dev-ok", "tags": ["gf-device"]}, {"name": "dev-old", "tags": "gf-device"},
               {"name": "dev-none", "tags": ["gf-device"]}, {"name": "x-fence", "tags": []},
               {"name": "bad.name", "tags": ["gf-device"]}],
              [current("dev-ok"), old])
    steps = device_permission_steps(api)  # type: ignore[arg-type]
    assert all(isinstance(s, Ctl) for s in steps)
    users = [s.argv[s.argv.index("set_topic_permissions") + 3] for s in steps if isinstance(s, Ctl)]
    assert users == ["dev-old", "dev-none"]
    want = d.device_topic_permission("dev-old")
    first = steps[0]
    assert isinstance(first, Ctl) and first.argv[-2:] == (want.write, want.read)


def test_nothing_to_do_when_every_device_is_current() -> None:
    api = Api([{"name": "dev-1", "tags": ["gf-device"]}], [current("dev-1")])
    assert device_permission_steps(api) == []  # type: ignore[arg-type]
