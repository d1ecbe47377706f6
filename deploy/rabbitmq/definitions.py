"""What RabbitMQ must hold for one `Topology`: pure data, no I/O.

Every name comes from `exchanges.topology`. Everything is durable; nothing here is ever
auto-deleted. The choices, in one place:

Exchanges, queues, bindings (declared by the topology; the sidecars only declare passively):

    gf-ingress     amq.topic --"positions.*.*"--> x-ingress.partition (x-consistent-hash)
                   --"1"--> x-ingress.p00 .. p15, in order (exchanges/ingress_partitions.py)
                   ingress.gateway (topic) --"*"--> x-ingress.batches (key: the gateway's tenant)
                   amq.topic --"positions.*"--> x-ingress.positions, ingress.batches (fanout)
                   --> x-ingress.batches: the contract before tenants, dead-lettered
                   fence.map-positions (fanout): the API binds its own map queue (below)
    gf-region-<r>  x-geo.in (fanout) --> x-geo.positions
                   x-geo.control (fanout) --> x-geo.control
                   x-fence.in (direct): no local queue; the federation link's queue is bound
                   to it by the link itself
    gf-fences      x-fence.in (direct) --"<w>"--> x-fence.<w>
                   x-fence.control (direct) --"<w>"--> x-fence.<w>.control
                   fence.event-batches (fanout) --> fence.archive (the events archiver)
                   fence.event-batches, fence.events "roam-events.#" --> fence.webhooks (the
                   webhooks sidecar)
                   fence.events (topic), fence.event-batches: applications bind their own
                   queues (app.<anything>)
                   fence.map-events (fanout): the API binds its own map queue (below)
    every vhost    dead-letters (fanout) --> dead-letters (a classic queue)

Policies (RabbitMQ applies one policy per queue, the highest priority one that matches, so
each queue group gets one policy carrying all of its settings, and the patterns are disjoint):

    gf-input-limits   (priority 10, queues) the sidecar input queues of the vhost, which
                      are quorum queues (Raft log, fsynced before the publisher's confirm;
                      a per-message delivery count): dead-letter-exchange dead-letters,
                      max-length 1,000,000 messages and 2 GiB, overflow reject-publish (a full queue
                      nacks new publishes: publishers with confirms see it and retry;
                      nothing is dropped silently), delivery-limit 10 (a poison message
                      goes to dead-letters with reason delivery_limit), dead-letter-strategy
                      at-least-once (the dead-lettering itself is confirmed, so it cannot
                      lose the message)
    gf-map-taps       (priority 5, queues, gf-ingress and gf-fences) the live map's queues
                      (fence.map.<process>.<what>, exclusive, declared by each API process):
                      max-length 64 messages, overflow drop-head, no dead-letter exchange. A
                      map shows the newest sample; an old one is worth nothing, so dropping it
                      is the point (and dead-lettering it would fill dead-letters with samples).
    gf-dead-letter-limits (priority 5, queues, ^dead-letters$) dead-letters itself: max-length
                      1,000,000 messages and 256 MiB, overflow drop-head. Bad input is a
                      client's to send: unbounded, one device's garbage could fill the disk
                      and raise the alarm that blocks every publisher. Each dead letter is
                      counted by reason when it is made (geofence_dead_letters_total), so a
                      dropped one is still counted; the alert fires at 80%.
    gf-client-queues  (priority 5, queues) the queues clients declare and nobody else drains:
                      mqtt-subscription-* in gf-ingress (devices', sensors', applications'
                      MQTT subscriptions), app.* in gf-fences (applications' AMQP queues):
                      max-length 100,000 messages and 64 MiB, overflow drop-head, no
                      dead-letter exchange. An idle reader loses its oldest events instead of
                      refusing the pipeline's publishes (which would stall every tenant).
    gf-dead-letters   (priority 0, queues) every other queue of the vhost except the groups
                      above: dead-letter-exchange dead-letters.
    gf-federate-x-fence-in  (gf-fences, exchanges, ^x-fence\\.in$) upstream set "all" (RabbitMQ's
                            implicit set: every upstream of gf-fences, one per region vhost;
                            a region added or removed starts or stops its own link only,
                            where a named set's change restarts every link of the exchange)
    gf-federate-events      (gf-ingress, exchanges, ^amq\\.topic$) upstream gf-fences
                            (its exchange fence.events)

Federation upstreams (ack-mode on-confirm: a message leaves the upstream queue only once
the downstream broker confirmed it; trust-user-id false; max-hops 1). The upstream URI
holds the `federation` user's password in clear: RabbitMQ stores runtime parameters as
given, so `rabbitmqctl list_parameters` and the management API show it to administrators.

Permissions: see `permissions()`. Regexes are anchored and list exact names, so a user can
touch only what its sidecar touches; "^$" grants nothing (the default exchange is called
amq.default in permission checks, so it is not matched either).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from deploy.rabbitmq.federation_links import Endpoint as Endpoint  # re-exported, as amqp_uri
from deploy.rabbitmq.federation_links import amqp_uri as amqp_uri  # re-exported
from deploy.rabbitmq.federation_links import upstream
from exchanges import topology as t
from exchanges.topology import Topology

INPUT_QUEUE_MAX_LENGTH = 1_000_000  # messages; at ~300 B each, ~300 MB of backlog per queue
# A message handed to consumers this many times without an ack is dead-lettered by the broker
# (reason delivery_limit). Every delivery a consumer did not settle counts (a crash, a
# connection cut, a broker restart), so the limit is well above what faults alone reach; a
# sidecar takes messages delivered twice or more one at a time (exchanges.shell.Intake), so
# a message that kills it only ever drags itself towards the limit.
DELIVERY_LIMIT = 10
QUORUM = "quorum"
STREAM = "stream"
# A worker's journal stream (issue 38, exchanges/replica_log.py) keeps its newest snapshots and
# the records between them: a snapshot of ~300k objects is ~30 MB, a generation's records up to
# 64 MB (exchanges/state_dir.py's rotation); whole segments go, oldest first.
JOURNAL_STREAM_MAX_BYTES = 1024**3
JOURNAL_STREAM_SEGMENT_BYTES = 64 * 1024**2
JOURNAL_STREAMS_PRIORITY = 10
INPUT_QUEUE_MAX_BYTES = 2 * 1024**3  # the same bound in bytes: a backlog of big gateway batches
# Queues a client fills and no sidecar drains (issue 37): a device's garbage dead-lettered, an
# application's or a device's subscription that nobody reads. Bounded in messages and bytes,
# the oldest dropped (drop-head): a full one never refuses the pipeline's publishes (that
# would stall every tenant's events behind one idle reader), and the GeofenceQueueNearLimit
# alert (deploy/prometheus/rules.yml) fires at 80% of either bound.
DEAD_LETTER_MAX_LENGTH = 1_000_000
DEAD_LETTER_MAX_BYTES = 256 * 1024**2
CLIENT_QUEUE_MAX_LENGTH = 100_000
CLIENT_QUEUE_MAX_BYTES = 64 * 1024**2
INPUT_LIMITS_PRIORITY = 10
MAP_TAPS_PRIORITY = 5
CLIENT_QUEUES_PRIORITY = 5
DEAD_LETTER_LIMITS_PRIORITY = 5
MAP_TAP_MAX_LENGTH = 64  # messages: a few seconds of samples and event batches
DEAD_LETTER_PRIORITY = 0
FEDERATION_PRIORITY = 0
NOTHING = "^$"
EVERYTHING = ".*"
FEDERATION_PREFIX = "federation: "  # queues and exchanges a federation link creates upstream
DEFAULT_VHOST = "/"
DEFAULT_EXCHANGE = "amq.default"  # the name permission checks give the default exchange
ADMIN_TAGS = ("administrator",)
_REGEX_SPECIALS = frozenset(".^$*+?{}[]\\|()")


@dataclass(frozen=True)
class User:
    name: str
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Permission:
    user: str
    vhost: str
    configure: str
    write: str
    read: str


@dataclass(frozen=True)
class TopicPermission:
    user: str
    vhost: str
    exchange: str
    write: str
    read: str


@dataclass(frozen=True)
class Exchange:
    vhost: str
    name: str
    type: str


@dataclass(frozen=True)
class Queue:
    vhost: str
    name: str
    type: str = "classic"  # quorum | classic (a queue's type is fixed when it is declared)
    # x-single-active-consumer (fixed at declaration too): the broker hands the queue to one
    # consumer at a time, the next one only once the last one's unacked messages are back in
    # it, so per-object order holds across a consumer's death by the broker's own rule (a
    # cluster node lost included: see SHARED_INPUT_QUEUES)
    single_active: bool = False


QUEUE_DESTINATION, EXCHANGE_DESTINATION = "q", "e"  # the management API's words
@dataclass(frozen=True)
class Binding:
    vhost: str
    source: str
    queue: str  # the destination: a queue, or an exchange (destination_type "e")
    routing_key: str
    destination_type: str = QUEUE_DESTINATION


@dataclass(frozen=True)
class Parameter:
    vhost: str
    component: str  # federation-upstream | federation-upstream-set
    name: str
    value: Any  # JSON


@dataclass(frozen=True)
class Policy:
    vhost: str
    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int
    apply_to: str  # queues | exchanges


@dataclass(frozen=True)
class Definitions:
    topology: Topology
    vhosts: tuple[str, ...]
    users: tuple[User, ...]
    permissions: tuple[Permission, ...]
    exchanges: tuple[Exchange, ...]
    queues: tuple[Queue, ...]
    bindings: tuple[Binding, ...]
    retired_bindings: tuple[Binding, ...]
    parameters: tuple[Parameter, ...]
    policies: tuple[Policy, ...]
    retired_users: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["topology"] = {"regions": list(self.topology.regions),
                            "workers": list(self.topology.workers)}
        return data

    def held_by(self, vhosts: Iterable[str], parameters: bool) -> Definitions:
        """What one broker holds of these definitions: its vhosts and what lives in them,
        every user, and the federation parameters only where the links end (`parameters`)."""
        keep = set(vhosts)
        return dataclasses.replace(
            self, vhosts=tuple(v for v in self.vhosts if v in keep),
            permissions=tuple(p for p in self.permissions if p.vhost in keep),
            exchanges=tuple(x for x in self.exchanges if x.vhost in keep),
            queues=tuple(q for q in self.queues if q.vhost in keep),
            bindings=tuple(b for b in self.bindings if b.vhost in keep),
            retired_bindings=tuple(b for b in self.retired_bindings if b.vhost in keep),
            parameters=tuple(p for p in self.parameters if p.vhost in keep) if parameters else (),
            policies=tuple(p for p in self.policies if p.vhost in keep))

    def digest(self, passwords: Mapping[str, str]) -> str:
        """A hash of everything `apply` would set, passwords included (only hashed)."""
        body = json.dumps({"definitions": self.to_json(), "passwords": dict(sorted(passwords.items()))},
                          sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()


# --------------------------------------------------------------------------- regexes


def regex_escape(name: str) -> str:
    """`name` as a regex literal, escaping only what is special (so '-' stays readable)."""
    return "".join("\\" + c if c in _REGEX_SPECIALS else c for c in name)


def exactly(*names: str) -> str:
    """A regex matching exactly these names: "^name$" or "^(a|b)$"."""
    unique = list(dict.fromkeys(names))
    if not unique:
        return NOTHING
    alternatives = "|".join(regex_escape(n) for n in unique)
    return f"^{alternatives}$" if len(unique) == 1 else f"^({alternatives})$"


def all_but(*names: str, prefixes: tuple[str, ...] = ()) -> str:
    """A regex matching every name except exactly these and those a prefix starts and goes
    on from (a negative lookahead)."""
    alternatives = "|".join(regex_escape(n) for n in dict.fromkeys(names))
    starts = "".join(f"|{prefixed(p)}" for p in dict.fromkeys(prefixes))
    return f"^(?!({alternatives})${starts})"


def prefixed(prefix: str) -> str:
    """A regex part (unanchored) for the names that start with `prefix`."""
    return f"{regex_escape(prefix)}.+"


def either(*patterns: str) -> str:
    """One anchored regex matching what any of these anchored ones (^...$) matches."""
    inner = [p[1:-1] for p in patterns if p != NOTHING]
    return f"^({'|'.join(inner)})$" if inner else NOTHING


def federation_read(upstream_exchange: str) -> str:
    return f"^({regex_escape(FEDERATION_PREFIX)}.*|{regex_escape(upstream_exchange)})$"


# --------------------------------------------------------------------------- per vhost


def region_vhosts(topology: Topology) -> tuple[str, ...]:
    return tuple(t.region_vhost(r) for r in topology.regions)


# The input queues whose sidecar runs as one instance (its InstanceLock) and consumes in order:
# single active consumer. Not the API's (fence.api, fence.follow). Why the broker's rule rather
# than the sidecar's wait for its predecessor's consumer to go: RabbitMQ 3.10's quorum queues
# keep listing a consumer whose node died ("suspected down", its messages returned) until the
# node is back, then make it a consumer again for a moment, handing it messages that come back
# behind newer ones; a single-active-consumer queue parks it among the waiting ones instead.
SHARED_INPUT_QUEUES = frozenset({t.API_QUEUE, t.FOLLOW_QUEUE})


def input_queues(topology: Topology, vhost: str) -> tuple[str, ...]:
    """The queues sidecars consume in `vhost` (the gf-input-limits policy's group)."""
    if vhost == t.INGRESS_VHOST:
        return (*t.PARTITION_QUEUES, t.POSITIONS_QUEUE, t.BATCHES_QUEUE, t.PROXIMITY_QUEUE, t.FOLLOW_QUEUE,
                t.SENSORS_QUEUE, t.NOTIFY_QUEUE, t.HIVE_EVENTS_QUEUE)
    if vhost == t.FENCES_VHOST:
        return (*(q for w in topology.workers for q in (t.fence_queue(w), t.fence_control_queue(w))),
                t.ARCHIVE_QUEUE, t.WEBHOOKS_QUEUE, t.API_QUEUE)
    if vhost in region_vhosts(topology):
        return (t.GEO_POSITIONS_QUEUE, t.GEO_CONTROL_QUEUE)
    raise ValueError(f"{vhost!r} is not a vhost of this topology")


def client_queue_prefixes(vhost: str) -> tuple[str, ...]:
    """The queues clients declare in `vhost` (the gf-client-queues policy's group): the MQTT
    plugin's subscription queues of devices, sensors and applications in gf-ingress, the
    applications' own `app.<user>.*` queues in gf-fences."""
    if vhost == t.INGRESS_VHOST:
        return (t.MQTT_SUBSCRIPTION_QUEUE_PREFIX,)
    if vhost == t.FENCES_VHOST:
        return (t.APP_QUEUE_PREFIX,)
    return ()


def _exchange(vhost: str, name: str) -> Exchange:
    return Exchange(vhost, name, t.EXCHANGE_TYPES[name])


def exchanges(topology: Topology) -> tuple[Exchange, ...]:
    found = [_exchange(t.INGRESS_VHOST, t.GATEWAY_EXCHANGE),
             _exchange(t.INGRESS_VHOST, t.PARTITION_EXCHANGE),
             _exchange(t.INGRESS_VHOST, t.RETIRED_BATCHES_EXCHANGE),
             _exchange(t.INGRESS_VHOST, t.FOLLOW_EXCHANGE),
             _exchange(t.INGRESS_VHOST, t.OCCUPANCY_EXCHANGE),
             _exchange(t.INGRESS_VHOST, t.MAP_POSITIONS_EXCHANGE)]
    for v in region_vhosts(topology):
        found += [_exchange(v, t.GEO_IN_EXCHANGE), _exchange(v, t.GEO_CONTROL_EXCHANGE),
                  _exchange(v, t.FENCE_IN_EXCHANGE)]
    found += [_exchange(t.FENCES_VHOST, name) for name in (
        t.FENCE_IN_EXCHANGE, t.FENCE_CONTROL_EXCHANGE, t.EVENTS_EXCHANGE, t.EVENT_BATCHES_EXCHANGE,
        t.TENANT_BATCHES_EXCHANGE, t.API_EXCHANGE, t.MAP_EVENTS_EXCHANGE)]
    found += [_exchange(v, t.DEAD_LETTER_EXCHANGE) for v in topology.vhosts]
    return tuple(found)


def journal_streams(topology: Topology) -> tuple[str, ...]:
    """The workers' journal streams in gf-fences (their backups read them)."""
    return tuple(t.fence_journal_queue(w) for w in topology.workers)


def queues(topology: Topology) -> tuple[Queue, ...]:
    return (*(q for v in topology.vhosts
              for q in (*(Queue(v, name, QUORUM, name not in SHARED_INPUT_QUEUES)
                          for name in input_queues(topology, v)),
                        Queue(v, t.DEAD_LETTER_QUEUE))),
            *(Queue(t.FENCES_VHOST, name, STREAM) for name in journal_streams(topology)))


def bindings(topology: Topology) -> tuple[Binding, ...]:
    found = [Binding(t.INGRESS_VHOST, t.MQTT_TOPIC_EXCHANGE, t.PARTITION_EXCHANGE, t.POSITIONS_TOPIC_PATTERN,
                     EXCHANGE_DESTINATION),  # then weight 1 each, in bucket order:
             *(Binding(t.INGRESS_VHOST, t.PARTITION_EXCHANGE, q, "1") for q in t.PARTITION_QUEUES),
             Binding(t.INGRESS_VHOST, t.GATEWAY_EXCHANGE, t.BATCHES_QUEUE, t.GATEWAY_TOPIC_PATTERN),
             # the contract before tenants (MQTT positions/<id>, ingress.batches): still bound,
             # so what a device or gateway not moved yet sends is dead-lettered by x-ingress with
             # the reason (no tenant), never dropped as unroutable
             Binding(t.INGRESS_VHOST, t.MQTT_TOPIC_EXCHANGE, t.POSITIONS_QUEUE, t.RETIRED_POSITIONS_PATTERN),
             Binding(t.INGRESS_VHOST, t.RETIRED_BATCHES_EXCHANGE, t.BATCHES_QUEUE, ""),
             Binding(t.INGRESS_VHOST, t.FOLLOW_EXCHANGE, t.FOLLOW_QUEUE, ""),
             Binding(t.INGRESS_VHOST, t.MQTT_TOPIC_EXCHANGE, t.SENSORS_QUEUE, t.SENSORS_TOPIC_PATTERN),
             Binding(t.INGRESS_VHOST, t.OCCUPANCY_EXCHANGE, t.NOTIFY_QUEUE, f"{t.OCCUPANCY_TOPIC_PREFIX}.#"),
             Binding(t.FENCES_VHOST, t.EVENT_BATCHES_EXCHANGE, t.ARCHIVE_QUEUE, ""),
             Binding(t.FENCES_VHOST, t.EVENT_BATCHES_EXCHANGE, t.WEBHOOKS_QUEUE, ""),
             Binding(t.FENCES_VHOST, t.EVENTS_EXCHANGE, t.WEBHOOKS_QUEUE, f"{t.ROAM_EVENTS_TOPIC_PREFIX}.#"),
             Binding(t.FENCES_VHOST, t.API_EXCHANGE, t.API_QUEUE, "")]
    for v in region_vhosts(topology):
        found += [Binding(v, t.GEO_IN_EXCHANGE, t.GEO_POSITIONS_QUEUE, ""),
                  Binding(v, t.GEO_CONTROL_EXCHANGE, t.GEO_CONTROL_QUEUE, "")]
    for w in topology.workers:
        found += [Binding(t.FENCES_VHOST, t.FENCE_IN_EXCHANGE, t.fence_queue(w), w),
                  Binding(t.FENCES_VHOST, t.FENCE_CONTROL_EXCHANGE, t.fence_control_queue(w), w)]
    found += [Binding(v, t.DEAD_LETTER_EXCHANGE, t.DEAD_LETTER_QUEUE, "") for v in topology.vhosts]
    return tuple(found)


# Bindings an earlier topology declared that must go where a broker still has them: the plan
# removes them (a binding holds no message; exchanges and queues are never removed). MQTT
# positions went to one queue for one x-ingress before they were partitioned (issue 39).
RETIRED_BINDINGS = (
    Binding(t.INGRESS_VHOST, t.MQTT_TOPIC_EXCHANGE, t.POSITIONS_QUEUE, t.POSITIONS_TOPIC_PATTERN),
    # the archive took every event of fence.events one by one; it takes fence.event-batches now
    Binding(t.FENCES_VHOST, t.EVENTS_EXCHANGE, t.ARCHIVE_QUEUE, "#"),
)
# Users an earlier topology declared that must go (the plan deletes them where they exist):
# the one gateway user every gateway shared, of no tenant (gateways are per tenant now,
# `geofence gateway add NAME --tenant T`, deploy/rabbitmq/devices.py), and the one application
# user every application shared, which read every tenant's events (`geofence app add`)
RETIRED_USERS = (t.GATEWAY_USER, t.CLIENT_USER)


# --------------------------------------------------------------------------- users


SIDECAR_USERS = (t.INGRESS_USER, t.GEO_USER, t.FENCE_USER, t.MANAGER_USER, t.FEDERATION_USER,
                 t.ARCHIVER_USER, t.VENUES_USER, t.WEBHOOKS_USER)


def users() -> tuple[User, ...]:
    return (User(t.ADMIN_USER, ADMIN_TAGS), *(User(name) for name in SIDECAR_USERS))


def permissions(topology: Topology) -> tuple[Permission, ...]:
    """Each user's (configure, write, read) regexes per vhost.

    Publishing needs write on the exchange, consuming read on the queue; a passive declare
    needs nothing, so the sidecars' only configure right is their instance lock. The federation user
    declares its own queue and exchange upstream ("federation: ...", configure), binds them
    (write on the destination, read on the source) and consumes its queue.
    """
    ingress, fences, regions = t.INGRESS_VHOST, t.FENCES_VHOST, region_vhosts(topology)
    dlx = t.DEAD_LETTER_EXCHANGE
    fed = f"^{regex_escape(FEDERATION_PREFIX)}"
    found = [Permission(t.ADMIN_USER, v, EVERYTHING, EVERYTHING, EVERYTHING)
             for v in (DEFAULT_VHOST, *topology.vhosts)]
    # configure: only each role's instance lock (an exclusive queue, see exchanges/shell/connections.py)
    # instance N's lock: lock.x-ingress-N; the default exchange: hand-ons (ingress/partition_split.py)
    found.append(Permission(t.INGRESS_USER, ingress, f"^{regex_escape(t.INGRESS_LOCK)}(-[0-9]+)?$",
                            exactly(dlx, t.FOLLOW_EXCHANGE, t.MAP_POSITIONS_EXCHANGE, DEFAULT_EXCHANGE),
                            exactly(*t.PARTITION_QUEUES, t.POSITIONS_QUEUE, t.BATCHES_QUEUE,
                                    t.PROXIMITY_QUEUE)))
    found += [Permission(t.INGRESS_USER, v, NOTHING, exactly(t.GEO_IN_EXCHANGE, dlx), NOTHING)
              for v in regions]
    # proximity rows and subscriptions straight to the workers' queues (ingress/proximity.py)
    found.append(Permission(t.INGRESS_USER, fences, NOTHING, exactly(t.FENCE_IN_EXCHANGE), NOTHING))
    # x-geo and x-fence answer `geofence inspect` requests on the default exchange (amq.default)
    found += [Permission(t.GEO_USER, v, exactly(t.GEO_LOCK),
                         exactly(t.FENCE_IN_EXCHANGE, dlx, DEFAULT_EXCHANGE),
                         exactly(*input_queues(topology, v))) for v in regions]
    locks = exactly(*(lock for w in topology.workers for lock in (t.fence_lock(w), t.fence_home_lock(w))))
    found.append(Permission(t.FENCE_USER, fences, locks,
                            exactly(t.EVENTS_EXCHANGE, t.EVENT_BATCHES_EXCHANGE, t.TENANT_BATCHES_EXCHANGE,
                                    t.MAP_EVENTS_EXCHANGE, dlx, DEFAULT_EXCHANGE),
                            # its own input, control and journal queues only, not the archive's nor the API's
                            exactly(*(q for w in topology.workers
                                      for q in (t.fence_queue(w), t.fence_control_queue(w),
                                                t.fence_journal_queue(w))))))
    found += [Permission(t.MANAGER_USER, v, NOTHING, exactly(t.GEO_CONTROL_EXCHANGE), NOTHING)
              for v in regions]
    # the fence service: control, its API queue (answers on the default exchange), the follow tap;
    # the live map's own queues (declared exclusive: configure; bound: write on the queue, read on
    # the exchange; consumed: read)
    taps = f"^{prefixed(t.MAP_TAP_QUEUE_PREFIX)}$"
    found.append(Permission(t.MANAGER_USER, fences, taps,
                            either(exactly(t.FENCE_CONTROL_EXCHANGE, dlx, DEFAULT_EXCHANGE), taps),
                            either(exactly(t.API_QUEUE, t.MAP_EVENTS_EXCHANGE), taps)))
    # ... and in gf-ingress the follow tap, and sensor configurations on amq.topic (fence/venues/commands.py)
    found.append(Permission(t.MANAGER_USER, ingress, taps, either(exactly(dlx, t.MQTT_TOPIC_EXCHANGE), taps),
                            either(exactly(t.FOLLOW_QUEUE, t.MAP_POSITIONS_EXCHANGE), taps)))
    found.append(Permission(t.ARCHIVER_USER, fences, NOTHING, exactly(dlx), exactly(t.ARCHIVE_QUEUE)))
    # one deliverer at a time by a PostgreSQL lock (fence/webhooks/sidecar.py), no broker lock
    found.append(Permission(t.WEBHOOKS_USER, fences, NOTHING, exactly(dlx), exactly(t.WEBHOOKS_QUEUE)))
    # the sensor sidecar: its frames in, occupancy out (AMQP and MQTT), configurations to sensors
    # and binds its queue of hive fences' events to amq.topic (write on the queue, read on amq.topic)
    found.append(Permission(t.VENUES_USER, ingress, exactly(t.VENUES_LOCK),
                            exactly(dlx, t.OCCUPANCY_EXCHANGE, t.MQTT_TOPIC_EXCHANGE, t.HIVE_EVENTS_QUEUE),
                            exactly(t.SENSORS_QUEUE, t.NOTIFY_QUEUE, t.HIVE_EVENTS_QUEUE,
                                    t.MQTT_TOPIC_EXCHANGE)))
    # applications are each a tenant's own user (`app_permission`, `geofence app add`)
    found += [Permission(t.FEDERATION_USER, v, fed, fed, federation_read(t.FENCE_IN_EXCHANGE))
              for v in regions]
    found.append(Permission(t.FEDERATION_USER, fences, fed, fed,
                            federation_read(t.EVENTS_EXCHANGE)))
    return tuple(found)


def user_vhosts(topology: Topology) -> dict[str, tuple[str, ...]]:
    """The vhosts each sidecar user may use (the admin user is left out)."""
    found: dict[str, list[str]] = {u: [] for u in SIDECAR_USERS}
    for p in permissions(topology):
        if p.user in found:
            found[p.user].append(p.vhost)
    return {u: tuple(vs) for u, vs in found.items()}


# --------------------------------------------------------------------------- federation, policies


def parameters(topology: Topology, endpoint: Endpoint, federation_password: str,
               elsewhere: Mapping[str, Endpoint] | None = None) -> tuple[Parameter, ...]:
    """`elsewhere`: region vhosts held by another broker (the upstream connects there)."""
    regions = region_vhosts(topology)
    away = elsewhere or {}
    found = [Parameter(t.FENCES_VHOST, "federation-upstream", t.upstream_name(v),
                       upstream(away.get(v, endpoint), federation_password, v, t.FENCE_IN_EXCHANGE))
             for v in regions]
    found.append(Parameter(t.INGRESS_VHOST, "federation-upstream", t.upstream_name(t.FENCES_VHOST),
                           upstream(endpoint, federation_password, t.FENCES_VHOST,
                                    t.EVENTS_EXCHANGE)))
    return tuple(found)


def policies(topology: Topology) -> tuple[Policy, ...]:
    dlx = {"dead-letter-exchange": t.DEAD_LETTER_EXCHANGE}
    limits = {**dlx, "max-length": INPUT_QUEUE_MAX_LENGTH, "max-length-bytes": INPUT_QUEUE_MAX_BYTES,
              "overflow": "reject-publish", "delivery-limit": DELIVERY_LIMIT,
              "dead-letter-strategy": "at-least-once"}
    client_limits = {"max-length": CLIENT_QUEUE_MAX_LENGTH, "max-length-bytes": CLIENT_QUEUE_MAX_BYTES,
                     "overflow": "drop-head"}
    found: list[Policy] = []
    for v in topology.vhosts:
        group = input_queues(topology, v)
        found.append(Policy(v, t.INPUT_LIMITS_POLICY, exactly(*group), limits,
                            INPUT_LIMITS_PRIORITY, "queues"))
        found.append(Policy(v, t.DEAD_LETTER_LIMITS_POLICY, exactly(t.DEAD_LETTER_QUEUE),
                            {"max-length": DEAD_LETTER_MAX_LENGTH, "max-length-bytes": DEAD_LETTER_MAX_BYTES,
                             "overflow": "drop-head"}, DEAD_LETTER_LIMITS_PRIORITY, "queues"))
        taps: tuple[str, ...] = ()
        if v in (t.INGRESS_VHOST, t.FENCES_VHOST):
            taps = (t.MAP_TAP_QUEUE_PREFIX,)
            found.append(Policy(v, t.MAP_TAPS_POLICY, f"^{prefixed(t.MAP_TAP_QUEUE_PREFIX)}$",
                                {"max-length": MAP_TAP_MAX_LENGTH, "overflow": "drop-head"},
                                MAP_TAPS_PRIORITY, "queues"))
        clients = client_queue_prefixes(v)
        if clients:  # no dead-letter exchange: what a full one drops would flood dead-letters
            found.append(Policy(v, t.CLIENT_QUEUES_POLICY, either(*(f"^{prefixed(p)}$" for p in clients)),
                                client_limits, CLIENT_QUEUES_PRIORITY, "queues"))
        streams = journal_streams(topology) if v == t.FENCES_VHOST else ()
        if streams:  # retention: no dead-lettering on a stream (nothing leaves it but old segments)
            found.append(Policy(v, t.JOURNAL_STREAMS_POLICY, exactly(*streams),
                                {"max-length-bytes": JOURNAL_STREAM_MAX_BYTES,
                                 "stream-max-segment-size-bytes": JOURNAL_STREAM_SEGMENT_BYTES},
                                JOURNAL_STREAMS_PRIORITY, "queues"))
        found.append(Policy(v, t.DEAD_LETTER_POLICY,
                            all_but(t.DEAD_LETTER_QUEUE, *group, *streams, prefixes=(*taps, *clients)), dlx,
                            DEAD_LETTER_PRIORITY, "queues"))
    found.append(Policy(t.FENCES_VHOST, t.FEDERATE_FENCE_IN_POLICY, exactly(t.FENCE_IN_EXCHANGE),
                        {"federation-upstream-set": t.REGIONS_UPSTREAM_SET}, FEDERATION_PRIORITY,
                        "exchanges"))
    found.append(Policy(t.INGRESS_VHOST, t.FEDERATE_EVENTS_POLICY, exactly(t.MQTT_TOPIC_EXCHANGE),
                        {"federation-upstream": t.upstream_name(t.FENCES_VHOST)},
                        FEDERATION_PRIORITY, "exchanges"))
    return tuple(found)


def build(topology: Topology, endpoint: Endpoint, federation_password: str,
          elsewhere: Mapping[str, Endpoint] | None = None) -> Definitions:
    """Everything of `topology`; `elsewhere`: the region vhosts another broker holds (their
    federation upstreams connect there; `Definitions.held_by` splits the rest by broker)."""
    if not topology.regions or not topology.workers:
        raise ValueError("a topology needs at least one region and one worker")
    return Definitions(
        topology=topology,
        vhosts=topology.vhosts,
        users=users(),
        permissions=permissions(topology),
        exchanges=exchanges(topology),
        queues=queues(topology),
        bindings=bindings(topology),
        retired_bindings=RETIRED_BINDINGS,
        retired_users=RETIRED_USERS,
        parameters=parameters(topology, endpoint, federation_password, elsewhere),
        policies=policies(topology),
    )


def matching_policy(pols: Iterable[Policy], vhost: str, name: str, apply_to: str) -> Policy | None:
    """The policy RabbitMQ applies to a queue or exchange: the highest priority match
    (ties are broken by RabbitMQ arbitrarily; the topology has none)."""
    found = [p for p in pols if p.vhost == vhost and p.apply_to in (apply_to, "all")
             and re.search(p.pattern, name)]
    return max(found, key=lambda p: p.priority, default=None)

