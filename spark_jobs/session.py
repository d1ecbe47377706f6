"""What every nightly job shares: its configuration, the Spark session and JDBC access.

Trade-off: the jobs read and write PostgreSQL over JDBC (Debian's libpostgresql-jdbc-java,
passed as spark.jars), so the executors do the I/O in parallel and nothing but small results
goes through the driver; the driver uses asyncpg only for the few statements JDBC cannot do
(DELETE of a day, transactions around a swap). The Python the executors run is the driver's
own interpreter (spark.pyspark.python), so they import the same compiled kernel; on a cluster
the project's venv must exist at that path on every node, or be shipped (see the README).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"  # Debian's libpostgresql-jdbc-java
ENV_KEYS = ("GEOFENCE_POSTGRES_URL", "GEOFENCE_AMQP_URL", "GEOFENCE_SPARK_MASTER", "GEOFENCE_JDBC_JAR",
            "GEOFENCE_SPARK_PARTITIONS")


class ConfigError(ValueError):
    pass


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
    def from_env(env: Mapping[str, str] | None = None, **overrides: Any) -> JobConfig:
        """From GEOFENCE_* variables, else the local stack's settings; `overrides` (command-line
        flags) win. Unknown GEOFENCE_SPARK_* keys are refused, so a typo is not ignored."""
        env = os.environ if env is None else env
        unknown = sorted(k for k in env if k.startswith("GEOFENCE_SPARK_") and k not in ENV_KEYS)
        if unknown:
            raise ConfigError(f"unknown settings {', '.join(unknown)}; known: {', '.join(ENV_KEYS)}")
        from deploy import local_stack as ls
        from exchanges import topology as t

        # the stack's settings (regions, workers, ports) from the same environment, less the
        # keys that are the job's own (the stack refuses keys it does not know)
        settings = ls.Settings.from_env({k: v for k, v in env.items()
                                         if k not in ENV_KEYS or k in t.SIDECAR_ENV_KEYS})
        pg, amqp = env.get("GEOFENCE_POSTGRES_URL", ""), env.get("GEOFENCE_AMQP_URL", "")
        if not (pg and amqp):
            pw = ls.load_secrets(settings)
            pg = pg or ls.postgres_dsn(settings, pw.postgres_password)
            amqp = amqp or ls.amqp_url(settings, pw.users[t.MANAGER_USER], "/", t.MANAGER_USER)
        try:
            partitions = int(env.get("GEOFENCE_SPARK_PARTITIONS", "0"))
        except ValueError:
            raise ConfigError("GEOFENCE_SPARK_PARTITIONS must be an integer") from None
        values: dict[str, Any] = {
            "postgres_url": pg, "amqp_url": amqp,
            "master": env.get("GEOFENCE_SPARK_MASTER", ""),
            "jdbc_jar": env.get("GEOFENCE_JDBC_JAR", DEFAULT_JDBC_JAR),
            "partitions": partitions,
            "regions": tuple(settings.regions), "workers": tuple(settings.workers),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        cfg = JobConfig(**values)
        cfg.check()
        return cfg

    def check(self) -> None:
        if not self.postgres_url.startswith(("postgresql://", "postgres://")):
            raise ConfigError("the PostgreSQL URL must be postgresql://user:password@host:port/db")
        if self.partitions < 0:
            raise ConfigError("partitions must be >= 0")
        if not os.path.exists(self.jdbc_jar) and "://" not in self.jdbc_jar:
            raise ConfigError(f"no JDBC driver at {self.jdbc_jar}: install libpostgresql-jdbc-java "
                              "(bash deploy/setup.sh does) or set GEOFENCE_JDBC_JAR")

    def masked(self) -> str:
        master = self.master or "spark-submit's or local[*]"
        return (f"postgres={mask(self.postgres_url)} amqp={mask(self.amqp_url)} master={master} "
                f"jdbc={self.jdbc_jar}")


def mask(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":****@", 1)


@dataclass(frozen=True)
class Jdbc:
    url: str  # jdbc:postgresql://host:port/db
    user: str
    password: str

    @staticmethod
    def from_url(postgres_url: str) -> Jdbc:
        u = urlsplit(postgres_url)
        host = u.hostname or "localhost"
        return Jdbc(f"jdbc:postgresql://{host}:{u.port or 5432}{u.path or '/postgres'}",
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

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
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
               # the bar is for people at a terminal, not for the journal of a timer's run
               .config("spark.ui.showConsoleProgress", str(sys.stderr.isatty()).lower()))
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
