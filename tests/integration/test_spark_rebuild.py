"""rebuild-bindings on a real local Spark session and the real PostgreSQL (and, for the
repair, the running pipeline): the coverings equal the kernel's, the diff is exactly the
drift, and a repaired binding routes positions again."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import asyncpg
import numpy as np
from shapely.geometry import MultiPolygon, Point, Polygon, box, mapping

import hilbert_c as hk
from deploy.settings import ConnectionSettings, Settings
from exchanges import routing_store
from exchanges import topology as t
from exchanges.fence_binding import INDEX_BITS
from exchanges.tenancy import qualify
from exchanges.worldmap import AREA, Worldmap
from fence.manager import FenceManager
from fence.spec import MAX_RANGES, FenceSpec, bindings, choose_bits
from hilbert_c.covering import circle
from spark_jobs import rebuild_bindings
from spark_jobs.bindings_core import to_bytes
from spark_jobs.session import JobConfig, clone_schema
from tests.integration.test_pipeline import (  # noqa: F401  (fixtures)
    AmqpEvents,
    fences,
    pipeline,
    publish_positions,
    region_at,
    tid,
    trajectory,
)

TABLES = ("fence", "fence_range", "fence_binding", "fence_binding_run", "fence_binding_diff")


def job_args(**kw: Any) -> Any:
    args = dict(master=None, partitions=None, schema="public", dry_run=False, resplit="never",
                max_imbalance=1.25, settle_timeout=30.0, quiet=True)
    return SimpleNamespace(**{**args, **kw})


def kernel_covering(geom: Polygon | MultiPolygon) -> tuple[bytes, bytes]:
    """Straight from the kernel (the shapely path the API validates with), not the job's."""
    cov = hk.cover(geom, choose_bits(geom), max_ranges=MAX_RANGES).to_bits(INDEX_BITS)
    return to_bytes(cov.ranges, cov.interior)


def shapes(n: int) -> list[Polygon | MultiPolygon]:
    rng = np.random.default_rng(5)
    out: list[Polygon | MultiPolygon] = []
    for i in range(n):
        lon, lat = 9.42 + 0.26 * rng.random(), 47.02 + 0.26 * rng.random()
        if i % 5 == 3:
            out.append(box(lon, lat, lon + 0.01, lat + 0.004).difference(box(lon + 0.004, lat + 0.001,
                                                                             lon + 0.006, lat + 0.003)))
        elif i % 5 == 4:
            out.append(MultiPolygon([circle(lon, lat, 120.0), circle(lon + 0.01, lat, 80.0)]))
        else:
            out.append(circle(lon, lat, float(rng.uniform(40, 2500))))
    return out


async def seed_drift(conn: Any, schema: str, wm: Worldmap, tenant: str
                     ) -> tuple[list[str], list[Polygon | MultiPolygon], set[tuple[str, str, str, int, int]]]:
    """30 fences of `tenant` in `schema` with bindings drifted 4 ways (right, a range missing, a
    region too many, none at all) and a deleted fence: the ids (qualified, as the store holds
    them), the shapes and the diff a rebuild must find ((region, fence, action, removed, added))."""
    geoms = shapes(30)
    ids = [qualify(tenant, f"rb-{i:02d}") for i in range(len(geoms))]
    expected: set[tuple[str, str, str, int, int]] = set()
    await clone_schema(conn, schema, TABLES)
    for i, (fid, g) in enumerate(zip(ids, geoms, strict=True)):
        x0, y0, x1, y1 = g.bounds
        await conn.execute(f'INSERT INTO "{schema}".fence (id, geometry, options, version, min_lon, '
                           "min_lat, max_lon, max_lat) "
                           "VALUES ($1, $2, '{\"timeout_s\": 60}', $3, $4, $5, $6, $7)",
                           fid, json.dumps(mapping(g)), i + 1, x0, y0, x1, y1)
        b = bindings(g, wm)
        rows = {r: to_bytes(*v) for r, v in b.per_region.items()}
        if 10 <= i < 15:  # drift: one range missing in its first region -> change, 0 removed, 1 added
            region = sorted(rows)[0]
            r, f = b.per_region[region]
            rows[region] = to_bytes(r[1:], f[1:])
            expected.add((region, fid, "change", 0, 1))
        elif 15 <= i < 20:  # a region bound that the fence does not touch -> remove
            other = next(r for r in wm.regions if r not in rows) if len(rows) < len(wm.regions) else None
            if other is not None:
                rows[other] = to_bytes(np.array([[5, 9]], np.uint64), np.array([True]))
                expected.add((other, fid, "remove", 1, 0))
        elif i >= 20:  # nothing bound -> add in every region it touches
            expected |= {(r, fid, "add", 0, len(v[0])) for r, v in b.per_region.items()}
            rows = {}
        for region, (rb, fb) in rows.items():
            await conn.execute(f'INSERT INTO "{schema}".fence_range (fence_id, region, version, bits, '
                               "ranges, interior) VALUES ($1, $2, $3, $4, $5, $6)",
                               fid, region, i + 1, b.bits, rb, fb)
    await conn.execute(f'INSERT INTO "{schema}".fence (id, geometry, options, version, min_lon, '
                       "min_lat, max_lon, max_lat, deleted_at) "
                       "VALUES ($2, $1, '{\"timeout_s\": 60}', 3, 0, 0, 1, 1, now())",
                       json.dumps(mapping(geoms[0])), qualify(tenant, "rb-gone"))
    return ids, geoms, expected


async def test_dry_run_coverings_equal_the_kernel_and_the_diff_is_the_drift(
        spark: Any, spark_config: JobConfig, pg_schema: str, stack: ConnectionSettings, tenant: str) -> None:
    dsn = stack["postgres"]["dsn"]
    wm = await routing_store.read_worldmap(dsn)
    assert wm is not None
    conn = await asyncpg.connect(dsn)
    try:
        ids, geoms, expected = await seed_drift(conn, pg_schema, wm, tenant)

        job = rebuild_bindings.Job(spark_config, job_args(schema=pg_schema, dry_run=True))
        report = await asyncio.to_thread(job.run, spark)  # the job runs its own event loops

        assert (report.fences, report.failed, report.status) == (30, 0, "dry run")
        stored = {r["fence_id"]: (bytes(r["ranges"]), bytes(r["interior"]), r["version"], r["run_id"])
                  for r in await conn.fetch(f'SELECT * FROM "{pg_schema}".fence_binding')}
        assert set(stored) == set(ids)  # the deleted fence is not covered
        for i, (fid, g) in enumerate(zip(ids, geoms, strict=True)):
            assert stored[fid][:2] == kernel_covering(g), fid
            assert stored[fid][2:] == (i + 1, report.run_id)
        diff = {(r["region"], r["fence_id"], r["action"], r["ranges_removed"], r["ranges_added"])
                for r in await conn.fetch(f'SELECT * FROM "{pg_schema}".fence_binding_diff WHERE run_id = $1',
                                          report.run_id)}
        assert diff == expected
        outcomes = await conn.fetch(f'SELECT DISTINCT phase, outcome FROM "{pg_schema}".fence_binding_diff')
        assert {(r["phase"], r["outcome"]) for r in outcomes} <= {("repair", "dry-run"), ("grow", "dry-run"),
                                                                  ("shrink", "dry-run")}
        run = await conn.fetchrow(f'SELECT * FROM "{pg_schema}".fence_binding_run WHERE run_id = $1',
                                  report.run_id)
        assert run is not None and run["status"] == "dry run" and run["fences"] == 30
        assert run["diff_rows"] == report.diff_rows and run["finished_at"] is not None
    finally:
        await conn.close()


async def test_a_fence_with_a_lost_binding_is_repaired_and_routes_again(
        spark: Any, pipeline: ConnectionSettings, fences: FenceManager, tenant: str) -> None:  # noqa: F811
    settings = Settings.from_env()
    fid, obj = tid(tenant, "frb"), tid(tenant, "obj")
    geom = box(9.590, 47.100, 9.600, 47.110)
    change = await fences.put(FenceSpec(fence_id=fid, geometry=geom, timeout_s=600), create=True)
    wm = await routing_store.read_worldmap(pipeline["postgres"]["dsn"])
    assert wm is not None
    b = bindings(geom, wm)
    region = region_at(wm, 9.595, 47.105)  # where the object will report from
    assert region in b.per_region
    # that region's binding is lost, in the store and in x-geo (as after an operator's mistake)
    assert await fences.rebind(fid, change.version, b.bits, {region: None})
    await fences.applied()
    conn = await asyncpg.connect(pipeline["postgres"]["dsn"])
    try:
        assert await routing_store.region_binding(conn, region, fid) is None

        cfg = JobConfig(postgres_url=pipeline["postgres"]["dsn"],
                        amqp_url=pipeline["users"][t.MANAGER_USER][t.region_vhost(settings.regions[0])],
                        master="local[2]", partitions=4, regions=settings.regions, workers=settings.workers)
        report = await asyncio.to_thread(rebuild_bindings.Job(cfg, job_args()).run, spark)

        assert report.status == "done" and report.applied >= 1
        row = await conn.fetchrow("SELECT * FROM fence_binding_diff WHERE run_id = $1 AND fence_id = $2",
                                  report.run_id, fid)
        assert row is not None
        assert (row["phase"], row["region"], row["action"], row["outcome"]) == (
            "repair", region, "add", "applied")
        assert (row["ranges_before"], row["ranges_removed"]) == (0, 0)
        assert row["ranges_after"] == row["ranges_added"] == len(b.per_region[region][0])
        restored = await routing_store.region_binding(conn, region, fid)
        assert restored is not None and restored.version == change.version
        assert to_bytes(restored.ranges, restored.interior) == to_bytes(*b.per_region[region])
        version = await conn.fetchval("SELECT version FROM fence WHERE id = $1", fid)
        assert version == change.version  # a repair is not a change of the fence
    finally:
        await conn.close()

    # x-geo has the binding back: a position inside gives an ENTER
    steps = trajectory([(9.585, 47.105), (9.595, 47.105)])
    async with AmqpEvents(pipeline) as amqp:
        await amqp.watch(fid)
        await publish_positions(pipeline, obj, steps)
        await amqp.until({fid: (fid, "enter", obj, steps[-1].ts, "entered")})
    assert amqp.events(obj) == [(fid, "enter", obj, steps[-1].ts, "entered")]



async def test_a_live_resplit_balances_the_regions_and_every_fence_still_routes(
        spark: Any, pipeline: ConnectionSettings, fences: FenceManager, tenant: str) -> None:  # noqa: F811
    """Fences crowded into the first region: the job re-splits the live worldmap (grow, store
    the map, wait for x-ingress, shrink); the regions' loads even out, every fence's live
    bindings are its cut under the new map, and a position inside a fence still ENTERs."""
    settings = Settings.from_env()
    dsn = pipeline["postgres"]["dsn"]
    wm0 = await routing_store.read_worldmap(dsn)
    assert wm0 is not None and len(wm0.regions) >= 2
    rng = np.random.default_rng(11)
    x0, y0, x1, y1 = AREA
    points = [(float(x), float(y)) for x, y in zip(rng.uniform(x0, x1, 4000), rng.uniform(y0, y1, 4000),
                                                    strict=True)
              if region_at(wm0, float(x), float(y)) == wm0.regions[0]]
    # at least 24 fences, and as many more as it takes to crowd the first region whatever is
    # live already (the demo's fences, say): its load at twice the others' (imbalance >= 1.33)
    conn = await asyncpg.connect(dsn)
    try:
        loads = {r["region"]: int(r["n"]) for r in await conn.fetch(
            "SELECT region, sum(octet_length(ranges) / 16) AS n FROM fence_range GROUP BY region")}
    finally:
        await conn.close()
    first, others = loads.get(wm0.regions[0], 0), sum(v for k, v in loads.items() if k != wm0.regions[0])
    made: dict[str, Polygon] = {}
    for i, (lon, lat) in enumerate(points):
        if len(made) >= 24 and first >= 2 * others:
            break
        fid = tid(tenant, f"frs{i}")
        made[fid] = circle(lon, lat, float(rng.uniform(200.0, 600.0)))
        await fences.put(FenceSpec(fence_id=fid, geometry=made[fid], timeout_s=600), create=True)
        for region, (ranges, _) in bindings(made[fid], wm0).per_region.items():
            first, others = (first + len(ranges), others) if region == wm0.regions[0] else \
                (first, others + len(ranges))
    assert len(made) >= 24 and first >= 2 * others, "the first region is too small to crowd"

    amqp_url = pipeline["users"][t.MANAGER_USER][t.region_vhost(settings.regions[0])]
    cfg = JobConfig(postgres_url=dsn, amqp_url=amqp_url,
                    master="local[2]", partitions=4, regions=settings.regions, workers=settings.workers)
    try:
        report = await asyncio.to_thread(
            rebuild_bindings.Job(cfg, job_args(resplit="always", settle_timeout=60.0)).run, spark)
        await check_resplit(report, wm0, made, settings, dsn, pipeline, tenant)
    finally:  # the map as it was (a later test's stream should cross the regions as before)
        await asyncio.to_thread(restore_worldmap, spark, cfg, wm0)


def restore_worldmap(spark: Any, cfg: JobConfig, wm0: Worldmap) -> None:
    job = rebuild_bindings.Job(cfg, job_args(settle_timeout=60.0))
    current = asyncio.run(job._worldmap())
    if np.array_equal(current.starts, wm0.starts) and np.array_equal(current.owner, wm0.owner):
        return
    back = Worldmap(current.version + 1, wm0.regions, wm0.starts, wm0.owner)
    cov = job.coverings(spark, current)
    job.resplit(spark, cov, back, current)
    cov.unpersist()
    assert job.report.worldmap_after == back.version, job.report.status


async def check_resplit(report: rebuild_bindings.Report, wm0: Worldmap, made: dict[str, Polygon],
                        settings: Settings, dsn: str, pipeline: ConnectionSettings,  # noqa: F811
                        tenant: str) -> None:
    assert report.status == "done", report.line()
    assert report.worldmap_after == report.worldmap_before + 1 and report.worldmap_before == wm0.version
    # (other tests' fences may be live too: the loads are the whole map's)
    assert report.imbalance_after < report.imbalance_before and report.imbalance_after <= 1.3, report.line()
    wm1 = await routing_store.read_worldmap(dsn)
    assert wm1 is not None and wm1.version == report.worldmap_after and wm1.regions == wm0.regions
    conn = await asyncpg.connect(dsn)
    try:
        for fid, geom in made.items():
            want = bindings(geom, wm1).per_region
            for region in settings.regions:
                live = await routing_store.region_binding(conn, region, fid)
                if region not in want:
                    assert live is None, (fid, region)
                else:
                    assert live is not None, (fid, region)
                    assert to_bytes(live.ranges, live.interior) == to_bytes(*want[region]), (fid, region)
    finally:
        await conn.close()

    # x-ingress routes with the new map and the regions bind what it sends them
    fid, geom = next(iter(made.items()))
    c = geom.centroid
    obj = tid(tenant, "obj")
    start = next((c.x + dx, c.y) for dx in (-0.03, 0.03, -0.05, 0.05)
                 if not any(g.contains(Point(c.x + dx, c.y)) for g in made.values()))
    steps = trajectory([start, (c.x, c.y)])
    async with AmqpEvents(pipeline) as amqp:
        await amqp.watch(fid)
        await publish_positions(pipeline, obj, steps)
        await amqp.until({fid: (fid, "enter", obj, steps[-1].ts, "entered")})
    assert amqp.events(obj) == [(fid, "enter", obj, steps[-1].ts, "entered")]
