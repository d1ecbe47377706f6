"""The local single-host stack as a whole: `geofence up`, `geofence down`, `geofence status`.

`up` starts the services (deploy.services) that are not running, records what it started,
applies the pipeline's RabbitMQ topology (deploy.rabbitmq.apply: vhosts, users, permissions,
exchanges, queues, federation, policies, for GEOFENCE_REGIONS / GEOFENCE_WORKERS) and starts
the sidecars (deploy.sidecars). `down` stops the sidecars, then only the services `up` started;
`status` tells what runs and where. `deploy.stack_cmd` is the command-line glue.

Trade-offs: it runs as root on a development / CI machine without systemd (services run as
the users rabbitmq, postgres and nobody); running `up` twice changes nothing.
"""

from __future__ import annotations

import contextlib
import os
import urllib.request
from dataclasses import dataclass

from deploy import broker_cluster, broker_host, sidecars
from deploy.demo import map_roads
from deploy.processes import (
    Say,
    ServiceRecord,
    StackError,
    State,
    is_ours,
    load_state,
    port_open,
    record_for_running,
    save_state,
)
from deploy.rabbitmq import apply as rabbit_topology
from deploy.services import SERVICES, Service
from deploy.settings import (
    FIREBASE_PROJECT,
    METRICS_HOST,
    USER,
    Secrets,
    Settings,
    amqp_url,
    ensure_secrets,
    management_url,
    postgres_dsn,
    read_live_topology,
    write_live_topology,
)
from exchanges.health import WAITING
from exchanges.settings import mask


def require_root() -> None:
    if os.geteuid() != 0:
        raise StackError("must run as root: it starts services as the users rabbitmq, "
                         "postgres and nobody")


def prepare_state_dir(settings: Settings) -> None:
    settings.state_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    settings.log_dir.mkdir(mode=0o755, exist_ok=True)


def up(settings: Settings, say: Say) -> State:
    """Start what is not running; record what we started. Running twice changes nothing."""
    require_root()
    prepare_state_dir(settings)
    pw = ensure_secrets(settings)
    broker_host.tls_setup(settings, say)  # before the servers that read them start
    state = start_services(settings, pw, say)
    for name in broker_cluster.retire(settings, say):  # nodes above GEOFENCE_BROKER_NODES
        state.pop(name, None)
        save_state(settings.state_file, state)
    rabbit_topology.ensure(settings, pw, say)
    if settings.broker_nodes > 1:
        broker_cluster.settle(settings, say)
    map_roads.ensure(settings.map_roads_file)  # before the API reads it
    sidecars.up(settings, pw, say)  # the pipeline's processes, once the broker is set up
    recorded = read_live_topology(settings.state_dir) or {}
    runs = (settings.regions, settings.workers, settings.placement, settings.broker_nodes, settings.ingress)
    if (recorded.get("regions"), recorded.get("workers"), recorded.get("placement", ()),
            recorded.get("broker_nodes", 1), recorded.get("ingress", ())) != runs:
        write_live_topology(settings, settings.regions, settings.workers)  # what runs (see Settings)
    return state


def start_services(settings: Settings, pw: Secrets, say: Say) -> State:
    """The services these settings want (a second RabbitMQ too when a region is placed on
    it) started if they are not running, recorded, configured."""
    previous = load_state(settings.state_file)
    state: State = {}
    launched: list[Service] = []
    wanted = [svc for svc in SERVICES if svc.wanted(settings)]
    for svc in wanted:
        svc.prepare(settings, say)
    for svc in wanted:  # launch all first: they boot in parallel
        if svc.running(settings):
            state[svc.name] = record_for_running(previous.get(svc.name))
            whose = "ours" if state[svc.name].started_by_us else "not started by geofence up"
            say(f"{svc.name}: already running ({whose}), left as is")
        else:
            say(f"{svc.name}: starting")
            svc.launch(settings)
            launched.append(svc)
    for svc in launched:
        proc = svc.await_started(settings)
        state[svc.name] = ServiceRecord(True, proc)
        save_state(settings.state_file, state)  # record at once what we will have to stop
        say(f"{svc.name}: started (pid {proc.pid})")
    save_state(settings.state_file, state)
    for svc in wanted:
        svc.configure(settings, pw, svc in launched)
    for name, record in previous.items():  # services of this stack not wanted now stay recorded
        state.setdefault(name, record)
    save_state(settings.state_file, state)
    return state


def down(settings: Settings, say: Say) -> State:
    """Stop what `up` started (and still runs as that very process); leave the rest alone."""
    require_root()
    sidecars.down(settings, say)
    state = load_state(settings.state_file)
    for svc in reversed(SERVICES):
        record = state.get(svc.name)
        if is_ours(record):
            assert record is not None and record.process is not None
            say(f"{svc.name}: stopping (pid {record.process.pid})")
            svc.stop(settings, record.process)
        elif record is not None and record.started_by_us:
            say(f"{svc.name}: already stopped")
        elif svc.running(settings):
            say(f"{svc.name}: not started by geofence up, left running")
        state.pop(svc.name, None)
        save_state(settings.state_file, state)
    return state


@dataclass(frozen=True)
class StatusRow:
    service: str
    running: bool
    started_by_us: bool
    address: str
    # a running sidecar that does not serve: "NOT CONSUMING" (its session lost its consumer),
    # "no /metrics answer", or why it does not consume on purpose (recovering, paused, standby)
    note: str = ""

    @property
    def serving(self) -> bool:
        return self.running and self.note not in (NOT_CONSUMING, NO_METRICS)


NOT_CONSUMING, NO_METRICS = "NOT CONSUMING", "no /metrics answer"


def consumer_note(metrics_url: str, timeout: float = 2.0) -> str:
    """What a sidecar's /metrics says of its consumer (StatusRow.note): "" when it consumes
    (or has no input queue)."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout) as r:
            text = r.read().decode(errors="replace")
    except (OSError, ValueError):
        return NO_METRICS
    gauges: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name.startswith("geofence_") and not line.startswith("#"):
            with contextlib.suppress(ValueError, IndexError):
                gauges[name.removeprefix("geofence_")] = float(rest.rsplit(" ", 1)[1])
    if gauges.get("consuming", 1.0) == 1.0:
        return ""
    return next((w for w in WAITING if gauges.get(w) == 1.0), NOT_CONSUMING)


@dataclass(frozen=True)
class Status:
    rows: tuple[StatusRow, ...]
    hidden: tuple[str, ...] = ()  # values to mask in human output

    @property
    def all_running(self) -> bool:
        return all(r.serving for r in self.rows)


def status(settings: Settings, pw: Secrets | None) -> Status:
    """What runs, who started it and where. `pw` is None before the first `up`."""
    state = load_state(settings.state_file)
    ours = {svc.name: is_ours(state.get(svc.name)) for svc in SERVICES}
    h = settings.host
    tls_host = h if settings.public_host == "0.0.0.0" else settings.public_host  # the TLS listeners'
    rabbit = amqp_url(settings, pw.rabbitmq_password) if pw else f"amqp://{h}:{settings.amqp_port}"
    pg = postgres_dsn(settings, pw.postgres_password) if pw else f"postgresql://{h}:{settings.pg_port}"
    rows: tuple[StatusRow, ...] = (
        StatusRow("rabbitmq", port_open(h, settings.amqp_port), ours["rabbitmq"], rabbit),
        StatusRow("mqtt", port_open(h, settings.mqtt_port), ours["rabbitmq"],
                  f"mqtt://{h}:{settings.mqtt_port} (login /:{USER})"),
        StatusRow("management", port_open(h, settings.management_port), ours["rabbitmq"],
                  management_url(settings)),
        StatusRow("tls", all(port_open(tls_host, p) for p in (settings.amqps_port, settings.mqtts_port)),
                  ours["rabbitmq"], f"amqps :{settings.amqps_port}, mqtts :{settings.mqtts_port}, "
                  f"api https :{settings.api_tls_port} on {settings.public_host}; clients trust "
                  f"{settings.tls_ca_file}"),
        StatusRow("broker-guard", port_open(METRICS_HOST, settings.guard_port), ours["broker-guard"],
                  f"http://{METRICS_HOST}:{settings.guard_port}/auth/user (every RabbitMQ login), "
                  f"log {settings.log_dir / 'broker-guard.log'}"),
        *((StatusRow("rabbitmq-2", port_open(h, settings.broker_amqp_port(2)), ours["rabbitmq-2"],
                     f"amqp://{h}:{settings.broker_amqp_port(2)} (second node; regions "
                     f"{', '.join(r for r, _ in settings.placement) or 'none yet'}), management "
                     f"http://{h}:{settings.broker_management_port(2)}/"),)
          if settings.broker_count == 2 else ()),
        *(StatusRow(f"rabbitmq-n{n}", port_open(h, settings.node_port(settings.amqp_port, n)),
                    ours[f"rabbitmq-n{n}"], f"amqp://{h}:{settings.node_port(settings.amqp_port, n)}, "
                    f"mqtt :{settings.node_port(settings.mqtt_port, n)} (cluster node {n} of "
                    f"{settings.broker_nodes}, {broker_cluster.node_name(n)}), management "
                    f"http://{h}:{settings.node_port(settings.management_port, n)}/")
          for n in range(2, settings.broker_nodes + 1)),
        StatusRow("postgres", port_open(h, settings.pg_port), ours["postgres"], pg),
        StatusRow("memcached", port_open(h, settings.memcached_port), ours["memcached"],
                  f"{h}:{settings.memcached_port}"),
        StatusRow("firebase-auth", port_open(h, settings.firebase_auth_port), ours["firebase-auth"],
                  f"http://{h}:{settings.firebase_auth_port} (Auth emulator, project {FIREBASE_PROJECT})"),
        StatusRow("prometheus", port_open(h, settings.prometheus_port), ours["prometheus"],
                  f"http://{h}:{settings.prometheus_port} (scrapes every /metrics below)"),
    )
    alive = sidecars.running(settings)
    metrics = settings.metrics_ports()
    urls = {name: f"http://{METRICS_HOST}:{port}/metrics" for name, port in metrics.items()}
    rows += tuple(StatusRow(name, ok, True, f"log {settings.log_dir / (name + '.log')}, metrics {urls[name]}"
                            if name in urls else f"log {settings.log_dir / (name + '.log')}",
                            consumer_note(urls[name]) if ok and name in urls else "")
                  for name, ok in alive.items())
    return Status(rows, pw.values() if pw else ())


def format_status(st: Status) -> str:
    """The human table; passwords masked."""
    header = ("SERVICE", "RUNNING", "STARTED BY US", "ADDRESS")
    body = [(r.service, ("yes" if r.running else "NO") + (f" ({r.note})" if r.note else ""),
             "yes" if r.started_by_us else "no",
             mask(r.address, st.hidden)) for r in st.rows]
    widths = [max(len(row[i]) for row in (header, *body)) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)) + "  " + row[3]
             for row in (header, *body)]
    return "\n".join(lines)
