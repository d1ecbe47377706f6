"""fence/api_models.py describes what the service answers: each answer, built by the service's
own code from a fence with every option set, a following fence, a query's rows, a stored
subscription, validates against its model, and names no field the model does not declare (a
field the document does not list is one a generated client drops). The served OpenAPI
document names the models for the routes, under their media types, and every operation has
its function's name as its id."""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime
from typing import Any, cast

import numpy as np
import pytest
from shapely.geometry import MultiPolygon, box

from exchanges.fence_def import FenceDef
from exchanges.fence_options import FENCE_OPTIONS, filters
from exchanges.tenancy import ROLES
from exchanges.x_geo import queries
from fence import api_models as am
from fence import page_models as pm
from fence import quotas, store, tenants
from fence.ops import SERIES, shape
from fence.service import _public_subscription, feature
from fence.spec import Follow
from fence.venues import owner_store as os_
from fence.venues.hive_index import HiveCard
from fence.venues.occupancy import HiveOccupancy
from fence.venues.reads import VenueReads, status_json
from fence.venues.sidecar import live_status
from tests.model_check import described, undeclared
from tests.unit.test_api_media import HTTP
from tests.unit.test_fence_api_inputs import ME, service, stored
from tests.unit.test_ops_figures import answers, vector

NOW = datetime(2026, 1, 1, tzinfo=UTC)
EVERY_OPTION = FenceDef(fence_id="t1:yard", version=7, geometry=box(9.5, 47.1, 9.51, 47.11), name="yard",
                        timeout_s=600.0, hysteresis_m=15.0, where=filters.parse([["speed", ">", 20],
                                                                                  ["kind", "in", ["van"]]]),
                        dwell_s=30.0, cross=True, expires_at=1.9e9, counts_from=("t2",))
FOLLOWING = FenceDef(fence_id="t1:escort", version=2, name="escort",
                     geometry=MultiPolygon([box(9.5, 47.1, 9.51, 47.11), box(9.52, 47.1, 9.53, 47.11)]))


def test_every_fence_option_is_a_declared_property() -> None:
    declared = set(am.FenceProperties.model_fields)
    assert {o.key for o in FENCE_OPTIONS} <= declared, {o.key for o in FENCE_OPTIONS} - declared


@pytest.mark.parametrize("fence, follow", [(EVERY_OPTION, None), (FOLLOWING, Follow("t1:van-1", 250.0))])
def test_a_stored_fence_is_a_fence(fence: FenceDef, follow: Follow | None) -> None:
    record = store.FenceRecord(fence, "uid-1", NOW, NOW, ("a", "b"), follow, 1.7e9 if follow else None)
    described(am.Fence, feature(record))


def test_a_page_of_fences_is_a_fence_page() -> None:
    with stored():
        page = asyncio.run(service().list(ME, limit=1))
    one = feature(store.FenceRecord(EVERY_OPTION, "u", NOW, NOW, ("a",), None))
    described(am.FencePage, {**page, "features": [one], "next_after": "yard"})


@pytest.mark.parametrize("kind, extra", [("bbox", {"bbox": [9.4, 47.0, 9.6, 47.2]}),
                                         ("nearby", {"point": [9.5, 47.1], "radius_m": 5000.0}),
                                         ("within", {"shape": {"type": "Polygon", "coordinates": [
                                             [[9.4, 47.0], [9.6, 47.0], [9.6, 47.2], [9.4, 47.0]]]}})])
def test_a_query_answer_is_an_objects_page(kind: str, extra: dict[str, Any]) -> None:
    q = queries.parse({"query": kind, "limit": 2, **extra})
    fields = np.array([{"speed": 12.5}, None, {"kind": "van"}], dtype=object)
    rows = queries.answer(q, ["t1:a", "t1:b", "t1:c"], np.array([9.50, 9.51, 9.52]), np.array([47.10] * 3),
                          np.array([1.0, 2.0, 3.0]), fields)
    described(am.ObjectsPage, queries.merge(q, [rows]))


@pytest.mark.parametrize("row", [
    {"id": "t1:near-van", "radius_m": 300.0, "object_id": "t1:van-1", "point_lon": None, "point_lat": None,
     "match": "truck-*", "where_json": [["speed", ">", 20]]},
    {"id": "t1:gate", "radius_m": 50.0, "object_id": "@t1:gate", "point_lon": 9.5, "point_lat": 47.1,
     "match": "*", "where_json": None}])
def test_a_stored_subscription_is_a_subscription(row: dict[str, Any]) -> None:
    stored_row = store._subscription({**row, "owner": "uid-1", "created_at": NOW, "updated_at": NOW})
    described(am.Subscription, _public_subscription(stored_row))


def test_the_live_state_answers_are_their_models() -> None:
    occupant = {"object_id": "van-1", "since": 1.0, "last_seen": 5.0, "confirmed": True}
    described(am.FenceOccupants, {"fence_id": "yard", "version": 7, "worker": "w0", "workers": ["w0"],
                                  "worker_version": 7, "objects": [occupant], "shared_inside": 0})
    described(am.Loitering, {"fence_id": "yard", "version": 7, "min_s": 0.0, "worker_version": None,
                             "objects": [{**occupant, "inside_s": 4.0}]})


def test_the_document_names_the_models_and_the_operations_by_their_functions() -> None:
    doc = HTTP.get("/openapi.json").json()
    paths = doc["paths"]
    fence = paths["/fences/{fence_id}"]["get"]
    assert fence["operationId"] == "get_fence"
    assert fence["responses"]["200"]["content"]["application/geo+json"]["schema"] == {
        "$ref": "#/components/schemas/Fence"}
    put = paths["/fences/{fence_id}"]["put"]["requestBody"]["content"]["application/json"]["schema"]
    assert put == {"oneOf": [{"$ref": f"#/components/schemas/{m}"} for m in ("FenceIn", "FollowIn")]}
    post_sub = paths["/subscriptions"]["post"]
    assert post_sub["responses"]["201"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Subscription"}
    ids = [op["operationId"] for ops in paths.values() for op in ops.values()]
    assert len(ids) == len(set(ids)) and all(i.isidentifier() for i in ids), ids
    schemas = doc["components"]["schemas"]
    assert {"Fence", "FenceIn", "FollowIn", "Polygon", "MultiPolygon", "SubscriptionIn", "ObjectsPage"} \
        <= set(schemas)
    refs = {r for r in _refs(doc)}
    assert all(r.removeprefix("#/components/schemas/") in schemas for r in refs), refs


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [*(v for k, v in node.items() if k == "$ref"), *(r for v in node.values() for r in _refs(v))]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_the_tenant_answers_are_their_models() -> None:
    made = tenants.Tenant("fleet", "The fleet", NOW, 2, 5)
    described(am.Tenant, made.to_json())
    member = tenants.Member("fleet", "uid-1", "admin", NOW)
    described(am.Members, {"tenant": "fleet", "members": [member.to_json()]})
    described(am.Member, member.to_json())
    described(am.MyTenants, {"tenants": [{"tenant": "fleet", "name": "The fleet", "role": "editor"}]})
    described(am.Quota, {"tenant": "fleet", "quota": {k: {"max": 10, "used": 1, "default": True}
                                                     for k in quotas.RESOURCES}})
    described(am.Shares, {"tenant": "fleet", "shares_with": ["venue"], "shared_by": []})
    described(am.ShareWithdrawn, {"tenant": "fleet", "to_tenant": "venue", "fences_changed": 0})
    assert set(am.Role.__args__) == set(ROLES)


def test_the_venue_answers_are_their_models() -> None:
    now = datetime(2026, 6, 3, 18, 30, tzinfo=UTC).timestamp()  # a Wednesday evening
    card = HiveCard("bar-1", "The Bar", "bar", "Städtle 1", 9.52, 47.14, "Europe/Vaduz", 80,
                    {"wed": [["17:00", "23:30"]], "fri": [["17:00", "02:00"]]})
    row = {"day": date(2026, 6, 3), "entries": 40, "exits": 12, "occupancy": 28, "raw": 28,
           "app_occupancy": 5, "updated_at": NOW}
    status = status_json(row, card.capacity)
    described(am.HiveStatus, status)
    described(am.HiveStatus, live_status(HiveOccupancy("bar-1", 80), now))
    profile = {"reset_hour": 4, "as_of": "2026-06-02", "hours": {f"3-{h}": [20.0, 4.0, 6] for h in range(24)}}
    found = VenueReads._card(cast(Any, None), card, status, now, 120.5, profile)
    assert found["usual"] is not None and found["usual"]["busyness"] == "busier than usual"
    described(am.Hive, found)
    described(am.HivePage, {"hives": [found, VenueReads._card(cast(Any, None), card, None, now)], "count": 2})
    hours = {"wed": [["17:00", "23:30"]]}
    stored_hive = os_._checked_hive({"id": "bar-1", "name": "The Bar", "type": "bar", "lon": 9.52,
                                     "lat": 47.14, "capacity": 80, "opening_hours": hours})
    described(am.HiveStored, stored_hive)
    am.HiveIn.model_validate(stored_hive)  # what was stored is a body the API takes back
    described(am.OwnedHives, {"hives": [{"id": "bar-1", "name": "The Bar", "type": "bar", "capacity": 80,
                                         "occupancy": 28, "entries": 40, "exits": 12, "day": "2026-06-03"}]})
    described(am.MyHives, {"favourites": ["bar-1"], "recent": ["bar-1", "cafe-2"]})
    described(am.Notification, {"id": 3, "hive_id": "bar-1", "threshold": 50, "direction": "above",
                                "quiet_start": "22:00", "quiet_end": "08:00"})
    listed = {"id": 3, "hive_id": "bar-1", "threshold": 50, "direction": "below", "quiet_start": None,
              "quiet_end": None, "armed": True, "last_sent_at": None}
    described(am.Notifications, {"notifications": [listed]})
    described(am.ConfigSent, {"configuration_id": 7, "state": "pending"})
    assert set(am.HiveIn.model_fields) == os_.HIVE_FIELDS


def test_the_operators_figures_are_their_model() -> None:
    got = answers()
    ep = {"endpoint": "wh-1", "tenant": "fleet"}
    got["wh_enabled"] = vector((ep, 1))
    got["wh_delivered"] = vector((ep, 12.5))
    got["wh_lag_p99"] = vector((ep, 0.2))
    alerts = [{"labels": {"alertname": "GeofenceRoleDown"}, "state": "firing",
               "annotations": {"summary": "x-ingress does not answer"}}]
    figures = shape(got, {name: {940.0: 1.0, 1000.0: None} for name in SERIES}, alerts, 1000.0, 940.0)
    assert figures["webhooks"] and figures["processes"] and figures["alerts"]
    described(pm.OpsData, figures)


def test_a_map_of_lists_of_models_is_checked_inside() -> None:
    day = {"hour": 20, "entries": 3, "exits": 1, "mean_occupancy": 2.0, "peak_occupancy": 3.0,
           "phones_mean": None, "phones_peak": None}
    analytics = {"hive_id": "bar-1", "today": {"day": "2026-06-03", "hours": []}, "days": [],
                 "hourly": {"2026-06-02": [{**day, "extra": 1}]}, "profile": None, "forecast": []}
    assert undeclared(pm.HiveAnalytics, analytics) == ["hourly.extra"]


def test_the_contracts_index_is_its_model() -> None:
    index = HTTP.get("/schemas").json()
    assert "event" in index["schemas"]
    described(am.SchemaIndex, index)
