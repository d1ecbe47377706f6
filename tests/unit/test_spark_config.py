"""The nightly jobs' configuration: one URL per backend from the environment, the job's own
keys accepted next to the stack's (the systemd units set both), typos refused."""

from __future__ import annotations

import pytest

from spark_jobs.session import DEFAULT_JDBC_JAR, ConfigError, JobConfig

UNIT_ENV = {  # what /etc/geofence/spark.env holds (deploy/systemd/geofence-spark-*.service)
    "GEOFENCE_POSTGRES_URL": "postgresql://spark:s3cret@db.example:5432/geofence",
    "GEOFENCE_AMQP_URL": "amqp://fence-manager:pw@broker:5672/?name=spark-rebuild",
    "GEOFENCE_REGIONS": "a,b,c",
    "GEOFENCE_WORKERS": "w0,w1",
    "GEOFENCE_SPARK_MASTER": "spark://master:7077",
    "GEOFENCE_SPARK_PARTITIONS": "12",
    "GEOFENCE_JDBC_JAR": DEFAULT_JDBC_JAR,
}


def test_the_units_environment_is_a_valid_configuration() -> None:
    cfg = JobConfig.from_env(UNIT_ENV, jdbc_jar="https://repo.example/postgresql.jar")
    assert cfg.postgres_url == UNIT_ENV["GEOFENCE_POSTGRES_URL"]
    assert cfg.amqp_url == UNIT_ENV["GEOFENCE_AMQP_URL"]
    assert (cfg.master, cfg.partitions) == ("spark://master:7077", 12)
    assert cfg.regions == ("a", "b", "c") and cfg.workers == ("w0", "w1")
    assert "s3cret" not in cfg.masked() and ":pw@" not in cfg.masked() and "****" in cfg.masked()


def test_flags_win_over_the_environment() -> None:
    cfg = JobConfig.from_env(UNIT_ENV, master="local[2]", partitions=None, jdbc_jar="https://x/pg.jar")
    assert (cfg.master, cfg.partitions) == ("local[2]", 12)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("GEOFENCE_SPARK_MASTR", "local[*]", "unknown settings GEOFENCE_SPARK_MASTR"),
    ("GEOFENCE_SPARK_PARTITIONS", "many", "must be an integer"),
    ("GEOFENCE_SPARK_PARTITIONS", "-1", "partitions must be >= 0"),
    ("GEOFENCE_POSTGRES_URL", "mysql://x@y/z", "PostgreSQL URL"),
    ("GEOFENCE_JDBC_JAR", "/nowhere/postgresql.jar", "no JDBC driver"),
])
def test_a_bad_setting_is_refused_with_what_is_wrong(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        JobConfig.from_env({**UNIT_ENV, key: value})
