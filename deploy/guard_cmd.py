"""`geofence broker-guard`: run the broker's login guard (exchanges/broker_guard.py) with the
settings of its environment (GEOFENCE_GUARD_*: `geofence settings`). `geofence up` starts it
before RabbitMQ; on a host, its systemd unit does."""

from __future__ import annotations

import argparse
import os

from exchanges import broker_guard


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.description = __doc__.splitlines()[0]


def run(args: argparse.Namespace) -> int:
    return broker_guard.main(dict(os.environ))
