"""The one `geofence` command.

Each subcommand lives with the part of the product it drives and is imported lazily,
so `geofence status` does not pay for numpy/shapely and nothing is read at import time.
A subcommand module exposes `add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from types import ModuleType

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "up": ("deploy.local_stack_cmd", "start the local stack (RabbitMQ, PostgreSQL, memcached)"),
    "down": ("deploy.local_stack_cmd", "stop what `geofence up` started"),
    "status": ("deploy.local_stack_cmd", "show the local stack; --json for connection settings"),
    "demo": ("deploy.demo", "run the demo against the local stack"),
    "kernel": ("hilbert_c.cli", "Hilbert kernel tools: encode, decode, cover"),
}


def build_parser(argv: list[str]) -> tuple[argparse.ArgumentParser, ModuleType | None]:
    parser = argparse.ArgumentParser(prog="geofence", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # Only import the module of the subcommand actually asked for.
    wanted = next((a for a in argv if not a.startswith("-")), None)
    chosen: ModuleType | None = None
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == wanted:
            module = importlib.import_module(module_name)
            module.add_arguments(p, name)
            chosen = module
    return parser, chosen


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser, module = build_parser(argv)
    args = parser.parse_args(argv)
    assert module is not None
    rc: int = module.run(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
