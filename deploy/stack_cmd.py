"""`geofence up | down | status [--json]`: the command-line side of deploy.stack."""

from __future__ import annotations

import argparse
import dataclasses
import json

from deploy import exit_codes
from deploy.processes import StackError
from deploy.settings import (
    Secrets,
    Settings,
    SettingsError,
    StackNotSetUpError,
    connection_settings,
    load_secrets,
)
from deploy.stack import down, format_status, status, up
from exchanges import settings_registry


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    if name == "up":
        parser.add_argument("--broker-nodes", type=int, choices=(1, 3), default=None,
                            help="RabbitMQ nodes in the first broker's cluster (recorded in the state "
                                 "dir; GEOFENCE_BROKER_NODES, else what was recorded, else 1)")
    if name == "status":
        parser.add_argument("--json", action="store_true",
                            help="print the connection settings (with passwords) as JSON")


def _say(line: str) -> None:
    print(line, flush=True)


def _up(settings: Settings) -> int:
    up(settings, _say)
    return _status(settings, as_json=False)


def _down(settings: Settings) -> int:
    down(settings, _say)
    return 0


def _status(settings: Settings, as_json: bool) -> int:
    try:
        pw: Secrets | None = load_secrets(settings)
    except StackNotSetUpError:
        if as_json:
            raise
        pw = None
    st = status(settings, pw)
    if as_json:
        assert pw is not None
        print(json.dumps(connection_settings(settings, pw), indent=2))
    else:
        print(format_status(st))
        if pw is None:
            print("(no credentials yet: run `geofence up`)")
    return 0 if st.all_running else 1


def run(args: argparse.Namespace) -> int:
    command: str = args.command
    try:
        settings = Settings.from_env()
        if command == "up":
            nodes = getattr(args, "broker_nodes", None)
            if nodes is not None and nodes != settings.broker_nodes:
                if settings_registry.read("GEOFENCE_BROKER_NODES"):
                    raise SettingsError("GEOFENCE_BROKER_NODES is set: unset it, or use it instead of "
                                        "--broker-nodes")
                settings = dataclasses.replace(settings, broker_nodes=nodes)
            return _up(settings)
        if command == "down":
            return _down(settings)
        return _status(settings, as_json=bool(args.json))
    except (SettingsError, StackError) as exc:
        return exit_codes.say(command, exc)
