"""The live map under load (issue 22): the amqp benchmark at its max rate with no map open and
with `--maps` maps open (websocket clients in a process of their own, reading every frame as a
browser would), in alternating order, `--rounds` times. Prints per run the pipeline's updates/s,
the API's CPU (the map feed lives there) and x-ingress's (it takes the sample), and per map the
messages and bytes a second it got; then the medians side by side and the drop.

    python -m bench.map_load [--maps 10] [--rounds 3] [--fences 1000] [--objects 10000]
        [--updates 300000] [--batch 1000]

Target: with 10 maps open, the pipeline's throughput drops by less than 5%; the messages per
map per second stay capped (2: fence/map_view.FRAME_EVERY_S).

Trade-off: runs take turns on one machine whose two cores are shared with everything else, so
each figure is a median over rounds, and the order alternates (off, on / on, off) so that a
drift of the machine over the rounds does not land on one side. Before a run with no map, the
API's tap queues must be gone (the feed keeps them `LINGER_S` after the last map closed), so
that run pays nothing for the maps.

The maps are an operator's (every tenant's fences, objects and events, as /map showed them all
before tenants): a Firebase user with the operator claim is made in the stack's Auth emulator
for the run (deleted at the end), each map signs in with its ID token (fence/page_data.py), and
the workload is the benchmarks' tenant's (bench/broker_modes.py, bench/tenant.py).

    python -m bench.map_load --serve-maps N --api URL   (the maps' process, used by the above;
    the first line of its stdin is the ID token the maps sign in with)
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: again as a module of bench
    import cli  # type: ignore[import-not-found]  # bench/cli.py, in this file's own folder

    cli.run_as_module(__file__)

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from bench import capacity, report
from deploy import firebase_emulator as fe
from deploy.rabbitmq.apply import management
from deploy.settings import ConnectionSettings, Settings, load_connection_settings, load_secrets
from exchanges import topology as t
from fence.map_view import FRAME_EVERY_S
from fence.service import OPERATOR_CLAIM

TARGET_DROP = 0.05


# --------------------------------------------------------------------------- the maps' process


@dataclass
class MapStats:
    messages: int = 0
    snapshots: int = 0
    bytes: int = 0
    first_at: float | None = None
    per_second: dict[int, int] = field(default_factory=dict)


def serve_maps(n: int, api: str) -> int:
    """N websocket clients, signed in with the token of stdin's first line, until stdin closes;
    prints one JSON line of their figures then. They count what they get and do not parse it:
    the browsers are on other machines, and their work is not the server's (this process's own
    CPU is printed beside)."""
    import websocket  # websocket-client: only this process needs it

    token = sys.stdin.readline().strip()
    url = api.replace("http://", "ws://") + "/map/ws"
    stats = [MapStats() for _ in range(n)]
    socks = [websocket.create_connection(url, timeout=30) for _ in range(n)]
    for ws in socks:  # the sign-in: an operator's map, of every tenant
        ws.send(json.dumps({"token": token, "tenant": None}))
    stop = threading.Event()

    def read(ws: Any, s: MapStats) -> None:
        while not stop.is_set():
            try:
                data = ws.recv()
            except Exception:  # closed at the end
                return
            if not data:
                return
            now = time.monotonic()
            s.first_at = s.first_at or now
            s.messages += 1
            s.bytes += len(data)
            s.snapshots += b'"type":"snapshot"' in data[:40]
            s.per_second[int(now)] = s.per_second.get(int(now), 0) + 1

    threads = [threading.Thread(target=read, args=(w, s), daemon=True)
               for w, s in zip(socks, stats, strict=True)]
    for th in threads:
        th.start()
    while any(s.first_at is None for s in stats):
        if any(s.first_at is None and not th.is_alive() for s, th in zip(stats, threads, strict=True)):
            print("a map's socket closed before its first frame: its sign-in refused (see the api's log)",
                  flush=True)
            return 1
        time.sleep(0.05)
    print("ready", flush=True)
    started = time.monotonic()
    sys.stdin.read()  # until the parent closes it
    took = time.monotonic() - started
    stop.set()
    for w in socks:
        w.close()
    cpu = time.process_time()
    out = [{"messages": s.messages, "snapshots": s.snapshots, "bytes": s.bytes,
            "max_per_s": max((v for k, v in s.per_second.items() if k > int(started)), default=0)}
           for s in stats]
    print(json.dumps({"seconds": took, "cpu_s": cpu, "maps": out}), flush=True)
    return 0


@dataclass(frozen=True)
class Operator:
    """A Firebase user of the Auth emulator with the operator claim (email, password)."""

    conn: ConnectionSettings
    uid: str
    email: str
    password: str

    def where(self) -> tuple[str, int, str]:
        host, port = self.conn["firebase"]["auth_emulator_host"].rsplit(":", 1)
        return host, int(port), self.conn["firebase"]["project"]

    def token(self) -> str:
        """A fresh ID token (they last an hour: one per map run)."""
        host, port, project = self.where()
        return fe.sign_in(host, port, project, self.email, self.password)


@contextlib.contextmanager
def operator(conn: ConnectionSettings) -> Iterator[Operator]:
    """An operator made in the stack's Auth emulator for the run, deleted after it."""
    host, port = conn["firebase"]["auth_emulator_host"].rsplit(":", 1)
    project = conn["firebase"]["project"]
    email, password = f"bench-map-{uuid.uuid4().hex[:10]}@example.org", uuid.uuid4().hex
    uid, _ = fe.sign_up(host, int(port), project, email, password)
    try:
        fe.set_claims(host, int(port), project, uid, {OPERATOR_CLAIM: True})
        yield Operator(conn, uid, email, password)
    finally:
        with contextlib.suppress(Exception):
            fe.delete_user(host, int(port), project, uid)


class Maps:
    """The maps' process: open, signed in with `token`, ready, then closed with its figures."""

    def __init__(self, n: int, api: str, token: str) -> None:
        argv = [sys.executable, "-m", "bench.map_load", "--serve-maps", str(n), "--api", api]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.proc.stdin.write(token + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"the maps did not open: {line!r}")

    def close(self) -> dict[str, Any]:
        out, _ = self.proc.communicate("", timeout=60)
        figures: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return figures


# --------------------------------------------------------------------------- the runs


def taps_gone(deadline: float = 90.0) -> None:
    """Wait until no API map-feed queue is left (the feed closes them LINGER_S after the last map)."""
    settings = Settings.from_env()
    admin = management(settings, load_secrets(settings))
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        names = [q["name"] for v in (t.INGRESS_VHOST, t.FENCES_VHOST)
                 for q in admin.get(f"api/queues/{quote(v, safe='')}") or []]
        if not any(n.startswith(t.MAP_TAP_QUEUE_PREFIX) for n in names):
            return
        time.sleep(1.0)
    raise RuntimeError("the map feed's queues are still there")


@dataclass
class Run:
    maps: int
    updates_per_s: float
    api_cpu: float  # cores (CPU seconds per second of stream)
    ingress_cpu: float
    fence_cpu: float  # the x-fence workers (they take the event samples)
    broker_cpu: float
    ok: bool
    map_figures: dict[str, Any] | None = None


def one_run(args: argparse.Namespace, maps: int, api: str, op: Operator) -> Run:
    if maps == 0:
        taps_gone()
    opened = Maps(maps, api, op.token()) if maps else None
    try:
        out, us = capacity.measure(args.fences, args.objects, args.updates, args.batch, args.seed)
    finally:
        figures = opened.close() if opened else None
    rate = out.updates_per_s or 0.0
    if out.error or out.diff:
        report.warn(f"{maps} map(s): " + (out.error or "; ".join(out.diff[:6])))
    cores = {role: v * rate / 1e6 for role, v in us.items()}
    return Run(maps, rate, cores.get("api", 0.0), cores.get("x-ingress", 0.0),
               cores.get("x-fence (all workers)", 0.0), cores.get("RabbitMQ", 0.0),
               not out.error and not out.diff, figures)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.map_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--maps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--fences", type=int, default=1_000)
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--updates", type=int, default=300_000)
    p.add_argument("--batch", type=int, default=1_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--serve-maps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--api", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_maps:
        return serve_maps(args.serve_maps, args.api)
    conn = load_connection_settings(Settings.from_env())
    api = conn["api"]
    if api is None:
        p.error("the local stack runs no API (`geofence up` starts it)")
    runs: list[Run] = []
    with operator(conn) as op:
        for r in range(args.rounds):
            for maps in ((0, args.maps) if r % 2 == 0 else (args.maps, 0)):
                print(f"round {r + 1}/{args.rounds}: {maps} map(s) open", flush=True)
                runs.append(one_run(args, maps, api, op))
    rows = []
    for run in runs:
        m = run.map_figures
        per_map = ""
        if m:
            secs = m["seconds"] or 1.0
            msgs = [x["messages"] / secs for x in m["maps"]]
            per_map = (f"{min(msgs):.2f}-{max(msgs):.2f} msg/s (max in a second "
                       f"{max(x['max_per_s'] for x in m['maps'])}), "
                       f"{statistics.mean(x['bytes'] for x in m['maps']) / secs / 1e3:,.0f} kB/s, "
                       f"{sum(x['snapshots'] for x in m['maps'])} snapshots; the maps' process "
                       f"{m['cpu_s'] / secs * 100:.1f}% CPU")
        rows.append([str(run.maps), f"{run.updates_per_s:,.0f}", f"{run.api_cpu * 100:.1f}%",
                     f"{run.ingress_cpu * 100:.1f}%", f"{run.fence_cpu * 100:.1f}%",
                     f"{run.broker_cpu * 100:.1f}%", "yes" if run.ok else "NO", per_map])
    print()
    print("CPU: % of one core while the stream ran (from /proc, bench/capacity.py)")
    print(report.table(["maps", "updates/s", "API", "x-ingress", "x-fence", "RabbitMQ", "events exact",
                        "per map"], rows))
    off = [x.updates_per_s for x in runs if x.maps == 0]
    on = [x.updates_per_s for x in runs if x.maps]
    off_m, on_m = statistics.median(off), statistics.median(on)
    drop = 1 - on_m / off_m if off_m else 1.0
    api_on = statistics.median(x.api_cpu for x in runs if x.maps)
    api_off = statistics.median(x.api_cpu for x in runs if x.maps == 0)
    cap = max((x["max_per_s"] for r in runs if r.map_figures for x in r.map_figures["maps"]), default=0)
    ok = drop < TARGET_DROP and all(x.ok for x in runs) and cap <= round(1 / FRAME_EVERY_S) + 1
    print(report.summary([
        f"median updates/s {off_m:,.0f} with no map, {on_m:,.0f} with {args.maps} maps "
        f"(ratio {on_m / off_m if off_m else 0:.3f}, drop {drop:.1%}; target < {TARGET_DROP:.0%})",
        f"API CPU {api_off * 100:.1f}% -> {api_on * 100:.1f}% of a core for {args.maps} maps",
        f"at most {cap} messages in a second to one map (cap {1 / FRAME_EVERY_S:.0f}/s)",
        f"runs off {', '.join(f'{x:,.0f}' for x in off)}; on {', '.join(f'{x:,.0f}' for x in on)}"],
        "OK" if ok else "BELOW TARGET", "map load"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
