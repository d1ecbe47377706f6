"""The one `geofence` command.

Each subcommand lives with the part of the product it drives and is imported lazily,
so `geofence status` does not pay for numpy/shapely and nothing is read at import time.
A subcommand module exposes `add_arguments(parser, name)` and `run(args) -> int`.

`geofence inspect <target>` is a group: each part of the product registers its own target
in INSPECT_TARGETS (same module contract; `args.command` is "inspect", `args.target` the
target), and only the module of the target asked for is imported.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib import metadata
from types import ModuleType

from deploy import exit_codes

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "up": ("deploy.stack_cmd", "start the local stack (RabbitMQ, PostgreSQL, memcached)"),
    "down": ("deploy.stack_cmd", "stop what `geofence up` started"),
    "status": ("deploy.stack_cmd", "show the local stack; --json for connection settings"),
    "demo": ("deploy.demo_cmd", "run the demo against the local stack"),
    "kernel": ("hilbert_c.cli", "Hilbert kernel tools: encode, decode, cover"),
    "topology": ("deploy.topology_cmd", "the pipeline's RabbitMQ topology: apply, show"),
    "device": ("deploy.topology_cmd", "a tenant's device (MQTT) users: add, remove, list"),
    "gateway": ("deploy.topology_cmd", "a tenant's gateway (AMQP or MQTT) users: add, remove, list"),
    "app": ("deploy.topology_cmd", "a tenant's application (AMQP) users: add, remove, list"),
    "sensor": ("deploy.venue_cmd", "presence sensors of hives: add, remove, list"),
    "x-ingress": ("deploy.sidecar_cmd", "run the x-ingress sidecar (MQTT / AMQP positions in)"),
    "x-geo": ("deploy.sidecar_cmd", "run the x-geo sidecar of one region"),
    "x-fence": ("deploy.sidecar_cmd", "run one x-fence worker (ENTER / LEAVE events out)"),
    "fence-archiver": ("deploy.sidecar_cmd", "run the events archiver (fence.events -> PostgreSQL)"),
    "api": ("deploy.sidecar_cmd", "run the fence service: HTTP and AMQP fence API, moving fences"),
    "venue-sensors": ("deploy.sidecar_cmd", "run the sensor sidecar (sensor frames -> hive occupancy)"),
    "fence-webhooks": ("deploy.sidecar_cmd", "run the webhooks sidecar (events -> tenants' HTTPS endpoints)"),
    "webhook": ("deploy.webhook_cmd", "a tenant's webhook endpoints: add, list, show, remove, enable, "
                "rotate, dead, replay"),
    "broker-guard": ("deploy.guard_cmd", "run the broker's login guard (RabbitMQ asks it for every login)"),
    "fence": ("deploy.fence_cmd", "add, replace, remove, list fences (GeoJSON)"),
    "subscription": ("deploy.subscription_cmd", "proximity subscriptions: add, list, show, remove"),
    "tenant": ("deploy.tenant_cmd", "tenants (organisations) and their members: add, list, remove, member"),
    "migrate": ("deploy.migrate", "apply the PostgreSQL schema migrations"),
    "archive": ("deploy.archive_cmd", "the events archive's months: list; maintain (retention, Parquet "
                "export)"),
    "settings": ("deploy.settings_cmd", "every environment variable: type, default, roles, secret; "
                 "--markdown, --json"),
    "host": ("deploy.host_units", "render the systemd units and environment files for a host"),
    "region": ("deploy.region_cmd", "the x-geo regions: list; add or remove one while positions flow"),
    "worker": ("deploy.worker_cmd", "the x-fence workers: list; add or remove one while positions flow"),
    "ingress": ("deploy.ingress_cmd", "the x-ingress instances: list; add or remove one while positions "
                "flow"),
    "dlq": ("deploy.dlq_cmd", "dead-lettered messages: list, replay"),
    "query": ("deploy.query_cmd", "where objects were last seen: in a bbox, within a polygon or fence, "
              "nearby a point (live, from the x-geo regions)"),
    "inspect": ("", "look inside the running pipeline (see `geofence inspect -h`)"),
    "spark": ("", "the nightly PySpark jobs (see `geofence spark -h`)"),
}

# `geofence inspect TARGET`: target -> (module, one-line help)
INSPECT_TARGETS: dict[str, tuple[str, str]] = {
    "topology": ("deploy.inspect_topology_cmd",
                 "vhosts, queues (messages, consumers, policy), federation links"),
    "fence": ("deploy.inspect_cmd", "a fence: definition, worker, occupants (live, from x-fence)"),
    "object": ("deploy.inspect_cmd", "an object: the fences it is in (live, from x-fence)"),
    "geo": ("deploy.inspect_cmd", "an x-geo region: bindings, tracked objects, counters"),
    "worker": ("deploy.inspect_cmd", "an x-fence worker: fences, counters"),
    "ring": ("deploy.inspect_cmd", "the consistent-hash ring: workers, shares, a fence's worker"),
    "proximity": ("deploy.inspect_cmd", "proximity subscriptions: per worker, positions held, near pairs"),
    "worldmap": ("deploy.inspect_cmd", "the worldmap: which Hilbert intervals each region owns"),
}
# `geofence spark JOB`: the nightly jobs (each also a spark-submit entry point), launched by
# deploy.spark_cmd with the local stack's settings
SPARK_JOBS: dict[str, tuple[str, str]] = {
    "rebuild-bindings": ("deploy.spark_cmd",
                         "recompute every fence's covering, repair live bindings, re-split the worldmap"),
    "occupancy-analytics": ("deploy.spark_cmd",
                            "per fence and hour: entries, exits, occupancy, dwell; busiest hours; forecast"),
    "cluster": ("deploy.spark_cluster", "a Spark standalone cluster on this machine: up, down, status"),
}
GROUPS: dict[str, dict[str, tuple[str, str]]] = {"inspect": INSPECT_TARGETS, "spark": SPARK_JOBS}


def _version() -> str:
    """The installed distribution's version (pyproject.toml's, once `pip install -e` ran)."""
    try:
        return metadata.version("geofence")
    except metadata.PackageNotFoundError:
        return "unknown (not installed: run `bash deploy/setup.sh`)"


def _first_word(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


# The extras' packages (pyproject.toml) and the extra that brings each.
EXTRA_OF = {"pyspark": "spark", "pandas": "spark", "pyarrow": "spark", "osmium": "demo", "paho": "demo"}


class MissingExtra(ImportError):
    """A command whose packages come with an extra that is not installed: bad usage (2)."""

    exit_code = exit_codes.USAGE


def _missing_extra(exc: ModuleNotFoundError, words: str) -> int:
    """A module of an extra that is not installed: said in one line (exit 2); any other
    missing module is a bug, raised."""
    root = (exc.name or "").split(".")[0]
    extra = EXTRA_OF.get(root)
    if extra is None:
        raise exc
    why = f"it needs {root}, of the {extra!r} extra: pip install 'geofence[{extra}]' (bash deploy/setup.sh " \
        "installs every extra)"
    return exit_codes.say(words, MissingExtra(why))


def _load(module_name: str, parser: argparse.ArgumentParser, name: str) -> ModuleType:
    module = importlib.import_module(module_name)
    module.add_arguments(parser, name)
    return module


def build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, ModuleType | None]:
    parser = argparse.ArgumentParser(prog="geofence", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"geofence {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # Only import the module of the subcommand (or inspect target) actually asked for.
    wanted = _first_word(argv)
    chosen: ModuleType | None = None
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name in GROUPS:
            targets = p.add_subparsers(dest="target", metavar="TARGET", required=True)
            rest = argv[argv.index(name) + 1:] if name == wanted else []
            for target, (target_module, target_help) in GROUPS[name].items():
                tp = targets.add_parser(target, help=target_help)
                if rest and target == _first_word(rest):
                    chosen = _load(target_module, tp, target)
        elif name == wanted:
            chosen = _load(module_name, p, name)
    return parser, chosen


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser, module = build_parser(argv)
    except ModuleNotFoundError as exc:
        return _missing_extra(exc, _first_word(argv) or "")
    args = parser.parse_args(argv)
    assert module is not None
    try:
        rc: int = module.run(args)
    except ModuleNotFoundError as exc:
        return _missing_extra(exc, args.command)
    except Exception as exc:
        # one behaviour for every command: an expected failure (a settings error included) is
        # one line and its exit code (deploy/exit_codes.py: 1 failed, 2 usage or settings, 3 a
        # service unreachable); any other exception is a bug, and its traceback is shown
        if not exit_codes.expected(exc):
            raise
        more = (getattr(args, "target", None), getattr(args, "action", None))
        words = [args.command, *(str(w) for w in more if w)]
        return exit_codes.say(" ".join(words), exc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
