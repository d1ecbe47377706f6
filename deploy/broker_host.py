"""What a broker host carries beside RabbitMQ itself (issue 37): the certificates of every TLS
listener (deploy/tls.py) and each server's copy, RabbitMQ's host defaults (no anonymous MQTT, a
message size bound, epmd and the Erlang distribution on loopback), its chain of auth backends
through the login guard and its TLS listeners, and the login guard as a service of the local
stack (started before RabbitMQ: every login goes through it). deploy/services.py starts and
stops the servers with these."""

from __future__ import annotations

import functools
import ipaddress
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from deploy import tls
from deploy.processes import (
    POLL_INTERVAL,
    ProcessId,
    Say,
    StackError,
    identify,
    port_open,
    run,
    terminate,
    wait_until,
)
from deploy.settings import METRICS_HOST, Secrets, Settings


def server_tls(settings: Settings, who: str) -> tls.TlsFiles:
    """A server's own copy (its user owns the key): <state dir>/tls/<who>/."""
    d = settings.state_dir / "tls" / who
    return tls.TlsFiles(d / "ca.pem", d / "server.pem", d / "server.key")


def tls_setup(settings: Settings, say: Say) -> tls.TlsFiles:
    """The certificates made or renewed, and each server's copy in place (before any starts)."""
    made = tls.ensure(settings.state_dir, settings.host, settings.tls_dir)
    for who in ("rabbitmq", "postgres"):
        try:
            tls.copy_key(made, who, server_tls(settings, who).dir)
        except (KeyError, LookupError):  # that server's user does not exist (not installed yet)
            say(f"tls: no user {who!r} yet: its copy of the key is made at its first start")
    return made


PLUGINS = ("rabbitmq_mqtt", "rabbitmq_federation", "rabbitmq_management", "rabbitmq_shovel",
           "rabbitmq_prometheus", "rabbitmq_auth_backend_http",
           "rabbitmq_consistent_hash_exchange")  # x-ingress.partition (exchanges/ingress_partitions.py)
MAX_MESSAGE_SIZE = 16 * 1024**2  # bytes: the broker's bound on any message (its default: 128 MiB)
# What every node of this stack carries (issue 37): no anonymous MQTT login (the plugin's
# default would log a client with no credentials in as guest), a message size bound.
HOST_DEFAULT_ARGS = f"-rabbitmq_mqtt allow_anonymous false -rabbit max_message_size {MAX_MESSAGE_SIZE}"
LOOPBACK_DIST_ARGS = "-kernel inet_dist_use_interface {127,0,0,1}"
EPMD_PORT, DIST_PORTS = 4369, (25672, 25673)


def host_name_is_loopback() -> bool:
    """The node's host name resolves to loopback only: `rabbitmqctl` (which reaches the node
    through epmd at that name's address) still works with epmd and the distribution bound to
    127.0.0.1."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def dist_on_loopback(settings: Settings) -> bool:
    """epmd and the Erlang distribution bound to loopback: with a loopback GEOFENCE_HOST
    whose host name resolves to loopback (else they stay on every interface, and the
    operator firewalls 4369 and 25672; see SECURITY.md)."""
    return ipaddress.ip_address(settings.host).is_loopback and host_name_is_loopback()


def node_env(settings: Settings, erl_args: str) -> dict[str, str]:
    env = {**os.environ, "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": f"{erl_args} {HOST_DEFAULT_ARGS}"}
    if dist_on_loopback(settings):
        env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"] += f" {LOOPBACK_DIST_ARGS}"
        env["ERL_EPMD_ADDRESS"] = "127.0.0.1"  # for the epmd the node starts (the first one)
    return env


def await_startup(ctl: Sequence[str], settings: Settings, what: str, logs: str) -> None:
    """`rabbitmqctl await_startup` fails at once until the node is known to epmd: poll it."""
    deadline = time.monotonic() + settings.start_timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise StackError(f"{what} did not start within {settings.start_timeout:g}s; see {logs}")
        proc = run([*ctl, "await_startup", "--timeout", str(max(1, int(left)))], check=False,
                   timeout=left + 30)
        if proc.returncode == 0:
            return
        time.sleep(POLL_INTERVAL)


def node_pid(ctl: Sequence[str]) -> int:
    out = run([*ctl, "eval", "list_to_integer(os:getpid())."]).stdout
    return int(out.strip().splitlines()[-1])


def guard_args(settings: Settings) -> str:
    """The chain of auth backends of the first node (the one clients log in to): every login
    authenticated by the login guard (exchanges/broker_guard.py: the password against the
    store's hash, failed logins throttled, an MQTT client id bound to its user), authorised
    by RabbitMQ's own store; POST so that no password is ever in a URL; a guard that does not
    answer within 5 s refuses the login (the plugin fails closed)."""
    url = f"http://{METRICS_HOST}:{settings.guard_port}/auth/user"
    return ("-rabbit auth_backends [{rabbit_auth_backend_http,rabbit_auth_backend_internal}] "
            "-rabbitmq_auth_backend_http http_method post "
            f'-rabbitmq_auth_backend_http user_path "{url}" '
            "-rabbitmq_auth_backend_http request_timeout 5000 "
            "-rabbitmq_auth_backend_http connection_timeout 2000")


def rabbitmq_tls_args(settings: Settings) -> str:
    """AMQPS and MQTTS on GEOFENCE_PUBLIC_HOST with the server certificate, TLS 1.2 and 1.3;
    a client certificate asked for (verify_peer) but not required: clients log in with a
    password, over TLS."""
    f, h = server_tls(settings, "rabbitmq"), settings.public_host
    options = (f'[{{cacertfile,"{f.ca}"}},{{certfile,"{f.cert}"}},{{keyfile,"{f.key}"}},'
               "{verify,verify_peer},{fail_if_no_peer_cert,false},{versions,['tlsv1.3','tlsv1.2']}]")
    return (f'-rabbit ssl_listeners [{{"{h}",{settings.amqps_port}}}] -rabbit ssl_options {options} '
            f'-rabbitmq_mqtt ssl_listeners [{{"{h}",{settings.mqtts_port}}}]')



# --------------------------------------------------------------------------- the login guard
#
# Every login to the first node goes through it (guard_args): it runs before the node's
# configure step logs in. A detached process of ours (a pid file in the state dir), like
# Prometheus; on a host, a systemd unit (deploy/host_units.py).


def guard_dir(settings: Settings) -> Path:
    return settings.state_dir / "broker-guard"


def guard_env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEOFENCE_")}
    return {**env, "GEOFENCE_GUARD_HOST": METRICS_HOST, "GEOFENCE_GUARD_PORT": str(settings.guard_port),
            "GEOFENCE_GUARD_FAILED_LOGINS": f"{settings.guard_failed_logins:g}",
            "PYTHONPATH": str(Path(__file__).parents[1])}


def guard_running(settings: Settings) -> bool:
    return port_open(METRICS_HOST, settings.guard_port)


def guard_launch(settings: Settings) -> None:
    d = guard_dir(settings)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    log = settings.log_dir / "broker-guard.log"
    argv = [sys.executable, "-m", "deploy.cli", "broker-guard"]
    script = 'log=$1; pidfile=$2; shift 2; "$@" >>"$log" 2>&1 </dev/null & echo $! >"$pidfile"'
    try:
        subprocess.run(["/bin/sh", "-c", script, "sh", str(log), str(d / "broker-guard.pid"), *argv],
                       cwd=Path(__file__).parents[1], env=guard_env(settings),
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=True,
                       start_new_session=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise StackError(f"cannot launch the broker login guard: {exc}") from None


def guard_await(settings: Settings) -> ProcessId:
    wait_until(functools.partial(guard_running, settings), settings.start_timeout,
               f"the broker login guard on {METRICS_HOST}:{settings.guard_port} "
               f"(log {settings.log_dir}/broker-guard.log)")
    return identify(int((guard_dir(settings) / "broker-guard.pid").read_text().strip()))


def guard_configure(settings: Settings, pw: Secrets, started_now: bool) -> None:
    return None


def guard_stop(settings: Settings, proc: ProcessId) -> None:
    terminate(proc, settings.start_timeout, "the broker login guard")


