"""The events archiver: every event of fence.event-batches (queue fence.archive; a message is
a JSON array of a worker batch's events, or one event object) into PostgreSQL's fence_event
table, for `GET /fences/{id}/events` and the nightly analytics.

Per batch (up to GEOFENCE_BATCH_MAX messages): decode and check each event (a message with a
bad one goes to dead-letters with the reason, its good events are stored), one INSERT of the
rows as arrays .. ON CONFLICT (event_id, ts) DO NOTHING (the table of a month the batch is the
first to reach made first: store.archive_events), commit, then one ack for the batch. A
redelivered event (a crash between commit and ack, or x-fence publishing it twice) meets its
event_id and is stored once. PostgreSQL being away holds the batch unacked and retries with
backoff; nothing is lost. An event PostgreSQL refuses (the batch's INSERT fails on one row) is
found by storing the batch message by message, and its message is dead-lettered with
PostgreSQL's reason; the others are stored.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Sequence

import asyncpg
import orjson
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from exchanges import routing_store, shell
from exchanges import topology as t
from exchanges.contract import InvalidMessage
from exchanges.fence_events import DWELLED, KINDS, REASONS, qualified_ids
from exchanges.fence_options.shares import ANON_PREFIX
from exchanges.tenancy import TENANT_RULE, is_tenant
from fence import store

log = logging.getLogger("geofence")
Row = store.EventRow
VISIT_ID_RE = re.compile(r"[0-9a-f]{1,64}")
MAX_TS = 253402300800.0  # 10000-01-01: a month's table is named by its year (fence_event_YYYY_MM)


def event_row(body: bytes) -> Row:
    """One event body (fence/state.Event.to_json) as a fence_event row; InvalidMessage says why not."""
    return _row(_json(body))


def event_rows(body: bytes) -> tuple[list[Row], list[str]]:
    """A message's rows (a JSON array of events, or one event) and what is wrong with the
    events that are not (by their place in the array); InvalidMessage if it is neither."""
    data = _json(body)
    if isinstance(data, dict):
        return [_row(data)], []
    if not isinstance(data, list):
        raise InvalidMessage("events message is neither a JSON array of events nor an event object")
    rows, bad = [], []
    for i, e in enumerate(data):
        try:
            rows.append(_row(e))
        except InvalidMessage as exc:
            bad.append(f"event {i} of {len(data)}: {exc.reason}")
    return rows, bad


def _json(body: bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage(f"event is not JSON: {exc}") from None


def _row(e: object) -> Row:
    if not isinstance(e, dict):
        raise InvalidMessage("event is not a JSON object")
    missing = [k for k in store.EVENT_COLUMNS if k not in e]
    if missing:
        raise InvalidMessage(f"event lacks {', '.join(missing)}")
    for k in ("event_id", "fence_id", "object_id"):
        if not isinstance(e[k], str) or not 0 < len(e[k]) <= 200 or "\x00" in e[k]:
            raise InvalidMessage(f"event {k} {e[k]!r}: a string of 1-200 characters, no NUL, expected")
    tenant = e.get("tenant", "")
    if not (tenant == "" or is_tenant(tenant)):
        raise InvalidMessage(f"event tenant {str(tenant)[:80]!r}: {TENANT_RULE}")
    shared = e.get("shared", False)
    if shared is not False and not (shared is True and str(e["object_id"]).startswith(ANON_PREFIX)):
        raise InvalidMessage(f"event shared {str(shared)[:20]!r}: a presence event is shared: true, "
                             f"its object {ANON_PREFIX}<stay>")
    fence_id, object_id = qualified_ids(e)  # stored as the pipeline names them (a presence event's
    # object: its pseudonym, of no tenant, which the events API leaves out)
    if e["event"] not in KINDS:
        raise InvalidMessage(f"event kind {e['event']!r}: enter, leave or cross expected")
    if e["reason"] not in REASONS:
        raise InvalidMessage(f"event reason {e['reason']!r}: one of {', '.join(REASONS)}")
    ts = e["ts"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise InvalidMessage(f"event ts {ts!r}: epoch seconds expected")
    if not 0 <= ts < MAX_TS:
        raise InvalidMessage(f"event ts {ts!r}: epoch seconds from 1970 to 9999 expected")
    visit, inside = e.get("visit_id"), e.get("inside_s")
    if visit is not None and not (isinstance(visit, str) and VISIT_ID_RE.fullmatch(visit)):
        raise InvalidMessage(f"event visit_id {str(visit)[:80]!r}: 1-64 lowercase hex digits expected")
    if inside is not None and (isinstance(inside, bool) or not isinstance(inside, int | float)
                               or not math.isfinite(inside) or inside < 0
                               or (e["event"] != "leave" and e["reason"] != DWELLED)):
        raise InvalidMessage(f"event inside_s {str(inside)[:80]!r}: a LEAVE's or a dwelled ENTER's seconds "
                             "inside (>= 0) expected")
    return (e["event_id"], fence_id, object_id, e["event"], e["reason"], float(ts), visit,
            None if inside is None else float(inside))


class Archiver:
    dlx: AbstractExchange  # the vhost's dead letters, once a session is open

    def __init__(self, config: shell.SidecarConfig) -> None:
        self.config = config
        self.counters = shell.Counters()
        self.db = routing_store.StoreConnection(config.postgres_url)

    async def recover(self, stop: asyncio.Event) -> bool:
        """Nothing to recover: the archive is in PostgreSQL (shell.Sidecar)."""
        return True

    async def session(self, stop: asyncio.Event) -> None:
        self.db.stop = stop
        await shell.consume_queue(stop, self.config, t.FENCES_VHOST, t.ARCHIVE_QUEUE, self.handle,
                                  self.counters, self.counters.line, self.dead_letters_to)

    def dead_letters_to(self, exchange: AbstractExchange) -> None:
        self.dlx = exchange

    async def handle(self, messages: Sequence[AbstractIncomingMessage]) -> None:
        per_message: list[tuple[AbstractIncomingMessage, list[Row]]] = []
        outs = []
        for m in messages:
            try:
                rows, bad = event_rows(m.body)
            except InvalidMessage as exc:
                outs.append(shell.dead_letter(self.dlx, m, exc.reason, t.ARCHIVE_QUEUE, self.counters))
                continue
            if bad:  # the message as it came, with why; its good events are stored below
                more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
                outs.append(shell.dead_letter(self.dlx, m, bad[0] + more, t.ARCHIVE_QUEUE, self.counters))
            if rows:
                per_message.append((m, rows))
        rows = [r for _, rs in per_message for r in rs]
        new = 0
        if rows:
            try:
                new = await self.store(rows)
            except asyncpg.PostgresError:  # a row PostgreSQL refuses: find its message, keep the others
                for m, rs in per_message:
                    try:
                        new += await self.store(rs)
                    except asyncpg.PostgresError as exc:
                        outs.append(shell.dead_letter(self.dlx, m, f"refused by PostgreSQL: {exc}",
                                                      t.ARCHIVE_QUEUE, self.counters))
            self.counters.events += new
            self.counters.bump("duplicates", len(rows) - new)
        await shell.publish_all(outs, self.counters)

    async def store(self, rows: list[Row]) -> int:
        """Rows stored, retried until PostgreSQL takes them; raises (batch left unacked, so
        redelivered) only when the sidecar is stopping. A connection left inside a transaction
        by a store cancelled with its session (archive_events refuses it) is replaced."""
        return await self.db.run(lambda conn: store.archive_events(conn, rows), f"archive {len(rows)} events")

    @property
    def _pg(self) -> asyncpg.Connection | None:
        return self.db.conn

    async def close(self) -> None:
        await self.db.close()


async def main(config: shell.SidecarConfig) -> int:
    stop = asyncio.Event()
    shell.install_signal_handlers(stop)
    log.info("%s", config.describe())
    archiver = Archiver(config)
    try:
        await shell.serve(config, archiver.session, stop, archiver.counters)
    finally:
        await archiver.close()
    log.info("stopped: %s", archiver.counters.line())
    return 0
