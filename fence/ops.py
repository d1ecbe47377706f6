"""The figures of the operators' page `/ops`, from Prometheus (deploy/monitoring.py): the
same series the metrics carry and the alerts evaluate, so the page and the alerts never
disagree.

`OpsFigures.take()` asks Prometheus' HTTP API a handful of instant queries and three range
queries (the last 15 minutes, 5 s apart) at once and shapes the answers for the page: per
process its state and rates, the queues with the deepest backlog, dead letters by reason, the
device-to-event latency, the alerts firing. Prometheus unreachable: `Unavailable` (the API
answers 503 and the page says so).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from exchanges.health import WAITING

WINDOW_S = 900
TOP_QUEUES = 15
STEP_S = 5
RATE = "30s"  # over 6 scrapes at the local stack's 5 s interval
QUERIES = {
    "up": 'up{job="geofence"}',
    "received": f"sum by (name, role) (rate(geofence_messages_received_total[{RATE}]))",
    "positions": f"sum by (name) (rate(geofence_positions_total[{RATE}]))",
    "events": f"sum by (name) (rate(geofence_events_total[{RATE}]))",
    "objects": "geofence_objects_tracked",
    "fences": "geofence_fences_bound",
    "held": "geofence_held_positions",
    # a process whose session lost its consumer is down though it answers its scrape
    # (exchanges/shell/lifecycle.py): consuming, and why not on purpose
    "consuming": "geofence_consuming",
    "recovering": "geofence_recovering == 1",
    "paused": "geofence_paused == 1",
    "standby": "geofence_standby == 1",
    # (not the workers' journal streams: a stream keeps what it was sent, it has no backlog)
    "ready": 'rabbitmq_detailed_queue_messages_ready{queue!~"x-fence\\\\..+\\\\.journal"}',
    "unacked": 'rabbitmq_detailed_queue_messages_unacked{queue!~"x-fence\\\\..+\\\\.journal"}',
    "dead_letters": "sum by (role, reason) (geofence_dead_letters_total)",
    "dead_letters_15m": "sum by (role, reason) (increase(geofence_dead_letters_total[15m]))",
    "p50": "histogram_quantile(0.5, sum by (le) (rate(geofence_event_latency_seconds_bucket[1m])))",
    "p99": "histogram_quantile(0.99, sum by (le) (rate(geofence_event_latency_seconds_bucket[1m])))",
    # per webhook endpoint (fence/webhooks/figures.py)
    "wh_enabled": "geofence_webhook_enabled",
    "wh_delivered": f"sum by (endpoint) (rate(geofence_webhook_delivered_total[{RATE}]))",
    "wh_failed": f'sum by (endpoint) (rate(geofence_webhook_requests_total{{outcome="failed"}}[{RATE}]))',
    "wh_backlog": "geofence_webhook_backlog",
    "wh_oldest": "geofence_webhook_oldest_seconds",
    "wh_lag_p99": "histogram_quantile(0.99, sum by (le, endpoint) "
                  "(rate(geofence_webhook_lag_seconds_bucket[1m])))",
    "wh_dead": "geofence_webhook_dead_total",
}
SERIES = {
    "updates_per_s": f'sum(rate(geofence_positions_total{{role="x-ingress"}}[{RATE}]))',
    "events_per_s": f'sum(rate(geofence_events_total{{role="x-fence"}}[{RATE}]))',
    "p99_ms": "1000 * " + QUERIES["p99"],
}


class Unavailable(RuntimeError):
    """Prometheus did not answer."""


def _number(value: str) -> float | None:
    x = float(value)
    return None if math.isnan(x) or math.isinf(x) else x


class OpsFigures:
    def __init__(self, prometheus_url: str, timeout: float = 5.0) -> None:
        self.base = prometheus_url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as r:
                got = json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise Unavailable(f"Prometheus at {self.base} did not answer: {exc}") from None
        if got.get("status") != "success":
            raise Unavailable(f"Prometheus refused a query: {got.get('error', got)}")
        return got["data"]

    async def _instant(self, promql: str, at: float) -> list[dict[str, Any]]:
        data = await asyncio.to_thread(self._get, "/api/v1/query", {"query": promql, "time": f"{at:.3f}"})
        return list(data["result"])

    async def _range(self, promql: str, start: float, end: float) -> dict[float, float | None]:
        data = await asyncio.to_thread(self._get, "/api/v1/query_range", {
            "query": promql, "start": f"{start:.0f}", "end": f"{end:.0f}", "step": str(STEP_S)})
        result = data["result"]
        return {float(t): _number(v) for t, v in result[0]["values"]} if result else {}

    async def take(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        names = list(QUERIES)
        instant = await asyncio.gather(*(self._instant(QUERIES[n], now) for n in names))
        got = dict(zip(names, instant, strict=True))
        start = now - WINDOW_S
        ranges = await asyncio.gather(*(self._range(q, start, now) for q in SERIES.values()))
        alerts = await asyncio.to_thread(self._get, "/api/v1/alerts", {})
        return shape(got, dict(zip(SERIES, ranges, strict=True)), alerts.get("alerts", []), now, start)


def _by(rows: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float | None]:
    return {tuple(r["metric"].get(k, "") for k in labels): _number(r["value"][1]) for r in rows}


def process_state(scraped: bool, consuming: float | None, waiting: str | None) -> str:
    """"up", "DOWN" (no scrape answer), "not consuming" (its session lost its consumer), or
    why it does not consume on purpose ("recovering", "paused", "standby"). A process without
    the gauge (no input queue) is up when it answers."""
    if not scraped:
        return "DOWN"
    if consuming is None or consuming == 1.0:
        return "up"
    return waiting or "not consuming"


def shape(got: dict[str, list[dict[str, Any]]], ranges: dict[str, dict[float, float | None]],
          alerts: list[dict[str, Any]], now: float, start: float) -> dict[str, Any]:
    """The page's JSON from Prometheus' answers (pure: the tests feed it answers)."""
    up = _by(got["up"], "name")
    received = {k[0]: (k[1], v) for k, v in _by(got["received"], "name", "role").items()}
    per = {k: _by(got[k], "name") for k in ("positions", "events", "objects", "fences", "held")}
    consuming = _by(got.get("consuming", []), "name")
    waiting = {r["metric"].get("name", ""): why for why in WAITING for r in got.get(why, [])}
    processes = []
    for (name,), scraped in sorted(up.items()):
        role, rate = received.get(name, ("", None))
        state = process_state(scraped == 1.0, consuming.get((name,)), waiting.get(name))
        processes.append({"name": name, "role": role, "up": state in ("up", *WAITING), "state": state,
                          "received_per_s": rate, **{k: per[k].get((name,)) for k in per}})
    ready, unacked = _by(got["ready"], "vhost", "queue"), _by(got["unacked"], "vhost", "queue")
    deepest = sorted({*ready, *unacked}, key=lambda k: (-((ready.get(k) or 0) + (unacked.get(k) or 0)), k))
    queues = [{"vhost": k[0], "queue": k[1], "ready": ready.get(k), "unacked": unacked.get(k)}
              for k in deepest[:TOP_QUEUES]]
    recent = _by(got["dead_letters_15m"], "role", "reason")
    dead = [{"role": role, "reason": reason, "total": v, "last_15m": recent.get((role, reason))}
            for (role, reason), v in sorted(_by(got["dead_letters"], "role", "reason").items())]
    steps = [start + i * STEP_S for i in range(int((now - start) // STEP_S) + 1)]
    series: dict[str, Any] = {"t": steps}
    for name, values in ranges.items():
        by_t = {round(t): v for t, v in values.items()}
        series[name] = [by_t.get(round(t)) for t in steps]
    p50, p99 = (_number(g[0]["value"][1]) if g else None for g in (got["p50"], got["p99"]))
    wh = {k: _by(got.get(k, []), "endpoint") for k in ("wh_delivered", "wh_failed", "wh_backlog", "wh_oldest",
                                                      "wh_lag_p99", "wh_dead")}
    tenant_of = {r["metric"].get("endpoint", ""): r["metric"].get("tenant", "")
                 for r in got.get("wh_enabled", [])}
    enabled = _by(got.get("wh_enabled", []), "endpoint")
    webhooks = [{"endpoint": e, "tenant": tenant_of.get(e, ""), "enabled": v == 1.0,
                 "delivered_per_s": wh["wh_delivered"].get((e,)), "failed_per_s": wh["wh_failed"].get((e,)),
                 "backlog": wh["wh_backlog"].get((e,)), "oldest_s": wh["wh_oldest"].get((e,)),
                 "lag_p99_ms": None if (x := wh["wh_lag_p99"].get((e,))) is None else 1000 * x,
                 "dead": wh["wh_dead"].get((e,))} for (e,), v in sorted(enabled.items())]
    return {
        "at": now, "processes": processes, "queues": queues, "dead_letters": dead,
        "latency_ms": {k: None if v is None else 1000 * v for k, v in (("p50", p50), ("p99", p99))},
        "series": series, "webhooks": webhooks,
        "alerts": [{"name": a.get("labels", {}).get("alertname", ""), "state": a.get("state", ""),
                    "summary": a.get("annotations", {}).get("summary", "")} for a in alerts],
    }
