"""A client generated from the OpenAPI document the live API serves, by a standard generator
(openapi-python-client), drives the API as an application would (issue 40): it creates, reads,
pages, moves and deletes a fence, reads who is inside it once an object's positions went
through the pipeline, finds the object by the fence, a bbox and a point, manages a proximity
subscription, and gets a refusal as a problem. Each answer is parsed into the generated types
(the generator's `from_dict` fails on a required field the answer lacks), so the document
and the API agree on every route driven here (tests/unit/test_api_models.py checks the same
of the service's answers without services)."""

from __future__ import annotations

import asyncio
import importlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from deploy.settings import ConnectionSettings
from exchanges.tenancy import qualify
from tests.integration.clients import DEADLINE, POLL, Account
from tests.integration.test_pipeline import Step, publish_positions

pytestmark = pytest.mark.integration
LON, LAT, HALF = 9.5361, 47.1650, 0.002  # north of Vaduz
PACKAGE = "geofence_api"


def square(dx: float = 0.0) -> list[list[list[float]]]:
    x, y = LON + dx, LAT
    return [[[x - HALF, y - HALF], [x + HALF, y - HALF], [x + HALF, y + HALF], [x - HALF, y + HALF],
             [x - HALF, y - HALF]]]


def generate(api: str, into: Path) -> ModuleType:
    """The served document, a client generated from it into `into`, imported."""
    doc = httpx.get(f"{api}/openapi.json", timeout=DEADLINE)
    assert doc.status_code == 200, doc.text
    spec = into / "openapi.json"
    spec.write_bytes(doc.content)
    tools = Path(sys.executable).parent  # the generator, and the ruff it formats with
    done = subprocess.run([str(tools / "openapi-python-client"), "generate", "--path", str(spec),
                           "--output-path", str(into / PACKAGE), "--meta", "none"],
                          env={**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ.get('PATH', '')}"},
                          capture_output=True, text=True, timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode == 0 and "Warning" not in said, said
    sys.path.insert(0, str(into))
    try:
        return importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(into))


async def until(check: Any, what: str) -> Any:
    end = time.monotonic() + DEADLINE
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(POLL)


async def test_a_generated_client_drives_the_api(stack: ConnectionSettings, tenant: str, editor: Account,
                                                 tmp_path: Path) -> None:
    assert stack["api"] is not None, "the stack runs no API"
    gen = generate(stack["api"], tmp_path)
    fences = importlib.import_module(f"{PACKAGE}.api.fences")
    live = importlib.import_module(f"{PACKAGE}.api.live_state")
    proximity = importlib.import_module(f"{PACKAGE}.api.proximity")
    for group, names in ((fences, "post_fence get_fence list_fences put_fence delete_fence"),
                         (live, "fence_objects object_fences objects_within objects_nearby"),
                         (proximity, "post_subscription get_subscription list_subscriptions "
                                     "delete_subscription")):
        for name in names.split():
            importlib.import_module(f"{group.__name__}.{name}")
    m = importlib.import_module(f"{PACKAGE}.models")
    tenants = importlib.import_module(f"{PACKAGE}.api.tenants")
    for name in ("my_tenants", "get_quota", "list_shares", "list_members"):
        importlib.import_module(f"{tenants.__name__}.{name}")
    venues = importlib.import_module(f"{PACKAGE}.api.venues.list_hives")
    app_users = importlib.import_module(f"{PACKAGE}.api.app_users.my_hives")
    fence_id, obj = f"gen-{uuid.uuid4().hex[:8]}", f"gen-car-{uuid.uuid4().hex[:6]}"
    async with gen.AuthenticatedClient(base_url=stack["api"], token=editor.token,
                                       raise_on_unexpected_status=True) as client:
        created = await fences.post_fence.asyncio(client=client, body=m.FenceIn(
            type_="Feature", id=fence_id, geometry=m.Polygon(type_="Polygon", coordinates=square()),
            properties=m.FenceOptionsIn(name="generated", timeout_s=600.0)))
        assert isinstance(created, m.Fence), created
        assert (created.id, created.properties.version, created.properties.tenant) == (fence_id, 1, tenant)
        assert isinstance(created.geometry, m.Polygon) and created.properties.name == "generated"
        got = await fences.get_fence.asyncio(fence_id, client=client)
        assert isinstance(got, m.Fence) and got.properties.version == 1
        page = await fences.list_fences.asyncio(client=client, bbox=f"{LON - 0.01},{LAT - 0.01},"
                                                                    f"{LON + 0.01},{LAT + 0.01}")
        assert isinstance(page, m.FencePage) and fence_id in [f.id for f in page.features]
        moved = await fences.put_fence.asyncio(fence_id, client=client, body=m.FenceIn(
            type_="Feature", geometry=m.Polygon(type_="Polygon", coordinates=square(0.0005)),
            properties=m.FenceOptionsIn(name="generated", timeout_s=600.0)))
        assert isinstance(moved, m.Fence) and moved.properties.version == 2

        now = time.time()
        steps = [Step(LON - 0.01, LAT, now), Step(LON, LAT, now + 1)]  # from outside, in
        await publish_positions(stack, qualify(tenant, obj), steps)

        async def inside() -> Any:
            got = await live.fence_objects.asyncio(fence_id, client=client)
            assert isinstance(got, m.FenceOccupants), got
            return got if obj in [o.object_id for o in got.objects] else None

        occupants = await until(inside, f"{obj} inside {fence_id}")
        assert occupants.version == 2 and occupants.objects[0].confirmed
        its = await live.object_fences.asyncio(obj, client=client)
        assert isinstance(its, m.ObjectFences) and fence_id in its.fences
        within = await live.objects_within.asyncio(client=client, fence_id=fence_id)
        assert isinstance(within, m.ObjectsPage) and obj in [o.id for o in within.objects]
        near = await live.objects_nearby.asyncio(client=client, lon=LON, lat=LAT, radius_m=500.0)
        assert isinstance(near, m.ObjectsPage) and obj in [o.id for o in near.objects]
        assert all(isinstance(o.distance_m, float) for o in near.objects)

        sub = await proximity.post_subscription.asyncio(client=client, body=m.SubscriptionIn(
            object_=obj, radius_m=250.0, match="gen-*"))
        assert isinstance(sub, m.Subscription) and sub.object_ == obj and sub.tenant == tenant
        listed = await proximity.list_subscriptions.asyncio(client=client)
        assert isinstance(listed, m.SubscriptionList) and sub.id in [s.id for s in listed.subscriptions]
        again = await proximity.get_subscription.asyncio(sub.id, client=client)
        assert isinstance(again, m.Subscription) and again.radius_m == 250.0
        gone = await proximity.delete_subscription.asyncio_detailed(sub.id, client=client)
        assert gone.status_code == 204

        mine = await tenants.my_tenants.asyncio(client=client)
        assert isinstance(mine, m.MyTenants)
        assert (tenant, "editor") in [(x.tenant, x.role) for x in mine.tenants]
        quota = await tenants.get_quota.asyncio(tenant, client=client)
        assert isinstance(quota, m.Quota) and quota.quota["fences"].used >= 1
        shares = await tenants.list_shares.asyncio(tenant, client=client)
        assert isinstance(shares, m.Shares) and shares.tenant == tenant
        members = await tenants.list_members.asyncio(tenant, client=client)  # an admin's
        assert isinstance(members, m.Problem) and members.status == 403

        hives = await venues.asyncio(client=client, limit=5)  # public: the token is not needed
        assert isinstance(hives, m.HivePage) and hives.count == len(hives.hives) <= 5
        favourites = await app_users.asyncio(client=client)
        assert isinstance(favourites, m.MyHives) and favourites.favourites == []

        missing = await fences.get_fence.asyncio(f"{fence_id}-nope", client=client)
        assert isinstance(missing, m.Problem) and missing.status == 404 and missing.detail
        deleted = await fences.delete_fence.asyncio(fence_id, client=client)
        assert isinstance(deleted, m.FenceDeleted) and deleted.deleted and deleted.id == fence_id
