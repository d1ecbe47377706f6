"""The local single-host stack: RabbitMQ, PostgreSQL and memcached, started by hand.

`geofence up` starts what is not running, `geofence down` stops only what `up` started and
`geofence status [--json]` tells what runs and how to connect. This module holds the logic;
`deploy.local_stack_cmd` is the command-line glue. Nothing happens at import time: settings
are read from the environment once, by `Settings.from_env()`, and passed down.

Trade-offs, chosen for a development / CI machine without systemd:

- RabbitMQ is the machine's own node (Debian package, `/var/lib/rabbitmq`, node
  `rabbit@<host>`), not a private one, so the `rabbitmqctl` an operator types and the scripts
  in `deploy/rabbitmq/` talk to the same broker. The price: its users, vhosts and queues
  outlive `geofence down`, and a node somebody else started is used as it is (we only add our
  user, and enable the plugins online if its MQTT port is closed). Its listeners are bound to
  GEOFENCE_HOST through environment variables, so /etc/rabbitmq is never edited; epmd and the
  Erlang distribution port still listen on all interfaces (binding them to loopback breaks
  `rabbitmqctl` wherever the host name does not resolve to loopback). epmd, started by the
  node, is left running by `down`: it is shared by every Erlang node on the machine.
- RabbitMQ's `guest` is left alone: it can only log in from loopback, and a node started by
  an operator may rely on it. Our user `geofence` is an administrator with full permissions
  on `/`; MQTT clients log in as `/:geofence` (the plugin's `vhost:username` form).
- PostgreSQL is a private cluster under the state dir, on its own port and socket directory,
  so it never meets Debian's cluster on 5432 and goes away with the state dir.
- "Running" is a TCP connect (cheap, no subprocess, the test a client makes); "ours" is a pid
  plus the process start time recorded in state.json, so `down` never stops a process it did
  not start, even after its pid was reused.
- Passwords are generated once (`secrets.json`, mode 600) and handed to tools on stdin, never
  on a command line. Human output masks them; `status --json` prints them, since it is how
  tools get the connection settings (it needs the same root access as the file).
- Every wait polls with a deadline (GEOFENCE_START_TIMEOUT); there are no fixed sleeps.
- After the services, `up` applies the pipeline's RabbitMQ topology (deploy/rabbitmq/: vhosts,
  users, permissions, exchanges, queues, federation, policies) for the regions and workers of
  GEOFENCE_REGIONS / GEOFENCE_WORKERS (comma-separated; default a,b and w0,w1). The sidecar
  users' passwords are generated once, into the same secrets file.
"""

from __future__ import annotations

import base64
import difflib
import functools
import ipaddress
import json
import os
import pwd
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import quote

from deploy.rabbitmq import definitions as rabbit_defs
from exchanges import topology as topo

ENV_PREFIX = "GEOFENCE_"
USER = topo.ADMIN_USER  # RabbitMQ user, PostgreSQL role and database: "geofence"
MASK = "****"
PLUGINS = ("rabbitmq_mqtt", "rabbitmq_federation", "rabbitmq_management", "rabbitmq_shovel")
ENABLED_PLUGINS_FILE = Path("/etc/rabbitmq/enabled_plugins")
RABBITMQ_LOG_DIR = Path("/var/log/rabbitmq")
POLL_INTERVAL = 0.2


class SettingsError(ValueError):
    """The GEOFENCE_* environment is wrong."""


class StackError(RuntimeError):
    """A service could not be started, stopped or reached."""


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


def _seconds(key: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{key}={raw!r}: not a number of seconds") from None
    if not value > 0:
        raise SettingsError(f"{key}={raw!r}: must be positive")
    return value


def _names(key: str, raw: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in raw.split(","))
    if not all(names):
        raise SettingsError(f"{key}={raw!r}: a comma-separated list of names such as a,b")
    return names


# GEOFENCE_<KEY> -> (Settings field, parser). The one registry of the keys the local stack
# accepts: a key missing here is rejected, so a typo never falls back to a default silently.
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
    "GEOFENCE_PG_BINDIR": ("pg_bindir", _abs_path),
    "GEOFENCE_START_TIMEOUT": ("start_timeout", _seconds),
    "GEOFENCE_REGIONS": ("regions", _names),
    "GEOFENCE_WORKERS": ("workers", _names),
}
ENV_KEYS = tuple(_ENV_KEYS)


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
    pg_bindir: Path | None = None  # None: the newest /usr/lib/postgresql/*/bin
    start_timeout: float = 120.0
    regions: tuple[str, ...] = topo.Topology.regions  # x-geo regions (vhosts gf-region-<r>)
    workers: tuple[str, ...] = topo.Topology.workers  # x-fence workers

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        given = {k: v for k, v in env.items() if k.startswith(ENV_PREFIX)}
        unknown = sorted(set(given) - set(_ENV_KEYS) - set(topo.SIDECAR_ENV_KEYS))
        if unknown:
            raise SettingsError(_unknown_keys_message(unknown))
        values = {name: parse(key, given[key]) for key, (name, parse) in _ENV_KEYS.items()
                  if key in given}
        settings = cls(**values)
        settings.check_ports_distinct()
        try:
            _ = settings.topology  # validates the region and worker names
        except ValueError as exc:
            raise SettingsError(f"GEOFENCE_REGIONS / GEOFENCE_WORKERS: {exc}") from None
        return settings

    @property
    def topology(self) -> topo.Topology:
        return topo.Topology(regions=self.regions, workers=self.workers)

    def check_ports_distinct(self) -> None:
        ports = self.ports()
        if len(set(ports.values())) != len(ports):
            raise SettingsError(f"two services on one port: {ports}")

    def ports(self) -> dict[str, int]:
        return {"amqp": self.amqp_port, "mqtt": self.mqtt_port,
                "management": self.management_port, "postgres": self.pg_port,
                "memcached": self.memcached_port, "api": self.api_port,
                "firebase-auth": self.firebase_auth_port}

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

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


def _unknown_keys_message(unknown: Sequence[str]) -> str:
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key, list(_ENV_KEYS), n=1)
        parts.append(f"{key} (did you mean {close[0]}?)" if close else key)
    known = ", ".join(sorted(_ENV_KEYS))
    return f"unknown setting {', '.join(parts)}; known {ENV_PREFIX}* keys: {known}"


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


def mask(text: str, hidden: Iterable[str]) -> str:
    """`text` with every secret (plain or URL-quoted) replaced by ****."""
    variants = {v for s in hidden if s for v in (s, quote(s, safe=""))}
    for value in sorted(variants, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


# --------------------------------------------------------------------------- connection settings


class MqttSettings(TypedDict):
    host: str
    port: int
    username: str
    password: str
    ingress_vhost: str  # devices log in as "<ingress_vhost>:<object_id>"


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
    users: dict[str, dict[str, str]]
    mqtt: MqttSettings
    postgres: PostgresSettings
    memcached: MemcachedSettings
    management: ManagementSettings
    api: str | None
    firebase: FirebaseSettings
    state_dir: str


def amqp_url(settings: Settings, password: str, vhost: str = "/", user: str = USER) -> str:
    return (f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@{settings.host}:"
            f"{settings.amqp_port}/{quote(vhost, safe='')}")


def user_urls(settings: Settings, pw: Secrets) -> dict[str, dict[str, str]]:
    """{sidecar user: {vhost: AMQP URL}} for the users whose passwords are known."""
    return {user: {v: amqp_url(settings, pw.users[user], v, user) for v in vhosts}
            for user, vhosts in rabbit_defs.user_vhosts(settings.topology).items()
            if user in pw.users}


def postgres_dsn(settings: Settings, password: str) -> str:
    return (f"postgresql://{USER}:{quote(password, safe='')}@{settings.host}:{settings.pg_port}"
            f"/{USER}")


def management_url(settings: Settings) -> str:
    return f"http://{settings.host}:{settings.management_port}/"


def connection_settings(settings: Settings, pw: Secrets) -> ConnectionSettings:
    return {
        "amqp": {v: amqp_url(settings, pw.rabbitmq_password, v)
                 for v in ("/", *settings.topology.vhosts)},
        "users": user_urls(settings, pw),
        "mqtt": {"host": settings.host, "port": settings.mqtt_port,
                 "username": f"/:{USER}", "password": pw.rabbitmq_password,
                 "ingress_vhost": topo.INGRESS_VHOST},
        "postgres": {"dsn": postgres_dsn(settings, pw.postgres_password)},
        "memcached": {"host": settings.host, "port": settings.memcached_port},
        "management": {"url": management_url(settings)},
        "api": f"http://{settings.host}:{settings.api_port}",
        "firebase": {"project": FIREBASE_PROJECT,
                     "auth_emulator_host": f"{settings.host}:{settings.firebase_auth_port}"},
        "state_dir": str(settings.state_dir),
    }


def load_connection_settings(settings: Settings | None = None) -> ConnectionSettings:
    """The connection settings of the local stack, as `geofence status --json` prints them."""
    settings = Settings.from_env() if settings is None else settings
    return connection_settings(settings, load_secrets(settings))


# --------------------------------------------------------------------------- processes and state


@dataclass(frozen=True)
class ProcessId:
    """A process, told apart from a later one that reuses its pid by its start time."""

    pid: int
    start_ticks: int


@dataclass(frozen=True)
class ServiceRecord:
    started_by_us: bool
    process: ProcessId | None = None


State = dict[str, ServiceRecord]
Lookup = Callable[[int], ProcessId | None]


def parse_proc_stat(text: str) -> tuple[str, int]:
    """(state letter, start time in clock ticks) from the text of /proc/<pid>/stat."""
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and ')'
    return fields[0], int(fields[19])


def process_identity(pid: int) -> ProcessId | None:
    """The live process `pid`, or None when it is gone (a zombie counts as gone)."""
    try:
        state, start = parse_proc_stat(Path(f"/proc/{pid}/stat").read_text())
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return None
    return None if state in ("Z", "X") else ProcessId(pid, start)


def identify(pid: int) -> ProcessId:
    found = process_identity(pid)
    if found is None:
        raise StackError(f"process {pid} vanished right after it started")
    return found


def is_ours(record: ServiceRecord | None, lookup: Lookup = process_identity) -> bool:
    """True if `up` started this service and that very process still runs."""
    if record is None or not record.started_by_us or record.process is None:
        return False
    return lookup(record.process.pid) == record.process


def record_for_running(previous: ServiceRecord | None,
                       lookup: Lookup = process_identity) -> ServiceRecord:
    """The record of a service found already running: ours as before, or somebody else's."""
    if previous is not None and is_ours(previous, lookup):
        return previous
    return ServiceRecord(started_by_us=False)


def state_to_json(state: State) -> dict[str, Any]:
    services: dict[str, Any] = {}
    for name, rec in sorted(state.items()):
        proc = rec.process
        services[name] = {"started_by_us": rec.started_by_us,
                          "pid": proc.pid if proc else None,
                          "start_ticks": proc.start_ticks if proc else None}
    return {"version": 1, "services": services}


def state_from_json(data: Any) -> State:
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict):
        raise ValueError("expected {'version': 1, 'services': {...}}")
    state: State = {}
    for name, raw in data["services"].items():
        pid, ticks = raw.get("pid"), raw.get("start_ticks")
        proc = ProcessId(int(pid), int(ticks)) if pid is not None and ticks is not None else None
        state[str(name)] = ServiceRecord(bool(raw["started_by_us"]), proc)
    return state


def load_state(path: Path) -> State:
    try:
        return state_from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StackError(f"{path} is damaged ({exc}); fix or delete it") from None


def save_state(path: Path, state: State) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state_to_json(state), indent=2) + "\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------- small helpers


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            raise StackError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(POLL_INTERVAL)


def run(argv: Sequence[str], *, stdin: str | None = None, env: Mapping[str, str] | None = None,
        timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a tool, output captured; cwd is / so that `runuser -u postgres` finds no fault."""
    try:
        proc = subprocess.run(list(argv), input=stdin if stdin is not None else "", env=env,
                              cwd="/", capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise StackError(f"{argv[0]} not found: run `bash deploy/setup.sh`") from None
    except subprocess.TimeoutExpired:
        raise StackError(f"`{' '.join(argv)}` still running after {timeout:g}s") from None
    if check and proc.returncode != 0:
        raise StackError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): "
                         f"{_tail(proc.stderr or proc.stdout)}")
    return proc


def launch(argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> None:
    """Start a daemonising tool. Its output goes to `log`, never to a pipe that the daemon
    could inherit and keep open."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        try:
            rc = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd="/", timeout=120).returncode
        except FileNotFoundError:
            raise StackError(f"{argv[0]} not found: run `bash deploy/setup.sh`") from None
    if rc != 0:
        raise StackError(f"`{' '.join(argv)}` failed (exit {rc}): {_tail(log.read_text())}")


def _tail(text: str, lines: int = 8) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


def _log_tail(path: Path) -> str:
    try:
        return f"; last lines of {path}: {_tail(path.read_text(errors='replace'))}"
    except OSError:
        return ""


def chown(path: Path, user: str) -> None:
    """Give `path` to `user` and that user's primary group."""
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def terminate(proc: ProcessId, timeout: float, what: str) -> None:
    """SIGTERM, wait until gone, SIGKILL at the deadline."""
    try:
        os.kill(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        wait_gone(proc, timeout, what)
    except StackError:
        if process_identity(proc.pid) == proc:
            os.kill(proc.pid, signal.SIGKILL)
        wait_gone(proc, 10, what)


def wait_gone(proc: ProcessId, timeout: float, what: str) -> None:
    wait_until(lambda: process_identity(proc.pid) != proc, timeout, f"{what} to exit")


# --------------------------------------------------------------------------- RabbitMQ


def rabbitmq_env(settings: Settings) -> dict[str, str]:
    """Listeners on GEOFENCE_HOST and the configured ports, without touching /etc/rabbitmq."""
    h, mqtt, web = settings.host, settings.mqtt_port, settings.management_port
    erl_args = (f'-rabbitmq_mqtt tcp_listeners [{{"{h}",{mqtt}}}] '
                f'-rabbitmq_management tcp_config [{{ip,"{h}"}},{{port,{web}}}]')
    return {**os.environ, "RABBITMQ_NODE_IP_ADDRESS": h,
            "RABBITMQ_NODE_PORT": str(settings.amqp_port),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": erl_args}


def missing_plugins(enabled_plugins_text: str) -> list[str]:
    """Plugins of PLUGINS absent from an `enabled_plugins` file (an Erlang list)."""
    body = enabled_plugins_text.strip().rstrip(".").strip("[]")
    enabled = {p.strip() for p in body.split(",")}
    return [p for p in PLUGINS if p not in enabled]


def rabbitmq_enable_plugins_offline() -> None:
    try:
        text = ENABLED_PLUGINS_FILE.read_text()
    except FileNotFoundError:
        text = ""
    if missing_plugins(text):
        run(["rabbitmq-plugins", "enable", "--offline", *PLUGINS])


def rabbitmq_running(settings: Settings) -> bool:
    return port_open(settings.host, settings.amqp_port)


def rabbitmq_launch(settings: Settings) -> None:
    rabbitmq_enable_plugins_offline()
    launch(["rabbitmq-server", "-detached"], settings.log_dir / "rabbitmq-launch.log",
           env=rabbitmq_env(settings))


def rabbitmq_await(settings: Settings) -> ProcessId:
    """`rabbitmqctl await_startup` fails at once until the node is known to epmd: poll it."""
    deadline = time.monotonic() + settings.start_timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StackError(f"RabbitMQ did not start within {settings.start_timeout:g}s; "
                             f"see {RABBITMQ_LOG_DIR}/ and {settings.log_dir}/rabbitmq-launch.log")
        proc = run(["rabbitmqctl", "await_startup", "--timeout", str(max(1, int(left)))],
                   check=False, timeout=left + 30)
        if proc.returncode == 0:
            break
        time.sleep(POLL_INTERVAL)
    _await_rabbitmq_listeners(settings)
    return identify(rabbitmq_pid())


def _await_rabbitmq_listeners(settings: Settings) -> None:
    for port in (settings.amqp_port, settings.mqtt_port, settings.management_port):
        wait_until(functools.partial(port_open, settings.host, port), settings.start_timeout,
                   f"RabbitMQ to listen on {settings.host}:{port}")


def rabbitmq_pid() -> int:
    out = run(["rabbitmqctl", "eval", "list_to_integer(os:getpid())."]).stdout
    return int(out.strip().splitlines()[-1])


def rabbitmq_configure(settings: Settings, pw: Secrets, started_now: bool) -> None:
    if not started_now and not port_open(settings.host, settings.mqtt_port):
        # A node started elsewhere without our plugins: enable them on the running node.
        run(["rabbitmqctl", "await_startup", "--timeout", str(int(settings.start_timeout))])
        run(["rabbitmq-plugins", "enable", *PLUGINS], timeout=settings.start_timeout)
        _await_rabbitmq_listeners(settings)
    if not rabbitmq_user_ok(settings, pw):
        rabbitmq_set_user(pw)


def _http_get_json(url: str, user: str, password: str) -> Any:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def rabbitmq_user_ok(settings: Settings, pw: Secrets) -> bool:
    """Fast path through the management API: our user logs in, is an administrator and has
    full permissions on `/`."""
    base = management_url(settings) + "api/"
    who = _http_get_json(base + "whoami", USER, pw.rabbitmq_password)
    tags = who.get("tags", []) if isinstance(who, dict) else []
    if "administrator" not in (tags.split(",") if isinstance(tags, str) else tags):
        return False
    perms = _http_get_json(base + f"permissions/%2F/{USER}", USER, pw.rabbitmq_password)
    return isinstance(perms, dict) and all(perms.get(k) == ".*"
                                           for k in ("configure", "write", "read"))


def rabbitmq_set_user(pw: Secrets) -> None:
    listed = run(["rabbitmqctl", "-q", "list_users", "--formatter", "json"]).stdout
    exists = any(u.get("user") == USER for u in json.loads(listed or "[]"))
    verb = "change_password" if exists else "add_user"
    run(["rabbitmqctl", verb, USER], stdin=pw.rabbitmq_password + "\n")  # password on stdin
    run(["rabbitmqctl", "set_user_tags", USER, "administrator"])
    run(["rabbitmqctl", "set_permissions", "-p", "/", USER, ".*", ".*", ".*"])


def rabbitmq_stop(settings: Settings, proc: ProcessId) -> None:
    run(["rabbitmqctl", "stop"], timeout=settings.start_timeout)
    wait_gone(proc, settings.start_timeout, "RabbitMQ")


# --------------------------------------------------------------------------- PostgreSQL


def pg_bindir(settings: Settings) -> Path:
    if settings.pg_bindir is not None:
        return settings.pg_bindir
    found = [p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/initdb")]
    numeric = [p for p in found if p.parent.name.isdigit()]
    if not numeric:
        raise StackError("no /usr/lib/postgresql/*/bin/initdb: run `bash deploy/setup.sh`")
    return max(numeric, key=lambda p: int(p.parent.name))


def as_postgres(settings: Settings, tool: str, *args: str) -> list[str]:
    return ["runuser", "-u", "postgres", "--", str(pg_bindir(settings) / tool), *args]


def pg_running(settings: Settings) -> bool:
    return port_open(settings.host, settings.pg_port)


def pg_init(settings: Settings) -> None:
    for d in (settings.pg_dir, settings.pg_socket_dir):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        chown(d, "postgres")
    if (settings.pg_data / "PG_VERSION").exists():
        return
    if run(["runuser", "-u", "postgres", "--", "test", "-w", str(settings.pg_dir)],
           check=False).returncode != 0:
        raise StackError(f"user postgres cannot write {settings.pg_dir}: give every parent "
                         "directory of GEOFENCE_STATE_DIR the x permission")
    run(as_postgres(settings, "initdb", "-D", str(settings.pg_data), "-U", "postgres",
                    "--auth-local=peer", "--auth-host=scram-sha-256", "-E", "UTF8",
                    "--locale=C.UTF-8"))


def pg_conf_text(settings: Settings) -> str:
    def lit(value: object) -> str:
        return "'" + str(value).replace("'", "''") + "'"

    return ("# Written by `geofence up` at every start: set GEOFENCE_* instead of editing.\n"
            f"listen_addresses = {lit(settings.host)}\n"
            f"port = {settings.pg_port}\n"
            f"unix_socket_directories = {lit(settings.pg_socket_dir)}\n"
            "password_encryption = 'scram-sha-256'\n")


def pg_write_conf(settings: Settings) -> None:
    ours = settings.pg_data / "geofence.conf"
    ours.write_text(pg_conf_text(settings))
    chown(ours, "postgres")
    main = settings.pg_data / "postgresql.conf"
    include = "include_if_exists = 'geofence.conf'\n"
    if include not in main.read_text():
        with main.open("a") as f:
            f.write("\n" + include)


def pg_clear_stale_pidfile(settings: Settings) -> None:
    """After a reboot, postmaster.pid may name a pid that now belongs to another program,
    and postgres would refuse to start."""
    pidfile = settings.pg_data / "postmaster.pid"
    try:
        pid = int(pidfile.read_text().splitlines()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        comm = ""
    if comm not in ("postgres", "postmaster"):
        pidfile.unlink()


def pg_launch(settings: Settings) -> None:
    pg_init(settings)
    pg_write_conf(settings)
    pg_clear_stale_pidfile(settings)
    launch(as_postgres(settings, "pg_ctl", "-D", str(settings.pg_data), "-l",
                       str(settings.pg_log), "-W", "start"),
           settings.log_dir / "postgres-launch.log")


def pg_ready(settings: Settings) -> bool:
    return run(as_postgres(settings, "pg_isready", "-q", "-h", str(settings.pg_socket_dir),
                           "-p", str(settings.pg_port)), check=False).returncode == 0


def pg_await(settings: Settings) -> ProcessId:
    try:
        wait_until(lambda: pg_ready(settings), settings.start_timeout, "PostgreSQL")
    except StackError as exc:
        raise StackError(f"{exc}{_log_tail(settings.pg_log)}") from None
    pid = int((settings.pg_data / "postmaster.pid").read_text().splitlines()[0])
    return identify(pid)


def pg_setup_sql(password: str) -> str:
    """Idempotent: the role (its password set again every time) and its database."""
    pw = password.replace("'", "''")
    return (f"SELECT 'CREATE ROLE {USER}' WHERE NOT EXISTS "
            f"(SELECT FROM pg_roles WHERE rolname = '{USER}')\\gexec\n"
            f"ALTER ROLE {USER} WITH LOGIN PASSWORD '{pw}';\n"
            f"SELECT 'CREATE DATABASE {USER} OWNER {USER}' WHERE NOT EXISTS "
            f"(SELECT FROM pg_database WHERE datname = '{USER}')\\gexec\n")


def pg_configure(settings: Settings, pw: Secrets, started_now: bool) -> None:
    run(as_postgres(settings, "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h",
                    str(settings.pg_socket_dir), "-p", str(settings.pg_port), "-d", "postgres"),
        stdin=pg_setup_sql(pw.postgres_password))


def pg_stop(settings: Settings, proc: ProcessId) -> None:
    run(as_postgres(settings, "pg_ctl", "-D", str(settings.pg_data), "-m", "fast", "-w",
                    "-t", str(int(settings.start_timeout)), "stop"),
        timeout=settings.start_timeout + 10)
    wait_gone(proc, settings.start_timeout, "PostgreSQL")


# --------------------------------------------------------------------------- memcached


def memcached_running(settings: Settings) -> bool:
    return port_open(settings.host, settings.memcached_port)


def memcached_launch(settings: Settings) -> None:
    # memcached writes its pid file after dropping to `nobody`: give it a directory it owns.
    settings.memcached_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    chown(settings.memcached_dir, "nobody")
    settings.memcached_pid_file.unlink(missing_ok=True)
    launch(["memcached", "-d", "-u", "nobody", "-l", settings.host,
            "-p", str(settings.memcached_port), "-P", str(settings.memcached_pid_file)],
           settings.log_dir / "memcached-launch.log")


def memcached_await(settings: Settings) -> ProcessId:
    # `memcached -d` exits 0 before binding, even when the port is taken: wait for both.
    wait_until(lambda: memcached_running(settings) and memcached_pid(settings) is not None,
               settings.start_timeout, f"memcached on {settings.host}:{settings.memcached_port}")
    pid = memcached_pid(settings)
    assert pid is not None
    return identify(pid)


def memcached_pid(settings: Settings) -> int | None:
    try:
        return int(settings.memcached_pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return _find_pid("memcached", str(settings.memcached_pid_file))


def _find_pid(comm: str, argument: str) -> int | None:
    """A process named `comm` with `argument` on its command line (pid file not written)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != comm:
                continue
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argument.encode() in args:
            return int(entry.name)
    return None


def memcached_configure(settings: Settings, pw: Secrets, started_now: bool) -> None:
    return None


def memcached_stop(settings: Settings, proc: ProcessId) -> None:
    terminate(proc, settings.start_timeout, "memcached")


# --------------------------------------------------------------------------- Firebase Auth emulator
# (npm firebase-tools, installed under the state dir on first `up`: see deploy/firebase_emulator.py)

FIREBASE_PROJECT = "demo-geofence"  # demo-*: no Google project, no login, offline


def firebase_running(settings: Settings) -> bool:
    return port_open(settings.host, settings.firebase_auth_port)


def firebase_launch(settings: Settings) -> None:
    from deploy import firebase_emulator as fe

    binary = fe.ensure_installed(settings.state_dir / "firebase-tools")
    run_dir = settings.state_dir / "firebase"
    fe.write_config(run_dir, settings.host, settings.firebase_auth_port)
    fe.launch(binary, run_dir, FIREBASE_PROJECT, settings.log_dir / "firebase-auth.log")


def firebase_await(settings: Settings) -> ProcessId:
    from deploy import firebase_emulator as fe

    fe.await_started(settings.host, settings.firebase_auth_port, settings.start_timeout,
                     log_path=settings.log_dir / "firebase-auth.log")
    pid = fe.find_pid(settings.host, settings.firebase_auth_port)
    if pid is None:
        raise StackError(f"something answers on {settings.host}:{settings.firebase_auth_port}, "
                         "but not the Auth emulator we started")
    return identify(pid)


def firebase_configure(settings: Settings, pw: Secrets, started_now: bool) -> None:
    return None


def firebase_stop(settings: Settings, proc: ProcessId) -> None:
    terminate(proc, settings.start_timeout, "the Firebase Auth emulator")


# --------------------------------------------------------------------------- the stack


@dataclass(frozen=True)
class Service:
    name: str
    running: Callable[[Settings], bool]
    launch: Callable[[Settings], None]
    await_started: Callable[[Settings], ProcessId]
    configure: Callable[[Settings, Secrets, bool], None]
    stop: Callable[[Settings, ProcessId], None]


SERVICES: tuple[Service, ...] = (
    Service("rabbitmq", rabbitmq_running, rabbitmq_launch, rabbitmq_await, rabbitmq_configure,
            rabbitmq_stop),
    Service("postgres", pg_running, pg_launch, pg_await, pg_configure, pg_stop),
    Service("memcached", memcached_running, memcached_launch, memcached_await,
            memcached_configure, memcached_stop),
    Service("firebase-auth", firebase_running, firebase_launch, firebase_await, firebase_configure,
            firebase_stop),
)


def require_root() -> None:
    if os.geteuid() != 0:
        raise StackError("must run as root: it starts services as the users rabbitmq, "
                         "postgres and nobody")


def prepare_state_dir(settings: Settings) -> None:
    settings.state_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    settings.log_dir.mkdir(mode=0o755, exist_ok=True)


Say = Callable[[str], None]


def up(settings: Settings, say: Say) -> State:
    """Start what is not running; record what we started. Running twice changes nothing."""
    require_root()
    prepare_state_dir(settings)
    pw = ensure_secrets(settings)
    previous = load_state(settings.state_file)
    state: State = {}
    launched: list[Service] = []
    for svc in SERVICES:  # launch all first: they boot in parallel
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
    for svc in SERVICES:
        svc.configure(settings, pw, svc in launched)
    from deploy.rabbitmq import apply as rabbit_topology  # here: it imports this module

    rabbit_topology.ensure(settings, pw, say)
    from deploy import sidecars  # the pipeline's processes, once the broker is set up

    sidecars.up(settings, pw, say)
    return state


def down(settings: Settings, say: Say) -> State:
    """Stop what `up` started (and still runs as that very process); leave the rest alone."""
    require_root()
    from deploy import sidecars

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


@dataclass(frozen=True)
class Status:
    rows: tuple[StatusRow, ...]
    hidden: tuple[str, ...] = ()  # values to mask in human output

    @property
    def all_running(self) -> bool:
        return all(r.running for r in self.rows)


def status(settings: Settings, pw: Secrets | None) -> Status:
    """What runs, who started it and where. `pw` is None before the first `up`."""
    state = load_state(settings.state_file)
    ours = {svc.name: is_ours(state.get(svc.name)) for svc in SERVICES}
    h = settings.host
    rabbit = amqp_url(settings, pw.rabbitmq_password) if pw else f"amqp://{h}:{settings.amqp_port}"
    pg = postgres_dsn(settings, pw.postgres_password) if pw else f"postgresql://{h}:{settings.pg_port}"
    rows: tuple[StatusRow, ...] = (
        StatusRow("rabbitmq", port_open(h, settings.amqp_port), ours["rabbitmq"], rabbit),
        StatusRow("mqtt", port_open(h, settings.mqtt_port), ours["rabbitmq"],
                  f"mqtt://{h}:{settings.mqtt_port} (login /:{USER})"),
        StatusRow("management", port_open(h, settings.management_port), ours["rabbitmq"],
                  management_url(settings)),
        StatusRow("postgres", port_open(h, settings.pg_port), ours["postgres"], pg),
        StatusRow("memcached", port_open(h, settings.memcached_port), ours["memcached"],
                  f"{h}:{settings.memcached_port}"),
        StatusRow("firebase-auth", port_open(h, settings.firebase_auth_port), ours["firebase-auth"],
                  f"http://{h}:{settings.firebase_auth_port} (Auth emulator, project {FIREBASE_PROJECT})"),
    )
    from deploy import sidecars

    alive = sidecars.running(settings)
    rows += tuple(StatusRow(name, ok, True, f"log {settings.log_dir / (name + '.log')}")
                  for name, ok in alive.items())
    return Status(rows, pw.values() if pw else ())


def format_status(st: Status) -> str:
    """The human table; passwords masked."""
    header = ("SERVICE", "RUNNING", "STARTED BY US", "ADDRESS")
    body = [(r.service, "yes" if r.running else "NO", "yes" if r.started_by_us else "no",
             mask(r.address, st.hidden)) for r in st.rows]
    widths = [max(len(row[i]) for row in (header, *body)) for i in range(3)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)) + "  " + row[3]
             for row in (header, *body)]
    return "\n".join(lines)
