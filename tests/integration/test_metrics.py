"""Metrics on the live stack: every process `geofence status --json` lists answers /metrics with
its role's families; positions through the pipeline move the counters, the events by kind and
the device-to-event latency histogram; Prometheus (started by `geofence up`) scrapes every
target, RabbitMQ's plugin included, and answers a query; its configuration and alert rules pass
promtool, and the rules' own tests (deploy/prometheus/rules_test.yml) pass."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from prometheus_client.parser import text_string_to_metric_families
from shapely.geometry import box

from deploy import monitoring
from deploy.settings import ConnectionSettings, Settings, sidecar_ids, sidecar_names
from exchanges import topology as t
from exchanges.tenancy import qualify
from fence.manager import FenceManager
from fence.spec import FenceSpec
from tests.integration.clients import DEADLINE, poll

pytestmark = pytest.mark.integration
PROMETHEUS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        body: str = r.read().decode()
        return body


def scrape(url: str) -> dict[str, float]:
    """Sample name{labels} -> value."""
    out = {}
    for family in text_string_to_metric_families(get(url)):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def total(samples: dict[str, float], prefix: str, *needles: str) -> float:
    return sum(v for k, v in samples.items() if k.startswith(prefix + "{") and all(n in k for n in needles))


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary is not None, "promtool not found: `bash deploy/setup.sh` installs Debian's prometheus"
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_the_configuration_and_the_alert_rules_pass_promtool(stack: ConnectionSettings) -> None:
    live = monitoring.prometheus_dir(Settings.from_env())
    checked = promtool("check", "config", "prometheus.yml", cwd=live)  # the copy with its targets
    assert checked.returncode == 0 and "WARNING" not in checked.stdout + checked.stderr, checked
    rules = promtool("check", "rules", "rules.yml", cwd=PROMETHEUS_DIR)
    assert rules.returncode == 0 and "10 rules found" in rules.stdout, rules
    tested = promtool("test", "rules", "rules_test.yml", cwd=PROMETHEUS_DIR)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested
    targets = json.loads((live / "targets-geofence.json").read_text())
    assert [g["labels"]["name"] for g in targets] == [*stack["metrics"], "broker-guard"]


async def test_every_process_serves_its_metrics_and_positions_move_them(stack: ConnectionSettings,
                                                                        tenant: str) -> None:
    settings = Settings.from_env()
    roles = {name: "fence-api" if role == "api" else role  # the API process calls itself fence-api
             for name, (role, _) in zip(sidecar_names(settings.topology), sidecar_ids(settings.topology),
                                        strict=True)}
    assert set(roles) == set(stack["metrics"])
    for name, url in stack["metrics"].items():
        samples = await asyncio.to_thread(scrape, url)
        assert f"geofence_messages_received_total{{role={roles[name]}}}" in samples, name
    assert "rabbitmq_" in await asyncio.to_thread(get, stack["rabbitmq_metrics"])
    workers = [url for name, url in stack["metrics"].items() if name.startswith("x-fence-")]

    async def events_and_latency() -> tuple[float, float]:
        got = await asyncio.gather(*(asyncio.to_thread(scrape, u) for u in workers))
        return (sum(total(s, "geofence_events_out_total", "kind=enter", "reason=entered") for s in got),
                sum(total(s, "geofence_event_latency_seconds_count") for s in got))

    ingress_url = stack["metrics"]["x-ingress"]
    before_positions = total(await asyncio.to_thread(scrape, ingress_url), "geofence_positions_total")
    before_events, before_latency = await events_and_latency()
    fid, obj = qualify(tenant, f"mx-{uuid.uuid4().hex[:8]}"), f"mo-{uuid.uuid4().hex[:8]}"  # the tenant's
    amqp = stack["users"][t.MANAGER_USER][t.region_vhost(settings.regions[0])]
    async with FenceManager(amqp, stack["postgres"]["dsn"], settings.regions, settings.workers) as m:
        await m.put(FenceSpec(fence_id=fid, geometry=box(9.500, 47.100, 9.510, 47.110), timeout_s=600),
                    create=True)
        await m.applied()
        try:
            async with await aio_pika.connect(stack["amqp"][t.INGRESS_VHOST], timeout=DEADLINE) as conn:
                ch = await conn.channel(publisher_confirms=True)
                ex = await ch.get_exchange(t.MQTT_TOPIC_EXCHANGE)
                now = time.time()
                for i, (lon, lat) in enumerate(((9.495, 47.105), (9.505, 47.105), (9.506, 47.105))):
                    body = json.dumps({"lon": lon, "lat": lat, "ts": now + i * 0.01}).encode()
                    await ex.publish(aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                                     f"positions.{tenant}.{obj}", mandatory=True)
            moved: list[float] = []

            async def counted() -> bool:
                events, latency = await events_and_latency()
                positions = total(await asyncio.to_thread(scrape, ingress_url), "geofence_positions_total")
                moved[:] = [positions - before_positions, events - before_events, latency - before_latency]
                return moved[0] >= 3 and moved[1] >= 1 and moved[2] >= 1

            end = time.monotonic() + DEADLINE
            while not await counted() and time.monotonic() < end:
                await asyncio.sleep(0.2)
            assert moved[0] >= 3 and moved[1] >= 1 and moved[2] >= 1, moved
        finally:
            await m.remove(fid)


def query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    got = json.loads(get(url))
    assert got["status"] == "success", got
    result: list[dict[str, Any]] = got["data"]["result"]
    return result


async def test_prometheus_scrapes_every_target_and_answers(stack: ConnectionSettings) -> None:
    base = stack["prometheus"]
    seen: dict[str, str] = {}

    def all_up() -> bool:
        targets = json.loads(get(f"{base}/api/v1/targets"))["data"]["activeTargets"]
        seen.clear()
        seen.update({t_["labels"]["name"]: t_["health"] for t_ in targets})
        return set(seen) == {*stack["metrics"], "broker-guard", "rabbitmq"} and set(seen.values()) == {"up"}

    await poll(all_up, "every target scraped and up")
    rows = await asyncio.to_thread(query, base, 'geofence_messages_received_total{role="x-ingress"}')
    assert [r["metric"]["name"] for r in rows] == ["x-ingress"]
    rules = json.loads(await asyncio.to_thread(get, f"{base}/api/v1/rules"))["data"]["groups"]
    assert {r["name"] for g in rules for r in g["rules"]} >= {
        "GeofenceRoleDown", "GeofenceDeadLettersGrowing", "GeofenceRoleSilent", "GeofenceConfirmLag",
        "GeofenceEventLatencyHigh", "GeofenceSensorOffline"}
