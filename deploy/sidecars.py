"""The pipeline on the local stack: schema, default worldmap and the sidecar processes that
`geofence up` starts after the broker topology (x-ingress, one x-geo per region, one
x-fence per worker, the events archiver and the fence service `geofence api`), and that
`geofence down` stops first.

Each sidecar runs `python -m deploy.cli <role> [instance]` detached, logging to
<state dir>/log/<name>.log, with its own RabbitMQ user's URL. `sidecars.json` records each
one's process and the digest of the code it runs: `up` leaves a running sidecar alone unless
the code changed (then it restarts it), and starts the missing ones. `up` returns once
every input queue has its consumer, so what it prints is usable at once.
(Production runs the same commands from the systemd units in deploy/systemd/.)
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy.consumer_probe import ConsumerProbe
from deploy.processes import ProcessId, Say, StackError, identify, port_open, process_identity, terminate
from deploy.rabbitmq import definitions as d
from deploy.settings import (
    FIREBASE_PROJECT,
    METRICS_HOST,
    Secrets,
    Settings,
    postgres_dsn,
    sidecar_amqp_url,
    sidecar_ids,
    sidecar_names,
)
from exchanges import topology as t

ROOT = Path(__file__).resolve().parent.parent
CODE_DIRS = ("exchanges", "ingress", "fence", "hilbert_c", "deploy")
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0  # above the sidecars' drain time (GEOFENCE_DRAIN_S, 10 s)
USERS = {"x-ingress": t.INGRESS_USER, "x-geo": t.GEO_USER, "x-fence": t.FENCE_USER,
         "fence-archiver": t.ARCHIVER_USER, "api": t.MANAGER_USER, "venue-sensors": t.VENUES_USER,
         "fence-webhooks": t.WEBHOOKS_USER}


@dataclass(frozen=True)
class Sidecar:
    role: str  # x-ingress | x-geo | x-fence | fence-archiver | api | venue-sensors | fence-webhooks
    instance: str = ""

    @property
    def name(self) -> str:
        return f"{self.role}-{self.instance}" if self.instance else self.role

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "deploy.cli", self.role, *([self.instance] if self.instance else [])]


def sidecars(topology: t.Topology, ingress: tuple[str, ...] = ()) -> list[Sidecar]:
    return [Sidecar(role, instance) for role, instance in sidecar_ids(topology, ingress)]


def input_queues(topology: t.Topology) -> list[tuple[str, str]]:
    """(vhost, queue) of every queue a sidecar consumes."""
    return [(v, q) for v in topology.vhosts for q in d.input_queues(topology, v)]


# Sidecar settings `geofence up` passes on from its own environment (the rest it sets itself).
PASSED_ON = ("GEOFENCE_DRAIN_S", "GEOFENCE_BATCH_MAX", "GEOFENCE_PREFETCH", "GEOFENCE_LOG_LEVEL",
             "GEOFENCE_PERSISTENCE", "GEOFENCE_FENCE_BACKUPS", "GEOFENCE_TAKEOVER_S")


def passed_on(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {k: env[k] for k in PASSED_ON if env.get(k)}


def environment(settings: Settings, pw: Secrets, sc: Sidecar) -> dict[str, str]:
    user = USERS[sc.role]
    broker = settings.broker_of(sc.instance) if sc.role == "x-geo" else 1  # its region's node
    node, others = cluster_place(settings, sc) if broker == 1 else (1, [])
    env = {"GEOFENCE_AMQP_URL": sidecar_amqp_url(settings, user, pw.users[user], sc.name, broker, node),
           "GEOFENCE_POSTGRES_URL": postgres_dsn(settings, pw.postgres_password),
           "GEOFENCE_REGIONS": ",".join(settings.regions),
           "GEOFENCE_WORKERS": ",".join(settings.workers)}
    if others:
        env["GEOFENCE_AMQP_NODES"] = ",".join(f"{h}:{p}" for h, p in others)
    env.update(passed_on())
    env["GEOFENCE_METRICS_LISTEN"] = f"{METRICS_HOST}:{settings.metrics_ports()[sc.name]}"
    if sc.role in ("api", "venue-sensors"):  # the venues' read cache
        env["GEOFENCE_MEMCACHED_URL"] = f"memcache://{settings.host}:{settings.memcached_port}"
    if sc.role in ("x-fence", "x-ingress"):  # its snapshot and journal (x-ingress: the proximity router's)
        env["GEOFENCE_JOURNAL_DIR"] = str(settings.state_dir / "state" / sc.name)
    if sc.role == "api":
        env.update({"GEOFENCE_API_HOST": settings.host, "GEOFENCE_API_PORT": str(settings.api_port),
                    "GEOFENCE_API_TLS_LISTEN": f"{settings.public_host}:{settings.api_tls_port}",
                    "GEOFENCE_API_TLS_CERT": str(settings.tls_cert_file),
                    "GEOFENCE_API_TLS_KEY": str(settings.tls_key_file),
                    "GEOFENCE_PROMETHEUS_URL": f"http://{settings.host}:{settings.prometheus_port}",
                    "GEOFENCE_FIREBASE_PROJECT": FIREBASE_PROJECT,
                    "GEOFENCE_MAP_ROADS": str(settings.map_roads_file),
                    "FIREBASE_AUTH_EMULATOR_HOST": f"{settings.host}:{settings.firebase_auth_port}"})
        if settings.map_tiles:
            env["GEOFENCE_MAP_TILES"] = settings.map_tiles
    return env


# the roles whose connections fail over between a cluster's nodes (exchanges/shell): spread
# over the nodes; the API's fence manager (aio-pika's robust connection, one URL) stays on node 1
SPREAD_ROLES = ("x-ingress", "x-geo", "x-fence", "fence-archiver", "venue-sensors", "fence-webhooks")


def cluster_place(settings: Settings, sc: Sidecar) -> tuple[int, list[tuple[str, int]]]:
    """The first broker's cluster node a process connects to (1..broker_nodes; on loopback,
    where every node listens, the processes in turn) and the other nodes, in the order it
    fails over to them."""
    n = settings.broker_nodes
    if n == 1 or not ipaddress.ip_address(settings.host).is_loopback:
        return 1, []
    names = sidecar_names(settings.topology, settings.ingress)
    first = names.index(sc.name) % n if sc.role in SPREAD_ROLES and sc.name in names else 0
    order = [(first + i) % n + 1 for i in range(n)]
    return order[0], [(settings.host, settings.node_port(settings.amqp_port, k)) for k in order[1:]]


def api_url(settings: Settings) -> str:
    return f"http://{settings.host}:{settings.api_port}"


def code_digest() -> str:
    h = hashlib.sha256()
    for top in CODE_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in (".py", ".so", ".sql") and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(ROOT)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()


# --------------------------------------------------------------------------- records


def _records_path(settings: Settings) -> Path:
    return settings.state_dir / "sidecars.json"


def load_records(settings: Settings) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(_records_path(settings).read_text())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise StackError(f"{_records_path(settings)} is damaged ({exc}); delete it") from None
    return dict(data.get("sidecars", {}))


def save_records(settings: Settings, records: dict[str, dict[str, Any]]) -> None:
    path = _records_path(settings)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": 1, "sidecars": records}, indent=2) + "\n")
    os.replace(tmp, path)


def _process(rec: dict[str, Any] | None) -> ProcessId | None:
    if not rec:
        return None
    proc = ProcessId(int(rec["pid"]), int(rec["start_ticks"]))
    return proc if process_identity(proc.pid) == proc else None


def running(settings: Settings) -> dict[str, bool]:
    recs = load_records(settings)
    return {sc.name: _process(recs.get(sc.name)) is not None
            for sc in sidecars(settings.topology, settings.ingress)}


def process(settings: Settings, name: str) -> ProcessId | None:
    """Sidecar `name`'s process as sidecars.json records it; None when that process is gone."""
    return _process(load_records(settings).get(name))


# --------------------------------------------------------------------------- up / down


async def prepare_database(dsn: str, regions: tuple[str, ...], say: Say,
                           workers: tuple[str, ...] | None = None,
                           placement: list[tuple[str, tuple[str, int]]] | None = None,
                           ingress: tuple[str, ...] | None = None) -> None:
    # here, not at the top: asyncpg, numpy and shapely, which `geofence status` and `down` do not need
    from deploy.migrate import migrate
    from exchanges import routing_store
    from exchanges.worldmap import Worldmap
    from fence import store

    applied = await migrate(dsn)
    if applied:
        say(f"postgres: migrations applied: {', '.join(applied)}")
    conn = await routing_store.connect(dsn)
    try:
        wm = await routing_store.latest_worldmap(conn)
        # A map routing to a region the stack no longer has is replaced by equal shares (not
        # live: GEOFENCE_REGIONS changed by hand). A region the map lacks is left owning
        # nothing: `geofence region add` gives it its part live (or finishes an add cut short).
        if wm is None or set(wm.regions) - set(regions):
            version = 1 if wm is None else wm.version + 1
            new = Worldmap.over_area(list(regions), version=version)
            await store.save_worldmap(conn, new)
            say(f"worldmap: version {version} stored (regions {', '.join(regions)})")
        if placement is not None:  # the stack's record of placed regions is the table's
            await conn.execute("DELETE FROM region_broker WHERE NOT (region = ANY($1))",
                               [r for r, _ in placement])
            await conn.executemany("INSERT INTO region_broker (region, host, port) VALUES ($1, $2, $3) "
                                   "ON CONFLICT (region) DO UPDATE SET host = EXCLUDED.host, "
                                   "port = EXCLUDED.port", [(r, h, p) for r, (h, p) in placement])
        ring = await routing_store.latest_ring(conn)
        if workers is not None and ring is not None and set(ring[1].nodes) != set(workers):
            raise StackError(f"the worker ring in force (version {ring[0]}: {', '.join(ring[1].nodes)}) "
                             f"is not the workers to run ({', '.join(workers)}): change workers with "
                             "`geofence worker add / remove` (their fences' state moves with them), or unset "
                             "GEOFENCE_WORKERS")
        if ingress is not None:
            await _partitions_to_instances_run(conn, ingress, say)
        if wm is not None and not set(wm.regions) - set(regions):
            idle = [r for r in regions if r not in wm.regions or not len(wm.intervals(r))]
            if idle:
                say(f"worldmap: region {', '.join(idle)} owns no part of the curve: `geofence region "
                    "add NAME --split-from R` gives it one")
    finally:
        await conn.close()


async def _partitions_to_instances_run(conn: Any, ingress: tuple[str, ...], say: Say) -> None:
    """A stored partition map naming an x-ingress instance this stack does not run (an
    `ingress add` or `remove` cut short, an instance's number dropped from the recorded
    topology) would leave its partitions without a consumer: its share goes to the instances
    run, nothing else moves (the instances read the new map within a second)."""
    from exchanges import ingress_partitions as ip
    from exchanges import routing_store

    run = [ip.FIRST_INSTANCE, *(f"{ip.FIRST_INSTANCE}-{n}" for n in ingress)]
    version, owners = await routing_store.assignment_or_first(conn)
    gone = sorted(set(owners.values()) - set(run))
    if gone:
        after = ip.assign(run, owners)
        new = await routing_store.store_assignment(conn, after)
        say(f"x-ingress partition map version {new} stored (was {version}): the partitions of "
            f"{', '.join(gone)}, which this stack does not run, go to {', '.join(run)}")


def up(settings: Settings, pw: Secrets, say: Say) -> None:
    dsn = postgres_dsn(settings, pw.postgres_password)
    placed = [(r, (settings.host, settings.broker_amqp_port(b))) for r, b in settings.placement]
    records = load_records(settings)
    wanted = {sc.name for sc in sidecars(settings.topology, settings.ingress)}
    for name in sorted(set(records) - wanted):  # a region, worker or x-ingress instance that is gone
        _stop_one(settings, records, name, say, "not in the topology any more")
    asyncio.run(prepare_database(dsn, settings.regions, say, settings.workers, placed, settings.ingress))
    for sc in sidecars(settings.topology, settings.ingress):
        start(settings, pw, sc, say, records)
    save_records(settings, records)
    wait_ready(settings, pw)


def digest_of(settings: Settings, sc: Sidecar) -> str:
    """The code, the settings passed on, the sidecar's metrics port and its broker nodes: a
    sidecar runs again when one of them changed (not for the regions and workers listed in its
    environment: the roles follow those live)."""
    seen = {**passed_on(), "metrics": settings.metrics_ports()[sc.name], "nodes": cluster_place(settings, sc)}
    return hashlib.sha256((code_digest() + json.dumps(seen, sort_keys=True)).encode()).hexdigest()


def start(settings: Settings, pw: Secrets, sc: Sidecar, say: Say,
          records: dict[str, dict[str, Any]] | None = None) -> bool:
    """Start sidecar `sc` unless it runs with the same digest (restarted if it changed);
    recorded in sidecars.json. True if it was started."""
    records = load_records(settings) if records is None else records
    digest = digest_of(settings, sc)
    rec = records.get(sc.name)
    proc = _process(rec)
    if proc is not None and rec is not None and rec.get("digest") == digest:
        return False
    if proc is not None:
        _stop_one(settings, records, sc.name, say, "code or settings changed")
    records[sc.name] = _launch(settings, pw, sc, digest)
    save_records(settings, records)
    say(f"{sc.name}: started (pid {records[sc.name]['pid']}, log {log_path(settings, sc.name)})")
    return True


def stop(settings: Settings, name: str, say: Say, why: str) -> None:
    """Stop sidecar `name` (drained: SIGTERM, then its drain time) and forget it."""
    _stop_one(settings, load_records(settings), name, say, why)


def log_path(settings: Settings, name: str) -> Path:
    """Where sidecar `name` logs (its stdout and stderr): <log dir>/<name>.log."""
    return settings.log_dir / f"{name}.log"


def spawn(settings: Settings, pw: Secrets, sc: Sidecar,
          overrides: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start sidecar `sc` detached as `up` does (its command, environment and working
    directory, appending to its log) and return the child; `overrides` replace variables of
    its environment (the fault suite points GEOFENCE_AMQP_URL at a TCP proxy). Not recorded
    in sidecars.json: that is the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEOFENCE_")}
    env.update(environment(settings, pw, sc))
    env.update(overrides or {})
    env["PYTHONPATH"] = str(ROOT)
    with log_path(settings, sc.name).open("a") as out:
        return subprocess.Popen(sc.argv(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=str(ROOT), start_new_session=True)


def _launch(settings: Settings, pw: Secrets, sc: Sidecar, digest: str) -> dict[str, Any]:
    proc = spawn(settings, pw, sc)
    ident = identify(proc.pid)
    return {"pid": ident.pid, "start_ticks": ident.start_ticks, "digest": digest}


def _stop_one(settings: Settings, records: dict[str, dict[str, Any]], name: str, say: Say,
              why: str) -> None:
    proc = _process(records.get(name))
    if proc is not None:
        say(f"{name}: stopping ({why})")
        terminate(proc, STOP_TIMEOUT_S, name)
    records.pop(name, None)
    save_records(settings, records)


def down(settings: Settings, say: Say) -> None:
    records = load_records(settings)
    for name in sorted(records):
        _stop_one(settings, records, name, say, "geofence down")


def wait_ready(settings: Settings, pw: Secrets, timeout: float = READY_TIMEOUT_S) -> None:
    """Until every input queue has a consumer (and every sidecar still runs)."""
    asyncio.run(_wait_ready(settings, pw, timeout))


async def _wait_ready(settings: Settings, pw: Secrets, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    missing: list[str] = []
    async with ConsumerProbe(settings, pw) as probe:
        while time.monotonic() < deadline:
            dead = [n for n, ok in running(settings).items() if not ok]
            if dead:
                raise StackError(f"sidecar {', '.join(dead)} exited; see {log_path(settings, dead[0])}")
            missing = await probe.unconsumed(input_queues(settings.topology))
            if not port_open(settings.host, settings.api_port):
                missing.append(f"the fence API on {api_url(settings)}")
            if not missing:
                return
            await asyncio.sleep(0.3)
    raise StackError(f"no consumer on {', '.join(missing)} after {timeout:g}s; see the logs in "
                        f"{settings.log_dir}")
