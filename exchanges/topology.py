"""Names of every vhost, exchange, queue and user of the pipeline: one place, so the
`rabbitmqctl` scripts in deploy/rabbitmq/, the sidecars and the tests agree.

    devices (MQTT, vhost gf-ingress) --amq.topic "positions.<tenant>.<id>"--> queue x-ingress.positions
    gateways (AMQP, gf-ingress) --exchange ingress.gateway, key <tenant>--> queue x-ingress.batches
    (the tenant of a position is in its routing key; each device's and gateway's topic
    permission allows its own tenant's keys only, exchanges/tenancy.py)
    x-ingress --(worldmap)--> vhost gf-region-<r>: exchange x-geo.in --> queue x-geo.positions
    fence management          --> vhost gf-region-<r>: exchange x-geo.control --> queue x-geo.control
    x-geo <r> --> gf-region-<r>: exchange x-fence.in (routing key = x-fence worker)
        ==federation==> vhost gf-fences: exchange x-fence.in --> queue x-fence.<worker>
    fence management --> gf-fences: exchange x-fence.control (key = worker) --> x-fence.<worker>.control
    applications --> gf-fences: exchange fence.api --> queue fence.api (the fence API, request /
                     reply with reply-to and correlation id) --> the fence service
    x-ingress (positions of followed objects) --> gf-ingress: fence.follow --> queue fence.follow
                     --> the fence service moves the fences that follow them
    x-fence --> gf-fences: exchange fence.event-batches (fanout): one message per worker batch,
                a JSON array of its events --> queue fence.archive --> the events archiver
                (PostgreSQL); the platform's own (no application may read it)
            --> gf-fences: exchange fence.tenant-batches (topic, key <tenant>): the same events
                split by tenant, one message per tenant per batch: a tenant's applications
                that want every event of their tenant bind their own queues here
            --> gf-fences: exchange fence.events (topic,
                "fence-events.<tenant>.<fence_id>.<enter|leave|cross>.<object_id>"): one message
                per event, for subscribers to a fence's, a kind's or an object's events; the
                tenant is the fence's, so a topic permission keeps a tenant's readers to its own
        ==federation==> gf-ingress: amq.topic, so MQTT clients of gf-ingress subscribe to
                        fence-events/<tenant>/<fence_id>/<kind>/+ (a fence's events) and
                        fence-events/<tenant>/+/+/<object_id> (an object's; a device only its own)
            --> gf-fences: exchange fence.events, "roam-events.<tenant>.<subscription>.
                <nearby|faraway>.<object_id>": proximity events, one message each (same
                federation to MQTT)
    x-ingress (proximity rows and subscriptions) --> gf-fences: exchange x-fence.in (key = worker)
                --> queue x-fence.<worker>, beside what the regions' x-geo send

Every vhost has a fanout exchange `dead-letters` and a queue `dead-letters`; a policy makes
it the dead-letter exchange of the vhost's queues. Sidecars publish what they cannot process
there themselves, with the reason in the `x-geofence-reason` header (a rejection by policy
carries only RabbitMQ's `x-death` reason).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exchanges import ingress_partitions as ip
from exchanges.settings_registry import SIDECAR_KEYS
from exchanges.tenancy import name_of, split

# The routing-key word of names without a tenant (the platform's own, the cores' tests): no
# tenant id can be it (tenant ids have no "_"), so no tenant's permission matches it.
NO_TENANT_WORD = "_"

INGRESS_VHOST = "gf-ingress"
FENCES_VHOST = "gf-fences"
REGION_VHOST_PREFIX = "gf-region-"

# gf-ingress
POSITIONS_QUEUE = "x-ingress.positions"  # the retired topic's (positions.*, dead-lettered there)
POSITIONS_TOPIC_PATTERN = "positions.*.*"  # MQTT positions/<tenant>/<object_id> on amq.topic
# ... bound to x-ingress.partition, RabbitMQ's consistent-hash exchange, which sends each to
# one of the partition queues x-ingress.p00 .. (exchanges/ingress_partitions.py) by object
PARTITION_EXCHANGE = "x-ingress.partition"
PARTITION_QUEUES = ip.queue_names()
# With several x-ingress instances, the positions of tenants with a proximity subscription go
# from the others to the first one (x-ingress, which holds the proximity router) through this
PROXIMITY_QUEUE = "x-ingress.proximity"
GATEWAY_EXCHANGE = "ingress.gateway"  # topic: a gateway's batches, routing key = its tenant
GATEWAY_TOPIC_PATTERN = "*"
BATCHES_QUEUE = "x-ingress.batches"
# Retired: ingress.batches (fanout, no tenant) and positions.* (MQTT positions/<object_id>, no
# tenant): still bound to x-ingress's queues, which dead-letter what comes that way with the
# reason; and the shared user `gateway` (deploy/rabbitmq/definitions.RETIRED_USERS)
RETIRED_BATCHES_EXCHANGE = "ingress.batches"
RETIRED_POSITIONS_PATTERN = "positions.*"
MQTT_TOPIC_EXCHANGE = "amq.topic"

# gf-region-<r>
GEO_IN_EXCHANGE = "x-geo.in"
GEO_POSITIONS_QUEUE = "x-geo.positions"
GEO_CONTROL_EXCHANGE = "x-geo.control"
GEO_CONTROL_QUEUE = "x-geo.control"
FENCE_IN_EXCHANGE = "x-fence.in"  # exists in every region vhost and in gf-fences (federated)

# gf-fences
FENCE_CONTROL_EXCHANGE = "x-fence.control"
EVENTS_EXCHANGE = "fence.events"  # one message per event, key event_routing_key()
EVENT_BATCHES_EXCHANGE = "fence.event-batches"  # one message per worker batch (a JSON array)
# the same batches split by tenant (topic, key = the tenant): a tenant's applications bind here
# for every event of their tenant, their topic permission allowing their tenant's key only
TENANT_BATCHES_EXCHANGE = "fence.tenant-batches"
ARCHIVE_QUEUE = "fence.archive"  # every event batch (fence.event-batches), for the events archiver
# every event batch again, and every proximity event (fence.events "roam-events.#"), for the
# webhooks sidecar: it queues what its tenants' endpoints want in PostgreSQL (fence/webhooks/)
WEBHOOKS_QUEUE = "fence.webhooks"
# Retired: fence.events.mqtt (a second, MQTT-keyed copy of every event: fence.events is now
# keyed for MQTT and federated itself; a broker that has it keeps it, unused) and
# fence.archive's binding to fence.events "#" (deploy/rabbitmq/definitions.RETIRED_BINDINGS).
API_EXCHANGE = "fence.api"  # the fence API over AMQP (request / reply)
API_QUEUE = "fence.api"

# gf-ingress: positions of objects that fences follow, tapped by x-ingress for the follower
FOLLOW_EXCHANGE = "fence.follow"
FOLLOW_QUEUE = "fence.follow"

# The live map (fence/map_feed.py): x-ingress publishes, once a second, the latest position of
# each object that moved (a sample, transient, unconfirmed) to fence.map-positions in
# gf-ingress, and each x-fence worker twice a second its newest events to fence.map-events in
# gf-fences; each API process reads both through queues of its own,
# exclusive, named fence.map.<process>.<what>: the gf-map-taps policy keeps them short and
# drops their oldest message (a map wants the newest, never a backlog).
MAP_POSITIONS_EXCHANGE = "fence.map-positions"
MAP_EVENTS_EXCHANGE = "fence.map-events"  # gf-fences: each x-fence's newest events, twice a second
MAP_TAP_QUEUE_PREFIX = "fence.map."

# gf-ingress: venue presence sensors (fence/venues/): their MQTT frames (sensors/<id>/...) on
# amq.topic --"sensors.#"--> queue venue.sensors --> the sensor sidecar, which publishes each
# hive's occupancy when it moves on venue.occupancy (topic, key hive-occupancy.<hive_id>) and
# on amq.topic (MQTT hive-occupancy/<hive_id>), and configurations on amq.topic
# (commands/sensor/<sensor_id>)
SENSORS_QUEUE = "venue.sensors"
NOTIFY_QUEUE = "venue.notify"  # venue.occupancy "hive-occupancy.#": the notifier (same sidecar)
# amq.topic (fence.events federated) "fence-events.<fence_id>.*.*" for each hive's fence, bound
# by the sensor sidecar itself: app users' phones inside a hive (its second occupancy figure)
HIVE_EVENTS_QUEUE = "venue.fence-events"
SENSORS_TOPIC_PATTERN = "sensors.#"
OCCUPANCY_EXCHANGE = "venue.occupancy"
SENSORS_TOPIC_PREFIX = "sensors"  # MQTT sensors/<sensor_id>/<kind>
COMMANDS_TOPIC_PREFIX = "commands.sensor"  # MQTT commands/sensor/<sensor_id>
OCCUPANCY_TOPIC_PREFIX = "hive-occupancy"  # MQTT hive-occupancy/<hive_id>
SENSOR_TAG = "gf-sensor"  # a sensor's RabbitMQ user (MQTT login gf-ingress:<sensor_id>)

# every vhost
DEAD_LETTER_EXCHANGE = "dead-letters"
DEAD_LETTER_QUEUE = "dead-letters"
REASON_HEADER = "x-geofence-reason"
FIRST_EXCHANGE_HEADER = "x-geofence-exchange"  # a dead letter's first exchange, kept on replay

# users (one per sidecar kind, each limited to what it touches)
INGRESS_USER = "x-ingress"
GEO_USER = "x-geo"
FENCE_USER = "x-fence"
MANAGER_USER = "fence-manager"  # the fence API (HTTP and AMQP) and the follower
ARCHIVER_USER = "fence-archiver"
WEBHOOKS_USER = "fence-webhooks"  # the webhooks sidecar
VENUES_USER = "venue-sensors"  # the sensor sidecar
# retired: the one user every application shared (it read every tenant's events); each
# application is a tenant's own user now, `<tenant>.<name>` tagged gf-app (`geofence app add`)
CLIENT_USER = "fence-client"
FEDERATION_USER = "federation"
GATEWAY_USER = "gateway"  # retired: the one gateway user of no tenant (deleted by the plan)


# The settings a sidecar reads (exchanges.shell.SidecarConfig); the local stack accepts them too.
# A view of exchanges/settings_registry.py, where every key is declared.
SIDECAR_ENV_KEYS = SIDECAR_KEYS


def region_vhost(region: str) -> str:
    return f"{REGION_VHOST_PREFIX}{region}"


def fence_queue(worker: str) -> str:
    return f"x-fence.{worker}"


def fence_control_queue(worker: str) -> str:
    return f"x-fence.{worker}.control"


# One instance per routing role: each session first declares its lock, an exclusive queue
# (the broker's own mutex: owned by the connection, gone with it; a second declare is refused)
INGRESS_LOCK = "lock.x-ingress"  # in gf-ingress; an added x-ingress instance N: lock.x-ingress-N
VENUES_LOCK = "lock.venue-sensors"  # in gf-ingress
GEO_LOCK = "lock.x-geo"  # in each region's vhost


def fence_journal_queue(worker: str) -> str:
    """A stream in gf-fences: the worker's journal, shipped to its backups (issue 38)."""
    return f"x-fence.{worker}.journal"


def ingress_lock(instance: str) -> str:
    """The lock of x-ingress instance `instance` ("" for the first, x-ingress)."""
    return f"{INGRESS_LOCK}-{instance}" if instance else INGRESS_LOCK


def fence_lock(worker: str) -> str:  # in gf-fences
    return f"lock.x-fence.{worker}"


def fence_home_lock(worker: str) -> str:
    """In gf-fences: held (an exclusive queue) by the worker's own process while it stands by
    for it: a backup running the worker hands it back, and takes it only when this is gone."""
    return f"lock.x-fence.{worker}.home"


def event_routing_key(fence_id: str, kind: str, object_id: str) -> str:
    """The routing key of an event on fence.events (the MQTT topic with '/' for '.'), from the
    qualified ids of its fence and object (exchanges/tenancy.py): one key serves the fence's
    subscribers (fence-events.<tenant>.<fence_id>.*.*), a kind's and the object's
    (fence-events.<tenant>.*.*.<object_id>), AMQP and MQTT alike, so an event is one message,
    not one per audience. The tenant is the fence's: a topic permission on it keeps a tenant's
    applications to their own events. An object of another tenant (a count shared with the
    fence's tenant) never goes out under its id: see fence/x_fence/sidecar.py."""
    tenant, fence = split(fence_id)
    return f"{EVENTS_TOPIC_PREFIX}.{tenant or NO_TENANT_WORD}.{fence}.{kind}.{name_of(object_id)}"


def presence_routing_key(fence_id: str, kind: str) -> str:
    """The routing key of a presence event on fence.events (an object of another tenant than
    the fence's, which the fence counts from: exchanges/fence_options/shares.py): no object in
    it, and a prefix no tenant's permission lets it bind (the sensor sidecar's)."""
    tenant, fence = split(fence_id)
    return f"{PRESENCE_TOPIC_PREFIX}.{tenant or NO_TENANT_WORD}.{fence}.{kind}"


def presence_binding_key(fence_id: str) -> str:
    tenant, fence = split(fence_id)
    return f"{PRESENCE_TOPIC_PREFIX}.{tenant or NO_TENANT_WORD}.{fence}.*"


def roam_event_routing_key(subscription_id: str, kind: str, object_id: str) -> str:
    """The routing key of a proximity event on fence.events (MQTT
    roam-events/<tenant>/<subscription>/<nearby|faraway>/<object>), from qualified ids."""
    tenant, sub = split(subscription_id)
    return f"{ROAM_EVENTS_TOPIC_PREFIX}.{tenant or NO_TENANT_WORD}.{sub}.{kind}.{name_of(object_id)}"


def occupancy_routing_key(hive_id: str) -> str:
    return f"{OCCUPANCY_TOPIC_PREFIX}.{hive_id}"


def sensor_command_key(sensor_id: str) -> str:
    return f"{COMMANDS_TOPIC_PREFIX}.{sensor_id}"


def event_binding_key(fence_id: str = "*", kind: str = "*", object_id: str = "*", tenant: str = "") -> str:
    """A binding key on fence.events for a fence's, a kind's or an object's events: a qualified
    fence id gives its tenant; else `tenant` ("*" for every tenant's, an operator's)."""
    if fence_id != "*":
        tenant, fence_id = split(fence_id)
    word = tenant or (NO_TENANT_WORD if fence_id != "*" else "*")
    return f"{EVENTS_TOPIC_PREFIX}.{word}.{fence_id}.{kind}.{object_id}"


@dataclass(frozen=True)
class Topology:
    """The regions (x-geo instances) and x-fence workers of one deployment."""

    regions: tuple[str, ...] = ("a", "b")
    workers: tuple[str, ...] = ("w0", "w1")
    vhosts: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        for name in (*self.regions, *self.workers):
            if not name or not name.replace("-", "").isalnum():
                raise ValueError(f"region / worker names are [A-Za-z0-9-]+, got {name!r}")
        if len(set(self.regions)) != len(self.regions) or len(set(self.workers)) != len(self.workers):
            raise ValueError("region and worker names must be unique")
        object.__setattr__(
            self, "vhosts", (INGRESS_VHOST, *(region_vhost(r) for r in self.regions), FENCES_VHOST)
        )


# --------------------------------------------------------------------------- deployment names
# Added with deploy/rabbitmq/ (the scripts that declare all of the above).

ADMIN_USER = "geofence"  # the local stack's administrator: full rights on every vhost

# Every exchange the topology declares, with its type (amq.topic is RabbitMQ's own).
EXCHANGE_TYPES: dict[str, str] = {
    GATEWAY_EXCHANGE: "topic",
    PARTITION_EXCHANGE: ip.EXCHANGE_TYPE,  # bindings weigh 1 each, bound in name order
    RETIRED_BATCHES_EXCHANGE: "fanout",
    GEO_IN_EXCHANGE: "fanout",
    GEO_CONTROL_EXCHANGE: "fanout",
    FENCE_IN_EXCHANGE: "direct",  # routing key = x-fence worker
    FENCE_CONTROL_EXCHANGE: "direct",  # routing key = x-fence worker
    API_EXCHANGE: "direct",  # routing key "" (one service; replicas share the queue)
    FOLLOW_EXCHANGE: "fanout",
    MAP_POSITIONS_EXCHANGE: "fanout",
    MAP_EVENTS_EXCHANGE: "fanout",
    EVENTS_EXCHANGE: "topic",
    EVENT_BATCHES_EXCHANGE: "fanout",
    TENANT_BATCHES_EXCHANGE: "topic",
    OCCUPANCY_EXCHANGE: "topic",
    DEAD_LETTER_EXCHANGE: "fanout",
}

# Policies (one per queue group, so that the group's settings never shadow each other).
DEAD_LETTER_POLICY = "gf-dead-letters"  # every queue of a vhost but the ones below
INPUT_LIMITS_POLICY = "gf-input-limits"  # sidecar input queues: dead letters + length limit
MAP_TAPS_POLICY = "gf-map-taps"  # the live map's queues: short, oldest dropped, no dead letters
CLIENT_QUEUES_POLICY = "gf-client-queues"  # queues clients fill (app.*, MQTT subscriptions): bounded
DEAD_LETTER_LIMITS_POLICY = "gf-dead-letter-limits"  # dead-letters itself: bounded, oldest dropped
JOURNAL_STREAMS_POLICY = "gf-journal-streams"  # gf-fences: the workers' journal streams' retention
FEDERATE_FENCE_IN_POLICY = "gf-federate-x-fence-in"  # gf-fences x-fence.in <- regions
FEDERATE_EVENTS_POLICY = "gf-federate-events"  # gf-ingress amq.topic <- fence.events

# Federation upstreams (runtime parameters of the downstream vhost). An upstream is named
# after the vhost it reads from.
# The federation policy of gf-fences' x-fence.in uses RabbitMQ's implicit upstream set "all":
# every upstream of the vhost, one per region vhost (so gf-fences holds no other upstream).
# Adding or clearing one upstream starts or stops that link alone; changing a named set
# restarts every link of the exchange, which reorders what they were carrying.
REGIONS_UPSTREAM_SET = "all"

# Devices: one RabbitMQ user per tenant's object, `<tenant>.<object_id>`, in gf-ingress,
# tagged so that tools tell them from the sidecar users. MQTT login
# "gf-ingress:<tenant>.<object_id>", MQTT client id the same user name. Gateways: one user per
# tenant's gateway, `<tenant>.<name>`, publishing to ingress.gateway under its tenant's key.
DEVICE_TAG = "gf-device"
GATEWAY_TAG = "gf-gateway"
# Applications: one user per tenant's application, `<tenant>.<name>`, in gf-fences: the AMQP
# fence API, and its own queues `app.<tenant>.<name>.<anything>` bound to its tenant's events
APP_TAG = "gf-app"
APP_QUEUE_PREFIX = "app."
MQTT_SUBSCRIPTION_QUEUE_PREFIX = "mqtt-subscription-"  # + <client_id> + "qos0" / "qos1"
POSITIONS_TOPIC_PREFIX = "positions"  # MQTT positions/<tenant>/<object_id>
EVENTS_TOPIC_PREFIX = "fence-events"  # MQTT fence-events/<tenant>/<fence_id>/<kind>/<object_id>
# MQTT roam-events/<tenant>/<subscription>/<nearby|faraway>/<object_id>
ROAM_EVENTS_TOPIC_PREFIX = "roam-events"
PRESENCE_TOPIC_PREFIX = "presence"  # presence.<tenant>.<fence>.<kind>: shared counts, the platform's


def app_queue_prefix(user: str) -> str:
    """The queues an application user (`<tenant>.<name>`) may declare: `app.<tenant>.<name>.`"""
    return f"{APP_QUEUE_PREFIX}{user}."


def tenant_batch_key(fence_id: str) -> str:
    """The routing key of a batch of a tenant's events on fence.tenant-batches: its tenant."""
    tenant, _ = split(fence_id)
    return tenant or NO_TENANT_WORD


def map_tap_queue(process: str, what: str) -> str:
    """An API process's own queue for the live map (`what`: positions | events)."""
    return f"{MAP_TAP_QUEUE_PREFIX}{process}.{what}"


def upstream_name(vhost: str) -> str:
    """The federation upstream that reads from `vhost`."""
    return vhost
