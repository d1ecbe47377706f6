"""Both nightly jobs on a real Spark standalone cluster (`geofence spark cluster up`: a master and
a worker from the pyspark package), submitted as an operator would (`geofence spark <job>
--master spark://127.0.0.1:7077`, a driver process of its own, executors on the worker
importing the project), against the same inputs as a local-mode run in this process: the
outputs are exactly the local ones (and, for the analytics, the reference's)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from deploy.settings import ConnectionSettings
from exchanges import routing_store
from spark_jobs import rebuild_bindings
from spark_jobs.occupancy_reference import compute
from spark_jobs.session import JobConfig
from tests.integration.clients import geofence
from tests.integration.test_spark_occupancy import insert, run, tables
from tests.integration.test_spark_rebuild import job_args, seed_drift
from tests.occupancy_events import DAYS, assert_matches, generate

pytestmark = pytest.mark.integration
MASTER_UI = "http://127.0.0.1:8090/json/"


def finished_apps() -> list[dict[str, Any]]:
    with urllib.request.urlopen(MASTER_UI, timeout=10) as r:
        apps: list[dict[str, Any]] = json.load(r).get("completedapps", [])
        return apps


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    up = geofence("spark", "cluster", "up")
    assert up.returncode == 0, up.stdout + up.stderr
    status = geofence("spark", "cluster", "status")
    assert status.returncode == 0 and "1 worker(s) alive" in status.stdout, status.stdout
    yield "spark://127.0.0.1:7077"
    down = geofence("spark", "cluster", "down")
    assert down.returncode == 0, down.stdout + down.stderr


def submitted(name: str, before: list[dict[str, Any]]) -> dict[str, Any]:
    """The application the master ran for `name` since `before` (it ran there, not locally)."""
    ids = {a["id"] for a in before}
    new = [a for a in finished_apps() if a["id"] not in ids and a["name"] == name]
    assert len(new) == 1, [a["name"] for a in finished_apps()]
    assert new[0]["state"] == "FINISHED" and new[0]["cores"] > 0
    return new[0]


async def test_occupancy_analytics_on_the_cluster_equals_local_mode(
        cluster: str, spark: object, spark_config: JobConfig, occupancy_db: Any, pg_schema: str) -> None:
    events = generate()
    await insert(occupancy_db, pg_schema, events)
    await run(spark_config, pg_schema, DAYS[-1], len(DAYS))  # local mode, in this process
    local = await tables(occupancy_db, pg_schema)
    await occupancy_db.execute(f'TRUNCATE "{pg_schema}".occupancy_hourly, "{pg_schema}".occupancy_open, '
                               f'"{pg_schema}".occupancy_day, "{pg_schema}".occupancy_busiest, '
                               f'"{pg_schema}".occupancy_forecast')
    before = finished_apps()
    done = geofence("spark", "occupancy-analytics", "--master", cluster, "--schema", pg_schema,
                    "--day", DAYS[-1].isoformat(), "--days", str(len(DAYS)))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    submitted("geofence-occupancy-analytics", before)
    on_cluster = await tables(occupancy_db, pg_schema)
    assert on_cluster == local
    assert_matches(on_cluster, compute(events, DAYS[0], DAYS[-1]), DAYS)


async def test_rebuild_bindings_on_the_cluster_equals_local_mode(
        cluster: str, spark: Any, spark_config: JobConfig, pg_schema: str, stack: ConnectionSettings,
        tenant: str) -> None:
    dsn = stack["postgres"]["dsn"]
    wm = await routing_store.read_worldmap(dsn)
    assert wm is not None
    conn = await asyncpg.connect(dsn)
    try:
        ids, _, expected = await seed_drift(conn, pg_schema, wm, tenant)

        async def outputs(run_id: str) -> tuple[set[tuple[Any, ...]], set[tuple[Any, ...]]]:
            s = f'"{pg_schema}"'
            binding = {(r["fence_id"], bytes(r["ranges"]), bytes(r["interior"]), r["version"])
                       for r in await conn.fetch(f"SELECT * FROM {s}.fence_binding WHERE run_id = $1",
                                                 run_id)}
            diff = {(r["region"], r["fence_id"], r["action"], r["ranges_removed"], r["ranges_added"],
                     r["phase"])
                    for r in await conn.fetch(f"SELECT * FROM {s}.fence_binding_diff WHERE run_id = $1",
                                              run_id)}
            return binding, diff

        job = rebuild_bindings.Job(spark_config, job_args(schema=pg_schema, dry_run=True))
        report = await asyncio.to_thread(job.run, spark)  # local mode, in this process
        local = await outputs(report.run_id)
        assert {b[0] for b in local[0]} == set(ids) and {d[:5] for d in local[1]} == expected

        before = finished_apps()
        done = geofence("spark", "rebuild-bindings", "--master", cluster, "--schema", pg_schema, "--dry-run",
                        "--resplit", "never", "--quiet")
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        submitted("geofence-rebuild-bindings", before)
        runs = await conn.fetch(f'SELECT run_id, status, fences FROM "{pg_schema}".fence_binding_run '
                                "WHERE run_id <> $1", report.run_id)
        assert len(runs) == 1 and runs[0]["status"] == "dry run" and runs[0]["fences"] == 30
        assert await outputs(runs[0]["run_id"]) == local
    finally:
        await conn.close()
