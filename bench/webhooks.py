"""Webhook delivery on the running stack (issue 40): events published as x-fence publishes them
(JSON arrays of a worker batch's events on fence.event-batches, persistent, confirmed) for a
tenant with one endpoint, a local receiver (bench/webhook_receiver.py) that checks every
signature, and three runs:

- rate: N events as fast as they are taken; delivered events/s is N over first publish ->
  last event received (target >= 5,000/s signed).
- lag: the events at half that rate for --lag-s seconds; per event, its receipt minus its ts
  (the publish time): p50 / p99.
- faults: events at --fault-rate/s while the receiver is down --down-s seconds (connections
  refused), then answers 500 for 10 s, then stalls (the sender's 2 s timeout) for 6 s, then is
  well. Nothing may be lost, no event may arrive under two webhook-ids, and each object's events
  must arrive in order; a webhook-id that arrives twice (an answer lost to a timeout) is counted.

The endpoint is made with the operator's `--local` (a loopback receiver), removed at the end.

    python -m bench.webhooks [--events 60000] [--batch 100] [--lag-s 20] [--down-s 30] [--no-faults]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import re
import time
import urllib.request
from dataclasses import dataclass

import aio_pika
import asyncpg
import numpy as np
import orjson

from bench.tenant import TENANT, ensure_tenant
from bench.webhook_receiver import Receiver
from deploy.settings import Settings, amqp_url, load_secrets, postgres_dsn
from exchanges import topology as t
from fence.webhooks import endpoints, signing, store

TARGET_RATE = 5_000.0
OBJECTS = 2_000
PER_MESSAGE = 250  # events per published array (a worker batch)


@dataclass
class Stack:
    pg: str
    amqp: str
    metrics: str


def stack() -> Stack:
    s = Settings.from_env()
    pw = load_secrets(s)
    return Stack(postgres_dsn(s, pw.postgres_password), amqp_url(s, pw.rabbitmq_password, t.FENCES_VHOST),
                 f"http://127.0.0.1:{s.metrics_ports()['fence-webhooks']}/metrics")


class Events:
    """Synthetic ENTER events of the bench tenant, ids unique per run, objects round robin."""

    def __init__(self) -> None:
        self.n = 0
        self.run = os.urandom(6).hex()

    def make(self, count: int, ts: float) -> list[dict[str, object]]:
        out = []
        for _ in range(count):
            i = self.n
            self.n += 1
            out.append({"schema": 1, "event": "enter", "tenant": TENANT, "fence_id": "wh-depot",
                        "object_id": f"wh-obj-{i % OBJECTS}", "ts": ts, "reason": "entered",
                        "event_id": f"{self.run}{i:020x}", "position": {"lon": 2.35, "lat": 48.85, "ts": ts}})
        return out


async def publish(exchange: aio_pika.abc.AbstractExchange, events: list[dict[str, object]]) -> None:
    """In order (one confirmed publish after the other), so each object's events are queued in
    the order of their ids and the receiver's order can be checked against them."""
    for at in range(0, len(events), PER_MESSAGE):
        body = orjson.dumps(events[at:at + PER_MESSAGE])
        await exchange.publish(aio_pika.Message(body, content_type="application/json",
                                                delivery_mode=aio_pika.DeliveryMode.PERSISTENT), "")


async def wait_loaded(metrics: str, endpoint_id: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    want = re.compile(rf'geofence_webhook_enabled{{endpoint="{endpoint_id}"[^}}]*}} 1')
    while time.monotonic() < deadline:
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(metrics, timeout=5).read().decode())
        if want.search(text):
            return
        await asyncio.sleep(0.2)
    raise SystemExit(f"the webhooks sidecar did not load {endpoint_id} within {timeout:.0f} s ({metrics})")


@contextlib.asynccontextmanager
async def endpoint(pg: str, receiver: Receiver, batch: int, timeout_s: float):  # type: ignore[no-untyped-def]
    conn = await asyncpg.connect(pg)
    try:
        await ensure_tenant(conn)
        ep = endpoints.from_request({"url": receiver.url, "batch": batch, "timeout_s": timeout_s,
                                     "description": "bench/webhooks.py"}, store.new_id(), TENANT,
                                    receiver.secret, local=True)
        await store.create(conn, ep)
        try:
            yield ep
        finally:
            await store.remove(conn, TENANT, ep.id)
    finally:
        await conn.close()


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) * 1000 if values else float("nan")


async def rate_run(ex: aio_pika.abc.AbstractExchange, rx: Receiver, ev: Events, n: int) -> float:
    before = len(rx.events())
    started = time.monotonic()
    await publish(ex, ev.make(n, time.time()))
    published = time.monotonic() - started
    ok = await rx.wait_for(before + n, 300)
    took = time.monotonic() - started
    got = len(rx.events()) - before
    print(f"rate: {n:,} events published in {published:.2f} s; {got:,} delivered in {took:.2f} s: "
          f"{got / took:,.0f} events/s{'' if ok else ' (NOT ALL ARRIVED)'}")
    return got / took


async def paced(ex: aio_pika.abc.AbstractExchange, ev: Events, rate: float, seconds: float) -> list[str]:
    """Events at `rate`/s for `seconds`, a publish every 50 ms; their ids."""
    ids: list[str] = []
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        k = int(rate * elapsed) - len(ids)
        if k > 0:
            batch = ev.make(k, time.time())
            await publish(ex, batch)
            ids += [str(e["event_id"]) for e in batch]
        await asyncio.sleep(0.05)
    return ids


async def lag_run(ex: aio_pika.abc.AbstractExchange, rx: Receiver, ev: Events, rate: float,
                  seconds: float) -> None:
    ids = await paced(ex, ev, rate, seconds)
    await rx.wait_for(len(rx.events() | set(ids)), 60)
    got = rx.got
    lags = [got.first_at[i] - got.event_ts[i] for i in ids if i in got.first_at]
    print(f"lag at {rate:,.0f} events/s for {seconds:.0f} s: {len(lags):,} of {len(ids):,} delivered, "
          f"p50 {pct(lags, 50):.1f} ms, p99 {pct(lags, 99):.1f} ms, max {max(lags) * 1000:.0f} ms")


async def fault_run(ex: aio_pika.abc.AbstractExchange, rx: Receiver, ev: Events, rate: float, down_s: float
                    ) -> bool:
    async def script() -> None:
        await asyncio.sleep(2)
        await rx.stop()
        print(f"  receiver down for {down_s:.0f} s")
        await asyncio.sleep(down_s)
        await rx.start()
        rx.set_mode("fail")
        print("  receiver up, answering 500 for 10 s")
        await asyncio.sleep(10)
        rx.set_mode("stall")
        print("  receiver stalling (no answer) for 6 s")
        await asyncio.sleep(6)
        rx.set_mode("ok")
        print("  receiver well")

    seconds = down_s + 24
    faults = asyncio.ensure_future(script())
    ids = await paced(ex, ev, rate, seconds)
    await faults
    ok = await rx.wait_for(len(rx.events() | set(ids)), 180)
    g = rx.got
    lost = [i for i in ids if i not in g.first_at]
    two_ids = [i for i in ids if len(g.under.get(i, ())) > 1]
    repeated = sum(c - 1 for c in g.copies.values() if c > 1)
    out_of_order = sum(1 for seq in g.order.values() for a, b in itertools.pairwise(seq) if a > b)
    print(f"faults: {len(ids):,} events published over {seconds:.0f} s; {len(ids) - len(lost):,} delivered, "
          f"{len(lost)} lost, {len(two_ids)} under two webhook-ids, {out_of_order} out of order per object; "
          f"{repeated} webhook-id(s) delivered again after a lost answer; {g.bad_signatures} bad signatures"
          f"{'' if ok else ' (wait timed out)'}")
    return ok and not lost and not two_ids and not out_of_order and not g.bad_signatures


async def main(args: argparse.Namespace) -> int:
    st = stack()
    rx = Receiver(signing.new_secret())
    await rx.start()
    conn = await aio_pika.connect(st.amqp)
    ch = await conn.channel(publisher_confirms=True)
    ex = await ch.get_exchange(t.EVENT_BATCHES_EXCHANGE, ensure=False)
    ev = Events()
    try:
        async with endpoint(st.pg, rx, args.batch, 2.0) as ep:
            await wait_loaded(st.metrics, ep.id)
            print(f"endpoint {ep.id}: batch {args.batch}, receiver {rx.url}")
            rate = await rate_run(ex, rx, ev, args.events)
            await lag_run(ex, rx, ev, rate / 2, args.lag_s)
            fine = True
            if args.faults:
                fine = await fault_run(ex, rx, ev, args.fault_rate, args.down_s)
            print(f"summary: {rate:,.0f} events/s delivered signed (target >= {TARGET_RATE:,.0f}: "
                  f"{'met' if rate >= TARGET_RATE else 'NOT met'}); fault run "
                  f"{'skipped' if not args.faults else 'clean' if fine else 'FAILED'}; "
                  f"{rx.got.requests:,} requests on {rx.got.connections} connections, "
                  f"{rx.got.bad_signatures} bad signatures")
            return 0 if rate >= TARGET_RATE and fine else 1
    finally:
        await conn.close()
        await rx.stop()


def cli() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=60_000)
    p.add_argument("--batch", type=int, default=100, help="the endpoint's events per request")
    p.add_argument("--lag-s", type=float, default=20.0)
    p.add_argument("--down-s", type=float, default=30.0)
    p.add_argument("--fault-rate", type=float, default=500.0)
    p.add_argument("--no-faults", dest="faults", action="store_false")
    return asyncio.run(main(p.parse_args()))


if __name__ == "__main__":
    raise SystemExit(cli())
