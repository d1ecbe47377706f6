"""Webhooks on the live stack (issue 40): the API keeps a tenant's endpoints to public HTTPS
addresses and to its own admins; the webhooks sidecar POSTs a fence's events from the real
pipeline to a receiver (bench/webhook_receiver.py, allowed on loopback by the operator's
`geofence webhook add --local`), signed, in order, each under one webhook-id, through the
receiver's faults: down (delivered once it is back), 500s (retried), failing past the endpoint's
retry window (given up with the reason, then replayed), 410 (the endpoint disabled, its events
kept and delivered once it is enabled)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
import uuid
from typing import Any

import httpx

from bench.webhook_receiver import Receiver
from deploy.settings import ConnectionSettings
from exchanges.tenancy import qualify
from tests.integration.clients import DEADLINE, Account, Firebase, Login, geofence, member
from tests.integration.test_fence_api import feature
from tests.integration.test_fence_changes_live import HALF, Gateway, defined, square
from tests.integration.test_pipeline import pipeline  # noqa: F401 (fixture)

WHERE = (9.5660, 47.0920)  # a spot of this test's own
OUT = (WHERE[0] - 3 * HALF, WHERE[1])


async def test_the_api_keeps_endpoints_public_and_to_their_tenant(
        stack: ConnectionSettings, firebase: Firebase, tenant: str, other_tenant: str, editor: Account
) -> None:
    admin, outsider = member(firebase, tenant, "admin"), member(firebase, other_tenant, "admin")
    assert stack["api"] is not None
    async with httpx.AsyncClient(base_url=stack["api"], timeout=DEADLINE) as http:
        ok = {"url": "https://hooks.example.com/geofence", "kinds": ["enter"], "batch": 10}
        assert (await http.post("/webhooks", json=ok, headers=editor.auth)).status_code == 403
        for body, why in (({"url": "http://hooks.example.com/x"}, "https"),
                          ({"url": "https://127.0.0.1/x"}, "not a public address"),
                          ({"url": "https://169.254.169.254/latest"}, "not a public address"),
                          ({"url": "https://[::ffff:10.0.0.1]/x"}, "not a public address"),
                          ({"url": "https://u:p@hooks.example.com/x"}, "no user or password"),
                          ({**ok, "bogus": 1}, "body.bogus"), ({**ok, "kinds": ["teleport"]}, "kinds"),
                          ({**ok, "batch": 501}, "batch"), ({**ok, "timeout_s": 60}, "timeout_s")):
            refused = await http.post("/webhooks", json=body, headers=admin.auth)
            assert refused.status_code == 422 and why in refused.json()["detail"], (body, refused.text)
            assert refused.headers["content-type"] == "application/problem+json"
        made = await http.post("/webhooks", json=ok, headers=admin.auth)
        assert made.status_code == 201, made.text
        ep = made.json()
        assert ep["secret"].startswith("whsec_") and made.headers["location"] == f"/webhooks/{ep['id']}"
        try:
            listed = (await http.get("/webhooks", headers=admin.auth)).json()["webhooks"]
            assert [e["id"] for e in listed] == [ep["id"]] and "secret" not in listed[0]
            shown = (await http.get(f"/webhooks/{ep['id']}", headers=admin.auth)).json()
            assert shown["delivery"]["to_deliver"] == 0 and shown["kinds"] == ["enter"]
            for call in (http.get(f"/webhooks/{ep['id']}", headers=outsider.auth),
                         http.delete(f"/webhooks/{ep['id']}", headers=outsider.auth),
                         http.post(f"/webhooks/{ep['id']}/rotate", headers=outsider.auth)):
                assert (await call).status_code == 404  # another tenant's: not found, exists or not
            assert (await http.get("/webhooks", headers=outsider.auth)).json()["webhooks"] == []
            rotated = (await http.post(f"/webhooks/{ep['id']}/rotate", headers=admin.auth)).json()
            assert rotated["secret"].startswith("whsec_") and rotated["secret"] != ep["secret"]
        finally:
            assert (await http.delete(f"/webhooks/{ep['id']}", headers=admin.auth)).status_code == 204
        assert (await http.get(f"/webhooks/{ep['id']}", headers=admin.auth)).status_code == 404


def cli(*args: str) -> str:
    done = geofence("webhook", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def until(what: str, check: Any, deadline: float = 30.0) -> Any:
    """Poll `check()` (sync) until it returns something true, with a deadline."""
    end = time.monotonic() + deadline
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < end, f"{what}: not within {deadline:g} s"
        await asyncio.sleep(0.2)


def loaded(metrics: str, endpoint_id: str) -> bool:
    text = urllib.request.urlopen(metrics, timeout=5).read().decode()
    return re.search(rf'geofence_webhook_enabled{{endpoint="{endpoint_id}"[^}}]*}} 1', text) is not None


async def test_events_reach_an_endpoint_signed_in_order_through_its_faults(
        pipeline: ConnectionSettings, editor: Account, tenant: str, gateway: Login,  # noqa: F811
        firebase: Firebase) -> None:
    tag = uuid.uuid4().hex[:8]
    admin = member(firebase, tenant, "admin")  # told when the endpoint is disabled, on their device
    fid, other = f"hook-{tag}", f"nohook-{tag}"
    rx = Receiver("whsec_" + "A" * 32, keep=True)
    await rx.start()
    made = json.loads(cli("add", tenant, rx.url, "--local", "--fence", fid, "--kind", "enter",
                          "--kind", "leave", "--timeout", "1", "--retry-for", "3"))
    rx.secret, eid = made["secret"], made["id"]

    def show() -> dict[str, Any]:
        shown: dict[str, Any] = json.loads(cli("show", tenant, eid))
        return shown
    assert pipeline["api"] is not None
    async with httpx.AsyncClient(base_url=pipeline["api"], timeout=DEADLINE) as http, \
            Gateway(pipeline, gateway) as gw:
        for f in (fid, other):
            created = await http.post("/fences", json=feature(f, square(*WHERE)), headers=editor.auth)
            assert created.status_code == 201, created.text
        device = f"fcm-{tag}"
        registered = await http.post("/me/device-tokens", json={"token": device, "platform": "android"},
                                     headers=admin.auth)
        assert registered.status_code == 204, registered.text
        try:
            await defined(qualify(tenant, fid), 1)
            await defined(qualify(tenant, other), 1)
            metrics = pipeline["metrics"]["fence-webhooks"]
            await until("the sidecar loads the endpoint", lambda: loaded(metrics, eid))
            t0 = float(int(time.time())) + 1.0
            objs = [f"{c}-{tag}" for c in "abcde"]

            def arrived(obj: str, kind: str) -> dict[str, Any] | None:
                return next((e for e in rx.got.kept if e["object_id"] == obj and e["event"] == kind), None)

            # a: in and out, delivered as they come; the other fence's events are not this endpoint's
            a = objs[0]
            await gw.send((a, *OUT, t0))
            await gw.send((a, *WHERE, t0 + 10))
            await gw.send((a, *OUT, t0 + 20))
            enter = await until("a's ENTER", lambda: arrived(a, "enter"))
            assert enter["fence_id"] == fid and enter["schema"] == 1 and enter["tenant"] == tenant
            assert enter["position"]["ts"] == t0 + 10
            await until("a's LEAVE", lambda: arrived(a, "leave"))
            assert [e["event"] for e in rx.got.kept if e["object_id"] == a] == ["enter", "leave"]

            # b: the receiver down, then answering 500: retried until it takes them
            b = objs[1]
            await rx.stop()
            await gw.send((b, *OUT, t0), (b, *WHERE, t0 + 10))
            await until("a failed attempt while down", lambda: show()["delivery"]["last_error"])
            await rx.start()
            rx.set_mode("fail")
            await gw.send((b, *OUT, t0 + 20))
            await until("a 500 seen", lambda: rx.got.refused)
            rx.set_mode("ok")
            await until("b's ENTER and LEAVE", lambda: arrived(b, "enter") and arrived(b, "leave"))

            # c: failing past the endpoint's 3 s retry window: given up with the reason, replayed
            c = objs[2]
            rx.set_mode("fail")
            await gw.send((c, *OUT, t0), (c, *WHERE, t0 + 10))
            dead = await until("c given up", lambda: json.loads(cli("dead", tenant, eid, "--json")))
            assert dead[0]["event"]["object_id"] == c and "HTTP 500" in dead[0]["reason"]
            assert arrived(c, "enter") is None
            rx.set_mode("ok")
            assert "1 given-up" in cli("replay", tenant, eid)
            await until("c's ENTER after the replay", lambda: arrived(c, "enter"))

            # d: 410 Gone disables the endpoint; its events wait, and go once it is enabled
            d = objs[3]
            rx.set_mode("gone")
            await gw.send((d, *OUT, t0), (d, *WHERE, t0 + 10))
            off = await until("disabled on 410",
                              lambda: next((s for s in [show()] if not s["enabled"]), None))
            assert "410" in off["disabled_reason"]
            # its admins are told: a notice stored with the disable, pushed to the admin's device
            # (logged as local: the stack has no Cloud Messaging credentials), listed to admins only

            async def told() -> dict[str, Any] | None:
                got = await http.get("/notices", headers=admin.auth)
                assert got.status_code == 200, got.text
                return next((n for n in got.json()["notices"] if n["subject"] == eid and n["pushed"]), None)
            notice = None
            end = time.monotonic() + 30
            while notice is None:
                assert time.monotonic() < end, "no notice of the disabled endpoint pushed within 30 s"
                notice = await told()
                await asyncio.sleep(0.2)
            assert notice["kind"] == "webhook.disabled"
            assert "410" in notice["body"] and rx.url in notice["body"]
            assert notice["pushed"] >= 1  # this admin's device (the tenant may have other admins')
            assert (await http.get("/notices", headers=editor.auth)).status_code == 403
            assert [n["id"] for n in json.loads(cli("notices", tenant, "--json")) if n["subject"] == eid] == [
                notice["id"]]
            rx.set_mode("ok")
            assert arrived(d, "enter") is None
            cli("enable", tenant, eid)
            await until("d's ENTER once enabled", lambda: arrived(d, "enter"))

            assert not [e for e in rx.got.kept if e["fence_id"] != fid]
            assert rx.got.bad_signatures == 0
            assert all(len(ids) == 1 for ids in rx.got.under.values())  # one webhook-id per event
        finally:
            cli("remove", tenant, eid)
            await rx.stop()
            for f in (fid, other):
                await http.delete(f"/fences/{f}", headers=editor.auth)
