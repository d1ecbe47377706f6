"""`geofence topology apply|show`, and a tenant's credentials (`--tenant T`): `geofence device
add|remove|list`, `geofence gateway add|remove|list`, `geofence app add|remove|list`; the
command-line side of deploy/rabbitmq/ (which sits below the rest of deploy/ and imports
nothing from it)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from deploy import exit_codes
from deploy.processes import StackError
from deploy.progress import Progress
from deploy.rabbitmq import apply as ap
from deploy.rabbitmq import device_bulk, devices
from deploy.rabbitmq.plan import Current, api_function, plan, render, section
from deploy.settings import Secrets, Settings, SettingsError, load_secrets, management_url
from exchanges import topology as t
from exchanges.tenancy import InvalidTenant, check_tenant


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    if name == "topology":
        a = sub.add_parser("apply", help="compare the broker with the topology, run what differs")
        a.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
        a.add_argument("--redeclare-input-queues", action="store_true",
                       help="delete and declare again the empty input queues declared with other "
                            "arguments (a stack from before single active consumer); stop their "
                            "publishers first: what reaches a queue meanwhile is lost")
        sub.add_parser("show", help="print every command of the topology, as for an empty "
                                    "broker (passwords masked)")
        return
    what = {"device": "device", "gateway": "gateway", "app": "application"}[name]
    a = sub.add_parser("add", help=f"create a tenant's {what} user (prints its password once)"
                                   + ("; --file: many" if what == "device" else ""))
    a.add_argument("object_id", nargs="?", metavar="ID" if what == "device" else "NAME")
    a.add_argument("--tenant", required=True, help="the tenant it publishes for (its positions are that "
                                                   "tenant's, whatever their body says)")
    a.add_argument("--password-stdin", action="store_true",
                   help="read the password from the first line of stdin")
    r = sub.add_parser("remove", help=f"delete a tenant's {what} user, its connections"
                                      + (" and MQTT queues" if what == "device" else ""))
    r.add_argument("object_id", nargs="?", metavar="ID" if what == "device" else "NAME")
    r.add_argument("--tenant", required=True)
    ls = sub.add_parser("list", help=f"list the {what} users (<tenant>.<name>)")
    ls.add_argument("--tenant", help="one tenant's only")
    ls.add_argument("--json", action="store_true", help="a JSON array of {user, tenant, name}")
    if what == "device":
        a.add_argument("--file", help="object ids, one a line ('-' for stdin): created in bulk, "
                                      "devices already there keep their password (idempotent)")
        a.add_argument("--out", help="with --file: write the credentials CSV here (mode 600), "
                                     "not to stdout")
        r.add_argument("--file", help="object ids, one a line ('-' for stdin)")


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _say(line: str) -> None:
    print(line, flush=True)


def show_script(settings: Settings, pw: Secrets) -> str:
    """Every command of the topology for an empty broker, as a shell script (masked)."""
    defs = ap.definitions_for(settings, pw)
    pws = ap.passwords(pw)
    topo = settings.topology
    lines = [
        "#!/bin/sh",
        "# The pipeline's RabbitMQ topology as applied to an empty broker, for regions "
        f"{','.join(topo.regions)} and workers {','.join(topo.workers)}",
        "# (GEOFENCE_REGIONS, GEOFENCE_WORKERS). Passwords are masked (****): they are in the "
        f"state dir's {settings.secrets_file.name}.",
        "# `geofence topology apply` runs the lines that differ from the broker.",
        "set -e",
        ': "${GEOFENCE_PASSWORD:?the geofence user\'s password}"',
        api_function(management_url(settings)),
    ]
    last = None
    for step in plan(defs, pws, Current.empty()):
        if section(step) != last:
            last = section(step)
            lines += ["", f"# {last}"]
        lines.append(render(step, pws.values()))
    return "\n".join(lines)


def _topology(args: argparse.Namespace, settings: Settings, pw: Secrets) -> int:
    if args.action == "show":
        print(show_script(settings, pw))
        return 0
    steps = ap.apply(settings, pw, _say, dry_run=bool(args.dry_run),
                     redeclare=bool(args.redeclare_input_queues))
    if not steps:
        print("the broker holds the topology: nothing to change")
    elif args.dry_run:
        print(f"{len(steps)} change(s) to apply (dry run: nothing was run)")
    else:
        print(f"{len(steps)} change(s) applied")
    return 0


def _bulk(args: argparse.Namespace, settings: Settings, pw: Secrets) -> int:
    try:
        check_tenant(args.tenant)
    except InvalidTenant as exc:
        raise device_bulk.BadIds(str(exc)) from None
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    ids = device_bulk.parse_ids(text, devices.RESERVED)
    broker = device_bulk.Broker(ap.management(settings, pw).request)
    if args.action == "remove":
        device_bulk.remove_many(broker, args.tenant, ids, _progress)
        return 0
    with Progress(len(ids), "devices", "device") as bar:  # a bar with its ETA on a terminal
        rows = device_bulk.add_many(broker, args.tenant, ids, bar.say, step=bar.to)
    out = device_bulk.credentials_csv(rows, args.tenant)
    if args.out:
        path = Path(args.out)
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(out)
    else:
        sys.stdout.write(out)
    created = sum(p is not None for _, p in rows)
    print(f"{created:,} devices added, {len(rows) - created:,} were there already (rights set again)"
          + (f"; credentials in {args.out}" if args.out else ""), file=sys.stderr)
    return 0


def _gateway_or_app(args: argparse.Namespace, settings: Settings, pw: Secrets, app: bool) -> int:
    what, tag = ("application", t.APP_TAG) if app else ("gateway", t.GATEWAY_TAG)
    if args.action == "list":
        _print_users(devices.list_devices(settings, pw, args.tenant, tag=tag), args.json)
        return 0
    if not args.object_id:
        raise devices.DeviceError(f"an {what} name" if app else f"a {what} name")
    user = devices.user_of(args.tenant, args.object_id)
    if args.action == "remove":
        (devices.remove_app if app else devices.remove_gateway)(settings, pw, args.tenant, args.object_id,
                                                                _progress)
        print(f"{what} {user} removed")
        return 0
    given = sys.stdin.readline().rstrip("\r\n") if args.password_stdin else None
    add = devices.add_app if app else devices.add_gateway
    password = add(settings, pw, args.tenant, args.object_id, given, _progress)
    if app:
        print(f"application {user} added: AMQP user {user} in vhost {t.FENCES_VHOST}; its queues are named "
              f"{t.app_queue_prefix(user)}<anything>, bound to {t.EVENTS_EXCHANGE} "
              f"({t.EVENTS_TOPIC_PREFIX}.{args.tenant}.<fence>.<kind>.<object>) or "
              f"{t.TENANT_BATCHES_EXCHANGE} (key {args.tenant}); requests to the fence API on "
              f"{t.API_EXCHANGE}")
    else:
        print(f"gateway {user} added: in vhost {t.INGRESS_VHOST} it publishes batches to exchange "
              f"{t.GATEWAY_EXCHANGE} with routing key {args.tenant} (AMQP), or positions to "
              f"{t.POSITIONS_TOPIC_PREFIX}/{args.tenant}/<object_id> (MQTT login {devices.mqtt_login(user)})")
    if given is None:
        print(f"password (shown once, store it with the {what}): {password}")
    return 0


def _print_users(users: list[str], as_json: bool) -> None:
    """One `<tenant>.<name>` a line, or a JSON array (a tenant's name has no dot)."""
    if not as_json:
        for user in users:
            print(user)
        return
    rows = [{"user": u, "tenant": u.partition(".")[0], "name": u.partition(".")[2]} for u in users]
    print(json.dumps(rows, indent=2))


def _device(args: argparse.Namespace, settings: Settings, pw: Secrets) -> int:
    if args.action == "list":
        _print_users(devices.list_devices(settings, pw, args.tenant), args.json)
        return 0
    if getattr(args, "file", None):
        if args.object_id or getattr(args, "password_stdin", False):
            raise devices.DeviceError("--file takes the ids from the file: no ID, no --password-stdin")
        return _bulk(args, settings, pw)
    if not args.object_id:
        raise devices.DeviceError("an object id, or --file with one per line")
    object_id: str = args.object_id
    user = devices.user_of(args.tenant, object_id)
    if args.action == "remove":
        devices.remove_device(settings, pw, args.tenant, object_id, _progress)
        print(f"device {user} removed")
        return 0
    given = sys.stdin.readline().rstrip("\r\n") if args.password_stdin else None
    password = devices.add(settings, pw, args.tenant, object_id, given, _progress)
    print(f"device {user} added: MQTT login {devices.mqtt_login(user)}, client id {user}, "
          f"topic {t.POSITIONS_TOPIC_PREFIX}/{args.tenant}/{object_id}")
    if given is None:
        print(f"password (shown once, store it on the device): {password}")
    return 0


def run(args: argparse.Namespace) -> int:
    command: str = args.command
    try:
        settings = Settings.from_env()
        pw = load_secrets(settings)
        if command == "topology":
            return _topology(args, settings, pw)
        if command in ("gateway", "app"):
            return _gateway_or_app(args, settings, pw, app=command == "app")
        return _device(args, settings, pw)
    except (SettingsError, StackError, OSError, device_bulk.BulkError) as exc:
        return exit_codes.say(f"{command} {args.action}", exc)
