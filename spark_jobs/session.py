"""What every nightly job shares: its configuration, the Spark session and JDBC access.

The configuration comes from the environment only (GEOFENCE_POSTGRES_URL, GEOFENCE_AMQP_URL,
GEOFENCE_REGIONS, GEOFENCE_WORKERS and the Spark keys), as the systemd units set it; a job
knows nothing of the local stack. Whoever launches a job from deploy/ (`geofence spark`,
deploy/spark_cmd.py) puts the local stack's URLs in that environment.

Trade-off: the jobs read and write PostgreSQL over JDBC (Debian's libpostgresql-jdbc-java,
passed as spark.jars), so the executors do the I/O in parallel and nothing but small results
goes through the driver; the driver uses asyncpg only for the few statements JDBC cannot do
(DELETE of a day, transactions around a swap). The Python the executors run is the driver's
own interpreter (spark.pyspark.python), so they import the same compiled kernel; on a cluster
the project's venv must exist at that path on every node, or be shipped (see docs/reference.md,
"On a real cluster").
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from exchanges import settings_registry
from exchanges import topology as t
from exchanges.settings import ConfigError, given, mask

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"  # Debian's libpostgresql-jdbc-java
ENV_KEYS = settings_registry.keys_for("spark")  # declared in exchanges/settings_registry.py
SPARK_PREFIX = "GEOFENCE_SPARK_"  # the jobs' own namespace: only ENV_KEYS' keys start with it



@dataclass(frozen=True)
class JobConfig:
    postgres_url: str
    amqp_url: str = ""  # the fence-manager user: only rebuild-bindings applies changes
    master: str = ""  # "": spark-submit's --master when launched by it, else local[*]
    jdbc_jar: str = DEFAULT_JDBC_JAR
    partitions: int = 0  # 0: twice the cores Spark has
    regions: tuple[str, ...] = field(default=())
    workers: tuple[str, ...] = field(default=())

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None, *, also_known: Iterable[str] = (),
                 **overrides: Any) -> JobConfig:
        """From the GEOFENCE_* variables of `env` (default: the process's); `overrides`
        (command-line flags) win. Regions and workers default to the topology's. A GEOFENCE_*
        key that is neither the job's (ENV_KEYS), a sidecar's (one file may serve both) nor in
        `also_known` (the launcher's own keys) is refused, so a typo is not ignored."""
        env = given(env, {*ENV_KEYS, *t.SIDECAR_ENV_KEYS, *also_known})
        try:
            partitions = int(env.get("GEOFENCE_SPARK_PARTITIONS", "0"))
        except ValueError:
            raise ConfigError("GEOFENCE_SPARK_PARTITIONS must be an integer") from None
        values: dict[str, Any] = {
            "postgres_url": env.get("GEOFENCE_POSTGRES_URL", ""),
            "amqp_url": env.get("GEOFENCE_AMQP_URL", ""),
            "master": env.get("GEOFENCE_SPARK_MASTER", ""),
            "jdbc_jar": env.get("GEOFENCE_JDBC_JAR", DEFAULT_JDBC_JAR),
            "partitions": partitions,
            "regions": t.Topology.regions, "workers": t.Topology.workers,
        }
        for key, name in (("GEOFENCE_REGIONS", "regions"), ("GEOFENCE_WORKERS", "workers")):
            if key in env:
                values[name] = tuple(n.strip() for n in env[key].split(","))
        values.update({k: v for k, v in overrides.items() if v is not None})
        cfg = JobConfig(**values)
        cfg.check()
        return cfg

    def check(self) -> None:
        if not self.postgres_url:
            raise ConfigError("no PostgreSQL URL: set GEOFENCE_POSTGRES_URL (`geofence spark` takes the "
                              "local stack's)")
        if not self.postgres_url.startswith(("postgresql://", "postgres://")):
            raise ConfigError("the PostgreSQL URL must be postgresql://user:password@host:port/db")
        if self.partitions < 0:
            raise ConfigError("partitions must be >= 0")
        if not os.path.exists(self.jdbc_jar) and "://" not in self.jdbc_jar:
            raise ConfigError(f"no JDBC driver at {self.jdbc_jar}: install libpostgresql-jdbc-java "
                              "(bash deploy/setup.sh does) or set GEOFENCE_JDBC_JAR")
        try:
            t.Topology(self.regions, self.workers)
        except ValueError as exc:
            raise ConfigError(f"GEOFENCE_REGIONS / GEOFENCE_WORKERS: {exc}") from None

    def masked(self) -> str:
        master = self.master or "spark-submit's or local[*]"
        return (f"postgres={mask(self.postgres_url)} amqp={mask(self.amqp_url)} master={master} "
                f"jdbc={self.jdbc_jar}")



@dataclass(frozen=True)
class Jdbc:
    url: str  # jdbc:postgresql://host:port/db
    user: str
    password: str

    @staticmethod
    def from_url(postgres_url: str) -> Jdbc:
        """The JDBC form of a postgresql:// URL; its TLS parameters (sslmode, sslrootcert) kept:
        PgJDBC reads them as libpq does."""
        u = urlsplit(postgres_url)
        host = u.hostname or "localhost"
        tls = [(k, v) for k, v in parse_qsl(u.query) if k in ("sslmode", "sslrootcert")]
        query = ("?" + urlencode(tls, safe="/")) if tls else ""
        return Jdbc(f"jdbc:postgresql://{host}:{u.port or 5432}{u.path or '/postgres'}{query}",
                    unquote(u.username or ""), unquote(u.password or ""))

    def properties(self) -> dict[str, str]:
        return {"user": self.user, "password": self.password, "driver": "org.postgresql.Driver"}

    def read(self, spark: SparkSession, query: str, predicates: list[str] | None = None,
             fetch_size: int = 10_000) -> DataFrame:
        """A query's rows; one partition per predicate (each reads its share in parallel)."""
        props = {**self.properties(), "fetchsize": str(fetch_size)}
        table = f"({query}) AS q"
        if predicates:
            return spark.read.jdbc(self.url, table, predicates=predicates, properties=props)
        return spark.read.jdbc(self.url, table, properties=props)

    def append(self, df: DataFrame, table: str, batch_size: int = 10_000) -> None:
        """Append a DataFrame's rows to an existing table (rewriteBatchedInserts: one multi-row
        INSERT per batch)."""
        props = {**self.properties(), "batchsize": str(batch_size), "rewriteBatchedStatements": "true",
                 "stringtype": "unspecified"}  # text into jsonb / enums without casts
        url = self.url + ("&" if "?" in self.url else "?") + "reWriteBatchedInserts=true"
        df.write.jdbc(url, table, mode="append", properties=props)


def hash_predicates(column: str, n: int) -> list[str]:
    """n disjoint WHERE clauses splitting a text key evenly (PostgreSQL's hashtext)."""
    return [f"(hashtext({column}) & 2147483647) % {n} = {i}" for i in range(n)]


def spark_session(cfg: JobConfig, app_name: str) -> SparkSession:
    """The job's session; getOrCreate, so the tests' session-wide one is reused."""
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    settings_registry.setdefault("PYSPARK_PYTHON", sys.executable)
    master = cfg.master or SparkConf().get("spark.master", None) or "local[*]"
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.jars", cfg.jdbc_jar)
               .config("spark.pyspark.python", sys.executable)
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
               .config("spark.sql.inMemoryColumnarStorage.compressed", "false")
               .config("spark.sql.adaptive.enabled", "true")
               .config("spark.ui.enabled", "false")
               # spark_jobs/stage_progress.py draws the stages with their time left instead
               .config("spark.ui.showConsoleProgress", "false"))
    if cfg.partitions:
        builder = builder.config("spark.sql.shuffle.partitions", str(cfg.partitions))
    elif master.startswith("local"):
        # a few shuffle partitions per core, not Spark's 200 (sized for clusters)
        builder = builder.config("spark.sql.shuffle.partitions", str(4 * (os.cpu_count() or 2)))
    if master.startswith("local"):
        builder = builder.config("spark.driver.memory", "4g")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_tasks(spark: SparkSession, n: int, task: Any, ddl: str, what: str) -> tuple[list[Any], list[str]]:
    """n tasks (mapInArrow over the partition numbers 0..n-1, one a partition); their rows and
    the attempts Spark kept (each row's "task": "<partition>.<attempt>"), one per partition."""
    done = spark.range(0, n, 1, n).mapInArrow(task, ddl).collect()
    tags = sorted({r["task"] for r in done})
    if len(tags) != n:
        raise RuntimeError(f"{n} {what} tasks but results of {len(tags)} attempts: {tags}")
    return done, tags


def partitions(spark: SparkSession, cfg: JobConfig) -> int:
    return cfg.partitions or max(2, 2 * spark.sparkContext.defaultParallelism)


# ---------------------------------------------------------------- a schema of its own

async def clone_schema(conn: Any, schema: str, tables: tuple[str, ...]) -> None:
    """Create `schema` (if missing) with empty copies of public's `tables` (columns, defaults,
    checks, indexes; no foreign keys): the benchmarks and tests run the jobs there, so they
    never touch the live tables. `conn` is an asyncpg connection."""
    check_schema(schema)
    await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    for table in tables:
        await conn.execute(f'CREATE TABLE IF NOT EXISTS "{schema}"."{table}" '
                           f'(LIKE public."{table}" INCLUDING ALL)')


def check_schema(schema: str) -> str:
    if not schema.isidentifier() or schema != schema.lower() or len(schema) > 63:
        raise ConfigError(f"schema {schema!r}: lower-case letters, digits and _ only")
    return schema
