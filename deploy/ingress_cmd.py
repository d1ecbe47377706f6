"""`geofence ingress list | add | remove NAME`: the x-ingress instances, changed while positions
flow (deploy/ingress_ops.py), with a SUMMARY line."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

import asyncpg

from deploy import exit_codes, ingress_ops
from deploy.processes import StackError
from deploy.progress import Steps
from deploy.settings import Settings, SettingsError, load_secrets


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("action", choices=("list", "add", "remove"),
                        help="list the instances and their partitions; add one (it takes its share of the "
                             "partitions, live); remove one (its partitions go to the others, live)")
    parser.add_argument("instance", nargs="?", help="remove: the instance (x-ingress-N)")
    parser.add_argument("--json", action="store_true", help="list: print JSON")


def run(args: argparse.Namespace) -> int:
    if (args.action == "remove") != bool(args.instance):
        print("geofence ingress: remove takes the instance's name (x-ingress-N), add and list none",
              file=sys.stderr)
        return 2
    try:
        settings = Settings.from_env()
        pw = load_secrets(settings)
        if args.action == "list":
            data = asyncio.run(ingress_ops.gather(settings, pw))
            print(json.dumps(data, indent=2) if args.json else ingress_ops.human(data))
            return 0 if all(r["up"] for r in data["instances"]) else 1
        with Steps(f"ingress {args.action}", f"ingress {args.action}", settings.progress_file,
                   "geofence ingress") as steps:
            if args.action == "add":
                outcome = asyncio.run(ingress_ops.add(settings, pw, steps.say))
            else:
                outcome = asyncio.run(ingress_ops.remove(settings, pw, args.instance, steps.say))
    except (SettingsError, StackError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return exit_codes.say(f"ingress {args.action}", exc)
    print(outcome.line(), flush=True)
    return 0
