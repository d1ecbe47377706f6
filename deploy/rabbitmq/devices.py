"""A tenant's device and gateway users in gf-ingress: `geofence device add | remove | list`
and `geofence gateway add | remove | list`, each `--tenant T`.

A device is a RabbitMQ user `<tenant>.<object_id>`, tagged `gf-device`, with rights in
gf-ingress only: it logs in over MQTT as `gf-ingress:<tenant>.<object_id>` with that client
id, may publish `positions/<tenant>/<object_id>` and subscribe to its own events
`fence-events/<tenant>/+/+/<object_id>` (or a given fence or kind in place of a `+`), nothing
else (see deploy/rabbitmq/credentials.py). A gateway is a user
`<tenant>.<name>`, tagged `gf-gateway`: it may publish batches to `ingress.gateway` with its
tenant as the routing key, or its tenant's devices' positions over MQTT, nothing else. An
application is a user `<tenant>.<name>` in gf-fences, tagged `gf-app`. So what a credential
publishes is its tenant's, whatever the body says (exchanges/tenancy.py). RabbitMQ is the
credentials store: the password is shown once by `add` (or read from stdin) and kept nowhere
else.
"""

from __future__ import annotations

import secrets

from deploy.processes import Say, StackError
from deploy.rabbitmq import credentials as cred
from deploy.rabbitmq import definitions as d
from deploy.rabbitmq.apply import management, run_steps, tags_of
from deploy.rabbitmq.definitions import TopicPermission
from deploy.rabbitmq.management import Management, ManagementError
from deploy.rabbitmq.nodes import StackSecrets, StackSettings
from deploy.rabbitmq.plan import api_path, delete_user_step, device_steps
from exchanges import topology as t
from exchanges.ids import check_object_id

RESERVED = frozenset({t.ADMIN_USER, "guest", *d.SIDECAR_USERS, *d.RETIRED_USERS})


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


def user_of(tenant: str, name: str) -> str:
    """The RabbitMQ user of a tenant's device or gateway `name`: `<tenant>.<name>`."""
    try:
        return cred.device_user(tenant, name)
    except ValueError as exc:
        raise DeviceError(str(exc)) from None


def add(settings: StackSettings, pw: StackSecrets, tenant: str, object_id: str, password: str | None,
        say: Say) -> str:
    """Create a tenant's device user; returns its password (generated unless given)."""
    return _add_user(settings, pw, user_of(tenant, object_id), password, say, t.DEVICE_TAG,
                     "`geofence device remove` it first")


def add_gateway(settings: StackSettings, pw: StackSecrets, tenant: str, name: str, password: str | None,
                say: Say) -> str:
    """Create a tenant's gateway user; returns its password (generated unless given)."""
    return _add_user(settings, pw, user_of(tenant, name), password, say, t.GATEWAY_TAG,
                     "`geofence gateway remove` it first")


def add_sensor(settings: StackSettings, pw: StackSecrets, sensor_id: str, password: str | None,
               say: Say) -> str:
    """A presence sensor's user (tag gf-sensor): it publishes sensors/<sensor_id>/<kind> and
    subscribes to commands/sensor/<sensor_id>; returns its password (generated unless given)."""
    return _add_user(settings, pw, sensor_id, password, say, t.SENSOR_TAG,
                     "`geofence sensor remove` it first")


def _add_user(settings: StackSettings, pw: StackSecrets, name: str, password: str | None, say: Say, tag: str,
              hint: str) -> str:
    """A device's or a sensor's user, with the rights of its kind (tag)."""
    if "." not in name:
        _checked(name)
    mgmt = management(settings, pw)
    if _user(mgmt, name) is not None:
        raise DeviceError(f"RabbitMQ user {name!r} exists: {hint}")
    password = secrets.token_urlsafe(24) if password is None else password
    if not password:
        raise DeviceError("empty password")
    topics: tuple[TopicPermission, ...]
    if tag == t.SENSOR_TAG:
        perm, topics = cred.sensor_permission(name), (cred.sensor_topic_permission(name),)
    elif tag == t.GATEWAY_TAG:
        perm, topics = cred.gateway_permission(name), cred.gateway_topic_permissions(name)
    elif tag == t.APP_TAG:
        perm, topics = cred.app_permission(name), cred.app_topic_permissions(name)
    else:
        perm, topics = cred.device_permission(name), (cred.device_topic_permission(name),)
    run_steps(list(device_steps(name, password, perm, topics, (tag,))), mgmt, (password, *pw.values()), say)
    return password


def remove_sensor(settings: StackSettings, pw: StackSecrets, sensor_id: str, say: Say) -> None:
    """Delete a presence sensor's user (tag gf-sensor), as `remove` does a device's."""
    remove(settings, pw, sensor_id, say, tag=t.SENSOR_TAG)


def add_app(settings: StackSettings, pw: StackSecrets, tenant: str, name: str, password: str | None,
            say: Say) -> str:
    """Create a tenant's application user (gf-fences); returns its password."""
    return _add_user(settings, pw, user_of(tenant, name), password, say, t.APP_TAG,
                     "`geofence app remove` it first")


def remove_app(settings: StackSettings, pw: StackSecrets, tenant: str, name: str, say: Say) -> None:
    """Delete a tenant's application user, close its connections and delete its queues."""
    user = user_of(tenant, name)
    remove(settings, pw, user, say, tag=t.APP_TAG)
    mgmt = management(settings, pw)
    prefix = t.app_queue_prefix(user)
    for q in mgmt.get(api_path("queues", t.FENCES_VHOST) + "?columns=name") or []:
        if str(q["name"]).startswith(prefix):
            mgmt.delete(api_path("queues", t.FENCES_VHOST, q["name"]))
            say(f"  deleted queue {q['name']} in {t.FENCES_VHOST}")


def remove_device(settings: StackSettings, pw: StackSecrets, tenant: str, object_id: str, say: Say) -> None:
    """Delete a tenant's device user, its connections and its MQTT subscription queues."""
    remove(settings, pw, user_of(tenant, object_id), say)


def remove_gateway(settings: StackSettings, pw: StackSecrets, tenant: str, name: str, say: Say) -> None:
    """Delete a tenant's gateway user and close its connections."""
    remove(settings, pw, user_of(tenant, name), say, tag=t.GATEWAY_TAG)


def remove(settings: StackSettings, pw: StackSecrets, object_id: str, say: Say,
           tag: str = t.DEVICE_TAG) -> None:
    """Delete the user (a device's `<tenant>.<id>`, a sensor's, a gateway's), close its
    connections, delete its MQTT subscription queues."""
    if "." not in object_id:
        _checked(object_id)
    mgmt = management(settings, pw)
    user = _user(mgmt, object_id)
    what = {t.DEVICE_TAG: "device", t.GATEWAY_TAG: "gateway", t.APP_TAG: "application"}.get(tag, "sensor")
    if user is None:
        raise DeviceError(f"no {what} {object_id!r}")
    if tag not in tags_of(user.get("tags")):
        raise DeviceError(f"RabbitMQ user {object_id!r} is not a {what} (no {tag} tag)")
    run_steps([delete_user_step(object_id)], mgmt, pw.values(), say)
    for conn in mgmt.get("api/connections?columns=name,user"):
        if conn.get("user") == object_id:
            say(f"  closing connection {conn['name']}")
            mgmt.delete(api_path("connections", conn["name"]))
    if tag in (t.GATEWAY_TAG, t.APP_TAG):
        return
    for queue in cred.device_queues(object_id):
        if mgmt.delete(api_path("queues", t.INGRESS_VHOST, queue)):
            say(f"  deleted queue {queue} in {t.INGRESS_VHOST}")


def list_devices(settings: StackSettings, pw: StackSecrets, tenant: str | None = None,
                 tag: str = t.DEVICE_TAG) -> list[str]:
    """The users of this kind (`<tenant>.<name>`), of one tenant or of all."""
    users = management(settings, pw).get("api/users")
    prefix = "" if tenant is None else f"{tenant}."
    return sorted(str(u["name"]) for u in users
                  if tag in tags_of(u.get("tags")) and str(u["name"]).startswith(prefix))


def mqtt_login(user: str) -> str:
    """The MQTT login of a device user (`<tenant>.<object_id>`) or a sensor's."""
    return f"{t.INGRESS_VHOST}:{user}"

