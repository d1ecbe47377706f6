"""A sidecar's Counters as Prometheus metrics (exchanges/shell/metrics.py): the families, their
names and labels by Prometheus' conventions, histograms with cumulative buckets, and the small
/metrics server answering a real HTTP client."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exchanges.settings import ConfigError
from exchanges.shell import Counters, SidecarConfig
from exchanges.shell.metrics import metrics_server, registry_of


def scrape(counters: Counters, extra: dict[str, float] | None = None) -> dict[str, object]:
    registry = registry_of(counters, "x-fence", (lambda: extra) if extra else None)
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(family: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}  # type: ignore[attr-defined]


def test_the_counters_become_families_with_their_role() -> None:
    c = Counters()
    c.batch(3)
    c.batch(700)
    c.positions += 703
    c.dead_lettered["lat N is outside [N, N]"] += 2
    c.events_by[("enter", "entered")] += 5
    c.bump("journal_records", 4)
    c.bump("journal_us", 2_500_000)
    c.gauge("objects_tracked", 42)
    got = scrape(c, {"venue_cache_hits_total": 9.0, "queue_depth": 3.0})
    me = (("role", "x-fence"),)
    assert samples(got["geofence_positions"])[("geofence_positions_total", me)] == 703
    assert samples(got["geofence_messages_received"])[("geofence_messages_received_total", me)] == 703
    dl = samples(got["geofence_dead_letters"])
    assert dl[("geofence_dead_letters_total", (("reason", "lat N is outside [N, N]"), *me))] == 2
    ev = samples(got["geofence_events_out"])
    assert ev[("geofence_events_out_total", (("kind", "enter"), ("reason", "entered"), *me))] == 5
    assert got["geofence_journal_records"].type == "counter"
    assert samples(got["geofence_journal_seconds"])[("geofence_journal_seconds_total", me)] == 2.5
    assert samples(got["geofence_objects_tracked"])[("geofence_objects_tracked", me)] == 42
    assert got["geofence_objects_tracked"].type == "gauge"
    assert got["geofence_venue_cache_hits"].type == "counter" and got["geofence_queue_depth"].type == "gauge"
    h = samples(got["geofence_batch_size"])
    assert h[("geofence_batch_size_count", me)] == 2 and h[("geofence_batch_size_sum", me)] == 703
    assert h[("geofence_batch_size_bucket", (("le", "5.0"), *me))] == 1
    assert h[("geofence_batch_size_bucket", (("le", "1000.0"), *me))] == 2
    assert h[("geofence_batch_size_bucket", (("le", "+Inf"), *me))] == 2


def test_a_histogram_takes_a_batch_of_values_at_once() -> None:
    c = Counters()
    c.observe("event_latency_seconds", [0.004, 0.005, 0.02, 30.0])
    c.observe("event_latency_seconds", [])
    h = c.histograms["event_latency_seconds"]
    assert h.count == 4 and h.total == pytest.approx(30.029)
    got = samples(scrape(c)["geofence_event_latency_seconds"])
    le = {dict(k[1])["le"]: v for k, v in got.items() if k[0].endswith("_bucket")}
    assert (le["0.0025"], le["0.005"], le["0.025"], le["10.0"], le["+Inf"]) == (0, 2, 3, 3, 4)


async def test_the_server_answers_get_metrics_and_nothing_else() -> None:
    c = Counters()
    c.positions = 7
    async with metrics_server("127.0.0.1:0", registry_of(c, "x-ingress")) as server:
        assert server is not None
        port = server.sockets[0].getsockname()[1]

        def get(path: str) -> tuple[int, str, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                    return r.status, r.headers["Content-Type"], r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.headers["Content-Type"], e.read().decode()

        status, ctype, body = await asyncio.to_thread(get, "/metrics")
        assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
        assert 'geofence_positions_total{role="x-ingress"} 7.0' in body
        assert (await asyncio.to_thread(get, "/"))[0] == 404
    async with metrics_server("", registry_of(c, "x")) as none:
        assert none is None


def test_the_listen_setting_is_checked() -> None:
    env = {"GEOFENCE_AMQP_URL": "amqp://u:p@h:5672/", "GEOFENCE_POSTGRES_URL": "postgresql://u:p@h/db"}
    cfg = SidecarConfig.from_env("x-geo", "a", {**env, "GEOFENCE_METRICS_LISTEN": "127.0.0.1:9470"})
    assert cfg.metrics_listen == "127.0.0.1:9470" and "metrics 127.0.0.1:9470" in cfg.describe()
    for bad in ("9470", "host:", "host:99999", "host:port"):
        with pytest.raises(ConfigError, match="GEOFENCE_METRICS_LISTEN"):
            SidecarConfig.from_env("x-geo", "a", {**env, "GEOFENCE_METRICS_LISTEN": bad})
