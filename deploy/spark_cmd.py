"""`geofence spark JOB`: run a nightly job (spark_jobs/) with the local stack's settings.

A job reads its settings from the environment only (spark_jobs.session.JobConfig), as the
systemd units give them. This launcher hands it the process's environment with what is not
set taken from the local stack (`geofence up`): GEOFENCE_POSTGRES_URL and GEOFENCE_AMQP_URL
(the fence-manager user) from its settings and secrets; the stack's own GEOFENCE_* keys are
checked here (deploy.settings.Settings) and accepted by the job. The benchmarks build their
configuration the same way (`job_config`).
"""

from __future__ import annotations

import argparse
import importlib
import os
from collections.abc import Mapping
from typing import Any

from deploy import settings as ls
from exchanges import topology as t
from spark_jobs import session

# job -> its module (each also a spark-submit entry point), with add_arguments(parser, name) and
# run(args, env, also_known)
JOBS = {"rebuild-bindings": "spark_jobs.rebuild_bindings", "occupancy-analytics": "spark_jobs.occupancy"}
PG_KEY, AMQP_KEY = "GEOFENCE_POSTGRES_URL", "GEOFENCE_AMQP_URL"


def local_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: the process's) with the PostgreSQL and AMQP URLs the local stack's where
    they are not set. The stack's settings (host, ports, state dir) are read from the same
    environment, less the job's own keys (the stack refuses keys it does not know)."""
    env = dict(os.environ if env is None else env)
    settings = ls.Settings.from_env({k: v for k, v in env.items() if k in t.SIDECAR_ENV_KEYS or not (
        k in session.ENV_KEYS or k.startswith(session.SPARK_PREFIX))})
    if not (env.get(PG_KEY) and env.get(AMQP_KEY)):
        pw = ls.load_secrets(settings)
        env[PG_KEY] = env.get(PG_KEY) or ls.postgres_dsn(settings, pw.postgres_password)
        env[AMQP_KEY] = env.get(AMQP_KEY) or ls.amqp_url(settings, pw.users[t.MANAGER_USER], "/",
                                                         t.MANAGER_USER)
    return env


def job_config(env: Mapping[str, str] | None = None, **overrides: Any) -> session.JobConfig:
    """A job's configuration from `env` (default: the process's), the local stack's URLs where
    not set; `overrides` (command-line flags) win."""
    return session.JobConfig.from_env(local_environment(env), also_known=ls.ENV_KEYS, **overrides)


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    importlib.import_module(JOBS[name]).add_arguments(parser, name)
    parser.set_defaults(spark_job=name)


def run(args: argparse.Namespace) -> int:
    job = importlib.import_module(JOBS[args.spark_job])
    rc: int = job.run(args, local_environment(), also_known=ls.ENV_KEYS)
    return rc
