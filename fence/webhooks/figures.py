"""Per endpoint figures of the webhooks sidecar, as Prometheus families labelled by endpoint and
tenant (what the sidecar's own Counters cannot say: they have one label, the role).

    geofence_webhook_delivered_total       events delivered (2xx)
    geofence_webhook_requests_total        requests made, by outcome (ok, failed)
    geofence_webhook_dead_total            events given up (dead-lettered in the outbox)
    geofence_webhook_disabled_total        times the endpoint was disabled
    geofence_webhook_backlog               events waiting to be delivered
    geofence_webhook_oldest_seconds        how long the oldest of them has waited
    geofence_webhook_enabled               1 enabled, 0 disabled
    geofence_webhook_request_seconds       histogram: a request's time, answer or not
    geofence_webhook_lag_seconds           histogram: an event's time to its delivery

The series are bounded: endpoints are at most MAX_ENDPOINTS per tenant, and a removed one's
series go at the next reload.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from exchanges.shell.counters import Histogram

REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


@dataclass
class EndpointFigures:
    tenant: str
    enabled: bool = True
    delivered: int = 0
    ok_requests: int = 0
    failed_requests: int = 0
    dead: int = 0
    disabled: int = 0
    backlog: int = 0
    oldest_s: float = 0.0
    request_s: Histogram = field(default_factory=lambda: Histogram(REQUEST_BUCKETS))
    lag_s: Histogram = field(default_factory=lambda: Histogram(LAG_BUCKETS))

    def to_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "enabled": self.enabled, "delivered": self.delivered,
                "requests_ok": self.ok_requests, "requests_failed": self.failed_requests, "dead": self.dead,
                "backlog": self.backlog, "oldest_s": round(self.oldest_s, 3)}


class WebhookFigures(Collector):
    def __init__(self) -> None:
        self.by_endpoint: dict[str, EndpointFigures] = {}

    def of(self, endpoint_id: str, tenant: str) -> EndpointFigures:
        f = self.by_endpoint.get(endpoint_id)
        if f is None:
            f = self.by_endpoint[endpoint_id] = EndpointFigures(tenant)
        return f

    def keep(self, endpoint_ids: set[str]) -> None:
        for gone in set(self.by_endpoint) - endpoint_ids:
            del self.by_endpoint[gone]

    def collect(self) -> Iterator[Any]:
        labels = ["endpoint", "tenant"]
        items = list(self.by_endpoint.items())

        def family(kind: type, name: str, doc: str, value: Any, extra: list[str] | None = None) -> Any:
            f = kind(f"geofence_webhook_{name}", doc, labels=labels + (extra or []))
            for ep, fig in items:
                for more, v in value(fig):
                    f.add_metric([ep, fig.tenant, *more], v)
            return f

        yield family(CounterMetricFamily, "delivered", "Events delivered (2xx)",
                     lambda f: [([], f.delivered)])
        yield family(CounterMetricFamily, "requests", "Requests made, by outcome",
                     lambda f: [(["ok"], f.ok_requests), (["failed"], f.failed_requests)], ["outcome"])
        yield family(CounterMetricFamily, "dead", "Events given up", lambda f: [([], f.dead)])
        yield family(CounterMetricFamily, "disabled", "Times the endpoint was disabled",
                     lambda f: [([], f.disabled)])
        yield family(GaugeMetricFamily, "backlog", "Events waiting to be delivered",
                     lambda f: [([], f.backlog)])
        yield family(GaugeMetricFamily, "oldest_seconds", "Age of the oldest event waiting",
                     lambda f: [([], f.oldest_s)])
        yield family(GaugeMetricFamily, "enabled", "1 enabled, 0 disabled", lambda f: [([], int(f.enabled))])
        for name, doc in (("request_seconds", "A request's time, answer or not"),
                          ("lag_seconds", "An event's time (its ts) to its delivery")):
            hf = HistogramMetricFamily(f"geofence_webhook_{name}", doc, labels=labels)
            for ep, fig in items:
                h = fig.request_s if name == "request_seconds" else fig.lag_s
                cumulative = np.cumsum(h.counts).tolist()
                buckets = [(repr(float(b)), n) for b, n in zip(h.bounds.tolist(), cumulative, strict=False)]
                buckets.append(("+Inf", cumulative[-1]))
                hf.add_metric([ep, fig.tenant], buckets, h.total)
            yield hf
