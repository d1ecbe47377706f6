"""The live local stack as the fault suite drives it (`geofence up`'s settings, secrets and
process records): which input queues each sidecar consumes, a sidecar's `kill -9`, stop and
restart (through its TCP proxy if it has one), its log, RabbitMQ stopped and started again
(state.json updated with the new node's pid), the revival of sidecars a fault left exited or
stuck, and `QueueProbe`: consumers and ready messages of queues as the broker sees them now.

The sidecars' processes are deploy/sidecars.py's: a restart is its `spawn` (the very command,
environment and log `geofence up` uses), recorded back into <state dir>/sidecars.json so that
`geofence status/down/up` see it; their records, liveness and logs are read through it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aio_pika
from aio_pika.abc import AbstractConnection

from deploy import broker_cluster, region_ops, sidecars
from deploy.processes import ProcessId, ServiceRecord, identify, load_state, save_state, wait_gone
from deploy.processes import terminate as terminate_process
from deploy.rabbitmq.apply import management
from deploy.rabbitmq.plan import api_path
from deploy.services import rabbitmq_await, rabbitmq_launch, rabbitmq_pid, rabbitmq_stop
from deploy.settings import Settings, load_connection_settings, load_secrets
from deploy.stack import up as stack_up
from exchanges import topology as t
from exchanges.hash_ring import HashRing
from tests.faults.timing import poll_until, say

PROXY_DIGEST = "fault-suite-proxy"  # the sidecars.json digest of a proxied sidecar: any
#                                     `geofence up` replaces it with the stack's own instance


def sidecar_queues(topology: t.Topology, name: str) -> list[tuple[str, str]]:
    """(vhost, queue) of the input queues a sidecar consumes."""
    if name == "x-ingress":
        return [(t.INGRESS_VHOST, q) for q in (*t.PARTITION_QUEUES, t.POSITIONS_QUEUE, t.BATCHES_QUEUE,
                                               t.PROXIMITY_QUEUE)]
    if name.startswith("x-ingress-"):  # an added instance: back when every partition is consumed again
        return [(t.INGRESS_VHOST, q) for q in t.PARTITION_QUEUES]
    if name.startswith("x-geo-"):
        v = t.region_vhost(name.removeprefix("x-geo-"))
        return [(v, t.GEO_POSITIONS_QUEUE), (v, t.GEO_CONTROL_QUEUE)]
    if name.startswith("x-fence-"):
        w = name.removeprefix("x-fence-")
        return [(t.FENCES_VHOST, t.fence_queue(w)), (t.FENCES_VHOST, t.fence_control_queue(w))]
    if name == "fence-archiver":
        return [(t.FENCES_VHOST, t.ARCHIVE_QUEUE)]
    if name == "fence-webhooks":
        return [(t.FENCES_VHOST, t.WEBHOOKS_QUEUE)]
    if name == "api":
        return [(t.FENCES_VHOST, t.API_QUEUE), (t.INGRESS_VHOST, t.FOLLOW_QUEUE)]
    if name == "venue-sensors":
        return [(t.INGRESS_VHOST, t.SENSORS_QUEUE), (t.INGRESS_VHOST, t.NOTIFY_QUEUE),
                (t.INGRESS_VHOST, t.HIVE_EVENTS_QUEUE)]
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
        if name.startswith("x-ingress-"):  # added live (`geofence ingress add`)
            return sidecars.Sidecar("x-ingress", name.removeprefix("x-ingress-"))
        for sc in sidecars.sidecars(self.topology):
            if sc.name == name:
                return sc
        raise ValueError(f"{name!r} is not a sidecar of the topology ({', '.join(self.names)})")

    def process(self, name: str) -> ProcessId | None:
        return sidecars.process(self.settings, name)

    def dead(self) -> list[str]:
        return [n for n, ok in sidecars.running(self.settings).items() if not ok]

    def log_path(self, name: str) -> Path:
        return sidecars.log_path(self.settings, name)

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
        """Start the sidecar as `geofence up` does (deploy's sidecars.spawn; through its
        TcpProxy if it has one: `proxy_port`); recorded in sidecars.json."""
        sc = self.sidecar(name)
        amqp_port = self.proxy_port.get(name)
        overrides = {}
        if amqp_port is not None:
            url = sidecars.environment(self.settings, self.pw, sc)["GEOFENCE_AMQP_URL"]
            overrides["GEOFENCE_AMQP_URL"] = _with_port(url, amqp_port)
        self._note(name, "started" + (f" through the TCP proxy on port {amqp_port}" if amqp_port else ""))
        settings = region_ops.live(self.settings)  # x-ingress instances added since the start
        proc = sidecars.spawn(settings, self.pw, sc, overrides)
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

    def broker_node_process(self, node: int) -> ProcessId:
        """A cluster node's Erlang VM (deploy/broker_cluster.py). Asked of the node itself
        (`rabbitmqctl eval`: seconds on a loaded machine), before the fault's clock starts."""
        return identify(broker_cluster.node_pid_of(node))

    def kill_broker_node(self, node: int, proc: ProcessId) -> None:
        """SIGKILL of a cluster node's Erlang VM, until it is gone."""
        os.kill(proc.pid, signal.SIGKILL)
        wait_gone(proc, 30, f"RabbitMQ node {node}")

    def start_broker_node(self, node: int) -> None:
        """A cluster node started again as `geofence up` starts it (it rejoins by itself)."""
        broker_cluster.start(self.settings, node)
        proc = broker_cluster.await_started(self.settings, node)
        broker_cluster.configure(self.settings, self.pw, True, node)
        state = load_state(self.settings.state_file)
        state[f"rabbitmq-n{node}"] = ServiceRecord(True, proc)
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

    async def in_flight(self, queues: Sequence[tuple[str, str]]) -> int | None:
        """Ready messages (now) and those delivered but not acked yet (the management API's
        figure, up to 5 s old) in all of them; None if a figure is missing. A sidecar that
        took a batch and waits on its next hop (a journal stream or a quorum queue still
        recovering after a broker restart) leaves none ready, but its batch is not done."""
        ready = await self.ready(queues)
        if ready is None:
            return None
        unacked = 0
        for v, q in queues:
            n = await asyncio.to_thread(self._management_figure, v, q, "messages_unacknowledged")
            if n is None:
                return None
            unacked += n
        return ready + unacked

    def _management_ready(self, vhost: str, queue: str) -> int | None:
        return self._management_figure(vhost, queue, "messages_ready")

    def _management_figure(self, vhost: str, queue: str, figure: str) -> int | None:
        try:
            got = management(self.stack.settings, self.stack.pw).get(api_path("queues", vhost, queue))
            return int(got.get(figure) or 0)
        except Exception:
            return None

    async def close(self) -> None:
        for c in self._conns.values():
            with contextlib.suppress(Exception):
                await c.close()
        self._conns.clear()
