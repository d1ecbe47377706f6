"""A worker's journal stream (`x-fence.<worker>.journal`) as its master sees it: the state it
rebuilds from at the start, the frames it ships, and the check that it was the stream's only
writer between two of its sessions (issue 38, exchanges/replica_log.py).

Invariants (beside the local journal's, exchanges/state_dir.py):
- The stream is where the state is taken from when a worker starts in a process (its own
  after a restart, a backup's after a takeover): its newest complete snapshot and the records
  after it. The local journal is the fallback for a stream with no complete snapshot (a stack
  from before the streams, a broker that lost its data), and the state of a session that
  follows the process's own last one.
- The master ships in pipeline order: a step's records before its input is acked (with the
  local sync, concurrently), a snapshot as a new generation at each session's start and at
  each local rotation. A step whose input was acked is in the stream; one that is not may be
  too, and its redelivery gives the same events with the same ids (dropped by event_id).
- A session other than a process's first for this worker begins with a marker and reads the
  stream's tail up to it: a frame of another master before it means another process ran the
  worker meanwhile, and this one's state is stale (TookOver: the slot stands by again and
  rebuilds from the stream when it next takes the worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from typing import Any

from aio_pika.abc import AbstractExchange

from exchanges import replica_log
from exchanges import topology as t
from exchanges.replica_log import Frame, ReplicaLog, marker_frame, records_frame, snapshot_frames
from exchanges.shell import Counters, SidecarConfig, TookOver, open_connection
from exchanges.shell.replica_stream import StreamFollower, ship
from exchanges.state_dir import pack, unpack
from fence.x_fence.worker_state import WorkerState

log = logging.getLogger("geofence")


class Replica:
    def __init__(self, worker: str, follower: StreamFollower | None = None, process: str = "") -> None:
        self.worker = worker
        self.queue = t.fence_journal_queue(worker)
        self.follower = follower if follower is not None else StreamFollower(self.queue)
        # who writes: the process (x-fence-<its own worker>), its host and pid, this instance
        self.master = (f"{process or 'x-fence-' + worker}@{socket.gethostname()}/{os.getpid()}/"
                       f"{uuid.uuid4().hex[:6]}")
        self.generation = 0  # of the last snapshot shipped
        self.since = 0  # when (ms since the epoch) the newest snapshot it knows of began
        self.seq = 0  # of the next records frame in it
        self.sessions = 0
        self.shadow = Shadow(worker)

    async def check_in(self, config: SidecarConfig, exchange: AbstractExchange, counters: Counters,
                       first: bool, stop: asyncio.Event | None = None) -> None:
        """At a session's start, the instance lock held: everything written before read (the
        whole stream from where the standby stopped, `first`; else its tail), and for a
        later session, TookOver if another master wrote since this one. The stream is read on
        a connection of its own, closed after: the session's owns the lock and the work.
        `stop` set before the marker is read: TookOver (what was read is not all there is)."""
        self.sessions += 1
        token = f"{self.master}#{self.sessions}"
        known = self.follower.log.recovered()
        if known is not None:
            self.since = max(self.since, known.since)
        began = time.monotonic()
        async with contextlib.AsyncExitStack() as stack:
            conn = await open_connection(config, t.FENCES_VHOST, stack)
            started = await self.follower.attach(conn, stack, None if first else "last")
            read_from = self.follower.read
            await ship(exchange, self.queue, [marker_frame(self.master, token, self.since)], counters)
            shipped = time.monotonic()
            seen, before = await self.follower.until_marker(token, stop)
            await self.follower.detach()
            if not seen:
                raise TookOver(f"worker {self.worker}: stopped while its stream was read")
            log.info("worker %s: its stream read up to this session's marker in %.2fs (marker confirmed in "
                     "%.2fs, %d frames read)", self.worker, time.monotonic() - began, shipped - began,
                     self.follower.read - read_from)
            if first and self.follower.log.recovered() is None and started != "first":
                # began at a snapshot that was not there (a writer's clock far off the broker's):
                # the whole stream, then
                log.warning("worker %s: no complete snapshot after the stream's %s: reading it all",
                            self.worker, started)
                self.follower.log = ReplicaLog()
                await self.follower.attach(conn, stack, "first")
                seen, _ = await self.follower.until_marker(token, stop)
                await self.follower.detach()
                if not seen:
                    raise TookOver(f"worker {self.worker}: stopped while its stream was read")
        self.generation = max(self.generation, self.follower.log.max_generation)
        if not first and before != self.master:
            raise TookOver(f"worker {self.worker}: another process wrote its stream since this one's last "
                           f"session ({before or 'nothing before this session'}): its state is stale")

    def keep_up(self) -> None:
        """The shadow brought up to what the stream has read (in a thread, while standing by)."""
        got = self.follower.log.recovered()
        if got is not None:
            self.shadow.catch_up(got)

    def state(self) -> WorkerState | None:
        """The stream's state (the newest complete snapshot and the records after it, most of
        it already applied by the standby), or None when it has none to give; the bytes read
        stay until `started`. In a thread."""
        got = self.follower.log.recovered()
        read = self.follower.log
        if got is None:
            if read.max_generation:  # frames of a state were read, none usable
                log.error("worker %s: its stream has no usable state (%s): the local journal is used",
                          self.worker, read.broken or "no complete snapshot")
            else:  # said too: a state from the local journal may be older than the stream's last master's
                log.warning("worker %s: nothing of a state read from its stream (up to offset %d): the "
                            "local journal is used", self.worker, read.last_offset)
            return None
        ahead = self.shadow.catch_up(got)
        # the shadow's state goes to the session; the bytes read stay until the session has
        # shipped its own snapshot (`started`): a session that ends before takes them again
        state, self.shadow = self.shadow.state, Shadow(self.worker)
        log.info("worker %s: state from its stream: snapshot generation %d (%d bytes) + %d records, "
                 "%d of them applied as they came", self.worker, got.generation, len(got.snapshot),
                 len(got.records), len(got.records) - ahead)
        return state

    def started(self) -> None:
        """The session shipped its snapshot: what was read of the stream is let go."""
        read = self.follower.log
        self.follower.log = ReplicaLog(last_offset=read.last_offset, max_generation=read.max_generation,
                                       last_writer=read.last_writer)

    def snapshot(self, data: bytes) -> list[Frame]:
        self.generation += 1
        self.seq = 0
        self.since = int(time.time() * 1000)
        return snapshot_frames(self.generation, data, master=self.master, since=self.since)

    def frames(self, records: list[dict[str, Any]], snapshot: bytes | None) -> list[Frame]:
        """A journal entry's frames: its records, then (a local rotation) a new snapshot."""
        out = []
        if records:
            out.append(records_frame(self.generation, self.seq, pack({"records": records}), self.master,
                                     self.since))
            self.seq += 1
        if snapshot is not None:
            out += self.snapshot(snapshot)
        return out

    async def ship(self, exchange: AbstractExchange, frames: list[Frame], counters: Counters) -> None:
        await ship(exchange, self.queue, frames, counters)


class Shadow:
    """A standby's copy of the worker's state, kept current from the stream (hot): built from
    each newer complete snapshot, then each record applied as it is read, so a takeover
    applies only what came in its last moments. Touched by one thread at a time."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.state: WorkerState | None = None
        self.of: tuple[int, int] = (-1, -1)  # the snapshot it was built from: generation, first offset
        self.applied = 0  # records of that generation applied

    def catch_up(self, got: replica_log.Recovered) -> int:
        """Up to `got` (the stream's newest complete snapshot and its records); returns how
        many records it applied."""
        if (got.generation, got.first_offset) != self.of or self.state is None:
            self.state = WorkerState.of(unpack(got.snapshot), self.worker)
            self.of, self.applied = (got.generation, got.first_offset), 0
        todo = got.records[self.applied:]  # the reader appends meanwhile: a copy of what is there
        for body in todo:
            for record in unpack(body)["records"]:
                self.state.apply(record)
            self.applied += 1
        return len(todo)
