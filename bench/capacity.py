"""Capacity (issues 18, 39): CPU microseconds per update for each role and for RabbitMQ and
PostgreSQL, from the kernel's counters (/proc/<pid>/stat: user + system time) read when a run
starts streaming and when its last event arrived, and from them the cores needed for 10k, 100k
and 1M updates/s at each fence count (with --path mqtt: 100k, 1M and 10M devices reporting
every 10 s). The basis on which an operator sizes a deployment that outgrows one machine.

    python -m bench.capacity [--path amqp|mqtt] [--fences 1000,10000] [--objects 10000]
        [--updates U] [--batch 1000] [--clients 4] [--profile DIR]

--path amqp (the default): gateway batches of --batch positions. --path mqtt: one MQTT message
per update from --clients paho processes (their CPU is the benchmark's row: the children's
time of this process).

With --profile, every sidecar is sampled by py-spy over the same window (bench/profiles.py):
the raw stacks go to DIR/F<fences>/<sidecar>.txt and the top functions of each are printed.

Runs against the running stack (`geofence up`), production settings, events checked against
the shapely reference (a run whose events differ is reported, not counted).

Trade-off: the figures are averages over a whole run on a machine where every process shares
two cores, and the extrapolation is linear: it says how much CPU the work takes, not how it
parallelises. A role is one process per instance (x-ingress, x-geo per region, x-fence per
worker), so the cores a role needs are also the instances it needs, at least.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: again as a module of bench
    import cli  # type: ignore[import-not-found]  # bench/cli.py, in this file's own folder

    cli.run_as_module(__file__)

import argparse
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from bench import e2e, report
from bench.profiles import Profiles
from deploy.processes import proc_stat_fields
from deploy.services import rabbitmq_pid
from deploy.settings import Settings
from deploy.sidecars import load_records

TICKS = os.sysconf("SC_CLK_TCK")
RATES = (10_000, 100_000, 1_000_000)
DEVICE_EVERY_S = 10  # --path mqtt: a device reports every 10 s, so 10k updates/s are 100k devices
UPDATES = {1_000: 50_000, 10_000: 20_000}
ROLE_OF = {"x-ingress": "x-ingress", "x-geo": "x-geo (all regions)", "x-fence": "x-fence (all workers)",
           "fence-archiver": "fence-archiver", "api": "api"}


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU seconds of a process (all its threads), with `children` also those
    of its children it waited for; 0 if it is gone."""
    try:
        fields = proc_stat_fields(Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError):
        return 0.0
    own = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return (own + (int(fields[13]) + int(fields[14]) if children else 0)) / TICKS  # cutime, cstime


def postgres_pids() -> list[int]:
    """Every process named postgres (the cluster's postmaster and backends)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


@dataclass
class Sample:
    """CPU seconds per role at one instant."""

    cpu: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def now(settings: Settings, broker_pid: int) -> Sample:
        s: dict[str, float] = defaultdict(float)
        for name, rec in load_records(settings).items():
            role = next((r for prefix, r in ROLE_OF.items() if name.startswith(prefix)), name)
            s[role] += cpu_seconds(int(rec["pid"]))
        s["RabbitMQ"] = cpu_seconds(broker_pid)
        s["PostgreSQL"] = sum(cpu_seconds(p) for p in postgres_pids())
        s["this benchmark (publisher, reader)"] = cpu_seconds(os.getpid(), children=True)
        return Sample(dict(s))


@dataclass
class Window:
    """The samples around the stream: before its first update, after its last event."""

    settings: Settings
    broker_pid: int
    start: Sample | None = None
    end: Sample | None = None
    profiles: Profiles | None = None

    def phase(self, phase: str, done: int, total: int) -> None:
        """Called every tick (0.5 s) with the run's phase. The start is the last tick before
        the stream (the pipeline is idle then: it was drained), the end the first tick after
        the last event (parking or cleanup)."""
        if phase in ("fences", "drain"):
            self.start = Sample.now(self.settings, self.broker_pid)
        elif phase in ("publish", "events") and self.profiles is not None and not self.profiles.procs:
            self.profiles.start({name: int(rec["pid"]) for name, rec in load_records(self.settings).items()})
        elif phase in ("parking", "cleanup") and self.start is not None and self.end is None:
            self.end = Sample.now(self.settings, self.broker_pid)
            if self.profiles is not None:
                self.profiles.stop()


def measure(f: int, n: int, u: int, batch: int, seed: int, profile: Path | None = None,
            path: str = "amqp", clients: int = 4) -> tuple[e2e.Outcome, dict[str, float]]:
    """One run of `path` ("amqp" or "mqtt"); the CPU microseconds per update of each role
    while it streamed (and, with `profile`, py-spy's samples of each sidecar over that window)."""
    settings = Settings.from_env()
    window = Window(settings, rabbitmq_pid(), profiles=Profiles(profile / f"F{f}") if profile else None)
    args = argparse.Namespace(clients=clients, no_idle_wait=False, no_park=False, paho=False)
    out = e2e.run_broker(args, e2e.Workloads(seed), e2e.Sizes(f, n, u, batch), path, path,
                         progress_hook=window.phase)
    if window.profiles is not None:
        window.profiles.stop()
        if window.profiles.why_not:
            report.warn(f"no profiles: {window.profiles.why_not}")
        for name, funcs in window.profiles.summaries().items():
            print(f"  profile {name} (F={f:,}): " + "; ".join(f"{share:.0%} {fn}" for share, fn in funcs),
                  flush=True)
    if window.start is None or window.end is None:
        return out, {}
    us = {role: (window.end.cpu.get(role, 0.0) - c) / u * 1e6 for role, c in window.start.cpu.items()}
    return out, us


def rate_label(path: str, rate: int) -> str:
    """An update rate as a column says it: devices reporting every 10 s on the MQTT path."""
    if path == "mqtt":
        devices = rate * DEVICE_EVERY_S
        return f"{devices / 1e6:g}M devices" if devices >= 1e6 else f"{devices // 1000:,}k devices"
    return f"{rate:,}/s"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__.split("\n\n")[0])
    p.add_argument("--path", choices=("amqp", "mqtt"), default="amqp",
                   help="gateway batches (amqp) or one MQTT message per update (mqtt)")
    p.add_argument("--clients", type=int, default=4, help="mqtt: publishing processes")
    p.add_argument("--fences", default="1000,10000", help="fence counts, comma-separated")
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--updates", type=int, help="per run (default 50,000 at F=1,000, 20,000 at F=10,000)")
    p.add_argument("--batch", type=int, default=1_000, help="positions per gateway message")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile", type=Path, metavar="DIR", help="py-spy every sidecar over the stream")
    a = p.parse_args(argv)
    try:
        a.fence_counts = [int(x) for x in a.fences.split(",") if x.strip()]
    except ValueError:
        p.error(f"--fences {a.fences!r}: comma-separated integers")
    if a.objects < 1 or a.batch < 1 or (a.updates is not None and a.updates < 1) or not a.fence_counts \
            or min(a.fence_counts) < 1:
        p.error("--objects, --batch, --updates and the fence counts must be positive")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    results: list[tuple[int, e2e.Outcome, dict[str, float]]] = []
    for f in a.fence_counts:
        u = a.updates or UPDATES.get(f, 20_000)
        out, us = measure(f, a.objects, u, a.batch, a.seed, a.profile, a.path, a.clients)
        results.append((f, out, us))
        state = out.error or ("events match the reference" if not out.diff else "EVENTS DIFFER: not counted")
        print(f"{a.path} F={f:,}: {out.updates_per_s:,.0f} updates/s; {state}", flush=True)
    counted = [(f, us) for f, out, us in results if us and not out.error and not out.diff]
    if not counted:
        print(report.summary(["no run could be counted"], "FAILED", lead="capacity"))
        return 1
    roles = list(dict.fromkeys(r for _, us in counted for r in us))
    bench_role = "this benchmark (publisher, reader)"
    pipeline = [r for r in roles if r != bench_role]
    print()
    print(f"CPU microseconds per update ({a.path}, while streaming):")
    rows = [[r, *(f"{us.get(r, 0.0):,.1f}" for _, us in counted)] for r in roles]
    rows.append(["pipeline total (without the benchmark)",
                 *(f"{sum(us.get(r, 0.0) for r in pipeline):,.1f}" for _, us in counted)])
    print(report.table(["role", *(f"F={f:,}" for f, _ in counted)], rows))
    print()
    print("Cores needed (CPU seconds per second; linear):")
    header = ["role", *(f"F={f:,} @ {rate_label(a.path, rate)}" for f, _ in counted for rate in RATES)]
    crows = [[r, *(f"{us.get(r, 0.0) * rate / 1e6:,.1f}" for _, us in counted for rate in RATES)]
             for r in pipeline]
    crows.append(["total", *(f"{sum(us.get(r, 0.0) for r in pipeline) * rate / 1e6:,.1f}"
                             for _, us in counted for rate in RATES)])
    print(report.table(header, crows))
    parts = [f"F={f:,}: {sum(us.get(r, 0.0) for r in pipeline):,.0f} us/update, "
             f"{sum(us.get(r, 0.0) for r in pipeline) * 100_000 / 1e6:,.0f} cores at 100k/s"
             for f, us in counted]
    print(report.summary(parts, lead="capacity"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
