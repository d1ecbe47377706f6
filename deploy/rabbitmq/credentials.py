"""A tenant's credentials in RabbitMQ, and the presence sensors': each kind of user's rights,
pure data as deploy/rabbitmq/definitions.py's (whose types and regex helpers they use).

    device       `<tenant>.<object_id>`, gf-ingress: publishes positions/<tenant>/<itself>,
                 reads its own events (fence-events.<tenant>.<fence>.<kind>.<itself>)
    gateway      `<tenant>.<name>`, gf-ingress: batches to ingress.gateway under <tenant>, or MQTT
                 positions/<tenant>/<any id>
    application  `<tenant>.<name>`, gf-fences: the fence API, its own app.<tenant>.<name>.* queues
                 bound to its tenant's keys on fence.events / fence.tenant-batches
    sensor       `<sensor id>`, gf-ingress: its own frames, its own configuration

RabbitMQ checks routing keys only where a user has a topic permission for the exchange, so
every topic exchange one of these may write or bind has one.

Each kind also has connection and channel limits (`USER_LIMITS`, RabbitMQ's user limits, as
`rabbitmqctl set_user_limits` sets them): a leaked or buggy credential cannot open thousands
of connections or channels, each costing the broker an Erlang process and memory.
"""

from __future__ import annotations

from deploy.rabbitmq.definitions import (
    NOTHING,
    Permission,
    TopicPermission,
    exactly,
    regex_escape,
)
from exchanges import topology as t
from exchanges.ids import check_object_id
from exchanges.tenancy import check_tenant

# A device or a sensor: one MQTT connection (the MQTT plugin opens two channels on it), one
# more while a reconnect overlaps the old one. A gateway or an application: a pool of AMQP
# connections with a few channels each.
USER_LIMITS: dict[str, dict[str, int]] = {
    t.DEVICE_TAG: {"max-connections": 2, "max-channels": 8},
    t.SENSOR_TAG: {"max-connections": 2, "max-channels": 8},
    t.GATEWAY_TAG: {"max-connections": 16, "max-channels": 128},
    t.APP_TAG: {"max-connections": 16, "max-channels": 128},
}


def limits_of(tags: tuple[str, ...] | list[str]) -> dict[str, int] | None:
    """The user limits of a client user with these tags; None for the platform's users."""
    for tag in tags:
        if tag in USER_LIMITS:
            return USER_LIMITS[tag]
    return None


def device_user(tenant: str, object_id: str) -> str:
    """A tenant's device's RabbitMQ user (its MQTT login's user part and its client id):
    `<tenant>.<object_id>` (neither holds a dot, so two tenants' `car-1` are two users)."""
    return f"{check_tenant(tenant)}.{check_object_id(object_id)}"


def tenant_user(user: str) -> tuple[str, str]:
    """(tenant, name) of a tenant's device or gateway user; ValueError for any other name."""
    tenant, dot, name = user.partition(".")
    if not dot:
        raise ValueError(f"{user!r} is not <tenant>.<name>")
    return check_tenant(tenant), check_object_id(name)


def _client(user: str) -> str:
    """A device's or sensor's user name, checked: `<tenant>.<object_id>` or a sensor id."""
    if "." in user:
        tenant_user(user)
    else:
        check_object_id(user)
    return user


def device_queues(user: str) -> tuple[str, str]:
    """The MQTT plugin's subscription queues of a device whose client id is its user name."""
    base = f"{t.MQTT_SUBSCRIPTION_QUEUE_PREFIX}{_client(user)}"
    return f"{base}qos0", f"{base}qos1"


def device_permission(user: str) -> Permission:
    """Its own MQTT subscription queues (declare, bind, consume) and amq.topic (publish,
    bind). What it may publish and subscribe to is narrowed by the topic permission."""
    own = f"{t.MQTT_SUBSCRIPTION_QUEUE_PREFIX}{regex_escape(_client(user))}qos[01]"
    topic = regex_escape(t.MQTT_TOPIC_EXCHANGE)
    return Permission(user, t.INGRESS_VHOST, f"^{own}$", f"^({topic}|{own})$",
                      f"^({topic}|{own})$")


def device_topic_permission(user: str) -> TopicPermission:
    """Publish only positions.<its tenant>.<itself>, subscribe only to its own events
    (fence-events.<its tenant>.<fence>.<kind>.<itself>, the fence and kind possibly
    wildcards): the tenant of what it publishes is its own, whatever the body says."""
    tenant, object_id = tenant_user(user)
    return TopicPermission(user, t.INGRESS_VHOST, t.MQTT_TOPIC_EXCHANGE,
                           f"^{regex_escape(t.POSITIONS_TOPIC_PREFIX)}\\.{tenant}\\.{object_id}$",
                           f"^{regex_escape(t.EVENTS_TOPIC_PREFIX)}\\.{tenant}\\.[^.#]+\\.[^.#]+\\.{object_id}$")


def gateway_permission(user: str) -> Permission:
    """A tenant's gateway: publish batches to ingress.gateway (AMQP) or its devices' positions
    to amq.topic (MQTT: a network server publishing for many devices), nothing else (no
    queue, no read)."""
    tenant_user(user)
    return Permission(user, t.INGRESS_VHOST, NOTHING, exactly(t.GATEWAY_EXCHANGE, t.MQTT_TOPIC_EXCHANGE),
                      NOTHING)


def gateway_topic_permissions(user: str) -> tuple[TopicPermission, TopicPermission]:
    """Its batches only under its tenant's key, its MQTT positions only under its tenant's
    topics: x-ingress qualifies their ids by that tenant."""
    tenant, _ = tenant_user(user)
    return (TopicPermission(user, t.INGRESS_VHOST, t.GATEWAY_EXCHANGE, f"^{tenant}$", NOTHING),
            TopicPermission(user, t.INGRESS_VHOST, t.MQTT_TOPIC_EXCHANGE,
                            f"^{regex_escape(t.POSITIONS_TOPIC_PREFIX)}\\.{tenant}\\.[^.#*]+$", NOTHING))


def app_permission(user: str) -> Permission:
    """A tenant's application, in gf-fences: requests to the fence API (answers by direct
    reply-to); its own queues `app.<tenant>.<name>.<anything>` (declare, bind, consume), bound
    to fence.events or fence.tenant-batches, where its topic permissions allow its tenant's
    keys only. No other queue: another application's is neither read nor bound."""
    tenant_user(user)
    own = f"{regex_escape(t.app_queue_prefix(user))}.+"
    return Permission(user, t.FENCES_VHOST, f"^{own}$", f"^({regex_escape(t.API_EXCHANGE)}|{own})$",
                      f"^({regex_escape(t.EVENTS_EXCHANGE)}|{regex_escape(t.TENANT_BATCHES_EXCHANGE)}|{own})$")


def app_topic_permissions(user: str) -> tuple[TopicPermission, TopicPermission]:
    """Bind (read) only its tenant's keys: on fence.events `fence-events.<tenant>.` and
    `roam-events.<tenant>.` (a fence's, a kind's, an object's, or `#` after them), on
    fence.tenant-batches its tenant. Nothing is published to these by an application."""
    tenant, _ = tenant_user(user)
    events = (f"^({regex_escape(t.EVENTS_TOPIC_PREFIX)}|{regex_escape(t.ROAM_EVENTS_TOPIC_PREFIX)})"
              f"\\.{tenant}\\.")
    return (TopicPermission(user, t.FENCES_VHOST, t.EVENTS_EXCHANGE, NOTHING, events),
            TopicPermission(user, t.FENCES_VHOST, t.TENANT_BATCHES_EXCHANGE, NOTHING, f"^{tenant}$"))


# --------------------------------------------------------------------------- sensors


SENSOR_KINDS_PATTERN = r"(counter|v2\.(counter|event|status))"  # sensors/<id>/<kind> (fence/venues)


def sensor_permission(sensor_id: str) -> Permission:
    """A presence sensor: like a device, its own MQTT subscription queues and amq.topic."""
    return device_permission(sensor_id)


def sensor_topic_permission(sensor_id: str) -> TopicPermission:
    """Publish only its own frames (sensors.<itself>.<kind>), subscribe only to its own
    configuration (commands.sensor.<itself>). Sensors are the platform's (their hives have
    owners; a sensor's frames are counts, never an identity)."""
    check_object_id(sensor_id)
    return TopicPermission(sensor_id, t.INGRESS_VHOST, t.MQTT_TOPIC_EXCHANGE,
                           f"^{regex_escape(t.SENSORS_TOPIC_PREFIX)}\\.{{username}}\\.{SENSOR_KINDS_PATTERN}$",
                           f"^{regex_escape(t.COMMANDS_TOPIC_PREFIX)}\\.{{username}}$")
