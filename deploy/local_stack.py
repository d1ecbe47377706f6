"""The old path of the stack's settings, kept only for spark_jobs/session.py (JobConfig.from_env
imports it inside a function). That import is being removed on its own branch; delete this
module then. Everything else imports deploy.settings, deploy.processes, deploy.services or
deploy.stack."""

from deploy.settings import Settings, amqp_url, load_secrets, postgres_dsn

__all__ = ["Settings", "amqp_url", "load_secrets", "postgres_dsn"]
