"""The nightly jobs' configuration: one URL per backend from the environment, the job's own
keys accepted next to the stack's (the systemd units set both), typos refused. A job reads
nothing but its environment; `geofence spark` (deploy/spark_cmd.py) fills in the local stack's
URLs, and no module of spark_jobs/ imports deploy."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from deploy import cli, spark_cmd
from deploy import settings as ls
from exchanges import topology as t
from exchanges.settings import ConfigError
from spark_jobs.session import DEFAULT_JDBC_JAR, JobConfig

SPARK_JOBS_DIR = Path(__file__).resolve().parents[2] / "spark_jobs"

PG_URL = "postgresql://spark:s3cret@db.example:5432/geofence"
AMQP_URL = "amqp://fence-manager:pw@broker:5672/?name=spark-rebuild"
UNIT_ENV = {  # what /etc/geofence/spark.env holds (deploy/systemd/geofence-spark-*.service)
    "GEOFENCE_POSTGRES_URL": PG_URL,
    "GEOFENCE_AMQP_URL": AMQP_URL,
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
    ("GEOFENCE_SPARK_MASTR", "local[*]", "unknown setting GEOFENCE_SPARK_MASTR"),
    ("GEOFENCE_SPARK_PARTITIONS", "many", "must be an integer"),
    ("GEOFENCE_SPARK_PARTITIONS", "-1", "partitions must be >= 0"),
    ("GEOFENCE_POSTGRES_URL", "mysql://x@y/z", "PostgreSQL URL"),
    ("GEOFENCE_JDBC_JAR", "/nowhere/postgresql.jar", "no JDBC driver"),
])
def test_a_bad_setting_is_refused_with_what_is_wrong(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        JobConfig.from_env({**UNIT_ENV, key: value})


def test_the_job_reads_nothing_but_its_environment() -> None:
    with pytest.raises(ConfigError, match="no PostgreSQL URL: set GEOFENCE_POSTGRES_URL"):
        JobConfig.from_env({"GEOFENCE_SPARK_MASTER": "local[2]"})
    cfg = JobConfig.from_env({"GEOFENCE_POSTGRES_URL": PG_URL})
    assert (cfg.amqp_url, cfg.regions, cfg.workers) == ("", t.Topology.regions, t.Topology.workers)
    with pytest.raises(ConfigError, match="GEOFENCE_REGIONS / GEOFENCE_WORKERS"):
        JobConfig.from_env({**UNIT_ENV, "GEOFENCE_REGIONS": "a,,b"})
    # the local stack's keys are its launcher's: accepted when it says so, else refused
    stack_env = {**UNIT_ENV, "GEOFENCE_PG_PORT": "6543"}
    with pytest.raises(ConfigError, match="unknown setting GEOFENCE_PG_PORT"):
        JobConfig.from_env(stack_env)
    assert JobConfig.from_env(stack_env, also_known=ls.ENV_KEYS).postgres_url == PG_URL


def test_geofence_spark_fills_in_the_local_stacks_urls(tmp_path: Path) -> None:
    settings = ls.Settings(state_dir=tmp_path, pg_port=6543)
    pw = ls.ensure_secrets(settings)
    env = {"GEOFENCE_STATE_DIR": str(tmp_path), "GEOFENCE_PG_PORT": "6543", "GEOFENCE_WORKERS": "w0,w1,w2",
           "GEOFENCE_SPARK_PARTITIONS": "3", "GEOFENCE_JDBC_JAR": "https://x/pg.jar"}
    cfg = spark_cmd.job_config(env, master="local[2]")
    assert cfg.postgres_url == ls.postgres_dsn(settings, pw.postgres_password)
    assert ":6543/" in cfg.postgres_url
    assert cfg.amqp_url == ls.amqp_url(settings, pw.users[t.MANAGER_USER], "/", t.MANAGER_USER)
    assert (cfg.master, cfg.partitions, cfg.workers) == ("local[2]", 3, ("w0", "w1", "w2"))
    # URLs that are set win, and then the stack's secrets are not read
    given = {**env, "GEOFENCE_STATE_DIR": str(tmp_path / "none"), "GEOFENCE_POSTGRES_URL": PG_URL,
             "GEOFENCE_AMQP_URL": AMQP_URL}
    cfg = spark_cmd.job_config(given)
    assert (cfg.postgres_url, cfg.amqp_url) == (PG_URL, AMQP_URL)
    with pytest.raises(ls.StackNotSetUpError):
        spark_cmd.job_config({**env, "GEOFENCE_STATE_DIR": str(tmp_path / "none")})


def test_geofence_spark_launches_each_job_and_refuses_a_typo(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert set(spark_cmd.JOBS) == set(cli.SPARK_JOBS) - {"cluster"}  # `spark cluster`: the local cluster
    monkeypatch.setenv("GEOFENCE_POSTGRES_URL", PG_URL)
    monkeypatch.setenv("GEOFENCE_AMQP_URL", AMQP_URL)
    monkeypatch.setenv("GEOFENCE_SPARK_MASTR", "local[2]")
    assert cli.main(["spark", "occupancy-analytics", "--day", "2024-03-04"]) == 2
    err = capsys.readouterr().err
    assert "unknown setting GEOFENCE_SPARK_MASTR" in err and "Traceback" not in err


def test_no_module_of_spark_jobs_imports_deploy() -> None:
    """The layers: hilbert_c <- exchanges <- ingress, fence <- spark_jobs <- deploy."""
    found = []
    for path in sorted(SPARK_JOBS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}: {n}" for n in names if n == "deploy" or n.startswith("deploy.")]
    assert len(list(SPARK_JOBS_DIR.glob("*.py"))) > 5 and found == []
