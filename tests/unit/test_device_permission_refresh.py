"""`geofence up` brings devices' topic permissions up to date (deploy.rabbitmq.apply): a
tenant's device (`<tenant>.<object_id>`) whose topic permission is of an older layout gets the
current one; a device user from before tenants (its name an object id) is no tenant's and is
left alone (what it publishes, `positions.<id>`, is dead-lettered by x-ingress)."""

from __future__ import annotations

from typing import Any

from deploy.rabbitmq import credentials as cred
from deploy.rabbitmq.apply import device_permission_steps
from deploy.rabbitmq.plan import Ctl


class Api:
    """The two management API reads device_permission_steps makes."""

    def __init__(self, users: list[dict[str, Any]], topic_permissions: list[dict[str, Any]]) -> None:
        self.answers = {"api/users": users, "api/topic-permissions": topic_permissions}

    def get(self, path: str) -> Any:
        return self.answers[path]


def current(user: str) -> dict[str, Any]:
    p = cred.device_topic_permission(user)
    return {"user": p.user, "vhost": p.vhost, "exchange": p.exchange, "write": p.write, "read": p.read}


def test_only_devices_with_an_outdated_permission_get_a_step() -> None:
    first = {**current("acme.dev-old"), "read": "^object-events\\.{username}\\."}  # the first layout
    untenanted = {**current("acme.dev-pre"),  # the layout before tenants: positions.<id>
                  "write": "^positions\\.{username}$",
                  "read": "^fence-events\\.[^.#]+\\.[^.#]+\\.{username}$"}
    api = Api([{"name": "acme.dev-ok", "tags": ["gf-device"]}, {"name": "acme.dev-old", "tags": "gf-device"},
               {"name": "acme.dev-pre", "tags": ["gf-device"]},
               {"name": "acme.dev-none", "tags": ["gf-device"]}, {"name": "x-fence", "tags": []},
               {"name": "acme.gw-1", "tags": ["gf-gateway"]},
               {"name": "dev-1", "tags": ["gf-device"]},  # a device user from before tenants
               {"name": "Bad.name", "tags": ["gf-device"]}, {"name": "a.b.c", "tags": ["gf-device"]}],
              [current("acme.dev-ok"), first, untenanted])
    steps = device_permission_steps(api)  # type: ignore[arg-type]
    assert all(isinstance(s, Ctl) for s in steps)
    users = [s.argv[s.argv.index("set_topic_permissions") + 3] for s in steps if isinstance(s, Ctl)]
    assert users == ["acme.dev-old", "acme.dev-pre", "acme.dev-none"]
    for step, user in zip(steps, users, strict=True):
        want = cred.device_topic_permission(user)
        assert isinstance(step, Ctl) and step.argv[-2:] == (want.write, want.read)
        assert step.argv[-2] == f"^positions\\.acme\\.{user.removeprefix('acme.')}$"


def test_nothing_to_do_when_every_device_is_current() -> None:
    api = Api([{"name": "acme.dev-1", "tags": ["gf-device"]}, {"name": "other.dev-1", "tags": ["gf-device"]}],
              [current("acme.dev-1"), current("other.dev-1")])
    assert device_permission_steps(api) == []  # type: ignore[arg-type]


def test_another_tenants_permission_is_not_this_devices() -> None:
    """other.dev-1's permission (another tenant's object of the same id) is not acme.dev-1's."""
    theirs = {**current("other.dev-1"), "user": "acme.dev-1"}
    api = Api([{"name": "acme.dev-1", "tags": ["gf-device"]}], [theirs])
    steps = device_permission_steps(api)  # type: ignore[arg-type]
    assert len(steps) == 1 and isinstance(steps[0], Ctl)
    assert steps[0].argv[-2] == "^positions\\.acme\\.dev-1$"
