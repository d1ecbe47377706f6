"""Apply the topology to the local stack's broker: read it (management API), plan, run.

`apply()` always compares everything (`geofence topology apply`); `ensure()` is what
`geofence up` calls: it skips the comparison when the hash of the wanted definitions
(passwords included) equals the one stored in the state dir after the last successful
apply and the vhosts still exist (a reset broker has none, and is set up again).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from deploy.processes import POLL_INTERVAL, Say, StackError, run
from deploy.rabbitmq import credentials as cred
from deploy.rabbitmq import definitions as d
from deploy.rabbitmq.management import Management, ManagementError
from deploy.rabbitmq.nodes import StackSecrets, StackSettings, broker2_node
from deploy.rabbitmq.plan import (
    FEDERATION_COMPONENTS,
    Ctl,
    Current,
    CurrentUser,
    Http,
    Step,
    TopologyConflict,
    api_path,
    delete_user_step,
    plan,
    render,
    set_topic_permissions,
    wrapper_safe,
)
from exchanges import topology as t
from exchanges.login_guard import rabbit_hash_ok
from exchanges.settings import mask

STAMP_NAME = "rabbitmq-topology.sha256"


class TopologyError(StackError):
    """The topology could not be read or applied."""


def management(settings: StackSettings, pw: StackSecrets, broker: int = 1) -> Management:
    """The management API of the first node, or of the second (`broker` 2)."""
    url = f"http://{settings.host}:{settings.broker_management_port(broker)}/"
    return Management(url, t.ADMIN_USER, pw.rabbitmq_password)


def broker_of_vhost(settings: StackSettings, vhost: str) -> int:
    return settings.broker_of(vhost.removeprefix(t.REGION_VHOST_PREFIX)) \
        if vhost.startswith(t.REGION_VHOST_PREFIX) else 1


def on_node(step: Step, broker: int) -> Step:
    """A step for the second node: its rabbitmqctl / rabbitmq-plugins calls name it."""
    if broker == 1 or not isinstance(step, Ctl):
        return step
    return Ctl((step.argv[0], "-n", broker2_node(), *step.argv[1:]), step.stdin)


def passwords(pw: StackSecrets) -> dict[str, str]:
    found = {t.ADMIN_USER: pw.rabbitmq_password, **pw.users}
    missing = [u for u in d.SIDECAR_USERS if u not in found]
    if missing:
        raise TopologyError(f"no password for {', '.join(missing)}: run `geofence up` "
                            "(it adds the missing ones to the secrets file)")
    return found


def definitions_for(settings: StackSettings, pw: StackSecrets) -> d.Definitions:
    """The whole topology (the federation upstream of a region placed on the second node
    connects there)."""
    ca = str(settings.state_dir / "tls" / "rabbitmq" / "ca.pem")  # the brokers' copy (services.server_tls)
    elsewhere = {t.region_vhost(r): d.Endpoint(settings.host, settings.broker_amqp_port(b),
                                               settings.amqps_port, ca)
                 for r, b in settings.placement}
    return d.build(settings.topology, d.Endpoint(settings.host, settings.amqp_port, settings.amqps_port, ca),
                   passwords(pw)[t.FEDERATION_USER], elsewhere)


def per_broker(settings: StackSettings, pw: StackSecrets) -> list[tuple[int, d.Definitions]]:
    """What each node holds: the second its placed regions' vhosts (and every user), the
    first everything else, with the federation upstreams."""
    defs = definitions_for(settings, pw)
    if settings.broker_count == 1:
        return [(1, defs)]
    second = {v for v in defs.vhosts if broker_of_vhost(settings, v) == 2}
    return [(1, defs.held_by([v for v in defs.vhosts if v not in second], parameters=True)),
            (2, defs.held_by(second, parameters=False))]


# --------------------------------------------------------------------------- reading the broker


def tags_of(raw: object) -> tuple[str, ...]:
    """A management API user's `tags`: a list, or "a,b" on older brokers."""
    if isinstance(raw, str):  # older brokers: "a,b"
        return tuple(x for x in raw.split(",") if x)
    return tuple(str(x) for x in raw) if isinstance(raw, list | tuple) else ()


def read_broker(mgmt: Management, defs: d.Definitions) -> Current:
    ours = set(defs.vhosts)
    cur = Current(federation_api=mgmt.exists("api/federation-links"))
    cur.vhosts = {v["name"] for v in mgmt.get("api/vhosts?columns=name")}
    cur.users = {u["name"]: CurrentUser(tags_of(u.get("tags")), u.get("password_hash", ""),
                                        u.get("hashing_algorithm", ""))
                 for u in mgmt.get("api/users")}
    cur.permissions = {(p["user"], p["vhost"]): (p["configure"], p["write"], p["read"])
                       for p in mgmt.get("api/permissions")}
    cur.exchanges = {(x["vhost"], x["name"]): x for x in mgmt.get(
        "api/exchanges?columns=vhost,name,type,durable,auto_delete,internal,arguments")
        if x["vhost"] in ours}
    cur.queues = {(q["vhost"], q["name"]): q for q in mgmt.get(
        "api/queues?columns=vhost,name,type,durable,auto_delete,exclusive,arguments,messages")
        if q["vhost"] in ours}
    cur.bindings = {(b["vhost"], b["source"], b["destination"], b["routing_key"])
                    for b in mgmt.get("api/bindings")
                    if b["vhost"] in ours and b["destination_type"] in ("queue", "exchange")}
    for component in FEDERATION_COMPONENTS:
        for p in mgmt.get(f"api/parameters/{component}"):
            cur.parameters[(p["vhost"], component, p["name"])] = p["value"]
    cur.policies = {(p["vhost"], p["name"]): d.Policy(p["vhost"], p["name"], p["pattern"],
                                                      p["definition"], int(p["priority"]),
                                                      p["apply-to"])
                    for p in mgmt.get("api/policies")}
    return cur


def read_with_retry(mgmt: Management, defs: d.Definitions, timeout: float) -> Current:
    """read_broker, again while the API is not ready (no answer or a 5xx, as right after
    the node started), until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return read_broker(mgmt, defs)
        except ManagementError as exc:
            if (exc.status is not None and exc.status < 500) or time.monotonic() >= deadline:
                raise TopologyError(f"cannot read the broker: {exc}") from None
        time.sleep(POLL_INTERVAL)


def quick_check(mgmt: Management, defs: d.Definitions) -> bool:
    """Cheap: the vhosts and every queue exist, and the federation status API answers. (A
    queue deleted behind the stack's back, or lost with a cluster node, is declared again.)"""
    try:
        vhosts = {v["name"] for v in mgmt.get("api/vhosts?columns=name")}
        if not set(defs.vhosts) <= vhosts or not mgmt.exists("api/federation-links"):
            return False
        for vhost in defs.vhosts:
            held = {q["name"] for q in mgmt.get(api_path("queues", vhost) + "?columns=name")}
            if any(q.name not in held for q in defs.queues if q.vhost == vhost):
                return False
        return True
    except StackError:
        return False


# --------------------------------------------------------------------------- running steps


def run_steps(steps: list[Step], mgmt: Management, hidden: tuple[str, ...], say: Say) -> None:
    for step in steps:
        say("  " + render(step, hidden))
        try:
            if isinstance(step, Ctl):
                unsafe = [a for a in step.argv if not wrapper_safe(a)]
                if unsafe:
                    raise TopologyError(f"argument {unsafe[0]!r} would be changed by the "
                                        "rabbitmqctl wrapper's shell")
                run(step.argv, stdin=None if step.stdin is None else step.stdin + "\n")
            else:
                mgmt.request(step.method, step.path, step.body)
        except StackError as exc:
            raise TopologyError(mask(str(exc), hidden)) from None


def _stamp_path(settings: StackSettings) -> Path:
    return settings.state_dir / STAMP_NAME


def apply(settings: StackSettings, pw: StackSecrets, say: Say, dry_run: bool = False,
          redeclare: bool = False) -> list[Step]:
    """Compare everything and run what differs, on each node; returns the steps (run, or
    not if dry_run). `redeclare`: the empty quorum queues declared with other arguments are
    deleted and declared again (their publishers stopped: see plan._declare_steps)."""
    pws = passwords(pw)
    hidden = tuple(pws.values())
    done: list[Step] = []
    pending: list[str] = []
    for broker, defs in per_broker(settings, pw):
        mgmt = management(settings, pw, broker)
        try:
            steps = [on_node(x, broker)
                     for x in plan(defs, pws, read_with_retry(mgmt, defs, settings.start_timeout), pending,
                                   redeclare)]
        except TopologyConflict as exc:
            raise TopologyError(str(exc)) from None
        if broker != 1 and steps:
            say(f"  on the second node ({broker2_node()}):")
        if dry_run:
            for step in steps:
                say(render(step, hidden))
        else:
            run_steps(steps, mgmt, hidden, say)
        done += steps
    if pending:  # said at every apply (no stamp) until they are declared again
        say(f"  {len(pending)} input queue(s) declared before single active consumer, left as they are: "
            f"{', '.join(pending)}. They work, but a cluster node's loss can reorder their messages. "
            "To declare them again: stop what publishes to them (devices, gateways), let them drain, then "
            "`geofence topology apply --redeclare-input-queues`")
    elif not dry_run:
        write_stamp(settings, digest(settings, pw))
    return done


def digest(settings: StackSettings, pw: StackSecrets) -> str:
    pws = passwords(pw)
    return "-".join(f"{b}:{defs.digest(pws)}" for b, defs in per_broker(settings, pw))


def write_stamp(settings: StackSettings, digest: str) -> None:
    path = _stamp_path(settings)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # a hash of passwords
    with os.fdopen(fd, "w") as f:
        f.write(digest + "\n")
    os.replace(tmp, path)


def read_stamp(settings: StackSettings) -> str | None:
    try:
        return str(_stamp_path(settings).read_text().strip())
    except FileNotFoundError:
        return None


def ensure(settings: StackSettings, pw: StackSecrets, say: Say) -> None:
    """`geofence up`: apply the topology unless nothing changed since the last apply."""
    if read_stamp(settings) == digest(settings, pw) and all(
            quick_check(management(settings, pw, b), defs) for b, defs in per_broker(settings, pw)):
        say("rabbitmq topology: up to date")
    else:
        say("rabbitmq topology: applying")
        steps = apply(settings, pw, say)
        say(f"rabbitmq topology: {len(steps)} change(s)" if steps else "rabbitmq topology: no change")
    stale = device_permission_steps(management(settings, pw))
    if stale:
        say(f"rabbitmq devices: {len(stale)} topic permission(s) brought up to date")
        run_steps(stale, management(settings, pw), tuple(passwords(pw).values()), say)
    for broker in range(1, settings.broker_count + 1):
        mgmt = management(settings, pw, broker)
        steps = host_default_steps(mgmt.get("api/users"), mgmt.get("api/user-limits"))
        if steps:
            say(f"rabbitmq users{' (second node)' if broker != 1 else ''}: {len(steps)} change(s) "
                "(the default guest removed, client users' connection and channel limits)")
            run_steps(steps, mgmt, tuple(passwords(pw).values()), say)


def host_default_steps(users: list[dict[str, Any]], limits: list[dict[str, Any]]) -> list[Step]:
    """What a broker on a host must not keep (issue 37): RabbitMQ's `guest` while its password
    is still `guest` (an operator who changed it keeps it), and client users (devices,
    sensors, gateways, applications) without their kind's connection and channel limits
    (users made by an older release, or whose limits an operator cleared)."""
    have = {str(x["user"]): dict(x.get("value") or {}) for x in limits}
    steps: list[Step] = []
    for u in users:
        name = str(u["name"])
        stored = u.get("password_hash", ""), u.get("hashing_algorithm", "")
        if name == "guest" and rabbit_hash_ok("guest", *stored):
            steps.append(delete_user_step(name))
            continue
        want = cred.limits_of(tags_of(u.get("tags")))
        for key, value in (want or {}).items():
            if have.get(name, {}).get(key) != value:
                steps.append(Http("PUT", api_path("user-limits", name, key), {"value": value}))
    return steps


def device_permission_steps(mgmt: Management) -> list[Step]:
    """Devices (users tagged gf-device) whose topic permission is not the current one (an
    older release's topic layout): one set_topic_permissions each."""
    users = mgmt.get("api/users")
    current = {(p["user"], p["vhost"], p["exchange"]): (p["write"], p["read"])
               for p in mgmt.get("api/topic-permissions")}
    steps: list[Step] = []
    for u in users:
        tags = u.get("tags")
        tags = tags.split(",") if isinstance(tags, str) else list(tags or [])
        if t.DEVICE_TAG not in tags:
            continue
        try:
            want = cred.device_topic_permission(str(u["name"]))
        except ValueError:  # not an object id: not ours to fix
            continue
        if current.get((want.user, want.vhost, want.exchange)) != (want.write, want.read):
            steps.append(set_topic_permissions(want))
    return steps

