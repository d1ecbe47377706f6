"""The MQTT path with more x-ingress instances (issue 39), side by side in one run.

For each instance count asked (`--instances 1 2`: the default), the stack is brought to that
many x-ingress instances live (`geofence ingress add / remove`, deploy/ingress_ops.py: the
partitions spread over them) and `bench.e2e --mode mqtt` runs with the arguments after `--`
(the bare broker with the same publishers first, then the pipeline, events checked against
the reference). At the end the stack has one instance again, and a table and a SUMMARY line
give each count's updates/s and share of the bare broker of its own run.

    python -m bench.ingress_instances --instances 1 2 -- --fences 1000 --objects 10000 \\
        --updates 40000 --clients 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import sys
from dataclasses import dataclass

from bench import e2e
from deploy import ingress_ops
from deploy.region_ops import live
from deploy.settings import Settings, load_secrets


@dataclass
class Row:
    instances: int
    bare: float
    pipeline: float
    events_ok: bool


def _say(line: str) -> None:
    print(f"  ingress: {line}", flush=True)


async def scale_to(settings: Settings, n: int) -> None:
    pw = load_secrets(settings)
    while 1 + len(live(settings).ingress) < n:
        print(f"  {(await ingress_ops.add(settings, pw, _say)).line()}", flush=True)
    while 1 + len(live(settings).ingress) > n:
        last = live(settings).ingress[-1]
        print(f"  {(await ingress_ops.remove(settings, pw, f'x-ingress-{last}', _say)).line()}", flush=True)


def run_once(e2e_args: list[str]) -> tuple[float, float, bool]:
    """bench.e2e's MQTT mode, its output shown and its outcomes read back."""
    out = io.StringIO()

    class Tee(io.TextIOBase):
        def write(self, s: str) -> int:
            sys.__stdout__.write(s)
            out.write(s)
            return len(s)

    with contextlib.redirect_stdout(Tee()):
        rc = e2e.main(["--mode", "mqtt", *e2e_args])
    summary = next((line for line in out.getvalue().splitlines() if line.startswith("SUMMARY:")), "")
    if rc != 0 or not summary:
        raise SystemExit(f"bench.e2e failed (rc {rc})")
    # SUMMARY: mqtt bare F=0 11,328 updates/s; mqtt F=1,000 6,194 updates/s (...); events match ...
    parts = summary.split(";")
    bare = float(parts[0].split()[-2].replace(",", ""))
    pipeline = float(parts[1].split("updates/s")[0].split()[-1].replace(",", ""))
    return bare, pipeline, "events match the reference in every run" in summary


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, nargs="+", default=[1, 2],
                   help="x-ingress instance counts, run in this order (default 1 2)")
    args = p.parse_args(argv[:split])
    e2e_args = argv[split + 1:]
    settings = Settings.from_env()
    rows: list[Row] = []
    try:
        for n in args.instances:
            print(f"-- {n} x-ingress instance(s)", flush=True)
            asyncio.run(scale_to(settings, n))
            bare, pipeline, ok = run_once(e2e_args)
            rows.append(Row(n, bare, pipeline, ok))
    finally:
        asyncio.run(scale_to(settings, 1))
    print(f"\n{'instances':>9}  {'bare broker':>12}  {'pipeline':>10}  {'share':>6}  events ok")
    for r in rows:
        print(f"{r.instances:>9}  {r.bare:>10,.0f}/s  {r.pipeline:>8,.0f}/s  {r.pipeline / r.bare:>6.0%}  "
              f"{'yes' if r.events_ok else 'NO'}")
    ok = all(r.events_ok for r in rows)
    print("SUMMARY: MQTT path by x-ingress instances: " + "; ".join(
        f"{r.instances}: {r.pipeline:,.0f} updates/s ({r.pipeline / r.bare:.0%} of the bare broker's "
        f"{r.bare:,.0f}/s)" for r in rows) + f"; events match the reference: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
