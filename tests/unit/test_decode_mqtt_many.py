"""ingress/positions.py::decode_mqtt_many: many device messages in one column pass, refusals
reported per message (by its position in the input list); the ids are qualified by the tenant
of each routing key (`positions.<tenant>.<object_id>`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from ingress.positions import MAX_BODY_BYTES, Decoded, decode_mqtt, decode_mqtt_many

TS = 1_700_000_000.0
TENANT = "acme"
NOT_A_KEY = "is not positions.<tenant>.<object_id>"


def msg(oid: str, tenant: str = TENANT, **body: Any) -> tuple[str, bytes]:
    return f"positions.{tenant}.{oid}", orjson.dumps(body)


def good(oid: str, lon: float = 9.5, lat: float = 47.1, ts: float = TS, tenant: str = TENANT,
         **extra: Any) -> tuple[str, bytes]:
    return msg(oid, tenant, lon=lon, lat=lat, ts=ts, **extra)


MIXED: list[tuple[str, bytes]] = [
    good("car-1", 9.51, 47.11, TS + 1, speed=3.5),             # 0 ok, extra field
    ("positions.acme.bad key", orjson.dumps({"lon": 9.5, "lat": 47.1, "ts": TS})),  # 1 routing key
    ("positions.acme.car-2", b"{not json"),                      # 2 malformed JSON
    ("positions.acme.car-3", orjson.dumps([9.5, 47.1, TS])),     # 3 JSON list
    ("positions.acme.car-4", b'{"lon": 9.5, "pad": "' + b"x" * MAX_BODY_BYTES + b'"}'),  # 4 too big
    msg("car-5", lon=9.5, lat=91, ts=TS),                        # 5 lat 91
    msg("car-6", lon=9.5, ts=TS),                                # 6 lat missing (NaN column)
    msg("car-7", lon=9.5, lat=47.1, ts=TS * 1000),               # 7 milliseconds
    good("car-8", 9.52, 47.12, TS + 2, id="other:spoofed"),      # 8 ok, id from the key
    ("telemetry.acme.car-9", orjson.dumps({"lon": 9.5, "lat": 47.1, "ts": TS})),  # 9 routing key
    good("car-1", 9.53, 47.13, TS + 3),                          # 10 ok, same object again
    msg("car-11", lon=True, lat=47.1, ts=TS),                    # 11 bool lon
    msg("car-12", lon=9.5, lat=None, ts=TS),                     # 12 null lat
    ("positions.acme.car-13", b"42"),                            # 13 JSON number
    ("positions.car-14", orjson.dumps({"lon": 9.5, "lat": 47.1, "ts": TS})),  # 14 no tenant (old contract)
    good("car-15", tenant="Acme"),                               # 15 not a tenant
    good("car-1", 9.54, 47.14, TS + 4, tenant="other"),          # 16 ok, another tenant's car-1
    good("car-17", tenant="acme-2"),                             # 17 ok, tenant acme-2 (not acme)
]
EXPECTED_REFUSALS = {
    1: f"routing key 'positions.acme.bad key' {NOT_A_KEY}",
    2: "malformed JSON: ",
    3: "the body is a JSON list, not an object with lon, lat, ts",
    4: f"body of {len(MIXED[4][1]):,} bytes is over the {MAX_BODY_BYTES:,}-byte limit",
    5: "lat 91 is outside [-90, 90]",
    6: "missing field 'lat'",
    7: f"ts {TS * 1000!r} looks like milliseconds; send epoch seconds",
    9: f"routing key 'telemetry.acme.car-9' {NOT_A_KEY}",
    11: "lon must be a number, got bool",
    12: "lat must be a number, got NoneType",
    13: "the body is a JSON int, not an object with lon, lat, ts",
    14: f"routing key 'positions.car-14' {NOT_A_KEY} (MQTT positions/<tenant>/<object_id>",
    15: f"routing key 'positions.Acme.car-15' {NOT_A_KEY}",
}


@pytest.fixture(scope="module")
def mixed() -> Decoded:
    return decode_mqtt_many(MIXED)


def test_refusals_name_message_indices_once_each(mixed: Decoded) -> None:
    indices = [i for i, _ in mixed.refused]
    assert indices == sorted(EXPECTED_REFUSALS)  # sorted, each message at most once
    for i, reason in mixed.refused:
        assert reason.startswith(EXPECTED_REFUSALS[i]), (i, reason)


def test_reasons_have_no_position_prefix(mixed: Decoded) -> None:
    for _, reason in mixed.refused:
        assert not reason.startswith("position "), reason
        assert "position 0" not in reason and "position 1:" not in reason


def test_good_positions_keep_message_order_and_ids_from_routing_keys(mixed: Decoded) -> None:
    b = mixed.batch
    assert b.ids == ["acme:car-1", "acme:car-8", "acme:car-1", "other:car-1", "acme-2:car-17"]
    np.testing.assert_array_equal(b.lon, [9.51, 9.52, 9.53, 9.54, 9.5])
    np.testing.assert_array_equal(b.lat, [47.11, 47.12, 47.13, 47.14, 47.1])
    np.testing.assert_array_equal(b.ts, [TS + 1, TS + 2, TS + 3, TS + 4, TS])
    assert b.h.dtype == np.uint64 and not b.h.any()  # the index is set later, by x-ingress


def test_extra_fields_pass_through_per_position(mixed: Decoded) -> None:
    assert mixed.batch.extra == [{"speed": 3.5}, None, None, None, None]


def test_two_tenants_objects_of_one_id_stay_two() -> None:
    d = decode_mqtt_many([good("car-1", tenant="acme"), good("car-1", tenant="other"),
                          good("car-1", tenant="acme")])
    assert d.refused == [] and d.batch.ids == ["acme:car-1", "other:car-1", "acme:car-1"]
    assert len(set(d.batch.ids)) == 2


def test_every_message_is_either_kept_or_refused(mixed: Decoded) -> None:
    assert len(mixed.batch) + len(mixed.refused) == len(MIXED)


def test_same_answers_as_one_by_one() -> None:
    """A message's outcome does not depend on its neighbours."""
    d = decode_mqtt_many(MIXED)
    refused = dict(d.refused)
    kept = iter(range(len(d.batch)))
    for m, (key, body) in enumerate(MIXED):
        try:
            one = decode_mqtt(key, body)
        except ValueError as exc:
            assert refused[m] == str(exc)
            continue
        if one.refused:
            (_, reason), = one.refused
            assert reason == f"position 0: {refused[m]}"
        else:
            k = next(kept)
            assert one.batch.ids == [d.batch.ids[k]]
            assert one.batch.lon[0] == d.batch.lon[k]


def test_empty_list() -> None:
    d = decode_mqtt_many([])
    assert len(d.batch) == 0 and d.refused == []
    assert d.batch.lon.shape == (0,) and d.batch.h.dtype == np.uint64


def test_all_good_no_extra() -> None:
    d = decode_mqtt_many([good(f"o{i}", 9.0 + i / 100, 47.0, TS + i) for i in range(50)])
    assert d.refused == []
    assert d.batch.ids == [f"acme:o{i}" for i in range(50)]
    np.testing.assert_allclose(d.batch.lon, 9.0 + np.arange(50) / 100)
    assert d.batch.extra == []


def test_all_bad() -> None:
    d = decode_mqtt_many([("positions.acme.a", b"[]"), ("nope", b"{}"), msg("b", lon=200, lat=0, ts=TS)])
    assert len(d.batch) == 0
    assert [i for i, _ in d.refused] == [0, 1, 2]
    assert d.refused[2][1] == "lon 200 is outside [-180, 180]"


def test_several_missing_fields_in_one_reason() -> None:
    d = decode_mqtt_many([good("a"), msg("b", note="x")])
    assert d.refused == [(1, "missing fields 'lon', 'lat', 'ts'")]
    assert d.batch.ids == ["acme:a"]


def test_the_index_is_of_the_message_not_of_the_column() -> None:
    """Column refusals come after whole-message ones were left out; their index must still be
    the message's."""
    msgs = [("x", b"{}"), ("y", b"{}"), ("z", b"{}"), msg("late", lon=9.5, lat=-95, ts=TS), good("ok")]
    d = decode_mqtt_many(msgs)
    assert d.refused[-1] == (3, "lat -95 is outside [-90, 90]")
    assert d.batch.ids == ["acme:ok"]


def test_body_exactly_at_the_limit_is_read() -> None:
    head = orjson.dumps({"lon": 9.5, "lat": 47.1, "ts": TS, "pad": ""})
    body = head[:-2] + b"x" * (MAX_BODY_BYTES - len(head)) + b'"}'
    assert len(body) == MAX_BODY_BYTES
    d = decode_mqtt_many([("positions.acme.big", body)])
    assert d.refused == [] and d.batch.ids == ["acme:big"]


def test_nan_and_infinity_literals_are_malformed_json() -> None:
    d = decode_mqtt_many([("positions.acme.a", b'{"lon": NaN, "lat": 47.1, "ts": 1700000000}'),
                          ("positions.acme.b", b'{"lon": Infinity, "lat": 47.1, "ts": 1700000000}')])
    assert [i for i, _ in d.refused] == [0, 1]
    assert all(r.startswith("malformed JSON") for _, r in d.refused)


def test_extra_fields_are_kept_with_their_json_types() -> None:
    d = decode_mqtt_many([good("a", battery=0.5, tags=["x", "y"], meta={"fw": "1.2"}, ok=True, n=None)])
    assert d.batch.extra == [
        {"battery": 0.5, "tags": ["x", "y"], "meta": {"fw": "1.2"}, "ok": True, "n": None}]


def test_object_id_or_tenant_with_a_trailing_newline_is_refused() -> None:
    body = orjson.dumps({"lon": 9.5, "lat": 47.1, "ts": TS})
    d = decode_mqtt_many([("positions.acme.car-1\n", body), ("positions.acme\n.car-1", body)])
    assert d.batch.ids == []
    assert [i for i, _ in d.refused] == [0, 1]
