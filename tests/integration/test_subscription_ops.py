"""Proximity subscriptions through the AMQP fence API (as the tenant's application user) and the
command line (issue 20), and the loitering report over AMQP: what the HTTP API offers
(tests/integration/test_proximity_live.py) is there too, with the same checks (an editor's,
a bad definition refused with the reason, another tenant's subscription and fence not found)."""

from __future__ import annotations

import json
import uuid

from geofence_client.amqp import FenceClient

from deploy.settings import ConnectionSettings
from exchanges import topology as t
from exchanges.tenancy import qualify
from tests.integration.clients import Account, Login, geofence, login_url
from tests.integration.test_fence_api import feature
from tests.integration.test_fence_changes_live import square


async def test_subscriptions_and_loitering_over_amqp(stack: ConnectionSettings, app_user: Login, tenant: str,
                                                     editor: Account, viewer: Account,
                                                     outsider: Account) -> None:
    url = login_url(stack, app_user, t.FENCES_VHOST)
    sub_id = f"rs-amqp-{uuid.uuid4().hex[:8]}"
    async with FenceClient(url, editor.token) as client, FenceClient(url, viewer.token) as reader, \
            FenceClient(url, outsider.token) as stranger:
        denied = await reader.call("subscribe", subscription={"object": "truck-1", "radius_m": 100},
                                   id=sub_id)
        assert denied.status == 403 and "editor" in (denied.error or "")
        bad = await client.call("subscribe", subscription={"object": "truck-1", "radius_m": -5}, id=sub_id)
        assert bad.status == 422 and "radius" in (bad.error or "")
        other = await client.call("subscribe", subscription={"object": f"{tenant}:truck-1", "radius_m": 5},
                                  id=sub_id)
        assert other.status == 422 and "object" in (other.error or "")  # names are the tenant's own
        made = await client.subscribe({"object": "truck-1", "radius_m": 250, "match": "car-*",
                                       "where": [["type", "==", "car"]]}, sub_id)
        assert (made["id"], made["radius_m"], made["match"]) == (sub_id, 250.0, "car-*")
        assert (made["owner"], made["tenant"], made["object"]) == (editor.uid, tenant, "truck-1")
        assert (await client.subscription(sub_id))["where"] == [["type", "==", "car"]]
        assert sub_id in [s["id"] for s in (await client.subscriptions())["subscriptions"]]
        changed = await client.subscribe({"object": "truck-1", "radius_m": 90}, sub_id)
        assert changed["radius_m"] == 90.0 and "match" not in changed
        assert (await reader.call("subscription", id=sub_id)).status == 200  # viewers read
        assert (await reader.call("unsubscribe", id=sub_id)).status == 403  # and change nothing
        assert (await stranger.call("subscription", id=sub_id)).status == 404  # another tenant's
        assert (await stranger.call("unsubscribe", id=sub_id)).status == 404
        assert sub_id not in [s["id"] for s in (await stranger.subscriptions())["subscriptions"]]
        assert (await client.unsubscribe(sub_id)) == {"id": sub_id, "deleted": True}
        assert (await client.call("subscription", id=sub_id)).status == 404
        assert (await client.call("unsubscribe", id=sub_id)).status == 404

        fid = f"loiter-{uuid.uuid4().hex[:8]}"
        await client.create(feature(fid, square(9.5777, 47.0777), dwell_s=60))
        try:
            report = await reader.loitering(fid, 0)
            assert report["fence_id"] == fid and report["min_s"] == 0.0
            assert isinstance(report["objects"], list)
            assert (await reader.call("loitering", fence_id=fid, min_s=-1)).status == 422
            assert (await stranger.call("loitering", fence_id=fid)).status == 404  # another tenant's fence
        finally:
            await client.delete(fid)


def test_subscriptions_from_the_command_line(stack: ConnectionSettings, tenant: str,
                                             other_tenant: str) -> None:
    """The operator's command names a tenant's subscription with --tenant and shows the store's
    (qualified) names."""
    sub_id = f"rs-cli-{uuid.uuid4().hex[:8]}"
    key = qualify(tenant, sub_id)
    made = geofence("subscription", "add", "--tenant", tenant, "--object", "bus-9", "--radius", "300",
                    "--match", "taxi-*", "--where", '[["seats", ">=", 4]]', "--id", sub_id)
    assert made.returncode == 0, made.stderr
    assert key in made.stdout and "owner operator" in made.stdout
    listed = geofence("subscription", "list", "--tenant", tenant, "--json")
    assert listed.returncode == 0, listed.stderr
    mine = [s for s in json.loads(listed.stdout) if s["id"] == key]
    assert mine and (mine[0]["object"], mine[0]["radius_m"], mine[0]["match"]) == (
        qualify(tenant, "bus-9"), 300.0, "taxi-*")
    assert mine[0]["where"] == [["seats", ">=", 4]]
    everyone = json.loads(geofence("subscription", "list", "--json").stdout)
    assert key in [s["id"] for s in everyone]
    theirs = json.loads(geofence("subscription", "list", "--tenant", other_tenant, "--json").stdout)
    assert key not in [s["id"] for s in theirs]
    shown = geofence("subscription", "show", sub_id, "--tenant", tenant, "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["object"] == qualify(tenant, "bus-9")
    said = geofence("subscription", "show", sub_id, "--tenant", tenant)  # for a person: its list line
    assert said.returncode == 0 and said.stdout.split()[:2] == [key, qualify(tenant, "bus-9")], said.stdout
    elsewhere = geofence("subscription", "show", sub_id, "--tenant", other_tenant)
    assert elsewhere.returncode == 1 and "no subscription" in elsewhere.stderr
    bad = geofence("subscription", "add", "--tenant", tenant, "--object", "bus-9", "--radius", "0")
    assert bad.returncode == 2 and "invalid subscription" in bad.stderr and "radius" in bad.stderr
    bad_where = geofence("subscription", "add", "--tenant", tenant, "--object", "bus-9", "--radius", "10",
                         "--where", "[[")
    assert bad_where.returncode == 2 and "not JSON" in bad_where.stderr
    bad_tenant = geofence("subscription", "add", "--tenant", "Not_A_Tenant", "--object", "bus-9",
                          "--radius", "10")
    assert bad_tenant.returncode == 2 and "tenant" in bad_tenant.stderr
    no_tenant = geofence("subscription", "add", "--object", "bus-9", "--radius", "10")
    assert no_tenant.returncode == 2 and "--tenant" in no_tenant.stderr
    point_id = f"{sub_id}-pt"
    at_point = geofence("subscription", "add", "--tenant", tenant, "--point", "9.55", "47.12",
                        "--radius", "80", "--id", point_id)
    assert at_point.returncode == 0 and "point 9.550000,47.120000" in at_point.stdout, at_point.stderr
    stored = json.loads(geofence("subscription", "show", point_id, "--tenant", tenant, "--json").stdout)
    assert stored["point"] == [9.55, 47.12] and "object" not in stored
    assert geofence("subscription", "remove", point_id, "--tenant", tenant).returncode == 0
    kept = geofence("subscription", "remove", sub_id, "--tenant", other_tenant)
    assert kept.returncode == 1  # not the other tenant's: nothing removed
    gone = geofence("subscription", "remove", sub_id, "--tenant", tenant)
    assert gone.returncode == 0 and f"{sub_id} removed" in gone.stdout
    missing = geofence("subscription", "show", sub_id, "--tenant", tenant)
    assert missing.returncode == 1 and "no subscription" in missing.stderr
