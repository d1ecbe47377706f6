"""The first broker as a cluster of three RabbitMQ nodes (issue 38: lose a host, lose nothing):
GEOFENCE_BROKER_NODES=3, or `geofence up --broker-nodes 3`, which records it in the state dir.

Node 1 is the machine's own node (`rabbit@<host>`, deploy/services.py); nodes 2 and 3
(`geofence-n2@<host>`, `geofence-n3@<host>`) are private nodes of the stack with their own
ports (100 and 200 above the first's: AMQP, MQTT, management, Prometheus), Erlang
distribution port and data dir under the state dir, the same plugins, host defaults and login
guard as node 1. `up` starts them, has them join node 1 (`join_cluster`, once: a member that
restarts rejoins by itself), and gives every quorum queue and stream a member on them
(`rabbitmq-queues grow`, `rabbitmq-streams add_replica`): a queue declared while the cluster
is whole gets its three members from the start. `up --broker-nodes 1` retires them again:
their members removed, the nodes forgotten by the cluster, stopped, their data dirs deleted.

The sidecars are spread over the nodes and fail over between them (GEOFENCE_AMQP_NODES,
exchanges/shell/connections.py); federation between sites is unchanged (a second site is
`GEOFENCE_BROKERS=2`, deploy/services.py, never a member of this cluster).

Trade-offs:
- Three nodes on one machine survive the loss of a node (its process, its data dir), not of
  the machine: the local stack's shape of the production one (a node per host, the same
  commands), on which the fault suite kills a node under load.
- Node 1 keeps what is not replicated: each vhost's dead-letter queue (classic), the TLS
  listeners, the management API the commands use, the login guard's reads of the users (it
  answers from its cache while node 1 is away). Losing node 1 loses those until it is back;
  losing node 2 or 3 loses nothing but a quorum member.
"""

from __future__ import annotations

import functools
import json
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path

from deploy.broker_host import PLUGINS, await_startup, guard_args, node_env, node_pid
from deploy.processes import (
    ProcessId,
    Say,
    StackError,
    identify,
    launch,
    port_open,
    run,
    wait_gone,
    wait_until,
)
from deploy.rabbitmq.definitions import journal_streams
from deploy.settings import Secrets, Settings
from exchanges import topology as t

CLUSTER_NODES = (2, 3)
DIST_PORT = {2: 25674, 3: 25675}  # beside node 1's 25672 and a second site's 25673


def _short_host() -> str:
    return socket.gethostname().split(".")[0]


def first_node() -> str:
    return f"rabbit@{_short_host()}"


def node_name(node: int) -> str:
    return first_node() if node == 1 else f"geofence-n{node}@{_short_host()}"


def ctl(node: int, *args: str) -> list[str]:
    return ["rabbitmqctl", "-n", node_name(node), *args]


def node_dir(settings: Settings, node: int) -> Path:
    return settings.state_dir / f"rabbitmq-n{node}"


def endpoints(settings: Settings) -> list[tuple[str, int]]:
    """The AMQP (host, port) of each node of the cluster, node 1 first."""
    return [(settings.host, settings.node_port(settings.amqp_port, n))
            for n in range(1, settings.broker_nodes + 1)]


def node_environment(settings: Settings, node: int) -> dict[str, str]:
    h, d = settings.host, node_dir(settings, node)

    def port(base: int) -> int:
        return settings.node_port(base, node)

    mqtt, web, prom = (port(settings.mqtt_port), port(settings.management_port),
                       port(settings.rabbitmq_metrics_port))
    erl_args = (f'-rabbitmq_mqtt tcp_listeners [{{"{h}",{mqtt}}}] '
                f'-rabbitmq_management tcp_config [{{ip,"{h}"}},{{port,{web}}}] '
                f'-rabbitmq_prometheus tcp_config [{{ip,"{h}"}},{{port,{prom}}}] '
                f"{guard_args(settings)}")
    return {**node_env(settings, erl_args), "RABBITMQ_NODENAME": node_name(node),
            "RABBITMQ_NODE_IP_ADDRESS": h, "RABBITMQ_NODE_PORT": str(port(settings.amqp_port)),
            "RABBITMQ_DIST_PORT": str(DIST_PORT[node]), "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"), "RABBITMQ_PID_FILE": str(d / "rabbitmq.pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins")}


def running(settings: Settings, node: int) -> bool:
    return port_open(settings.host, settings.node_port(settings.amqp_port, node))


def start(settings: Settings, node: int) -> None:
    d = node_dir(settings, node)
    for sub in ("", "mnesia", "log"):
        (d / sub).mkdir(mode=0o750, parents=True, exist_ok=True)
    (d / "enabled_plugins").write_text("[" + ",".join(PLUGINS) + "].\n")
    run(["chown", "-R", "rabbitmq:rabbitmq", str(d)])
    launch(["rabbitmq-server", "-detached"], settings.log_dir / f"rabbitmq-n{node}-launch.log",
           env=node_environment(settings, node))


def await_started(settings: Settings, node: int) -> ProcessId:
    logs = f"{node_dir(settings, node) / 'log'} and {settings.log_dir}/rabbitmq-n{node}-launch.log"
    await_startup(ctl(node), settings, f"RabbitMQ node {node}", logs)
    for base in (settings.amqp_port, settings.mqtt_port, settings.management_port):
        port = settings.node_port(base, node)
        wait_until(functools.partial(port_open, settings.host, port), settings.start_timeout,
                   f"RabbitMQ node {node} to listen on port {port}")
    return identify(node_pid(ctl(node)))


def node_pid_of(node: int) -> int:
    return node_pid(ctl(node))


def members(node: int) -> list[str]:
    """The cluster's disk nodes as `node` sees them."""
    out = run(ctl(node, "cluster_status", "--formatter", "json")).stdout
    return [str(n) for n in json.loads(out).get("disk_nodes", [])]


def configure(settings: Settings, pw: Secrets, started_now: bool, node: int) -> None:
    """Joined to node 1, once (a member that restarts rejoins by itself)."""
    if first_node() not in members(node):
        run(ctl(node, "stop_app"), timeout=settings.start_timeout)
        run(ctl(node, "reset"), timeout=settings.start_timeout)  # a private node: nothing of its own
        run(ctl(node, "join_cluster", first_node()), timeout=settings.start_timeout)
        run(ctl(node, "start_app"), timeout=settings.start_timeout)
        await_startup(ctl(node), settings, f"RabbitMQ node {node}", str(node_dir(settings, node) / "log"))


def settle(settings: Settings, say: Say) -> None:
    """Once the topology is declared: every quorum queue and stream with a member on every
    node (queues declared before a node joined have none there), and the quorum queues'
    leaders spread over the nodes (a queue declared through node 1 is led from there); each
    step does nothing when there is nothing to do."""
    for node in range(2, settings.broker_nodes + 1):
        grow(settings, node)
    wait_until(functools.partial(coordinated, settings), max(settings.start_timeout, 120),
               "every RabbitMQ node to be a member of the streams' coordinator and MQTT's tracker")
    done = run(["rabbitmq-queues", "-n", first_node(), "rebalance", "quorum"], check=False,
               timeout=settings.start_timeout)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[-200:]
        say(f"rabbitmq: the quorum queues' leaders not rebalanced: {said}")


def coordinated(settings: Settings) -> bool:
    """The streams' coordinator (a Raft cluster that adds a joined node by itself, within
    about a minute) and MQTT's client-id tracker have a member on every node."""
    names = [node_name(n) for n in range(1, settings.broker_nodes + 1)]
    for cluster in ("rabbit_stream_coordinator", "mqtt_node"):
        said = run(ctl(1, "eval", f"ra:members({{{cluster}, node()}})."), check=False).stdout
        if not all(f"{{{cluster},{n}}}" in "".join(said.split()).replace("'", "") for n in names):
            return False
    return True


def grow(settings: Settings, node: int) -> None:
    """A member on `node` for every quorum queue and for the workers' journal streams."""
    run(["rabbitmq-queues", "-n", first_node(), "grow", node_name(node), "all"],
        timeout=settings.start_timeout)
    for stream in journal_streams(settings.topology):
        said = stream_replica(settings, "add_replica", stream, node)
        if said not in ("ok", "{error,already_member}", "{error,not_found}"):
            raise StackError(f"stream {stream}: no replica on {node_name(node)}: {said[-300:]}")


def stream_replica(settings: Settings, op: str, stream: str, node: int) -> str:
    """rabbit_stream_queue's add_replica / delete_replica for a journal stream (Debian's
    package has no `rabbitmq-streams` on the PATH); what it returned, e.g. `ok`."""
    term = f"rabbit_stream_queue:{op}(<<\"{t.FENCES_VHOST}\">>, <<\"{stream}\">>, '{node_name(node)}')."
    done = run(ctl(1, "eval", term), check=False, timeout=settings.start_timeout)
    return "".join((done.stdout or done.stderr).split())


def stop(settings: Settings, proc: ProcessId, node: int) -> None:
    run(ctl(node, "stop"), timeout=settings.start_timeout)
    wait_gone(proc, settings.start_timeout, f"RabbitMQ node {node}")


def quorum_queues_on(node: int) -> list[tuple[str, str]]:
    """(vhost, name) of every quorum queue with a member on node `node`, as node 1 has them."""
    term = ("io:format(\"~s~n\", [rabbit_json:encode("
            "[[amqqueue:get_vhost(Q), element(4, amqqueue:get_name(Q))]"
            " || Q <- rabbit_amqqueue:list(), amqqueue:get_type(Q) =:= rabbit_quorum_queue,"
            f" lists:member('{node_name(node)}', maps:get(nodes, amqqueue:get_type_state(Q), []))])]).")
    out = run(ctl(1, "eval", term)).stdout
    return [(str(v), str(q)) for v, q in json.loads(out.splitlines()[0])]


def shrink(settings: Settings, node: int) -> None:
    """Every quorum queue's member on `node` removed, checked, before the node may be forgotten.
    `rabbitmq-queues shrink` reports "ok" for a queue whose member it failed to remove (seen
    right after a cluster stopped whole came back: two queues of three kept theirs). Such a
    queue, once the node is forgotten, keeps a member that never answers, and with two members
    left it has no majority, no leader, and no way back on 3.10 but its deletion. So the members
    left are removed one by one until none is, or this fails and the node stays."""
    run(["rabbitmq-queues", "-n", first_node(), "shrink", node_name(node)], timeout=settings.start_timeout)
    deadline = time.monotonic() + settings.start_timeout
    while left := quorum_queues_on(node):
        if time.monotonic() > deadline:
            raise StackError(f"{node_name(node)} still holds a member of the quorum queues "
                             f"{', '.join(f'{v}/{q}' for v, q in left)}: it stays in the cluster; run "
                             "`geofence up` again")
        for vhost, queue in left:
            run(ctl(1, "eval", f"rabbit_quorum_queue:delete_member(<<\"{vhost}\">>, <<\"{queue}\">>, "
                               f"'{node_name(node)}')."), check=False, timeout=settings.start_timeout)
        time.sleep(1.0)


def retire(settings: Settings, say: Say) -> list[str]:
    """The nodes above GEOFENCE_BROKER_NODES taken out of the cluster (their queue and stream
    members removed, forgotten by node 1), stopped, their data dirs deleted; their names."""
    gone = []
    for node in CLUSTER_NODES:
        if node <= settings.broker_nodes or not node_dir(settings, node).exists():
            continue
        say(f"rabbitmq-n{node}: leaving the cluster (GEOFENCE_BROKER_NODES={settings.broker_nodes})")
        name = node_name(node)
        if running(settings, node):
            shrink(settings, node)
            for stream in journal_streams(settings.topology):
                stream_replica(settings, "delete_replica", stream, node)
            # the Raft clusters of the streams' coordinator and of MQTT's client ids lose their
            # member there while they have a majority: a node forgotten with its member still
            # listed leaves them without one (streams and MQTT logins then fail on node 1)
            run(ctl(1, "eval", f"ra:remove_member({{rabbit_stream_coordinator, node()}}, "
                               f"{{rabbit_stream_coordinator, '{name}'}})."), check=False,
                timeout=settings.start_timeout)
            run(ctl(1, "decommission_mqtt_node", name), check=False, timeout=settings.start_timeout)
            proc = identify(node_pid(ctl(node)))
            run(ctl(node, "stop_app"), timeout=settings.start_timeout)
            run(ctl(node, "stop"), timeout=settings.start_timeout)
            wait_gone(proc, settings.start_timeout, f"RabbitMQ node {node}")
        if name in members(1):
            run(["rabbitmqctl", "-n", first_node(), "forget_cluster_node", name],
                timeout=settings.start_timeout)
        shutil.rmtree(node_dir(settings, node))
        gone.append(f"rabbitmq-n{node}")
    return gone


ServiceParts = tuple[Callable[[Settings], bool], Callable[[Settings], None], Callable[[Settings], ProcessId],
                     Callable[[Settings, Secrets, bool], None], Callable[[Settings, ProcessId], None]]


def node_service(node: int) -> ServiceParts:
    """running, launch, await, configure, stop of node `node` (deploy/services.Service)."""
    return (lambda s: running(s, node), lambda s: start(s, node), lambda s: await_started(s, node),
            lambda s, pw, now: configure(s, pw, now, node), lambda s, proc: stop(s, proc, node))


def wanted(node: int) -> Callable[[Settings], bool]:
    """Node `node` is started when the settings want it, and also when its data dir is still
    there: a cluster stopped whole (a reboot) is still a cluster of three, whose node 1 waits
    for its peers' tables before it boots. They are started together, then `retire` takes the
    unwanted ones out while they run (a quorum queue of three members with two of them never
    started again would have no leader, and could not be shrunk)."""
    return lambda settings: settings.broker_nodes >= node or node_dir(settings, node).exists()
