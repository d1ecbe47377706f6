"""Schema migrations: the ordered SQL files of deploy/migrations/, each applied once.

`schema_migration` records what was applied (number, name, a hash of the text). A file is
applied in its own transaction together with its record, under an advisory lock so two
`geofence up` at once do not race. A file that changed after it was applied is an error:
migrations are append-only, a fix is a new file. From 0028 on, a constraint added to an
existing table is added NOT VALID and validated by a later file (deploy/migration_rules.py,
held by a unit test): `up` never scans a busy table under an exclusive lock.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from deploy import exit_codes
from deploy.settings import load_connection_settings

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
FILE_RE = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")
LOCK_KEY = 0x67656F66  # "geof": the advisory lock held while migrating

BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS schema_migration (
    number      integer PRIMARY KEY,
    name        text NOT NULL,
    sha256      text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
)
"""


class MigrationError(RuntimeError):
    pass


@dataclass(frozen=True)
class Migration:
    number: int
    name: str
    sql: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        m = FILE_RE.fullmatch(path.name)
        if not m:
            raise MigrationError(f"{path.name}: migration files are named NNNN_name.sql")
        found.append(Migration(int(m[1]), m[2], path.read_text()))
    numbers = [m.number for m in found]
    if numbers != list(range(1, len(found) + 1)):
        raise MigrationError(f"migrations must be numbered 1, 2, 3... without gaps: {numbers}")
    return found


async def migrate(dsn: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply what is missing; returns the names applied now."""
    todo = migrations(directory)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", LOCK_KEY)
        try:
            await conn.execute(BOOKKEEPING)
            rows = await conn.fetch("SELECT number, name, sha256 FROM schema_migration")
            done = {r["number"]: r for r in rows}
            applied = []
            for m in todo:
                row = done.get(m.number)
                if row is not None:
                    if row["sha256"] != m.sha256:
                        raise MigrationError(f"migration {m.number:04d}_{m.name}.sql changed after it "
                                             "was applied; add a new migration instead")
                    continue
                async with conn.transaction():
                    await conn.execute(m.sql)
                    await conn.execute("INSERT INTO schema_migration (number, name, sha256) "
                                       "VALUES ($1, $2, $3)", m.number, m.name, m.sha256)
                applied.append(f"{m.number:04d}_{m.name}")
            unknown = sorted(set(done) - {m.number for m in todo})
            if unknown:
                raise MigrationError(f"the database has migrations this code does not know: {unknown}")
            return applied
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", LOCK_KEY)
    finally:
        await conn.close()


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--dsn", help="postgresql:// URL (default: the local stack's)")


def run(args: argparse.Namespace) -> int:
    dsn = args.dsn or load_connection_settings()["postgres"]["dsn"]
    try:
        applied = asyncio.run(migrate(dsn))
    except (MigrationError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return exit_codes.say("migrate", exc)
    print(f"migrations applied: {', '.join(applied)}" if applied else "schema is up to date")
    return 0
