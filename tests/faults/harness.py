"""The fault suite's harness (issue 5, "Nothing lost, nothing duplicated").

What it drives, all against the real local stack (`geofence up`):

- process control: `kill -9` of a named sidecar (its pid from <state dir>/sidecars.json), its
  restart with the very command and environment `geofence up` uses (recorded back into
  sidecars.json, so `geofence status/down/up` see it), RabbitMQ stopped and started again
  (state.json updated with the new node's pid), and a sidecar run through a TCP proxy;
- `TcpProxy`: an asyncio proxy in a thread of its own, listening on a free port and forwarding
  to the broker's AMQP port; `cut()` aborts every live connection both ways, `pause()` /
  `resume()` hold the bytes;
- `EventCollector`: the test's own consumer of fence.events (a durable queue, "#"), which
  dedupes on event_id, counts raw deliveries, acks after recording and reconnects for ever
  (it is the system's client: it must not lose events either, broker restarts included);
- `DeadLetterWatch`: a durable queue on every vhost's `dead-letters` exchange, to see every
  message dead-lettered during a run (with its reason header);
- `Publisher`: the position stream as gateway batches over AMQP with publisher confirms,
  paced, at-least-once (reconnects with backoff and republishes, in order, every batch not
  confirmed: a position published twice is the same observation);
- `FaultRun`: one run of the scripted stream (bench/workload.py) with its shapely ground
  truth, faults injected by the test, recovery times measured, and the verdict: the deduped
  events against the reference (fence.reference.compare), duplicates, dead letters, sidecars
  alive, the archive table in PostgreSQL.

Recovery time of a fault = from the moment it was injected until the pipeline flows again:
the sidecar's input queues (every input queue for a broker restart) have a consumer again and
an event caused by a position published after the fault, and that the restarted part had to
handle (its region for x-geo, its fences for x-fence), has come out at the end (for the
archiver: a fence_event row archived after the kill). A sidecar that has not consumed again
CONSUMER_DEADLINE_S after the fault's end (it hangs, or it exited) is started again by the
harness, as systemd's Restart=on-failure would, so that the rest of the run still tells
whether anything was lost; the run fails on it, with the sidecar's last log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import msgpack
import numpy as np
import numpy.typing as npt
import orjson
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

import hilbert_c as hk
from bench import broker_modes as bm
from bench import workload as wl
from deploy import sidecars
from deploy.inspect_cmd import ask
from deploy.processes import (
    ProcessId,
    ServiceRecord,
    identify,
    load_state,
    process_identity,
    save_state,
    wait_gone,
)
from deploy.processes import terminate as terminate_process
from deploy.services import rabbitmq_await, rabbitmq_launch, rabbitmq_pid, rabbitmq_stop
from deploy.settings import ENV_PREFIX, ConnectionSettings, Settings, load_connection_settings, load_secrets
from deploy.stack import up as stack_up
from exchanges import routing_store
from exchanges import topology as t
from exchanges.hash_ring import HashRing
from exchanges.x_geo.range_index import INDEX_BITS
from fence.reference import EventTuple, compare
from tests.faults import report

POLL_S = 0.1
CONSUMER_DEADLINE_S = 30.0  # after a fault, a sidecar consumes again within this (backoff cap 10 s)
FLOW_DEADLINE_S = 30.0  # ... and its first new event comes out within this
SETTLE_DEADLINE_S = 150.0  # after the last position is confirmed, for the last events
QUIET_S = 8.0  # no delivery for this long and no backlog: nothing more is coming
QUIET_LONG_S = 30.0  # no delivery for this long: nothing more is coming, whatever the backlog
GRACE_S = 2.0  # listening on after the last expected event (a late duplicate is seen)
HOLD_AT = 0.9  # of the stream: new positions wait there until every planned fault is in
FLOW_MARGIN = 2_500  # updates the stream goes on for after each fault (1 s at RATE)
ARCHIVE_STUCK_S = 15.0  # the archive table did not grow for this long: it will not
ARCHIVE_DEADLINE_S = 150.0  # the longest wait for the archiver to catch up
ATTRIBUTION_SLACK = 1_000  # updates: published before a fault, still in flight when it struck
PUBLISH_TIMEOUT_S = 30.0  # a confirm not back by then counts as failed (republished)
PROXY_DIGEST = "fault-suite-proxy"  # the sidecars.json digest of a proxied sidecar: any
#                                     `geofence up` replaces it with the stack's own instance

# The workload: 500 fences (32-gons of 150-500 m) in a 6 km box across the border between the
# default worldmap's two regions, 500 objects walking 20 m steps: ~18k events for 50k updates.
BOX = wl.Box(9.59, 47.18, 6_000.0)
RADIUS_M = (150.0, 500.0)
FENCES = 500
OBJECTS = 500
UPDATES = 50_000
BATCH = 200  # positions per gateway message
RATE = 2_500.0  # updates/s
WORKLOAD_SEED = 5
BAD_INPUTS = 5  # gateway batches of invalid positions mixed into every stream


def say(line: str) -> None:
    print(f"[faults {time.strftime('%H:%M:%S')}] {line}", flush=True)


async def poll_until(check: Callable[[], Awaitable[bool]], deadline: float) -> bool:
    """True once check() holds, False at the deadline (seconds)."""
    end = time.monotonic() + deadline
    while True:
        if await check():
            return True
        if time.monotonic() > end:
            return False
        await asyncio.sleep(POLL_S)


# --------------------------------------------------------------------------- the stack


def sidecar_queues(topology: t.Topology, name: str) -> list[tuple[str, str]]:
    """(vhost, queue) of the input queues a sidecar consumes."""
    if name == "x-ingress":
        return [(t.INGRESS_VHOST, t.POSITIONS_QUEUE), (t.INGRESS_VHOST, t.BATCHES_QUEUE)]
    if name.startswith("x-geo-"):
        v = t.region_vhost(name.removeprefix("x-geo-"))
        return [(v, t.GEO_POSITIONS_QUEUE), (v, t.GEO_CONTROL_QUEUE)]
    if name.startswith("x-fence-"):
        w = name.removeprefix("x-fence-")
        return [(t.FENCES_VHOST, t.fence_queue(w)), (t.FENCES_VHOST, t.fence_control_queue(w))]
    if name == "fence-archiver":
        return [(t.FENCES_VHOST, t.ARCHIVE_QUEUE)]
    if name == "api":
        return [(t.FENCES_VHOST, t.API_QUEUE), (t.INGRESS_VHOST, t.FOLLOW_QUEUE)]
    raise ValueError(f"unknown sidecar {name!r}")


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo, _, _ = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.hostname}:{port}"))


class Stack:
    """The local stack's settings, secrets and process records, and what the suite does to them."""

    def __init__(self) -> None:
        self.settings = Settings.from_env()
        self.pw = load_secrets(self.settings)
        self.conn = load_connection_settings(self.settings)
        self.topology = self.settings.topology
        self.names = [sc.name for sc in sidecars.sidecars(self.topology)]
        self.ring = HashRing(list(self.settings.workers))
        self._children: dict[int, subprocess.Popen[bytes]] = {}  # what we launched, to reap
        self._digests: dict[str, str] = {}  # per sidecar, the digest of `geofence up`'s record
        self.proxy_port: dict[str, int] = {}  # sidecars that run through a TcpProxy, its port

    # -- sidecars -----------------------------------------------------------------------------

    def sidecar(self, name: str) -> sidecars.Sidecar:
        for sc in sidecars.sidecars(self.topology):
            if sc.name == name:
                return sc
        raise ValueError(f"{name!r} is not a sidecar of the topology ({', '.join(self.names)})")

    def process(self, name: str) -> ProcessId | None:
        rec = sidecars.load_records(self.settings).get(name)
        if not rec:
            return None
        proc = ProcessId(int(rec["pid"]), int(rec["start_ticks"]))
        return proc if process_identity(proc.pid) == proc else None

    def dead(self) -> list[str]:
        return [n for n, ok in sidecars.running(self.settings).items() if not ok]

    def log_path(self, name: str) -> Path:
        return self.settings.log_dir / f"{name}.log"

    def log_tail(self, name: str, lines: int = 6, grep: str = "") -> list[str]:
        try:
            text = self.log_path(name).read_text(errors="replace").splitlines()
        except OSError:
            return []
        if grep:
            text = [x for x in text if re.search(grep, x)]
        return text[-lines:]

    def log_evidence(self, name: str, lines: int = 3) -> list[str]:
        """The last log lines of a sidecar that say something (not the periodic counters,
        not traceback lines)."""
        said = [x for x in self.log_tail(name, 400, r"^\d{4}-\d\d-\d\d ") if " received " not in x]
        return [x[:220] for x in said[-lines:]]

    def _note(self, name: str, what: str) -> None:
        with self.log_path(name).open("a") as out:
            out.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} ---- fault suite: {what} ----\n")

    def kill9(self, name: str) -> None:
        """SIGKILL the sidecar and wait until it is gone (no drain, no goodbye to the broker)."""
        proc = self.process(name)
        if proc is None:
            raise AssertionError(f"{name} is not running before its kill -9 (see {self.log_path(name)})")
        os.kill(proc.pid, signal.SIGKILL)
        self._note(name, f"kill -9 {proc.pid}")
        self._reap(proc.pid)
        wait_gone(proc, 10, name)

    def terminate(self, name: str) -> None:
        """SIGTERM (the sidecar drains), SIGKILL at the stack's stop deadline."""
        proc = self.process(name)
        if proc is not None:
            self._note(name, f"stopped (SIGTERM {proc.pid})")
            terminate_process(proc, sidecars.STOP_TIMEOUT_S, name)
            self._reap(proc.pid)

    def launch(self, name: str) -> int:
        """Start the sidecar as `geofence up` does (same command and environment; through its
        TcpProxy if it has one: `proxy_port`); recorded in sidecars.json."""
        sc = self.sidecar(name)
        amqp_port = self.proxy_port.get(name)
        env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        env.update(sidecars.environment(self.settings, self.pw, sc))
        if amqp_port is not None:
            env["GEOFENCE_AMQP_URL"] = _with_port(env["GEOFENCE_AMQP_URL"], amqp_port)
        env["PYTHONPATH"] = str(sidecars.ROOT)
        self._note(name, "started" + (f" through the TCP proxy on port {amqp_port}" if amqp_port else ""))
        with self.log_path(name).open("a") as out:
            proc = subprocess.Popen(sc.argv(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=env, cwd=str(sidecars.ROOT), start_new_session=True)
        self._children[proc.pid] = proc
        ident = identify(proc.pid)
        records = sidecars.load_records(self.settings)
        # the digest `geofence up` recorded for this sidecar (the same code, from the same tree),
        # so `up` leaves it alone; a proxied one gets a digest no `up` wants, so `up` replaces it
        digest = self._digests.setdefault(name, str(records.get(name, {}).get("digest", "")))
        records[name] = {"pid": ident.pid, "start_ticks": ident.start_ticks,
                         "digest": PROXY_DIGEST if amqp_port is not None else digest}
        sidecars.save_records(self.settings, records)
        return ident.pid

    def _reap(self, pid: int) -> None:
        child = self._children.pop(pid, None)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=10)

    # -- RabbitMQ -----------------------------------------------------------------------------

    def stop_broker(self) -> None:
        proc = identify(rabbitmq_pid())
        rabbitmq_stop(self.settings, proc)

    def start_broker(self) -> None:
        rabbitmq_launch(self.settings)
        proc = rabbitmq_await(self.settings)
        state = load_state(self.settings.state_file)
        state["rabbitmq"] = ServiceRecord(True, proc)  # ours now: `geofence down` stops it
        save_state(self.settings.state_file, state)

    # -- health -------------------------------------------------------------------------------

    async def revive(self, grace: float = 20.0, names: Sequence[str] | None = None) -> dict[str, str]:
        """Every sidecar (of `names`, default all) that has not consumed its input queues
        for `grace` seconds is started again: one that exited is launched (as systemd's
        Restart=on-failure would), one that runs but never came back from a fault is
        stopped first. Returns {name: "exited" | "stuck"}."""
        probe = QueueProbe(self)
        names = self.names if names is None else names
        try:
            async def all_consumed() -> bool:
                return not await self._not_consuming(probe, names)

            if await poll_until(all_consumed, grace):
                return {}
            found = {n: "stuck" if self.process(n) is not None else "exited"
                     for n in await self._not_consuming(probe, names)}
            for name, how in found.items():
                what = "runs but does not consume" if how == "stuck" else "exited"
                say(f"{name} {what}: starting it again; its log: {' | '.join(self.log_evidence(name))}")
                if how == "stuck":
                    await asyncio.to_thread(self.terminate, name)
                await asyncio.to_thread(self.launch, name)
            return found
        finally:
            await probe.close()

    async def _not_consuming(self, probe: QueueProbe, names: Sequence[str]) -> list[str]:
        return [n for n in names if self.process(n) is None
                or await probe.consumed(sidecar_queues(self.topology, n))]

    def restore(self) -> dict[str, str]:
        """Every sidecar consuming again (the stuck or exited ones started again), then
        `geofence up`; from synchronous code (a fresh event loop in a thread of its own)."""
        revived: dict[str, str] = {}
        worker = threading.Thread(target=lambda: revived.update(asyncio.run(self.revive())))
        worker.start()
        worker.join()
        self.up()
        return revived

    def up(self) -> None:
        """`geofence up`: every service, the topology and every sidecar (a proxied one is
        replaced by the stack's own), until every input queue has its consumer."""
        stack_up(self.settings, lambda line: say(f"geofence up: {line}"))


_AMQP_NAME = re.compile(r"[A-Za-z0-9_.:-]*")  # what pamqp lets through as a queue name


class QueueProbe:
    """Passive declares as the administrator, one connection per vhost (reopened when the
    broker went away): consumers and ready messages of a queue, as the broker sees them now
    (the management API's figures lag by up to 5 s)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.urls = stack.conn["amqp"]
        self._conns: dict[str, AbstractConnection] = {}

    async def _declare(self, vhost: str, queue: str) -> tuple[int, int] | None:
        try:
            c = self._conns.get(vhost)
            if c is None or c.is_closed:
                c = self._conns[vhost] = await aio_pika.connect(self.urls[vhost], timeout=5)
            ch = await c.channel()
            try:
                q = await ch.declare_queue(queue, passive=True)
                r = q.declaration_result
                return int(r.consumer_count or 0), int(r.message_count or 0)
            finally:
                with contextlib.suppress(Exception):
                    await ch.close()
        except Exception:  # the broker is away, or the queue is not there: no figures
            old = self._conns.pop(vhost, None)
            if old is not None:
                with contextlib.suppress(Exception):
                    await old.close()
            return None

    async def consumed(self, queues: Sequence[tuple[str, str]]) -> list[str]:
        """The queues without a consumer (all of them while the broker is away)."""
        missing = []
        for v, q in queues:
            got = await self._declare(v, q)
            if got is None or got[0] == 0:
                missing.append(f"{v}/{q}")
        return missing

    async def ready(self, queues: Sequence[tuple[str, str]]) -> int | None:
        """Ready messages in all of them; None if a figure is missing. A name AMQP clients
        refuse (a federation link's queue: "federation: x -> y") is read from the
        management API."""
        total = 0
        for v, q in queues:
            if _AMQP_NAME.fullmatch(q):
                got = await self._declare(v, q)
                n = None if got is None else got[1]
            else:
                n = await asyncio.to_thread(self._management_ready, v, q)
            if n is None:
                return None
            total += n
        return total

    def _management_ready(self, vhost: str, queue: str) -> int | None:
        from deploy.rabbitmq.apply import management
        from deploy.rabbitmq.plan import api_path

        try:
            got = management(self.stack.settings, self.stack.pw).get(api_path("queues", vhost, queue))
            return int(got.get("messages_ready") or 0)
        except Exception:
            return None

    async def close(self) -> None:
        for c in self._conns.values():
            with contextlib.suppress(Exception):
                await c.close()
        self._conns.clear()


# --------------------------------------------------------------------------- the TCP proxy


class TcpProxy:
    """127.0.0.1:<free port> -> (host, port), in a thread with its own event loop, so nothing
    the test's loop does (nor a blocking call there) slows the proxied traffic."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = 0
        self.accepted = 0
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._live: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._flowing = asyncio.Event()
        self._server: asyncio.Server | None = None

    def start(self) -> int:
        self._thread.start()
        self.port = self._call(self._start())
        return self.port

    def _call(self, coro: Any, timeout: float = 10) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self) -> int:
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            broker_r, broker_w = await asyncio.open_connection(*self.target)
        except OSError:  # the broker is away: the client sees its connection refused-ish
            client_w.transport.abort()
            return
        self.accepted += 1
        pair = (client_w, broker_w)
        self._live.add(pair)
        try:
            await asyncio.gather(self._pipe(client_r, broker_w), self._pipe(broker_r, client_w))
        finally:
            self._live.discard(pair)
            for w in pair:
                w.transport.abort()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await r.read(1 << 16):
                await self._flowing.wait()
                w.write(data)
                await w.drain()
        w.transport.abort()  # one side gone: the other goes too, as a cut link would

    def cut(self) -> int:
        """Abort every live connection both ways (RST); returns how many were cut."""
        self.cuts += 1
        return int(self._call(self._cut()))

    async def _cut(self) -> int:
        live = list(self._live)
        for pair in live:
            for w in pair:
                w.transport.abort()
        return len(live)

    def pause(self) -> None:
        """Hold the bytes (connections stay open, heartbeats stop flowing)."""
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def resume(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.set)

    def connections(self) -> int:
        return len(self._live)

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._cut()


# --------------------------------------------------------------------------- consumers


def _setter(event: asyncio.Event) -> Callable[..., None]:
    """A close callback that sets `event` (whatever it is called with)."""
    def on_close(*_: Any) -> None:
        event.set()
    return on_close


class ReconnectingConsumer:
    """A durable queue of its own, bound as asked, consumed for ever: reconnects with
    backoff when the broker or the connection goes away; the queue (durable, persistent
    messages) keeps what arrives meanwhile. Each message is handled, then acked; a message
    whose ack was lost with the connection comes back and is handled again (raw counts
    include it)."""

    def __init__(self, url: str, queue: str, bindings: Sequence[tuple[str, str]],
                 prefetch: int = 2000) -> None:
        self.url, self.queue, self.bindings, self.prefetch = url, queue, list(bindings), prefetch
        self.reconnects = 0
        self.errors: list[str] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def handle(self, message: AbstractIncomingMessage) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        """The queue is declared and bound before this returns (nothing published after it is missed)."""
        async with await aio_pika.connect(self.url, timeout=10) as c:
            ch = await c.channel()
            q = await ch.declare_queue(self.queue, durable=True)
            for exchange, key in self.bindings:
                await q.bind(exchange, key)
        self._task = asyncio.create_task(self._run(), name=f"consumer {self.queue}")

    async def _run(self) -> None:
        delay = 0.1
        while not self._stop.is_set():
            c: AbstractConnection | None = None
            try:
                c = await aio_pika.connect(self.url, timeout=5)
                # aio-pika 10's `closed()` / `is_closed` miss a close by the broker (e.g.
                # CONNECTION_FORCED at its shutdown); the close callbacks do not
                lost = asyncio.Event()
                c.close_callbacks.add(_setter(lost))
                ch = await c.channel()
                ch.close_callbacks.add(_setter(lost))
                await ch.set_qos(prefetch_count=self.prefetch)
                q = await ch.declare_queue(self.queue, durable=True)
                await q.consume(self._on_message)
                delay = 0.1
                closed = asyncio.ensure_future(lost.wait())
                stopped = asyncio.ensure_future(self._stop.wait())
                await asyncio.wait([closed, stopped], return_when=asyncio.FIRST_COMPLETED)
                for f in (closed, stopped):
                    f.cancel()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                if c is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(c.close(), 5)
            if self._stop.is_set():
                return
            self.reconnects += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)  # backoff, cut short by stop
            delay = min(delay * 2, 1.0)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        self.handle(message)
        with contextlib.suppress(Exception):  # lost with the connection: redelivered, handled again
            await message.ack()

    async def stop(self, delete: bool = True) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 15)
        if delete:
            with contextlib.suppress(Exception):
                async with await aio_pika.connect(self.url, timeout=10) as c:
                    ch = await c.channel()
                    await ch.queue_delete(self.queue)


@dataclass(frozen=True)
class Delivery:
    at: float  # time.monotonic() of receipt
    event: EventTuple
    event_id: str


class EventCollector(ReconnectingConsumer):
    """fence.events (all of it), kept only for the run's fences and objects (prefix)."""

    def __init__(self, conn: ConnectionSettings, queue: str, prefix: str) -> None:
        super().__init__(conn["amqp"][t.FENCES_VHOST], queue, [(t.EVENTS_EXCHANGE, "#")])
        self.prefix = prefix
        self.deliveries: list[Delivery] = []  # raw, in order of receipt
        self.distinct: dict[str, EventTuple] = {}
        self.conflicts: list[str] = []  # one event_id, two different events
        self.malformed = 0
        self.last_at = time.monotonic()

    def handle(self, message: AbstractIncomingMessage) -> None:
        try:
            e = orjson.loads(message.body)
            fence_id, object_id = str(e["fence_id"]), str(e["object_id"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            self.malformed += 1
            return
        if not (fence_id.startswith(self.prefix) and object_id.startswith(self.prefix)):
            return
        ev: EventTuple = (str(e["event"]), fence_id, object_id, float(e["ts"]), str(e["reason"]))
        eid = str(e["event_id"])
        now = time.monotonic()
        self.last_at = now
        self.deliveries.append(Delivery(now, ev, eid))
        seen = self.distinct.setdefault(eid, ev)
        if seen != ev:
            self.conflicts.append(f"event_id {eid}: {seen} and {ev}")

    @property
    def raw(self) -> int:
        return len(self.deliveries)

    @property
    def duplicates(self) -> int:
        return self.raw - len(self.distinct)


@dataclass(frozen=True)
class DeadLetter:
    vhost: str
    reason: str | None
    source: str | None
    ours: bool  # the body names the run's objects
    bad_input: int | None  # which of the run's planted bad inputs it is, if one


class DeadLetterWatch(ReconnectingConsumer):
    """A copy of everything dead-lettered in one vhost during the run."""

    def __init__(self, conn: ConnectionSettings, vhost: str, queue: str, prefix: str,
                 into: list[DeadLetter]) -> None:
        super().__init__(conn["amqp"][vhost], queue, [(t.DEAD_LETTER_EXCHANGE, "")])
        self.vhost, self.into = vhost, into
        self.ours_marker = prefix.encode()
        self.bad = re.compile(re.escape(prefix.encode()) + rb"bad(\d+)")

    def handle(self, message: AbstractIncomingMessage) -> None:
        h = message.headers or {}
        reason = h.get(t.REASON_HEADER)
        source = h.get("x-geofence-source")
        m = self.bad.search(message.body)
        self.into.append(DeadLetter(self.vhost, None if reason is None else str(reason),
                                    None if source is None else str(source),
                                    self.ours_marker in message.body, int(m.group(1)) if m else None))


# --------------------------------------------------------------------------- the publisher


@dataclass(frozen=True)
class Body:
    lo: int  # first update of the stream it carries
    hi: int
    data: bytes
    bad: int | None = None  # a planted bad input (no valid position): its number

    @property
    def updates(self) -> int:
        return 0 if self.bad is not None else self.hi - self.lo


class Publisher:
    """Gateway batches (msgpack) to ingress.batches with confirms, `window` in flight, paced
    at `rate` updates/s. At-least-once: a failed publish or a lost connection ends the
    connection; the next one (backoff 0.1-1 s) republishes, in stream order, every body not
    confirmed, then goes on. `set_limit` holds the stream at an update until it is raised."""

    def __init__(self, url: str, bodies: Sequence[Body], rate: float, window: int = 8) -> None:
        self.url, self.bodies, self.rate, self.window = url, list(bodies), rate, window
        self.confirmed = np.zeros(len(self.bodies), bool)
        self.frontier = 0  # bodies published at least once
        self.sent_updates = 0  # updates of those
        self.republished = 0
        self.reconnects = 0
        self.errors: list[str] = []
        self.limit: int | None = None  # no new body from this update on (None: no limit)
        self._moved = asyncio.Event()
        self.done = asyncio.Event()
        self._due = 0.0

    def set_limit(self, update: int | None) -> None:
        """Publish no new body whose first update is `update` or later (None: go on)."""
        self.limit = update
        self._moved.set()

    @property
    def confirmed_updates(self) -> int:
        return sum(b.updates for b, ok in zip(self.bodies, self.confirmed.tolist(), strict=True) if ok)

    async def run(self) -> None:
        delay = 0.1
        self._due = time.monotonic()
        while not self.confirmed.all():
            try:
                conn = await aio_pika.connect(self.url, timeout=5)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.errors.append(f"connect: {type(exc).__name__}: {exc}")
                self.reconnects += 1
                await asyncio.sleep(delay)  # backoff while the broker is away
                delay = min(delay * 2, 1.0)
                continue
            delay = 0.1
            try:
                ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
                ex = await ch.get_exchange(t.BATCHES_EXCHANGE, ensure=False)
                await self._session(ch, ex)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.errors.append(f"session: {type(exc).__name__}: {exc}")
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.close(), 5)
            if not self.confirmed.all():
                self.reconnects += 1
        self.done.set()

    def _order(self) -> Iterator[int]:
        """Bodies to publish on this connection: first the unconfirmed ones already sent
        (republished, in order), then new ones."""
        retry = [int(i) for i in np.flatnonzero(~self.confirmed[:self.frontier])]
        self.republished += len(retry)
        yield from retry
        while self.frontier < len(self.bodies):
            yield self.frontier

    async def _session(self, ch: AbstractChannel, ex: aio_pika.abc.AbstractExchange) -> None:
        sem = asyncio.Semaphore(self.window)
        failed = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        async def one(k: int) -> None:
            b = self.bodies[k]
            try:
                await asyncio.wait_for(ex.publish(aio_pika.Message(
                    b.data, content_type="application/msgpack",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT), ""), PUBLISH_TIMEOUT_S)
                self.confirmed[k] = True
            except Exception as exc:
                self.errors.append(f"publish: {type(exc).__name__}: {exc}")
                failed.set()
            finally:
                sem.release()

        try:
            for k in self._order():
                if k == self.frontier:  # a new body: the limit, then the pace
                    while self.limit is not None and self.bodies[k].lo >= self.limit:
                        self._moved.clear()
                        await self._moved.wait()
                    now = time.monotonic()
                    self._due = max(self._due, now - 0.5)
                    if self._due > now:
                        await asyncio.sleep(self._due - now)  # pacing the load
                await sem.acquire()
                if failed.is_set():
                    sem.release()
                    break
                if k == self.frontier:
                    self.frontier += 1
                    self.sent_updates += self.bodies[k].updates
                    self._due += self.bodies[k].updates / self.rate
                tasks.add(asyncio.create_task(one(k)))
        finally:
            await asyncio.gather(*tasks, return_exceptions=True)


# --------------------------------------------------------------------------- the workload


@dataclass(frozen=True)
class Workload:
    fences: list[wl.Fence]
    stream: wl.Stream
    reference: list[EventTuple]


def make_workload() -> Workload:
    fences = wl.make_fences(FENCES, WORKLOAD_SEED, BOX, RADIUS_M)
    stream = wl.random_walk(OBJECTS, UPDATES, WORKLOAD_SEED, BOX)
    return Workload(fences, stream, wl.reference_events(fences, stream))


# --------------------------------------------------------------------------- a run


@dataclass
class Fault:
    label: str
    kind: str  # kill | broker | cut
    at_update: int  # updates published before it was injected
    started: float  # time.monotonic()
    started_wall: float  # time.time()
    done: float = 0.0  # time.monotonic() when the fault's action was over (the broker up again)
    recovery_s: float | None = None
    note: str = ""
    revived: dict[str, str] = field(default_factory=dict)  # sidecars the harness started again: how
    evidence: dict[str, list[str]] = field(default_factory=dict)  # their last log lines


@dataclass
class Outcome:
    row: report.Row
    problems: list[str] = field(default_factory=list)
    info: list[str] = field(default_factory=list)


class FaultRun:
    """One run: the workload renamed for the run (fences and objects unique to it, times
    shifted to now), its fences stored through the production path, the test's consumers,
    the paced publisher; `inject_*` inject faults while it streams; `finish()` waits for the
    last events and returns the verdict; `close()` parks the objects, removes the fences and
    the consumers' queues."""

    def __init__(self, stack: Stack, work: Workload, title: str, seed: int, rate: float = RATE) -> None:
        self.stack, self.title, self.seed, self.rate = stack, title, seed, rate
        self.rng = np.random.default_rng(seed)
        self.run_id = f"ft{uuid.uuid4().hex[:6]}"
        fences, stream = bm.renamed(work.fences, work.stream, self.run_id)
        self.prefix = f"b{self.run_id}-"
        self.stream = stream
        self.fences = fences
        rename_f = {f.fence_id: g.fence_id for f, g in zip(work.fences, fences, strict=True)}
        rename_o = dict(zip(work.stream.object_ids, stream.object_ids, strict=True))
        self.reference = [(e, rename_f[f], rename_o[o], ts, r) for e, f, o, ts, r in work.reference]
        self._bad_at: list[int] = []
        self._shift_to_now()
        self.faults: list[Fault] = []
        self.dead_letters: list[DeadLetter] = []
        self.probe = QueueProbe(stack)
        q = f"fault-suite.{self.run_id}"
        self.collector = EventCollector(stack.conn, f"{q}.events", self.prefix)
        self.dlq = [DeadLetterWatch(stack.conn, v, f"{q}.dead-letters", self.prefix, self.dead_letters)
                    for v in stack.topology.vhosts]
        self.publisher = Publisher(stack.conn["users"][t.GATEWAY_USER][t.INGRESS_VHOST], self.bodies, rate)
        self._publishing: asyncio.Task[None] | None = None
        self._recoveries: list[asyncio.Task[None]] = []
        self.planned: int | None = None  # faults the test will inject (moments())
        self._fences_stored = False
        self.region_of_update: npt.NDArray[np.int64] = np.zeros(len(self.stream), np.int64)
        self.regions: tuple[str, ...] = ()
        self.started = 0.0
        self.pipeline_queues: list[tuple[str, str]] = []

    def _shift_to_now(self) -> None:
        """The stream's times (and the reference's) from now on: a run's positions come
        after its fences exist (a fence's events are never dated before its creation)."""
        shift = time.time() - float(self.stream.ts.min())
        self.stream = dataclasses.replace(self.stream, ts=self.stream.ts + shift)
        self.reference = [(e, f, o, ts + shift, r) for e, f, o, ts, r in self.reference]
        self.where = bm.update_index(self.stream)
        self.end_ts = float(self.stream.ts.max())
        self.bodies = self._bodies()

    def _bodies(self) -> list[Body]:
        bodies = [Body(lo, hi, data) for lo, hi, data in bm.gateway_bodies(self.stream, BATCH)]
        if not self._bad_at:  # drawn once: the seed's moments stay the same
            drawn = self.rng.choice(np.arange(1, len(bodies)), BAD_INPUTS, replace=False)
            self._bad_at = sorted(drawn.tolist())
        at = self._bad_at
        for k, i in enumerate(reversed(at)):  # bad inputs between good batches: no valid position
            n = BAD_INPUTS - 1 - k
            lo = bodies[i].lo
            data = msgpack.packb({"positions": [{"id": f"{self.prefix}bad{n}", "lon": BOX.lon, "lat": 91.0,
                                                 "ts": float(self.stream.ts[lo])}]})
            bodies.insert(i, Body(lo, lo, data, bad=n))
        return bodies

    # -- set-up -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Consumers first (nothing is missed), then the fences, then the stream."""
        say(f"{self.title}: run {self.run_id}, seed {self.seed}, {len(self.fences)} fences, "
            f"{len(self.stream):,} updates at {self.rate:,.0f}/s, {len(self.reference):,} events expected")
        dead = self.stack.dead()
        assert not dead, f"sidecars not running before the run: {', '.join(dead)}; run `geofence up`"
        await self.collector.start()
        for w in self.dlq:
            await w.start()
        wm = await routing_store.read_worldmap(self.stack.conn["postgres"]["dsn"])
        assert wm is not None, "no worldmap stored: run `geofence up`"
        self.regions = wm.regions
        gx, gy = hk.lonlat_to_grid(self.stream.lon, self.stream.lat, INDEX_BITS)
        self.region_of_update = wm.region_index(hk.encode_many(gx, gy, INDEX_BITS))
        self.pipeline_queues = await self._pipeline_queues()
        self._fences_stored = True
        await bm.put_fences(self.stack.conn, self.fences)
        self._shift_to_now()  # the stream starts once the fences are stored
        self.publisher = Publisher(self.publisher.url, self.bodies, self.rate)

    async def _pipeline_queues(self) -> list[tuple[str, str]]:
        """The queues a position passes through on its way to an event: the sidecars'
        position inputs and the federation links' queues (in the upstream vhosts)."""
        inputs = {t.POSITIONS_QUEUE, t.BATCHES_QUEUE, t.GEO_POSITIONS_QUEUE,
                  *(t.fence_queue(w) for w in self.stack.settings.workers)}
        qs = [(v, q) for v, q in sidecars.input_queues(self.stack.topology) if q in inputs]
        from deploy.rabbitmq.apply import management

        mgmt = management(self.stack.settings, self.stack.pw)
        listed = await asyncio.to_thread(mgmt.get, "api/queues?columns=vhost,name")
        vhosts = self.stack.topology.vhosts
        qs += [(str(q["vhost"]), str(q["name"])) for q in listed
               if str(q.get("name", "")).startswith("federation:") and q["vhost"] in vhosts]
        return qs

    def stream_now(self, hold_at: float = HOLD_AT) -> None:
        """Start publishing. While planned faults are not all injected, the stream waits at
        `hold_at` of its length, and after each fault goes on for FLOW_MARGIN updates only
        (enough for the recovery to be seen): every fault lands mid-stream however long the
        ones before took."""
        self.publisher.set_limit(int(hold_at * len(self.stream)))
        self.started = time.monotonic()
        self._publishing = asyncio.create_task(self.publisher.run(), name="publisher")

    def release(self) -> None:
        self.publisher.set_limit(None)

    def _after_fault(self) -> None:
        if self.planned is not None and len(self.faults) >= self.planned:
            self.release()
        elif self.publisher.limit is not None:
            self.publisher.set_limit(max(self.publisher.limit, self.publisher.sent_updates + FLOW_MARGIN))

    def moments(self, n: int, lo: float = 0.08, hi: float = 0.8) -> list[int]:
        """n random moments of the stream (update counts), sorted, from the run's RNG; plans
        n faults (the stream is held back until the last one is in, see stream_now)."""
        self.planned = n
        return sorted(int(x) for x in self.rng.uniform(lo * len(self.stream), hi * len(self.stream), n))

    async def reach(self, update: int) -> None:
        ok = await poll_until(self._sent(update), 300)
        assert ok, f"the publisher did not reach update {update:,} ({self.publisher.errors[-3:]})"

    def _sent(self, update: int) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            if self._publishing is not None and self._publishing.done():
                self._publishing.result()  # raises what killed it
                return True
            return self.publisher.sent_updates >= update
        return check

    # -- faults -------------------------------------------------------------------------------

    def _begin(self, label: str, kind: str) -> Fault:
        f = Fault(label, kind, self.publisher.sent_updates, time.monotonic(), time.time())
        self.faults.append(f)
        say(f"{self.title}: {label} at update {f.at_update:,}")
        return f

    async def recovered(self) -> None:
        """Until every fault injected so far has recovered (or given up)."""
        await asyncio.gather(*self._recoveries)

    def _measure(self, f: Fault, queues: Sequence[tuple[str, str]], scope: str) -> None:
        """The recovery is measured in the background: the next fault may land meanwhile.
        The sidecars have CONSUMER_DEADLINE_S from the end of the fault's action."""
        f.done = time.monotonic()
        self._after_fault()
        self._recoveries.append(asyncio.create_task(self._recovered(f, queues, scope),
                                                    name=f"recovery of {f.label}"))

    async def kill(self, name: str) -> Fault:
        """kill -9 the sidecar and restart it at once; its recovery is measured meanwhile."""
        f = self._begin(f"kill -9 {name}", "kill")
        await asyncio.to_thread(self.stack.kill9, name)
        await asyncio.to_thread(self.stack.launch, name)
        self._measure(f, sidecar_queues(self.stack.topology, name), self._scope(name))
        return f

    async def restart_broker(self) -> Fault:
        """RabbitMQ stopped (`rabbitmqctl stop`) and started again; until every input queue
        has its consumer and events flow again."""
        f = self._begin("RabbitMQ stop + start", "broker")
        await asyncio.to_thread(self.stack.stop_broker)
        down_s = time.monotonic() - f.started
        await asyncio.to_thread(self.stack.start_broker)
        f.note = f"stop {down_s:.1f}s, start {time.monotonic() - f.started - down_s:.1f}s"
        queues = [(v, q) for n in self.stack.names for v, q in sidecar_queues(self.stack.topology, n)]
        self._measure(f, queues, "any")
        return f

    async def cut(self, proxy: TcpProxy, names: Sequence[str]) -> Fault:
        f = self._begin("TCP cut", "cut")
        n = await asyncio.to_thread(proxy.cut)
        f.note = f"{n} connections cut"
        queues = [(v, q) for name in names for v, q in sidecar_queues(self.stack.topology, name)]
        self._measure(f, queues, "any")
        return f

    def _scope(self, name: str) -> str:
        if name.startswith("x-geo-"):
            return "region:" + name.removeprefix("x-geo-")
        if name.startswith("x-fence-"):
            return "worker:" + name.removeprefix("x-fence-")
        if name == "fence-archiver":
            return "archive"
        return "any"

    async def _recovered(self, f: Fault, queues: Sequence[tuple[str, str]], scope: str) -> None:
        """Until the queues have consumers and an event in scope flows; a sidecar that has
        not reconnected by itself at CONSUMER_DEADLINE_S is restarted by the harness (noted:
        the run fails on it), so the rest of the run still tells whether anything was lost."""
        async def consuming() -> bool:
            return not await self.probe.consumed(queues)

        left = CONSUMER_DEADLINE_S - (time.monotonic() - f.done)
        if not await poll_until(consuming, max(left, 0.0)):
            missing = await self.probe.consumed(queues)
            owners = [n for n in self.stack.names
                      if {f"{v}/{q}" for v, q in sidecar_queues(self.stack.topology, n)} & set(missing)]
            f.evidence = {n: self.stack.log_evidence(n) for n in owners}
            f.revived = await self.stack.revive(0, owners)
            f.note += (f"{'; ' if f.note else ''}no consumer on {', '.join(missing)} after "
                       f"{CONSUMER_DEADLINE_S:g}s: started again "
                       f"{', '.join(f'{n} ({how})' for n, how in f.revived.items()) or 'nothing'}")
            say(f"{self.title}: {f.label}: {f.note}")
            if not await poll_until(consuming, CONSUMER_DEADLINE_S):
                f.note += f"; still no consumer on {', '.join(await self.probe.consumed(queues))}"
                return
        consumer_s = time.monotonic() - f.started
        if scope == "archive":
            ok = await poll_until(self._archived_after(f.started_wall), FLOW_DEADLINE_S)
        else:
            ok = await poll_until(self._event_after(f.at_update, scope), FLOW_DEADLINE_S)
        f.recovery_s = time.monotonic() - f.started
        f.note += f"{'; ' if f.note else ''}consumer back after {consumer_s:.1f}s"
        if not ok:
            f.note += f", no new event within {FLOW_DEADLINE_S:g}s more"
        say(f"{self.title}: {f.label}: recovered in {f.recovery_s:.1f}s ({f.note})")

    def _event_after(self, update: int, scope: str) -> Callable[[], Awaitable[bool]]:
        """An event caused by a position published after the fault, in scope, was received."""
        seen = [0]
        kind, _, which = scope.partition(":")
        region = self.regions.index(which) if kind == "region" else -1

        async def check() -> bool:
            ds = self.collector.deliveries
            for d in ds[seen[0]:]:
                i = self.where.get((d.event[2], d.event[3]))
                if i is None or i < update:
                    continue
                if kind == "region" and self.region_of_update[i] != region:
                    continue
                if kind == "worker" and self.stack.ring.node_for(d.event[1]) != which:
                    continue
                return True
            seen[0] = len(ds)
            return False
        return check

    def _archived_after(self, wall: float) -> Callable[[], Awaitable[bool]]:
        """An event was archived (in a transaction begun) after `wall`: the archiver writes
        again (whatever backlog it works through)."""
        async def check() -> bool:
            try:
                c = await asyncpg.connect(self.stack.conn["postgres"]["dsn"])
                try:
                    n = await c.fetchval("SELECT EXISTS (SELECT 1 FROM fence_event "
                                         "WHERE archived_at > to_timestamp($1))", wall)
                finally:
                    await c.close()
            except (OSError, asyncpg.PostgresError):
                return False
            return bool(n)
        return check

    # -- the end ------------------------------------------------------------------------------

    async def finish(self) -> Outcome:
        """Every position confirmed, then the last events (or quiet), then the verdict."""
        self.release()
        assert self._publishing is not None, "stream_now() first"
        await asyncio.wait_for(self._publishing, SETTLE_DEADLINE_S + 120)
        published_s = time.monotonic() - self.started
        await asyncio.gather(*self._recoveries)
        await self._settle()
        events_s = time.monotonic() - self.started
        out = await self._verdict()
        out.info.insert(0, f"published in {published_s:.1f}s (reconnects {self.publisher.reconnects}, "
                           f"bodies republished {self.publisher.republished}), events settled at "
                           f"{events_s:.1f}s")
        return out

    async def _settle(self) -> None:
        want = len(self.reference)
        end = time.monotonic() + SETTLE_DEADLINE_S
        while time.monotonic() < end:
            quiet = time.monotonic() - self.collector.last_at
            if len(self.collector.distinct) >= want and quiet >= GRACE_S:
                return
            if quiet >= QUIET_S and await self.probe.ready(self.pipeline_queues) == 0:
                return
            if quiet >= QUIET_LONG_S:  # the pipeline is busy with others' work, not ours
                return
            await asyncio.sleep(POLL_S)
        ago = time.monotonic() - self.collector.last_at
        say(f"{self.title}: no end of events after {SETTLE_DEADLINE_S:g}s: {len(self.collector.distinct):,} "
            f"of {want:,}, the last {ago:.0f}s ago, {await self.probe.ready(self.pipeline_queues)} "
            "messages ready in the pipeline")

    async def _verdict(self) -> Outcome:
        got = list(self.collector.distinct.values())
        problems: list[str] = []
        info = [f"seed {self.seed} (FAULT_SEED={self.seed} replays the moments), run {self.run_id}"]
        diff = compare(got, self.reference)
        if diff:
            problems.append("events (deduped on event_id) differ from the shapely ground truth: " + diff[0])
            problems += self._attribute(got)
            problems += diff[1:]
            problems += await self._worker_stats()
        if self.collector.conflicts:
            problems.append(f"{len(self.collector.conflicts)} event_ids name two different events: "
                            + "; ".join(self.collector.conflicts[:3]))
        problems += [f"{f.label}: did not recover ({f.note})" for f in self.faults if f.recovery_s is None]
        for f in self.faults:
            for how, verb in (("stuck", "ran on without consuming"), ("exited", "exited")):
                names = [n for n, h in f.revived.items() if h == how]
                if names:
                    said = " | ".join(f"{n}: {' / '.join(f.evidence.get(n, []))}" for n in names)
                    problems.append(f"{f.label}: {', '.join(names)} {verb} (seen {CONSUMER_DEADLINE_S:g}s "
                                    f"after the fault; the harness started them again); log: {said}")
        problems += await self._sidecars_alive()
        problems += self._dead_letter_problems()
        problems += await self._archive_problems()
        info.append(f"raw deliveries {self.collector.raw:,}, distinct {len(self.collector.distinct):,}, "
                    f"duplicates {self.collector.duplicates:,}; test consumer reconnects "
                    f"{self.collector.reconnects}")
        info += [f"fault {f.label} at update {f.at_update:,}: "
                 f"{'-' if f.recovery_s is None else f'{f.recovery_s:.1f}s'} ({f.note})" for f in self.faults]
        ours = [d for d in self.dead_letters if d.ours]
        row = report.Row(self.title, len(self.faults), len(self.stream), len(self.reference),
                         len(self.collector.distinct), self.collector.duplicates, len(ours),
                         tuple(float("nan") if f.recovery_s is None else f.recovery_s for f in self.faults),
                         ok=not problems)
        return Outcome(row, problems, info)

    def _attribute(self, got: Sequence[EventTuple]) -> list[str]:
        """Each unexpected or missing event to the last fault injected before the position
        that caused it was published, or shortly after (ATTRIBUTION_SLACK: positions in flight
        when it struck), else 'before any fault'; counted by kind, event and worker."""
        extra = Counter(got) - Counter(self.reference)
        missing = Counter(self.reference) - Counter(got)
        marks = [(f.at_update, f.label) for f in self.faults]
        per: dict[str, Counter[str]] = {}
        for what, ctr in (("unexpected", extra), ("missing", missing)):
            for ev, n in ctr.items():
                i = self.where.get((ev[2], ev[3]), -1)
                label = "before any fault"
                for at, lab in marks:
                    if i + ATTRIBUTION_SLACK >= at:
                        label = lab
                worker = self.stack.ring.node_for(ev[1])
                per.setdefault(label, Counter())[f"{what} {ev[0]}/{ev[4]} on {worker}"] += n
        lines = []
        for label in [lab for _, lab in marks] + ["before any fault"]:
            if label in per:
                parts = ", ".join(f"{n} {k}" for k, n in sorted(per[label].items()))
                lines.append(f"  after {label}: {parts}")
        for what, ctr in (("unexpected", extra), ("missing", missing)):
            lines += [f"  {what} {ev}: {self._explain(ev)}" for ev in sorted(ctr)[:6]]
        return lines

    def _explain(self, ev: EventTuple) -> str:
        """Where the update behind an event sits: its index and region, the object's updates
        around it (regions), the faults just before it."""
        i = self.where.get((ev[2], ev[3]))
        if i is None:
            return "no update of the stream has this object and ts"
        o = int(self.stream.obj[i])
        mine = np.flatnonzero(self.stream.obj == o)
        k = int(np.searchsorted(mine, i))
        near = mine[max(0, k - 2):k + 3].tolist()
        regions = " ".join(f"#{j}{'*' if j == i else ''}:{self.regions[int(self.region_of_update[j])]}"
                           for j in near)
        before = [f"{f.label} at #{f.at_update} ({i - f.at_update:+d})" for f in self.faults
                  if f.at_update <= i + 2 * BATCH * 10]
        return (f"update #{i}, the object's updates (region) {regions}; fault(s) before: "
                f"{', '.join(before[-3:]) or 'none'}")

    async def _worker_stats(self) -> list[str]:
        lines = []
        for w in self.stack.settings.workers:
            with contextlib.suppress(Exception):
                got = await ask(self.stack.conn["amqp"][t.FENCES_VHOST], t.FENCE_CONTROL_EXCHANGE, w, {}, 5)
                s = got.get("stats", {})
                lines.append(f"  x-fence {w} now: " + ", ".join(
                    f"{k} {s[k]}" for k in ("held_now", "held_positions", "holds_expired", "stale_positions")
                    if k in s))
        return lines

    async def _sidecars_alive(self) -> list[str]:
        problems = []
        dead = self.stack.dead()
        for name in dead:
            tail = " | ".join(self.stack.log_tail(name, 4))
            problems.append(f"sidecar {name} is dead at the end of the run; "
                            f"{self.stack.log_path(name)}: {tail}")
        queues = [(v, q) for n in self.stack.names for v, q in sidecar_queues(self.stack.topology, n)]

        async def consuming() -> bool:
            return not await self.probe.consumed(queues)

        if not await poll_until(consuming, 30):
            problems.append(f"input queues without a consumer at the end: "
                            f"{', '.join(await self.probe.consumed(queues))}")
        return problems

    def _dead_letter_problems(self) -> list[str]:
        problems = []
        bad = {d.bad_input for d in self.dead_letters if d.bad_input is not None}
        missing = sorted(set(range(BAD_INPUTS)) - bad)
        if missing:
            problems.append(f"bad inputs not in a dead-letter queue: {missing} of {BAD_INPUTS}")
        no_reason = [d for d in self.dead_letters if d.ours and not d.reason]
        if no_reason:
            problems.append(f"{len(no_reason)} dead letters of the run without a {t.REASON_HEADER} header")
        stray = [d for d in self.dead_letters if d.ours and d.bad_input is None]
        if stray:
            problems.append(f"{len(stray)} messages of valid positions or events were dead-lettered: "
                            + "; ".join(f"{d.vhost} {d.source}: {d.reason}" for d in stray[:5]))
        return problems

    async def _archive_problems(self) -> list[str]:
        """fence_event holds exactly the run's distinct events (the archiver is idempotent
        by event_id); waits for the archiver while the table still grows (a count a second),
        then compares the rows."""
        want = set(self.collector.distinct)
        dsn = self.stack.conn["postgres"]["dsn"]
        # the run's objects in the run's fences: an object of another run (a parked demo car)
        # inside a fence when it is defined gets its own ENTER, none of this run's business
        query = "FROM fence_event WHERE fence_id LIKE $1 AND object_id LIKE $1 AND ts <= $2"
        args = (self.prefix + "%", self.end_ts)

        async def fetch(sql: str) -> list[asyncpg.Record] | None:
            try:
                c = await asyncpg.connect(dsn)
                try:
                    return list(await c.fetch(sql, *args))
                finally:
                    await c.close()
            except (OSError, asyncpg.PostgresError):
                return None

        archive = [(t.FENCES_VHOST, t.ARCHIVE_QUEUE)]
        t0 = time.monotonic()
        end = t0 + ARCHIVE_DEADLINE_S
        first_depth = await self.probe.ready(archive)
        last, moved, depth = -1, t0, first_depth
        while time.monotonic() < end:
            got = await fetch(f"SELECT count(*) AS n {query}")
            n = int(got[0]["n"]) if got else -1
            now = time.monotonic()
            if n >= len(want) or now - moved > ARCHIVE_STUCK_S:
                break
            if n != last:
                last, moved = n, now
            depth = await self.probe.ready(archive)
            drained = (first_depth or 0) - (depth or 0)
            if depth and drained > 0 and now - t0 > 5 and depth / (drained / (now - t0)) > end - now:
                break  # the archiver's backlog will not drain before the deadline: say so now
            await asyncio.sleep(1.0)  # polling a count, not synchronising
        rs = await fetch(f"SELECT event_id, event, fence_id, object_id, ts, reason {query}") or []
        rows: dict[str, EventTuple] = {r["event_id"]: (r["event"], r["fence_id"], r["object_id"], r["ts"],
                                                       r["reason"]) for r in rs}
        problems = []
        lost = want - set(rows)
        extra = set(rows) - want
        if lost:
            behind = await self.probe.ready(archive)
            rate = ((first_depth or 0) - (behind or 0)) / max(time.monotonic() - t0, 1e-9)
            why = (f"the archiver is behind: {behind:,} messages wait in {t.ARCHIVE_QUEUE}, draining at "
                   f"{rate:,.0f}/s" if behind else f"{t.ARCHIVE_QUEUE} is empty: lost")
            problems.append(f"fence_event lacks {len(lost):,} of the {len(want):,} events received ({why}), "
                            "e.g. " + "; ".join(str(self.collector.distinct[e]) for e in sorted(lost)[:3]))
        if extra:
            problems.append(f"fence_event holds {len(extra)} events of the run never received, e.g. "
                            + "; ".join(str(rows[e]) for e in sorted(extra)[:3]))
        differ = [e for e in want & set(rows) if rows[e] != self.collector.distinct[e]]
        if differ:
            problems.append(f"{len(differ)} archived events differ from the ones delivered, e.g. "
                            f"{rows[differ[0]]} vs {self.collector.distinct[differ[0]]}")
        return problems

    async def close(self) -> None:
        """Stop publishing, park the run's objects, remove its fences and the test's queues."""
        for task in [*self._recoveries, self._publishing]:
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        try:
            revived = await self.stack.revive(5)  # the clean-up (and the next run) need every sidecar
            if revived:
                say(f"{self.title}: started {', '.join(f'{n} ({h})' for n, h in revived.items())} again "
                    "before cleaning up")
            if self._fences_stored:
                try:
                    await bm.park(self.stack.conn, self.stream, 1000)
                except Exception as exc:  # the fences go anyway
                    say(f"{self.title}: parking failed ({type(exc).__name__}: {exc})")
                await bm.remove_fences(self.stack.conn, self.fences)
        finally:
            await self.collector.stop()
            for w in self.dlq:
                await w.stop()
            await self.probe.close()


# --------------------------------------------------------------------------- proxied sidecars


class Proxied:
    """The stack's instances of `names` replaced by ones connecting through a TcpProxy;
    `restore()` puts the stack's own back."""

    def __init__(self, stack: Stack, names: Sequence[str]) -> None:
        self.stack, self.names = stack, list(names)
        self.proxy = TcpProxy(stack.settings.host, stack.settings.amqp_port)
        self.swapped: list[str] = []
        self.probe = QueueProbe(stack)

    async def start(self) -> None:
        port = await asyncio.to_thread(self.proxy.start)
        say(f"TCP proxy on 127.0.0.1:{port} -> {self.stack.settings.host}:{self.stack.settings.amqp_port}")
        for name in self.names:
            await asyncio.to_thread(self.stack.terminate, name)
            self.swapped.append(name)
            self.stack.proxy_port[name] = port
            await asyncio.to_thread(self.stack.launch, name)
        await self._consuming()

    async def _consuming(self) -> None:
        queues = [(v, q) for n in self.names for v, q in sidecar_queues(self.stack.topology, n)]

        async def ok() -> bool:
            return not await self.probe.consumed(queues)

        assert await poll_until(ok, CONSUMER_DEADLINE_S), \
            f"no consumer on {await self.probe.consumed(queues)} after the swap"

    async def restore(self) -> None:
        self.proxy.resume()
        for name in self.swapped:
            self.stack.proxy_port.pop(name, None)
            await asyncio.to_thread(self.stack.terminate, name)
            await asyncio.to_thread(self.stack.launch, name)
        self.swapped.clear()
        self.proxy.close()
        try:
            await self._consuming()
        finally:
            await self.probe.close()


# --------------------------------------------------------------------------- a whole test


async def execute(run: FaultRun, inject: Callable[[FaultRun], Awaitable[None]]) -> Outcome:
    """Start the run, stream, `inject(run)` the faults, finish; the row goes into the suite's
    table whatever happens (a run that broke off is a row marked NO)."""
    out: Outcome | None = None
    try:
        await run.start()
        run.stream_now()
        await inject(run)
        run.release()  # every fault is in: the rest of the stream goes on
        out = await run.finish()
    finally:
        if out is None:
            report.record(report.Row(
                run.title, len(run.faults), run.publisher.sent_updates, len(run.reference),
                len(run.collector.distinct), run.collector.duplicates,
                sum(1 for d in run.dead_letters if d.ours),
                tuple(float("nan") if f.recovery_s is None else f.recovery_s for f in run.faults), ok=False))
        await run.close()
    report.record(out.row)
    for line in out.info:
        say(f"{run.title}: {line}")
    return out


def failure_message(out: Outcome) -> str:
    return "\n".join([*out.problems, "-- run:", *out.info])
