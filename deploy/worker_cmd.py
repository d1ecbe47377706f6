"""`geofence worker list | add | remove | hot | lost`: the x-fence workers.

`list`: the ring in force (stored by `worker add / remove`, else GEOFENCE_WORKERS), each
worker's weight and share of the ring, and what it holds (fences, objects inside, positions
held for a gate), asked over its control queue; a worker that does not answer is listed as
down. `add NAME [--weight K]` and `remove NAME`: a worker added or removed while positions
flow, its fences' state handed over (deploy/worker_ops.py), with a SUMMARY line. `hot FENCE...
--masters N`: the fence judged by N workers, each for its share of the objects (the hash
ring's hot fences), handed over the same way. `lost NAME`: the process running worker NAME is
gone for good or hung (docs/operations.md, "Losing a host"): its connections are closed, and a
standby that follows the worker's journal stream takes it over with its state.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import asyncpg

from deploy import exit_codes, worker_ops
from deploy.inspect_cmd import RpcTimeout, ask
from deploy.processes import StackError
from deploy.progress import Steps
from deploy.region_ops import live
from deploy.settings import Settings, connection_settings, load_secrets, overriding
from exchanges import topology as t


async def gather() -> dict[str, Any]:
    settings = live(Settings.from_env())
    pw = load_secrets(settings)
    version, ring, fences = await worker_ops.current_ring(settings, pw)
    url = connection_settings(settings, pw)["amqp"][t.FENCES_VHOST]

    async def one(worker: str) -> dict[str, Any]:
        try:
            answer: dict[str, Any] = await ask(url, t.FENCE_CONTROL_EXCHANGE, worker, {}, timeout=5.0)
            return answer
        except (RpcTimeout, OSError) as exc:
            return {"error": str(exc)}

    names = sorted({*ring.nodes, *settings.workers})
    answers = await asyncio.gather(*(one(w) for w in names))
    shares = ring.shares()
    rows = []
    for w, a in zip(names, answers, strict=True):
        row: dict[str, Any] = {"worker": w, "on_ring": w in ring.nodes, "weight": ring.weights.get(w, 0),
                               "share": shares.get(w, 0.0), "up": "stats" in a,
                               "recovering": a.get("recovering")}
        if a.get("master"):  # the process running it (host/pid/...): its own, or a backup's
            row["process"] = a["master"]["process"]
        if "stats" in a:
            s = a["stats"]
            row.update(fences=s["fences"], objects=s["objects"], inside=s["inside_pairs"], held=s["held_now"],
                       ring_version=a.get("ring_version"))
        rows.append(row)
    return {"ring_version": version, "fences": fences, "workers": rows}


def human(data: dict[str, Any]) -> str:
    lines = [f"worker ring version {data['ring_version']} ({data['fences']:,} live fences)",
             f"{'worker':<10}{'weight':>7}{'share':>8}{'fences':>9}{'objects':>9}{'inside':>9}{'held':>6}"]
    for r in data["workers"]:
        if r["up"]:
            tail = f"{r['fences']:>9,}{r['objects']:>9,}{r['inside']:>9,}{r['held']:>6,}"
        elif r.get("recovering"):  # answering while it replays its journal
            done = r["recovering"]
            tail = f"     recovering: {done['replayed']:,} of {done['records']:,} records"
        else:
            tail = "     down"
        ring = "" if r["on_ring"] else "  (not on the ring)"
        on = f"  on {r['process']}" if r.get("process") else ""
        lines.append(f"{r['worker']:<10}{r['weight']:>7}{r['share']:>8.1%}{tail}{ring}{on}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("action", choices=("list", "add", "remove", "hot", "lost"),
                        help="list the workers; add one (its share of the fences handed over, live); "
                             "remove one (its fences handed to the others, live); hot: give a fence "
                             "--masters N workers, its objects spread over them (live); lost: the "
                             "process running a worker is gone or hung: a backup takes the worker over")
    parser.add_argument("worker", nargs="*", help="the worker to add or remove (a name such as w2); "
                                                  "hot: the fence(s)")
    parser.add_argument("--masters", type=int, default=None,
                        help="hot: how many workers judge the fence, each for its share of the objects "
                             "(1: one worker again)")
    parser.add_argument("--weight", type=int, default=1,
                        help="add: the worker's weight on the ring (its share grows with it; default 1)")
    parser.add_argument("--json", action="store_true", help="list: print JSON")


def run(args: argparse.Namespace) -> int:
    def say(text: str) -> None:
        print(f"geofence worker: {text}", flush=True)

    try:
        if args.action == "list":
            data = asyncio.run(gather())
            print(json.dumps(data, indent=2) if args.json else human(data))
            return 0 if all(r["up"] for r in data["workers"]) else 1
        if not args.worker or (args.action != "hot" and len(args.worker) > 1):
            what = "fences' names" if args.action == "hot" else "worker's name (one)"
            print(f"geofence worker {args.action}: give the {what}", file=sys.stderr)
            return 2
        if (args.masters is None) == (args.action == "hot"):
            print(f"geofence worker {args.action}: --masters goes with hot, and only with it",
                  file=sys.stderr)
            return 2
        if args.action == "lost":  # the ring stays: another process runs the worker
            settings = live(Settings.from_env())
            print(asyncio.run(worker_ops.lost(settings, load_secrets(settings), args.worker[0], say)),
                  flush=True)
            return 0
        refused = overriding("GEOFENCE_WORKERS", "workers")
        if refused:
            print(f"geofence worker {args.action}: {refused}", file=sys.stderr)
            return 2
        settings = Settings.from_env()
        pw = load_secrets(settings)
        with Steps(f"worker {args.action} {' '.join(args.worker)}", f"worker {args.action}",
                   settings.progress_file, "geofence worker") as steps:
            if args.action == "add":
                outcome = asyncio.run(worker_ops.add(settings, pw, args.worker[0], args.weight, steps.say))
            elif args.action == "hot":
                outcome = asyncio.run(worker_ops.hot(settings, pw, args.worker, args.masters, steps.say))
            else:
                outcome = asyncio.run(worker_ops.remove(settings, pw, args.worker[0], steps.say))
    except (StackError, ValueError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return exit_codes.say(f"worker {args.action}", exc)
    print(outcome.line(), flush=True)
    return 0
