"""`geofence tenant ...`: tenants (organisations) and their members, as a platform operator (this
command writes the store directly, as `geofence subscription` does; over HTTP a tenant is made
with the operator claim and its members are managed by its admins).

    geofence tenant add ID [--name NAME]
    geofence tenant list [--json]
    geofence tenant remove ID
    geofence tenant member add TENANT UID --role viewer|editor|admin   (also changes a role)
    geofence tenant member remove TENANT UID
    geofence tenant member list TENANT [--json]
    geofence tenant quota TENANT [--set RESOURCE=N|default ...] [--json]

A tenant id is 1-32 characters from a-z 0-9 -, starting with a letter or digit: the prefix of
the tenant's names inside the pipeline (exchanges/tenancy.py). Here, unlike the API, the last
admin of a tenant may be removed or demoted. `quota` shows what the tenant holds against its
quotas (fence/quotas.py: fences, vertices, follow_fences, subscriptions) and sets them. Exit
code 0 on success, 2 on any refusal or error (one line on stderr). Connects with
GEOFENCE_POSTGRES_URL when set, else to the local stack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import UTC, datetime

import asyncpg

from deploy import exit_codes
from deploy.fence_cmd import connection
from exchanges import routing_store
from exchanges.tenancy import ROLES, TENANT_RULE, InvalidTenant
from fence import quotas, tenants


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("add", help="create a tenant (no members yet)")
    p.add_argument("id", help=f"the tenant id: {TENANT_RULE}")
    p.add_argument("--name", default="", help="its display name")
    p = sub.add_parser("list", help="every tenant: members, live fences")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("remove", help="delete a tenant and its members (refused while it holds fences or "
                                      "subscriptions)")
    p.add_argument("id")
    p = sub.add_parser("member", help="a tenant's members: add (or change a role), remove, list")
    members = p.add_subparsers(dest="member_action", metavar="ACTION", required=True)
    m = members.add_parser("add", help="add a member, or change a member's role")
    m.add_argument("tenant")
    m.add_argument("uid", help="the user's Firebase uid")
    m.add_argument("--role", required=True, choices=ROLES, help="viewer < editor < admin")
    m = members.add_parser("remove", help="remove a member (the last admin too)")
    m.add_argument("tenant")
    m.add_argument("uid")
    m = members.add_parser("list", help="a tenant's members and roles")
    m.add_argument("tenant")
    m.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("quota", help="a tenant's quotas and what it holds; --set changes them")
    p.add_argument("id")
    p.add_argument("--set", action="append", default=[], metavar="RESOURCE=N",
                   help=f"a quota ({', '.join(quotas.RESOURCES)}) to N, or to `default`; repeatable")
    p.add_argument("--json", action="store_true", help="print JSON")


def _when(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def tenant_lines(found: list[tenants.Tenant]) -> str:
    if not found:
        return "no tenant (add one with `geofence tenant add ID`)"
    head = f"{'TENANT':<33} {'MEMBERS':>7} {'FENCES':>7}  {'CREATED':<20} NAME"
    rows = (f"{t.id:<33} {t.members:>7} {t.live_fences:>7}  {_when(t.created_at):<20} {t.name}"
            for t in found)
    return "\n".join([head, *rows])


def member_lines(tenant: str, found: list[tenants.Member]) -> str:
    if not found:
        return f"tenant {tenant} has no member (add one with `geofence tenant member add`)"
    head = f"{'UID':<40} {'ROLE':<7} ADDED"
    return "\n".join([head, *(f"{m.uid:<40} {m.role:<7} {_when(m.added_at)}" for m in found)])


async def _member(conn: asyncpg.Connection, args: argparse.Namespace) -> str:
    if args.member_action == "add":
        was = (await tenants.memberships(conn, args.uid)).get(args.tenant)
        m = await tenants.put_member(conn, args.tenant, args.uid, args.role, keep_admin=False)
        done = ("added" if was is None else "unchanged" if was == m.role else f"changed from {was}")
        return f"{m.uid} is {m.role} of {m.tenant} ({done})"
    if args.member_action == "remove":
        await tenants.remove_member(conn, args.tenant, args.uid, keep_admin=False)
        return f"{args.uid} removed from {args.tenant}"
    found = await tenants.members(conn, args.tenant)
    if args.json:
        return json.dumps([m.to_json() for m in found], indent=2)
    return member_lines(args.tenant, found)


def quota_lines(tenant: str, report: dict[str, dict[str, int | bool]]) -> str:
    head = f"{'QUOTA':<14} {'USED':>10} {'MAX':>10}  OF {tenant}"
    rows = (f"{k:<14} {q['used']:>10,} {q['max']:>10,}  {'(default)' if q['default'] else '(set)'}"
            for k, q in report.items())
    return "\n".join([head, *rows])


class BadArgument(tenants.TenantError):
    """An argument that is not what it should be (deploy/exit_codes.py: bad usage)."""

    exit_code = 2


def parse_sets(sets: list[str]) -> list[tuple[str, int | None]]:
    out: list[tuple[str, int | None]] = []
    for item in sets:
        resource, sep, value = item.partition("=")
        if not sep or resource not in quotas.RESOURCES:
            raise BadArgument(f"--set {item!r}: RESOURCE=N or RESOURCE=default, RESOURCE one of "
                              f"{', '.join(quotas.RESOURCES)}")
        if value == "default":
            out.append((resource, None))
        elif value.isdigit() and len(value) <= 15:
            out.append((resource, int(value)))
        else:
            raise BadArgument(f"--set {item!r}: N is a whole number 0 or more, or `default`")
    return out


async def _quota(conn: asyncpg.Connection, args: argparse.Namespace) -> str:
    await tenants.get_tenant(conn, args.id)  # an unknown tenant: said so
    changes = parse_sets(args.set)
    async with conn.transaction():
        for resource, maximum in changes:
            await quotas.set_quota(conn, args.id, resource, maximum)
    report = await quotas.report(conn, args.id)
    return json.dumps(report, indent=2) if args.json else quota_lines(args.id, report)


async def _run(args: argparse.Namespace) -> str:
    _, pg, _, _ = connection()
    conn = await routing_store.connect(pg)
    try:
        if args.action == "add":
            t = await tenants.add_tenant(conn, args.id, args.name)
            return f"tenant {t.id} added" + (f" ({t.name})" if t.name else "")
        if args.action == "list":
            found = await tenants.list_tenants(conn)
            return json.dumps([t.to_json() for t in found], indent=2) if args.json else tenant_lines(found)
        if args.action == "remove":
            await tenants.remove_tenant(conn, args.id)
            return f"tenant {args.id} removed"
        if args.action == "quota":
            return await _quota(conn, args)
        return await _member(conn, args)
    finally:
        await conn.close()


def run(args: argparse.Namespace) -> int:
    what = f"tenant {args.action}" + (f" {args.member_action}" if args.action == "member" else "")
    try:
        print(asyncio.run(_run(args)))
        return 0
    except InvalidTenant as exc:
        return exit_codes.say(what, exc, usage=True)
    except tenants.TenantError as exc:
        return exit_codes.say(what, exc)
    except asyncpg.UndefinedTableError as exc:
        return exit_codes.say(what, exc, f"{exc}: the database lacks the tenants' tables, run "
                                         "`geofence migrate`")
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return exit_codes.say(what, exc)
