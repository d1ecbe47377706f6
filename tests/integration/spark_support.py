"""The Spark jobs' tests share one local Spark session (it takes seconds to start) and run
in a PostgreSQL schema of their own, dropped at the end, so they never touch live tables."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from deploy.migrate import MIGRATIONS_DIR
from deploy.settings import ConnectionSettings
from spark_jobs import occupancy
from spark_jobs.session import JobConfig, spark_session


@pytest.fixture(scope="session")
def spark_config(stack: ConnectionSettings) -> JobConfig:
    return JobConfig(postgres_url=stack["postgres"]["dsn"], amqp_url="", master="local[2]",
                     partitions=4)


@pytest.fixture(scope="session")
def spark(spark_config: JobConfig) -> Iterator[object]:
    session = spark_session(spark_config, "geofence-tests")
    yield session
    session.stop()


@pytest.fixture
async def pg_schema(stack: ConnectionSettings) -> object:
    """A fresh schema name (created empty, dropped after the test)."""
    name = f"t_spark_{os.getpid()}_{os.urandom(3).hex()}"
    conn = await asyncpg.connect(stack["postgres"]["dsn"])
    try:
        await conn.execute(f'CREATE SCHEMA "{name}"')
        yield name
        await conn.execute(f'DROP SCHEMA "{name}" CASCADE')
    finally:
        await conn.close()


@pytest.fixture
async def occupancy_db(stack: ConnectionSettings, pg_schema: str) -> AsyncIterator[Any]:
    """A connection, with occupancy-analytics' input and output tables in `pg_schema`."""
    conn = await asyncpg.connect(stack["postgres"]["dsn"])
    try:
        await occupancy.create_tables(conn, pg_schema, MIGRATIONS_DIR)
        yield conn
    finally:
        await conn.close()
