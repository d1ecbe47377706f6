"""`geofence sensor add | remove | list`: presence sensors of hives, for the operator who
installs them.

`add SENSOR --hive HIVE` stores the sensor (its firmware's byte order and total modulus, its
reporting interval) and creates its RabbitMQ user in gf-ingress (tag gf-sensor: it may
publish sensors/<SENSOR>/... and read commands/sensor/<SENSOR>, nothing else); the password
is printed once. `remove` deletes the user (the sensor can no longer publish) and keeps the
sensor's history; `--purge` deletes the sensor and its reports too. Hives are their owners'
(`POST /owner/hives`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import datetime

import asyncpg

from deploy import exit_codes
from deploy.processes import StackError
from deploy.rabbitmq import devices
from deploy.settings import Settings, load_secrets, postgres_dsn
from exchanges.text import TextError, check_id
from fence.venues import counting


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    a = sub.add_parser("add", help="store a sensor of a hive and create its user (prints the password once)")
    a.add_argument("sensor_id")
    a.add_argument("--hive", required=True, help="the hive it counts the door of")
    a.add_argument("--byte-order", choices=("little", "big"), default="little",
                   help="of the legacy firmware's 16-bit fields (default little)")
    a.add_argument("--modulus", type=int, default=counting.OBSERVED_MODULUS,
                   help=f"where the firmware's totals wrap (default {counting.OBSERVED_MODULUS}, as "
                        f"observed; the documented one is {counting.DOCUMENTED_MODULUS})")
    a.add_argument("--report-interval", type=int, default=30, help="minutes between timeout reports (30)")
    a.add_argument("--modem", default="", help="IMEI / ICCID, for the owner")
    r = sub.add_parser("remove", help="delete the sensor's user (its history stays)")
    r.add_argument("sensor_id")
    r.add_argument("--purge", action="store_true", help="delete the sensor and its reports too")
    ls = sub.add_parser("list", help="the sensors, with their hive and last report")
    ls.add_argument("--hive")
    ls.add_argument("--json", action="store_true", help="a JSON array of the sensors")


async def _add(dsn: str, args: argparse.Namespace) -> None:
    try:
        check_id(args.sensor_id, "sensor id")
        check_id(args.hive, "hive")
    except TextError as exc:
        raise StackError(str(exc)) from None
    conn = await asyncpg.connect(dsn)
    try:
        if not await conn.fetchval("SELECT EXISTS (SELECT 1 FROM hive WHERE id = $1)", args.hive):
            raise StackError(f"no hive {args.hive!r} (owners add hives: POST /owner/hives)")
        done = await conn.execute(
            "INSERT INTO sensor (id, hive_id, byte_order, modulus, report_interval_min, modem) "
            "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
            args.sensor_id, args.hive, args.byte_order, args.modulus, args.report_interval, args.modem)
        if done.endswith(" 0"):
            raise StackError(f"sensor {args.sensor_id!r} exists")
    except asyncpg.CheckViolationError as exc:
        raise StackError(f"refused: {exc}") from None
    finally:
        await conn.close()


async def _purge(dsn: str, sensor_id: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            for table in ("sensor_report", "sensor_event", "sensor_status", "sensor_config"):
                await conn.execute(f"DELETE FROM {table} WHERE sensor_id = $1", sensor_id)
            await conn.execute("DELETE FROM sensor WHERE id = $1", sensor_id)
    finally:
        await conn.close()


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat(timespec="seconds")


async def _list(dsn: str, hive: str | None) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        rows: list[asyncpg.Record] = await conn.fetch(
            "SELECT id, hive_id, byte_order, modulus, last_report_at, last_status_at FROM sensor "
            "WHERE $1::text IS NULL OR hive_id = $1 ORDER BY hive_id, id", hive)
        return rows
    finally:
        await conn.close()


def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    pw = load_secrets(settings)
    dsn = postgres_dsn(settings, pw.postgres_password)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        if args.action == "add":
            asyncio.run(_add(dsn, args))
            try:
                password = devices.add_sensor(settings, pw, args.sensor_id, None, say)
            except Exception:
                asyncio.run(_purge(dsn, args.sensor_id))  # no sensor without its user
                raise
            print(password)
            say(f"sensor {args.sensor_id} of hive {args.hive}: MQTT login gf-ingress:{args.sensor_id}, "
                f"client id {args.sensor_id}; publishes sensors/{args.sensor_id}/counter (or v2/...), reads "
                f"commands/sensor/{args.sensor_id}. The password above is shown once.")
        elif args.action == "remove":
            devices.remove_sensor(settings, pw, args.sensor_id, say)
            if args.purge:
                asyncio.run(_purge(dsn, args.sensor_id))
                say(f"sensor {args.sensor_id} and its history deleted")
        else:
            rows = asyncio.run(_list(dsn, args.hive))
            if args.json:
                print(json.dumps([{"sensor_id": r["id"], "hive_id": r["hive_id"],
                                   "byte_order": r["byte_order"], "modulus": r["modulus"],
                                   "last_report_at": _iso(r["last_report_at"]),
                                   "last_status_at": _iso(r["last_status_at"])} for r in rows], indent=2))
            else:
                for r in rows:
                    print(f"{r['id']}\t{r['hive_id']}\t{r['byte_order']}\t{r['modulus']}\t"
                          f"{_iso(r['last_report_at']) or '-'}")
    except (StackError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return exit_codes.say(f"sensor {args.action}", exc)
    return 0
