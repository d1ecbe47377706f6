"""Moving fences: what re-binding a fence that follows an object costs (fence/follow.py).

    .venv/bin/python -m bench.moving_fences [--fences 100] [--rounds 5] [--duration 20] [--seed 1]

The issue asks for "100 such fences each moving once per second". One run measures, side by
side, against the running stack (`geofence up`):

A. capacity, in this process (no follower): F fences (150 m circles around Vaduz, the benchmarks'
   tenant's `bench:bench-mv-NNN`, following its objects `bench:bench-mv-car-NNN`: bench/tenant.py)
   go in through a FenceManager (the fence-manager user,
   PostgreSQL); then R rounds of moving every fence by 20-50 m (`FenceManager.put` with an
   increasing follow_ts, create=False, as the follower does), first with at most 8 moves in
   flight (the follower's MOVE_CONCURRENCY), then one at a time. Figures: moves/s, latency
   per move (p50/p99), the ranges sent to x-geo per move (a binding diff, Change.sent_ranges)
   next to the whole covering's (Change.ranges), the time `applied()` needed afterwards (x-geo
   catching up), and the x-geo counters `rebinds` (a diff applied as a diff) and
   `rebinds_from_store` (a diff that did not fit: the bindings re-read from PostgreSQL).
B. sustained, end to end through the pipeline and the follower (the api process): each car
   publishes one position per second (AMQP to gf-ingress amq.topic, `positions.bench.<id>`, JSON,
   persistent, confirmed; the cars spread over the second), moving at 15 m/s along its own
   heading; x-ingress taps them to fence.follow, the follower moves the fences. After a warm-up
   in which every fence moved once (PostgreSQL fence.follow_ts), a window of D seconds: moves
   applied per second (the fences' version increments in PostgreSQL / window), the lag from a
   position's ts to the stored move standing on it (fence.updated_at - follow_ts of every
   version seen by a poll every 0.2 s, p50/p99; next to it the lag of each fence's first move
   of the warm-up, which the follower's 1 s interval never holds back, and the share of moves
   that skipped a position), how far x-geo is behind the store (an `applied()` barrier once a
   second), the api's counters (/health: follow_moves, follow_stale) and the CPU of the
   sidecars, RabbitMQ, PostgreSQL and the machine (/proc) over the window; then, publishing
   stopped, every fence must stand on its car's last position (follow_ts equal, within a
   deadline).

Target: F=100 fences moving once per second, i.e. F moves/s: the ratio is moves/s / F for A
(capacity: what one manager can do) and B (sustained: what the pipeline does). The fences are
removed at the end (also when a run fails). Exit 1 if a part failed or B's fences did not end
on their cars' last positions; the figures never fail it. Run one broker benchmark at a time
(the counters and CPU figures are the stack's, whoever else uses it).

The fleet (fences, cars) and what is read of the stack: bench/moving_fleet.py; here the two
parts and the report.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: again as a module of bench
    import cli  # type: ignore[import-not-found]  # bench/cli.py, in this file's own folder

    cli.run_as_module(__file__)

import argparse
import asyncio
import contextlib
import functools
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import numpy as np

from bench import broker_modes as bm
from bench import cli, report
from bench.moving_fleet import (
    APPLIED_TIMEOUT_S,
    CENTRE,
    OWNER,
    RADIUS_M,
    SPEED_M_S,
    TICKS_PER_S,
    Cars,
    Fleet,
    Stack,
    bounded,
    delta,
    geo_delta,
    live_rows,
    offset,
    remove_leftovers,
)
from bench.report import fmt, pct
from deploy.settings import Settings, load_connection_settings
from exchanges import routing_store
from fence.follow_shell import MOVE_CONCURRENCY
from fence.manager import Change, FenceManager

STEP_M = (20.0, 50.0)  # A: a move shifts a fence by this much
POLL_S = 0.2  # B: PostgreSQL sampling period (lags, warm-up, settling)
WARMUP_DEADLINE_S = 30.0
SETTLE_DEADLINE_S = 20.0
TICK_S = 0.5


# --------------------------------------------------------------------------- A: capacity


@dataclass
class PhaseA:
    label: str
    concurrency: int
    moves: int = 0
    wall_s: float = 0.0
    latency_ms: list[float] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    full: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    applied_s: float = 0.0  # after the last put: until every x-geo had applied everything
    rebinds: int = 0
    from_store: int = 0
    regions: set[str] = field(default_factory=set)

    @property
    def rate(self) -> float:
        return self.moves / self.wall_s if self.wall_s else 0.0


async def move_rounds(m: FenceManager, fleet: Fleet, rng: np.random.Generator, rounds: int, phase: PhaseA,
                      status: list[str]) -> None:
    n = len(fleet.ids)
    t0 = time.perf_counter()

    async def move(i: int, east: float, north: float, label: str) -> None:
        fleet.centre[i] = offset(*fleet.centre[i], east, north)
        spec = fleet.spec(i)
        t = time.perf_counter()
        try:
            c: Change = await m.put(spec, create=False, owner=OWNER, follow_ts=time.time())
        except Exception as exc:
            phase.errors.append(f"{fleet.ids[i]}: {type(exc).__name__}: {exc}")
            return
        phase.latency_ms.append((time.perf_counter() - t) * 1000.0)
        phase.sent.append(c.sent_ranges)
        phase.full.append(c.ranges)
        phase.regions.update(c.regions)
        phase.moves += 1
        el = time.perf_counter() - t0
        status[0] = (f"A {phase.label}: {label}, {phase.moves:,}/{rounds * n:,} moves, "
                     f"{phase.moves / el if el else 0:,.0f}/s")

    for r in range(rounds):
        steps = rng.uniform(*STEP_M, n)
        angles = rng.uniform(0, 2 * math.pi, n)
        label = f"round {r + 1}/{rounds}"
        await bounded(phase.concurrency, [
            functools.partial(move, i, float(steps[i] * math.cos(angles[i])),
                              float(steps[i] * math.sin(angles[i])), label) for i in range(n)])
    phase.wall_s = time.perf_counter() - t0


async def part_a(stack: Stack, m: FenceManager, fleet: Fleet, rng: np.random.Generator, rounds: int,
                 status: list[str]) -> tuple[list[PhaseA], dict[str, Any]]:
    n = len(fleet.ids)
    made = [0]
    t0 = time.perf_counter()

    def create(i: int) -> Callable[[], Any]:
        async def put() -> Change:
            c = await m.put(fleet.spec(i), create=True, owner=OWNER)
            made[0] += 1
            status[0] = f"A: fences in {made[0]:,}/{n:,}"
            return c
        return put

    created: list[Change] = await bounded(MOVE_CONCURRENCY, [create(i) for i in range(n)])
    await m.applied(timeout=APPLIED_TIMEOUT_S)
    info = {"create_s": time.perf_counter() - t0, "ranges": [c.ranges for c in created],
            "bits": sorted({c.bits for c in created}),
            "regions": sorted({r for c in created for r in c.regions})}
    phases = [PhaseA(f"concurrent ({MOVE_CONCURRENCY})", MOVE_CONCURRENCY), PhaseA("sequential", 1)]
    before = await stack.geo_counters()
    for phase in phases:
        await move_rounds(m, fleet, rng, rounds, phase, status)
        status[0] = f"A {phase.label}: waiting for x-geo to apply the moves"
        ta = time.perf_counter()
        await m.applied(timeout=APPLIED_TIMEOUT_S)
        phase.applied_s = time.perf_counter() - ta
        after = await stack.geo_counters()
        phase.rebinds = geo_delta(after, before, "rebinds")
        phase.from_store = geo_delta(after, before, "rebinds_from_store")
        before = after
    return phases, info


# --------------------------------------------------------------------------- B: end to end


@dataclass
class PartB:
    fences: int
    duration: float
    window_s: float = 0.0
    warmup_s: float = 0.0
    warmed: int = 0  # fences that moved during the warm-up
    first_lag_ms: list[float] = field(default_factory=list)  # their first move: never held back
    moves: int = 0  # version increments in the window
    per_fence: list[int] = field(default_factory=list)
    published: int = 0  # positions confirmed, whole run
    published_window: int = 0
    skipped_ticks: int = 0  # the publisher was late (this process starved): cars missed a second
    publish_errors: list[str] = field(default_factory=list)
    lag_ms: list[float] = field(default_factory=list)
    steps: list[float] = field(default_factory=list)  # follow_ts between a fence's consecutive moves
    settled: int = 0  # fences on their car's last position at the end
    settle_s: float = math.nan
    not_settled: list[str] = field(default_factory=list)
    api: dict[str, int] = field(default_factory=dict)  # /health deltas over the window
    api_total: dict[str, int] = field(default_factory=dict)  # ... over the whole of B
    cpu: dict[str, float] = field(default_factory=dict)  # % of one core over the window
    rebinds: int = 0
    from_store: int = 0
    applied_s: float = math.nan
    behind_s: list[float] = field(default_factory=list)  # applied() barriers during the window

    @property
    def rate(self) -> float:
        return self.moves / self.window_s if self.window_s else 0.0


async def sample_barriers(m: FenceManager, out: list[float], until: float) -> None:
    """How far x-geo is behind the store: the time an `applied()` barrier takes (queued behind
    every change sent before it), one after another, once a second at most."""
    while time.perf_counter() < until:
        t0 = time.perf_counter()
        await m.applied(timeout=APPLIED_TIMEOUT_S)
        out.append(time.perf_counter() - t0)
        await asyncio.sleep(max(0.0, min(1.0 - (time.perf_counter() - t0), until - time.perf_counter())))


async def part_b(stack: Stack, m: FenceManager, pg: asyncpg.Connection, fleet: Fleet,
                 rng: np.random.Generator, duration: float, status: list[str]) -> PartB:
    n = len(fleet.ids)
    out = PartB(n, duration)
    cars = Cars(stack, fleet, rng)
    health0, geo0 = await stack.health(), await stack.geo_counters()
    publisher = asyncio.create_task(cars.run())
    try:
        # warm-up: x-ingress taps the cars (it re-reads the followed set every 2 s) and every
        # fence has moved once onto a position of this part
        t0 = time.perf_counter()
        first: dict[str, float] = {}  # fence -> lag of its first move onto a position of this part
        while True:
            rows = await live_rows(pg, fleet.ids)
            for i, fid in enumerate(fleet.ids):
                r = rows.get(fid)
                if fid not in first and r is not None and r["follow_ts"] is not None \
                        and not math.isnan(cars.first_ts[i]) and r["follow_ts"] >= cars.first_ts[i]:
                    first[fid] = (r["updated"] - r["follow_ts"]) * 1000.0
            moved = len(first)
            el = time.perf_counter() - t0
            status[0] = f"B warm-up: {moved}/{n} fences moved once, {cars.confirmed:,} positions, {el:.0f} s"
            if moved == n or el > WARMUP_DEADLINE_S or publisher.done():
                break
            await asyncio.sleep(POLL_S)
        out.warmup_s, out.warmed = time.perf_counter() - t0, moved
        out.first_lag_ms = list(first.values())
        if publisher.done():
            publisher.result()  # the publisher failed: say why

        # the window
        geo1, health1 = await stack.geo_counters(), await stack.health()
        rows0 = await live_rows(pg, fleet.ids)
        cpu0, own0, pub0, w0 = stack.cpu_ticks(), time.process_time(), cars.confirmed, time.perf_counter()
        barriers = asyncio.create_task(sample_barriers(m, out.behind_s, w0 + duration))
        seen = {fid: r["version"] for fid, r in rows0.items()}
        seen_ts = {fid: r["follow_ts"] for fid, r in rows0.items()}
        while (el := time.perf_counter() - w0) < duration:
            await asyncio.sleep(min(POLL_S, max(0.0, duration - el)))
            rows = await live_rows(pg, fleet.ids)
            for fid, r in rows.items():
                if r["version"] != seen.get(fid) and r["follow_ts"] is not None:
                    seen[fid] = r["version"]
                    out.lag_ms.append((r["updated"] - r["follow_ts"]) * 1000.0)
                    if seen_ts.get(fid) is not None:
                        out.steps.append(r["follow_ts"] - seen_ts[fid])
                    seen_ts[fid] = r["follow_ts"]
            moves = sum(r["version"] - rows0[fid]["version"] for fid, r in rows.items() if fid in rows0)
            status[0] = (f"B window: {el:.0f}/{duration:g} s, {moves:,} moves "
                         f"({moves / el if el else 0:,.0f}/s), {cars.confirmed - pub0:,} positions")
        rows1, w1 = await live_rows(pg, fleet.ids), time.perf_counter()
        cpu1, own1 = stack.cpu_ticks(), time.process_time()
        out.window_s, out.published_window = w1 - w0, cars.confirmed - pub0
        health2 = await stack.health()
        await barriers  # the last one may end after the window; it was queued within it
        out.per_fence = [rows1[f]["version"] - rows0[f]["version"] for f in fleet.ids
                         if f in rows0 and f in rows1]
        out.moves = sum(out.per_fence)
        hz = os.sysconf("SC_CLK_TCK")
        out.cpu = {name: (cpu1[name] - cpu0[name]) / hz / out.window_s * 100.0
                   for name in cpu1 if name in cpu0}
        out.cpu["this bench"] = (own1 - own0) / out.window_s * 100.0
        out.api = {k: delta(health2, health1, k) for k in ("follow_moves", "follow_stale", "follow_refused",
                                                            "positions")}
    finally:
        cars.stop.set()
        await asyncio.gather(publisher, return_exceptions=True)
    out.published, out.publish_errors, out.skipped_ticks = cars.confirmed, cars.errors, cars.skipped_ticks
    if publisher.done() and not publisher.cancelled() and publisher.exception():
        raise publisher.exception()  # type: ignore[misc]

    # settling: every fence on its car's last position
    t0 = time.perf_counter()
    while True:
        rows = await live_rows(pg, fleet.ids)
        late = [fid for i, fid in enumerate(fleet.ids)
                if fid not in rows or rows[fid]["follow_ts"] is None
                or abs(rows[fid]["follow_ts"] - cars.last_ts[i]) > 1e-6]
        el = time.perf_counter() - t0
        status[0] = f"B settling: {n - len(late)}/{n} fences on their car's last position, {el:.1f} s"
        if not late or el > SETTLE_DEADLINE_S:
            break
        await asyncio.sleep(POLL_S)
    out.settled, out.not_settled = n - len(late), late
    out.settle_s = el if not late else math.nan
    ta = time.perf_counter()
    await m.applied(timeout=APPLIED_TIMEOUT_S)
    out.applied_s = time.perf_counter() - ta
    geo2, health3 = await stack.geo_counters(), await stack.health()
    out.rebinds = geo_delta(geo2, geo1, "rebinds")
    out.from_store = geo_delta(geo2, geo1, "rebinds_from_store")
    out.api_total = {k: delta(health3, health0, k)
                     for k in ("follow_moves", "follow_stale", "follow_refused")}
    out.api_total["rebinds_all_b"] = geo_delta(geo2, geo0, "rebinds")
    out.api_total["from_store_all_b"] = geo_delta(geo2, geo0, "rebinds_from_store")
    return out


# --------------------------------------------------------------------------- the report


def skipped(b: PartB) -> float:
    """The share of B's moves whose position came more than one position after the previous."""
    return float(np.mean(np.asarray(b.steps) > 1.5)) if b.steps else math.nan


def figures(fences: int, a: list[PhaseA], info: dict[str, Any], b: PartB | None, b_error: str) -> None:
    want = float(fences)  # F fences x 1 move/s
    cols = [f"A {p.label}" for p in a] + ["B end to end"]
    rows: list[list[str]] = []

    def row(name: str, values: list[str]) -> None:
        rows.append([name, *values])

    bv = b
    row("moves", [f"{p.moves:,}" for p in a] + [f"{bv.moves:,}" if bv else "-"])
    row("time (s)", [f"{p.wall_s:.2f}" for p in a] + [f"{bv.window_s:.1f}" if bv else "-"])
    row("moves/s", [f"{p.rate:,.1f}" for p in a] + [f"{bv.rate:,.1f}" if bv else "-"])
    row("per move p50 (ms)", [fmt(pct(p.latency_ms, 50)) for p in a] + ["-"])
    row("per move p99 (ms)", [fmt(pct(p.latency_ms, 99)) for p in a] + ["-"])
    row("lag ts->stored p50 (ms)", ["-"] * len(a) + [fmt(pct(bv.lag_ms, 50)) if bv else "-"])
    row("lag ts->stored p99 (ms)", ["-"] * len(a) + [fmt(pct(bv.lag_ms, 99)) if bv else "-"])
    row("  first move p50 (ms)", ["-"] * len(a) + [fmt(pct(bv.first_lag_ms, 50)) if bv else "-"])
    row("  first move p99 (ms)", ["-"] * len(a) + [fmt(pct(bv.first_lag_ms, 99)) if bv else "-"])
    row("moves skipping a position",
        ["-"] * len(a) + [f"{skipped(bv) * 100:.0f}%" if bv and bv.steps else "-"])
    row("ranges sent / move", [fmt(float(np.mean(p.sent)) if p.sent else math.nan) for p in a] + ["-"])
    row("covering ranges / move", [fmt(float(np.mean(p.full)) if p.full else math.nan) for p in a] + ["-"])
    row("sent / covering", [report.times(report.ratio(sum(p.sent), sum(p.full))) for p in a] + ["-"])
    row("x-geo behind p50 (ms)", ["-"] * len(a) + [fmt(pct(bv.behind_s, 50) * 1000) if bv else "-"])
    row("x-geo behind max (ms)",
        ["-"] * len(a) + [fmt(max(bv.behind_s) * 1000 if bv.behind_s else math.nan) if bv else "-"])
    row("applied() after (s)", [f"{p.applied_s:.2f}" for p in a] + [fmt(bv.applied_s, ".2f") if bv else "-"])
    row("x-geo rebinds", [f"{p.rebinds:,}" for p in a] + [f"{bv.rebinds:,}" if bv else "-"])
    row("x-geo rebinds_from_store", [f"{p.from_store:,}" for p in a] + [f"{bv.from_store:,}" if bv else "-"])
    row("errors", [f"{len(p.errors)}" for p in a]
        + [(f"{len(bv.publish_errors)}" if bv else "ERROR")])
    row("target (moves/s)", [f"{want:,.0f}"] * (len(a) + 1))
    row("ratio", [report.ratio_cell(report.ratio(p.rate, want)) for p in a]
        + [report.ratio_cell(report.ratio(bv.rate, want) if bv else None)])
    print(report.table(["", *cols], rows))

    ranges = info.get("ranges") or [0]
    print(f"  fences: {fences:,} circles of {RADIUS_M:g} m around {CENTRE}, coverings of "
          f"{min(ranges)}-{max(ranges)} ranges (mean {np.mean(ranges):.0f}) at {info.get('bits')} bits in "
          f"region(s) {', '.join(info.get('regions', [])) or '-'}; in and applied in "
          f"{info.get('create_s', 0):.1f} s")
    for p in a:
        expected = p.moves * max(1, len(p.regions))
        print(f"  A {p.label}: {p.moves:,} moves of {STEP_M[0]:g}-{STEP_M[1]:g} m; x-geo applied "
              f"{p.rebinds:,} rebinds as diffs (expected {expected:,}: one per move and region), "
              f"{p.from_store:,} from the store")
        for e in p.errors[:3]:
            print(f"    ! {e}")
    if b_error:
        print(f"  B: FAILED: {b_error}")
    if bv:
        pf = bv.per_fence or [0]
        print(f"  B: warm-up {bv.warmup_s:.1f} s ({bv.warmed}/{bv.fences} fences moved once); window "
              f"{bv.window_s:.1f} s: {bv.published_window:,} positions published "
              f"({bv.published_window / bv.window_s if bv.window_s else 0:,.1f}/s), {bv.moves:,} moves "
              f"(per fence {min(pf)}-{max(pf)}, mean {np.mean(pf):.1f}), {len(bv.lag_ms):,} lag samples"
              + (f"; the publisher was late and skipped {bv.skipped_ticks} of its {TICKS_PER_S}/s ticks"
                 if bv.skipped_ticks else ""))
        api, total = bv.api, bv.api_total
        print(f"  B: api /health over the window: follow_moves +{api.get('follow_moves', 0):,}, "
              f"follow_stale +{api.get('follow_stale', 0):,}, "
              f"follow_refused +{api.get('follow_refused', 0):,}, "
              f"positions +{api.get('positions', 0):,}; over all of B: follow_moves "
              f"+{total.get('follow_moves', 0):,}, follow_stale +{total.get('follow_stale', 0):,}")
        cores = os.cpu_count() or 1
        cpu = ", ".join(f"{k} {v:.0f}%" for k, v in sorted(bv.cpu.items(), key=lambda kv: -kv[1])
                        if k != "machine")
        machine = bv.cpu.get("machine", math.nan) / cores
        print(f"  B: CPU over the window (% of one core): {cpu or 'unknown'}; the machine "
              f"{fmt(machine, '.0f')}% busy ({cores} cores, whoever uses them)")
        print(f"  B: lag of each fence's first move (warm-up, never held by the follower's 1 s interval) "
              f"p50 {fmt(pct(bv.first_lag_ms, 50))} ms, p99 {fmt(pct(bv.first_lag_ms, 99))} ms; in the "
              f"window {skipped(bv) * 100 if bv.steps else math.nan:.0f}% of the moves skipped at least one "
              f"position (follow_ts step > 1.5 s; step p50 {fmt(pct(bv.steps, 50), '.2f')} s)")
        print(f"  B: x-geo over all of B: {total.get('rebinds_all_b', 0):,} rebinds, "
              f"{total.get('from_store_all_b', 0):,} from the store; applied() after {bv.applied_s:.2f} s")
        if bv.not_settled:
            print(f"  B: {len(bv.not_settled)} fences NOT on their car's last position after "
                  f"{SETTLE_DEADLINE_S:g} s: {', '.join(bv.not_settled[:10])}")
        else:
            print(f"  B: all {bv.fences} fences stood on their car's last position {bv.settle_s:.1f} s after "
                  f"the last publish")
        for e in bv.publish_errors[:3]:
            print(f"    ! publish: {e}")

    print()
    srows = [[f"A {p.label}", f"{fences:,}", f"{p.rate:,.1f}", f"{want:,.0f}",
              report.ratio_cell(report.ratio(p.rate, want)), fmt(pct(p.latency_ms, 99)), f"{p.from_store:,}"]
             for p in a]
    srows.append(["B end to end", f"{fences:,}", f"{bv.rate:,.1f}" if bv else "-", f"{want:,.0f}",
                  report.ratio_cell(report.ratio(bv.rate, want) if bv else None),
                  fmt(pct(bv.lag_ms, 99)) if bv else "-", f"{bv.from_store:,}" if bv else "-"])
    print(report.table(["part", "F", "moves/s", "target", "ratio", "p99 ms", "from store"], srows))

    parts = [f"A {p.label} {p.rate:,.0f} moves/s ({report.times(report.ratio(p.rate, want))})" for p in a]
    sent = sum(sum(p.sent) for p in a)
    full = sum(sum(p.full) for p in a)
    moves = sum(p.moves for p in a)
    diff = (f"{sent / moves:.0f} ranges sent per move for a covering of {full / moves:.0f} "
            f"({report.times(report.ratio(sent, full))}), {sum(p.from_store for p in a)} rebinds from store"
            if moves and full else "no moves")
    if bv:
        bpart = (f"B sustained {bv.rate:,.1f} moves/s ({report.times(report.ratio(bv.rate, want))}), lag p50 "
                 f"{fmt(pct(bv.lag_ms, 50), '.0f')} ms p99 {fmt(pct(bv.lag_ms, 99), '.0f')} ms, "
                 f"{bv.from_store} rebinds from store, api CPU {fmt(bv.cpu.get('api', math.nan), '.0f')}%, "
                 f"{bv.settled}/{bv.fences} on the last position")
    else:
        bpart = "B ERROR"
    print(report.summary([*parts, diff, bpart], lead=f"F={fences:,} target {want:,.0f} moves/s"))


# --------------------------------------------------------------------------- main


async def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    stack = Stack(settings, load_connection_settings(settings))
    rng = np.random.default_rng(args.seed)
    fleet = Fleet.make(args.fences, rng)
    status = ["connecting"]
    progress = report.Progress(f"moving F={args.fences:,}")
    ticker = asyncio.create_task(report.every(TICK_S, lambda: progress.show(status[0])))
    a: list[PhaseA] = []
    info: dict[str, Any] = {}
    b: PartB | None = None
    a_error = b_error = ""
    pg = await routing_store.connect(stack.dsn)
    try:
        async with stack.manager() as m:
            try:
                status[0] = "removing leftovers"
                left = await remove_leftovers(pg, m)
                if left:
                    progress.close()
                    print(f"  (removed {left} fences left by an earlier run)", flush=True)
                try:
                    a, info = await part_a(stack, m, fleet, rng, args.rounds, status)
                except Exception as exc:
                    a_error = report.error_text(exc)
                progress.close()
                for p in a:
                    print(f"   A {p.label}: {p.moves:,} moves in {p.wall_s:.2f} s = {p.rate:,.1f}/s, "
                          f"p50 {fmt(pct(p.latency_ms, 50))} ms, p99 {fmt(pct(p.latency_ms, 99))} ms, "
                          f"{p.rebinds} rebinds / {p.from_store} from store", flush=True)
                if not a_error:
                    try:
                        b = await part_b(stack, m, pg, fleet, rng, args.duration, status)
                    except Exception as exc:
                        b_error = report.error_text(exc)
                    progress.close()
                    if b:
                        print(f"   B end to end: {b.moves:,} moves in {b.window_s:.1f} s = {b.rate:,.1f}/s, "
                              f"lag p50 {fmt(pct(b.lag_ms, 50))} ms, p99 {fmt(pct(b.lag_ms, 99))} ms",
                              flush=True)
            finally:
                status[0] = "cleanup: removing the fences"
                await bm.remove_stored(m, fleet.ids, owner=OWNER)
                with contextlib.suppress(Exception):
                    await m.applied(timeout=APPLIED_TIMEOUT_S)
    finally:
        ticker.cancel()
        progress.close()
        await pg.close()
    print()
    if a_error:
        print(f"A FAILED: {a_error}")
        print(report.summary([f"F={args.fences:,} A ERROR ({a_error})"]))
        return 1
    figures(args.fences, a, info, b, b_error)
    failed = bool(b_error) or b is None or bool(b.not_settled) or any(p.errors for p in a)
    return 1 if failed else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fences", type=int, default=100, help="F: fences, each following its car (default 100)")
    p.add_argument("--rounds", type=int, default=5,
                   help="A: rounds of moving every fence, per concurrency (default 5)")
    p.add_argument("--duration", type=float, default=20.0,
                   help="B: the measured window, seconds (default 20)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    cli.require_positive(p, args, ("fences", "rounds", "duration"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"-- moving fences: F={args.fences:,} fences of {RADIUS_M:g} m following F cars; A: {args.rounds} "
          f"rounds per concurrency; B: {args.duration:g} s at 1 position/s per car, {SPEED_M_S:g} m/s; "
          f"seed {args.seed}", flush=True)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
