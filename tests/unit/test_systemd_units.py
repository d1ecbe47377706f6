"""The systemd units in deploy/systemd: one per sidecar kind, restarted on failure, given
more time to stop than the sidecars take to drain."""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

from exchanges.shell import SidecarConfig

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
EXPECTED = {"geofence-x-ingress.service": "geofence x-ingress",
            "geofence-x-geo@.service": "geofence x-geo %i",
            "geofence-x-fence@.service": "geofence x-fence %i",
            "geofence-fence-archiver.service": "geofence fence-archiver",
            "geofence-api.service": "geofence api"}


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNITS / name)
    return parser


def test_every_sidecar_has_a_unit() -> None:
    assert {p.name for p in UNITS.glob("*.service")} >= set(EXPECTED)


@pytest.mark.parametrize(("name", "command"), sorted(EXPECTED.items()))
def test_unit_runs_the_sidecar_and_restarts_it(name: str, command: str) -> None:
    service = unit(name)["Service"]
    assert service["ExecStart"].endswith(command)
    assert service["Restart"] == "on-failure"
    assert service["KillSignal"] == "SIGTERM"
    drain = SidecarConfig("r", "i", "amqp://h/", "postgresql://h/").drain_s
    assert float(service["TimeoutStopSec"]) > drain
    assert service["User"] != "root"
    assert service["EnvironmentFile"].lstrip("-").startswith("/etc/geofence/")  # "-": optional (per instance)


NIGHTLY = {"geofence-spark-rebuild-bindings": "spark_jobs/rebuild_bindings.py",
           "geofence-spark-occupancy-analytics": "spark_jobs/occupancy.py"}


@pytest.mark.parametrize(("name", "script"), sorted(NIGHTLY.items()))
def test_each_nightly_job_has_a_timer_and_a_spark_submit_service(name: str, script: str) -> None:
    timer = unit(f"{name}.timer")["Timer"]
    assert timer["Unit"] == f"{name}.service"
    assert timer["OnCalendar"] and timer["Persistent"] == "true"
    service = unit(f"{name}.service")["Service"]
    start = service["ExecStart"].replace("\\\n", " ").split()
    assert start[0].endswith("/spark-submit")
    assert start[start.index("--jars") + 1] == "/usr/share/java/postgresql.jar"
    assert start[start.index("--master") + 1] == "${GEOFENCE_SPARK_MASTER}"
    assert any(a.startswith("spark.pyspark.python=") for a in start)
    assert next(a for a in start if a.endswith(".py")).endswith(script)
    assert (UNITS.parents[1] / script).is_file()
    assert service["Type"] == "oneshot" and service["User"] != "root"


def test_the_archive_months_run_nightly_through_the_geofence_command() -> None:
    timer = unit("geofence-archive-months.timer")["Timer"]
    assert timer["Unit"] == "geofence-archive-months.service"
    assert timer["OnCalendar"] and timer["Persistent"] == "true"
    service = unit("geofence-archive-months.service")["Service"]
    assert service["ExecStart"].split()[1:] == ["archive", "maintain"]
    assert service["Type"] == "oneshot" and service["User"] != "root"
    assert service["EnvironmentFile"] == "/etc/geofence/spark.env"
