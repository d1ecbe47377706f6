"""An x-fence process and the workers it may run (issue 38: lose a host, lose nothing).

The ring's members are logical workers; a process is started for one of them (its home
worker) and also backs up the GEOFENCE_FENCE_BACKUPS workers before it in name order
(exchanges/replica_log.backed_by): each of those is a slot. A slot stands by while another
process holds the worker's instance lock, following the worker's journal stream
(x-fence.<worker>.journal), and runs the worker (fence/x_fence/sidecar.py) once the lock is
free: at once for its home worker, after GEOFENCE_TAKEOVER_S of a free lock for another
(so that a worker whose process is up stays there; UNSEEN_TAKEOVER_S for a lock the slot
has not seen held since it last connected, so that at a stack's start, or after a broker
restart that every process reconnects from, every worker stays at home). Its state then comes from the stream:
everything its last master acknowledged, the rest redelivered from its queue. A standby
keeps that state hot (replica.Shadow: the newest snapshot built, each record applied as it
is read): a takeover applies only the records of its last moments.

A worker goes home: the home slot holds `lock.x-fence.<worker>.home` while it stands by, a
backup never takes a worker whose home slot stands by, and a backup running a worker hands it
back (a clean stop of its session: drained, snapshotted) once that lock appears, e.g. when a
lost host's replacement starts, or after `geofence up` restarted the processes in turn.

A slot whose worker is taken from it (the lock held by another process when a session
begins, or the stream written by another since its last session) goes back to standby: what
it held is stale, and the stream will give it the state again. A slot run to a clean stop
snapshots its state as a worker always did.

/metrics (the process's): the home worker's counters and gauges when it runs here, and the
slots' gauges: `slots_serving`, `slots_standing_by`, `standby_shadows_ready` (standbys whose
state is built: a takeover now costs only the last records), `standby_records_behind`.

Trade-off: the takeover is decided by the lock alone (an exclusive queue of the master's
connection), so it comes when the broker sees that connection go: at once for a process
killed on a live host (the kernel closes its socket), after the heartbeat timeout for a host
that vanished; `geofence worker lost NAME` closes a hung master's connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

from exchanges import shell
from exchanges import topology as t
from exchanges.replica_log import backed_by
from exchanges.shell.metrics import metrics_server, registry_of
from exchanges.shell.replica_stream import lock_held, stand_by
from fence.x_fence.replica import Replica, Shadow
from fence.x_fence.sidecar import FenceSidecar

log = logging.getLogger("geofence")
KEEP_UP_S = 0.5
# A backup takes over a worker whose lock it has not seen held since it connected (a stack
# starting, a broker restart, a process started while the worker's own was gone) after this
# long: the home process, which takes its lock at once, gets there first.
UNSEEN_TAKEOVER_S = 15.0
# a standby is ready (a takeover costs it little) with its shadow built from the stream's newest
# snapshot and at most this many of its records still to apply
READY_BEHIND = 200
HOME_POLL_S = 1.0  # how often a backup running a worker looks for the worker's own process


@dataclass
class Slot:
    worker: str
    home: bool
    counters: shell.Counters = field(default_factory=shell.Counters)
    replica: Replica | None = None  # while standing by
    sidecar: FenceSidecar | None = None  # while running the worker

    def gauges(self) -> dict[str, float]:
        """This slot's share of the process's slot gauges."""
        standby = self.replica is not None and self.sidecar is None
        behind, ready = 0, False
        if standby and self.replica is not None:
            got, shadow = self.replica.follower.log.recovered(), self.replica.shadow
            if got is not None and shadow.of == (got.generation, got.first_offset):
                behind = len(got.records) - shadow.applied
                ready = behind <= READY_BEHIND
        return {"slots_serving": float(self.sidecar is not None), "slots_standing_by": float(standby),
                "standby_shadows_ready": float(ready), "standby_records_behind": float(max(0, behind))}


def slot_config(config: shell.SidecarConfig, worker: str) -> shell.SidecarConfig:
    """A slot's config: no /metrics of its own (the process serves them); a backed-up worker
    has its own state directory inside the process's (`backup-<worker>`)."""
    journal = config.journal_dir
    if worker != config.instance and config.journal_dir:
        journal = str(Path(config.journal_dir) / f"backup-{worker}")
    return dataclasses.replace(config, instance=worker, journal_dir=journal, metrics_listen="")


async def keep_up(replica: Replica, done: asyncio.Event) -> None:
    """While standing by: the shadow state applied up to what the stream has read, in a
    thread (the standby's lock probes go on)."""
    while not done.is_set():
        try:
            await asyncio.to_thread(replica.keep_up)
        except Exception as exc:  # a stream this code cannot read: a takeover will say so again
            log.error("worker %s: the standby's state cannot be built from the stream (%s: %s)",
                      replica.worker, type(exc).__name__, exc)
            replica.shadow = Shadow(replica.worker)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), KEEP_UP_S)


async def _relay(source: asyncio.Event, target: asyncio.Event) -> None:
    await source.wait()
    target.set()


async def _home_back(config: shell.SidecarConfig, worker: str, until: asyncio.Event) -> None:
    """While a backup runs `worker`: sets `until` once the worker's own process stands by for
    it (its home lock held), so that the backup stops cleanly and the worker goes home."""
    backoff = shell.Backoff(cap=5.0)
    while not until.is_set():
        try:
            async with contextlib.AsyncExitStack() as stack:
                conn = await shell.open_connection(config, t.FENCES_VHOST, stack)
                while not until.is_set():
                    if await lock_held(conn, t.fence_home_lock(worker)):
                        log.warning("worker %s: its own process stands by for it: handing it back", worker)
                        until.set()
                        return
                    backoff.reset()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(until.wait(), HOME_POLL_S)
        except shell.BROKER_GONE:  # the session sees the broker go too; try again later
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(until.wait(), backoff.next())


async def run_slot(config: shell.SidecarConfig, slot: Slot, stop: asyncio.Event) -> None:
    cfg = slot_config(config, slot.worker)
    while not stop.is_set():
        replica = slot.replica = Replica(slot.worker, process=config.name)
        slot.counters.gauge("standby", 1)
        keeping = asyncio.Event()
        keeper = asyncio.create_task(keep_up(replica, keeping), name=f"shadow of {slot.worker}")
        try:
            free = await stand_by(cfg, t.FENCES_VHOST, replica.follower, t.fence_lock(slot.worker),
                                  0.0 if slot.home else config.takeover_s, stop,
                                  0.0 if slot.home else max(UNSEEN_TAKEOVER_S, config.takeover_s),
                                  t.fence_home_lock(slot.worker), present=slot.home)
        finally:
            keeping.set()
            await keeper  # its thread done: the shadow is the session's from here
            slot.counters.gauge("standby", 0)
        if not free:
            return
        if not slot.home:
            log.warning("worker %s: its instance lock has been free for %.1fs: taking it over here",
                        slot.worker, config.takeover_s)
        sidecar = slot.sidecar = FenceSidecar(cfg, replica, slot.counters)
        until = asyncio.Event()  # the process's stop, or (a backup) the worker's own process back
        async with asyncio.TaskGroup() as tg:
            ends = [tg.create_task(_relay(stop, until))]
            if not slot.home:
                ends.append(tg.create_task(_home_back(cfg, slot.worker, until)))
            try:
                await shell.serve(cfg, sidecar.session, until, slot.counters, sidecar.gauges)
            except shell.TookOver as exc:
                log.warning("worker %s: %s: standing by again", slot.worker, exc)
                sidecar.abandon()
                continue
            finally:
                slot.sidecar = None
                for task in ends:
                    task.cancel()
        await sidecar.close()
        if stop.is_set():
            log.info("worker %s stopped: %s", slot.worker, slot.counters.line())
            return
        log.info("worker %s handed back to its own process (it stands by): standing by here", slot.worker)


async def main(config: shell.SidecarConfig) -> int:
    if config.instance not in config.workers:
        log.error("worker (GEOFENCE_WORKERS) %r is not one of %s", config.instance, list(config.workers))
        return 2
    backed = (backed_by(config.instance, list(config.workers), config.fence_backups)
              if config.persistence else [])
    if not backed:  # no backups: one worker, as before (a takeover ends the process)
        return await shell.run_sidecar(config, config.workers, "worker (GEOFENCE_WORKERS)", FenceSidecar)
    stop = asyncio.Event()
    shell.install_signal_handlers(stop)
    log.info("%s; backing up %s", config.describe(), ", ".join(backed))
    slots = [Slot(config.instance, True), *(Slot(w, False) for w in backed)]
    home = slots[0]

    def gauges() -> dict[str, float]:
        out: dict[str, float] = {}
        for slot in slots:
            for k, v in slot.gauges().items():
                out[k] = out.get(k, 0.0) + v
        if home.sidecar is not None:
            out.update(home.sidecar.gauges())
        return out

    home.counters.bump("reconnects", 0)
    registry = registry_of(home.counters, config.role, gauges)
    async with metrics_server(config.metrics_listen, registry), asyncio.TaskGroup() as tg:
        for slot in slots:
            tg.create_task(run_slot(config, slot, stop), name=f"slot {slot.worker}")
    return 0
