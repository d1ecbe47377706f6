"""x-ingress's part of the proximity subscriptions (exchanges/roam_routing.py `RoamStream`): the
subscription changes from PostgreSQL, the rows and definitions to each worker's queue, and the
journal that makes the router's memory survive a restart.

Why x-ingress: it sees every position in one order, so a pair's two objects are judged in the
order their positions came, wherever they are (x-geo regions each see their own); and the
router's memory (each object's last position) is one process's.

Order: the rows of a batch, a change of a subscription and a sync go out on one channel to
`x-fence.in` of gf-fences (key: the worker), so each worker's queue holds them in the order
they were made. They are made and sent under one lock, and handed to x-ingress's pipeline
there (exchanges/shell/pipeline.py): a batch's journal record (one, fdatasync'ed) is written
once its publishes are confirmed and the records before it are written, and only then is the
batch acked; the next batches are routed meanwhile. So a record is taken when its batch is
routed (`entry`), with the router's snapshot when a rotation is due: the router has moved on
by the time the record is written.

Durability (GEOFENCE_JOURNAL_DIR; exchanges/state_dir.py): a snapshot plus records of what was
routed (`rows`), defined (`put`) or deleted (`drop`, with the change's seq: the cursor into
roam_change), and each session's `epoch`. A crash before a record is written leaves its batch
unacked: redelivered, it is routed again from the state before it and gives the workers the
same rows with the same marks (exchanges/roam_routing.py: every message carries the router's
step and session epoch, and a worker applies each once), so the same events with the same ids,
which consumers drop. Every session starts with a `sync` of a new epoch to every worker, so a
worker that got a batch x-ingress then lost is set back to the state x-ingress has, before
the batch comes again. A ring change (`geofence worker add / remove`, x-ingress paused) is a
`sync` too: who holds what follows the new ring.

Without a journal directory (GEOFENCE_PERSISTENCE=off, benchmarks) the router starts empty.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aio_pika.abc import AbstractExchange

from exchanges import shell
from exchanges.batch import CONTENT_TYPE, PositionBatch, pack
from exchanges.hash_ring import HashRing
from exchanges.roam_routing import ROAM, RoamStream
from exchanges.state_dir import StateDir
from exchanges.state_dir import pack as state_pack
from exchanges.subscriptions import InvalidSubscription, Subscription

log = logging.getLogger("geofence")


@dataclass(frozen=True)
class Entry:
    """A journal record taken when its batch (or change) was routed, with the router's
    snapshot at that point when a rotation was due then."""

    record: dict[str, Any]
    snapshot: bytes | None = None


class Proximity:
    def __init__(self, ring: HashRing, journal_dir: str | None, counters: shell.Counters,
                 pipeline: shell.Pipeline) -> None:
        self.stream = RoamStream(ring)
        self.ring_version = 0
        self.cursor = 0  # the last roam_change seq applied
        self.counters = counters
        self.journal = StateDir(Path(journal_dir) / "proximity") if journal_dir else None
        self.lock = asyncio.Lock()
        self.out: AbstractExchange | None = None  # gf-fences x-fence.in, while a session runs
        self.pending: list[tuple[int, str, dict[str, Any] | None, float]] = []  # changes read, not applied
        self.new_ring: tuple[int, HashRing] | None = None
        self.started = False
        self.pipeline = pipeline  # x-ingress's: the records are written in routing order
        self.unwritten = 0  # entries routed and not journaled: a session ending so reloads
        self._rotating = False  # an entry carries a snapshot not written yet

    # -- durable state -----------------------------------------------------------------------

    def load(self) -> None:
        """The router as the journal left it (at start, and after a session that ended with a
        batch routed and not journaled)."""
        if self.journal is None:
            return
        self.journal.close()
        got = self.journal.load()
        self.stream = RoamStream(self.stream.ring)
        self.cursor = 0
        if got.snapshot is not None:
            self.stream.load(got.snapshot["router"])
            self.cursor = int(got.snapshot["cursor"])
        for record in got.records:
            for one in record.get("changes", [record]):
                if "skip" not in one:
                    self.stream.replay(one)
                self.cursor = max(self.cursor, int(one.get("seq", 0)))
        log.info("proximity: %d subscriptions, %d objects, change cursor %d (snapshot %d + %d records)",
                 len(self.stream.subs), len(self.stream.router), self.cursor,
                 got.generation, len(got.records))
        self.journal.start(self._snapshot())
        self.started = True
        self.unwritten = 0
        self._rotating = False

    def _snapshot(self) -> dict[str, Any]:
        return {"router": self.stream.snapshot(), "cursor": self.cursor}

    def entry(self, record: dict[str, Any]) -> Entry:
        """A record of what was just routed (see the module's docstring)."""
        self.unwritten += 1
        if self.journal is None or self._rotating or not self.journal.wants_rotation:
            return Entry(record)
        self._rotating = True
        return Entry(record, state_pack(self._snapshot()))

    async def write(self, entry: Entry) -> None:
        """In a pipeline tail: the record synced, then a new generation with its snapshot."""
        if self.journal is not None:
            await asyncio.to_thread(self._write, entry)
        self.unwritten -= 1

    def _write(self, entry: Entry) -> None:
        assert self.journal is not None
        self.journal.commit([entry.record], entry.snapshot)
        if entry.snapshot is not None:
            self._rotating = False

    def _rotate(self) -> None:
        """A new journal generation and the snapshot of the router now beside it."""
        assert self.journal is not None
        gen = self.journal.rotate_begin()
        self.journal.rotate_finish(state_pack(self._snapshot()), gen)

    def close(self, snapshot: bool = True) -> None:
        if self.journal is not None and self.started:
            if snapshot:
                self._rotate()
            self.journal.close()

    # -- the stream --------------------------------------------------------------------------

    def outs(self, msgs: dict[str, dict[str, Any]]) -> list[shell.Out]:
        assert self.out is not None
        return [shell.Out(self.out, worker, pack(ROAM, **msg), CONTENT_TYPE) for worker, msg in msgs.items()]

    async def start_session(self, out: AbstractExchange) -> None:
        """A session's first word to every worker: what each should hold (see the docstring),
        under the ring in force (a newer stored one is taken now: x-ingress was paused for it),
        marked with a new epoch, journaled before it is sent (exchanges/roam_routing.py)."""
        async with self.lock:
            self.out = out
            if self.new_ring is not None:
                self.ring_version, ring = self.new_ring
                self.new_ring = None
                self.stream.set_ring(ring)
                log.info("proximity: worker ring version %d (%s)", self.ring_version, ", ".join(ring.nodes))
            msgs = self.stream.new_session()
            if self.journal is not None:
                await asyncio.to_thread(self._write, Entry({"epoch": self.stream.epoch}))
            if msgs:
                await shell.publish_all(self.outs(msgs), self.counters)
                self.counters.bump("roam_syncs")

    async def apply_changes(self) -> None:
        """The subscription changes read from the store, in seq order: their messages published
        together (in order, confirmed), then one journal record for them all."""
        if not self.pending or self.out is None:
            return
        async with self.lock:
            msgs: list[dict[str, dict[str, Any]]] = []
            records: list[dict[str, Any]] = []
            for seq, sub_id, definition, at in self.pending:
                if seq <= self.cursor:
                    continue
                if definition is None:
                    msgs.append(self.stream.drop(sub_id, at))
                    records.append({"drop": sub_id, "ts": at, "seq": seq})
                else:
                    try:
                        sub = Subscription.from_wire(definition)
                    except InvalidSubscription as exc:  # the API checks: a row written by hand, skipped
                        log.error("proximity: change %d of %s refused: %s", seq, sub_id, exc)
                        records.append({"skip": sub_id, "seq": seq})
                        continue
                    msgs.append(self.stream.put(sub, at, seq))
                    records.append({"put": sub.to_wire(), "ts": at, "seq": seq})
            self.pending = []
            if not records:
                return
            self.cursor = int(records[-1]["seq"])
            entry = self.entry({"changes": records})
            sent = await shell.send([o for m in msgs for o in self.outs(m)], self.counters,
                                    retry=self.pipeline.serial)
            await self.pipeline.add(sent, lambda: self.write(entry))
            log.info("proximity: %d subscription changes applied (up to change %d; %d subscriptions)",
                     len(records), self.cursor, len(self.stream.subs))

    def rows_outs(self, batch: PositionBatch) -> tuple[list[shell.Out], Entry | None]:
        """A batch routed: its rows for the workers and its journal entry (the lock held by
        the caller); nothing while no subscription exists, and only the rows of tenants with
        one (the journal keeps those alone: replayed, they route the same)."""
        if not self.stream.active or self.out is None or not len(batch):
            return [], None
        batch = self.stream.relevant(batch)
        if not len(batch):
            return [], None
        msgs = self.stream.rows(batch)
        self.counters.bump("roam_rows", sum(len(m["batch"]["ids"]) for m in msgs.values()))
        return self.outs(msgs), self.entry({"rows": batch.to_wire()})


