"""`geofence subscription add | list | show | remove`: a tenant's proximity subscriptions from
the command line, as an operator (this command writes the store directly, as `geofence fence`
does; over HTTP and AMQP a tenant's editors make them).

    geofence subscription add --tenant T (--object truck-7 | --point LON LAT) --radius 300 \\
        [--match 'car-*'] [--where '[["type", "==", "car"]]'] [--id ID] [--owner NAME]
    geofence subscription list [--tenant T]
    geofence subscription show ID --tenant T
    geofence subscription remove ID... --tenant T

A subscription is stored with its change; x-ingress applies it within a second
(exchanges/roam_routing.py). Connects with GEOFENCE_POSTGRES_URL when set, else to the local
stack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from typing import Any

import asyncpg

from deploy import exit_codes
from deploy.fence_cmd import connection
from exchanges import routing_store
from exchanges.subscriptions import InvalidSubscription, Subscription
from exchanges.tenancy import InvalidTenant, check_tenant, qualify
from fence import store

OWNER = "operator"  # the owner of subscriptions made here, unless --owner says another


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("add", help="create or change a subscription")
    around = p.add_mutually_exclusive_group(required=True)
    around.add_argument("--object", help="the object the subscription moves with")
    around.add_argument("--point", nargs=2, type=float, metavar=("LON", "LAT"), help="a fixed point instead")
    p.add_argument("--radius", type=float, required=True, help="metres")
    p.add_argument("--match", default="*", help="a glob on the other objects' ids (default: all)")
    p.add_argument("--where", help="conditions on the other objects' extra fields, JSON: "
                                   """'[["type", "==", "car"]]'""")
    p.add_argument("--id", help="the subscription's id (default: a new one)")
    p.add_argument("--owner", default=OWNER, help=f"who made it (default {OWNER!r})")
    p.add_argument("--tenant", required=True, help="the tenant it is of (it sees that tenant's objects only)")
    p = sub.add_parser("list", help="the subscriptions (every tenant's, or one tenant's)")
    p.add_argument("--tenant", help="only this tenant's")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("show", help="one subscription as stored")
    p.add_argument("id")
    p.add_argument("--tenant", required=True)
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("remove", help="delete subscriptions (their pairs report nothing more)")
    p.add_argument("ids", nargs="+", metavar="ID")
    p.add_argument("--tenant", required=True)


def _tenant(raw: str) -> str:
    try:
        return check_tenant(raw)
    except InvalidTenant as exc:
        raise InvalidSubscription(str(exc)) from None


def definition(args: argparse.Namespace) -> dict[str, Any]:
    """The subscription the `add` arguments describe (InvalidSubscription if none)."""
    tenant = _tenant(args.tenant)
    sub_id = args.id or f"rs-{uuid.uuid4().hex[:16]}"
    d: dict[str, Any] = {"id": qualify(tenant, sub_id), "radius_m": args.radius}
    if args.point is not None:
        d["point"] = list(args.point)
    else:
        d["object"] = qualify(tenant, args.object)
    if args.match != "*":
        d["match"] = args.match
    if args.where:
        try:
            d["where"] = json.loads(args.where)
        except ValueError as exc:
            raise InvalidSubscription(f"--where is not JSON: {exc}") from None
    return Subscription.from_wire(d).to_wire()


def line(s: dict[str, Any]) -> str:
    extra = "".join(f" {k} {json.dumps(s[k])}" for k in ("match", "where") if k in s)
    around = s["object"] if "object" in s else "point {:.6f},{:.6f}".format(*s["point"])
    return f"{s['id']:<24} {around:<20} {s['radius_m']:>8g} m  owner {s['owner']}{extra}"


async def _run(args: argparse.Namespace) -> int:
    _, pg, _, _ = connection()
    d = definition(args) if args.action == "add" else None
    conn = await routing_store.connect(pg)
    try:
        if d is not None:
            print(line(await store.put_subscription(conn, args.owner, d)))
        elif args.action == "list":
            subs = await store.list_subscriptions(conn, args.tenant and _tenant(args.tenant))
            print(json.dumps(subs, indent=2) if args.json else "\n".join(line(s) for s in subs)
                  or "no proximity subscription")
        elif args.action == "show":
            found = await store.get_subscription(conn, qualify(_tenant(args.tenant), args.id))
            print(json.dumps(found, indent=2) if args.json else line(found))
        else:
            for sub_id in args.ids:
                await store.delete_subscription(conn, qualify(_tenant(args.tenant), sub_id))
                print(f"{sub_id} removed")
    finally:
        await conn.close()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args))
    except InvalidSubscription as exc:
        return exit_codes.say(f"subscription {args.action}", exc, f"invalid subscription: {exc}", usage=True)
    except store.UnknownSubscription as exc:
        return exit_codes.say(f"subscription {args.action}", exc, f"no subscription {exc.args[0]!r}")
    except PermissionError as exc:
        return exit_codes.say(f"subscription {args.action}", exc)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, RuntimeError) as exc:
        return exit_codes.say(f"subscription {args.action}", exc)
