"""End-to-end benchmark of the fleet-over-fences workload (see bench/workload.py).

    .venv/bin/python -m bench.e2e --mode core [--fences 1000,10000] [--objects 10000]
        [--updates 200000] [--batch 10000] [--seed 1] [--profile]
    .venv/bin/python -m bench.e2e --mode amqp [--fences 1000,10000] [--objects 10000]
        [--updates 100000] [--batch 1000]
    .venv/bin/python -m bench.e2e --mode mqtt [--fences 100] [--objects 1000] [--updates 20000]
        [--clients 2]
    .venv/bin/python -m bench.e2e --mode half [--fences 1000] [--objects 10000]
        [--updates 100000] [--batch 1000] [--rate UPDATES_PER_S]
    .venv/bin/python -m bench.e2e --mode durability [--fences 1000] [--updates 100000]
    .venv/bin/python -m bench.e2e --mode all     # core, amqp, mqtt, half, each with its defaults

Modes (`MODES`; the defaults in brackets are per mode, an option given applies to every mode
run, so `--mode all --updates 20000` runs them all at U=20,000):
- core: the routing cores in one process, no broker (x-ingress -> x-geo per region -> x-fence
  per worker): the ceiling of the platform. Target 500,000 updates/s (the issue's figure, at
  F=1,000).
- amqp: gateway batches (msgpack, `--batch` positions each, 16 in flight with confirms) into
  the running stack (`geofence up`) through a gateway user of the benchmarks' tenant made for
  the run, events read back from `fence.event-batches` (bench/broker_modes.py, bench/tenant.py).
  Target 50,000 updates/s at F=1,000, 40,000 above.
- mqtt: one MQTT message per update (QoS 1, `--clients` publishing processes). Target 10,000
  updates/s; ~1-2k/s today, hence the small defaults.
- durability: the amqp run with the production setting (persistent messages, publisher
  confirms on every hop, the x-fence journal synced per batch) and the same run with
  GEOFENCE_PERSISTENCE=off (transient messages, no confirms, no journal; the sidecars are
  restarted for it, and again for production after), side by side, and the journal's cost
  from the workers' counters. Target: production >= 0.70 x the fast setting.
- half: latency at half the max rate: an amqp run as fast as possible (or `--rate`, taken as
  the max rate), then the same workload paced at half that rate; reports the paced run's
  latency. Target p99 <= 50 ms. In `--mode all` the amqp run of the same sizes is the max.

Broker modes put the fences through the production path (fence.manager) with ids unique to the
run, wait until the pipeline's queues are empty (`--no-idle-wait`: don't), and after the run
park its objects outside the box (`--no-park`: don't; see bench/broker_modes.py) and remove
the fences; updates/s is the updates over first publish -> last expected event, latency is per
event from the publish of the update that caused it to the event's receipt, "drain wait" the
time the pipeline needed to become idle first. Every run prints updates/s, events/s and where
the time went, then checks its events against the shapely STRtree reference on the same stream
(identical multisets). The figures go side by side, then a summary table (ratio = figure /
target, >= 1 meets it; for half, 50 ms / p99) and one SUMMARY line. Exit 1 if any run's events
differ from the reference or a run failed; the figures never fail it. Figures, not tests: the
machine is shared, run twice before believing a difference. Run one broker benchmark at a
time.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: again as a module of bench
    import cli  # type: ignore[import-not-found]  # bench/cli.py, in this file's own folder

    cli.run_as_module(__file__)

import argparse
import asyncio
import cProfile
import io
import json
import math
import os
import pstats
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bench import cli, report
from bench import tenant as tn
from bench import workload as wl

ALL = ("core", "amqp", "mqtt", "half")


@dataclass(frozen=True)
class Defaults:
    fences: tuple[int, ...]
    objects: int
    updates: int
    batch: int  # updates per intake batch (core) or gateway message (amqp, half); unused by mqtt


DEFAULTS = {
    "core": Defaults((1_000, 10_000), 10_000, 200_000, 10_000),
    "amqp": Defaults((1_000, 10_000), 10_000, 100_000, 1_000),  # 1,000 positions ~ 60 KiB < 256 KiB
    "mqtt": Defaults((100,), 1_000, 20_000, 1),
    "half": Defaults((1_000,), 10_000, 100_000, 1_000),
    "durability": Defaults((1_000,), 10_000, 100_000, 1_000),
}
DURABLE_MIN_RATIO = 0.70  # the production setting within 30% of the fast one
HALF_P99_MS = 50.0


MQTT_OF_BARE = 0.8  # issue 39: the MQTT path at >= 80% of the bare broker's, same publishers


def rate_target(mode: str, fences: int) -> float | None:
    """updates/s the issue asks for."""
    if mode == "core":
        return 500_000.0  # the figure at F=1,000
    if mode == "amqp":
        return 50_000.0 if fences <= 1_000 else 40_000.0
    if mode == "mqtt":
        return 10_000.0
    return None


# --------------------------------------------------------------------------- one run


@dataclass
class Outcome:
    """A run of any mode, as the report shows it."""

    mode: str
    fences: int
    objects: int
    updates: int
    batch: int
    updates_per_s: float = 0.0
    events: list[wl.EventTuple] = field(default_factory=list)
    diff: list[str] = field(default_factory=list)  # wl.compare against the reference; [] = same
    figures: dict[str, str] = field(default_factory=dict)  # row -> value, in order
    p50: float = math.nan
    p95: float = math.nan
    p99: float = math.nan
    rate: float | None = None  # updates/s asked for (half's paced run)
    error: str = ""
    notes: list[str] = field(default_factory=list)
    profile: str = ""
    fast_rate: float = 0.0  # durable: the same run's rate with persistence off
    bare_rate: float = 0.0  # mqtt: the bare broker's, same publishers, same run (bench/mqtt_baseline.py)

    @property
    def label(self) -> str:
        return f"{self.mode} F={self.fences:,}"

    @property
    def ok(self) -> bool:
        return not self.diff and not self.error

    def target(self) -> tuple[str, float | None]:
        """(what is asked, ratio: >= 1 meets it)."""
        if self.mode == "durable":
            if not self.fast_rate or not self.updates_per_s:
                return f">={DURABLE_MIN_RATIO:.2f}x fast", None
            return (f">={DURABLE_MIN_RATIO:.2f}x {self.fast_rate:,.0f}/s",
                    report.ratio(self.updates_per_s, DURABLE_MIN_RATIO * self.fast_rate))
        if self.mode == "mqtt" and self.bare_rate:
            share = (report.ratio(self.updates_per_s, MQTT_OF_BARE * self.bare_rate)
                     if self.updates_per_s else None)
            return f">={MQTT_OF_BARE:.0%} of {self.bare_rate:,.0f}/s", share
        if self.mode == "half":
            return f"p99<={HALF_P99_MS:g}ms", report.ratio(self.p99, HALF_P99_MS, lower_is_better=True)
        want = rate_target(self.mode, self.fences)
        if want is None:
            return "-", None
        return f"{want:,.0f}/s", (report.ratio(self.updates_per_s, want) if self.updates_per_s else None)


@dataclass
class Workloads:
    """Fences, streams and references, made once per size."""

    seed: int
    fences: dict[int, list[wl.Fence]] = field(default_factory=dict)
    streams: dict[tuple[int, int], wl.Stream] = field(default_factory=dict)
    refs: dict[tuple[int, int, int], tuple[list[wl.EventTuple], float]] = field(default_factory=dict)

    def fence_set(self, f: int) -> list[wl.Fence]:
        if f not in self.fences:
            self.fences[f] = wl.make_fences(f, self.seed)
        return self.fences[f]

    def stream(self, n: int, u: int) -> wl.Stream:
        if (n, u) not in self.streams:
            self.streams[(n, u)] = wl.random_walk(n, u, self.seed)
        return self.streams[(n, u)]

    def reference(self, f: int, n: int, u: int) -> tuple[list[wl.EventTuple], float]:
        """The shapely events and the seconds they took."""
        if (f, n, u) not in self.refs:
            t = time.perf_counter()
            events = wl.reference_events(self.fence_set(f), self.stream(n, u))
            self.refs[(f, n, u)] = (events, time.perf_counter() - t)
        return self.refs[(f, n, u)]


@dataclass(frozen=True)
class Sizes:
    fences: int
    objects: int
    updates: int
    batch: int


def run_core(args: argparse.Namespace, w: Workloads, z: Sizes) -> Outcome:
    """x-ingress -> x-geo per region -> x-fence per worker, in this process."""
    fences, stream = w.fence_set(z.fences), w.stream(z.objects, z.updates)
    t = time.perf_counter()
    pipe = wl.CorePipeline()
    pipe.define(fences, max_ranges=args.max_ranges, cells_per_radius=args.cells_per_radius)
    batches = [c.batch() for c in stream.chunks(z.batch)]  # the source is not measured
    setup_s = time.perf_counter() - t

    progress = report.Progress(f"core F={len(fences):,}", len(stream))
    received: list[wl.EventTuple] = []
    profiler = cProfile.Profile() if args.profile else None
    done, steady_s, steady_updates = 0, 0.0, 0
    t, cpu = time.perf_counter(), time.process_time()
    if profiler:
        profiler.enable()
    for b in batches:
        tb = time.perf_counter()
        # the receiver keeps what the check needs; the Event objects go, as after a publish
        received += wl.as_tuples(pipe.feed(b))
        if done >= len(stream.object_ids):
            steady_s += time.perf_counter() - tb
            steady_updates += len(b)
        done += len(b)
        progress.update(done)
    if profiler:
        profiler.disable()
    stream_s, cpu_s = time.perf_counter() - t, time.process_time() - cpu
    progress.close()

    reference, ref_s = w.reference(z.fences, z.objects, z.updates)
    times = pipe.times
    n = max(len(stream), 1)
    out = Outcome("core", z.fences, z.objects, z.updates, z.batch, events=received,
                  updates_per_s=len(stream) / stream_s if stream_s else 0.0,
                  diff=wl.compare(received, reference))
    out.figures = {
        "setup (s)": f"{setup_s:.1f}",
        "stream (s)": f"{stream_s:.2f}",
        "  cpu (s)": f"{cpu_s:.2f}",
        "updates/s": f"{out.updates_per_s:,.0f}",
        "  after round 1": f"{steady_updates / steady_s:,.0f}" if steady_s else "-",
        "events": f"{len(received):,}",
        "events/s": f"{len(received) / stream_s if stream_s else 0.0:,.0f}",
        "ingress (us/update)": f"{times.ingress / n * 1e6:.2f}",
        "geo (us/update)": f"{times.geo / n * 1e6:.2f}",
        "fence (us/update)": f"{times.fence / n * 1e6:.2f}",
        "reference (s)": f"{ref_s:.1f}",
    }
    workers = ", ".join(f"{w} {s / n * 1e6:.2f}" for w, s in times.per_worker.items())
    out.notes = [f"x-fence per worker (us/update): {workers}",
                 f"inside pairs at the end: {pipe.inside_pairs():,}",
                 f"regions {list(pipe.worldmap.regions)}, workers {list(pipe.fence)}, batch {z.batch:,}"]
    out.profile = top_functions(profiler) if profiler else ""
    return out


def run_broker(args: argparse.Namespace, w: Workloads, z: Sizes, intake: str, label: str,
               rate: float | None = None,
               progress_hook: Callable[[str, int, int], None] | None = None) -> Outcome:
    """One broker_modes.run ("amqp" or "mqtt") against the running stack, shown as `label`;
    `progress_hook` (phase, done, total) also hears where the run is (bench/capacity.py)."""
    from bench import broker_modes as bm  # the stack's clients (aio_pika, paho), only when asked for

    fences, stream = w.fence_set(z.fences), w.stream(z.objects, z.updates)
    reference, ref_s = w.reference(z.fences, z.objects, z.updates)
    out = Outcome(label, z.fences, z.objects, z.updates, z.batch if intake == "amqp" else 1, rate=rate)
    progress = report.Progress(f"{out.label}" + (f" at {rate:,.0f}/s" if rate else ""))
    try:
        def tell(phase: str, done: int, total: int) -> None:
            progress.phase_update(phase, done, total)
            if progress_hook is not None:
                progress_hook(phase, done, total)

        r = asyncio.run(bm.run(intake, fences, stream, reference, z.batch, rate, clients=args.clients,
                               progress=tell, idle=not args.no_idle_wait,
                               parking=not args.no_park, paho=getattr(args, "paho", False)))
    except Exception as exc:  # a sidecar restarted, the stack is down...: the other runs go on
        progress.close()
        out.error = report.error_text(exc)
        out.figures = {"reference (s)": f"{ref_s:.1f}"}
        return out
    progress.close()
    out.updates_per_s, out.events = r.updates_per_s, r.events
    out.diff = wl.compare(r.events, r.reference)
    out.p50, out.p95, out.p99 = r.pct(50), r.pct(95), r.pct(99)
    out.figures = {
        "rate asked (/s)": f"{rate:,.0f}" if rate else "max",
        "setup (s)": f"{r.setup_s:.1f}",
        "  drain wait (s)": f"{r.idle_wait_s:.1f}",
        "stream (s)": f"{r.total_s:.2f}",
        "  publish (s)": f"{r.publish_s:.2f}",
        "updates/s": f"{r.updates_per_s:,.0f}",
        "events": f"{len(r.events):,}",
        "  raw duplicates": f"{r.duplicates:,}",
        "events/s": f"{len(r.events) / r.total_s if r.total_s else 0.0:,.0f}",
        "latency p50 (ms)": f"{out.p50:.1f}",
        "latency p95 (ms)": f"{out.p95:.1f}",
        "latency p99 (ms)": f"{out.p99:.1f}",
        "  max (ms)": f"{float(r.latency_ms.max()):.1f}" if r.latency_ms.size else "-",
        "reference (s)": f"{ref_s:.1f}",
    }
    what = (f"gateway batches of {z.batch:,}" if intake == "amqp" else
            f"one message per update, {args.clients} {publisher_kind(args)} clients")
    backlog = "unknown" if r.backlog < 0 else f"{r.backlog:,} messages at most"
    out.notes = [f"{intake}: {what}; {r.latency_ms.size:,} latencies; fences in and applied "
                 f"{r.setup_s:.1f} s (production path); then {r.idle_wait_s:.1f} s until the pipeline "
                 f"was idle (backlog {backlog}); {r.parked:,} parking updates after; "
                 f"{len(r.events):,} distinct events (by event_id) checked, {r.duplicates:,} raw "
                 "duplicates dropped"]
    return out


def publisher_kind(args: argparse.Namespace) -> str:
    return "paho" if getattr(args, "paho", False) else "lean"


def sizes(args: argparse.Namespace, mode: str) -> list[Sizes]:
    d = DEFAULTS[mode]
    counts = args.fence_counts or list(d.fences)
    return [Sizes(f, args.objects or d.objects, args.updates or d.updates, args.batch or d.batch)
            for f in counts]


def mode_core(args: argparse.Namespace, w: Workloads, z: Sizes, ctx: dict[Sizes, float]) -> list[Outcome]:
    return [run_core(args, w, z)]


def mode_amqp(args: argparse.Namespace, w: Workloads, z: Sizes, ctx: dict[Sizes, float]) -> list[Outcome]:
    out = run_broker(args, w, z, "amqp", "amqp")
    if out.ok:
        ctx[z] = out.updates_per_s  # the max rate, for half
    return [out]


def mode_mqtt(args: argparse.Namespace, w: Workloads, z: Sizes, ctx: dict[Sizes, float]) -> list[Outcome]:
    """The bare broker with the same publishers first (bench/mqtt_baseline.py), then the
    pipeline; the pipeline's target is a share of the bare broker's rate of this run."""
    bare = run_bare_mqtt(args, w, z)
    out = run_broker(args, w, z, "mqtt", "mqtt")
    out.bare_rate = bare.updates_per_s if bare.ok else 0.0
    if out.bare_rate and out.updates_per_s:
        out.notes.append(f"the pipeline took {out.updates_per_s / out.bare_rate:.0%} of the bare broker's "
                         f"{out.bare_rate:,.0f} updates/s (same publishers, same run)")
    return [bare, out]


def run_bare_mqtt(args: argparse.Namespace, w: Workloads, z: Sizes) -> Outcome:
    from bench import mqtt_baseline  # the stack's clients, only when asked for

    out = Outcome("mqtt bare", 0, z.objects, z.updates, 1)
    progress = report.Progress(f"mqtt bare broker, N={z.objects:,}")
    try:
        r = asyncio.run(mqtt_baseline.run(w.stream(z.objects, z.updates), args.clients, publisher_kind(args)))
        out.updates_per_s = r.updates_per_s
        out.error = "" if r.received == r.updates else f"the consumer got {r.received:,} of {r.updates:,}"
        out.figures = {"stream (s)": f"{r.seconds:.2f}", "updates/s": f"{r.updates_per_s:,.0f}"}
        out.notes = [f"mqtt bare: {args.clients} {publisher_kind(args)} clients, {mqtt_baseline.PATH}"]
    except Exception as exc:
        out.error = report.error_text(exc)
    finally:
        progress.close()
    return out


def mode_half(args: argparse.Namespace, w: Workloads, z: Sizes, ctx: dict[Sizes, float]) -> list[Outcome]:
    """The max rate (--rate, an amqp run of these sizes earlier, or one now), then half of it."""
    runs: list[Outcome] = []
    top = args.rate or ctx.get(z)
    if not top:
        runs += mode_amqp(args, w, z, ctx)
        top = ctx.get(z)
    if not top:
        failed = Outcome("half", z.fences, z.objects, z.updates, z.batch,
                         error="no max rate: the amqp run as fast as possible failed")
        return [*runs, failed]
    half = run_broker(args, w, z, "amqp", "half", rate=top / 2.0)
    half.notes.append(f"paced at {top / 2.0:,.0f}/s = half of {top:,.0f}/s "
                      f"({'--rate' if args.rate else 'the amqp run as fast as possible'})")
    return [*runs, half]


def restart_pipeline(persistence: str) -> None:
    """`geofence up` with GEOFENCE_PERSISTENCE passed on: the sidecars run again with it."""
    from deploy import sidecars
    from deploy.settings import Settings, load_secrets

    os.environ["GEOFENCE_PERSISTENCE"] = persistence
    settings = Settings.from_env()
    sidecars.up(settings, load_secrets(settings), lambda line: None)


def journal_counters() -> dict[str, int]:
    """The x-fence workers' journal counters, summed (`geofence inspect worker`)."""
    from deploy.settings import Settings

    total: dict[str, int] = {}
    for worker in Settings.from_env().workers:
        done = subprocess.run([sys.executable, "-m", "deploy.cli", "inspect", "worker", worker, "--json"],
                              capture_output=True, text=True, timeout=60, check=True)
        counters = json.loads(done.stdout)["counters"]
        for k in ("journal_records", "journal_bytes", "journal_us", "positions"):
            total[k] = total.get(k, 0) + int(counters.get(k, 0))
    return total


def mode_durability(args: argparse.Namespace, w: Workloads, z: Sizes, ctx: dict[Sizes, float]
                    ) -> list[Outcome]:
    """The amqp run with persistent messages, confirms on every hop and the x-fence journal
    (production), then the same workload with GEOFENCE_PERSISTENCE=off (transient messages,
    no confirms, no journal; the queues stay quorum queues: their type is the topology's),
    then production again. Also the journal's own cost, from the workers' counters."""
    try:
        restart_pipeline("on")
        before = journal_counters()
        durable = run_broker(args, w, z, "amqp", "durable")
        after = journal_counters()
        restart_pipeline("off")
        fast = run_broker(args, w, z, "amqp", "fast")
    finally:
        restart_pipeline("on")
    fast.mode = "fast"
    durable.mode = "durable"
    durable.fast_rate = fast.updates_per_s if fast.ok else 0.0
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    stream_s = float(durable.figures.get("stream (s)", "0") or 0)
    if d.get("journal_records"):
        share = d["journal_us"] / 1e6 / stream_s if stream_s else 0.0
        durable.figures["journal records"] = f"{d['journal_records']:,}"
        durable.figures["journal MB"] = f"{d['journal_bytes'] / 1e6:,.1f}"
        durable.figures["journal ms/record"] = f"{d['journal_us'] / 1e3 / d['journal_records']:.2f}"
        durable.figures["journal s (share)"] = f"{d['journal_us'] / 1e6:.2f} ({share:.1%})"
        durable.notes.append(
            f"x-fence journal: {d['journal_records']:,} records, {d['journal_bytes'] / 1e6:,.1f} MB, "
            f"{d['journal_us'] / 1e6:.2f} s in all (encode + write + fdatasync) = {share:.1%} of the "
            f"stream's {stream_s:.2f} s (workers in parallel)")
    if durable.ok and fast.ok:
        durable.notes.append(f"durable / fast = {durable.updates_per_s / fast.updates_per_s:.2f} "
                             f"(asked: >= {DURABLE_MIN_RATIO:.2f})")
    return [durable, fast]


MODES: dict[str, Callable[[argparse.Namespace, Workloads, Sizes, dict[Sizes, float]], list[Outcome]]] = {
    "core": mode_core,
    "amqp": mode_amqp,
    "mqtt": mode_mqtt,
    "half": mode_half,
    "durability": mode_durability,
}


def top_functions(profiler: cProfile.Profile, n: int = 20) -> str:
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(n)
    return out.getvalue()


# --------------------------------------------------------------------------- the report


ROWS = ("objects", "updates", "batch", "rate asked (/s)", "setup (s)", "  drain wait (s)", "stream (s)",
        "  publish (s)", "  cpu (s)", "updates/s", "  after round 1", "events",
        "  raw duplicates", "events/s",
        "ingress (us/update)", "geo (us/update)", "fence (us/update)", "latency p50 (ms)",
        "latency p95 (ms)", "latency p99 (ms)", "  max (ms)", "reference (s)", "events match", "target",
        "ratio")


def events_ok(r: Outcome) -> str:
    return "ERROR" if r.error else ("yes" if not r.diff else "NO")


def figures(results: list[Outcome]) -> None:
    """The figures side by side, one column per run."""
    columns = []
    for r in results:
        target, ratio = r.target()
        fixed = {"objects": f"{r.objects:,}", "updates": f"{r.updates:,}",
                 "batch": f"{r.batch:,}" if r.mode != "mqtt" else "1 (msg)",
                 "events match": events_ok(r), "target": target, "ratio": report.ratio_cell(ratio)}
        columns.append({**r.figures, **fixed})
    print(report.side_by_side([r.label for r in results], columns, ROWS))
    for r in results:
        for note in r.notes:
            print(f"  {r.label}: {note}")


def summary(results: list[Outcome]) -> str:
    rows = []
    for r in results:
        target, ratio = r.target()
        rows.append([r.mode, f"{r.fences:,}", f"{r.objects:,}", f"{r.updates:,}",
                     f"{r.updates_per_s:,.0f}" if not r.error else "-", target, report.ratio_cell(ratio),
                     events_ok(r), report.fmt(r.p99, ".1f")])
    return report.table(["mode", "F", "N", "U", "updates/s", "target", "ratio", "events ok", "p99 ms"], rows)


def summary_line(results: list[Outcome]) -> str:
    parts = []
    for r in results:
        target, ratio = r.target()
        if r.error:
            parts.append(f"{r.label} ERROR")
        elif r.mode == "half":
            parts.append(f"{r.label} p99 {r.p99:.1f} ms at {r.updates_per_s:,.0f}/s "
                         f"(target {target}: {'met' if ratio and ratio >= 1 else 'missed'})")
        else:
            parts.append(f"{r.label} {r.updates_per_s:,.0f} updates/s"
                         + (f" ({report.times(ratio, target)})" if ratio else ""))
    bad = [r.label for r in results if not r.ok]
    events = ("events match the reference in every run" if not bad
              else f"events DIFFER or failed in {len(bad)} of {len(results)} runs: {', '.join(bad)}")
    return report.summary([*parts, events])


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=[*MODES, "all"], default="core")
    p.add_argument("--fences", default=None,
                   help="fence counts, comma-separated: a run each (default per mode: core and amqp "
                        "1000,10000; mqtt 100; half 1000)")
    p.add_argument("--objects", type=int, default=None, help="N (default 10,000; mqtt 1,000)")
    p.add_argument("--updates", type=int, default=None,
                   help="U (default core 200,000; amqp and half 100,000; mqtt 20,000)")
    p.add_argument("--batch", type=int, default=None,
                   help="updates per intake batch (core, default 10,000) or gateway message (amqp, half: "
                        "default 1,000, at most 50,000 positions and 256 KiB)")
    p.add_argument("--rate", type=float, default=None,
                   help="half: the max rate (updates/s) instead of an amqp run as fast as possible")
    p.add_argument("--clients", type=int, default=2, help="mqtt: publishing processes")
    p.add_argument("--paho", action="store_true",
                   help="mqtt: publish with paho-mqtt (a device library; ~250 us of CPU per message here) "
                        "instead of the lean publisher (bench/mqtt_load.py)")
    p.add_argument("--no-idle-wait", action="store_true",
                   help="broker modes: publish without waiting for the pipeline's queues to be empty")
    p.add_argument("--no-park", action="store_true",
                   help="broker modes: leave the run's objects where they are (see bench/broker_modes.py)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tls", action="store_true",
                   help="amqp, half, mqtt: the gateway or devices over AMQPS / MQTTS with the stack's CA")
    p.add_argument("--max-ranges", type=int, default=wl.MAX_RANGES, help="core: per fence covering")
    p.add_argument("--cells-per-radius", type=float, default=wl.CELLS_PER_RADIUS,
                   help="core: covering resolution: the cell side is about radius / this")
    p.add_argument("--profile", action="store_true", help="core: cProfile the stream: top 20 functions")
    args = p.parse_args(argv)
    args.fence_counts = []
    if args.fences is not None:
        try:
            args.fence_counts = [int(f) for f in args.fences.split(",") if f.strip()]
        except ValueError:
            p.error(f"--fences takes comma-separated integers, got {args.fences!r}")
        if not args.fence_counts or min(args.fence_counts) < 1:
            p.error("--fences needs at least one positive count")
    cli.require_positive(p, args, ("objects", "updates", "batch", "rate", "clients"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tn.USE_TLS[0] = args.tls
    if args.tls:
        print("-- the gateway and the devices over TLS (AMQPS, MQTTS) with the stack's CA", flush=True)
    modes = list(ALL) if args.mode == "all" else [args.mode]
    w = Workloads(args.seed)
    max_rates: dict[Sizes, float] = {}
    results: list[Outcome] = []
    for mode in modes:
        for z in sizes(args, mode):
            print(f"-- {mode}: F={z.fences:,} fences, N={z.objects:,} objects, U={z.updates:,} updates"
                  + (f", batch {z.batch:,}" if mode != "mqtt" else f", {args.clients} clients")
                  + f", seed {args.seed}", flush=True)
            for r in MODES[mode](args, w, z, max_rates):
                results.append(r)
                target, ratio = r.target()
                print(f"   {r.label}: " + (f"ERROR {r.error}" if r.error else
                      f"{r.updates_per_s:,.0f} updates/s, events {'match' if r.ok else 'DIFFER'}"
                      + (f", p99 {r.p99:.1f} ms" if not math.isnan(r.p99) else "")
                      + (f", {report.times(ratio, target)}" if ratio else "")), flush=True)
                if r.profile:
                    print(f"-- profile {r.label} (top 20 by own time) --\n{r.profile}")
    print()
    figures(results)
    print()
    for r in results:
        if r.error:
            print(f"{r.label}: run FAILED: {r.error}")
        elif r.diff:
            print(f"{r.label}: events DIFFER from the shapely reference:")
            print("\n".join(r.diff))
        else:
            print(f"{r.label}: events match the shapely reference: {len(r.events):,} events")
    print()
    print(summary(results))
    print(summary_line(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
