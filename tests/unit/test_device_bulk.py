"""The bulk device path's pure parts (deploy/rabbitmq/device_bulk.py) and its use of the
management API, against a recording fake (the live broker: tests/integration/test_devices_bulk.py).
A file's object ids are one tenant's: its devices are the users `<tenant>.<object_id>`."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
from typing import Any

import pytest

from deploy.rabbitmq import credentials as cred
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
    users = [{"name": "acme.old", "tags": [t.DEVICE_TAG]}, {"name": "x-ingress", "tags": []},
             {"name": "acme.legacy", "tags": t.DEVICE_TAG}, {"name": "acme.gw", "tags": [t.GATEWAY_TAG]}]
    p = b.plan(["acme.new", "acme.old", "acme.legacy", "other.old"], users)
    assert p.new == ["acme.new", "other.old"] and p.existing == ["acme.old", "acme.legacy"]
    with pytest.raises(b.BulkError, match=r"not devices.*x-ingress"):
        b.plan(["acme.new", "x-ingress"], users)
    with pytest.raises(b.BulkError, match=r"not devices.*acme\.gw"):  # a tenant's gateway
        b.plan(["acme.gw"], users)


def test_definitions_give_the_rights_of_device_add() -> None:
    doc = b.definitions([("acme.n1", "pw")], ["acme.e1"])
    assert [u["name"] for u in doc["users"]] == ["acme.n1"]  # an existing device keeps its password
    assert doc["users"][0]["tags"] == [t.DEVICE_TAG] and doc["users"][0]["hashing_algorithm"] == b.HASHING
    assert "password" not in doc["users"][0]
    writes = [tp["write"] for tp in doc["topic_permissions"]]
    assert writes == [r"^positions\.acme\.n1$", r"^positions\.acme\.e1$"]
    for i, (perm, topic) in enumerate(zip(doc["permissions"], doc["topic_permissions"], strict=True)):
        user = ["acme.n1", "acme.e1"][i]
        p, tp = cred.device_permission(user), cred.device_topic_permission(user)
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
            return [{"name": "c1", "user": "acme.a"}, {"name": "c2", "user": "someone"},
                    {"name": "c3", "user": "other.a"}]
        if path.startswith("api/queues/"):
            return [{"name": "mqtt-subscription-acme.aqos1"}, {"name": "x-ingress.positions"},
                    {"name": "mqtt-subscription-other.aqos1"}]
        return None


def test_add_many_imports_in_chunks_and_is_idempotent() -> None:
    broker = FakeBroker([{"name": "acme.e", "tags": [t.DEVICE_TAG]},
                         {"name": "other.d0", "tags": [t.DEVICE_TAG]}])  # another tenant's d0
    lines: list[str] = []
    ids = [f"d{i}" for i in range(5)] + ["e"]
    rows = b.add_many(b.Broker(broker.request), "acme", ids, lines.append, chunk=2)
    assert [i for i, _ in rows] == ids and rows[-1] == ("e", None)  # the object ids, as given
    assert all(p and len(p) >= 24 for _, p in rows[:-1]) and len({p for _, p in rows[:-1]}) == 5
    imports = [body for m, path, body in broker.calls if path == "api/definitions"]
    assert [len(x["users"]) for x in imports] == [2, 2, 1]
    assert [len(x["permissions"]) for x in imports] == [2, 2, 2]
    assert [u["name"] for x in imports for u in x["users"]] == [f"acme.d{i}" for i in range(5)]
    assert {p["user"] for x in imports for p in x["topic_permissions"]} == {f"acme.{i}" for i in ids}
    assert lines[-1].strip() == "6 / 6 devices"
    again = b.add_many(b.Broker(broker.request), "acme", ids, lines.append, chunk=100)
    assert all(p is None for _, p in again)  # every one exists now: no password, rights set again
    assert [len(x["users"]) for m, path, x in broker.calls[-1:]] == [0]


def test_the_same_ids_in_another_tenant_are_other_devices() -> None:
    broker = FakeBroker([{"name": "acme.d0", "tags": [t.DEVICE_TAG]}])
    rows = b.add_many(b.Broker(broker.request), "other", ["d0"], lambda s: None)
    assert rows[0][0] == "d0" and rows[0][1]  # new there: a password
    (doc,) = [body for m, path, body in broker.calls if path == "api/definitions"]
    assert [u["name"] for u in doc["users"]] == ["other.d0"]
    assert doc["topic_permissions"][0]["write"] == r"^positions\.other\.d0$"


@pytest.mark.parametrize("tenant", ["", "Acme", "a.b", "a_b"])
def test_a_bad_tenant_is_refused_before_anything_is_written(tenant: str) -> None:
    broker = FakeBroker([])
    with pytest.raises(ValueError, match="tenant"):
        b.add_many(b.Broker(broker.request), tenant, ["d0"], lambda s: None)
    with pytest.raises(ValueError, match="tenant"):
        b.remove_many(b.Broker(broker.request), tenant, ["d0"], lambda s: None)
    assert broker.calls == []


def test_credentials_csv() -> None:
    rows = list(csv.reader(io.StringIO(b.credentials_csv([("a", "pw1"), ("b", None)], "acme"))))
    assert rows == [["tenant", "object_id", "mqtt_login", "client_id", "topic", "password"],
                    ["acme", "a", f"{t.INGRESS_VHOST}:acme.a", "acme.a", "positions/acme/a", "pw1"],
                    ["acme", "b", f"{t.INGRESS_VHOST}:acme.b", "acme.b", "positions/acme/b", ""]]


def test_remove_many_deletes_devices_only_with_their_connections_and_queues() -> None:
    broker = FakeBroker([{"name": "acme.a", "tags": [t.DEVICE_TAG]},
                         {"name": "other.a", "tags": [t.DEVICE_TAG]}, {"name": "x-geo", "tags": []},
                         {"name": "acme.gw", "tags": [t.GATEWAY_TAG]}])  # a gateway: not removed here
    assert b.remove_many(b.Broker(broker.request), "acme", ["a", "x-geo", "ghost", "gw"], lambda s: None) == 1
    assert ("POST", "api/users/bulk-delete", {"users": ["acme.a"]}) in broker.calls
    deletes = [path for m, path, _ in broker.calls if m == "DELETE"]
    # other.a, the other tenant's device of the same id, keeps its connection and queue
    assert deletes == ["api/connections/c1", f"api/queues/{t.INGRESS_VHOST}/mqtt-subscription-acme.aqos1"]
