"""`geofence webhook ...`: a tenant's webhook endpoints, as a platform operator (this command
writes the store directly, as `geofence tenant` does; over HTTP a tenant's admins use
`/webhooks`). The webhooks sidecar picks a change up at once (NOTIFY) and at the latest 10 s later.

    geofence webhook add TENANT URL [--fence F ...] [--kind K ...] [--object O ...] [--batch N]
                                    [--timeout S] [--retry-for S] [--description TEXT] [--local]
    geofence webhook list [--tenant T] [--json]
    geofence webhook show TENANT ID [--json]
    geofence webhook remove TENANT ID
    geofence webhook enable TENANT ID
    geofence webhook rotate TENANT ID
    geofence webhook dead TENANT ID [--after SEQ] [--limit N] [--json]
    geofence webhook replay TENANT ID
    geofence webhook notices TENANT [--after ID] [--limit N] [--json]

`add` and `rotate` print the signing secret (whsec_...): it is shown only then. `--local` lets
the endpoint be on a private or loopback address (the operator's own receivers, a test
receiver); the API never allows that. Exit codes: deploy/exit_codes.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

import asyncpg

from deploy import exit_codes
from deploy.fence_cmd import connection
from exchanges import routing_store
from fence.webhooks import endpoints, notices, signing, store
from fence.webhooks.endpoints import KINDS, InvalidEndpoint


class BadArgument(ValueError):
    exit_code = exit_codes.USAGE


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("add", help="add an endpoint for a tenant's events (prints its secret)")
    p.add_argument("tenant")
    p.add_argument("url", help="https://... (http and private addresses with --local)")
    p.add_argument("--fence", action="append", default=None, help="only this fence's events; repeatable")
    p.add_argument("--kind", action="append", default=None, choices=KINDS, help="only this kind; repeatable")
    p.add_argument("--object", action="append", default=None, help="only this object's events; repeatable")
    p.add_argument("--batch", type=int, default=1, help="events per request (1: the event; more: an array)")
    p.add_argument("--timeout", type=float, default=endpoints.DEFAULT_TIMEOUT_S, help="seconds per request")
    p.add_argument("--retry-for", type=float, default=endpoints.DEFAULT_RETRY_FOR_S,
                   help="seconds a failing request is retried before it is given up")
    p.add_argument("--description", default="")
    p.add_argument("--local", action="store_true", help="allow a private or loopback address (operator only)")
    p = sub.add_parser("list", help="endpoints (every tenant's, or one's)")
    p.add_argument("--tenant")
    p.add_argument("--json", action="store_true", help="print JSON")
    for action, words in (("show", "an endpoint and its delivery"), ("remove", "remove an endpoint"),
                          ("enable", "enable a disabled endpoint"), ("rotate", "a new signing secret"),
                          ("dead", "its given-up events"), ("replay", "queue its given-up events again")):
        p = sub.add_parser(action, help=words)
        p.add_argument("tenant")
        p.add_argument("id")
        if action in ("show", "dead"):
            p.add_argument("--json", action="store_true", help="print JSON")
        if action == "dead":
            p.add_argument("--after", type=int, default=0, help="the last seq seen (a cursor)")
            p.add_argument("--limit", type=int, default=100)
    p = sub.add_parser("notices", help="what the tenant's admins were told (an endpoint disabled)")
    p.add_argument("tenant")
    p.add_argument("--after", type=int, default=0, help="the last id seen (a cursor)")
    p.add_argument("--limit", type=int, default=notices.MAX_PAGE)
    p.add_argument("--json", action="store_true", help="print JSON")


def lines(found: list[endpoints.Endpoint]) -> str:
    if not found:
        return "no webhook endpoint (add one with `geofence webhook add TENANT URL`)"
    head = f"{'ID':<20} {'TENANT':<20} {'STATE':<8} {'BATCH':>5}  URL"
    rows = (f"{e.id:<20} {e.tenant:<20} {'enabled' if e.enabled else 'disabled':<8} {e.batch:>5}  {e.url}"
            for e in found)
    return "\n".join([head, *rows])


def _body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"url": args.url, "batch": args.batch, "timeout_s": args.timeout,
                            "retry_for_s": args.retry_for, "description": args.description}
    for key, value in (("fences", args.fence), ("kinds", args.kind), ("objects", args.object)):
        if value:
            body[key] = value
    return body


async def _run(args: argparse.Namespace) -> str:
    _, pg, _, _ = connection()
    conn = await routing_store.connect(pg)
    try:
        if args.action == "add":
            secret = signing.new_secret()
            try:
                ep = endpoints.from_request(_body(args), store.new_id(), args.tenant, secret,
                                            local=args.local)
            except InvalidEndpoint as exc:
                raise BadArgument(str(exc)) from None
            if not await conn.fetchval("SELECT true FROM tenant WHERE id = $1", args.tenant):
                raise BadArgument(f"no tenant {args.tenant!r} (add it with `geofence tenant add`)")
            await store.create(conn, ep)
            return json.dumps({**ep.public(), "secret": secret}, indent=2)
        if args.action == "list":
            found = await store.listed(conn, args.tenant)
            return json.dumps([e.public() for e in found], indent=2) if args.json else lines(found)
        if args.action == "show":
            ep = await store.get(conn, args.tenant, args.id)
            shown = {**ep.public(), "delivery": (await store.stats(conn, args.tenant, args.id)).to_json()}
            return json.dumps(shown, indent=2)
        if args.action == "remove":
            await store.remove(conn, args.tenant, args.id)
            return f"webhook {args.id} removed"
        if args.action == "enable":
            await store.enable(conn, args.tenant, args.id)
            return f"webhook {args.id} enabled"
        if args.action == "rotate":
            secret = signing.new_secret()
            await store.rotate(conn, args.tenant, args.id, secret)
            return json.dumps({"id": args.id, "secret": secret}, indent=2)
        if args.action == "notices":
            told = await notices.page(conn, args.tenant, args.after, args.limit)
            if args.json:
                return json.dumps(told, indent=2)
            return "\n".join(f"{n['id']} {n['created_at']} {n['kind']} {n['subject']}: {n['body']} "
                             f"(pushed to {n['pushed']} device(s))" for n in told) or "no notice"
        if args.action == "dead":
            rows = await store.dead(conn, args.tenant, args.id, args.after, args.limit)
            if args.json:
                return json.dumps(rows, indent=2, default=str)
            return "\n".join(f"{r['seq']} {r['event_id']} {r['msg_id']} after {r['attempts']} attempts: "
                             f"{r['reason']}" for r in rows) or "nothing given up"
        n = await store.replay(conn, args.tenant, args.id)
        return f"{n} given-up event(s) queued again for {args.id}"
    finally:
        await conn.close()


def run(args: argparse.Namespace) -> int:
    what = f"webhook {args.action}"
    try:
        print(asyncio.run(_run(args)))
        return 0
    except BadArgument as exc:
        return exit_codes.say(what, exc, usage=True)
    except (store.UnknownEndpoint, store.TooManyEndpoints) as exc:
        return exit_codes.say(what, exc)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return exit_codes.say(what, exc)
