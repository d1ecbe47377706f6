"""`geofence x-ingress | x-geo REGION | x-fence WORKER | fence-archiver | api | venue-sensors |
fence-webhooks`: run
one sidecar (or the fence service) in the foreground.

Settings come from GEOFENCE_AMQP_URL, GEOFENCE_POSTGRES_URL and the other GEOFENCE_*
variables (exchanges.shell.SidecarConfig); `--local` takes the URLs of the local stack
(`geofence up`) for this role's RabbitMQ user instead. SIGTERM stops it cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from deploy import exit_codes, sidecars
from deploy.settings import ENV_KEYS as STACK_KEYS
from deploy.settings import Settings, load_secrets
from exchanges import shell

ROLES = {"x-ingress": "ingress.sidecar", "x-geo": "exchanges.x_geo.sidecar",
         "x-fence": "fence.x_fence.slots", "fence-archiver": "fence.archive", "api": "fence.api_server",
         "venue-sensors": "fence.venues.sidecar", "fence-webhooks": "fence.webhooks.sidecar"}


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    if name == "x-geo":
        parser.add_argument("instance", metavar="REGION", help="the region this x-geo serves")
    elif name == "x-fence":
        parser.add_argument("instance", metavar="WORKER", help="the x-fence worker name")
    elif name == "x-ingress":
        parser.add_argument("instance", metavar="N", nargs="?", default="",
                            help="an added instance's number (`geofence ingress add`); none: the first")
    parser.add_argument("--local", action="store_true",
                        help="connect to the local stack (URLs from `geofence status --json`)")


def local_environment(role: str, instance: str) -> dict[str, str]:
    settings = Settings.from_env()
    return sidecars.environment(settings, load_secrets(settings), sidecars.Sidecar(role, instance))


def run(args: argparse.Namespace) -> int:
    role: str = args.command
    instance: str = getattr(args, "instance", "")
    env = dict(os.environ)
    main_config: Any  # the role's main takes its own config (ApiConfig for the api)
    try:
        if args.local:
            env.update(local_environment(role, instance))
        if role == "api":
            from fence.api_server import ApiConfig  # here: only the api role imports FastAPI

            api = ApiConfig.from_env(env, also_known=STACK_KEYS)
            config, main_config = api.sidecar, api
        else:
            config = shell.SidecarConfig.from_env(role, instance, env, also_known=STACK_KEYS)
            main_config = config
    except (shell.ConfigError, ValueError, OSError) as exc:
        return exit_codes.say(role, exc, usage=True)
    shell.setup_logging(config)
    module = __import__(ROLES[role], fromlist=["main"])  # by role: a sidecar imports only its own code
    if role == "api":  # the HTTP front: uvloop (the sidecars keep asyncio's loop, measured for them)
        import uvloop

        rc: int = uvloop.run(module.main(main_config))
        return rc
    rc = asyncio.run(module.main(main_config))
    return rc
