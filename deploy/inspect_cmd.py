"""`geofence inspect fence | object | geo | worker | proximity | ring | worldmap`: the live state
of the pipeline. fence/object/geo/worker/proximity ask the running sidecars (a request on their control
queue, the answer on a private reply queue); ring and worldmap are computed / read here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from typing import Any

import aio_pika
import asyncpg
import numpy as np

from deploy import exit_codes
from deploy.processes import StackError
from deploy.settings import Settings, load_connection_settings
from exchanges import routing_store
from exchanges import topology as t
from exchanges.batch import CONTENT_TYPE, pack
from exchanges.control import INSPECT
from exchanges.hash_ring import HashRing
from exchanges.tenancy import InvalidTenant, check_tenant, qualify

RPC_TIMEOUT_S = 10.0


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    if name in ("fence", "object"):
        parser.add_argument("id", help="its id as its tenant names it (with --tenant), or <tenant>:<id>")
        parser.add_argument("--tenant", help="the tenant it is of")
    elif name == "geo":
        parser.add_argument("region")
    elif name == "worker":
        parser.add_argument("worker")
    elif name == "ring":
        parser.add_argument("--fence", action="append", default=[], help="show this fence's worker")
    if name in ("geo", "worker"):
        parser.add_argument("--limit", type=int, default=20, help="how many fences / objects to list")
    parser.add_argument("--json", action="store_true", help="print JSON")


class RpcTimeout(RuntimeError):
    pass


async def ask(url: str, exchange: str, routing_key: str, request: dict[str, Any],
              timeout: float = RPC_TIMEOUT_S, kind: str = INSPECT) -> Any:
    """Publish `request` (an inspect request unless `kind` says otherwise) with reply_to a
    private queue and wait for the one answer."""
    conn = await aio_pika.connect(url, timeout=10)
    try:
        ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
        replies = await ch.declare_queue("", exclusive=True, auto_delete=True)
        ex = await ch.get_exchange(exchange, ensure=False)
        cid = uuid.uuid4().hex
        await ex.publish(aio_pika.Message(pack(kind, **request), content_type=CONTENT_TYPE,
                                          reply_to=replies.name, correlation_id=cid), routing_key)
        async with replies.iterator(timeout=timeout) as it:
            async for message in it:
                async with message.process():
                    if message.correlation_id == cid:
                        return json.loads(message.body)
    except TimeoutError:
        raise RpcTimeout(f"no answer from {exchange} {routing_key!r} within {timeout:g}s: is the "
                         "sidecar running? (`geofence status`)") from None
    finally:
        await conn.close()
    raise RpcTimeout("the reply queue closed")


async def ring_in_force(settings: Settings) -> HashRing:
    """The stored worker ring (`geofence worker add / remove`), else GEOFENCE_WORKERS'
    (also when the stack is not up: the ring is computed, not asked)."""
    try:
        conn = await routing_store.connect(load_connection_settings(settings)["postgres"]["dsn"])
    except (StackError, OSError, asyncpg.PostgresError):
        return HashRing(list(settings.workers))
    try:
        return (await routing_store.ring_or(conn, settings.workers))[1]
    finally:
        await conn.close()


async def _run(args: argparse.Namespace) -> Any:
    settings = Settings.from_env()
    target = args.target
    ring = await ring_in_force(settings)
    if target == "ring":
        return {"workers": list(ring.nodes), "shares": ring.shares(),
                "vnodes_per_weight": ring.vnodes_per_weight,
                "hot": ring.hot,
                "fences": {f: {"walk": ring.nodes_for(f, len(ring.nodes)), "masters": ring.masters(f)}
                           for f in args.fence}}
    conn = load_connection_settings(settings)
    if target == "worldmap":
        wm = await routing_store.read_worldmap(conn["postgres"]["dsn"])
        if wm is None:
            raise RuntimeError("no worldmap stored: run `geofence up`")
        return wm.to_json()
    fences_url = conn["amqp"][t.FENCES_VHOST]
    if target in ("fence", "object") and args.tenant:
        args.id = qualify(check_tenant(args.tenant), args.id)  # the pipeline's name of it
    if target == "fence":
        masters = ring.masters(args.id)  # more than one: a hot fence, each master has its objects
        answers = await asyncio.gather(*(ask(fences_url, t.FENCE_CONTROL_EXCHANGE, w, {"fence_id": args.id})
                                         for w in masters))
        missing = [w for w, a in zip(masters, answers, strict=True) if a.get("fence") is None]
        if missing:
            raise RuntimeError(f"worker {', '.join(missing)} (the fence's node on the ring) has no fence "
                               f"{args.id!r}")
        fence = answers[0]["fence"]
        if len(masters) > 1:
            fence = {**fence, "occupants": sorted((o for a in answers for o in a["fence"]["occupants"]),
                                                  key=lambda o: str(o["object_id"]))}
        return {"worker": masters[0], "workers": masters, **fence}
    if target == "object":
        answers = await asyncio.gather(*(ask(fences_url, t.FENCE_CONTROL_EXCHANGE, w, {"object_id": args.id})
                                         for w in ring.nodes))
        regions = await asyncio.gather(*(ask(conn["amqp"][t.region_vhost(r)], t.GEO_CONTROL_EXCHANGE, "",
                                             {"limit": 0, "object_id": args.id}) for r in settings.regions))
        latest = {r: a["object"]["latest"] for r, a in zip(settings.regions, regions, strict=True)
                  if a["object"]["latest"] is not None}
        return {"object_id": args.id, "fences": sorted(f for a in answers for f in a["object"]["fences"]),
                "latest": latest,  # per region whose x-geo has the object (one, unless in transit)
                "workers": {w: a["object"] for w, a in zip(ring.nodes, answers, strict=True)}}
    if target == "worker":
        return await ask(fences_url, t.FENCE_CONTROL_EXCHANGE, args.worker,
                         {"fences": True, "limit": args.limit})
    if target == "geo":
        return await ask(conn["amqp"][t.region_vhost(args.region)], t.GEO_CONTROL_EXCHANGE, "",
                         {"limit": args.limit})
    if target == "proximity":
        answers = await asyncio.gather(*(ask(fences_url, t.FENCE_CONTROL_EXCHANGE, w, {"roam": True})
                                         for w in ring.nodes))
        return {w: a.get("proximity") for w, a in zip(ring.nodes, answers, strict=True)}
    raise ValueError(target)


def _human(target: str, data: Any) -> str:
    if target == "fence":
        dwell = f", dwell {data['dwell_s']:g}s" if data.get("dwell_s") else ""
        lines = [f"fence {data['id']} v{data['version']} {data['name']!r} on worker "
                 f"{', '.join(data['workers'])}, "
                 f"timeout {data['timeout_s']:g}s{dwell}: {len(data['occupants'])} inside"]
        lines += [f"  {o['object_id']:<24} since {o['since']:.3f}  last seen {o['last_seen']:.3f}"
                  + ("" if o.get("confirmed", True) else "  (within the dwell time: no ENTER yet)")
                  for o in data["occupants"]]
        return "\n".join(lines)
    if target == "object":
        lines = [f"object {data['object_id']} is in: {', '.join(data['fences']) or '(no fence)'}"]
        for region, p in sorted(data["latest"].items()):
            lines.append(f"  latest position (region {region}): {p['lon']:.6f}, {p['lat']:.6f} "
                         f"at {p['ts']:.3f}")
        if not data["latest"]:
            lines.append("  no region has a position of it (never seen, or not since a restart)")
        return "\n".join(lines)
    if target == "ring":
        lines = [f"{w:<10} share {s:6.1%}" for w, s in data["shares"].items()]
        lines += [f"hot fence {f}: {n} masters" for f, n in sorted(data["hot"].items())]
        lines += [f"fence {f}: worker{'s' if len(v['masters']) > 1 else ''} {', '.join(v['masters'])} "
                  f"(walk {', '.join(v['walk'])})" for f, v in data["fences"].items()]
        return "\n".join(lines)
    if target == "proximity":
        lines = []
        for w, p in data.items():
            if p is None:
                lines.append(f"worker {w}: no proximity subscription yet")
                continue
            lines.append(f"worker {w}: {len(p['ids'])} subscriptions, {p['held']} positions held, "
                         f"{len(p['near_pairs'])} near pairs reported here")
            lines += [f"  {s} ~ {o}" for s, o in p["near_pairs"][:20]]
        return "\n".join(lines)
    if target == "worldmap":
        starts = np.array([s for s, _ in data["intervals"]], dtype=np.uint64)
        lines = [f"worldmap version {data['version']} ({data['bits']} bits per axis), regions "
                 f"{', '.join(data['regions'])}:"]
        for i, (s, r) in enumerate(data["intervals"]):
            end = int(starts[i + 1]) - 1 if i + 1 < len(starts) else (1 << (2 * data["bits"])) - 1
            lines.append(f"  [{s}, {end}] -> {r}")
        return "\n".join(lines)
    return json.dumps(data, indent=2)


def run(args: argparse.Namespace) -> int:
    try:
        data = asyncio.run(_run(args))
    except InvalidTenant as exc:
        return exit_codes.say(f"inspect {args.target}", exc, usage=True)
    except RpcTimeout as exc:  # the sidecar did not answer: a service unreachable
        return exit_codes.say(f"inspect {args.target}", exc, unreachable=True)
    except (RuntimeError, OSError, KeyError) as exc:
        return exit_codes.say(f"inspect {args.target}", exc)
    print(json.dumps(data, indent=2) if args.json else _human(args.target, data))
    return 0
