"""The local stack's settings, its secrets and the connection settings built from both.

- `Settings.from_env()` reads the GEOFENCE_* environment once (nothing is read at import
  time) and the result is passed down. A key it does not know is refused, with the nearest
  known one suggested, so a typo never falls back to a default silently.
- Passwords are generated once (`secrets.json`, mode 600) and handed to tools on stdin,
  never on a command line. Human output masks them; `status --json` prints them, since it is
  how tools get the connection settings (it needs the same root access as the file).
- The sidecar users' passwords live in the same secrets file, generated when missing.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import quote

from deploy.processes import StackError
from deploy.rabbitmq import definitions as rabbit_defs
from exchanges import settings_registry
from exchanges import topology as topo
from exchanges.settings import ConfigError, given, positive

ENV_PREFIX = "GEOFENCE_"
USER = topo.ADMIN_USER  # RabbitMQ user, PostgreSQL role and database: "geofence"
MASK = "****"
FIREBASE_PROJECT = "demo-geofence"  # demo-*: no Google project, no login, offline


class SettingsError(ConfigError):
    """The local stack's GEOFENCE_* environment is wrong."""


class StackNotSetUpError(StackError):
    """`geofence up` never ran with this state dir."""


# --------------------------------------------------------------------------- settings


def _port(key: str, raw: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        raise SettingsError(f"{key}={raw!r}: not a port number") from None
    if not 1 <= port <= 65535:
        raise SettingsError(f"{key}={raw!r}: a port is between 1 and 65535")
    return port


def _abs_path(key: str, raw: str) -> Path:
    path = Path(raw)
    if not path.is_absolute():
        raise SettingsError(f"{key}={raw!r}: must be an absolute path")
    return path


def _ipv4(key: str, raw: str) -> str:
    try:
        return str(ipaddress.IPv4Address(raw))
    except ValueError:
        raise SettingsError(f"{key}={raw!r}: must be an IPv4 address such as 127.0.0.1") from None



def _tile_url(key: str, raw: str) -> str:
    if not raw.startswith(("http://", "https://")) or not all(k in raw for k in ("{z}", "{x}", "{y}")):
        raise SettingsError(f"{key}={raw!r}: a tile URL template, http(s) with {{z}}, {{x}} and {{y}}")
    return raw


def _brokers(key: str, raw: str) -> int:
    if raw not in ("1", "2"):
        raise SettingsError(f"{key}={raw!r}: 1 (one RabbitMQ) or 2 (a second, independent node)")
    return int(raw)


def _broker_nodes(key: str, raw: str) -> int:
    if raw not in ("1", "3"):
        raise SettingsError(f"{key}={raw!r}: 1 (one RabbitMQ node) or 3 (a cluster of three)")
    return int(raw)


def _names(key: str, raw: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(","))
    if not all(names):
        raise SettingsError(f"{key}={raw!r}: a comma-separated list of names such as a,b")
    return names


# GEOFENCE_<KEY> -> (Settings field, parser): how the local stack reads its keys, the ones
# exchanges/settings_registry.py declares for the role "stack" (ENV_KEYS; a unit test holds the
# two equal). A key the stack does not know is rejected, so a typo never falls back to a default
# silently.
_ENV_KEYS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "GEOFENCE_STATE_DIR": ("state_dir", _abs_path),
    "GEOFENCE_HOST": ("host", _ipv4),
    "GEOFENCE_AMQP_PORT": ("amqp_port", _port),
    "GEOFENCE_MQTT_PORT": ("mqtt_port", _port),
    "GEOFENCE_MANAGEMENT_PORT": ("management_port", _port),
    "GEOFENCE_PG_PORT": ("pg_port", _port),
    "GEOFENCE_MEMCACHED_PORT": ("memcached_port", _port),
    "GEOFENCE_API_PORT": ("api_port", _port),
    "GEOFENCE_FIREBASE_AUTH_PORT": ("firebase_auth_port", _port),
    "GEOFENCE_PROMETHEUS_PORT": ("prometheus_port", _port),
    "GEOFENCE_GUARD_PORT": ("guard_port", _port),
    "GEOFENCE_PUBLIC_HOST": ("public_host", _ipv4),
    "GEOFENCE_AMQPS_PORT": ("amqps_port", _port),
    "GEOFENCE_MQTTS_PORT": ("mqtts_port", _port),
    "GEOFENCE_API_TLS_PORT": ("api_tls_port", _port),
    "GEOFENCE_TLS_DIR": ("tls_dir", _abs_path),
    "GEOFENCE_GUARD_FAILED_LOGINS": ("guard_failed_logins", lambda key, raw: positive(key, raw, float)),
    "GEOFENCE_RABBITMQ_METRICS_PORT": ("rabbitmq_metrics_port", _port),
    "GEOFENCE_METRICS_PORT": ("metrics_port", _port),
    "GEOFENCE_PG_BINDIR": ("pg_bindir", _abs_path),
    "GEOFENCE_START_TIMEOUT": ("start_timeout", lambda key, raw: positive(key, raw, float)),
    "GEOFENCE_REGIONS": ("regions", _names),
    "GEOFENCE_WORKERS": ("workers", _names),
    "GEOFENCE_MAP_TILES": ("map_tiles", _tile_url),
    "GEOFENCE_BROKERS": ("brokers", lambda key, raw: _brokers(key, raw)),
    "GEOFENCE_BROKER_NODES": ("broker_nodes", _broker_nodes),
}
ENV_KEYS = settings_registry.keys_for("stack")
WORKER_PORTS = 16  # metrics ports kept for x-fence workers (see Settings.metrics_ports)
INGRESS_PORTS_AT = 64  # x-ingress-N's metrics port: metrics_port + 64 + N
# Every process's /metrics listens on the loopback address, whatever GEOFENCE_HOST says: its
# figures (queue names, counts per role) are the operators', and the Prometheus of the host
# scrapes them there (deploy/monitoring.py)
METRICS_HOST = "127.0.0.1"


def sidecar_ids(topology: topo.Topology, ingress: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(role, instance) of every process `geofence up` runs, in start order (deploy/sidecars.py);
    `ingress`: the x-ingress instances added (`geofence ingress add`: "2", "3", ...)."""
    return [("x-ingress", ""), *(("x-ingress", n) for n in ingress),
            *(("x-geo", r) for r in topology.regions),
            *(("x-fence", w) for w in topology.workers), ("fence-archiver", ""), ("api", ""),
            ("venue-sensors", ""), ("fence-webhooks", "")]


def sidecar_names(topology: topo.Topology, ingress: tuple[str, ...] = ()) -> list[str]:
    return [f"{role}-{instance}" if instance else role for role, instance in sidecar_ids(topology, ingress)]


@dataclass(frozen=True)
class Settings:
    """Where the stack lives and listens. Build it once with `Settings.from_env()`."""

    state_dir: Path = Path("/var/lib/geofence")
    host: str = "127.0.0.1"
    amqp_port: int = 5672
    mqtt_port: int = 1883
    management_port: int = 15672
    pg_port: int = 55432
    memcached_port: int = 11211
    api_port: int = 8080  # the fence API (HTTP), `geofence api`
    firebase_auth_port: int = 9099  # the Firebase Auth emulator
    prometheus_port: int = 9090  # Debian's prometheus, scraping everything below
    guard_port: int = 15680  # the broker's login guard (exchanges/broker_guard.py), loopback
    public_host: str = "0.0.0.0"  # the TLS listeners: AMQPS, MQTTS, the API's HTTPS
    amqps_port: int = 5671
    mqtts_port: int = 8883
    api_tls_port: int = 8443
    tls_dir: Path | None = None  # an operator's own certificates; None: the local CA (deploy/tls.py)

    @property
    def tls_ca_file(self) -> Path:
        """The CA every TLS client of the stack trusts (deploy/tls.py)."""
        return (self.tls_dir or self.state_dir / "tls") / "ca.pem"

    @property
    def tls_cert_file(self) -> Path:
        """The servers' certificate (each server has its copy: deploy/services.server_tls)."""
        return self.tls_ca_file.parent / "server.pem"

    @property
    def tls_key_file(self) -> Path:
        return self.tls_ca_file.parent / "server.key"
    guard_failed_logins: float = 10.0  # failed broker logins a minute per user name
    rabbitmq_metrics_port: int = 15692  # RabbitMQ's rabbitmq_prometheus plugin
    metrics_port: int = 9470  # the first sidecar's /metrics; the others follow (metrics_ports)
    pg_bindir: Path | None = None  # None: the newest /usr/lib/postgresql/*/bin
    start_timeout: float = 120.0
    regions: tuple[str, ...] = topo.Topology.regions  # x-geo regions (vhosts gf-region-<r>)
    workers: tuple[str, ...] = topo.Topology.workers  # x-fence workers
    map_tiles: str | None = None  # /map's background tiles where there is internet (else the roads)
    # RabbitMQ nodes of the local stack: 1, or 2 (a second, independent node on the next
    # ports, not clustered: regions placed on it are federated to the first over AMQP)
    brokers: int = 1
    placement: tuple[tuple[str, int], ...] = ()  # regions not on broker 1: (region, broker)
    ingress: tuple[str, ...] = ()  # x-ingress instances added live ("2", "3", ...: x-ingress-2, ...)
    # the first broker's cluster: 1 node, or 3 (deploy/broker_cluster.py)
    broker_nodes: int = 1

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        try:
            env = given(environ, {*ENV_KEYS, *topo.SIDECAR_ENV_KEYS})
        except ConfigError as exc:
            raise SettingsError(str(exc)) from None
        try:
            values = {name: parse(key, env[key]) for key, (name, parse) in _ENV_KEYS.items() if key in env}
        except SettingsError:
            raise
        except ConfigError as exc:  # a check of exchanges/settings.py: this stack's error all the same
            raise SettingsError(str(exc)) from None
        # GEOFENCE_REGIONS / _WORKERS, when set, say what the stack runs; unset, it runs what
        # was recorded last (by `geofence up` or a live `geofence region` change), else the
        # defaults
        live = read_live_topology(Path(values.get("state_dir", cls.state_dir)))
        for name in ("regions", "workers"):
            if live is not None and name not in values:
                values[name] = live[name]
        if live is not None:
            values["placement"] = tuple((r, b) for r, b in live.get("placement", ())
                                        if r in values.get("regions", cls.regions))
            if "broker_nodes" not in values and "broker_nodes" in live:
                values["broker_nodes"] = live["broker_nodes"]
            values["ingress"] = live.get("ingress", ())
        settings = cls(**values)
        try:
            _ = settings.topology  # validates the region and worker names
        except ValueError as exc:
            raise SettingsError(f"GEOFENCE_REGIONS / GEOFENCE_WORKERS: {exc}") from None
        settings.check_ports_distinct()  # the sidecars' metrics ports need the topology
        return settings

    @property
    def topology(self) -> topo.Topology:
        return topo.Topology(regions=self.regions, workers=self.workers)

    @property
    def broker_count(self) -> int:
        """The RabbitMQ nodes the stack runs: GEOFENCE_BROKERS, or 2 while a region is placed
        on the second."""
        return 2 if self.brokers == 2 or self.placement else 1

    def broker_of(self, region: str) -> int:
        return dict(self.placement).get(region, 1)

    def broker_amqp_port(self, broker: int) -> int:
        return self.amqp_port + broker - 1

    def broker_management_port(self, broker: int) -> int:
        return self.management_port + broker - 1

    def broker_metrics_port(self, broker: int) -> int:
        return self.rabbitmq_metrics_port + broker - 1

    def node_port(self, base: int, node: int) -> int:
        """Node `node` (1..broker_nodes) of the first broker's cluster: its port for the
        service whose first node's port is `base` (the next nodes 100 ports up each)."""
        return base + 100 * (node - 1)

    def vhost_port(self, vhost: str) -> int:
        """The AMQP port of the node that holds `vhost`."""
        if vhost.startswith(topo.REGION_VHOST_PREFIX):
            return self.broker_amqp_port(self.broker_of(vhost.removeprefix(topo.REGION_VHOST_PREFIX)))
        return self.amqp_port

    def check_ports_distinct(self) -> None:
        ports = self.ports()
        if len(set(ports.values())) != len(ports):
            raise SettingsError(f"two services on one port: {ports}")

    def ports(self) -> dict[str, int]:
        return {"amqp": self.amqp_port, "mqtt": self.mqtt_port,
                "management": self.management_port, "postgres": self.pg_port,
                "memcached": self.memcached_port, "api": self.api_port,
                "firebase-auth": self.firebase_auth_port, "prometheus": self.prometheus_port,
                "rabbitmq-metrics": self.rabbitmq_metrics_port, "broker-guard": self.guard_port,
                "amqps": self.amqps_port, "mqtts": self.mqtts_port, "api (https)": self.api_tls_port,
                **({"amqp (broker 2)": self.broker_amqp_port(2),
                    "management (broker 2)": self.broker_management_port(2),
                    "rabbitmq-metrics (broker 2)": self.broker_metrics_port(2)}
                   if self.broker_count == 2 else {}),
                **{f"{what} (node {n})": self.node_port(base, n) for n in range(2, self.broker_nodes + 1)
                   for what, base in (("amqp", self.amqp_port), ("mqtt", self.mqtt_port),
                                      ("management", self.management_port),
                                      ("rabbitmq-metrics", self.rabbitmq_metrics_port))},
                **{f"{name} metrics": port for name, port in self.metrics_ports().items()}}

    def metrics_ports(self) -> dict[str, int]:
        """Each sidecar's /metrics port (sidecar name -> port) from metrics_port up: the
        single roles, then a block of WORKER_PORTS for the workers, then the regions; so a
        worker or region added live (appended) moves no running sidecar's port (unless the
        workers outgrow their block)."""
        names = sidecar_names(self.topology)
        single = [n for n in names if not n.startswith(("x-fence-", "x-geo-"))]
        # x-ingress instances added live: a fixed block of their own, INGRESS_PORTS_AT on
        ports_of_added = {f"x-ingress-{n}": self.metrics_port + INGRESS_PORTS_AT + int(n)
                          for n in self.ingress}
        workers = [n for n in names if n.startswith("x-fence-")]
        regions = [n for n in names if n.startswith("x-geo-")]
        ports = {name: self.metrics_port + i for i, name in enumerate(single)}
        ports.update({name: self.metrics_port + len(single) + i for i, name in enumerate(workers)})
        first = self.metrics_port + len(single) + max(WORKER_PORTS, len(workers))
        ports.update({name: first + i for i, name in enumerate(regions)})
        return {**ports, **ports_of_added}

    @property
    def map_roads_file(self) -> Path:
        """The live map's roads (deploy/demo/map_roads.py writes it at `up`)."""
        return self.state_dir / "web" / "roads.geojson"

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def progress_file(self) -> Path:
        """How many steps each live operation took last time (deploy/progress.Steps)."""
        return self.state_dir / "progress.json"

    @property
    def secrets_file(self) -> Path:
        return self.state_dir / "secrets.json"

    @property
    def pg_dir(self) -> Path:
        return self.state_dir / "pg"

    @property
    def pg_data(self) -> Path:
        return self.pg_dir / "data"

    @property
    def pg_socket_dir(self) -> Path:
        return self.pg_dir / "run"

    @property
    def pg_log(self) -> Path:
        return self.pg_dir / "postgres.log"

    @property
    def memcached_dir(self) -> Path:
        return self.state_dir / "memcached"

    @property
    def memcached_pid_file(self) -> Path:
        return self.memcached_dir / "memcached.pid"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"



# --------------------------------------------------------------------------- live topology

LIVE_TOPOLOGY_FILE = "topology.json"


def read_live_topology(state_dir: Path) -> dict[str, Any] | None:
    """The regions and workers `geofence region` / `geofence worker` left the stack with,
    and the regions placed on the second broker ("placement": (region, broker) pairs)
    (None: never changed live, GEOFENCE_REGIONS / _WORKERS or their defaults hold)."""
    path = state_dir / LIVE_TOPOLOGY_FILE
    try:
        data = json.loads(path.read_text())
        out: dict[str, Any] = {k: tuple(str(n) for n in data[k]) for k in ("regions", "workers")}
        placed = data.get("placement", {})
        if placed:
            out["placement"] = tuple(sorted((str(r), int(b)) for r, b in placed.items()))
        if "broker_nodes" in data:
            out["broker_nodes"] = _broker_nodes("broker_nodes", str(data["broker_nodes"]))
        out["ingress"] = tuple(str(int(n)) for n in data.get("ingress", ()))
        return out
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise SettingsError(f"{path} is damaged ({type(exc).__name__}: {exc}); it lists the regions "
                            "and workers the stack runs: repair it") from None


def overriding(key: str, what: str) -> str | None:
    """Why a live change of the stack's `what` (regions, workers) is refused: `key` set in
    the environment would override what the change records (None: it is not set)."""
    if settings_registry.read(key):
        return (f"{key} is set, and it would override the {what} this command records: unset it "
                f"(the stack keeps its {what} in its state dir)")
    return None


def write_live_topology(settings: Settings, regions: tuple[str, ...], workers: tuple[str, ...],
                        placement: tuple[tuple[str, int], ...] | None = None,
                        ingress: tuple[str, ...] | None = None) -> Settings:
    """Record the stack's regions and workers, where regions are placed and the x-ingress
    instances added (kept as they are unless given; a region gone loses its place) (written
    whole, then renamed); the settings with them."""
    placed = tuple((r, b) for r, b in (settings.placement if placement is None else placement)
                   if r in regions and b != 1)
    added = settings.ingress if ingress is None else tuple(ingress)
    new = replace(settings, regions=tuple(regions), workers=tuple(workers), placement=placed, ingress=added)
    _ = new.topology  # validates the names
    path = settings.state_dir / LIVE_TOPOLOGY_FILE
    tmp = path.with_suffix(".tmp")
    body: dict[str, Any] = {"regions": list(regions), "workers": list(workers)}
    if placed:
        body["placement"] = dict(placed)
    if settings.broker_nodes != 1:
        body["broker_nodes"] = settings.broker_nodes
    if added:
        body["ingress"] = list(added)
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    os.replace(tmp, path)
    return new


# --------------------------------------------------------------------------- secrets


@dataclass(frozen=True)
class Secrets:
    rabbitmq_password: str
    postgres_password: str
    users: dict[str, str] = field(default_factory=dict)  # sidecar RabbitMQ user -> password

    def values(self) -> tuple[str, ...]:
        return (self.rabbitmq_password, self.postgres_password, *self.users.values())


def load_secrets(settings: Settings) -> Secrets:
    path = settings.secrets_file
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise StackNotSetUpError(f"no {path}: run `geofence up` first") from None
    except PermissionError:
        raise StackError(f"cannot read {path}: it is readable by root only") from None
    except json.JSONDecodeError as exc:
        raise StackError(f"{path} is not JSON ({exc}): delete it and run `geofence up`") from None
    try:
        users = data.get("users", {})
        return Secrets(str(data["rabbitmq_password"]), str(data["postgres_password"]),
                       {str(k): str(v) for k, v in users.items()})
    except (KeyError, TypeError, AttributeError):
        raise StackError(f"{path} lacks a password: delete it and run `geofence up`") from None


def _write_secrets(path: Path, pw: Secrets) -> None:
    """Written whole (a temporary file renamed over the old one), mode 600 from the start."""
    body = json.dumps({"rabbitmq_password": pw.rabbitmq_password,
                       "postgres_password": pw.postgres_password,
                       "users": dict(sorted(pw.users.items()))}, indent=2)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(body + "\n")
    os.replace(tmp, path)


def ensure_secrets(settings: Settings) -> Secrets:
    """Load the passwords, generating the missing ones (mode 600) once: the first time, and
    the sidecar users' when an older secrets file lacks them."""
    path = settings.secrets_file
    if not path.exists():
        _write_secrets(path, Secrets(secrets.token_urlsafe(24), secrets.token_urlsafe(24)))
    os.chmod(path, 0o600)
    pw = load_secrets(settings)
    missing = [u for u in rabbit_defs.SIDECAR_USERS if u not in pw.users]
    if missing:
        users = {**pw.users, **{u: secrets.token_urlsafe(24) for u in missing}}
        _write_secrets(path, Secrets(pw.rabbitmq_password, pw.postgres_password, users))
        pw = load_secrets(settings)
    return pw



# --------------------------------------------------------------------------- connection settings


class MqttSettings(TypedDict):
    host: str
    port: int
    username: str
    password: str
    ingress_vhost: str  # devices log in as "<ingress_vhost>:<object_id>"
    nodes: list[list[str | int]]  # [host, port] of each node of the first broker's cluster


class PostgresSettings(TypedDict):
    dsn: str


class MemcachedSettings(TypedDict):
    host: str
    port: int


class ManagementSettings(TypedDict):
    url: str


class FirebaseSettings(TypedDict):
    project: str
    auth_emulator_host: str  # FIREBASE_AUTH_EMULATOR_HOST


class ConnectionSettings(TypedDict):
    """What `geofence status --json` prints. `amqp` maps a vhost to the administrator's URL
    ("/" and every vhost of the topology); `users` maps a sidecar user to its URL per vhost."""

    amqp: dict[str, str]
    amqp_nodes: list[list[str | int]]  # [host, port] of each node of the first broker's cluster
    users: dict[str, dict[str, str]]
    mqtt: MqttSettings
    postgres: PostgresSettings
    memcached: MemcachedSettings
    management: ManagementSettings
    api: str | None
    metrics: dict[str, str]  # sidecar name -> its /metrics URL
    rabbitmq_metrics: str
    prometheus: str
    firebase: FirebaseSettings
    state_dir: str


def amqp_url(settings: Settings, password: str, vhost: str = "/", user: str = USER) -> str:
    """The URL of `vhost` on the node that holds it."""
    return (f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@{settings.host}:"
            f"{settings.vhost_port(vhost)}/{quote(vhost, safe='')}")


def sidecar_amqp_url(settings: Settings, user: str, password: str, name: str, broker: int = 1,
                     node: int = 1) -> str:
    """A process's broker URL: its user, and `name` as the connection's name in RabbitMQ. On
    this host's loopback, plain (to `node` of the first broker's cluster); to another host's
    broker (a second host's files, `geofence host render`), AMQPS with the stack's CA (the
    first node's TLS listener)."""
    who, named = f"{quote(user, safe='')}:{quote(password, safe='')}", f"?name={quote(name, safe='')}"
    if broker != 1 or ipaddress.ip_address(settings.host).is_loopback:
        port = (settings.node_port(settings.amqp_port, node) if broker == 1
                else settings.broker_amqp_port(broker))
        return f"amqp://{who}@{settings.host}:{port}/{named}"
    return (f"amqps://{who}@{settings.host}:{settings.amqps_port}/{named}"
            f"&cafile={quote(str(settings.tls_ca_file), safe='')}")


def user_urls(settings: Settings, pw: Secrets) -> dict[str, dict[str, str]]:
    """{sidecar user: {vhost: AMQP URL}} for the users whose passwords are known."""
    return {user: {v: amqp_url(settings, pw.users[user], v, user) for v in vhosts}
            for user, vhosts in rabbit_defs.user_vhosts(settings.topology).items()
            if user in pw.users}


def postgres_dsn(settings: Settings, password: str) -> str:
    """Over TLS, the server's certificate checked against the stack's CA and its name
    (verify-full): the server refuses plain TCP (deploy/services.pg_hba_text)."""
    return (f"postgresql://{USER}:{quote(password, safe='')}@{settings.host}:{settings.pg_port}"
            f"/{USER}?sslmode=verify-full&sslrootcert={quote(str(settings.tls_ca_file), safe='/')}")


def management_url(settings: Settings) -> str:
    return f"http://{settings.host}:{settings.management_port}/"


def connection_settings(settings: Settings, pw: Secrets) -> ConnectionSettings:
    return {
        "amqp": {v: amqp_url(settings, pw.rabbitmq_password, v)
                 for v in ("/", *settings.topology.vhosts)},
        "users": user_urls(settings, pw),
        "mqtt": {"host": settings.host, "port": settings.mqtt_port,
                 "username": f"/:{USER}", "password": pw.rabbitmq_password,
                 "ingress_vhost": topo.INGRESS_VHOST,
                 "nodes": [[settings.host, settings.node_port(settings.mqtt_port, n)]
                           for n in range(1, settings.broker_nodes + 1)]},
        # the first broker's cluster, node 1 first (the URLs above are node 1's)
        "amqp_nodes": [[settings.host, settings.node_port(settings.amqp_port, n)]
                       for n in range(1, settings.broker_nodes + 1)],
        "postgres": {"dsn": postgres_dsn(settings, pw.postgres_password)},
        "memcached": {"host": settings.host, "port": settings.memcached_port},
        "management": {"url": management_url(settings)},
        "api": f"http://{settings.host}:{settings.api_port}",
        "metrics": {name: f"http://{METRICS_HOST}:{port}/metrics"
                    for name, port in settings.metrics_ports().items()},
        "rabbitmq_metrics": f"http://{settings.host}:{settings.rabbitmq_metrics_port}/metrics",
        "prometheus": f"http://{settings.host}:{settings.prometheus_port}",
        "firebase": {"project": FIREBASE_PROJECT,
                     "auth_emulator_host": f"{settings.host}:{settings.firebase_auth_port}"},
        "state_dir": str(settings.state_dir),
    }


def load_connection_settings(settings: Settings | None = None) -> ConnectionSettings:
    """The connection settings of the local stack, as `geofence status --json` prints them."""
    settings = Settings.from_env() if settings is None else settings
    return connection_settings(settings, load_secrets(settings))


