"""Proximity subscriptions through the AMQP fence API and the command line (issue 20), and the
loitering report over AMQP: what the HTTP API offers (tests/integration/test_proximity_live.py)
is there too, with the same checks (the operator claim, a bad definition refused with the
reason, another owner's subscription refused)."""

from __future__ import annotations

import json
import uuid

from deploy.settings import ConnectionSettings
from exchanges import topology as t
from fence.client import FenceClient
from tests.integration.clients import geofence
from tests.integration.test_fence_api import Account, account, feature, firebase, operator_account  # noqa: F401
from tests.integration.test_fence_changes_live import square


async def test_subscriptions_and_loitering_over_amqp(stack: ConnectionSettings,
                                                     firebase: tuple[str, int, str]) -> None:  # noqa: F811
    url = stack["users"][t.CLIENT_USER][t.FENCES_VHOST]
    op, user = operator_account(firebase), account(firebase)
    sub_id = f"rs-amqp-{uuid.uuid4().hex[:8]}"
    async with FenceClient(url, op.token) as client, FenceClient(url, user.token) as plain:
        denied = await plain.call("subscribe", subscription={"object": "truck-1", "radius_m": 100}, id=sub_id)
        assert denied.status == 403 and "geofence_operator" in (denied.error or "")
        bad = await client.call("subscribe", subscription={"object": "truck-1", "radius_m": -5}, id=sub_id)
        assert bad.status == 422 and "radius" in (bad.error or "")
        made = await client.subscribe({"object": "truck-1", "radius_m": 250, "match": "car-*",
                                       "where": [["type", "==", "car"]]}, sub_id)
        assert (made["id"], made["radius_m"], made["match"]) == (sub_id, 250.0, "car-*")
        assert made["owner"] == op.uid
        assert (await client.subscription(sub_id))["where"] == [["type", "==", "car"]]
        assert sub_id in [s["id"] for s in (await client.subscriptions())["subscriptions"]]
        changed = await client.subscribe({"object": "truck-1", "radius_m": 90}, sub_id)
        assert changed["radius_m"] == 90.0 and "match" not in changed
        assert (await plain.call("subscription", id=sub_id)).status == 403
        assert (await client.unsubscribe(sub_id)) == {"id": sub_id, "deleted": True}
        assert (await client.call("subscription", id=sub_id)).status == 404
        assert (await client.call("unsubscribe", id=sub_id)).status == 404

        fid = f"loiter-{uuid.uuid4().hex[:8]}"
        await plain.create(feature(fid, square(9.5777, 47.0777), dwell_s=60))
        try:
            report = await plain.loitering(fid, 0)
            assert report["fence_id"] == fid and report["min_s"] == 0.0
            assert isinstance(report["objects"], list)
            assert (await plain.call("loitering", fence_id=fid, min_s=-1)).status == 422
            assert (await client.call("loitering", fence_id=fid)).status == 403  # another user's fence
        finally:
            await plain.delete(fid)


def test_subscriptions_from_the_command_line(stack: ConnectionSettings) -> None:
    sub_id = f"rs-cli-{uuid.uuid4().hex[:8]}"
    made = geofence("subscription", "add", "--object", "bus-9", "--radius", "300", "--match", "taxi-*",
                    "--where", '[["seats", ">=", 4]]', "--id", sub_id)
    assert made.returncode == 0, made.stderr
    assert sub_id in made.stdout and "owner operator" in made.stdout
    listed = geofence("subscription", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    mine = [s for s in json.loads(listed.stdout) if s["id"] == sub_id]
    assert mine and (mine[0]["object"], mine[0]["radius_m"], mine[0]["match"]) == ("bus-9", 300.0, "taxi-*")
    assert mine[0]["where"] == [["seats", ">=", 4]]
    shown = geofence("subscription", "show", sub_id)
    assert shown.returncode == 0 and json.loads(shown.stdout)["object"] == "bus-9"
    bad = geofence("subscription", "add", "--object", "bus-9", "--radius", "0")
    assert bad.returncode == 2 and "invalid subscription" in bad.stderr and "radius" in bad.stderr
    bad_where = geofence("subscription", "add", "--object", "bus-9", "--radius", "10", "--where", "[[")
    assert bad_where.returncode == 2 and "not JSON" in bad_where.stderr
    point_id = f"{sub_id}-pt"
    at_point = geofence("subscription", "add", "--point", "9.55", "47.12", "--radius", "80", "--id", point_id)
    assert at_point.returncode == 0 and "point 9.550000,47.120000" in at_point.stdout, at_point.stderr
    stored = json.loads(geofence("subscription", "show", point_id).stdout)
    assert stored["point"] == [9.55, 47.12] and "object" not in stored
    assert geofence("subscription", "remove", point_id).returncode == 0
    gone = geofence("subscription", "remove", sub_id)
    assert gone.returncode == 0 and f"{sub_id} removed" in gone.stdout
    missing = geofence("subscription", "show", sub_id)
    assert missing.returncode == 2 and "no subscription" in missing.stderr
