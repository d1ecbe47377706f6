"""Prometheus metrics of a sidecar: its `Counters` as metric families, served on
GEOFENCE_METRICS_LISTEN (host:port) at /metrics by a small asyncio server in the sidecar's own
event loop.

Names follow Prometheus' conventions: `geofence_` prefix, `_total` counters, base units
(seconds, bytes), label `role` on every family (`reason`, `kind` where a count is split). Which
process a series comes from is the scrape target's business (its `instance`, and the `name`
label deploy/monitoring.py gives each target: x-fence-w0), so the process does not repeat
it. What a role counts with `Counters.bump(name)` becomes `geofence_<name>_total`, what it sets
with `gauge(name)` `geofence_<name>`, what it observes with `observe(name, values)` a histogram
`geofence_<name>` with the buckets of HISTOGRAM_BUCKETS.

Trade-off: the metrics are read from the live Counters at scrape time, in the event loop (no
thread, no lock: the loop is the only writer), and the histograms are numpy bucket counts a
batch at a time (`observe` takes an array), so a batch of 5,000 events costs one searchsorted,
not 5,000 calls. The price: a scrape waits for the loop, so a loop stuck in a long batch
answers late (Prometheus marks the scrape failed after its timeout: a signal in itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from exchanges.shell.config import parse_listen
from exchanges.shell.counters import Counters

log = logging.getLogger("geofence")
PREFIX = "geofence_"
# the classic text format, which every Prometheus 2.x reads (Debian's is 2.42)
TEXT_FORMAT = b"text/plain; version=0.0.4; charset=utf-8"
_NAME = re.compile(r"[^a-zA-Z0-9_]")
HELP = {  # families every role has
    "messages_received": "Messages taken from the role's input queues",
    "positions": "Positions processed",
    "published": "Messages published (confirmed where confirms are on)",
    "events": "Events published (ENTER / LEAVE)",
    "batches": "Batches handled",
    "dead_letters": "Messages dead-lettered, by reason (without its variable parts)",
    "publish_retries": "Publishes the broker refused and that were sent again",
    "events_out": "Events published, by kind and reason",
}


def metric_name(name: str) -> str:
    return PREFIX + _NAME.sub("_", name).strip("_").lower()


class CountersCollector(Collector):
    """A role's Counters as metric families (read at each scrape)."""

    def __init__(self, counters: Counters, role: str,
                 extra: Callable[[], Mapping[str, float]] | None = None) -> None:
        self.counters, self.labels = counters, (role,)
        self.extra = extra  # more values, read at the scrape: a name ending _total is a counter

    def collect(self) -> Iterator[Any]:
        c, labels, names = self.counters, list(self.labels), ["role"]
        for name, value in (("messages_received", c.received), ("positions", c.positions),
                            ("published", c.published), ("events", c.events), ("batches", c.batches),
                            ("publish_retries", c.retries)):
            f = CounterMetricFamily(metric_name(name), HELP[name], labels=names)
            f.add_metric(labels, value)
            yield f
        f = CounterMetricFamily(metric_name("dead_letters"), HELP["dead_letters"], labels=[*names, "reason"])
        for reason, n in list(c.dead_lettered.items()):
            f.add_metric([*labels, reason], n)
        yield f
        f = CounterMetricFamily(metric_name("events_out"), HELP["events_out"],
                                labels=[*names, "kind", "reason"])
        for (kind, reason), n in list(c.events_by.items()):
            f.add_metric([*labels, kind, reason], n)
        yield f
        for name, count in list(c.other.items()):
            amount = float(count)
            if name.endswith("_us"):  # microseconds counted, seconds exported (base units)
                name, amount = name.removesuffix("_us") + "_seconds", count / 1e6
            f = CounterMetricFamily(metric_name(name), f"{name} (counted by the role)", labels=names)
            f.add_metric(labels, amount)
            yield f
        gauges: dict[str, float] = dict(c.gauges)
        if self.extra is not None:
            for name, x in self.extra().items():
                if name.endswith("_total"):
                    f = CounterMetricFamily(metric_name(name.removesuffix("_total")), name, labels=names)
                    f.add_metric(labels, x)
                    yield f
                else:
                    gauges[name] = x
        for name, x in gauges.items():
            g = GaugeMetricFamily(metric_name(name), f"{name} (now)", labels=names)
            g.add_metric(labels, x)
            yield g
        for name, h in list(c.histograms.items()):
            cumulative = np.cumsum(h.counts).tolist()
            buckets = [(_le(b), n) for b, n in zip(h.bounds.tolist(), cumulative, strict=False)]
            buckets.append(("+Inf", cumulative[-1]))
            hf = HistogramMetricFamily(metric_name(name), f"{name} (histogram)", labels=names)
            hf.add_metric(labels, buckets, h.total)
            yield hf


def _le(bound: float) -> str:
    return repr(float(bound))


def registry_of(counters: Counters, role: str,
                extra: Callable[[], Mapping[str, float]] | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CountersCollector(counters, role, extra))
    return registry


async def _answer(registry: CollectorRegistry, reader: asyncio.StreamReader,
                  writer: asyncio.StreamWriter) -> None:
    try:
        async with asyncio.timeout(5.0):
            request = await reader.readline()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
        parts = request.split()
        if len(parts) >= 2 and parts[0] in (b"GET", b"HEAD") and parts[1].split(b"?")[0] == b"/metrics":
            body, status, ctype = generate_latest(registry), b"200 OK", TEXT_FORMAT
        else:
            body, status, ctype = b"only GET /metrics here\n", b"404 Not Found", b"text/plain"
        body_out = b"" if parts and parts[0] == b"HEAD" else body
        writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body_out)
        await writer.drain()
    except (TimeoutError, ConnectionError, OSError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


@contextlib.asynccontextmanager
async def metrics_server(listen: str, registry: CollectorRegistry) -> AsyncIterator[asyncio.Server | None]:
    """Serve /metrics on `listen` (host:port) while in the block; "" serves nothing. A port
    that is taken is logged, not fatal: the role's work matters more than its metrics."""
    if not listen:
        yield None
        return
    host, port = parse_listen(listen)
    try:
        server = await asyncio.start_server(lambda r, w: _answer(registry, r, w), host, port)
    except OSError as exc:
        log.error("metrics: cannot listen on %s (%s); serving no metrics", listen, exc)
        yield None
        return
    log.info("metrics on http://%s/metrics", listen)
    try:
        yield server
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2.0)
