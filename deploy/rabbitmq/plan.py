"""From what the broker holds to what the topology wants: the commands, in order. Pure.

Users, permissions, federation upstreams and policies are set with `rabbitmqctl` (passwords
on stdin, never in argv); exchanges, queues and bindings, which `rabbitmqctl` cannot
declare, with the management HTTP API. `render()` prints a step as the shell line an
operator would type (passwords masked); `plan(defs, passwords, Current.empty())` is the
whole script for an empty broker (`geofence topology show`).

Only differences produce steps, so applying twice runs nothing the second time. What the
plan never does: delete a vhost, a user, an exchange, a queue or a binding it does not know
(they may hold data or belong to somebody else). It does clear what it owns and no longer
wants: the permissions of the sidecar users in vhosts they should not use, the `gf-*`
policies and federation parameters of the topology's vhosts, and the bindings an earlier
topology declared (`definitions.RETIRED_BINDINGS`, and the users of `RETIRED_USERS`).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from deploy.rabbitmq.credentials import limits_of
from deploy.rabbitmq.definitions import (
    QUORUM,
    SIDECAR_USERS,
    Binding,
    Definitions,
    Exchange,
    Parameter,
    Permission,
    Policy,
    Queue,
    TopicPermission,
)
from exchanges.ingress_partitions import EXCHANGE_TYPE as CONSISTENT_HASH
from exchanges.login_guard import rabbit_hash_ok
from exchanges.settings import mask

MASK = "****"
OWNED_PREFIX = "gf-"  # policies and federation parameters the plan may clear
FEDERATION_COMPONENTS = ("federation-upstream", "federation-upstream-set")
# Not among the plugins `geofence up` enables before the node starts: the federation links'
# status page of the management API (/api/federation-links), enabled online.
EXTRA_PLUGINS = ("rabbitmq_federation_management",)
# The Debian wrapper runs `su rabbitmq -c "rabbitmqctl \"arg\" ..."`: inside those double
# quotes the shell still expands $name, ${, $(, backquotes, and eats a backslash before
# \ $ ` " or a newline. Arguments with any of these would reach rabbitmqctl changed.
_WRAPPER_UNSAFE = re.compile(r"`|\$[A-Za-z0-9_{(@*#?!$-]|\\[\\$`\"\n]")


class TopologyConflict(ValueError):
    """Something of the topology's exists with other properties; it is not changed by force."""


# --------------------------------------------------------------------------- steps


@dataclass(frozen=True)
class Ctl:
    """A `rabbitmqctl` (or `rabbitmq-plugins`) command; `stdin` carries a password."""

    argv: tuple[str, ...]
    stdin: str | None = None


@dataclass(frozen=True)
class Http:
    """A management API call; `path` is relative to the management URL ("api/...")."""

    method: str
    path: str
    body: Any


Step = Ctl | Http


def ctl(*argv: str, stdin: str | None = None) -> Ctl:
    return Ctl(("rabbitmqctl", *argv), stdin)


def api_path(*parts: str) -> str:
    return "api/" + "/".join(quote(p, safe="") for p in parts)


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=False)


def wrapper_safe(arg: str) -> bool:
    """True if the Debian rabbitmqctl wrapper passes `arg` through unchanged."""
    return _WRAPPER_UNSAFE.search(arg) is None



def api_function(management_url: str) -> str:
    """The shell function the rendered management API calls use."""
    return (f"api() {{ curl -fsS -u \"geofence:$GEOFENCE_PASSWORD\" -X \"$1\" "
            f"-H 'content-type: application/json' \"{management_url}$2\" -d \"$3\"; }}")


def render(step: Step, hidden: Iterable[str] = ()) -> str:
    """The shell line of a step, secrets masked. A management API call is written
    `api METHOD PATH JSON` (see `api_function`)."""
    hidden = tuple(hidden)
    if isinstance(step, Ctl):
        line = mask(shlex.join(step.argv), hidden)
        if step.stdin is not None:
            line = f"printf '%s\\n' {shlex.quote(mask(step.stdin, hidden))} | {line}"
        return line
    return mask(shlex.join(["api", step.method, step.path, compact_json(step.body)]), hidden)


# --------------------------------------------------------------------------- steps per object


def set_permissions(p: Permission) -> Ctl:
    return ctl("set_permissions", "-p", p.vhost, p.user, p.configure, p.write, p.read)


def set_topic_permissions(p: TopicPermission) -> Ctl:
    return ctl("set_topic_permissions", "-p", p.vhost, p.user, p.exchange, p.write, p.read)


def set_parameter(p: Parameter) -> Ctl:
    return ctl("set_parameter", "-p", p.vhost, p.component, p.name, compact_json(p.value))


def set_policy(p: Policy) -> Ctl:
    return ctl("set_policy", "-p", p.vhost, "--priority", str(p.priority), "--apply-to", p.apply_to,
               p.name, p.pattern, compact_json(p.definition))


EXCHANGE_PROPERTIES = {"durable": True, "auto_delete": False, "internal": False, "arguments": {}}
QUEUE_PROPERTIES = {"durable": True, "auto_delete": False, "arguments": {}}


def declare_exchange(x: Exchange) -> Http:
    return Http("PUT", api_path("exchanges", x.vhost, x.name), {"type": x.type, **EXCHANGE_PROPERTIES})


SAC = "x-single-active-consumer"


def queue_arguments(q: Queue) -> dict[str, Any]:
    return {"x-queue-type": q.type, **({SAC: True} if q.single_active else {})}


def declare_queue(q: Queue) -> Http:
    return Http("PUT", api_path("queues", q.vhost, q.name),
                {**QUEUE_PROPERTIES, "arguments": queue_arguments(q)})


def delete_empty_queue(q: Queue) -> Http:
    """Delete a queue only if it holds no message (the broker refuses otherwise)."""
    return Http("DELETE", api_path("queues", q.vhost, q.name) + "?if-empty=true", None)


def delete_queue(q: Queue) -> Http:
    """Delete a queue whatever it holds (a quorum queue has no "if empty": the caller checked,
    its publishers stopped)."""
    return Http("DELETE", api_path("queues", q.vhost, q.name), None)


def bind(b: Binding) -> Http:
    return Http("POST", api_path("bindings", b.vhost, "e", b.source, b.destination_type, b.queue),
                {"routing_key": b.routing_key, "arguments": {}})


def unbind(b: Binding) -> Http:
    """Remove a binding without arguments (its properties key is its routing key, "~" if empty)."""
    return Http("DELETE", api_path("bindings", b.vhost, "e", b.source, b.destination_type, b.queue,
                                   b.routing_key or "~"), None)


# --------------------------------------------------------------------------- the broker's state


@dataclass(frozen=True)
class CurrentUser:
    tags: tuple[str, ...]
    password_hash: str
    hashing_algorithm: str


@dataclass
class Current:
    """What the broker holds (the part the plan compares), read by `apply.read_broker`."""

    federation_api: bool = False  # /api/federation-links answers
    vhosts: set[str] = field(default_factory=set)
    users: dict[str, CurrentUser] = field(default_factory=dict)
    permissions: dict[tuple[str, str], tuple[str, str, str]] = field(default_factory=dict)
    exchanges: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    queues: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    bindings: set[tuple[str, str, str, str]] = field(default_factory=set)  # vhost, src, queue, key
    parameters: dict[tuple[str, str, str], Any] = field(default_factory=dict)  # vhost, comp, name
    policies: dict[tuple[str, str], Policy] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> Current:
        return cls()


def password_matches(user: CurrentUser, password: str) -> bool:
    """Checks a password against RabbitMQ's stored hash: base64(salt[4] + H(salt + pw))."""
    return rabbit_hash_ok(password, user.password_hash, user.hashing_algorithm)


def queue_type(have: Mapping[str, Any]) -> str:
    return str(have.get("type") or (have.get("arguments") or {}).get("x-queue-type") or "classic")


def single_active(have: Mapping[str, Any]) -> bool:
    return (have.get("arguments") or {}).get(SAC) is True


def _queue_conflict(have: Mapping[str, Any]) -> bool:
    args = {k: v for k, v in (have.get("arguments") or {}).items() if k not in ("x-queue-type", SAC)}
    return (bool(have.get("durable")) is not True or bool(have.get("auto_delete"))
            or bool(have.get("exclusive")) or args != {})


def _kind(q: Queue | Mapping[str, Any]) -> str:
    if isinstance(q, Queue):
        kind, sac = q.type, q.single_active
    else:
        kind, sac = queue_type(q), single_active(q)
    return f"{kind}{' single-active-consumer' if sac else ''}"


def _exchange_conflict(x: Exchange, have: Mapping[str, Any]) -> bool:
    return (have.get("type") != x.type or bool(have.get("durable")) is not True
            or bool(have.get("auto_delete")) or bool(have.get("internal"))
            or (have.get("arguments") or {}) != {})


# --------------------------------------------------------------------------- the plan


def plan(defs: Definitions, passwords: Mapping[str, str], current: Current,
         pending: list[str] | None = None, redeclare: bool = False) -> list[Step]:
    """The steps that make the broker hold `defs`, in an order that works on an empty one:
    plugins, vhosts, users, permissions, exchanges, queues, bindings, federation upstreams,
    policies. Raises TopologyConflict if an exchange or queue exists with other properties.
    A quorum queue declared with another single-active-consumer flag is named in `pending`
    and left as it is, unless `redeclare` (see `_declare_steps`)."""
    steps: list[Step] = []
    if not current.federation_api:
        steps.append(Ctl(("rabbitmq-plugins", "enable", *EXTRA_PLUGINS)))
    steps += [ctl("add_vhost", v) for v in defs.vhosts if v not in current.vhosts]
    steps += _user_steps(defs, passwords, current)
    steps += _permission_steps(defs, current)
    steps += _declare_steps(defs, current, pending if pending is not None else [], redeclare)
    steps += _parameter_steps(defs, current)
    steps += _policy_steps(defs, current)
    return steps


def _user_steps(defs: Definitions, passwords: Mapping[str, str], current: Current) -> list[Step]:
    steps: list[Step] = []
    for user in defs.users:
        try:
            password = passwords[user.name]
        except KeyError:
            raise ValueError(f"no password for RabbitMQ user {user.name!r}") from None
        have = current.users.get(user.name)
        if have is None:
            steps.append(ctl("add_user", user.name, stdin=password))
        elif not password_matches(have, password):
            steps.append(ctl("change_password", user.name, stdin=password))
        if sorted(user.tags) != sorted(have.tags if have else ()):
            steps.append(ctl("set_user_tags", user.name, *user.tags))
    # a retired sidecar user had no tag: one that has a tag now is somebody else's (a device's, ...)
    steps += [ctl("delete_user", name) for name in defs.retired_users
              if name in current.users and not current.users[name].tags]
    return steps


def _permission_steps(defs: Definitions, current: Current) -> list[Step]:
    steps: list[Step] = []
    wanted = {(p.user, p.vhost) for p in defs.permissions}
    for p in defs.permissions:
        if current.permissions.get((p.user, p.vhost)) != (p.configure, p.write, p.read):
            steps.append(set_permissions(p))
    for user, vhost in sorted(current.permissions):
        if user in SIDECAR_USERS and (user, vhost) not in wanted:
            steps.append(ctl("clear_permissions", "-p", vhost, user))
    return steps


def _declare_steps(defs: Definitions, current: Current, pending: list[str], redeclare: bool) -> list[Step]:
    steps: list[Step] = []
    conflicts: list[str] = []
    for x in defs.exchanges:
        have_x = current.exchanges.get((x.vhost, x.name))
        if have_x is None:
            steps.append(declare_exchange(x))
        elif _exchange_conflict(x, have_x):
            conflicts.append(f"exchange {x.name} in {x.vhost} is {compact_json(have_x)}, "
                             f"the topology wants a durable {x.type} exchange without arguments")
    redeclared: set[tuple[str, str]] = set()
    for q in defs.queues:
        have_q = current.queues.get((q.vhost, q.name))
        if have_q is None:
            steps.append(declare_queue(q))
        elif _queue_conflict(have_q):
            conflicts.append(f"queue {q.name} in {q.vhost} is {compact_json(have_q)}, the "
                             f"topology wants a durable {_kind(q)} queue without other arguments")
        elif queue_type(have_q) != q.type or single_active(have_q) != q.single_active:
            # A queue's type and arguments are fixed at declaration: an empty one is deleted and
            # declared again (with its bindings); one holding messages is left for the operator.
            # A quorum queue cannot be deleted "if empty": what is published between the check
            # and the delete would be lost, so only on the operator's word (`redeclare`, its
            # publishers stopped); until then it works as declared, and is named in `pending`.
            if queue_type(have_q) == QUORUM and not redeclare:
                pending.append(f"{q.vhost}/{q.name}")
            elif int(have_q.get("messages") or 0):
                conflicts.append(f"queue {q.name} in {q.vhost} is a {_kind(have_q)} queue holding "
                                 f"{have_q['messages']} messages, the topology wants a {_kind(q)} queue: "
                                 "let its consumer drain it (stop its publishers) and apply again")
            else:
                delete = delete_queue(q) if queue_type(have_q) == QUORUM else delete_empty_queue(q)
                steps += [delete, declare_queue(q)]
                redeclared.add((q.vhost, q.name))
    if conflicts:
        raise TopologyConflict("; ".join(conflicts) + ": delete them (management UI or API) "
                               "and apply again; settings belong in policies")
    missing = [b for b in defs.bindings if (b.vhost, b.source, b.queue, b.routing_key) not in current.bindings
               or (b.vhost, b.queue) in redeclared]
    # A consistent-hash exchange numbers its buckets in the order its bindings came, and in
    # queue-name order after a broker restart (exchanges/ingress_partitions.py): one of its
    # bindings missing, they are all bound again, in order, so both orders agree.
    hashed = {(x.vhost, x.name) for x in defs.exchanges if x.type == CONSISTENT_HASH}
    redo = {(b.vhost, b.source) for b in missing if (b.vhost, b.source) in hashed}
    ordered = [b for b in defs.bindings if (b.vhost, b.source) in redo]
    steps += [unbind(b) for b in ordered if (b.vhost, b.source, b.queue, b.routing_key) in current.bindings
              and (b.vhost, b.queue) not in redeclared]
    steps += [bind(b) for b in defs.bindings if b in missing or b in ordered]
    steps += [unbind(b) for b in defs.retired_bindings
              if (b.vhost, b.source, b.queue, b.routing_key) in current.bindings]
    return steps


def _parameter_steps(defs: Definitions, current: Current) -> list[Step]:
    steps: list[Step] = [set_parameter(p) for p in defs.parameters
                         if current.parameters.get((p.vhost, p.component, p.name)) != p.value]
    wanted = {(p.vhost, p.component, p.name) for p in defs.parameters}
    for vhost, component, name in sorted(current.parameters):
        if (vhost in defs.vhosts and component in FEDERATION_COMPONENTS
                and name.startswith(OWNED_PREFIX) and (vhost, component, name) not in wanted):
            steps.append(ctl("clear_parameter", "-p", vhost, component, name))
    return steps


def _policy_steps(defs: Definitions, current: Current) -> list[Step]:
    steps: list[Step] = [set_policy(p) for p in defs.policies
                         if current.policies.get((p.vhost, p.name)) != p]
    wanted = {(p.vhost, p.name) for p in defs.policies}
    for vhost, name in sorted(current.policies):
        if vhost in defs.vhosts and name.startswith(OWNED_PREFIX) and (vhost, name) not in wanted:
            steps.append(ctl("clear_policy", "-p", vhost, name))
    return steps


def device_steps(user: str, password: str, permission: Permission,
                 topic_permissions: tuple[TopicPermission, ...], tags: tuple[str, ...]) -> list[Step]:
    """`geofence device add` (and gateway, application, sensor): the user with its tags, its
    connection and channel limits, its permissions, its topic permissions. Management API
    calls, not rabbitmqctl: a call takes milliseconds where rabbitmqctl boots an Erlang VM
    (about a second each, five per device), and the password still never reaches an argv
    (it is the body of a request to the loopback management listener)."""
    limits = limits_of(tags) or {}
    return [Http("PUT", api_path("users", user), {"password": password, "tags": ",".join(tags)}),
            *(Http("PUT", api_path("user-limits", user, name), {"value": value})
              for name, value in limits.items()),
            Http("PUT", api_path("permissions", permission.vhost, user),
                 {"configure": permission.configure, "write": permission.write, "read": permission.read}),
            *(Http("PUT", api_path("topic-permissions", p.vhost, user),
                   {"exchange": p.exchange, "write": p.write, "read": p.read}) for p in topic_permissions)]


def delete_user_step(user: str) -> Http:
    """A device's (gateway's, application's, sensor's) user deleted over the management API."""
    return Http("DELETE", api_path("users", user), None)


def section(step: Step) -> str:
    """What a step is about, for the comments of `geofence topology show`."""
    if isinstance(step, Http):
        kind = step.path.split("/")[1]
        return {"exchanges": "exchanges (management API)", "queues": "queues (management API)",
                "bindings": "bindings (management API)"}.get(kind, kind)
    verb = step.argv[1]
    if step.argv[0] == "rabbitmq-plugins":
        return "plugins"
    return {"add_vhost": "vhosts", "add_user": "users (password on stdin)",
            "delete_user": "users (password on stdin)",
            "change_password": "users (password on stdin)",
            "set_user_tags": "users (password on stdin)",
            "set_permissions": "permissions (configure, write, read)",
            "clear_permissions": "permissions (configure, write, read)",
            "set_topic_permissions": "topic permissions (write, read)",
            "set_parameter": "federation upstreams", "clear_parameter": "federation upstreams",
            "set_policy": "policies", "clear_policy": "policies"}.get(verb, verb)
