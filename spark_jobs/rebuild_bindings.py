"""Nightly: rebuild every fence's bindings from its geometry, repair the live ones, re-split.

    spark-submit --jars /usr/share/java/postgresql.jar spark_jobs/rebuild_bindings.py [flags]
    geofence spark rebuild-bindings [flags]

1. Reads the live fences over JDBC (one partition per hash share of the ids) and computes each
   one's whole covering with the C kernel inside the executors (mapInPandas, Arrow batches);
   writes them to `fence_binding` (swapped in whole, one transaction).
2. Cuts them by the worldmap exactly as the fence service does, compares with the live
   bindings (`fence_range`), writes the differences to `fence_binding_diff` with the size of
   the minimal diff, and applies them (unless --dry-run) through the fence service's own path
   (FenceManager.rebind: stored under the fence row's lock, then a "define" to each x-geo).
3. Measures how evenly the regions share the bindings (imbalance = busiest / mean, in
   ranges bound) and, when it is over --max-imbalance and a balanced map does better,
   re-splits the worldmap in two safe steps: "grow" (each region binds what it owns under
   either map), then the new map is stored, then, once every live x-ingress routes with it,
   "shrink" (each region keeps what it owns under the new map). A position routed with either
   map finds its fences at every moment. If an x-ingress does not take the new map within
   --settle-timeout, the shrink is left to the next run (bindings stay a superset: correct).

A fence the API changes while the job runs keeps the API's bindings: every write is guarded
by the fence's version, and a fence skipped that way is re-cut from the store under the
newest map before the job ends (the worldmap lock in fence.store keeps the API from storing
bindings cut with a map older than the newest).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import asyncpg
import numpy as np

from exchanges import routing_store
from exchanges.worldmap import Worldmap
from fence import store
from fence.manager import FenceManager
from fence.spec import bindings, covering
from hilbert_c.covering import _flatten
from spark_jobs import bindings_core as core
from spark_jobs.session import Jdbc, JobConfig, check_schema, hash_predicates, partitions, spark_session
from spark_jobs.stage_progress import StageBars

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

REMOVAL_BITS = 26  # the level sent with no ranges (a fence only removed from regions): unused
INGRESS_ALIVE_S = 60.0  # an x-ingress that checked in within this long is live (it checks every 2 s)


def add_arguments(parser: argparse.ArgumentParser, name: str = "rebuild-bindings") -> None:
    parser.add_argument("--master", help="Spark master (default local[*], or GEOFENCE_SPARK_MASTER)")
    parser.add_argument("--partitions", type=int, help="JDBC read partitions (default 2 x cores)")
    parser.add_argument("--schema", default="public", help="schema of the fence tables (default public)")
    parser.add_argument("--dry-run", action="store_true",
                        help="compute and write the diff, change nothing live")
    parser.add_argument("--resplit", choices=("auto", "always", "never"), default="auto",
                        help="re-split the worldmap: when over --max-imbalance (auto), whenever a "
                             "balanced map does better (always), or never")
    parser.add_argument("--max-imbalance", type=float, default=1.25,
                        help="busiest region / mean region load tolerated before a re-split (auto)")
    parser.add_argument("--settle-timeout", type=float, default=60.0,
                        help="seconds to wait for every x-ingress to route with a new worldmap")
    parser.add_argument("--quiet", action="store_true", help="only the summary line")


@dataclass
class Report:
    run_id: str
    fences: int = 0
    ranges: int = 0
    failed: int = 0
    diff_rows: int = 0
    applied: int = 0
    skipped: int = 0
    reconciled: int = 0
    worldmap_before: int = 0
    worldmap_after: int = 0
    imbalance_before: float = 1.0
    imbalance_after: float = 1.0
    loads_before: dict[str, int] = field(default_factory=dict)
    loads_after: dict[str, int] = field(default_factory=dict)
    status: str = "running"
    seconds: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        rate = self.fences / self.seconds.get("cover", 0) if self.seconds.get("cover") else 0.0
        return (f"SUMMARY rebuild-bindings {self.status}: {self.fences:,} fences ({self.failed} failed), "
                f"{self.ranges:,} ranges, covering {rate:,.0f} fences/s; diff {self.diff_rows:,} rows, "
                f"applied {self.applied:,}, skipped {self.skipped:,}, re-cut {self.reconciled:,}; "
                f"worldmap v{self.worldmap_before} -> v{self.worldmap_after}, imbalance "
                f"{self.imbalance_before:.3f} -> {self.imbalance_after:.3f}; "
                f"wall {sum(self.seconds.values()):.1f} s ("
                + ", ".join(f"{k} {v:.1f}" for k, v in self.seconds.items()) + ")")


class Job:
    def __init__(self, cfg: JobConfig, args: argparse.Namespace) -> None:
        self.cfg, self.args = cfg, args
        self.schema = check_schema(args.schema)
        self.jdbc = Jdbc.from_url(cfg.postgres_url)
        self.report = Report(datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ-") + secrets.token_hex(3))
        self.live_apply = not args.dry_run
        # how many ranges start in each curve block (ids, counts): the re-split's measure
        self.histogram: tuple[Any, Any] = (np.empty(0, np.int64), np.empty(0, np.int64))
        self.first_diff: dict[str, int] = {}  # the first pass's differences, per action
        if self.live_apply and self.schema != "public":
            raise SystemExit("changes can only be applied to the live tables: use --dry-run with --schema")
        if self.live_apply and not cfg.amqp_url:
            raise SystemExit("applying changes needs GEOFENCE_AMQP_URL (the fence-manager user): set it, "
                             "or use --dry-run")

    def say(self, text: str) -> None:
        if not self.args.quiet:
            print(f"rebuild-bindings: {text}", flush=True)

    def t(self, name: str, since: float) -> None:
        self.report.seconds[name] = self.report.seconds.get(name, 0.0) + time.perf_counter() - since

    def table(self, name: str) -> str:
        return f'"{self.schema}".{name}'

    # ------------------------------------------------------------------ steps

    def run(self, spark: SparkSession) -> Report:
        r = self.report
        asyncio.run(self._sql(f"INSERT INTO {self.table('fence_binding_run')} (run_id, started_at) "
                              "VALUES ($1, now())", r.run_id))
        wm = asyncio.run(self._worldmap())
        r.worldmap_before = r.worldmap_after = wm.version
        self.say(f"run {r.run_id}: {self.cfg.masked()}; worldmap version {wm.version} "
                 f"({', '.join(wm.regions)})")
        t0 = time.perf_counter()
        cov = self.coverings(spark, wm)
        self.t("cover", t0)
        t0 = time.perf_counter()
        self.write_coverings(cov)
        self.t("write", t0)

        t0 = time.perf_counter()
        r.imbalance_before = core.imbalance(r.loads_before, wm.regions)
        ids, counts = self.histogram
        new_wm = core.balanced(wm, ids, counts)
        r.loads_after = core.loads_by_start(new_wm, ids, counts) if new_wm is not wm else r.loads_before
        after = core.imbalance(r.loads_after, new_wm.regions)
        resplit = new_wm is not wm and after < r.imbalance_before * 0.98 and (
            self.args.resplit == "always"
            or (self.args.resplit == "auto" and r.imbalance_before > self.args.max_imbalance))
        r.imbalance_after = after if resplit else r.imbalance_before
        self.say(f"region loads (ranges bound) {_loads(r.loads_before)}: imbalance {r.imbalance_before:.3f}; "
                 f"a balanced map would give {_loads(r.loads_after)}: {after:.3f} -> "
                 f"{'re-split' if resplit else 'keep the map'}")
        self.t("balance", t0)

        if not resplit:  # the differences were found by the first pass
            from pyspark.sql import functions as F

            diff = cov.select(F.explode("diffs").alias("d")).select("d.*")
            if self.live_apply:
                diff = self.with_ranges(diff, cov, wm)
            self.apply_diff(diff, "repair", None, self.first_diff)
        else:
            self.resplit(spark, cov, new_wm, wm)
        cov.unpersist()
        if r.status == "running":
            r.status = "dry run" if not self.live_apply else "done"
        asyncio.run(self._finish())
        return r

    def resplit(self, spark: SparkSession, cov: DataFrame, new_wm: Worldmap, wm: Worldmap) -> None:
        """Move the live bindings from `wm` to `new_wm` (its version wm's + 1): grow, store
        the map, wait for every x-ingress to route with it, shrink."""
        r = self.report
        self.phase(spark, cov, "grow", new_wm, wm)
        if self.live_apply:
            if not asyncio.run(self._store_worldmap(new_wm, wm.version)):
                r.status = "worldmap changed by someone else: re-split abandoned after grow"
            else:
                r.worldmap_after = new_wm.version
                if asyncio.run(self._settled(new_wm.version)):
                    self.phase(spark, cov, "shrink", new_wm, None)
                else:
                    r.status = "shrink left to the next run (an x-ingress still routes with the old map)"
        else:
            self.phase(spark, cov, "shrink", new_wm, None)

    @staticmethod
    def with_ranges(diff: DataFrame, cov: DataFrame, wm: Worldmap) -> DataFrame:
        """The first pass's differences with the new ranges to send (null for a removal): the
        coverings of the fences named are cut by `wm` again, as the first pass did."""
        fences = cov.join(diff.select("fence_id").distinct(), "fence_id", "left_semi")
        cuts = (fences.select(*core.COVER_COLUMNS)
                .mapInPandas(core.per_batch(core.cut_batch, wm), core.CUT_SCHEMA)
                .select("fence_id", "region", "ranges", "interior"))
        return diff.join(cuts, ["fence_id", "region"], "left").select(*core.DIFF_FIELDS)

    def coverings(self, spark: SparkSession, wm: Worldmap) -> DataFrame:
        """The one pass over every fence: read with its live bindings (PostgreSQL joins them, so
        nothing is shuffled), covered, cut by `wm` and compared, in the executors; cached."""
        n = partitions(spark, self.cfg)
        live = ", ".join(f"array_agg(r.{c} ORDER BY r.region) FILTER (WHERE r.region IS NOT NULL) AS live_{a}"
                         for c, a in (("region", "regions"), ("version", "versions"), ("ranges", "ranges"),
                                      ("interior", "interior")))
        fences = self.jdbc.read(spark, f"""
            SELECT f.id AS fence_id, f.version, {live},
                   COALESCE(f.cover_geometry, f.geometry)::text AS geometry
            FROM {self.table('fence')} f LEFT JOIN {self.table('fence_range')} r ON r.fence_id = f.id
            WHERE f.deleted_at IS NULL GROUP BY f.id""", predicates=hash_predicates("fence_id", n))
        cov = fences.mapInPandas(core.per_batch(core.rebuild_batch, wm), core.REBUILD_SCHEMA).persist()
        # the batches' totals (on their first rows): collecting them fills the cache
        heads = cov.where("batch_counts IS NOT NULL").select("batch_counts", "batch_loads",
                                                             "batch_buckets").collect()
        r = self.report
        r.fences, r.ranges, r.failed, *actions = (sum(int(h["batch_counts"][i]) for h in heads)
                                                  for i in range(3 + len(core.ACTIONS)))
        self.first_diff = dict(zip(core.ACTIONS, actions, strict=True))
        r.loads_before = {region: sum(int(h["batch_loads"][i]) for h in heads)
                          for i, region in enumerate(wm.regions)}
        self.histogram = core.sum_histograms(h["batch_buckets"] for h in heads)
        self.say(f"covered {r.fences:,} fences: {r.ranges:,} ranges, {r.failed} failed")
        for row in cov.where("error IS NOT NULL").select("fence_id", "error").limit(10).collect():
            self.say(f"  cannot cover fence {row['fence_id']}: {row['error']}")
        return cov

    def write_coverings(self, cov: DataFrame) -> None:
        from pyspark.sql import functions as F

        # Replaced whole, not in one transaction: a reader takes it as complete when the
        # run's row in fence_binding_run says 'done' (or 'dry run').
        asyncio.run(self._sql(f"TRUNCATE {self.table('fence_binding')}"))
        rows = (cov.where("error IS NULL")
                .select("fence_id", "version", "bits", "n_ranges", "ranges", "interior")
                .withColumn("run_id", F.lit(self.report.run_id)))
        self.jdbc.append(rows, f"{self.schema}.fence_binding")
        self.say(f"fence_binding: {self.report.fences - self.report.failed:,} coverings stored")

    def phase(self, spark: SparkSession, cov: DataFrame, phase: str, wm: Worldmap,
              old: Worldmap | None) -> None:
        """A re-split step: make the live bindings what `wm` (and `old`, while growing) cut."""
        n = partitions(spark, self.cfg)
        target = cov.select(*core.COVER_COLUMNS).mapInPandas(core.per_batch(core.cut_batch, wm, old),
                                                             core.CUT_SCHEMA)
        live = self.jdbc.read(spark, "SELECT region, fence_id, version AS live_version, "
                                     "ranges AS live_ranges, interior AS live_interior "
                                     f"FROM {self.table('fence_range')}",
                              predicates=hash_predicates("fence_id", n))
        joined = target.join(live, ["region", "fence_id"], "full_outer")
        self.apply_diff(joined.mapInPandas(core.per_batch(core.diff_batch), core.DIFF_SCHEMA), phase, old)

    def apply_diff(self, diff: DataFrame, phase: str, old: Worldmap | None,
                   counts: dict[str, int] | None = None) -> None:
        """Write the differences found (fence_binding_diff), then apply them unless dry run.
        `counts`: how many of each action, when already known (the first pass counts its own)."""
        from pyspark.sql import functions as F

        t0 = time.perf_counter()
        if not self.live_apply:  # the ranges are only needed to apply them
            diff = diff.drop("ranges", "interior")
        if self.live_apply or counts is None:  # read again: once cached
            diff = diff.persist()
        outcome = "pending" if self.live_apply else "dry-run"
        rows = diff.select(F.lit(self.report.run_id).alias("run_id"), F.lit(phase).alias("phase"), "region",
                           "fence_id", "version", "action", "ranges_before", "ranges_after",
                           "ranges_removed", "ranges_added", F.lit(outcome).alias("outcome"))
        self.jdbc.append(rows, f"{self.schema}.fence_binding_diff")
        if counts is None:
            counts = {row["action"]: int(row["count"]) for row in diff.groupBy("action").count().collect()}
        counts = {k: v for k, v in counts.items() if v}
        total = sum(counts.values())
        self.report.diff_rows += total
        self.say(f"{phase}: {total:,} (region, fence) bindings differ "
                 f"({', '.join(f'{k} {v:,}' for k, v in sorted(counts.items())) or 'none'})")
        self.t(f"diff-{phase}", t0)
        if self.live_apply and total:
            t0 = time.perf_counter()
            asyncio.run(self._apply(phase, diff.toLocalIterator(prefetchPartitions=True), old))
            self.t(f"apply-{phase}", t0)
        diff.unpersist()

    # ------------------------------------------------------------------ PostgreSQL and x-geo

    async def _sql(self, sql: str, *args: Any) -> None:
        conn = await asyncpg.connect(self.cfg.postgres_url)
        try:
            await conn.execute(sql, *args)
        finally:
            await conn.close()

    async def _worldmap(self) -> Worldmap:
        wm = await routing_store.read_worldmap(self.cfg.postgres_url)
        if wm is None:
            raise SystemExit("no worldmap stored: run `geofence up` (or `geofence migrate` and the topology)")
        return wm

    async def _store_worldmap(self, new: Worldmap, base: int) -> bool:
        conn = await asyncpg.connect(self.cfg.postgres_url)
        try:
            await routing_store.init_connection(conn)
            if await routing_store.latest_worldmap_version(conn) != base:
                return False
            stored = await store.save_worldmap(conn, new)
        finally:
            await conn.close()
        self.say(f"worldmap version {new.version} stored")
        return stored

    async def _settled(self, version: int) -> bool:
        """Every x-ingress alive routes with `version` (polled until --settle-timeout)."""
        conn = await asyncpg.connect(self.cfg.postgres_url)
        try:
            deadline = time.monotonic() + self.args.settle_timeout
            while True:
                seen = await store.routing_versions(conn, INGRESS_ALIVE_S)
                behind = sorted(i for i, v in seen.items() if v < version)
                if not behind:
                    names = ", ".join(sorted(seen)) or "none"
                    self.say(f"every x-ingress routes with version {version} ({names})")
                    return True
                if time.monotonic() > deadline:
                    self.say(f"still on an older worldmap after {self.args.settle_timeout:g}s: "
                             f"{', '.join(behind)}")
                    return False
                await asyncio.sleep(0.5)  # polling a table the x-ingress write every 2 s
        finally:
            await conn.close()

    async def _apply(self, phase: str, rows: Iterator[Any], old: Worldmap | None) -> None:
        per_fence: dict[str, tuple[int, int, dict[str, Any]]] = {}
        for row in rows:
            version, bits, regions = per_fence.get(row["fence_id"], (row["version"], row["bits"], {}))
            regions[row["region"]] = None if row["action"] == "remove" else core.from_bytes(row["ranges"],
                                                                                           row["interior"])
            per_fence[row["fence_id"]] = (version, max(bits, row["bits"]), regions)
        outcomes: list[tuple[str, str, str, str, str]] = []
        async with FenceManager(self.cfg.amqp_url, self.cfg.postgres_url, self.cfg.regions,
                                self.cfg.workers) as manager:
            for done, (fence_id, (version, bits, regions)) in enumerate(per_fence.items(), 1):
                ok = await manager.rebind(fence_id, version, bits or REMOVAL_BITS, regions)
                outcomes += [(self.report.run_id, phase, region, fence_id, "applied" if ok else "skipped")
                             for region in regions]
                if ok:
                    self.report.applied += len(regions)
                else:
                    self.report.skipped += len(regions)
                    if await self._recut(manager, fence_id, old):
                        self.report.reconciled += 1
                if not self.args.quiet and done % 1000 == 0:
                    print(f"\rrebuild-bindings: {phase}: applied {done:,}/{len(per_fence):,} fences",
                          end="", flush=True)
            await manager.applied()
        if not self.args.quiet and len(per_fence) >= 1000:
            print(flush=True)
        conn = await asyncpg.connect(self.cfg.postgres_url)
        try:
            await conn.executemany(
                f"UPDATE {self.table('fence_binding_diff')} SET outcome = $5 "
                "WHERE run_id = $1 AND phase = $2 AND region = $3 AND fence_id = $4", outcomes)
        finally:
            await conn.close()
        self.say(f"{phase}: applied {self.report.applied:,} rows, skipped {self.report.skipped:,} "
                 f"(fences the API changed meanwhile), x-geo regions confirmed")

    async def _recut(self, manager: FenceManager, fence_id: str, old: Worldmap | None) -> bool:
        """A fence changed by the API while the job ran: cut it again from the store with the
        newest map (and the old one, while growing), so no region misses it."""
        for _ in range(5):
            async with manager.pool.acquire() as conn:
                try:
                    record = await store.get_fence(conn, fence_id)
                except store.UnknownFence:
                    return False  # deleted: the delete dropped it everywhere
                wm = await routing_store.latest_worldmap(conn)
                live = {r: await routing_store.region_binding(conn, r, fence_id) for r in self.cfg.regions}
            assert wm is not None
            b = bindings(record.fence.routed_geometry(), wm)
            per_region: dict[str, Any] = dict(b.per_region)
            if old is not None:
                first = covering(_flatten(record.fence.routed_geometry()))
                per_region = dict(core.union_cut(first, wm, old).per_region)
            changes = {r: per_region.get(r) for r in self.cfg.regions
                       if not _same(live.get(r), per_region.get(r))}
            if not changes or await manager.rebind(fence_id, record.fence.version, b.bits, changes):
                return bool(changes)
        return False

    async def _finish(self) -> None:
        r = self.report
        await self._sql(
            f"UPDATE {self.table('fence_binding_run')} SET finished_at = now(), fences = $2, ranges = $3, "
            "failed = $4, diff_rows = $5, applied = $6, skipped = $7, worldmap_before = $8, "
            "worldmap_after = $9, imbalance_before = $10, imbalance_after = $11, status = $12 "
            "WHERE run_id = $1",
            r.run_id, r.fences, r.ranges, r.failed, r.diff_rows, r.applied, r.skipped, r.worldmap_before,
            r.worldmap_after, r.imbalance_before, r.imbalance_after, r.status)


def _loads(loads: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(loads.items())) or "none"


def _same(live: Any, new: Any) -> bool:
    if live is None or new is None:
        return live is None and new is None
    return bool(core.to_bytes(live.ranges, live.interior) == core.to_bytes(*new))


def run(args: argparse.Namespace, env: Mapping[str, str] | None = None,
        also_known: Iterable[str] = ()) -> int:
    """The job as the command line asks; settings from `env` (default: the process's) as
    JobConfig.from_env reads them (`also_known`: the launcher's own GEOFENCE_* keys)."""
    cfg = JobConfig.from_env(env, also_known=also_known, master=args.master, partitions=args.partitions)
    spark = spark_session(cfg, "geofence-rebuild-bindings")
    try:
        with StageBars(spark):  # the stages with their time left, on a terminal
            report = Job(cfg, args).run(spark)
    finally:
        spark.stop()
    print(report.line(), flush=True)
    return 0 if report.failed == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rebuild-bindings", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
