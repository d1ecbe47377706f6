"""`geofence archive months | maintain`: the events archive's months (fence/archive_months.py).

    geofence archive months [--json]
    geofence archive maintain [--retention-days N] [--export-dir DIR] [--json]

`maintain` is the nightly run (geofence-archive-months.timer): this month's and the next
month's tables made ahead, then every month past the retention taken out, exported to Parquet
first when an export directory is set (spark_jobs/archive_export.py). The flags win over
GEOFENCE_ARCHIVE_RETENTION_DAYS and GEOFENCE_ARCHIVE_EXPORT_DIR. Connects with
GEOFENCE_POSTGRES_URL when set, else to the local stack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from deploy import exit_codes
from deploy.progress import Progress
from deploy.spark_cmd import PG_KEY, local_environment
from exchanges import routing_store, settings_registry
from exchanges.settings import ConfigError
from fence import archive_months as am


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("months", help="the archive's months: rows (estimated) and size")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("maintain", help="make the next months' tables; take out the months past the "
                                        "retention")
    p.add_argument("--retention-days", type=int, help="keep this many days (0: every month; default "
                                                      "GEOFENCE_ARCHIVE_RETENTION_DAYS, else 0)")
    p.add_argument("--export-dir", type=Path, help="export a month to Parquet here before dropping it "
                                                   "(default GEOFENCE_ARCHIVE_EXPORT_DIR, else none)")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")


@dataclass(frozen=True)
class ArchiveOptions:
    retention_days: int = 0  # 0: every month kept
    export_dir: Path | None = None  # None: a month past the retention is dropped unexported

    @staticmethod
    def of(args: argparse.Namespace, env: Mapping[str, str]) -> ArchiveOptions:
        """The flags, else GEOFENCE_ARCHIVE_RETENTION_DAYS / _EXPORT_DIR, else the defaults."""
        days = args.retention_days
        if days is None:
            raw = settings_registry.read("GEOFENCE_ARCHIVE_RETENTION_DAYS", env)
            try:
                days = ArchiveOptions.retention_days if raw is None else int(raw)
            except ValueError:
                raise ConfigError(f"GEOFENCE_ARCHIVE_RETENTION_DAYS {raw!r}: an integer >= 0 "
                                  "expected") from None
        if days < 0:
            raise ConfigError(f"retention {days} days: 0 (keep every month) or more expected")
        export = args.export_dir
        if export is None and (raw_dir := settings_registry.read("GEOFENCE_ARCHIVE_EXPORT_DIR", env)):
            export = Path(raw_dir)
        if export is not None and not export.is_absolute():
            raise ConfigError(f"export directory {str(export)!r}: an absolute path expected")
        return ArchiveOptions(days, export)


def month_line(m: am.Month) -> str:
    rows = "never analysed" if m.rows < 0 else f"~{m.rows:,} rows"
    pending = "  (detach pending)" if m.detaching else ""
    return f"{m.label}  {m.name:<22} {rows:>18}  {m.bytes / 1e6:10.1f} MB{pending}"


async def _run(args: argparse.Namespace) -> int:
    env = local_environment()
    opts = ArchiveOptions.of(args, env) if args.action == "maintain" else ArchiveOptions()
    days, export_dir = opts.retention_days, opts.export_dir
    conn = await routing_store.connect(env[PG_KEY])
    try:
        if args.action == "months":
            found = await am.months(conn)
            if args.json:
                rows = [{"month": m.label, "table": m.name, "rows_estimate": m.rows, "bytes": m.bytes,
                         "detach_pending": m.detaching} for m in found]
                print(json.dumps(rows, indent=2))
            else:
                print("\n".join(month_line(m) for m in found) or "the archive has no month yet")
            return exit_codes.OK
        export = None
        if export_dir is not None:
            from spark_jobs import archive_export  # pyarrow: the spark extra

            async def export(c: asyncpg.Connection, table: str) -> int:
                return await archive_export.export(c, table, export_dir)

        with Progress(0, "archive months", "month") as bar:
            def step(line: str, done: int, total: int) -> None:
                bar.say(line)
                bar.to(done, total)

            out = await am.maintain(conn, datetime.now(UTC), days, export, int(time.time()), step)
        summary = {"retention_days": days, "export_dir": str(export_dir) if export_dir else None,
                   "made_ahead": out.made, "removed": [{"month": m, "rows": n} for m, n in out.removed],
                   "months_kept": out.kept}
        if args.json:
            print(json.dumps(summary, indent=2))
        else:
            gone = ", ".join(f"{m} ({n:,} rows)" for m, n in out.removed) or "none"
            keep = "every month kept (no retention)" if days == 0 else f"retention {days} days"
            how = f"exported to {export_dir} and dropped" if export_dir else "dropped"
            print(f"archive: {keep}; months {how}: {gone}; {out.kept} months in the archive; "
                  f"ready ahead: {', '.join(out.made)}")
        return exit_codes.OK
    finally:
        await conn.close()


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args))
    except ConfigError as exc:
        return exit_codes.say(f"archive {args.action}", exc, usage=True)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, RuntimeError) as exc:
        return exit_codes.say(f"archive {args.action}", exc)

