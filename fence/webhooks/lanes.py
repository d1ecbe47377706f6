"""The delivery loop of one lane of one endpoint (fanout.py says what a lane is): take the
lane's oldest rows from the outbox, POST them signed, and settle them by the answer: delivered,
tried again later (exponential backoff with jitter), given up (dead, with the reason) or the
endpoint disabled (retries.py decides). PostgreSQL holds every row's state, so a restart
resumes each lane where it was, with the same webhook-id for a request already tried.

A lane waits on its `wake` event when it has nothing due: the intake sets it when it queues a
row there, a reload of the endpoints when one is enabled or replayed. Waiting never polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
import numpy as np

from exchanges.backoff import Backoff
from exchanges.routing_store import STORE_AWAY
from exchanges.shell import Counters
from fence.venues import push
from fence.webhooks import notices, signing, store
from fence.webhooks.delivery import Attempt, Poster
from fence.webhooks.endpoints import Endpoint
from fence.webhooks.fanout import Head, request_body
from fence.webhooks.figures import WebhookFigures
from fence.webhooks.retries import EndpointHealth, Policy, after_failure

log = logging.getLogger("geofence")
T = TypeVar("T")
IDLE_S = 60.0  # a lane with nothing to do looks again after this even if not woken


def policy_of(ep: Endpoint) -> Policy:
    return Policy(give_up_s=ep.retry_for_s, timeout_s=ep.timeout_s)


class Lanes:
    """Every lane of every enabled endpoint; shares the endpoints' state with the intake."""

    def __init__(self, counters: Counters, figures: WebhookFigures, poster: Poster,
                 sender: push.Sender | None = None) -> None:
        self.counters, self.figures, self.poster = counters, figures, poster
        self.sender = sender if sender is not None else push.LocalSender()  # the admins' notices
        self.endpoints: dict[str, Endpoint] = {}
        self.health: dict[str, EndpointHealth] = {}
        self.wakes: dict[tuple[str, int], asyncio.Event] = {}
        self.stopping = asyncio.Event()
        self.pool: asyncpg.Pool | None = None

    def wake(self, endpoint_id: str, lane: int) -> None:
        event = self.wakes.get((endpoint_id, lane))
        if event is not None:
            event.set()

    async def db(self, work: Callable[[asyncpg.Connection], Awaitable[T]], what: str) -> T:
        """`work` on a pooled connection, retried while PostgreSQL is away (until stopping)."""
        backoff = Backoff()
        while True:
            assert self.pool is not None
            try:
                async with self.pool.acquire() as conn:
                    return await work(conn)
            except STORE_AWAY as exc:
                if self.stopping.is_set():
                    raise
                delay = backoff.next()
                log.warning("cannot %s (%s); retrying in %.1fs", what, exc, delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), delay)

    async def _pause(self, wake: asyncio.Event, seconds: float) -> None:
        waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(self.stopping.wait())]
        try:
            await asyncio.wait(waits, timeout=max(0.0, seconds), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def run(self, endpoint_id: str, lane: int) -> None:
        wake = self.wakes.setdefault((endpoint_id, lane), asyncio.Event())
        while not self.stopping.is_set():
            ep = self.endpoints.get(endpoint_id)
            if ep is None or not ep.enabled:
                return
            wake.clear()  # before the read: a row queued after it sets it again
            due = await self.db(functools.partial(store.head, endpoint_id=ep.id, lane=lane, limit=ep.batch),
                                "read the outbox")
            if not due:
                await self._pause(wake, IDLE_S)
                continue
            wait_s = due[0].next_attempt - time.time()
            if wait_s > 0:
                await self._pause(wake, wait_s)
                continue
            head = Head([(d.seq, d.event_id, d.msg_id) for d in due])
            seqs, msg_id, new = head.next_request(ep.id, ep.batch)
            chosen = set(seqs)
            rows = [d for d in due if d.seq in chosen]
            first = rows[0].first_attempt
            if first is None:
                first = time.time()
            if new and ep.batch > 1:  # a batch's id is pinned before it is sent (one event's is its own)
                await self.db(functools.partial(store.pin, endpoint_id=ep.id, seqs=seqs, msg_id=msg_id,
                                                now=first), "pin a request")
            try:
                keys = [signing.key_of(s) for s in ep.secrets]
            except ValueError as exc:  # a stored secret that is not one: the endpoint cannot sign
                await self.disable(ep, f"its signing secret is unusable ({exc})")
                return
            body = request_body([d.body for d in rows], ep.batch)
            attempt = await self.poster.post(ep, msg_id, body, keys)
            await self.settle(ep, rows, seqs, msg_id, attempt, first)

    async def settle(self, ep: Endpoint, rows: list[store.Due], seqs: list[int], msg_id: str,
                     attempt: Attempt, first: float) -> None:
        now = time.time()
        fig = self.figures.of(ep.id, ep.tenant)
        fig.request_s.observe(attempt.seconds)
        health = self.health.setdefault(ep.id, EndpointHealth())
        if not attempt.error:
            await self.db(lambda c: store.delivered(c, ep.id, seqs, now), "settle a delivery")
            fig.delivered += len(rows)
            fig.ok_requests += 1
            ages = now - np.fromiter((d.event_ts for d in rows), np.float64, len(rows))
            fig.lag_s.observe(ages[ages >= 0])
            self.counters.events += len(rows)
            if health.failing_since is not None:
                health.delivered()
                await self.db(lambda c: store.set_failing(c, ep.id, None), "clear a failure")
            return
        fig.failed_requests += 1
        self.counters.bump("webhook_failed_requests")
        was = health.failing_since
        health.failed(now, attempt.error)
        if was is None:
            await self.db(lambda c: store.set_failing(c, ep.id, now), "record a failure")
        verdict = after_failure(policy_of(ep), health, attempt.status, first, now)
        if verdict == "give_up":
            reason = (f"{attempt.error}; given up after {rows[0].attempts + 1} attempts over "
                      f"{now - first:.0f} s")
            await self.db(lambda c: store.give_up(c, ep.id, seqs, reason, now, msg_id), "give up a request")
            fig.dead += len(rows)
            self.counters.bump("webhook_dead", len(rows))
            log.warning("webhook %s (tenant %s): %d event(s) given up: %s", ep.id, ep.tenant, len(rows),
                        reason)
            return
        delay = policy_of(ep).delay(rows[0].attempts + 1, random.random())
        await self.db(lambda c: store.failed(c, ep.id, seqs, attempt.error, now + delay, msg_id, first),
                      "settle a failure")
        if verdict == "disable":
            failing_s = now - (health.failing_since or now)
            why = ("it answered 410 Gone" if attempt.status == 410
                   else f"every attempt failed for {failing_s:.0f} s ({attempt.error})")
            await self.disable(ep, why)

    async def disable(self, ep: Endpoint, why: str) -> None:
        """The endpoint stops (its events stay queued, delivered once it is enabled again); its
        tenant's admins are told (a notice stored with the disable, pushed to their devices:
        fence/webhooks/notices.py) and see why in `GET /webhooks/{id}`, `geofence webhook show` and the
        metrics."""
        notice = await self.db(lambda c: store.disable(c, ep.id, why), "disable an endpoint")
        if notice is not None:
            try:
                await self.db(lambda c: notices.push_to_admins(c, self.sender, notice), "push a notice")
            except Exception as exc:  # stored all the same: the list shows it, unpushed
                log.error("webhook %s: notice %d not pushed (%s: %s)", ep.id, notice, type(exc).__name__, exc)
        self.endpoints[ep.id] = dataclasses.replace(ep, enabled=False, disabled_reason=why)
        fig = self.figures.of(ep.id, ep.tenant)
        fig.disabled += 1
        fig.enabled = False
        self.counters.bump("webhook_disabled")
        log.warning("webhook %s (tenant %s) disabled: %s", ep.id, ep.tenant, why)
