"""deploy.rabbitmq.plan without a broker: the commands, idempotence, what is cleared,
conflicts, rendering and masking, the rabbitmqctl wrapper's shell."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import replace

import pytest

from deploy.rabbitmq import credentials as cred
from deploy.rabbitmq import definitions as d
from deploy.rabbitmq import plan as p
from exchanges import topology as t
from exchanges.topology import Topology

ENDPOINT = d.Endpoint("127.0.0.1", 5672)
PASSWORDS = {u: f"pw-{u}-S3cret" for u in (t.ADMIN_USER, *d.SIDECAR_USERS)}
DEFS = d.build(Topology(), ENDPOINT, PASSWORDS[t.FEDERATION_USER])
# A hash RabbitMQ 3.10 stored for the password "s3cret-Pw_1" (rabbit_password_hashing_sha256).
REAL_HASH = "utoCFoSeQm5bXwd8jaMIODWO7s69xHwApUdyA9LCkF1wiOlt"


def rabbit_hash(password: str) -> str:
    salt = os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def applied(defs: d.Definitions, passwords: dict[str, str]) -> p.Current:
    """What the broker holds once `defs` was applied (as read_broker would see it)."""
    cur = p.Current(federation_api=True, vhosts={"/", *defs.vhosts})
    cur.users = {u.name: p.CurrentUser(u.tags, rabbit_hash(passwords[u.name]),
                                       "rabbit_password_hashing_sha256") for u in defs.users}
    cur.permissions = {(x.user, x.vhost): (x.configure, x.write, x.read) for x in defs.permissions}
    cur.exchanges = {(x.vhost, x.name): {"type": x.type, **p.EXCHANGE_PROPERTIES}
                     for x in defs.exchanges}
    cur.queues = {(q.vhost, q.name): {**p.QUEUE_PROPERTIES, "exclusive": False, "type": q.type,
                                      "arguments": p.queue_arguments(q), "messages": 0}
                  for q in defs.queues}
    cur.bindings = {(b.vhost, b.source, b.queue, b.routing_key) for b in defs.bindings}
    cur.parameters = {(x.vhost, x.component, x.name): x.value for x in defs.parameters}
    cur.policies = {(x.vhost, x.name): x for x in defs.policies}
    return cur


def argvs(steps: list[p.Step]) -> list[tuple[str, ...]]:
    return [s.argv for s in steps if isinstance(s, p.Ctl)]


def test_password_check_matches_rabbitmq() -> None:
    user = p.CurrentUser((), REAL_HASH, "rabbit_password_hashing_sha256")
    assert p.password_matches(user, "s3cret-Pw_1")
    assert not p.password_matches(user, "s3cret-Pw_2")
    assert not p.password_matches(replace(user, hashing_algorithm="unknown"), "s3cret-Pw_1")
    assert not p.password_matches(replace(user, password_hash="not base64!"), "s3cret-Pw_1")
    assert not p.password_matches(replace(user, password_hash=""), "")


def test_empty_broker_gets_everything_in_order() -> None:
    steps = p.plan(DEFS, PASSWORDS, p.Current.empty())
    sections = [p.section(s) for s in steps]
    order = ["plugins", "vhosts", "users (password on stdin)", "permissions (configure, write, read)",
             "exchanges (management API)", "queues (management API)", "bindings (management API)",
             "federation upstreams", "policies"]
    assert list(dict.fromkeys(sections)) == order
    assert steps[0] == p.Ctl(("rabbitmq-plugins", "enable", "rabbitmq_federation_management"))
    assert ("rabbitmqctl", "add_vhost", "gf-fences") in argvs(steps)
    assert ("rabbitmqctl", "set_user_tags", "geofence", "administrator") in argvs(steps)
    adds = [s for s in steps if isinstance(s, p.Ctl) and s.argv[1] == "add_user"]
    assert {s.argv[2] for s in adds} == set(PASSWORDS)
    assert all(s.stdin == PASSWORDS[s.argv[2]] for s in adds)
    assert ("rabbitmqctl", "set_policy", "-p", "gf-ingress", "--priority", "10", "--apply-to",
            "queues", "gf-input-limits",
            r"^(" + "".join(f"x-ingress\\.p{i:02d}|" for i in range(16))
            + r"x-ingress\.positions|x-ingress\.batches|x-ingress\.proximity|fence\.follow|venue\.sensors"
            r"|venue\.notify"
            r"|venue\.fence-events)$",
            '{"dead-letter-exchange":"dead-letters","max-length":1000000,"max-length-bytes":2147483648,'
            '"overflow":"reject-publish","delivery-limit":10,"dead-letter-strategy":"at-least-once"}'
            ) in argvs(steps)
    assert p.Http("PUT", "api/queues/gf-ingress/x-ingress.positions",
                  {"durable": True, "auto_delete": False,
                   "arguments": {"x-queue-type": "quorum", "x-single-active-consumer": True}}) in steps
    assert p.Http("PUT", "api/queues/gf-ingress/fence.follow",  # every API process consumes it
                  {"durable": True, "auto_delete": False, "arguments": {"x-queue-type": "quorum"}}) in steps
    assert p.Http("PUT", "api/queues/gf-ingress/dead-letters",
                  {"durable": True, "auto_delete": False, "arguments": {"x-queue-type": "classic"}}) in steps
    assert p.Http("PUT", "api/exchanges/gf-fences/x-fence.in",
                  {"type": "direct", "durable": True, "auto_delete": False, "internal": False,
                   "arguments": {}}) in steps
    # positions/<tenant>/<object_id>, and the contract before tenants (dead-lettered by x-ingress)
    assert p.Http("POST", "api/bindings/gf-ingress/e/amq.topic/e/x-ingress.partition",
                  {"routing_key": "positions.*.*", "arguments": {}}) in steps
    assert p.Http("POST", "api/bindings/gf-ingress/e/amq.topic/q/x-ingress.positions",
                  {"routing_key": "positions.*", "arguments": {}}) in steps
    hashed = [s for s in steps if isinstance(s, p.Http) and s.path.startswith(
        "api/bindings/gf-ingress/e/x-ingress.partition/")]
    assert [s.path.rsplit("/", 1)[1] for s in hashed] == [f"x-ingress.p{i:02d}" for i in range(16)]
    assert p.Http("PUT", "api/exchanges/gf-ingress/ingress.gateway",
                  {"type": "topic", "durable": True, "auto_delete": False, "internal": False,
                   "arguments": {}}) in steps
    assert p.Http("POST", "api/bindings/gf-ingress/e/ingress.gateway/q/x-ingress.batches",
                  {"routing_key": "*", "arguments": {}}) in steps
    # nothing to delete on an empty broker, and the retired gateway user is never created
    assert not [a for a in argvs(steps) if a[1] == "delete_user"]
    assert t.GATEWAY_USER not in {s.argv[2] for s in adds}


def test_passwords_never_in_argv_except_the_federation_uri() -> None:
    steps = p.plan(DEFS, PASSWORDS, p.Current.empty())
    for argv in argvs(steps):
        for user, password in PASSWORDS.items():
            if password in " ".join(argv):
                assert user == t.FEDERATION_USER and argv[1] == "set_parameter"
                assert argv[4] == "federation-upstream"


def test_every_argument_survives_the_debian_wrapper() -> None:
    for argv in argvs(p.plan(DEFS, PASSWORDS, p.Current.empty())):
        assert all(p.wrapper_safe(a) for a in argv), argv



def test_device_steps_are_management_calls_with_the_password_in_a_body_only() -> None:
    """A device (gateway, application, sensor) is made in milliseconds over the management API,
    not by five rabbitmqctl runs; its password is in the user's body, in no path or argv."""
    for user, perm, topics, tag in (
            ("acme.dev-1", cred.device_permission("acme.dev-1"),
             (cred.device_topic_permission("acme.dev-1"),), "gf-device"),
            ("acme.gw-1", cred.gateway_permission("acme.gw-1"), cred.gateway_topic_permissions("acme.gw-1"),
             "gf-gateway")):
        steps = p.device_steps(user, "s3cret-pw", perm, topics, (tag,))
        assert all(isinstance(s, p.Http) and s.method == "PUT" for s in steps)
        assert not argvs(steps)
        assert not [s for s in steps if "s3cret-pw" in p.render(s, ("s3cret-pw",))]  # masked when shown
        with_password = [s for s in steps if isinstance(s, p.Http) and "s3cret-pw" in json.dumps(s.body)]
        assert [s.path for s in with_password] == [p.api_path("users", user)]
        assert all("s3cret-pw" not in s.path for s in steps if isinstance(s, p.Http))
    assert p.delete_user_step("acme.dev-1") == p.Http("DELETE", "api/users/acme.dev-1", None)


def test_device_steps_set_every_topic_permission() -> None:
    """A gateway has two topic permissions (ingress.gateway and amq.topic), a device one."""
    gateway = "acme.gw-1"
    steps = p.device_steps(gateway, "pw", cred.gateway_permission(gateway),
                           cred.gateway_topic_permissions(gateway), ("gf-gateway",))
    assert [(s.method, s.path) for s in steps if isinstance(s, p.Http)] == [
        ("PUT", "api/users/acme.gw-1"), ("PUT", "api/user-limits/acme.gw-1/max-connections"),
        ("PUT", "api/user-limits/acme.gw-1/max-channels"), ("PUT", "api/permissions/gf-ingress/acme.gw-1"),
        ("PUT", "api/topic-permissions/gf-ingress/acme.gw-1"),
        ("PUT", "api/topic-permissions/gf-ingress/acme.gw-1")]
    bodies = [s.body for s in steps if isinstance(s, p.Http)]
    assert bodies[0] == {"password": "pw", "tags": "gf-gateway"}
    assert bodies[1:3] == [{"value": 16}, {"value": 128}]
    bodies = [bodies[0], *bodies[3:]]
    perm = cred.gateway_permission(gateway)
    assert bodies[1] == {"configure": perm.configure, "write": perm.write, "read": perm.read}
    assert [(b["exchange"], b["write"]) for b in bodies[2:]] == [
        ("ingress.gateway", "^acme$"), ("amq.topic", r"^positions\.acme\.[^.#*]+$")]
    device = "acme.dev-1"
    steps = p.device_steps(device, "pw", cred.device_permission(device),
                           (cred.device_topic_permission(device),), ("gf-device",))
    last = steps[-1]
    assert isinstance(last, p.Http) and last.body == {
        "exchange": "amq.topic", "write": r"^positions\.acme\.dev-1$",
        "read": r"^fence-events\.acme\.[^.#]+\.[^.#]+\.dev-1$"}


@pytest.mark.parametrize("unsafe", ["$HOME", "a${b}", "$(id)", "`id`", "a\\$b", 'a\\"b', "a\\\\b",
                                    "$1", "$$"])
def test_wrapper_unsafe_arguments_are_spotted(unsafe: str) -> None:
    assert not p.wrapper_safe(unsafe)


@pytest.mark.parametrize("safe", ["^$", "^(a|b)$", r"^x\.y$", "^(?!(a|b)$)", '{"a":"b"}',
                                  r"^positions\.{username}$", r"^positions\.acme\.[^.#*]+$", "acme.dev-1",
                                  "federation: ", "a$"])
def test_wrapper_safe_arguments(safe: str) -> None:
    assert p.wrapper_safe(safe)


def test_applying_twice_changes_nothing() -> None:
    assert p.plan(DEFS, PASSWORDS, applied(DEFS, PASSWORDS)) == []


def test_only_differences_are_planned() -> None:
    cur = applied(DEFS, PASSWORDS)
    cur.users[t.GEO_USER] = p.CurrentUser((), rabbit_hash("old"), "rabbit_password_hashing_sha256")
    cur.users[t.ARCHIVER_USER] = p.CurrentUser(("monitoring",), cur.users[t.ARCHIVER_USER].password_hash,
                                               "rabbit_password_hashing_sha256")
    cur.permissions[(t.FENCE_USER, "gf-fences")] = (".*", ".*", ".*")
    del cur.queues[("gf-fences", "x-fence.w1")]
    cur.bindings.discard(("gf-fences", "x-fence.in", "x-fence.w1", "w1"))
    fence_in = next(x for x in DEFS.policies if x.name == t.FEDERATE_FENCE_IN_POLICY)
    cur.policies[("gf-fences", fence_in.name)] = replace(fence_in, priority=5)
    cur.vhosts.discard("gf-region-b")
    cur.federation_api = False
    steps = p.plan(DEFS, PASSWORDS, cur)
    perm = next(x for x in DEFS.permissions if x.user == t.FENCE_USER)
    assert steps == [
        p.Ctl(("rabbitmq-plugins", "enable", "rabbitmq_federation_management")),
        p.ctl("add_vhost", "gf-region-b"),
        p.ctl("change_password", t.GEO_USER, stdin=PASSWORDS[t.GEO_USER]),
        p.ctl("set_user_tags", t.ARCHIVER_USER),
        p.set_permissions(perm),
        p.declare_queue(d.Queue("gf-fences", "x-fence.w1", "quorum", single_active=True)),
        p.bind(d.Binding("gf-fences", "x-fence.in", "x-fence.w1", "w1")),
        p.set_policy(fence_in),
    ]


def test_stale_things_it_owns_are_cleared_and_nothing_else() -> None:
    cur = applied(DEFS, PASSWORDS)
    cur.permissions[(t.GEO_USER, "gf-region-c")] = ("^$", "^x-fence\\.in$", "^$")  # removed region
    cur.permissions[(t.ADMIN_USER, "ops")] = (".*", ".*", ".*")  # somebody else's vhost
    cur.permissions[("acme.dev-1", "gf-ingress")] = ("^$", "^$", "^$")  # a device
    cur.permissions[("dev-1", "gf-ingress")] = ("^$", "^$", "^$")  # a device before tenants
    cur.parameters[("gf-fences", "federation-upstream", "gf-region-c")] = {"uri": "amqp://"}
    cur.parameters[("gf-fences", "federation-upstream", "ops-upstream")] = {"uri": "amqp://"}
    cur.parameters[("ops", "federation-upstream", "gf-x")] = {"uri": "amqp://"}
    cur.policies[("gf-ingress", "gf-old")] = replace(DEFS.policies[0], name="gf-old")
    cur.policies[("gf-ingress", "ops-ha")] = replace(DEFS.policies[0], name="ops-ha")
    cur.exchanges[("gf-fences", "old.exchange")] = {"type": "fanout"}
    cur.queues[("gf-fences", "x-fence.w9")] = {"durable": True}
    assert argvs(p.plan(DEFS, PASSWORDS, cur)) == [
        ("rabbitmqctl", "clear_permissions", "-p", "gf-region-c", t.GEO_USER),
        ("rabbitmqctl", "clear_parameter", "-p", "gf-fences", "federation-upstream", "gf-region-c"),
        ("rabbitmqctl", "clear_policy", "-p", "gf-ingress", "gf-old"),
    ]


def test_conflicting_exchange_or_queue_is_reported_not_forced() -> None:
    cur = applied(DEFS, PASSWORDS)
    cur.exchanges[("gf-fences", "x-fence.in")] = {"type": "topic", **p.EXCHANGE_PROPERTIES}
    cur.queues[("gf-ingress", "x-ingress.positions")] = {
        "durable": True, "auto_delete": False, "arguments": {"x-max-length": 10}}
    with pytest.raises(p.TopologyConflict, match=r"x-fence\.in in gf-fences.*x-ingress\.positions"):
        p.plan(DEFS, PASSWORDS, cur)


def test_a_classic_queue_without_type_argument_is_no_conflict() -> None:
    cur = applied(DEFS, PASSWORDS)
    cur.queues[("gf-ingress", "dead-letters")] = {
        "durable": True, "auto_delete": False, "exclusive": False, "arguments": {}}
    assert p.plan(DEFS, PASSWORDS, cur) == []


def test_an_empty_queue_of_another_type_is_declared_again_with_its_bindings() -> None:
    cur = applied(DEFS, PASSWORDS)
    cur.queues[("gf-fences", "x-fence.w0")] = {"durable": True, "auto_delete": False, "exclusive": False,
                                                "arguments": {}, "type": "classic", "messages": 0}
    q = d.Queue("gf-fences", "x-fence.w0", "quorum", single_active=True)
    assert p.plan(DEFS, PASSWORDS, cur) == [
        p.Http("DELETE", "api/queues/gf-fences/x-fence.w0?if-empty=true", None), p.declare_queue(q),
        p.bind(d.Binding("gf-fences", "x-fence.in", "x-fence.w0", "w0"))]


def test_a_queue_of_another_type_holding_messages_is_left_to_the_operator() -> None:
    cur = applied(DEFS, PASSWORDS)
    cur.queues[("gf-fences", "x-fence.w0")] = {"durable": True, "auto_delete": False, "exclusive": False,
                                                "arguments": {}, "type": "classic", "messages": 7}
    with pytest.raises(p.TopologyConflict, match=r"x-fence\.w0 in gf-fences is a classic queue holding 7 "
                                                 r"messages.*wants a quorum single-active-consumer queue: "
                                                 r"let its consumer drain"):
        p.plan(DEFS, PASSWORDS, cur)


def test_a_missing_password_is_an_error() -> None:
    with pytest.raises(ValueError, match="x-geo"):
        p.plan(DEFS, {k: v for k, v in PASSWORDS.items() if k != t.GEO_USER}, p.Current.empty())


def test_render_masks_secrets_and_quotes_for_the_shell() -> None:
    steps = p.plan(DEFS, PASSWORDS, p.Current.empty())
    lines = [p.render(s, PASSWORDS.values()) for s in steps]
    text = "\n".join(lines)
    assert not any(pw in text for pw in PASSWORDS.values())
    assert "printf '%s\\n' '****' | rabbitmqctl add_user x-geo" in lines
    assert ("rabbitmqctl set_permissions -p gf-ingress x-ingress '^lock\\.x-ingress(-[0-9]+)?$' "
            "'^(dead-letters|fence\\.follow|fence\\.map-positions|amq\\.default)$' "
            "'^(" + "".join(f"x-ingress\\.p{i:02d}|" for i in range(16))
            + "x-ingress\\.positions|x-ingress\\.batches|x-ingress\\.proximity)$'") in lines
    assert ("api PUT api/queues/gf-fences/x-fence.w0 "
            "'{\"durable\":true,\"auto_delete\":false,\"arguments\":{\"x-queue-type\":\"quorum\","
            "\"x-single-active-consumer\":true}}'") in lines
    assert "amqp://federation:****@127.0.0.1:5672/gf-region-a" in text
    assert "api()" in p.api_function("http://127.0.0.1:15672/")


def test_api_paths_quote_names() -> None:
    assert p.api_path("queues", "/", "federation: a -> b") == "api/queues/%2F/federation%3A%20a%20-%3E%20b"


def test_a_retired_binding_is_removed_where_the_broker_has_it() -> None:
    cur = applied(DEFS, PASSWORDS)
    cur.bindings.add(("gf-fences", "fence.events", "fence.archive", "#"))  # before event batches
    cur.bindings.add(("gf-fences", "fence.events", "app.mine", "#"))  # an application's: kept
    assert p.plan(DEFS, PASSWORDS, cur) == [
        p.Http("DELETE", "api/bindings/gf-fences/e/fence.events/q/fence.archive/%23", None)]
    assert p.plan(DEFS, PASSWORDS, applied(DEFS, PASSWORDS)) == []  # not there: nothing to do


def test_a_retired_user_is_deleted_where_the_broker_has_it() -> None:
    """The shared gateway user (before tenants) goes; a tenant's gateway and device, a sensor
    and a user the topology does not know stay (the plan deletes only what it retired)."""
    cur = applied(DEFS, PASSWORDS)
    old = p.CurrentUser((), rabbit_hash("gw"), "rabbit_password_hashing_sha256")
    cur.users[t.GATEWAY_USER] = old
    cur.permissions[(t.GATEWAY_USER, "gf-ingress")] = ("^$", "^ingress\\.batches$", "^$")
    for other in ("acme.gw-1", "acme.dev-1", "dev-1", "s-1", "ops"):
        cur.users[other] = old
    steps = p.plan(DEFS, PASSWORDS, cur)
    assert steps == [p.ctl("delete_user", t.GATEWAY_USER)]
    assert p.section(steps[0]) == "users (password on stdin)"
    del cur.users[t.GATEWAY_USER]
    cur.permissions.pop((t.GATEWAY_USER, "gf-ingress"))
    assert p.plan(DEFS, PASSWORDS, cur) == []  # gone: nothing to do


def test_an_input_queue_declared_before_single_active_consumer_waits_for_the_operator() -> None:
    """A queue's arguments are fixed at declaration, and a quorum queue cannot be deleted "if
    empty" (a message published between the check and the delete would be lost): an input
    queue of a stack from before single active consumer is left as it is and named, until the
    operator redeclares (its publishers stopped): then, empty, it is deleted and declared again
    with its bindings; one holding messages is theirs to drain."""
    cur = applied(DEFS, PASSWORDS)
    key = ("gf-fences", "x-fence.w0")
    cur.queues[key] = {**cur.queues[key], "arguments": {"x-queue-type": "quorum"}}
    pending: list[str] = []
    assert p.plan(DEFS, PASSWORDS, cur, pending) == []
    cur.queues[key] = {**cur.queues[key], "messages": 5}  # a live stack's queue: left all the same
    assert p.plan(DEFS, PASSWORDS, cur, pending) == []
    assert pending == ["gf-fences/x-fence.w0"] * 2
    cur.queues[key] = {**cur.queues[key], "messages": 0}
    steps = p.plan(DEFS, PASSWORDS, cur, redeclare=True)
    assert steps[:2] == [p.Http("DELETE", "api/queues/gf-fences/x-fence.w0", None),
                         p.Http("PUT", "api/queues/gf-fences/x-fence.w0",
                                {"durable": True, "auto_delete": False,
                                 "arguments": {"x-queue-type": "quorum", "x-single-active-consumer": True}})]
    assert any(isinstance(x, p.Http) and x.method == "POST" and "/q/x-fence.w0" in x.path for x in steps)
    cur.queues[key] = {**cur.queues[key], "messages": 12}
    with pytest.raises(p.TopologyConflict, match="single-active-consumer queue: let its consumer drain it"):
        p.plan(DEFS, PASSWORDS, cur, redeclare=True)


def test_every_input_queue_of_a_single_instance_role_has_a_single_active_consumer() -> None:
    """One consumer at a time by the broker's rule (per-object order across a consumer's death,
    a cluster node's included); the API's queues are shared by its processes."""
    shared = {q for q in DEFS.queues if q.type == "quorum" and not q.single_active}
    assert {q.name for q in shared} == {t.API_QUEUE, t.FOLLOW_QUEUE}
    assert all(not q.single_active for q in DEFS.queues if q.type != "quorum")
    single = {q.name for q in DEFS.queues if q.single_active}
    assert single >= {"x-ingress.positions", "x-fence.w0", "x-geo.control"}
