"""Per-device users in gf-ingress: `geofence device add | remove | list`.

A device is a RabbitMQ user named after its object id, tagged `gf-device`, with rights in
gf-ingress only: it logs in over MQTT as `gf-ingress:<object_id>` with client id
`<object_id>`, may publish `positions/<object_id>` and subscribe to its own events
`fence-events/+/+/<object_id>` (or a given fence or kind in place of a `+`), nothing else
(see `definitions.device_permission` and `device_topic_permission`). RabbitMQ is the
credentials store: the password is shown once by `add` (or read from stdin) and kept nowhere
else.
"""

from __future__ import annotations

import secrets

from deploy.processes import Say, StackError
from deploy.rabbitmq import definitions as d
from deploy.rabbitmq.apply import management, run_steps, tags_of
from deploy.rabbitmq.management import Management, ManagementError
from deploy.rabbitmq.nodes import StackSecrets, StackSettings
from deploy.rabbitmq.plan import api_path, ctl, device_steps
from exchanges import topology as t
from exchanges.ids import check_object_id

RESERVED = frozenset({t.ADMIN_USER, "guest", *d.SIDECAR_USERS})


class DeviceError(StackError):
    pass


def _user(mgmt: Management, name: str) -> dict[str, object] | None:
    try:
        found: dict[str, object] = mgmt.get(api_path("users", name))
    except ManagementError as exc:
        if exc.status == 404:
            return None
        raise
    return found


def _checked(object_id: str) -> str:
    try:
        check_object_id(object_id)
    except ValueError as exc:
        raise DeviceError(str(exc)) from None
    if object_id in RESERVED:
        raise DeviceError(f"{object_id!r} is a reserved RabbitMQ user name")
    return object_id


def add(settings: StackSettings, pw: StackSecrets, object_id: str, password: str | None,
        say: Say) -> str:
    """Create the device user; returns its password (generated unless given)."""
    return _add_user(settings, pw, object_id, password, say, t.DEVICE_TAG,
                     "`geofence device remove` it first")


def add_sensor(settings: StackSettings, pw: StackSecrets, sensor_id: str, password: str | None,
               say: Say) -> str:
    """A presence sensor's user (tag gf-sensor): it publishes sensors/<sensor_id>/<kind> and
    subscribes to commands/sensor/<sensor_id>; returns its password (generated unless given)."""
    return _add_user(settings, pw, sensor_id, password, say, t.SENSOR_TAG,
                     "`geofence sensor remove` it first")


def _add_user(settings: StackSettings, pw: StackSecrets, name: str, password: str | None, say: Say, tag: str,
              hint: str) -> str:
    """A device's or a sensor's user, with the rights of its kind (tag)."""
    _checked(name)
    mgmt = management(settings, pw)
    if _user(mgmt, name) is not None:
        raise DeviceError(f"RabbitMQ user {name!r} exists: {hint}")
    password = secrets.token_urlsafe(24) if password is None else password
    if not password:
        raise DeviceError("empty password")
    if tag == t.SENSOR_TAG:
        perm, topic = d.sensor_permission(name), d.sensor_topic_permission(name)
    else:
        perm, topic = d.device_permission(name), d.device_topic_permission(name)
    run_steps(list(device_steps(name, password, perm, topic, (tag,))), mgmt, (password, *pw.values()), say)
    return password


def remove_sensor(settings: StackSettings, pw: StackSecrets, sensor_id: str, say: Say) -> None:
    """Delete a presence sensor's user (tag gf-sensor), as `remove` does a device's."""
    remove(settings, pw, sensor_id, say, tag=t.SENSOR_TAG)


def remove(settings: StackSettings, pw: StackSecrets, object_id: str, say: Say,
           tag: str = t.DEVICE_TAG) -> None:
    """Delete the device user, close its connections, delete its MQTT subscription queues."""
    _checked(object_id)
    mgmt = management(settings, pw)
    user = _user(mgmt, object_id)
    what = "device" if tag == t.DEVICE_TAG else "sensor"
    if user is None:
        raise DeviceError(f"no {what} {object_id!r}")
    if tag not in tags_of(user.get("tags")):
        raise DeviceError(f"RabbitMQ user {object_id!r} is not a {what} (no {tag} tag)")
    run_steps([ctl("delete_user", object_id)], mgmt, pw.values(), say)
    for conn in mgmt.get("api/connections?columns=name,user"):
        if conn.get("user") == object_id:
            say(f"  closing connection {conn['name']}")
            mgmt.delete(api_path("connections", conn["name"]))
    for queue in d.device_queues(object_id):
        if mgmt.delete(api_path("queues", t.INGRESS_VHOST, queue)):
            say(f"  deleted queue {queue} in {t.INGRESS_VHOST}")


def list_devices(settings: StackSettings, pw: StackSecrets) -> list[str]:
    users = management(settings, pw).get("api/users")
    return sorted(str(u["name"]) for u in users if t.DEVICE_TAG in tags_of(u.get("tags")))


def mqtt_login(object_id: str) -> str:
    return f"{t.INGRESS_VHOST}:{object_id}"

