"""`geofence region list | add | remove`. `list`: the x-geo regions as an operator sees
them: each region's Hilbert intervals and share of the curve (the stored worldmap), the
fences bound to it as stored (fence_range) and as its x-geo holds them (a difference is
flagged), the objects it tracks, and the positions and messages it routes per second (its
counters, asked twice `--interval` apart).

Reads PostgreSQL and asks each region's x-geo over its control exchange, as `geofence inspect
geo` does; a region whose x-geo does not answer is listed as down, not skipped.

`add NAME --split-from R [--at HILBERT | --balance]` and `remove NAME --into R`: a region
added or removed while positions flow (deploy/region_ops.py), with a SUMMARY line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import asyncpg

from deploy import exit_codes, region_ops
from deploy.inspect_cmd import RpcTimeout, ask
from deploy.processes import StackError
from deploy.progress import Steps
from deploy.settings import ConnectionSettings, Settings, load_connection_settings, load_secrets, overriding
from exchanges import routing_store
from exchanges import topology as t
from exchanges.worldmap import TOP, Worldmap

STORED_BINDINGS = ("SELECT r.region, count(*) AS fences, "
                   "coalesce(sum(octet_length(r.ranges)), 0) / 16 AS ranges FROM fence_range r "
                   "JOIN fence f ON f.id = r.fence_id AND f.deleted_at IS NULL GROUP BY r.region")


def rows(wm: Worldmap, stored: dict[str, tuple[int, int]], first: dict[str, Any], second: dict[str, Any],
         seconds: float) -> list[dict[str, Any]]:
    """One row per region (the worldmap's, plus any region with stored bindings it lacks)."""
    spans = {r: [(int(a), int(b)) for a, b in wm.intervals(r)] for r in wm.regions}
    total = float(TOP) + 1
    out = []
    for region in sorted({*spans, *stored}):
        a, b = first.get(region), second.get(region)
        live = b is not None and "stats" in b
        row: dict[str, Any] = {
            "region": region, "vhost": t.region_vhost(region), "in_worldmap": region in spans,
            "intervals": spans.get(region, []),
            "share": sum(e - s + 1 for s, e in spans.get(region, [])) / total,
            "fences_stored": stored.get(region, (0, 0))[0], "ranges_stored": stored.get(region, (0, 0))[1],
            "up": live}
        if live:
            assert b is not None
            row.update(fences_bound=b["stats"]["fences"], objects=b["stats"]["objects"])
            if a is not None and "counters" in a and seconds > 0:
                row["positions_per_s"] = (b["counters"]["positions"] - a["counters"]["positions"]) / seconds
                row["messages_per_s"] = (b["counters"]["received"] - a["counters"]["received"]) / seconds
        out.append(row)
    return out


async def _ask_all(conn: ConnectionSettings, regions: list[str]) -> dict[str, Any]:
    async def one(region: str) -> Any:
        try:
            return await ask(conn["amqp"][t.region_vhost(region)], t.GEO_CONTROL_EXCHANGE, "", {"limit": 0},
                             timeout=5.0)
        except (RpcTimeout, KeyError, OSError) as exc:
            return {"error": str(exc)}

    answers = await asyncio.gather(*(one(r) for r in regions))
    return dict(zip(regions, answers, strict=True))


async def gather(interval: float) -> list[dict[str, Any]]:
    settings = Settings.from_env()
    conn = load_connection_settings(settings)
    dsn = conn["postgres"]["dsn"]
    wm = await routing_store.read_worldmap(dsn)
    if wm is None:
        raise RuntimeError("no worldmap stored: run `geofence up`")
    pg = await asyncpg.connect(dsn)
    try:
        stored = {r["region"]: (int(r["fences"]), int(r["ranges"])) for r in await pg.fetch(STORED_BINDINGS)}
    finally:
        await pg.close()
    regions = sorted({*wm.regions, *stored} & {*settings.regions, *wm.regions})
    first = await _ask_all(conn, regions)
    started = time.monotonic()
    if interval > 0:
        await asyncio.sleep(interval)  # the rate's window, not a synchronisation
    second = await _ask_all(conn, regions)
    return rows(wm, stored, first, second, time.monotonic() - started if interval > 0 else 0.0)


def human(data: list[dict[str, Any]]) -> str:
    lines = [f"{'region':<8}{'share':>7}{'fences stored/bound':>22}{'ranges':>9}{'objects':>9}"
             f"{'positions/s':>13}{'msgs/s':>9}  intervals"]
    for r in data:
        bound = r.get("fences_bound")
        flag = "" if bound is None or bound == r["fences_stored"] else " !"
        spans = ", ".join(f"[{s}, {e}]" for s, e in r["intervals"]) or "(not in the worldmap)"
        rate = f"{r['positions_per_s']:,.1f}" if "positions_per_s" in r else "-"
        msgs = f"{r['messages_per_s']:,.1f}" if "messages_per_s" in r else "-"
        fences = f"{r['fences_stored']:,}/{'down' if not r['up'] else f'{bound:,}'}{flag}"
        lines.append(f"{r['region']:<8}{r['share']:>7.1%}{fences:>22}{r['ranges_stored']:>9,}"
                     f"{r.get('objects', 0):>9,}{rate:>13}{msgs:>9}  {spans}")
    down = [r["region"] for r in data if not r["up"]]
    if down:
        lines.append(f"x-geo not answering: {', '.join(down)} (`geofence status`)")
    if any(r.get("fences_bound") not in (None, r["fences_stored"]) for r in data):
        lines.append("! the x-geo holds another number of fences than the store binds to it "
                     "(a change in flight, or drift: `geofence spark rebuild-bindings --dry-run`)")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("action", choices=("list", "add", "remove"),
                        help="list the regions; add one (a split of another, live); remove one (joined "
                             "into another, live)")
    parser.add_argument("region", nargs="?", help="the region to add or remove (a name such as c)")
    parser.add_argument("--split-from", metavar="R", help="add: the region to split")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--at", type=int, metavar="HILBERT",
                       help="add: the Hilbert index where the new region's part begins (to the end of "
                            "that interval of R)")
    where.add_argument("--balance", action="store_true",
                       help="add: split where R's bound ranges divide in two halves (the default)")
    parser.add_argument("--broker", type=int, choices=(1, 2), default=1,
                        help="add: the RabbitMQ node of the region's vhost: 1, the pipeline's own "
                             "(default), or 2, a second, independent node (started if it is not; "
                             "federated to the first)")
    parser.add_argument("--into", metavar="R", help="remove: the region that takes its part")
    parser.add_argument("--settle-timeout", type=float, default=60.0,
                        help="add / remove: seconds for every x-ingress to take a new worldmap")
    parser.add_argument("--interval", type=float, default=2.0,
                        help="list: seconds between the two counter reads")
    parser.add_argument("--json", action="store_true", help="list: print JSON")


def change(args: argparse.Namespace) -> int:
    """`region add` / `region remove` on the local stack."""

    refused = overriding("GEOFENCE_REGIONS", "regions")
    if refused:
        print(f"geofence region {args.action}: {refused}", file=sys.stderr)
        return 2
    needed = "--split-from" if args.action == "add" else "--into"
    if not args.region or not (args.split_from if args.action == "add" else args.into):
        print(f"geofence region {args.action}: give the region and {needed}", file=sys.stderr)
        return 2
    try:
        settings = Settings.from_env()
        pw = load_secrets(settings)
        with Steps(f"region {args.action} {args.region}", f"region {args.action}", settings.progress_file,
                   "geofence region") as steps:
            if args.action == "add":
                outcome = asyncio.run(region_ops.add(settings, pw, args.region, args.split_from, args.at,
                                                     steps.say, args.settle_timeout, args.broker))
            else:
                outcome = asyncio.run(region_ops.remove(settings, pw, args.region, args.into, steps.say,
                                                        args.settle_timeout))
    except (StackError, ValueError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return exit_codes.say(f"region {args.action}", exc)
    print(outcome.line(), flush=True)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.action != "list":
        return change(args)
    try:
        data = asyncio.run(gather(args.interval))
    except (RuntimeError, OSError) as exc:
        return exit_codes.say(f"region {args.action}", exc)
    print(json.dumps(data, indent=2) if args.json else human(data))
    return 0 if all(r["up"] for r in data) else 1
