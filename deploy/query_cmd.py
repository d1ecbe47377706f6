"""`geofence query bbox | within | nearby`: where the objects were last seen, from the x-geo
regions' memory (exchanges/x_geo/queries.py), not from PostgreSQL.

    geofence query bbox LON0 LAT0 LON1 LAT1 [--limit N] [--after ID]
    geofence query within (FILE.geojson | --fence ID) [--limit N] [--after ID]
    geofence query nearby LON LAT --radius M [--limit K]
    (each with [--where '[["type", "==", "truck"], ["speed", ">", 20]]'])

Each region's x-geo answers over its control queue with the objects it holds the latest
position of; the answers are merged (an object in transit between two regions keeps its
newer position). bbox and within list by object id, a page at a time (`--after` the last id
of the previous page, printed as next_after); nearby lists the K nearest within the radius.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

import shapely

from deploy import exit_codes
from deploy.inspect_cmd import RpcTimeout, ask
from deploy.processes import StackError
from deploy.region_ops import live
from deploy.settings import Settings, load_connection_settings
from exchanges import control, routing_store
from exchanges import topology as t
from exchanges.tenancy import InvalidTenant, check_tenant, name_of, qualify
from exchanges.x_geo import queries
from fence import store


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("kind", choices=queries.KINDS, help="bbox, within (a polygon or a fence), nearby")
    parser.add_argument("values", nargs="*", help="bbox: LON0 LAT0 LON1 LAT1; within: a GeoJSON file; "
                                                  "nearby: LON LAT")
    parser.add_argument("--fence", help="within: the area of this fence (of --tenant)")
    parser.add_argument("--tenant", help="only this tenant's objects (ids as it names them); without it, "
                                         "every tenant's (ids <tenant>:<id>), as an operator sees them")
    parser.add_argument("--radius", type=float, help="nearby: metres")
    parser.add_argument("--limit", type=int, default=100, help="at most this many objects (a page)")
    parser.add_argument("--after", default="", help="bbox / within: the page after this object id")
    parser.add_argument("--where", help="conditions on the positions' extra fields, JSON: "
                                        """'[["type", "==", "truck"], ["speed", ">", 20]]'""")
    parser.add_argument("--json", action="store_true", help="print JSON")


async def request(args: argparse.Namespace) -> dict[str, Any]:
    """The query the arguments describe, as the wire has it (InvalidQuery if it is not one)."""
    tenant = None
    if args.tenant:
        try:
            tenant = check_tenant(args.tenant)
        except InvalidTenant as exc:
            raise queries.InvalidQuery(str(exc)) from None
    msg: dict[str, Any] = {"query": args.kind, "limit": args.limit,
                           "after": qualify(tenant, args.after) if tenant and args.after else args.after}
    if tenant:
        msg["tenant"] = tenant
    if args.where:
        try:
            msg["where"] = json.loads(args.where)
        except ValueError as exc:
            raise queries.InvalidQuery(f"--where is not JSON: {exc}") from None
    try:
        values = [float(v) for v in args.values] if args.kind != "within" else []
    except ValueError as exc:
        raise queries.InvalidQuery(f"coordinates are numbers: {exc}") from None
    if args.kind == "bbox":
        if len(values) != 4:
            raise queries.InvalidQuery("bbox: LON0 LAT0 LON1 LAT1")
        msg["bbox"] = values
    elif args.kind == "nearby":
        if len(values) != 2 or args.radius is None:
            raise queries.InvalidQuery("nearby: LON LAT --radius METRES")
        msg["point"], msg["radius_m"] = values, args.radius
    elif args.fence:
        conn = await routing_store.connect(load_connection_settings(Settings.from_env())["postgres"]["dsn"])
        try:
            record = await store.get_fence(conn, qualify(tenant, args.fence) if tenant else args.fence)
        except store.UnknownFence:
            raise queries.InvalidQuery(f"within: no fence {args.fence!r}") from None
        finally:
            await conn.close()
        msg["shape"] = shapely.to_geojson(record.fence.geometry)
    elif len(args.values) == 1:
        try:
            data = json.loads(Path(args.values[0]).read_text())
        except (OSError, ValueError) as exc:
            raise queries.InvalidQuery(f"within: {exc}") from None
        msg["shape"] = data.get("geometry", data) if isinstance(data, dict) else data
    else:
        raise queries.InvalidQuery("within: a GeoJSON file (a Polygon, or a Feature of one) or --fence ID")
    queries.parse(msg)  # refused here, with its reason, rather than by every region
    return msg


async def gather(msg: dict[str, Any]) -> dict[str, Any]:
    settings = live(Settings.from_env())
    urls = load_connection_settings(settings)["amqp"]
    q = queries.parse(msg)
    answers = await asyncio.gather(*(ask(urls[t.region_vhost(r)], t.GEO_CONTROL_EXCHANGE, "", msg,
                                         kind=control.QUERY) for r in settings.regions))
    bad = [a["error"] for a in answers if "error" in a]
    if bad:
        raise queries.InvalidQuery(bad[0])
    out = queries.merge(q, [a["objects"] for a in answers])
    out["regions"] = len(answers)
    return out


async def answer(args: argparse.Namespace) -> dict[str, Any]:
    """The answer; with --tenant, the ids as the tenant names them (and `next_after`, which
    goes back as --after), as the API gives them."""
    out = await gather(await request(args))
    if args.tenant:
        out["objects"] = [{**r, "id": name_of(str(r["id"]))} for r in out["objects"]]
        if "next_after" in out:
            out["next_after"] = name_of(str(out["next_after"]))
    return out


def human(data: dict[str, Any]) -> str:
    rows = data["objects"]
    lines = [f"{len(rows)} object{'s' if len(rows) != 1 else ''} ({data['query']}, from {data['regions']} "
             "regions' latest positions)"]
    for r in rows:
        near = f"  {r['distance_m']:8.1f} m" if "distance_m" in r else ""
        lines.append(f"  {r['id']:<28} {r['lon']:11.6f} {r['lat']:10.6f}  at {r['ts']:.3f}{near}")
    if "next_after" in data:
        lines.append(f"next page: --after {data['next_after']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        data = asyncio.run(answer(args))
    except queries.InvalidQuery as exc:
        return exit_codes.say("query", exc, usage=True)
    except RpcTimeout as exc:
        return exit_codes.say("query", exc, unreachable=True)
    except (StackError, OSError, KeyError) as exc:
        return exit_codes.say("query", exc)
    print(json.dumps(data, indent=2) if args.json else human(data))
    return 0
