"""The bulk device path's pure parts (deploy/rabbitmq/device_bulk.py) and its use of the
management API, against a recording fake (the live broker: tests/integration/test_devices_bulk.py)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
from typing import Any

import pytest

from deploy.rabbitmq import definitions as d
from deploy.rabbitmq import device_bulk as b
from exchanges import topology as t


def test_password_hash_is_rabbitmqs_salted_sha256() -> None:
    h = base64.b64decode(b.password_hash("secret", b"\x01\x02\x03\x04"))
    assert h[:4] == b"\x01\x02\x03\x04" and h[4:] == hashlib.sha256(b"\x01\x02\x03\x04secret").digest()
    assert b.password_hash("secret") != b.password_hash("secret")  # a fresh salt each time
    with pytest.raises(ValueError):
        b.password_hash("x", b"abc")


def test_parse_ids_skips_blanks_comments_and_repeats() -> None:
    assert b.parse_ids("a1\n\n  b2  # a car\n# nothing\na1\nc-3\n", {"geofence"}) == ["a1", "b2", "c-3"]
    assert b.parse_ids("", ()) == []


def test_parse_ids_names_every_bad_line_and_keeps_nothing() -> None:
    with pytest.raises(b.BulkError) as err:
        b.parse_ids("ok\nbad id\n-lead\ngeofence\n" + "x" * 65 + "\n", {"geofence"})
    text = str(err.value)
    assert text.startswith("4 bad line(s), nothing done")
    assert "line 2" in text and "line 3" in text and "line 5" in text
    assert "line 4: 'geofence' is a reserved" in text


def test_plan_splits_new_and_existing_devices_and_refuses_other_users() -> None:
    users = [{"name": "old", "tags": [t.DEVICE_TAG]}, {"name": "x-ingress", "tags": []},
             {"name": "legacy", "tags": t.DEVICE_TAG}]
    p = b.plan(["new", "old", "legacy"], users)
    assert p.new == ["new"] and p.existing == ["old", "legacy"]
    with pytest.raises(b.BulkError, match=r"not devices.*x-ingress"):
        b.plan(["new", "x-ingress"], users)


def test_definitions_give_the_rights_of_device_add() -> None:
    doc = b.definitions([("n1", "pw")], ["e1"])
    assert [u["name"] for u in doc["users"]] == ["n1"]  # an existing device keeps its password
    assert doc["users"][0]["tags"] == [t.DEVICE_TAG] and doc["users"][0]["hashing_algorithm"] == b.HASHING
    assert "password" not in doc["users"][0]
    for i, (perm, topic) in enumerate(zip(doc["permissions"], doc["topic_permissions"], strict=True)):
        user = ["n1", "e1"][i]
        p, tp = d.device_permission(user), d.device_topic_permission(user)
        assert perm == {"user": user, "vhost": t.INGRESS_VHOST, "configure": p.configure, "write": p.write,
                        "read": p.read}
        assert topic == {"user": user, "vhost": t.INGRESS_VHOST, "exchange": t.MQTT_TOPIC_EXCHANGE,
                         "write": tp.write, "read": tp.read}


class FakeBroker:
    def __init__(self, users: list[dict[str, Any]]) -> None:
        self.users_ = users
        self.calls: list[tuple[str, str, Any]] = []

    def request(self, method: str, path: str, body: Any = None) -> Any:
        self.calls.append((method, path, body))
        if path.startswith("api/users?"):
            return self.users_
        if method == "POST" and path == "api/definitions":
            self.users_ += [{"name": u["name"], "tags": u["tags"]} for u in body["users"]]
        if path.startswith("api/connections"):
            return [{"name": "c1", "user": "a"}, {"name": "c2", "user": "someone"}]
        if path.startswith("api/queues/"):
            return [{"name": "mqtt-subscription-aqos1"}, {"name": "x-ingress.positions"}]
        return None


def test_add_many_imports_in_chunks_and_is_idempotent() -> None:
    broker = FakeBroker([{"name": "e", "tags": [t.DEVICE_TAG]}])
    lines: list[str] = []
    ids = [f"d{i}" for i in range(5)] + ["e"]
    rows = b.add_many(b.Broker(broker.request), ids, lines.append, chunk=2)
    assert [i for i, _ in rows] == ids and rows[-1] == ("e", None)
    assert all(p and len(p) >= 24 for _, p in rows[:-1]) and len({p for _, p in rows[:-1]}) == 5
    imports = [body for m, path, body in broker.calls if path == "api/definitions"]
    assert [len(x["users"]) for x in imports] == [2, 2, 1]
    assert [len(x["permissions"]) for x in imports] == [2, 2, 2]
    assert lines[-1].strip() == "6 / 6 devices"
    again = b.add_many(b.Broker(broker.request), ids, lines.append, chunk=100)
    assert all(p is None for _, p in again)  # every one exists now: no password, rights set again
    assert [len(x["users"]) for m, path, x in broker.calls[-1:]] == [0]


def test_credentials_csv() -> None:
    rows = list(csv.reader(io.StringIO(b.credentials_csv([("a", "pw1"), ("b", None)]))))
    assert rows == [["object_id", "mqtt_login", "client_id", "password"],
                    ["a", f"{t.INGRESS_VHOST}:a", "a", "pw1"], ["b", f"{t.INGRESS_VHOST}:b", "b", ""]]


def test_remove_many_deletes_devices_only_with_their_connections_and_queues() -> None:
    broker = FakeBroker([{"name": "a", "tags": [t.DEVICE_TAG]}, {"name": "x-geo", "tags": []}])
    assert b.remove_many(b.Broker(broker.request), ["a", "x-geo", "ghost"], lambda s: None) == 1
    assert ("POST", "api/users/bulk-delete", {"users": ["a"]}) in broker.calls
    deletes = [path for m, path, _ in broker.calls if m == "DELETE"]
    assert deletes == ["api/connections/c1", f"api/queues/{t.INGRESS_VHOST}/mqtt-subscription-aqos1"]
