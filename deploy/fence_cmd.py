"""`geofence fence add | replace | remove | list | show --tenant T`: a tenant's fences from
GeoJSON files, as an operator (this command writes the store directly).

A file holds a Feature or a FeatureCollection (one fence per feature; the id comes from the
feature's `id` or its `fence_id` / `id` property, or --id for a single feature), each a fence
of the tenant (its id qualified by it, exchanges/tenancy.py). Connects with
GEOFENCE_AMQP_URL (the fence-manager user) and GEOFENCE_POSTGRES_URL when set, else to the
local stack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import asyncpg

from deploy import exit_codes
from deploy.settings import Settings, amqp_url, load_secrets, postgres_dsn
from exchanges import routing_store, settings_registry
from exchanges import topology as t
from exchanges.fence_def import InvalidFence
from exchanges.fence_options.timeout import check_timeout
from exchanges.tenancy import InvalidTenant, check_tenant, name_of, qualify, tenant_of
from fence import store, tenants
from fence.manager import FenceManager
from fence.spec import FenceSpec, from_feature


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, help_text in (("add", "create fences (an existing id is an error)"),
                              ("replace", "replace (move, reshape) existing fences")):
        p = sub.add_parser(action, help=help_text)
        p.add_argument("file", help="GeoJSON Feature or FeatureCollection ('-' for stdin)")
        p.add_argument("--id", help="the fence id (a file with one feature only)")
        p.add_argument("--timeout", type=float, help="timeout_s for every fence of the file")
        p.add_argument("--tenant", required=True, help="the tenant the fences are of")
    p = sub.add_parser("remove", help="delete fences (objects inside get LEAVE fence_deleted)")
    p.add_argument("ids", nargs="+", metavar="ID")
    p.add_argument("--tenant", required=True)
    p = sub.add_parser("list", help="the live fences (of one tenant, or of all)")
    p.add_argument("--tenant", help="only this tenant's")
    p.add_argument("--json", action="store_true",
                   help="a JSON array of {fence_id, tenant, name, version, timeout_s, regions}")
    p = sub.add_parser("show", help="one fence as stored (GeoJSON geometry, version, regions)")
    p.add_argument("id")
    p.add_argument("--tenant", required=True)
    p.add_argument("--json", action="store_true", help="the stored fence whole, as JSON (geometry included)")


def fence_lines(fence: dict[str, Any]) -> str:
    """A stored fence for a person: its fields a line each, its geometry summed up."""
    geometry = fence.get("geometry") or {}
    polygons = geometry.get("coordinates", []) if geometry.get("type") == "MultiPolygon" else [
        geometry.get("coordinates", [])]
    points = [p for polygon in polygons for ring in polygon for p in ring]
    lines = [f"{'fence':<14} {fence.get('id')}"]
    if points:
        lons, lats = [p[0] for p in points], [p[1] for p in points]
        lines.append(f"{'geometry':<14} {geometry.get('type')}, {len(polygons)} polygon(s), {len(points)} "
                     f"vertices, bbox {min(lons):.6f},{min(lats):.6f},{max(lons):.6f},{max(lats):.6f}")
    for key, value in fence.items():
        if key not in ("id", "geometry"):
            lines.append(f"{key:<14} {value if isinstance(value, str) else json.dumps(value)}")
    return "\n".join(lines) + "\n(--json: the whole fence)"


def read_features(path: str) -> list[dict[str, Any]]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:  # the user's file: bad usage, not a failed operation
        raise InvalidFence(f"{path}: cannot be read ({exc})") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InvalidFence(f"{path}: not JSON ({exc})") from None
    if isinstance(doc, dict) and doc.get("type") == "FeatureCollection":
        feats = doc.get("features")
        if not isinstance(feats, list) or not feats:
            raise InvalidFence(f"{path}: the FeatureCollection has no features")
        return feats
    return [doc]


def specs_from(path: str, fence_id: str | None, timeout: float | None, tenant: str = "") -> list[FenceSpec]:
    """The fences of a file, their ids qualified by `tenant`."""
    features = read_features(path)
    if fence_id and len(features) != 1:
        raise InvalidFence(f"--id needs a file with one feature; {path} has {len(features)}")
    specs = []
    for i, f in enumerate(features):
        if timeout is not None and isinstance(f, dict):
            f = {**f, "properties": {**(f.get("properties") or {}), "timeout_s": check_timeout(timeout)}}
        try:
            spec = from_feature(f, fence_id)
            specs.append(FenceSpec.of(spec, spec.owner, spec.follow, fence_id=qualify(tenant, spec.fence_id)))
        except InvalidFence as exc:
            raise InvalidFence(f"{path}: feature {i}: {exc}") from None
    return specs


def connection() -> tuple[str, str, tuple[str, ...], tuple[str, ...]]:
    """(fence-manager AMQP URL, PostgreSQL URL, regions, workers)."""
    settings = Settings.from_env()
    amqp, pg = settings_registry.read("GEOFENCE_AMQP_URL"), settings_registry.read("GEOFENCE_POSTGRES_URL")
    if not (amqp and pg):
        pw = load_secrets(settings)
        amqp = amqp or amqp_url(settings, pw.users[t.MANAGER_USER], "/", t.MANAGER_USER)
        pg = pg or postgres_dsn(settings, pw.postgres_password)
    return amqp, pg, settings.regions, settings.workers


def tenant(args: argparse.Namespace) -> str:
    try:
        return check_tenant(args.tenant)
    except InvalidTenant as exc:
        raise InvalidFence(str(exc)) from None


async def _run(args: argparse.Namespace) -> int:
    amqp, pg, regions, workers = connection()
    if args.action in ("list", "show"):
        conn = await routing_store.connect(pg)
        try:
            if args.action == "show":
                shown = (await store.get_fence(conn, qualify(tenant(args), args.id))).to_json()
                print(json.dumps(shown, indent=2) if args.json else fence_lines(shown))
                return 0
            rows = await store.find_fences(conn, args.tenant and tenant(args), limit=1_000_000)
            if args.json:
                print(json.dumps([{"fence_id": r.fence.fence_id, "tenant": tenant_of(r.fence.fence_id),
                                   "name": r.fence.name, "version": r.fence.version,
                                   "timeout_s": r.fence.timeout_s, "regions": list(r.regions)} for r in rows],
                                 indent=2))
                return 0
            for r in rows:
                f = r.fence
                print(f"{f.fence_id:<24} v{f.version:<4} timeout {f.timeout_s:>7g}s  regions "
                      f"{','.join(r.regions) or '-':<6} {f.name}")
        finally:
            await conn.close()
        return 0
    specs = [] if args.action == "remove" else specs_from(args.file, args.id, args.timeout, tenant(args))
    async with FenceManager(amqp, pg, regions, workers) as manager:
        for spec in specs:  # both sides opt in, here as through the API (fence/service.py)
            if spec.counts_from:
                async with manager.pool.acquire() as conn:
                    sharing = await tenants.sharing_with(conn, list(spec.counts_from), tenant(args))
                missing = sorted(set(spec.counts_from) - sharing)
                if missing:
                    raise InvalidFence(f"{name_of(spec.fence_id)}: counts_from: tenant {missing[0]!r} does "
                                       f"not share its objects' presence with {tenant(args)!r}")
        if args.action == "remove":
            for fid in args.ids:
                print((await manager.remove(qualify(tenant(args), fid))).line() + " (deleted)")
        for spec in specs:
            print((await manager.put(spec, create=args.action == "add")).line())
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(args))
    except InvalidFence as exc:  # the file, or an argument: bad usage
        return exit_codes.say(f"fence {args.action}", exc, f"invalid fence: {exc}", usage=True)
    except store.UnknownFence as exc:
        return exit_codes.say(f"fence {args.action}", exc, f"no fence {exc.args[0]!r}")
    except store.VersionConflict as exc:
        return exit_codes.say(f"fence {args.action}", exc)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, RuntimeError) as exc:
        return exit_codes.say(f"fence {args.action}", exc)
