"""Where a position's time goes, hop by hop (issue 39), on the running stack.

Paced positions whose `ts` is the moment they are sent (a gateway batch of `--batch`, or one
MQTT message each with `--mqtt`) walk among the run's fences for `--seconds`. Each role counts
how old a position is when it takes it in (`position_age_seconds` of x-ingress, x-geo of each
region, x-fence of each worker), x-fence how old it is when its event is confirmed
(`event_latency_seconds`), and the bench when the event reaches it. The table gives the
quantiles of what the run added to each histogram (read from each sidecar's /metrics before and
after; linear within a bucket), hop by hop, so the difference of two rows is that hop's share.
Other traffic on the stack during the run is counted too: run it on a quiet stack.

    .venv/bin/python -m bench.hops [--rates 50,500] [--seconds 20] [--batch 10] [--mqtt]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import threading
import time
import urllib.request
import uuid
from collections.abc import Sequence

import aio_pika
import msgpack
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench import broker_modes as bm
from bench import report
from bench import tenant as tn
from bench import workload as wl
from deploy.settings import Settings, load_connection_settings
from exchanges import topology as t

HISTOGRAMS = ("position_age_seconds", "event_latency_seconds")
OBJECTS = 1000
FENCES = 1000
QUANTILES = (50, 90, 99)


def scrape(port: int) -> dict[str, tuple[list[float], np.ndarray]]:
    """Histogram name -> (upper bounds, cumulative counts) of one sidecar's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, tuple[list[float], np.ndarray]] = {}
    for fam in text_string_to_metric_families(text):
        short = fam.name.removeprefix("geofence_")
        if short not in HISTOGRAMS:
            continue
        buckets = [(float(s.labels["le"]), s.value) for s in fam.samples if s.name.endswith("_bucket")]
        buckets.sort()
        out[short] = ([b for b, _ in buckets], np.array([c for _, c in buckets], np.float64))
    return out


def quantile(bounds: Sequence[float], cumulative: np.ndarray, q: float) -> float:
    """The q-th percentile of a histogram's counts (cumulative per upper bound), linear within
    its bucket (as Prometheus's histogram_quantile); nan when empty."""
    total = float(cumulative[-1]) if cumulative.size else 0.0
    if total <= 0:
        return math.nan
    rank = q / 100 * total
    i = int(np.searchsorted(cumulative, rank, side="left"))
    if i >= len(bounds) or math.isinf(bounds[i]):
        return float(bounds[i - 1]) if i > 0 else math.nan
    lo = bounds[i - 1] if i > 0 else 0.0
    below = float(cumulative[i - 1]) if i > 0 else 0.0
    inside = float(cumulative[i]) - below
    return lo + (bounds[i] - lo) * ((rank - below) / inside if inside else 1.0)


def ports() -> dict[str, int]:
    """The pipeline's sidecars and their metrics ports, in the order a position meets them."""
    settings = Settings.from_env()
    every = settings.metrics_ports()
    names = ["x-ingress", *(f"x-geo-{r}" for r in settings.regions),
             *(f"x-fence-{w}" for w in settings.workers)]
    return {n: every[n] for n in names if n in every}


def snapshot(where: dict[str, int]) -> dict[str, dict[str, tuple[list[float], np.ndarray]]]:
    return {name: scrape(port) for name, port in where.items()}


def added(before: dict[str, dict[str, tuple[list[float], np.ndarray]]],
          after: dict[str, dict[str, tuple[list[float], np.ndarray]]], histogram: str,
          prefix: str) -> tuple[list[float], np.ndarray] | None:
    """What the run added to `histogram`, summed over the sidecars whose name starts with `prefix`."""
    total: np.ndarray | None = None
    bounds: list[float] = []
    for name, hs in after.items():
        if not name.startswith(prefix) or histogram not in hs:
            continue
        bounds, now = hs[histogram]
        was = before.get(name, {}).get(histogram, (bounds, np.zeros_like(now)))[1]
        d = now - (was if was.shape == now.shape else 0)
        total = d if total is None else total + d
    return None if total is None else (bounds, total)


async def probe(rate: float, seconds: float, batch: int, mqtt: bool, seed: int) -> list[list[str]]:
    """One paced run; the table's rows for it."""
    conn = load_connection_settings()
    run_id = uuid.uuid4().hex[:6]
    fences = bm.renamed(wl.make_fences(FENCES, seed), wl.random_walk(1, 1, seed), run_id)[0]
    walk = wl.random_walk(OBJECTS, max(1, int(rate * seconds)), seed)
    names = [f"{bm.run_prefix(run_id)}{o}" for o in walk.object_ids]
    where = ports()
    async with tn.run_gateway() as gw:
        await bm.put_fences(conn, fences)
        sink = bm.EventSink(conn, bm.run_prefix(run_id))
        await sink.start()
        try:
            before = snapshot(where)
            sent = await (publish_mqtt(gw, walk, names, rate) if mqtt else
                          publish_gateway(gw, walk, names, rate, batch))
            await asyncio.sleep(3.0)  # the last positions' events (a probe's tail, not a sync)
            after = snapshot(where)
        finally:
            await sink.close()
            await bm.remove_fences(conn, fences)
    got = np.array([recv - e[3] for e, recv in sink.got], np.float64)
    label = f"{'mqtt' if mqtt else f'gateway x{batch}'} at {rate:,.0f}/s"
    rows = []
    for hop, histogram, prefix in [("x-ingress takes it", "position_age_seconds", "x-ingress"),
                                   ("x-geo takes it", "position_age_seconds", "x-geo-"),
                                   ("x-fence takes it", "position_age_seconds", "x-fence-"),
                                   ("x-fence's event confirmed", "event_latency_seconds", "x-fence-")]:
        h = added(before, after, histogram, prefix)
        n = int(h[1][-1]) if h is not None and h[1].size else 0
        qs = [quantile(h[0], h[1], q) * 1e3 if h is not None else math.nan for q in QUANTILES]
        rows.append([label, hop, f"{n:,}", *(f"{v:.1f}" for v in qs)])
    qs = [float(np.percentile(got, q)) * 1e3 if got.size else math.nan for q in QUANTILES]
    rows.append([label, "the event received here", f"{got.size:,}", *(f"{v:.1f}" for v in qs)])
    print(f"{label}: {sent:,} positions sent, {len(sink.got):,} events received", flush=True)
    return rows


async def publish_gateway(gw: tn.Gateway, walk: wl.Stream, names: list[str], rate: float, batch: int) -> int:
    async with await aio_pika.connect(gw.amqp_url) as c:
        ch = await c.channel(publisher_confirms=True, on_return_raises=True)
        ex = await ch.get_exchange(t.GATEWAY_EXCHANGE, ensure=False)
        start, n, tasks = time.perf_counter(), len(walk), []
        for lo in range(0, n, batch):
            ahead = lo / rate - (time.perf_counter() - start)
            if ahead > 0:
                await asyncio.sleep(ahead)  # pacing the load
            now = time.time()
            body = msgpack.packb({"positions": [
                {"id": names[int(walk.obj[i])], "lon": float(walk.lon[i]), "lat": float(walk.lat[i]),
                 "ts": now} for i in range(lo, min(n, lo + batch))]})
            tasks.append(asyncio.create_task(ex.publish(aio_pika.Message(
                body, content_type="application/msgpack", delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                gw.routing_key)))
        await asyncio.gather(*tasks)
        return n


async def publish_mqtt(gw: tn.Gateway, walk: wl.Stream, names: list[str], rate: float) -> int:
    return await asyncio.to_thread(_publish_mqtt, gw.mqtt(), walk, names, rate)


def _publish_mqtt(cfg: dict[str, object], walk: wl.Stream, names: list[str], rate: float) -> int:
    import orjson
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    from exchanges.login_guard import client_id_for

    user = str(cfg["username"]).split(":", 1)[-1]
    me = client_id_for(user, f"hops-{uuid.uuid4().hex[:8]}")
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=me, protocol=mqtt.MQTTv311)
    client.username_pw_set(str(cfg["username"]), str(cfg["password"]))
    connected = threading.Event()
    client.on_connect = lambda c, u, f, rc, p=None: connected.set() if not rc.is_failure else None
    client.connect(str(cfg["host"]), int(str(cfg["port"])))
    client.loop_start()
    try:
        if not connected.wait(10):
            raise ConnectionError("the MQTT login was not accepted within 10 s")
        infos, start = [], time.perf_counter()
        prefix = f"{t.POSITIONS_TOPIC_PREFIX}/{tn.TENANT}"
        for i in range(len(walk)):
            ahead = i / rate - (time.perf_counter() - start)
            if ahead > 0:
                time.sleep(ahead)  # pacing the load
            body = orjson.dumps({"lon": float(walk.lon[i]), "lat": float(walk.lat[i]), "ts": time.time()})
            infos.append(client.publish(f"{prefix}/{names[int(walk.obj[i])]}", body, qos=1))
        for info in infos:
            info.wait_for_publish(timeout=60)
        return len(infos)
    finally:
        client.disconnect()
        client.loop_stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.hops", description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="50,500", help="positions/s, one run each (comma-separated)")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--batch", type=int, default=10, help="positions per gateway message")
    p.add_argument("--mqtt", action="store_true", help="one MQTT message per position instead")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    rows: list[list[str]] = []
    for rate in [float(r) for r in args.rates.split(",")]:
        rows += asyncio.run(probe(rate, args.seconds, args.batch, args.mqtt, args.seed))
    print(report.table(["run", "a position's age when", "count", *(f"p{q} (ms)" for q in QUANTILES)], rows))
    last = [r for r in rows if r[1] == "the event received here"]
    print(report.summary([f"{r[0]}: event p50 {r[3]} ms, p99 {r[5]} ms" for r in last], lead="bench.hops"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
