"""The x-fence sidecar of one worker: x-fence.<worker> (positions routed by every x-geo
region, and fence definitions they forward, in one ordered queue) in, ENTER / LEAVE events
out twice: one message per event on fence.events (key
`fence-events.<fence_id>.<enter|leave>.<object_id>`, for the fence's, the kind's and the
object's subscribers, AMQP ones and, federated to the ingress vhost's amq.topic, MQTT ones),
and one message per batch on fence.event-batches (a JSON array of its events, up to
EVENTS_PER_BATCH_MESSAGE) for consumers of every event: the archiver, analytics, load tests.
A broker routes an event nobody subscribed to nowhere, at the cost of one unroutable
publish; a consumer of everything pays one delivery per batch, not one per event.

The live map (fence/map_feed.py) gets a third, small copy: twice a second, the newest
MAP_EVENTS events and how many there were, to fence.map-events, transient and unconfirmed on a
channel of its own (a map shows a sample; it never holds the worker up).

Durability: the core's state (who is inside which fence since when, each object's last
position and handover time, positions held for a notice) lives in a snapshot plus a journal
under GEOFENCE_JOURNAL_DIR (exchanges/state_dir.py; records from XFence.changes, formats in
fence/x_fence/codec.py). Per batch: route, send the events, take the journal record of what
changed (and the state's snapshot when a rotation is due), hand them to the pipeline
(exchanges/shell/pipeline.py), take the next batch. The pipeline, in batch order, waits for
the events' confirms, appends the record and fdatasyncs it, then acks the batch. A crash
before the sync leaves the batch unacked: it is redelivered and routed again from the older
state, giving the same events with the same ids (duplicates a consumer drops by event_id; none
lost). A crash after it finds the record: the redelivered positions are at their objects'
last known ts and change nothing. Timeouts and handovers go through the same pipeline.

Recovery: the snapshot and journal give the state back; then the fences this worker owns on
the hash ring are read from PostgreSQL, and a fence the state has at an older version (or
deleted since) is defined (dropped) at its stored change time: the same events, with the
same ids, as the definition still in the queue would give. Those events are published at
the start of the first session, before the state is snapshotted and anything consumed.

Timeouts: every second, pairs whose object has been silent for the fence's timeout_s LEAVE
with reason `timeout` and ts = last seen + timeout_s, so the event and its id do not depend
on when the check ran. Silence is judged on the wall clock once the worker has caught up
with its queue, and on the newest position time consumed until then: after a restart, or
under a backlog, an object is not timed out while its positions wait in the queue.

Handover (`geofence worker add / remove`, deploy/worker_ops.py): a drain barrier in the input
queue is answered once everything before it is applied; on the control queue, EXPORT copies
the state of the fences a new ring gives to others, IMPORT takes this worker's share of
another's export, FORGET lets go of what was given away; IMPORT and FORGET are journaled
before they are answered. Which fences are this worker's at `recover` is the stored ring's.

Beside this module: the input queue read into steps (sidecar_inputs.py) and the control
queue's answers, `inspect` and the handover steps (sidecar_control.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage

from exchanges import control, routing_store, shell
from exchanges import topology as t
from exchanges.fence_events import ENTERED, EXITED, Event, is_shared, presence_json
from exchanges.hash_ring import HashRing
from exchanges.state_dir import StateDir
from exchanges.state_dir import pack as journal_pack
from exchanges.worker_batch import WorkerBatch
from fence import store
from fence.x_fence import roaming, sidecar_control
from fence.x_fence.core import XFence
from fence.x_fence.replica import Replica
from fence.x_fence.sidecar_inputs import RoamStep, read_inputs
from fence.x_fence.worker_state import WorkerState

log = logging.getLogger("geofence")
MAP_EVENTS = 200  # per sample: what a map's frame shows at most (fence/map_view.FRAME_EVENTS)
MAP_EVERY_S = 0.5
EXPIRE_EVERY_S = 1.0
EVENTS_PER_BATCH_MESSAGE = 2_000  # a batch message stays well under a megabyte


@dataclass(frozen=True)
class Entry:
    """The journal records of one step, taken when it was applied, and the state's snapshot
    at that point when a rotation was due (written after the records, as a new generation)."""

    records: list[dict[str, Any]]
    snapshot: bytes | None = None


class FenceSidecar:
    def __init__(self, config: shell.SidecarConfig, replica: Replica | None = None,
                 counters: shell.Counters | None = None) -> None:
        self.config = config
        self.worker = config.instance
        # the worker's journal stream (fence/x_fence/replica.py), run by a slot (slots.py)
        self.replica = replica if config.persistence else None
        self.instance_lock = shell.InstanceLock(t.fence_lock(self.worker), stand_by=self.replica is None)
        self.ring = HashRing(list(config.workers))  # the stored ring replaces it at `recover`
        self.ring_version = 0
        self.core = XFence(self.worker)
        self.roam: roaming.RoamMatcher | None = None  # proximity subscriptions (fence/x_fence/roaming.py)
        self.roam_log: list[dict[str, Any]] = []  # its messages applied since the last journal record
        self.counters = counters if counters is not None else shell.Counters()  # a slot's outlive it
        self.lock = asyncio.Lock()  # the core and the order of what it emits
        self.map_tail: deque[bytes] = deque(maxlen=MAP_EVENTS)  # the newest events' bodies
        self.map_seen = 0  # events since the last map sample
        self.map_out: AbstractExchange | None = None
        self.journal: StateDir | None = None
        if config.persistence:
            if not config.journal_dir:
                raise shell.ConfigError("x-fence needs GEOFENCE_JOURNAL_DIR (its snapshot and journal)")
            self.journal = StateDir(Path(config.journal_dir))
        self.n_persisted = 0  # object ids the journal holds
        self.started = False  # the journal's new generation is written (after `pending`)
        self.pending: list[Event] = []  # events of the recovery, published by the first session
        self.stream_ts = -math.inf  # the newest position time routed
        self.inputs: shell.Intake | None = None
        # Steps applied whose records are not written yet (the core holds effects the journal
        # does not): if a session ends with some, the next one starts from the journal.
        self.unpersisted = 0
        self._rotating = False  # an entry carries a snapshot not written yet
        self.recovered = False  # the state is rebuilt (the first session's `_prepare`)
        self.recovering = False  # the state is being rebuilt: `inspect` and /metrics say so
        # the session's `_prepare` is done (state rebuilt, journal generation begun): until then
        # the timer and a handover leave the state alone (the journal may not be open)
        self.ready = False
        self.replayed = (0, 0)  # journal records replayed, of
        self.pipeline = shell.Pipeline()  # the steps in flight (see the docstring)

    def _load(self, from_stream: bool = False) -> str:
        """The core from the snapshot and the journal (a new core if there are none); with
        `from_stream`, from the worker's stream if it has a state. Runs in a thread (the event
        loop answers heartbeats, /metrics and `inspect` meanwhile, which see `replayed` and
        touch nothing else of the state). Says where the state came from."""
        assert self.journal is not None
        self.roam_log = []
        self._rotating = False
        state = self.replica.state() if from_stream and self.replica is not None else None
        if state is not None:
            self.journal.take_over()
            self.core, self.roam = state.core, state.roam
            return f"stream {t.fence_journal_queue(self.worker)}"
        got = self.journal.load()
        self.replayed = (0, len(got.records))
        state = WorkerState.of(got.snapshot, self.worker)
        for i, record in enumerate(got.records):
            state.apply(record)
            self.replayed = (i + 1, len(got.records))
        self.core, self.roam = state.core, state.roam
        if got.snapshot is None and not got.records:
            return f"nothing in {self.journal.path}: a new worker"
        return (f"{self.journal.path}: snapshot {got.generation} + {len(got.records)} journal records"
                + (f" (a torn record of {got.torn_bytes} bytes cut off)" if got.torn_bytes else ""))

    async def recover(self, stop: asyncio.Event) -> bool:
        """Nothing before the first session: the state is rebuilt in it (`_prepare`), while the
        control queue is consumed, so `inspect` answers during a long journal replay and the
        broker connection keeps its heartbeats."""
        return not stop.is_set()

    async def _prepare(self, stop: asyncio.Event) -> None:
        """A session's first step, before its input is consumed: the state recovered (the
        first session) or reloaded from the journal (after a session that ended with effects
        not journaled), then the recovery's events published and a journal generation begun."""
        self.ready = False
        self.recovering = True
        self.counters.gauge("recovering", 1)
        try:
            if not self.recovered:
                async with self.lock:
                    if not await self._recover(stop):
                        return
                self.recovered = True
            elif self.unpersisted and self.journal is not None:
                await self._reload()
        finally:
            self.recovering = False
            self.counters.gauge("recovering", 0)
        await self._start_journal()
        self.ready = True

    async def _load_logged(self) -> None:
        where = await asyncio.to_thread(self._load, True)
        log.info("state recovered from %s: %s", where, self.core.stats())

    async def _recover(self, stop: asyncio.Event) -> bool:
        # the stored fences' versions read while the state loads (a takeover waits for both),
        # then the definitions of those the state lacks or holds older (few, after a takeover)
        stored = asyncio.ensure_future(asyncio.gather(
            routing_store.read_until_stopped(self.config.postgres_url,
                                             lambda conn: routing_store.ring_or(conn, self.config.workers),
                                             "worker ring", stop),
            routing_store.read_until_stopped(self.config.postgres_url, store.live_fence_versions,
                                             "fences", stop)))
        try:
            if self.journal is not None:
                await self._load_logged()
            ring, versions = await stored
        finally:
            stored.cancel()
        if versions is None or ring is None:
            return False
        self.ring_version, self.ring = ring
        mine = {f: v for f, v in versions if self.worker in self.ring.masters(f)}
        stale = [f for f, v in mine.items() if v > self.core.version_of(f)]
        records = (await self._read(lambda conn: store.fences_by_ids(conn, stale), "fences", stop)
                   if stale else [])
        if records is None:
            return False
        events: list[Event] = []
        for r in records:  # version-guarded: what the state has already is a no-op
            events += self.core.define(r.fence, r.updated_at.timestamp())
        gone = sorted(set(self.core.fences()) - set(mine))
        if gone:
            tombstones = await self._read(lambda conn: store.deleted_fences(conn, gone), "deleted fences",
                                          stop) or []
            for fence_id, version, deleted_at in tombstones:
                events += self.core.drop(fence_id, version, deleted_at)
            # a fence the store has neither live nor deleted was renamed away (migration 0024
            # qualified every id by its tenant): dropped, its stays ended now
            unknown = set(gone) - {f for f, _, _ in tombstones} - {f for f, _ in versions}
            for fence_id in sorted(unknown):
                events += self.core.drop(fence_id, self.core.version_of(fence_id) + 1, time.time())
        self.pending = events
        log.info("%d of %d fences are on worker %s (%d read again); %d events from fences changed while it "
                 "was down", len(mine), len(versions), self.worker, len(records), len(events))
        return True

    async def _read(self, read: Any, what: str, stop: asyncio.Event) -> Any:
        return await routing_store.read_until_stopped(self.config.postgres_url, read, what, stop)

    def abandon(self) -> None:
        """After TookOver (another process runs the worker): no snapshot, the files let go."""
        if self.journal is not None:
            self.journal.close()

    async def close(self) -> None:
        """At a clean stop: a snapshot, so the next start replays no journal; not of a core
        holding unacked effects (a batch cut off at the drain deadline): the journal stays."""
        if self.journal is None or not self.started:
            return
        if self.unpersisted:
            log.warning("a batch was cut off unacked: no snapshot, the journal holds the state")
        else:
            async with self.lock:
                gen, data = self._begin_snapshot()
            await asyncio.to_thread(self.journal.rotate_finish, data, gen)
            log.info("state snapshot %d written", gen)
        self.journal.close()

    async def _reload(self) -> None:
        """After a session that ended with effects the journal does not hold: the core as
        the journal has it (what was acked, and maybe a batch after it), so the redelivered
        batch is routed again from the state it first met. The events it gives again carry
        the same ids."""
        assert self.journal is not None
        async with self.lock:
            self.journal.close()
            where = await asyncio.to_thread(self._load)
            self.started = False
            self.unpersisted = 0
            log.warning("a session ended with a batch not journaled: state reloaded from %s", where)

    async def _start_journal(self) -> None:
        """First session: publish the recovery's events, then begin a new generation."""
        async with self.lock:
            if self.pending:
                await shell.publish_all(self.event_outs(self.pending), self.counters)
                self.pending = []
            if self.journal is not None and not self.started:
                snapshot = self._state()
                await asyncio.to_thread(self.journal.start, snapshot)
                self.n_persisted = len(self.core._objects)
                self.started = True
            if self.replica is not None:  # the stream gets the whole state at each session's start
                data = await asyncio.to_thread(journal_pack, self._state())
                await self.replica.ship(self.out_ch.default_exchange, self.replica.snapshot(data),
                                        self.counters)
                self.replica.started()

    def _entry(self, counted: bool = False) -> Entry:
        """Under the lock, right after a step was applied: its journal records (the proximity
        messages applied, the core's changes), and the snapshot when a rotation is due."""
        if not counted:
            self.unpersisted += 1
        if self.journal is None:
            return Entry([])
        records: list[dict[str, Any]] = []
        if self.roam_log:
            records.append({"roam": self.roam_log})
            self.roam_log = []
        record = self.core.changes(self.n_persisted)
        if record is not None:
            records.append(record)
            self.n_persisted = len(self.core._objects)
        if self._rotating or not self.journal.wants_rotation:
            return Entry(records)
        self._rotating = True
        snapshot = journal_pack(self._state())
        self.n_persisted = len(self.core._objects)
        return Entry(records, snapshot)

    async def _write(self, entry: Entry) -> None:
        """In the step's tail: the records appended and synced (off the event loop), then
        the snapshot as a new generation."""
        if self.journal is None:
            self.unpersisted -= 1  # nothing to reload from (persistence off: the benchmark's)
            return
        started = time.perf_counter()
        frames = self.replica.frames(entry.records, entry.snapshot) if self.replica is not None else []
        if frames:  # the local sync and the stream's confirms side by side
            assert self.replica is not None
            shipped = self.replica.ship(self.out_ch.default_exchange, frames, self.counters)
            written, _ = await asyncio.gather(asyncio.to_thread(self._write_sync, entry), shipped)
        else:
            written = await asyncio.to_thread(self._write_sync, entry)
        if entry.records:
            self.counters.bump("journal_records", len(entry.records))
            self.counters.bump("journal_bytes", written)
            self.counters.bump("journal_us", int((time.perf_counter() - started) * 1e6))
            self.counters.observe("journal_sync_seconds", time.perf_counter() - started)
        if entry.snapshot is not None:
            self.counters.bump("snapshots")
        self.unpersisted -= 1

    def _write_sync(self, entry: Entry) -> int:
        assert self.journal is not None
        written = self.journal.commit(entry.records, entry.snapshot)
        if entry.snapshot is not None:
            self._rotating = False
        return written

    async def _emit(self, outs: list[shell.Out | shell.Plains], events: Sequence[Event] = (),
                    roam_events: Sequence[roaming.RoamEvent] = (), barriers: Sequence[dict[str, Any]] = (),
                    messages: Sequence[AbstractIncomingMessage] = (), counted: bool = False) -> None:
        """Under the lock, after a step was applied: its publishes sent and its record taken
        now; its confirms awaited, its record written, its barriers answered and `messages`
        acked in the pipeline, after the steps before it. `counted`: the caller counted the
        step in `unpersisted` before applying it."""
        entry = self._entry(counted)
        sent = await shell.send(outs, self.counters, retry=self.pipeline.serial)

        async def confirmed() -> None:
            self.observe_latency(events)
            if roam_events:  # the position's time to its proximity event confirmed
                self.observe_ages("roam_event_latency_seconds", [e.ts for e in roam_events])
            await self._write(entry)
            if barriers:  # once the steps before are applied and journaled
                held = self.core.stats()["held_now"]
                answers = [orjson.dumps({"worker": self.worker, "region": b["region"],
                                         "barrier": b["barrier"], "held_now": held}) for b in barriers]
                await shell.publish_all([shell.Out(self.out_ch.default_exchange, b["reply"], body,
                                                   "application/json", mandatory=False)
                                         for b, body in zip(barriers, answers, strict=True)], self.counters)

        await self.pipeline.add(sent, confirmed, messages)

    def _state(self) -> dict[str, Any]:
        """The snapshot: the core's state and the proximity matcher's."""
        data = self.core.snapshot()
        if self.roam is not None:
            data["roam"] = roaming.snapshot_of(self.roam)
        self.roam_log = []
        return data

    def _begin_snapshot(self) -> tuple[int, bytes]:
        """Under the lock: a new journal generation and the snapshot of the state at that
        instant (written by the caller with journal.rotate_finish, off the event loop)."""
        assert self.journal is not None
        gen = self.journal.rotate_begin()
        data = journal_pack(self._state())
        self.n_persisted = len(self.core._objects)
        return gen, data

    # -- session -----------------------------------------------------------------------------

    async def session(self, stop: asyncio.Event) -> None:
        cfg = self.config
        began = time.monotonic()
        async with contextlib.AsyncExitStack() as stack:
            conn = await shell.open_connection(cfg, t.FENCES_VHOST, stack)
            await self.instance_lock.acquire(conn, stack)  # before the journal is touched
            self.out_ch: AbstractChannel = await shell.open_channel(conn, stack, confirms=cfg.persistence)
            if self.replica is not None:  # everything an earlier master wrote read (TookOver: stale)
                await self.replica.check_in(cfg, self.out_ch.default_exchange, self.counters,
                                            first=not self.recovered, stop=stop)
            self.events: AbstractExchange = await self.out_ch.get_exchange(t.EVENTS_EXCHANGE, ensure=False)
            self.event_batches = await self.out_ch.get_exchange(t.EVENT_BATCHES_EXCHANGE, ensure=False)
            self.tenant_batches = await self.out_ch.get_exchange(t.TENANT_BATCHES_EXCHANGE, ensure=False)
            self.dlx = await self.out_ch.get_exchange(t.DEAD_LETTER_EXCHANGE, ensure=False)
            map_ch = await shell.open_channel(conn, stack, confirms=False)  # samples: see above
            self.map_out = await map_ch.get_exchange(t.MAP_EVENTS_EXCHANGE, ensure=False)
            in_ch = await shell.open_channel(conn, stack)
            ctl_ch = await shell.open_channel(conn, stack)
            inputs = shell.Intake.on(await in_ch.get_queue(t.fence_queue(self.worker)), cfg.batch_max,
                                     cfg.prefetch)
            controls = shell.Intake.on(await ctl_ch.get_queue(t.fence_control_queue(self.worker)), 64, 64)
            self.inputs = inputs
            log.info("worker %s: consuming %s, and %s once the state is rebuilt (%.2fs after connecting)",
                     self.worker, t.fence_control_queue(self.worker), t.fence_queue(self.worker),
                     time.monotonic() - began)
            try:
                await shell.run_session(
                    stop, [conn], [controls, inputs],
                    [shell.run_batches(inputs, self.handle_inputs, self.counters, self.dlx, self.pipeline),
                     shell.run_batches(controls, self.handle_controls, self.counters, self.dlx)],
                    [shell.periodic(stop, EXPIRE_EVERY_S, self.expire),
                     shell.periodic(stop, MAP_EVERY_S, self.send_map_sample),
                     shell.periodic(stop, 30, lambda: log.info("%s", self.counters.line()))], cfg.drain_s,
                    prepare=self._prepare(stop), counters=self.counters)
            finally:
                self.ready = False  # the next session's _prepare says when the state may be used
                await self.pipeline.close()  # steps not journaled: their input comes back

    async def send_map_sample(self) -> None:
        if not self.map_seen or self.map_out is None:
            return
        body = b'{"seen":%d,"events":[%s]}' % (self.map_seen, b",".join(self.map_tail))
        self.map_tail.clear()
        self.map_seen = 0
        # not mandatory: with no map open the exchange has no queue and the sample just goes
        await shell.publish_sample(self.map_out, body, "application/json", mandatory=False)
        self.counters.bump("map_samples")

    # -- inputs ------------------------------------------------------------------------------

    async def handle_inputs(self, messages: Sequence[AbstractIncomingMessage]) -> None:
        """Runs of position parts are routed together; definitions apply between them
        (the steps, the barriers and the dead letters: sidecar_inputs.py)."""
        read = read_inputs(messages, self.worker, self.dlx, self.counters)
        outs, steps, barriers = read.outs, read.steps, read.barriers
        async with self.lock:
            events: list[Event] = []
            roam_events: list[roaming.RoamEvent] = []
            received_at = time.time()
            # The core holds effects the journal does not from here on: the loop is given back
            # between steps (and between slices of a run of proximity rows) so that heartbeats,
            # /metrics and `inspect` never wait for a whole batch; a session that ends at one
            # of those points reloads the state from the journal (see _reload).
            self.unpersisted += 1
            for n_step, step in enumerate(steps):
                if n_step:
                    await asyncio.sleep(0)
                if isinstance(step, RoamStep):
                    try:
                        if step.rows:
                            if self.roam is None:
                                raise ValueError("roaming rows before any sync")
                            got = []
                            for n_slice, part in enumerate(self.roam.apply_sliced(step.rows)):
                                if n_slice:
                                    await asyncio.sleep(0)
                                got += part
                        else:
                            self.roam, got = roaming.step(self.roam, step.msgs[0], self.worker)
                    except (KeyError, TypeError, ValueError) as exc:
                        outs += [shell.dead_letter(self.dlx, m, shell.reason_of(exc, "proximity message"),
                                                   t.fence_queue(self.worker), self.counters)
                                 for m in step.messages]
                        continue
                    self.roam_log += step.msgs
                    roam_events += got
                    self.counters.bump(f"roam_{step.msgs[0]['op']}", len(step.msgs))
                elif isinstance(step, list):
                    wb = WorkerBatch.concat(step)
                    self.counters.positions += len(wb.positions)
                    self.counters.observe_ages("position_age_seconds", wb.positions.ts[wb.sent_rows()])
                    if len(wb.positions):
                        self.stream_ts = max(self.stream_ts, float(wb.positions.ts.max()))
                    events += self.core.route(wb, received_at)
                elif isinstance(step, control.Define):
                    events += self.core.define(step.fence, step.ts, step.regions, step.region)
                    log.info("fence %s v%d defined", step.fence.fence_id, step.fence.version)
                else:
                    events += self.core.drop(step.fence_id, step.version, step.ts)
                    log.info("fence %s v%d deleted", step.fence_id, step.version)
            await self._emit(outs + self.event_outs(events) + self.roam_outs(roam_events), events,
                             roam_events, barriers, messages, counted=True)

    def observe_latency(self, events: Sequence[Event]) -> None:
        """Device to event: from the position's own time to now, its event confirmed (ENTER /
        LEAVE decided by positions; timeouts and fence changes are not a position's)."""
        if events:
            self.observe_ages("event_latency_seconds", [e.position_ts for e in events
                                                        if e.reason in (ENTERED, EXITED)])

    def observe_ages(self, histogram: str, times: Sequence[float]) -> None:
        self.counters.observe_ages(histogram, times)

    def gauges(self) -> dict[str, float]:
        """Levels for /metrics, read at each scrape (while the state is rebuilt, in a thread:
        how far the replay is, nothing of the state)."""
        if self.recovering:
            return {"journal_replayed": self.replayed[0], "journal_to_replay": self.replayed[1]}
        s = self.core.stats()
        return {"objects_tracked": s["objects"], "fences_bound": s["fences"],
                "inside_pairs": s["inside_pairs"], "held_positions": s["held_now"]}

    def clock(self) -> float:
        """Now, for timeouts: the wall clock once the input queue's backlog is consumed,
        until then the newest position time routed (see the module's docstring)."""
        now = time.time()
        if self.inputs is not None and self.inputs.caught_up:
            return now
        return min(now, self.stream_ts)

    async def expire(self) -> None:
        if not self.ready:  # the session's state is not rebuilt yet (_prepare)
            return
        async with self.lock:
            events = self.core.expire(self.clock())
            await self._emit(self.event_outs(events), events)

    def event_outs(self, events: Sequence[Event]) -> list[shell.Out | shell.Plains]:
        """One message per event on fence.events, and the same events in batch messages on
        fence.event-batches (the bodies joined into JSON arrays, not encoded twice)."""
        self.counters.events += len(events)
        if not events:
            return []
        self.counters.events_by.update((e.event, e.reason) for e in events)
        shared = [is_shared(e) for e in events]
        bodies = [orjson.dumps(presence_json(e) if s else e.to_json())
                  for e, s in zip(events, shared, strict=True)]
        own = [b for b, s in zip(bodies, shared, strict=True) if not s] if any(shared) else bodies
        self.map_tail.extend(own[-MAP_EVENTS:])  # a presence event is a count: not on the map
        self.map_seen += len(own)
        # a presence event goes out under a key no tenant may bind (the sensor sidecar's), and
        # to the archive (marked shared), never to a tenant's batches
        keys = [t.presence_routing_key(e.fence_id, e.event) if s else t.event_routing_key(e.fence_id, e.event,
                                                                                             e.object_id)
                for e, s in zip(events, shared, strict=True)]
        outs: list[shell.Out | shell.Plains] = [shell.Plains(self.events, keys, bodies, "application/json")]
        for at in range(0, len(bodies), EVENTS_PER_BATCH_MESSAGE):
            outs.append(shell.Out(self.event_batches, self.worker,
                                  b"[" + b",".join(bodies[at:at + EVENTS_PER_BATCH_MESSAGE]) + b"]",
                                  "application/json", mandatory=False))
        by_tenant: dict[str, list[bytes]] = {}  # the same batches, each tenant's apart
        for e, body, s in zip(events, bodies, shared, strict=True):
            if not s:
                by_tenant.setdefault(t.tenant_batch_key(e.fence_id), []).append(body)
        for tenant, part in by_tenant.items():
            for at in range(0, len(part), EVENTS_PER_BATCH_MESSAGE):
                outs.append(shell.Out(self.tenant_batches, tenant,
                                      b"[" + b",".join(part[at:at + EVENTS_PER_BATCH_MESSAGE]) + b"]",
                                      "application/json", mandatory=False))
        return outs

    def roam_outs(self, events: Sequence[roaming.RoamEvent]) -> list[shell.Out | shell.Plains]:
        """One message per proximity event on fence.events (roam-events.<sub>.<kind>.<object>)."""
        if not events:
            return []
        self.counters.bump("roam_events", len(events))
        keys = [t.roam_event_routing_key(e.subscription, e.kind, e.object) for e in events]
        bodies = [orjson.dumps(e.to_json()) for e in events]
        return [shell.Plains(self.events, keys, bodies, "application/json")]

    # -- control (inspect) ---------------------------------------------------------------------

    async def handle_controls(self, messages: Sequence[AbstractIncomingMessage]) -> None:
        await sidecar_control.handle_controls(self, messages)

    async def hand_over(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A handover step (EXPORT / IMPORT / FORGET): sidecar_control.hand_over."""
        return await sidecar_control.hand_over(self, msg)

    def inspect(self, msg: dict[str, Any]) -> dict[str, Any]:
        return sidecar_control.inspect(self, msg)


async def main(config: shell.SidecarConfig) -> int:
    return await shell.run_sidecar(config, config.workers, "worker (GEOFENCE_WORKERS)", FenceSidecar)
