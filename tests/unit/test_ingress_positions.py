"""x-ingress input decoding: every bad input refused with a reason, good ones kept; the tenant
comes from the routing key (MQTT `positions.<tenant>.<object_id>`, a gateway's batch its
tenant as the key on ingress.gateway), never from the body, and the ids that leave are
qualified `<tenant>:<object_id>` (exchanges/tenancy.py)."""

from __future__ import annotations

import math

import msgpack
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchanges.ids import is_object_id
from ingress.positions import (
    MAX_BODY_BYTES,
    Refused,
    decode_batch,
    decode_mqtt,
    object_id_from_routing_key,
    tenant_from_routing_key,
)

TS = 1_763_800_000.0
GOOD = orjson.dumps({"lon": 9.5, "lat": 47.1, "ts": TS})
NOT_A_KEY = "is not positions.<tenant>.<object_id>"


def test_mqtt_position_with_pass_through_fields() -> None:
    d = decode_mqtt("positions.fleet.truck-7", orjson.dumps({"lon": 9.5, "lat": 47.1, "ts": TS, "speed": 12}))
    assert d.refused == []
    b = d.batch
    assert b.ids == ["fleet:truck-7"] and b.lon.tolist() == [9.5] and b.lat.tolist() == [47.1]
    assert b.ts.tolist() == [TS] and b.extra == [{"speed": 12}]


def test_the_same_object_id_in_two_tenants_is_two_objects() -> None:
    a = decode_mqtt("positions.acme.car-1", GOOD).batch.ids
    b = decode_mqtt("positions.other.car-1", GOOD).batch.ids
    assert a == ["acme:car-1"] and b == ["other:car-1"] and a != b
    assert object_id_from_routing_key("positions.0.car-1") == "0:car-1"  # a digit is a tenant


def test_an_mqtt_body_cannot_name_another_object_or_tenant() -> None:
    body = orjson.dumps({"lon": 9.5, "lat": 47.1, "ts": TS, "id": "other:car-9", "tenant": "other"})
    d = decode_mqtt("positions.acme.car-1", body)
    assert d.batch.ids == ["acme:car-1"]
    assert d.batch.extra == [{"tenant": "other"}]  # an extra field like any other, not the tenant


@pytest.mark.parametrize(
    ("routing_key", "body", "reason"),
    [
        ("positions.acme.a", b"{not json", "malformed JSON"),
        ("positions.acme.a", b"[1, 2]", "JSON list, not an object"),
        ("positions.acme.a", b'{"lon": NaN, "lat": 1, "ts": 1}', "malformed JSON"),
        ("positions.acme.a", b"x" * (MAX_BODY_BYTES + 1), "over the 262,144-byte limit"),
        ("positions.", b"{}", NOT_A_KEY),
        ("positions.acme.", b"{}", NOT_A_KEY),
        ("positions.acme.a.b", b"{}", NOT_A_KEY),
        ("positions.acme.-a", b"{}", NOT_A_KEY),
        ("telemetry.acme.a", b"{}", NOT_A_KEY),
        # the contract before tenants (MQTT positions/<object_id>): refused, with the new one named
        ("positions.a", GOOD, NOT_A_KEY + r" \(MQTT positions/<tenant>/<object_id>"),
        ("positions.car-1", GOOD, NOT_A_KEY),
        # not a tenant: 1-32 of a-z 0-9 -, starting with a letter or digit
        ("positions..a", GOOD, NOT_A_KEY),
        ("positions.Acme.a", GOOD, NOT_A_KEY),
        ("positions.-acme.a", GOOD, NOT_A_KEY),
        ("positions.a_b.a", GOOD, NOT_A_KEY),
        ("positions.a:b.a", GOOD, NOT_A_KEY),
        ("positions.*.a", GOOD, NOT_A_KEY),
        ("positions.#.a", GOOD, NOT_A_KEY),
        ("positions.acme\n.a", GOOD, NOT_A_KEY),
        ("positions." + "x" * 33 + ".a", GOOD, NOT_A_KEY),
    ],
)
def test_mqtt_message_refused_whole(routing_key: str, body: bytes, reason: str) -> None:
    with pytest.raises(Refused, match=reason):
        decode_mqtt(routing_key, body)


@pytest.mark.parametrize("tenant", ["a", "0", "acme", "fleet-2", "x" * 32])
def test_a_longest_tenant_and_id_make_a_qualified_id(tenant: str) -> None:
    oid = "Z" * 64
    assert decode_mqtt(f"positions.{tenant}.{oid}", GOOD).batch.ids == [f"{tenant}:{oid}"]


@pytest.mark.parametrize("tenant", ["acme", "0", "fleet-2", "x" * 32])
def test_a_gateway_routing_key_that_is_a_tenant(tenant: str) -> None:
    assert tenant_from_routing_key(tenant) == tenant


@pytest.mark.parametrize("key", ["", "Acme", "-acme", "a_b", "acme.x", "positions.acme.car-1", "*", "#",
                                 "acme\n", "a:b", "x" * 33])
def test_a_gateway_routing_key_that_is_not_a_tenant_is_refused(key: str) -> None:
    """What comes through the retired fanout ingress.batches (routing key "", most likely) or
    with anything but a tenant as the key: the whole batch is refused, with the reason."""
    with pytest.raises(Refused, match=r"is not a tenant \(a gateway publishes its batches on ingress\.gateway"
                                      r" with its tenant as the routing key"):
        tenant_from_routing_key(key)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"lon": 9.5, "lat": 91.0, "ts": TS}, "lat 91.0 is outside [-90, 90]"),
        ({"lon": -180.5, "lat": 1.0, "ts": TS}, "lon -180.5 is outside [-180, 180]"),
        ({"lon": 9.5, "ts": TS}, "missing field 'lat'"),
        ({"ts": TS}, "missing fields 'lon', 'lat'"),
        ({"lon": "9.5", "lat": 1.0, "ts": TS}, "lon must be a number, got str"),
        ({"lon": True, "lat": 1.0, "ts": TS}, "lon must be a number, got bool"),
        ({"lon": 9.5, "lat": None, "ts": TS}, "lat must be a number, got NoneType"),
        ({"lon": 9.5, "lat": 1.0, "ts": TS * 1000}, "looks like milliseconds"),
        ({"lon": 9.5, "lat": 1.0, "ts": 12}, "ts 12 is outside"),
    ],
)
def test_mqtt_position_refused_with_reason(fields: dict, reason: str) -> None:  # type: ignore[type-arg]
    d = decode_mqtt("positions.acme.a", orjson.dumps(fields))
    assert len(d.batch) == 0
    assert len(d.refused) == 1 and reason in d.refused[0][1], d.refused


def test_batch_keeps_good_positions_and_names_bad_ones() -> None:
    body = orjson.dumps({"positions": [
        {"id": "a", "lon": 9.5, "lat": 47.1, "ts": TS},
        {"id": "b", "lon": 9.5, "lat": 95, "ts": TS},
        "junk",
        {"id": "bad id!", "lon": 9.5, "lat": 47.1, "ts": TS},
        {"id": "c", "lon": 9.6, "lat": 47.2, "ts": TS + 1, "fix": "gps"},
        {"id": "other:d", "lon": 9.6, "lat": 47.2, "ts": TS + 1},  # another tenant's name
    ]})
    d = decode_batch(body, "application/json", tenant="acme")
    assert d.batch.ids == ["acme:a", "acme:c"] and d.batch.extra == [None, {"fix": "gps"}]
    assert [i for i, _ in d.refused] == [1, 2, 3, 5]
    assert "position 1: lat 95 is outside" in d.refused[0][1]
    assert "position 2 is a str" in d.refused[1][1]
    assert "position 3: id 'bad id!' is not an object id" in d.refused[2][1]
    # a gateway names its tenant's objects only: a qualified id in the body is no object id
    assert "position 5: id 'other:d' is not an object id" in d.refused[3][1]


def test_a_batch_is_qualified_by_the_tenant_of_its_routing_key() -> None:
    body = orjson.dumps({"positions": [{"id": "car-1", "lon": 9.5, "lat": 47.1, "ts": TS},
                                       {"id": "car-2", "lon": 9.5, "lat": 47.1, "ts": TS}]})
    acme, other = decode_batch(body, None, tenant="acme"), decode_batch(body, None, tenant="other")
    assert acme.batch.ids == ["acme:car-1", "acme:car-2"]
    assert other.batch.ids == ["other:car-1", "other:car-2"]
    assert not set(acme.batch.ids) & set(other.batch.ids)


def test_msgpack_batch_and_nan_inside_it() -> None:
    body = msgpack.packb({"positions": [{"id": "a", "lon": 9.5, "lat": 47.1, "ts": TS},
                                        {"id": "b", "lon": float("nan"), "lat": 47.1, "ts": TS},
                                        {"id": "c", "lon": 9.5, "lat": float("inf"), "ts": TS}]})
    d = decode_batch(body, "application/msgpack", tenant="acme")
    assert d.batch.ids == ["acme:a"]
    assert d.refused == [(1, "position 1: lon is nan, not a finite number"),
                         (2, "position 2: lat is inf, not a finite number")]


@pytest.mark.parametrize(
    ("body", "ctype", "reason"),
    [
        (b"\xc1", "application/msgpack", "malformed msgpack"),
        (b'{"positions": 3}', None, "not {\"positions\""),
        (b'[]', None, "not {\"positions\""),
        (orjson.dumps({"positions": [{}] * 50_001}), None, "over the limit of 50,000"),
        (b" " * (1 << 20), None, "1,048,576 bytes is over"),
    ],
)
def test_batch_refused_whole(body: bytes, ctype: str | None, reason: str) -> None:
    with pytest.raises(Refused, match=reason):
        decode_batch(body, ctype, tenant="acme")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)
position_like = st.fixed_dictionaries(
    {}, optional={"id": st.one_of(st.text(max_size=10), st.integers(-(2**63), 2**63 - 1)),
                  "lon": st.one_of(st.floats(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=3)),
                  "lat": st.one_of(st.floats(), st.integers(-(2**63), 2**63 - 1), st.none()),
                  "ts": st.one_of(st.floats(), st.integers(-10, 10**13)), "x": json_values})


@settings(max_examples=500)
@given(st.binary(max_size=300), st.sampled_from([None, "application/msgpack"]))
def test_arbitrary_bytes_never_crash(body: bytes, ctype: str | None) -> None:
    try:
        d = decode_batch(body, ctype, tenant="acme")
    except Refused as exc:
        assert str(exc)
    else:
        assert len(d.batch) + len(d.refused) >= 0


@settings(max_examples=500)
@given(st.lists(st.one_of(position_like, json_values), max_size=20), st.booleans())
def test_every_position_is_either_kept_valid_or_refused_with_a_reason(items, as_msgpack: bool) -> None:  # type: ignore[no-untyped-def]
    body = msgpack.packb({"positions": items}) if as_msgpack else orjson.dumps(
        {"positions": items}, option=orjson.OPT_NON_STR_KEYS)
    d = decode_batch(body, "application/msgpack" if as_msgpack else "application/json", tenant="acme")
    assert len(d.batch) + len(d.refused) == len(items)  # nothing lost, nothing twice
    assert all(r for _, r in d.refused)
    b = d.batch
    assert all(i.startswith("acme:") and is_object_id(i.removeprefix("acme:")) for i in b.ids)
    assert ((b.lon >= -180) & (b.lon <= 180) & (b.lat >= -90) & (b.lat <= 90)).all()
    assert all(math.isfinite(t) for t in b.ts.tolist())
