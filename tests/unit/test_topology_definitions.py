"""deploy.rabbitmq.definitions without a broker: names, policies, permission regexes.

Regexes are checked with Python's `re`; the subset used (anchors, alternation, character
classes, a negative lookahead) means the same in RabbitMQ's PCRE (Erlang `re`), which, like
`re.search`, looks for a match anywhere unless anchored. Bindings are matched the way a topic
exchange matches (`topic_matches`: `*` one word, `#` zero or more).

Tenants (exchanges/tenancy.py): a device is the user `<tenant>.<object_id>`, a gateway
`<tenant>.<name>`; their topic permissions allow their own tenant's routing keys only, and a
user without a topic permission on a topic exchange it may write would be allowed every key
(RabbitMQ checks nothing then), so each such exchange has one.
"""

from __future__ import annotations

import re

import pytest

from deploy.rabbitmq import credentials as cred
from deploy.rabbitmq import definitions as d
from exchanges import topology as t
from exchanges.ids import check_object_id
from exchanges.topology import Topology

ENDPOINT = d.Endpoint("127.0.0.1", 5672)
DEVICE = "acme.dev-1"  # tenant acme's device dev-1
GATEWAY = "acme.gw-1"  # tenant acme's gateway gw-1
DEFAULT = d.build(Topology(), ENDPOINT, "fed-Pw/1")
BIG = d.build(Topology(regions=("a", "b", "eu-1"), workers=("w0", "w1", "w2")), ENDPOINT, "x")


def perm(defs: d.Definitions, user: str, vhost: str) -> d.Permission | None:
    found = [p for p in defs.permissions if p.user == user and p.vhost == vhost]
    assert len(found) <= 1
    return found[0] if found else None


def may(defs: d.Definitions, user: str, vhost: str, right: str, resource: str) -> bool:
    p = perm(defs, user, vhost)
    return p is not None and re.search(getattr(p, right), resource) is not None


def topic_matches(pattern: str, key: str) -> bool:
    """A topic exchange's match of a binding key against a routing key."""
    def match(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return match(p[1:], k) or (bool(k) and match(p, k[1:]))
        return bool(k) and p[0] in ("*", k[0]) and match(p[1:], k[1:])

    return match(pattern.split(".") if pattern else [], key.split(".") if key else [])


def test_topic_matches() -> None:
    assert topic_matches("positions.*.*", "positions.acme.car-1")
    assert not topic_matches("positions.*.*", "positions.car-1")
    assert topic_matches("a.#", "a") and topic_matches("a.#.b", "a.x.y.b") and not topic_matches("a.*", "a")
    assert not topic_matches("*", "")


# --------------------------------------------------------------------------- names


def test_default_topology_names() -> None:
    assert DEFAULT.vhosts == ("gf-ingress", "gf-region-a", "gf-region-b", "gf-fences")
    assert {(q.vhost, q.name) for q in DEFAULT.queues} == {
        *(("gf-ingress", f"x-ingress.{q}") for q in ("positions", "batches", "proximity")),
        *(("gf-ingress", f"x-ingress.p{i:02d}") for i in range(16)), ("gf-ingress", "fence.follow"),
        ("gf-ingress", "venue.sensors"), ("gf-ingress", "venue.notify"), ("gf-ingress", "venue.fence-events"),
        ("gf-ingress", "dead-letters"),
        ("gf-region-a", "x-geo.positions"), ("gf-region-a", "x-geo.control"),
        ("gf-region-a", "dead-letters"),
        ("gf-region-b", "x-geo.positions"), ("gf-region-b", "x-geo.control"),
        ("gf-region-b", "dead-letters"),
        *(("gf-fences", f"x-fence.{w}{q}") for w in ("w0", "w1") for q in ("", ".control", ".journal")),
        *(("gf-fences", q) for q in ("fence.archive", "fence.webhooks", "fence.api", "dead-letters"))}
    assert d.Exchange("gf-fences", "x-fence.in", "direct") in DEFAULT.exchanges
    assert d.Exchange("gf-region-b", "x-fence.in", "direct") in DEFAULT.exchanges
    assert all(d.Exchange(v, "dead-letters", "fanout") in DEFAULT.exchanges for v in DEFAULT.vhosts)
    assert not [x for x in DEFAULT.exchanges if x.name.startswith("amq.")]  # RabbitMQ's own


def test_bindings_route_what_the_names_say() -> None:
    # devices: MQTT positions/<tenant>/<object_id>; gateways: ingress.gateway, key = their tenant
    assert d.Binding("gf-ingress", "amq.topic", "x-ingress.partition", "positions.*.*", "e") in DEFAULT.bindings  # noqa: E501
    assert d.Binding("gf-ingress", "ingress.gateway", "x-ingress.batches", "*") in DEFAULT.bindings
    assert d.Exchange("gf-ingress", "ingress.gateway", "topic") in DEFAULT.exchanges
    # the contract before tenants still reaches x-ingress, which dead-letters it with the reason
    assert d.Binding("gf-ingress", "amq.topic", "x-ingress.positions", "positions.*") in DEFAULT.bindings
    assert d.Binding("gf-ingress", "ingress.batches", "x-ingress.batches", "") in DEFAULT.bindings
    assert d.Exchange("gf-ingress", "ingress.batches", "fanout") in DEFAULT.exchanges
    assert d.Binding("gf-fences", "x-fence.in", "x-fence.w1", "w1") in DEFAULT.bindings
    assert d.Binding("gf-fences", "x-fence.control", "x-fence.w0.control", "w0") in DEFAULT.bindings
    assert d.Binding("gf-fences", "fence.event-batches", "fence.archive", "") in DEFAULT.bindings
    assert d.Binding("gf-fences", "fence.events", "fence.archive", "#") not in DEFAULT.bindings
    assert d.Binding("gf-fences", "fence.events", "fence.archive", "#") in DEFAULT.retired_bindings
    assert d.Binding("gf-fences", "fence.api", "fence.api", "") in DEFAULT.bindings
    assert d.Binding("gf-ingress", "fence.follow", "fence.follow", "") in DEFAULT.bindings
    assert d.Binding("gf-ingress", "amq.topic", "venue.sensors", "sensors.#") in DEFAULT.bindings
    assert d.Exchange("gf-ingress", "venue.occupancy", "topic") in DEFAULT.exchanges
    declared = {(x.vhost, x.name) for x in DEFAULT.exchanges} | {(v, "amq.topic") for v in DEFAULT.vhosts}
    queues = {(q.vhost, q.name) for q in DEFAULT.queues}
    for b in DEFAULT.bindings:
        assert (b.vhost, b.source) in declared and (b.vhost, b.queue) in (queues | declared)


@pytest.mark.parametrize(("key", "queues"), [
    ("positions.acme.car-1", ["x-ingress.partition"]),  # then the object's partition queue
    ("positions.car-1", ["x-ingress.positions"]),  # no tenant: refused there, with the reason
    ("positions.acme.car-1.x", []),
    ("sensors.s-1.counter", ["venue.sensors"]),
])
def test_what_amq_topic_of_gf_ingress_delivers_to_the_topologys_queues(key: str, queues: list[str]) -> None:
    bound = [b for b in DEFAULT.bindings if (b.vhost, b.source) == ("gf-ingress", "amq.topic")]
    assert sorted({b.queue for b in bound if topic_matches(b.routing_key, key)}) == queues
    # each key reaches x-ingress by one binding at most (a message is queued once anyway)
    to_ingress = [b for b in bound if b.queue == "x-ingress.positions" and topic_matches(b.routing_key, key)]
    assert len(to_ingress) <= 1


def test_a_gateway_batch_reaches_x_ingress_under_its_tenants_key_only() -> None:
    bound = [b for b in DEFAULT.bindings if (b.vhost, b.source) == ("gf-ingress", "ingress.gateway")]
    assert [b.queue for b in bound if topic_matches(b.routing_key, "acme")] == ["x-ingress.batches"]
    assert not [b for b in bound if topic_matches(b.routing_key, "acme.x")]
    assert not [b for b in bound if topic_matches(b.routing_key, "")]


def test_workers_and_regions_are_parameters() -> None:
    assert "gf-region-eu-1" in BIG.vhosts
    assert d.Queue("gf-fences", "x-fence.w2.control", "quorum", single_active=True) in BIG.queues
    upstreams = [p.name for p in BIG.parameters if p.component == "federation-upstream"
                 and p.vhost == "gf-fences"]
    assert upstreams == ["gf-region-a", "gf-region-b", "gf-region-eu-1"]
    assert may(BIG, t.FENCE_USER, "gf-fences", "read", "x-fence.w2")
    assert may(BIG, t.GEO_USER, "gf-region-eu-1", "write", "x-fence.in")


def test_a_topology_needs_a_region_and_a_worker() -> None:
    with pytest.raises(ValueError, match="at least one region"):
        d.build(Topology(regions=()), ENDPOINT, "x")


# --------------------------------------------------------------------------- policies


@pytest.mark.parametrize("defs", [DEFAULT, BIG], ids=["default", "big"])
def test_each_queue_gets_exactly_one_policy_with_all_its_settings(defs: d.Definitions) -> None:
    queue_policies = [p for p in defs.policies if p.apply_to == "queues"]
    others = ["amq.gen-AbC", "federation: x-fence.in -> rabbit@h:gf-fences:x-fence.in",
              "mqtt-subscription-dev1qos1", "x-ingress.positions.old", "my-app.events",
              "fence.map.vm-12.positions", "fence.map.vm-12.events", "fence.mapping", "fence.map",
              "app.t1.crm.events", "app.", "xapp.t1.crm", "dead-letters2", "mqtt-subscription-"]
    client = {"max-length": 100_000, "max-length-bytes": 64 * 1024**2, "overflow": "drop-head"}
    for vhost in defs.vhosts:
        inputs = d.input_queues(defs.topology, vhost)
        for name in (*inputs, "dead-letters", *others):
            matching = [p for p in queue_policies if p.vhost == vhost and re.search(p.pattern, name)]
            if name == "dead-letters":  # bounded, oldest dropped, no dead-lettering loop
                assert [(p.name, p.definition) for p in matching] == [(t.DEAD_LETTER_LIMITS_POLICY, {
                    "max-length": 1_000_000, "max-length-bytes": 256 * 1024**2, "overflow": "drop-head"})]
            elif name.startswith(t.MAP_TAP_QUEUE_PREFIX):
                if vhost in ("gf-ingress", "gf-fences"):
                    assert [p.name for p in matching] == [t.MAP_TAPS_POLICY]
                    assert matching[0].definition == {"max-length": 64, "overflow": "drop-head"}
                else:
                    assert [p.name for p in matching] == [t.DEAD_LETTER_POLICY]
            elif any(vhost == v and name.startswith(p) and name != p
                     for v, p in (("gf-ingress", "mqtt-subscription-"), ("gf-fences", "app."))):
                assert [(p.name, p.definition) for p in matching] == [(t.CLIENT_QUEUES_POLICY, client)]
            elif name in inputs:
                assert [p.name for p in matching] == [t.INPUT_LIMITS_POLICY]
                assert matching[0].definition == {"dead-letter-exchange": "dead-letters",
                                                  "max-length": 1_000_000,
                                                  "max-length-bytes": 2 * 1024**3,
                                                  "overflow": "reject-publish",
                                                  "delivery-limit": 10,
                                                  "dead-letter-strategy": "at-least-once"}
            else:
                assert [p.name for p in matching] == [t.DEAD_LETTER_POLICY], (vhost, name)
                assert matching[0].definition == {"dead-letter-exchange": "dead-letters"}
            chosen = d.matching_policy(defs.policies, vhost, name, "queues")
            assert chosen == (matching[0] if matching else None)


def test_limits_outrank_the_catch_all() -> None:
    by_name = {p.name: p.priority for p in DEFAULT.policies}
    assert by_name[t.INPUT_LIMITS_POLICY] > by_name[t.DEAD_LETTER_POLICY]


def test_federation_policies_and_upstreams() -> None:
    fed = {(p.vhost, p.name): p for p in DEFAULT.policies if p.apply_to == "exchanges"}
    fence_in = fed[("gf-fences", t.FEDERATE_FENCE_IN_POLICY)]
    assert re.search(fence_in.pattern, "x-fence.in") and not re.search(fence_in.pattern, "x-fence.inx")
    # RabbitMQ's implicit set "all": adding a region's upstream starts its link alone (a named
    # set's change would restart every link of the exchange)
    assert fence_in.definition == {"federation-upstream-set": "all"}
    events = fed[("gf-ingress", t.FEDERATE_EVENTS_POLICY)]
    assert events.pattern == r"^amq\.topic$"
    assert events.definition == {"federation-upstream": "gf-fences"}
    params = {(p.vhost, p.component, p.name): p.value for p in DEFAULT.parameters}
    assert not [k for k in params if k[1] == "federation-upstream-set"]
    assert sorted(k[2] for k in params if k[0] == "gf-fences") == ["gf-region-a", "gf-region-b"]
    a = params[("gf-fences", "federation-upstream", "gf-region-a")]
    assert a == {"uri": "amqp://federation:fed-Pw%2F1@127.0.0.1:5672/gf-region-a",
                 "exchange": "x-fence.in", "ack-mode": "on-confirm", "trust-user-id": False,
                 "max-hops": 1}
    ev = params[("gf-ingress", "federation-upstream", "gf-fences")]
    assert ev["exchange"] == "fence.events"
    assert ev["uri"].endswith("@127.0.0.1:5672/gf-fences")


# --------------------------------------------------------------------------- permissions


def test_regex_helpers() -> None:
    assert d.regex_escape("x-fence.w0.control") == r"x-fence\.w0\.control"
    assert d.exactly("a.b") == r"^a\.b$"
    assert d.exactly("a", "b", "a") == "^(a|b)$"
    assert d.exactly() == "^$"
    pattern = d.all_but("dead-letters", "x.y")
    assert re.search(pattern, "dead-letters.2") and re.search(pattern, "x.yz")
    assert not re.search(pattern, "dead-letters") and not re.search(pattern, "x.y")
    pattern = d.all_but("dead-letters", prefixes=("fence.map.",))
    assert re.search(pattern, "fence.map") and re.search(pattern, "fence.mapx.y") and re.search(pattern, "a")
    assert not re.search(pattern, "fence.map.p.events") and not re.search(pattern, "dead-letters")
    assert d.either(d.exactly("a.b"), "^c.+$") == "^(a\\.b|c.+)$"
    assert d.either(d.NOTHING, d.NOTHING) == d.NOTHING


# (user, vhost, right, resource, allowed)
CASES = [
    (t.INGRESS_USER, "gf-ingress", "read", "x-ingress.positions", True),
    (t.INGRESS_USER, "gf-ingress", "read", "x-ingress.batches", True),
    (t.INGRESS_USER, "gf-ingress", "read", "x-ingress.positions2", False),
    (t.INGRESS_USER, "gf-ingress", "read", "dead-letters", False),
    (t.INGRESS_USER, "gf-ingress", "write", "dead-letters", True),
    (t.INGRESS_USER, "gf-ingress", "write", "amq.topic", False),
    (t.INGRESS_USER, "gf-ingress", "write", "ingress.batches", False),
    (t.INGRESS_USER, "gf-ingress", "write", "ingress.gateway", False),
    (t.INGRESS_USER, "gf-ingress", "configure", "x-ingress.positions", False),
    (t.INGRESS_USER, "gf-region-a", "write", "x-geo.in", True),
    (t.INGRESS_USER, "gf-region-b", "write", "dead-letters", True),
    (t.INGRESS_USER, "gf-region-a", "write", "x-geo.control", False),
    (t.INGRESS_USER, "gf-region-a", "read", "x-geo.positions", False),
    (t.INGRESS_USER, "gf-fences", "write", "x-fence.in", True),  # proximity rows (ingress/proximity.py)
    (t.INGRESS_USER, "gf-fences", "write", "fence.events", False),
    (t.INGRESS_USER, "gf-fences", "read", "x-fence.w0", False),
    (t.GEO_USER, "gf-region-a", "read", "x-geo.positions", True),
    (t.GEO_USER, "gf-region-a", "read", "x-geo.control", True),
    (t.GEO_USER, "gf-region-a", "write", "x-fence.in", True),
    (t.GEO_USER, "gf-region-a", "write", "x-geo.in", False),
    (t.GEO_USER, "gf-region-a", "write", "amq.default", True),  # answers to `inspect`
    (t.INGRESS_USER, "gf-region-a", "write", "amq.default", False),
    (t.GEO_USER, "gf-fences", "write", "x-fence.in", False),
    (t.GEO_USER, "gf-ingress", "read", "x-ingress.positions", False),
    (t.FENCE_USER, "gf-fences", "read", "x-fence.w0", True),
    (t.FENCE_USER, "gf-fences", "read", "x-fence.w1.control", True),
    (t.FENCE_USER, "gf-fences", "read", "x-fence.w2", False),
    (t.FENCE_USER, "gf-fences", "read", "dead-letters", False),
    (t.FENCE_USER, "gf-fences", "read", "fence.archive", False),  # the archiver's
    (t.FENCE_USER, "gf-fences", "read", "fence.api", False),  # the fence service's
    (t.FENCE_USER, "gf-fences", "write", "fence.events", True),
    (t.FENCE_USER, "gf-fences", "write", "fence.event-batches", True),
    (t.FENCE_USER, "gf-fences", "write", "fence.events.mqtt", False),  # retired
    (t.FENCE_USER, "gf-fences", "write", "dead-letters", True),
    (t.FENCE_USER, "gf-fences", "write", "fence.eventsXmqtt", False),  # the dots are literal
    (t.FENCE_USER, "gf-fences", "write", "x-fence.control", False),
    (t.FENCE_USER, "gf-fences", "write", "amq.default", True),  # answers to `inspect`
    (t.MANAGER_USER, "gf-region-b", "write", "x-geo.control", True),
    (t.MANAGER_USER, "gf-region-b", "write", "x-geo.in", False),
    (t.MANAGER_USER, "gf-fences", "write", "x-fence.control", True),
    (t.MANAGER_USER, "gf-fences", "write", "fence.events", False),
    (t.MANAGER_USER, "gf-fences", "read", "x-fence.w0.control", False),
    # the live map: its own queues, on fence.map-events and fence.map-positions
    (t.MANAGER_USER, "gf-fences", "configure", "fence.map.vm-12.events", True),
    (t.MANAGER_USER, "gf-fences", "write", "fence.map.vm-12.events", True),
    (t.MANAGER_USER, "gf-fences", "read", "fence.map.vm-12.events", True),
    (t.MANAGER_USER, "gf-fences", "read", "fence.map-events", True),
    (t.MANAGER_USER, "gf-fences", "read", "fence.event-batches", False),
    (t.FENCE_USER, "gf-fences", "write", "fence.map-events", True),
    (t.MANAGER_USER, "gf-fences", "write", "fence.map-events", False),
    (t.MANAGER_USER, "gf-fences", "configure", "fence.archive", False),
    (t.MANAGER_USER, "gf-fences", "read", "fence.archive", False),
    (t.MANAGER_USER, "gf-fences", "configure", "fence.map.", False),
    (t.MANAGER_USER, "gf-ingress", "configure", "fence.map.vm-12.positions", True),
    (t.MANAGER_USER, "gf-ingress", "read", "fence.map-positions", True),
    (t.MANAGER_USER, "gf-ingress", "write", "fence.map-positions", False),
    (t.MANAGER_USER, "gf-ingress", "read", "x-ingress.positions", False),
    (t.INGRESS_USER, "gf-ingress", "write", "fence.map-positions", True),
    (t.INGRESS_USER, "gf-ingress", "read", "fence.map.vm-12.positions", False),
    (t.CLIENT_USER, "gf-fences", "read", "fence.map.vm-12.events", False),
    # the shared gateway user is retired: no rights anywhere (gateways are a tenant's users)
    (t.GATEWAY_USER, "gf-ingress", "write", "ingress.batches", False),
    (t.GATEWAY_USER, "gf-ingress", "write", "ingress.gateway", False),
    (t.GATEWAY_USER, "gf-ingress", "write", "amq.topic", False),
    (t.GATEWAY_USER, "gf-ingress", "read", "x-ingress.batches", False),
    (t.GATEWAY_USER, "gf-region-a", "write", "x-geo.in", False),
    (t.FEDERATION_USER, "gf-region-a", "configure",
     "federation: x-fence.in -> rabbit@vm:gf-fences:x-fence.in", True),
    (t.FEDERATION_USER, "gf-region-a", "configure",
     "federation: x-fence.in -> rabbit@vm:gf-fences:x-fence.in B", True),
    (t.FEDERATION_USER, "gf-region-a", "write",
     "federation: x-fence.in -> rabbit@vm:gf-fences:x-fence.in", True),
    (t.FEDERATION_USER, "gf-region-a", "read", "x-fence.in", True),
    (t.FEDERATION_USER, "gf-region-a", "configure", "x-fence.in", False),
    (t.FEDERATION_USER, "gf-region-a", "write", "x-fence.in", False),
    (t.FEDERATION_USER, "gf-region-a", "read", "x-geo.positions", False),
    (t.FEDERATION_USER, "gf-fences", "read", "fence.events", True),
    (t.FEDERATION_USER, "gf-fences", "read", "fence.event-batches", False),
    (t.FEDERATION_USER, "gf-fences", "read", "fence.events.mqtt", False),
    (t.FEDERATION_USER, "gf-fences", "read", "x-fence.w0", False),
    (t.FEDERATION_USER, "gf-ingress", "read", "amq.topic", False),
]


@pytest.mark.parametrize(("user", "vhost", "right", "resource", "allowed"), CASES)
def test_permission_regexes(user: str, vhost: str, right: str, resource: str, allowed: bool) -> None:
    assert may(DEFAULT, user, vhost, right, resource) is allowed


def test_sidecars_configure_only_their_instance_lock_and_admin_everything() -> None:
    locks = {(t.INGRESS_USER, "gf-ingress"): "^lock\\.x-ingress(-[0-9]+)?$",  # instance N: lock.x-ingress-N
             (t.GEO_USER, "gf-region-a"): "^lock\\.x-geo$", (t.GEO_USER, "gf-region-b"): "^lock\\.x-geo$",
             (t.FENCE_USER, "gf-fences"): "^(lock\\.x-fence\\.w0|lock\\.x-fence\\.w0\\.home|"
                                          "lock\\.x-fence\\.w1|lock\\.x-fence\\.w1\\.home)$",
             # the API's own live-map queues (exclusive, fence/map_feed.py)
             (t.MANAGER_USER, "gf-fences"): "^fence\\.map\\..+$",
             (t.MANAGER_USER, "gf-ingress"): "^fence\\.map\\..+$"}
    for p in DEFAULT.permissions:
        if p.user in (t.INGRESS_USER, t.GEO_USER, t.FENCE_USER, t.MANAGER_USER):
            assert p.configure == locks.get((p.user, p.vhost), "^$"), (p.user, p.vhost)
        if p.user == t.ADMIN_USER:
            assert (p.configure, p.write, p.read) == (".*", ".*", ".*")
    assert {p.vhost for p in DEFAULT.permissions if p.user == t.ADMIN_USER} == {"/", *DEFAULT.vhosts}


def test_user_vhosts() -> None:
    assert d.user_vhosts(Topology()) == {
        t.INGRESS_USER: ("gf-ingress", "gf-region-a", "gf-region-b", "gf-fences"),
        t.GEO_USER: ("gf-region-a", "gf-region-b"),
        t.FENCE_USER: ("gf-fences",),
        t.MANAGER_USER: ("gf-region-a", "gf-region-b", "gf-fences", "gf-ingress"),
        t.FEDERATION_USER: ("gf-region-a", "gf-region-b", "gf-fences"),
        t.ARCHIVER_USER: ("gf-fences",),
        t.VENUES_USER: ("gf-ingress",), t.WEBHOOKS_USER: ("gf-fences",),
    }


def test_the_shared_gateway_user_is_retired() -> None:
    """One user of no tenant for every gateway: gone (the plan deletes it where it exists);
    gateways are each a tenant's user now (`gateway_permission`)."""
    assert t.GATEWAY_USER in d.RETIRED_USERS and t.GATEWAY_USER in DEFAULT.retired_users
    assert t.GATEWAY_USER not in d.SIDECAR_USERS
    assert t.GATEWAY_USER not in {u.name for u in DEFAULT.users}
    assert not [p for p in DEFAULT.permissions if p.user == t.GATEWAY_USER]
    assert not set(d.RETIRED_USERS) & {u.name for u in DEFAULT.users}
    # nobody but the administrator may publish to the retired fanout (no tenant in it)
    assert {p.user for p in DEFAULT.permissions if re.search(p.write, "ingress.batches")} == {t.ADMIN_USER}
    assert tuple(DEFAULT.to_json()["retired_users"]) == d.RETIRED_USERS


def test_the_fence_service_archiver_and_clients_touch_only_their_queues() -> None:
    assert may(DEFAULT, t.MANAGER_USER, "gf-fences", "read", "fence.api")
    assert may(DEFAULT, t.MANAGER_USER, "gf-ingress", "read", "fence.follow")
    assert not may(DEFAULT, t.MANAGER_USER, "gf-ingress", "read", "x-ingress.positions")
    assert may(DEFAULT, t.INGRESS_USER, "gf-ingress", "write", "fence.follow")
    assert may(DEFAULT, t.ARCHIVER_USER, "gf-fences", "read", "fence.archive")
    assert not may(DEFAULT, t.ARCHIVER_USER, "gf-fences", "read", "x-fence.w0")
    # the one application user of every tenant is retired: applications are a tenant's users
    assert t.CLIENT_USER in d.RETIRED_USERS
    assert not [p for p in DEFAULT.permissions if p.user == t.CLIENT_USER]
    app = cred.app_permission("acme.app-1")
    assert (app.user, app.vhost) == ("acme.app-1", "gf-fences")
    assert re.search(app.write, "fence.api") and not re.search(app.read, "fence.api")
    assert not re.search(app.write, "x-fence.control")
    for right in ("configure", "write", "read"):  # its own queues, no other application's
        assert re.search(getattr(app, right), "app.acme.app-1.events")
        for other in ("app.other.app-1.events", "app.acme.app-10.events", "app.my-events", "fence.archive"):
            assert not re.search(getattr(app, right), other), (right, other)
    assert re.search(app.read, "fence.events") and re.search(app.read, "fence.tenant-batches")
    assert not re.search(app.read, "fence.event-batches")  # every tenant's events: the platform's


@pytest.mark.parametrize(("exchange", "binding_key", "allowed"), [
    ("fence.events", "fence-events.acme.#", True),
    ("fence.events", "fence-events.acme.f1.*.*", True),
    ("fence.events", "roam-events.acme.rs-1.nearby.*", True),
    ("fence.events", "fence-events.other.#", False),
    ("fence.events", "fence-events.acme-2.#", False),
    ("fence.events", "fence-events.*.f1.*.*", False),
    ("fence.events", "fence-events.#", False),
    ("fence.events", "#", False),
    ("fence.tenant-batches", "acme", True),
    ("fence.tenant-batches", "other", False),
    ("fence.tenant-batches", "*", False),
    ("fence.tenant-batches", "#", False),
])
def test_an_application_binds_its_tenants_keys_only(exchange: str, binding_key: str, allowed: bool) -> None:
    tps = {tp.exchange: tp for tp in cred.app_topic_permissions("acme.app-1")}
    assert set(tps) == {"fence.events", "fence.tenant-batches"}  # every topic exchange it may read
    assert all(tp.write == d.NOTHING for tp in tps.values())
    assert (re.search(tps[exchange].read, binding_key) is not None) is allowed


def test_digest_follows_definitions_and_passwords() -> None:
    pws = {"x-geo": "a"}
    assert DEFAULT.digest(pws) == d.build(Topology(), ENDPOINT, "fed-Pw/1").digest(pws)
    assert DEFAULT.digest(pws) != DEFAULT.digest({"x-geo": "b"})
    assert DEFAULT.digest(pws) != BIG.digest(pws)
    assert DEFAULT.digest(pws) != d.build(Topology(), d.Endpoint("127.0.0.1", 5673),
                                          "fed-Pw/1").digest(pws)
    assert re.fullmatch("[0-9a-f]{64}", DEFAULT.digest(pws))


# --------------------------------------------------------------------------- devices and gateways


def test_a_tenants_device_and_gateway_users() -> None:
    assert cred.device_user("acme", "dev-1") == DEVICE and cred.tenant_user(DEVICE) == ("acme", "dev-1")
    # the same object id in two tenants: two users, two queues, two topics
    other = cred.device_user("other", "dev-1")
    assert other == "other.dev-1" != DEVICE
    assert set(cred.device_queues(DEVICE)).isdisjoint(cred.device_queues(other))
    assert cred.device_topic_permission(DEVICE).write != cred.device_topic_permission(other).write
    # a user of the layout before tenants (its name an object id) is no tenant's
    with pytest.raises(ValueError, match=r"<tenant>\.<name>"):
        cred.tenant_user("dev-1")
    with pytest.raises(ValueError):
        cred.device_topic_permission("dev-1")


@pytest.mark.parametrize(("routing_key", "allowed"), [
    ("positions.acme.dev-1", True),
    ("positions.acme.dev-2", False),
    ("positions.other.dev-1", False),  # another tenant's dev-1
    ("positions.acme-2.dev-1", False),
    ("positions.acm.dev-1", False),
    ("positions.*.dev-1", False),
    ("positions.dev-1", False),  # the contract before tenants
    ("positions.acme.dev-1.extra", False),
    ("positions.acme.dev-10", False),
    ("positions.acmeXdev-1", False),  # the dots are literal
    ("xpositions.acme.dev-1", False),
    ("fence-events.acme.f1.enter.dev-1", False),
])
def test_device_may_publish_only_its_positions(routing_key: str, allowed: bool) -> None:
    tp = cred.device_topic_permission(DEVICE)
    assert (tp.user, tp.vhost, tp.exchange) == (DEVICE, "gf-ingress", "amq.topic")
    # RabbitMQ's {username} would be `<tenant>.<id>`, not a word of the key: never used
    assert "{username}" not in tp.write and "{username}" not in tp.read
    assert (re.search(tp.write, routing_key) is not None) is allowed


@pytest.mark.parametrize(("binding_key", "allowed"), [
    ("fence-events.acme.*.*.dev-1", True),
    ("fence-events.acme.f1.enter.dev-1", True),
    ("fence-events.acme.*.leave.dev-1", True),
    ("fence-events.other.*.*.dev-1", False),  # another tenant's dev-1
    ("fence-events.acme-2.*.*.dev-1", False),
    ("fence-events.*.*.*.dev-1", False),  # every tenant's
    ("fence-events._.*.*.dev-1", False),  # the platform's own fences
    ("fence-events.acme.*.*.dev-10", False),
    ("fence-events.acme.*.*.dev", False),
    ("fence-events.acme.*.*.*", False),
    ("fence-events.#", False),
    ("fence-events.acme.#", False),
    ("fence-events.acme.*.#", False),
    ("fence-events.acme.#.dev-1", False),
    ("fence-events.acme.f1.enter.x.dev-1", False),
    ("fence-events.*.*.dev-1", False),  # the layout before tenants
    ("roam-events.acme.*.*.dev-1", False),
    ("object-events.dev-1.#", False),
    ("#", False),
])
def test_device_may_subscribe_only_to_its_events(binding_key: str, allowed: bool) -> None:
    tp = cred.device_topic_permission(DEVICE)
    assert (re.search(tp.read, binding_key) is not None) is allowed


def test_a_devices_binding_gets_its_own_events_not_another_tenants_object_of_its_id() -> None:
    tp = cred.device_topic_permission(DEVICE)
    mine = t.event_routing_key("acme:depot", "enter", "acme:dev-1")
    theirs = t.event_routing_key("other:depot", "enter", "other:dev-1")
    assert (mine, theirs) == ("fence-events.acme.depot.enter.dev-1", "fence-events.other.depot.enter.dev-1")
    allowed = [k for k in ("fence-events.acme.*.*.dev-1", "fence-events.*.*.*.dev-1", "fence-events.#")
               if re.search(tp.read, k)]
    assert allowed == ["fence-events.acme.*.*.dev-1"]
    assert topic_matches(allowed[0], mine) and not topic_matches(allowed[0], theirs)
    assert re.search(tp.write, "positions.acme.dev-1") and not re.search(tp.write, "positions.other.dev-1")


def test_device_resource_permissions() -> None:
    p = cred.device_permission(DEVICE)
    assert (p.user, p.vhost) == (DEVICE, "gf-ingress")
    own = ("mqtt-subscription-acme.dev-1qos0", "mqtt-subscription-acme.dev-1qos1")
    assert cred.device_queues(DEVICE) == own
    for name in own:
        assert re.search(p.configure, name) and re.search(p.write, name) and re.search(p.read, name)
    for name in ("mqtt-subscription-acme.dev-10qos0", "mqtt-subscription-acme.dev-1qos2",
                 "mqtt-subscription-other.dev-1qos0", "mqtt-subscription-acmeXdev-1qos0",
                 "mqtt-subscription-dev-1qos0", "x-ingress.positions", "dead-letters"):
        assert not re.search(p.configure, name) and not re.search(p.read, name), name
    assert re.search(p.write, "amq.topic") and re.search(p.read, "amq.topic")
    assert not re.search(p.configure, "amq.topic") and not re.search(p.write, "ingress.batches")
    assert not re.search(p.write, "ingress.gateway")


def test_gateway_resource_permissions() -> None:
    p = cred.gateway_permission(GATEWAY)
    assert (p.user, p.vhost) == (GATEWAY, "gf-ingress")
    assert re.search(p.write, "ingress.gateway") and re.search(p.write, "amq.topic")
    for name in ("ingress.batches", "x-ingress.batches", "dead-letters", "fence.follow", "ingress.gatewayx"):
        assert not re.search(p.write, name), name
    assert (p.configure, p.read) == (d.NOTHING, d.NOTHING)


@pytest.mark.parametrize(("exchange", "routing_key", "allowed"), [
    ("ingress.gateway", "acme", True),
    ("ingress.gateway", "other", False),
    ("ingress.gateway", "acme-2", False),
    ("ingress.gateway", "acm", False),
    ("ingress.gateway", "", False),
    ("ingress.gateway", "acme.x", False),
    ("ingress.gateway", "*", False),
    ("amq.topic", "positions.acme.car-1", True),
    ("amq.topic", "positions.other.car-1", False),
    ("amq.topic", "positions.acme-2.car-1", False),
    ("amq.topic", "positions.acme", False),
    ("amq.topic", "positions.acme.car-1.x", False),
    ("amq.topic", "positions.acme.*", False),
    ("amq.topic", "positions.acme.#", False),
    ("amq.topic", "positions.car-1", False),
    ("amq.topic", "fence-events.acme.f1.enter.car-1", False),
])
def test_gateway_may_publish_only_its_tenants_keys(exchange: str, routing_key: str, allowed: bool) -> None:
    tps = {tp.exchange: tp for tp in cred.gateway_topic_permissions(GATEWAY)}
    assert all((tp.user, tp.vhost, tp.read) == (GATEWAY, "gf-ingress", d.NOTHING) for tp in tps.values())
    assert (re.search(tps[exchange].write, routing_key) is not None) is allowed


def test_every_topic_exchange_a_device_or_gateway_may_write_has_its_topic_permission() -> None:
    """RabbitMQ checks no routing key on a topic exchange a user has no topic permission on."""
    ingress = [x for x in DEFAULT.exchanges if x.vhost == "gf-ingress"]
    topic = {"amq.topic", *(x.name for x in ingress if x.type == "topic")}
    for p, tps in ((cred.device_permission(DEVICE), [cred.device_topic_permission(DEVICE)]),
                   (cred.gateway_permission(GATEWAY), list(cred.gateway_topic_permissions(GATEWAY)))):
        writable = {x for x in topic if re.search(p.write, x)}
        assert writable and writable == {tp.exchange for tp in tps}, p.user


@pytest.mark.parametrize("bad", ["", "a.b", "-a", "_a", "a b", "a$b", "a/b", "a+b", "x" * 65,
                                 "a{username}", "a:b"])
def test_bad_object_ids_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="object id"):
        check_object_id(bad)
    with pytest.raises(ValueError, match="object id"):
        cred.device_user("acme", bad)
    for make in (cred.device_permission, cred.device_topic_permission, cred.gateway_permission,
                 cred.gateway_topic_permissions, cred.device_queues):
        with pytest.raises(ValueError):
            make(f"acme.{bad}")
    if "." not in bad:  # a sensor's user is its id
        with pytest.raises(ValueError):
            cred.device_permission(bad)


@pytest.mark.parametrize("bad", ["", "Acme", "-acme", "a_b", "a b", "a:b", "a$b", "*", "#", "acme\n",
                                 "x" * 33, "a{username}"])
def test_bad_tenants_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="tenant"):
        cred.device_user(bad, "dev-1")
    for make in (cred.device_permission, cred.device_topic_permission, cred.gateway_permission,
                 cred.gateway_topic_permissions, cred.tenant_user):
        with pytest.raises(ValueError):
            make(f"{bad}.dev-1")


@pytest.mark.parametrize("good", ["a", "dev-1", "Truck_42", "x" * 64, "0"])
def test_good_object_ids(good: str) -> None:
    assert check_object_id(good) == good


def test_the_sensor_sidecar_and_sensors_touch_only_their_own() -> None:
    assert may(DEFAULT, t.VENUES_USER, "gf-ingress", "read", "venue.sensors")
    assert not may(DEFAULT, t.VENUES_USER, "gf-ingress", "read", "x-ingress.positions")
    for exchange in ("venue.occupancy", "amq.topic", "dead-letters"):
        assert may(DEFAULT, t.VENUES_USER, "gf-ingress", "write", exchange)
    assert not may(DEFAULT, t.VENUES_USER, "gf-ingress", "write", "ingress.batches")
    assert may(DEFAULT, t.VENUES_USER, "gf-ingress", "configure", "lock.venue-sensors")
    tp = cred.sensor_topic_permission("s-1")
    write, read = tp.write.replace("{username}", "s-1"), tp.read.replace("{username}", "s-1")
    for key in ("sensors.s-1.counter", "sensors.s-1.v2.counter", "sensors.s-1.v2.event",
                "sensors.s-1.v2.status"):
        assert re.search(write, key)
    for key in ("sensors.s-2.counter", "sensors.s-1.v3.counter", "positions.s-1", "sensors.s-1.counter.x"):
        assert not re.search(write, key)
    assert re.search(read, "commands.sensor.s-1") and not re.search(read, "commands.sensor.s-2")
    assert cred.sensor_permission("s-1") == cred.device_permission("s-1")
