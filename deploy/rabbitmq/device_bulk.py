"""Devices by the thousand: `geofence device add --tenant T --file IDS` / `remove --file IDS`.

`geofence device add ID` costs a few broker CLI calls (about 0.85 s a device): ten thousand
trackers would take hours. Here a whole file of ids goes in as RabbitMQ definitions imports
(`POST /api/definitions`, a few thousand users per request), with exactly the rights of a
single `device add` (`definitions.device_permission`, `device_topic_permission`, the
`gf-device` tag).

Trade-off: the import carries password *hashes* (RabbitMQ's salted SHA-256, computed here),
never the passwords; the passwords go out once, in the credentials file, and are kept
nowhere else, as with `device add`. Idempotent: an id that is a device already keeps its
password (the file says "exists") and gets its rights set again; an id that is another kind
of user is refused, as is a bad id, before anything is written.
"""

from __future__ import annotations

import csv
import io
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from deploy.rabbitmq import credentials as cred
from deploy.rabbitmq.apply import tags_of
from deploy.rabbitmq.plan import api_path
from exchanges import topology as t
from exchanges.ids import check_object_id
from exchanges.login_guard import rabbit_hash

HASHING = "rabbit_password_hashing_sha256"
CHUNK = 2_000  # users per definitions import


class BulkError(ValueError):
    pass


class BadIds(BulkError):
    """The file of ids is not what it should be (deploy/exit_codes.py: bad usage)."""

    exit_code = 2


def password_hash(password: str, salt: bytes | None = None) -> str:
    """RabbitMQ's rabbit_password_hashing_sha256: base64(salt(4) + sha256(salt + password))."""
    return rabbit_hash(password, secrets.token_bytes(4) if salt is None else salt, HASHING)


def parse_ids(text: str, reserved: Iterable[str]) -> list[str]:
    """Object ids, one a line (blank lines and `#` comments skipped, repeats once), in file
    order; BulkError naming every bad line."""
    taken = frozenset(reserved)
    ids: dict[str, None] = {}
    bad = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            check_object_id(line)
        except ValueError as exc:
            bad.append(f"line {n}: {exc}")
            continue
        if line in taken:
            bad.append(f"line {n}: {line!r} is a reserved RabbitMQ user name")
            continue
        ids[line] = None
    if bad:
        shown = "; ".join(bad[:10]) + (f"; and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise BadIds(f"{len(bad)} bad line(s), nothing done: {shown}")
    return list(ids)


@dataclass(frozen=True)
class Plan:
    new: list[str]
    existing: list[str]  # devices already: rights set again, password kept


def plan(ids: list[str], users: list[dict[str, Any]]) -> Plan:
    """Which ids are new and which are devices already (`users`: GET api/users);
    BulkError for an id that is a user of another kind."""
    kinds = {str(u["name"]): tags_of(u.get("tags")) for u in users}
    others = [i for i in ids if i in kinds and t.DEVICE_TAG not in kinds[i]]
    if others:
        raise BulkError(f"{len(others)} id(s) are RabbitMQ users that are not devices, nothing done: "
                        f"{', '.join(others[:10])}")
    return Plan([i for i in ids if i not in kinds], [i for i in ids if i in kinds])


def definitions(new: list[tuple[str, str]], existing: list[str]) -> dict[str, Any]:
    """One definitions document: users (new ones, by password hash), and for every id its
    permission and topic permission in gf-ingress, as `device add` sets them."""
    users = [{"name": i, "password_hash": password_hash(p), "hashing_algorithm": HASHING,
              "tags": [t.DEVICE_TAG], "limits": cred.USER_LIMITS[t.DEVICE_TAG]} for i, p in new]
    perms, topics = [], []
    for i in [i for i, _ in new] + existing:
        p, tp = cred.device_permission(i), cred.device_topic_permission(i)
        perms.append({"user": p.user, "vhost": p.vhost, "configure": p.configure, "write": p.write,
                      "read": p.read})
        topics.append({"user": tp.user, "vhost": tp.vhost, "exchange": tp.exchange, "write": tp.write,
                       "read": tp.read})
    return {"users": users, "permissions": perms, "topic_permissions": topics}


def credentials_csv(rows: list[tuple[str, str | None]], tenant: str) -> str:
    """tenant, object_id, mqtt_login, client_id, topic, password ("" for a device that existed
    already)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["tenant", "object_id", "mqtt_login", "client_id", "topic", "password"])
    for object_id, password in rows:
        user = cred.device_user(tenant, object_id)
        w.writerow([tenant, object_id, f"{t.INGRESS_VHOST}:{user}", user,
                    f"{t.POSITIONS_TOPIC_PREFIX}/{tenant}/{object_id}", password or ""])
    return out.getvalue()


class Broker:
    """What the bulk path needs of the management API (deploy.rabbitmq.management)."""

    def __init__(self, request: Callable[..., Any]) -> None:
        self.request = request

    def users(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.request("GET", "api/users?columns=name,tags")
        return found


def add_many(broker: Broker, tenant: str, object_ids: list[str], say: Callable[[str], None],
             chunk: int = CHUNK, step: Callable[[int, int], None] | None = None
             ) -> list[tuple[str, str | None]]:
    """Create `tenant`'s new devices and set every device's rights; (object id, password or
    None if it existed) in the order given. `step(done, total)` after each chunk."""
    ids = [cred.device_user(tenant, i) for i in object_ids]
    p = plan(ids, broker.users())
    passwords = {i: secrets.token_urlsafe(24) for i in p.new}
    new, existing = list(passwords.items()), list(p.existing)
    done = 0
    while new or existing:
        part_new, new = new[:chunk], new[chunk:]
        room = max(0, chunk - len(part_new))
        part_old, existing = existing[:room], existing[room:]
        broker.request("POST", "api/definitions", definitions(part_new, part_old))
        done += len(part_new) + len(part_old)
        say(f"  {done:,} / {len(ids):,} devices")
        if step is not None:
            step(done, len(ids))
    return [(o, passwords.get(i)) for o, i in zip(object_ids, ids, strict=True)]


def remove_many(broker: Broker, tenant: str, object_ids: list[str], say: Callable[[str], None]) -> int:
    """Delete `tenant`'s device users among `object_ids` (one bulk delete), close their
    connections and delete their MQTT subscription queues; how many were devices."""
    ids = [cred.device_user(tenant, i) for i in object_ids]
    kinds = {str(u["name"]): tags_of(u.get("tags")) for u in broker.users()}
    gone = [i for i in ids if t.DEVICE_TAG in kinds.get(i, [])]
    for start in range(0, len(gone), CHUNK):
        broker.request("POST", "api/users/bulk-delete", {"users": gone[start:start + CHUNK]})
    wanted = set(gone)
    for conn in broker.request("GET", "api/connections?columns=name,user") or []:
        if conn.get("user") in wanted:
            broker.request("DELETE", api_path("connections", conn["name"]))
    queues = {q for i in gone for q in cred.device_queues(i)}
    for q in broker.request("GET", api_path("queues", t.INGRESS_VHOST) + "?columns=name") or []:
        if q["name"] in queues:
            broker.request("DELETE", api_path("queues", t.INGRESS_VHOST, q["name"]))
    say(f"  {len(gone):,} devices removed ({len(ids) - len(gone):,} of the ids were not devices)")
    return len(gone)


