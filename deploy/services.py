"""The services of the local stack: RabbitMQ, PostgreSQL, memcached, the Firebase Auth
emulator and Prometheus (deploy/monitoring.py). For each: is it running, launch it, wait
until it serves, configure it, stop it; SERVICES lists them in start order for `deploy.stack`.

Trade-offs, chosen for a development / CI machine without systemd:

- RabbitMQ is the machine's own node (Debian package, `/var/lib/rabbitmq`, node
  `rabbit@<host>`), not a private one, so the `rabbitmqctl` an operator types and the scripts
  in `deploy/rabbitmq/` talk to the same broker. The price: its users, vhosts and queues
  outlive `geofence down`, and a node somebody else started is used as it is (we add our
  user, enable the plugins online if its MQTT port is closed, and restart it if it lacks the
  host defaults below). Its listeners are bound to
  GEOFENCE_HOST through environment variables, so /etc/rabbitmq is never edited. Every node
  carries the host defaults (issue 37): no anonymous MQTT login, a message size bound, and
  epmd and the Erlang distribution on loopback when the host name resolves to loopback
  (elsewhere binding them to loopback would break `rabbitmqctl`: they stay on every
  interface and SECURITY.md says to firewall them). A node running without them is
  restarted by `up` (`rabbitmq_prepare`). epmd, started by the first node, is left running
  by `down`: it is shared by every Erlang node on the machine.
- RabbitMQ's `guest` is deleted while its password is still `guest` (an operator who set
  another keeps it). Our user `geofence` is an administrator with full permissions on `/`;
  client users (devices, sensors, gateways, applications) get connection and channel limits
  (deploy/rabbitmq/credentials.USER_LIMITS).
- PostgreSQL is a private cluster under the state dir, on its own port and socket directory,
  so it never meets Debian's cluster on 5432 and goes away with the state dir.
- The Firebase Auth emulator (npm firebase-tools) is installed under the state dir on the
  first `up` (deploy/firebase_emulator.py).
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploy import broker_cluster, exposure, monitoring
from deploy import firebase_emulator as fe
from deploy.broker_host import (
    DIST_PORTS,
    EPMD_PORT,
    MAX_MESSAGE_SIZE,
    PLUGINS,
    await_startup,
    dist_on_loopback,
    guard_args,
    guard_await,
    guard_configure,
    guard_launch,
    guard_running,
    guard_stop,
    node_env,
    node_pid,
    rabbitmq_tls_args,
    server_tls,
)
from deploy.processes import (
    ProcessId,
    Say,
    StackError,
    chown,
    identify,
    launch,
    log_tail,
    port_open,
    run,
    terminate,
    wait_gone,
    wait_until,
)
from deploy.rabbitmq.nodes import broker2_node
from deploy.settings import FIREBASE_PROJECT, USER, Secrets, Settings, management_url

ENABLED_PLUGINS_FILE = Path("/etc/rabbitmq/enabled_plugins")
RABBITMQ_LOG_DIR = Path("/var/log/rabbitmq")


# --------------------------------------------------------------------------- RabbitMQ


def rabbitmq_env(settings: Settings) -> dict[str, str]:
    """Listeners on GEOFENCE_HOST and the configured ports (the TLS ones on
    GEOFENCE_PUBLIC_HOST), without touching /etc/rabbitmq."""
    h, mqtt, web = settings.host, settings.mqtt_port, settings.management_port
    erl_args = (f'-rabbitmq_mqtt tcp_listeners [{{"{h}",{mqtt}}}] '
                f'-rabbitmq_management tcp_config [{{ip,"{h}"}},{{port,{web}}}] '
                f'-rabbitmq_prometheus tcp_config [{{ip,"{h}"}},{{port,{settings.rabbitmq_metrics_port}}}] '
                f"{guard_args(settings)} {rabbitmq_tls_args(settings)}")
    return {**node_env(settings, erl_args), "RABBITMQ_NODE_IP_ADDRESS": h,
            "RABBITMQ_NODE_PORT": str(settings.amqp_port)}


def host_defaults_applied(ctl: Sequence[str] = ("rabbitmqctl",), settings: Settings | None = None) -> bool:
    """The running node carries HOST_DEFAULT_ARGS (and, given the first node's `settings`, the
    login guard's chain and the TLS listeners)."""
    probe = ("{application:get_env(rabbitmq_mqtt, allow_anonymous), "
             "application:get_env(rabbit, max_message_size), application:get_env(rabbit, auth_backends), "
             "application:get_env(rabbit, ssl_listeners), "
             "application:get_env(rabbitmq_mqtt, ssl_listeners)}.")
    out = "".join(run([*ctl, "eval", probe], check=False).stdout.split())  # a term printed over lines
    if settings is None:
        tail = "{ok,[rabbit_auth_backend_internal]},{ok,[]},{ok,[]}"
    else:
        h = settings.public_host
        tail = (f'{{ok,[{{rabbit_auth_backend_http,rabbit_auth_backend_internal}}]}},'
                f'{{ok,[{{"{h}",{settings.amqps_port}}}]}},{{ok,[{{"{h}",{settings.mqtts_port}}}]}}')
    return out.endswith(f"{{{{ok,false}},{{ok,{MAX_MESSAGE_SIZE}}},{tail}}}")


def rabbitmq_prepare(settings: Settings, say: Say) -> None:
    """A node of this stack running without the host defaults (started by an older release,
    or by somebody else) is stopped; every node when epmd or a distribution port listens on
    every interface where they can be on loopback, and epmd with them. `up` then starts them
    again with the defaults."""
    nodes = (("rabbitmq", ("rabbitmqctl",), rabbitmq_running), ("rabbitmq-2", tuple(ctl2()), broker2_running))
    running = [(name, ctl) for name, ctl, is_running in nodes if is_running(settings)]
    exposed = dist_on_loopback(settings) and bool(exposure.exposed((EPMD_PORT, *DIST_PORTS)))
    stale = running if exposed else [
        (name, ctl) for name, ctl in running
        if not host_defaults_applied(ctl, settings if name == "rabbitmq" else None)]
    for name, ctl in stale:
        say(f"{name}: restarting to apply the host defaults (no anonymous MQTT, a message size bound, "
            "epmd and the Erlang distribution on loopback)")
        proc = identify(node_pid(ctl))
        run([*ctl, "stop"], timeout=settings.start_timeout)
        wait_gone(proc, settings.start_timeout, name)
    if exposed and len(stale) == len(running) and exposure.exposed((EPMD_PORT,)):
        run(["epmd", "-kill"], check=False)  # no node left registered: it exits
        wait_until(lambda: not exposure.exposed((EPMD_PORT,)), settings.start_timeout, "epmd to stop")


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
    await_startup(["rabbitmqctl"], settings, "RabbitMQ",
                   f"{RABBITMQ_LOG_DIR}/ and {settings.log_dir}/rabbitmq-launch.log")
    _await_rabbitmq_listeners(settings)
    return identify(rabbitmq_pid())


def _prometheus_plugin_listens(settings: Settings) -> bool:
    """rabbitmq_prometheus answers, on our port or (a node not started with our arguments)
    on its default one."""
    return port_open(settings.host, settings.rabbitmq_metrics_port) or port_open(settings.host, 15692)


def _await_rabbitmq_listeners(settings: Settings) -> None:
    wait_until(functools.partial(_prometheus_plugin_listens, settings), settings.start_timeout,
               "RabbitMQ's rabbitmq_prometheus plugin to listen")
    for port in (settings.amqp_port, settings.mqtt_port, settings.management_port):
        wait_until(functools.partial(port_open, settings.host, port), settings.start_timeout,
                   f"RabbitMQ to listen on {settings.host}:{port}")


def rabbitmq_pid() -> int:
    return node_pid(["rabbitmqctl"])


def _plugins_file_complete() -> bool:
    try:
        return not missing_plugins(ENABLED_PLUGINS_FILE.read_text())
    except OSError:  # no file (or not ours to read): the listeners' check decides
        return True


def rabbitmq_configure(settings: Settings, pw: Secrets, started_now: bool) -> None:
    if not started_now and not (port_open(settings.host, settings.mqtt_port)
                                and _prometheus_plugin_listens(settings) and _plugins_file_complete()):
        # A node started elsewhere (or before a plugin was added here) without our plugins:
        # enable them on the running node.
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


def rabbitmq_set_user(pw: Secrets, ctl: Sequence[str] = ("rabbitmqctl",)) -> None:
    """The administrator on the node `ctl` reaches (the first; `ctl2()` the second)."""
    listed = run([*ctl, "-q", "list_users", "--formatter", "json"]).stdout
    exists = any(u.get("user") == USER for u in json.loads(listed or "[]"))
    verb = "change_password" if exists else "add_user"
    run([*ctl, verb, USER], stdin=pw.rabbitmq_password + "\n")  # password on stdin
    run([*ctl, "set_user_tags", USER, "administrator"])
    run([*ctl, "set_permissions", "-p", "/", USER, ".*", ".*", ".*"])


def rabbitmq_stop(settings: Settings, proc: ProcessId) -> None:
    run(["rabbitmqctl", "stop"], timeout=settings.start_timeout)
    wait_gone(proc, settings.start_timeout, "RabbitMQ")


# --------------------------------------------------------------------------- a second RabbitMQ node
#
# GEOFENCE_BROKERS=2 (or a region placed on it): an independent node, not a cluster member
# (the Nokia talk: federation, not clustering, across hosts), on the next ports, with its own
# node name, data and log dirs under the state dir and its own plugins file (no MQTT: devices
# connect to the first). Regions placed on it are federated to gf-fences over AMQP/TCP.

BROKER2_PLUGINS = ("rabbitmq_federation", "rabbitmq_management", "rabbitmq_prometheus",
                   "rabbitmq_federation_management")


def broker2_dir(settings: Settings) -> Path:
    return settings.state_dir / "rabbitmq2"


def broker2_env(settings: Settings) -> dict[str, str]:
    h, d = settings.host, broker2_dir(settings)
    web, prom = settings.broker_management_port(2), settings.broker_metrics_port(2)
    erl_args = (f'-rabbitmq_management tcp_config [{{ip,"{h}"}},{{port,{web}}}] '
                f'-rabbitmq_prometheus tcp_config [{{ip,"{h}"}},{{port,{prom}}}]')
    return {**node_env(settings, erl_args), "RABBITMQ_NODENAME": broker2_node(),
            "RABBITMQ_NODE_IP_ADDRESS": h,
            "RABBITMQ_NODE_PORT": str(settings.broker_amqp_port(2)),
            "RABBITMQ_DIST_PORT": str(DIST_PORTS[1]), "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"), "RABBITMQ_PID_FILE": str(d / "rabbitmq2.pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins")}


def ctl2(*args: str) -> list[str]:
    """rabbitmqctl against the second node."""
    return ["rabbitmqctl", "-n", broker2_node(), *args]


def broker2_running(settings: Settings) -> bool:
    return port_open(settings.host, settings.broker_amqp_port(2))


def broker2_launch(settings: Settings) -> None:
    d = broker2_dir(settings)
    for sub in ("", "mnesia", "log"):
        (d / sub).mkdir(mode=0o750, parents=True, exist_ok=True)
    (d / "enabled_plugins").write_text("[" + ",".join(BROKER2_PLUGINS) + "].\n")
    run(["chown", "-R", "rabbitmq:rabbitmq", str(d)])
    launch(["rabbitmq-server", "-detached"], settings.log_dir / "rabbitmq2-launch.log",
           env=broker2_env(settings))


def broker2_await(settings: Settings) -> ProcessId:
    await_startup(ctl2(), settings, "the second RabbitMQ",
                   f"{broker2_dir(settings) / 'log'} and {settings.log_dir}/rabbitmq2-launch.log")
    for port in (settings.broker_amqp_port(2), settings.broker_management_port(2)):
        wait_until(functools.partial(port_open, settings.host, port), settings.start_timeout,
                   f"the second RabbitMQ to listen on {settings.host}:{port}")
    return identify(node_pid(ctl2()))


def broker2_configure(settings: Settings, pw: Secrets, started_now: bool) -> None:
    """The administrator, as on the first node."""
    rabbitmq_set_user(pw, ctl2())


def broker2_stop(settings: Settings, proc: ProcessId) -> None:
    run(ctl2("stop"), timeout=settings.start_timeout)
    wait_gone(proc, settings.start_timeout, "the second RabbitMQ")


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
            "password_encryption = 'scram-sha-256'\n"
            # TCP clients over TLS only (pg_hba_text), the server certificate of deploy/tls.py
            "ssl = on\n"
            f"ssl_cert_file = {lit(server_tls(settings, 'postgres').cert)}\n"
            f"ssl_key_file = {lit(server_tls(settings, 'postgres').key)}\n"
            "ssl_min_protocol_version = 'TLSv1.2'\n"
            # the events archive takes a few rows per position update: its indexes (a random
            # primary key) stay in memory well past PostgreSQL's default of 128MB
            "shared_buffers = '512MB'\n")


def pg_hba_text(settings: Settings) -> str:
    """Local (socket) logins by peer; TCP ones over TLS only, with a password; plain TCP refused."""
    nets = ["127.0.0.1/32", "::1/128"]
    if not ipaddress.ip_address(settings.host).is_loopback:
        nets.append("0.0.0.0/0")
    return ("# Written by `geofence up` at every start.\n"
            "local   all all                peer\n"
            + "".join(f"hostssl all all {net:<18} scram-sha-256\n" for net in nets)
            + "hostnossl all all 0.0.0.0/0     reject\nhostnossl all all ::/0          reject\n")


def pg_write_conf(settings: Settings) -> bool:
    """geofence.conf and pg_hba.conf as these settings want them: True when one changed."""
    changed = False
    for path, text in ((settings.pg_data / "geofence.conf", pg_conf_text(settings)),
                       (settings.pg_data / "pg_hba.conf", pg_hba_text(settings))):
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed = True
        chown(path, "postgres")
    main = settings.pg_data / "postgresql.conf"
    include = "include_if_exists = 'geofence.conf'\n"
    if include not in main.read_text():
        with main.open("a") as f:
            f.write("\n" + include)
    return changed


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
        raise StackError(f"{exc}{log_tail(settings.pg_log)}") from None
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
    if pg_write_conf(settings) and not started_now:  # TLS and the logins: a reload applies them
        run(as_postgres(settings, "pg_ctl", "-D", str(settings.pg_data), "reload"))
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


def firebase_running(settings: Settings) -> bool:
    return port_open(settings.host, settings.firebase_auth_port)


def firebase_launch(settings: Settings) -> None:
    binary = fe.ensure_installed(settings.state_dir / "firebase-tools")
    run_dir = settings.state_dir / "firebase"
    fe.write_config(run_dir, settings.host, settings.firebase_auth_port)
    fe.launch(binary, run_dir, FIREBASE_PROJECT, settings.log_dir / "firebase-auth.log")


def firebase_await(settings: Settings) -> ProcessId:
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
    for pid in fe.leftover_pids(settings.host, settings.firebase_auth_port):
        terminate(identify(pid), settings.start_timeout, "a process of the Firebase Auth emulator")


# --------------------------------------------------------------------------- the services, in start order


@dataclass(frozen=True)
class Service:
    name: str
    running: Callable[[Settings], bool]
    launch: Callable[[Settings], None]
    await_started: Callable[[Settings], ProcessId]
    configure: Callable[[Settings, Secrets, bool], None]
    stop: Callable[[Settings, ProcessId], None]
    wanted: Callable[[Settings], bool] = lambda settings: True  # run by this stack?
    prepare: Callable[[Settings, Say], None] = lambda settings, say: None  # before `running`


SERVICES: tuple[Service, ...] = (
    Service("broker-guard", guard_running, guard_launch, guard_await, guard_configure, guard_stop),
    Service("rabbitmq", rabbitmq_running, rabbitmq_launch, rabbitmq_await, rabbitmq_configure,
            rabbitmq_stop, prepare=rabbitmq_prepare),
    Service("rabbitmq-2", broker2_running, broker2_launch, broker2_await, broker2_configure, broker2_stop,
            lambda settings: settings.broker_count == 2),
    *(Service(f"rabbitmq-n{k}", *broker_cluster.node_service(k), broker_cluster.wanted(k))
      for k in broker_cluster.CLUSTER_NODES),
    Service("postgres", pg_running, pg_launch, pg_await, pg_configure, pg_stop),
    Service("memcached", memcached_running, memcached_launch, memcached_await,
            memcached_configure, memcached_stop),
    Service("firebase-auth", firebase_running, firebase_launch, firebase_await, firebase_configure,
            firebase_stop),
    Service("prometheus", monitoring.running, monitoring.launch, monitoring.await_started,
            monitoring.configure, monitoring.stop),
)
