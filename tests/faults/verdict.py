"""The verdict on a finished fault run: the deduped events against the shapely ground truth
(fence.reference.compare; per tenant: each tenant's objects against its own fences), every
difference attributed to the fault injected before the position that caused it, no event
pairing a fence with another tenant's object (on the wire, EventCollector.crossed, or in the
archive), event_ids naming two events, faults that did not recover and
sidecars the harness had to start again, sidecars alive and consuming at the end, the dead
letters (every planted bad input, nothing else of the run), and the archive table in
PostgreSQL holding exactly the distinct events; `Outcome` holds the table's row, the
problems (the run fails on any) and what else the run says, `failure_message` the text of
a failed assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import asyncpg
import numpy as np

from deploy.inspect_cmd import ask
from exchanges import topology as t
from exchanges.tenancy import qualify
from fence.reference import EventTuple, compare
from tests.faults import report
from tests.faults.session_fences import SESSION_FENCES
from tests.faults.stack import Stack, sidecar_queues
from tests.faults.timing import ARCHIVE_DEADLINE_S, ARCHIVE_STUCK_S, CONSUMER_DEADLINE_S, poll_until

if TYPE_CHECKING:  # the run calls judge() when it is finished: no import of it at run time
    from tests.faults.run import FaultRun

ATTRIBUTION_SLACK = 1_000  # updates: published before a fault, still in flight when it struck


@dataclass
class Outcome:
    """A run's verdict: its row of the suite's table, the problems (the run fails on any one)
    and what else there is to say about the run."""

    row: report.Row
    problems: list[str] = field(default_factory=list)
    info: list[str] = field(default_factory=list)


async def judge(run: FaultRun) -> Outcome:
    """The verdict on a finished run (every position confirmed, the last events received)."""
    got = list(run.collector.distinct.values())
    problems: list[str] = []
    info = [f"seed {run.seed} (FAULT_SEED={run.seed} replays the moments), run {run.run_id}"]
    diff = compare(got, run.reference)
    if diff:
        problems.append("events (deduped on event_id) differ from the shapely ground truth: " + diff[0])
        problems += _attribute(run, got)
        problems += diff[1:]
        problems += await _worker_stats(run)
    crossed = dict(run.collector.crossed)
    if crossed:
        problems.append(f"{len(crossed)} events pair a fence with another tenant's object (the tenant wall): "
                        + "; ".join(list(crossed.values())[:3]))
    if run.collector.conflicts:
        problems.append(f"{len(run.collector.conflicts)} event_ids name two different events: "
                        + "; ".join(run.collector.conflicts[:3]))
    problems += [f"{f.label}: did not recover ({f.note})" for f in run.faults if f.recovery_s is None]
    for f in run.faults:
        for how, verb in (("stuck", "ran on without consuming"), ("exited", "exited")):
            names = [n for n, h in f.revived.items() if h == how]
            if names:
                said = " | ".join(f"{n}: {' / '.join(f.evidence.get(n, []))}" for n in names)
                problems.append(f"{f.label}: {', '.join(names)} {verb} (seen {CONSUMER_DEADLINE_S:g}s "
                                f"after the fault; the harness started them again); log: {said}")
    problems += await _sidecars_alive(run)
    problems += _dead_letter_problems(run)
    problems += await _archive_problems(run)
    archived_crossings = await _archived_crossings(run)  # once the archive caught up
    if archived_crossings:
        problems.append(f"fence_event holds {len(archived_crossings)} events pairing a run's fence with "
                        f"an object of another tenant, e.g. {archived_crossings[:3]}")
    info.append(f"raw deliveries {run.collector.raw:,}, distinct {len(run.collector.distinct):,}, "
                f"duplicates {run.collector.duplicates:,}; test consumer reconnects "
                f"{run.collector.reconnects}")
    walled = await walled_candidates(run.stack)
    if walled is not None and run.walled_before is not None:
        info.append(f"tenant wall: x-fence refused {walled - run.walled_before:+,} candidates of another "
                    "tenant's fences during the run (x-geo routes by geometry alone); "
                    f"events across tenants: {len(crossed)} received, {len(archived_crossings)} archived")
    info += [f"fault {f.label} at update {f.at_update:,}: "
             f"{'-' if f.recovery_s is None else f'{f.recovery_s:.1f}s'} ({f.note})" for f in run.faults]
    ours = [d for d in run.dead_letters if d.ours]
    row = report.Row(run.title, len(run.faults), len(run.stream), len(run.reference),
                     len(run.collector.distinct), run.collector.duplicates, len(ours),
                     tuple(float("nan") if f.recovery_s is None else f.recovery_s for f in run.faults),
                     ok=not problems, crossed=len(crossed) + len(set(archived_crossings) - set(crossed)))
    return Outcome(row, problems, info)


def _attribute(run: FaultRun, got: Sequence[EventTuple]) -> list[str]:
    """Each unexpected or missing event to the last fault injected before the position
    that caused it was published, or shortly after (ATTRIBUTION_SLACK: positions in flight
    when it struck), else 'before any fault'; counted by kind, event and worker."""
    extra = Counter(got) - Counter(run.reference)
    missing = Counter(run.reference) - Counter(got)
    marks = [(f.at_update, f.label) for f in run.faults]
    per: dict[str, Counter[str]] = {}
    for what, ctr in (("unexpected", extra), ("missing", missing)):
        for ev, n in ctr.items():
            i = run.where.get((ev[2], ev[3]), -1)
            label = "before any fault"
            for at, lab in marks:
                if i + ATTRIBUTION_SLACK >= at:
                    label = lab
            worker = run.stack.ring.node_for(ev[1])
            per.setdefault(label, Counter())[f"{what} {ev[0]}/{ev[4]} on {worker}"] += n
    lines = []
    for label in [lab for _, lab in marks] + ["before any fault"]:
        if label in per:
            parts = ", ".join(f"{n} {k}" for k, n in sorted(per[label].items()))
            lines.append(f"  after {label}: {parts}")
    for what, ctr in (("unexpected", extra), ("missing", missing)):
        lines += [f"  {what} {ev}: {_explain(run, ev)}" for ev in sorted(ctr)[:6]]
    return lines


def _explain(run: FaultRun, ev: EventTuple) -> str:
    """Where the update behind an event sits: its index and region, the object's updates
    around it (regions), the faults just before it."""
    i = run.where.get((ev[2], ev[3]))
    if i is None:
        return "no update of the stream has this object and ts"
    o = int(run.stream.obj[i])
    mine = np.flatnonzero(run.stream.obj == o)
    k = int(np.searchsorted(mine, i))
    near = mine[max(0, k - 2):k + 3].tolist()
    regions = " ".join(f"#{j}{'*' if j == i else ''}:{run.regions[int(run.region_of_update[j])]}"
                       for j in near)
    before = [f"{f.label} at #{f.at_update} ({i - f.at_update:+d})" for f in run.faults
              if f.at_update <= i + 2 * run.batch * 10]
    return (f"update #{i}, the object's updates (region) {regions}; fault(s) before: "
            f"{', '.join(before[-3:]) or 'none'}")


async def _worker_stats(run: FaultRun) -> list[str]:
    lines = []
    for w in run.stack.settings.workers:
        with contextlib.suppress(Exception):
            got = await ask(run.stack.conn["amqp"][t.FENCES_VHOST], t.FENCE_CONTROL_EXCHANGE, w, {}, 5)
            s = got.get("stats", {})
            lines.append(f"  x-fence {w} now: " + ", ".join(
                f"{k} {s[k]}" for k in ("held_now", "held_positions", "holds_expired", "stale_positions")
                if k in s))
    return lines


async def walled_candidates(stack: Stack) -> int | None:
    """x-fence's count of candidates x-geo routed to a fence of another tenant than the
    position's object, over every worker (None if a worker did not answer): what the tenant
    wall refused (fence/x_fence/decisions.py)."""
    total = 0
    for w in stack.settings.workers:
        try:
            got = await ask(stack.conn["amqp"][t.FENCES_VHOST], t.FENCE_CONTROL_EXCHANGE, w, {}, 5)
            total += int(got.get("stats", {})["walled_candidates"])
        except Exception:
            return None
    return total


async def _sidecars_alive(run: FaultRun) -> list[str]:
    problems = []
    dead = run.stack.dead()
    for name in dead:
        tail = " | ".join(run.stack.log_tail(name, 4))
        problems.append(f"sidecar {name} is dead at the end of the run; "
                        f"{run.stack.log_path(name)}: {tail}")
    queues = [(v, q) for n in run.stack.names for v, q in sidecar_queues(run.stack.topology, n)]

    async def consuming() -> bool:
        return not await run.probe.consumed(queues)

    if not await poll_until(consuming, 30):
        problems.append(f"input queues without a consumer at the end: "
                        f"{', '.join(await run.probe.consumed(queues))}")
    return problems


def _dead_letter_problems(run: FaultRun) -> list[str]:
    problems = []
    bad = {d.bad_input for d in run.dead_letters if d.bad_input is not None}
    missing = sorted(set(range(run.bad_inputs)) - bad)
    if missing:
        problems.append(f"bad inputs not in a dead-letter queue: {missing} of {run.bad_inputs}")
    no_reason = [d for d in run.dead_letters if d.ours and not d.reason]
    if no_reason:
        problems.append(f"{len(no_reason)} dead letters of the run without a {t.REASON_HEADER} header")
    stray = [d for d in run.dead_letters if d.ours and d.bad_input is None]
    if stray:
        problems.append(f"{len(stray)} messages of valid positions or events were dead-lettered: "
                        + "; ".join(f"{d.vhost} {d.source}: {d.reason}" for d in stray[:5]))
    return problems


async def _archive_problems(run: FaultRun) -> list[str]:
    """fence_event holds exactly the run's distinct events (the archiver is idempotent
    by event_id); waits for the archiver while the table still grows (a count a second),
    then compares the rows."""
    want = set(run.collector.distinct)
    dsn = run.stack.conn["postgres"]["dsn"]
    # the run's objects in the run's fences, each tenant's (ids qualified): an object of another
    # run (a parked demo car) inside a fence when it is defined gets its own ENTER, none of this
    # run's business; a pair across tenants is _archived_crossings'
    query = ("FROM fence_event WHERE fence_id LIKE ANY($1::text[]) AND object_id LIKE ANY($2::text[]) "
             "AND split_part(fence_id, ':', 1) = split_part(object_id, ':', 1) AND ts <= $3")
    args = (_patterns(run, SESSION_FENCES.prefix), _patterns(run, run.prefix), run.end_ts)

    async def fetch(sql: str) -> list[asyncpg.Record] | None:
        try:
            c = await asyncpg.connect(dsn)
            try:
                return list(await c.fetch(sql, *args))
            finally:
                await c.close()
        except (OSError, asyncpg.PostgresError):
            return None

    archive = [(t.FENCES_VHOST, t.ARCHIVE_QUEUE)]
    t0 = time.monotonic()
    end = t0 + ARCHIVE_DEADLINE_S
    first_depth = await run.probe.ready(archive)
    last, moved, depth = -1, t0, first_depth
    while time.monotonic() < end:
        got = await fetch(f"SELECT count(*) AS n {query}")
        n = int(got[0]["n"]) if got else -1
        now = time.monotonic()
        if n >= len(want) or now - moved > ARCHIVE_STUCK_S:
            break
        if n != last:
            last, moved = n, now
        depth = await run.probe.ready(archive)
        drained = (first_depth or 0) - (depth or 0)
        if depth and drained > 0 and now - t0 > 5 and depth / (drained / (now - t0)) > end - now:
            break  # the archiver's backlog will not drain before the deadline: say so now
        await asyncio.sleep(1.0)  # polling a count, not synchronising
    rs = await fetch(f"SELECT event_id, event, fence_id, object_id, ts, reason {query}") or []
    rows: dict[str, EventTuple] = {r["event_id"]: (r["event"], r["fence_id"], r["object_id"], r["ts"],
                                                   r["reason"]) for r in rs}
    problems = []
    lost = want - set(rows)
    extra = set(rows) - want
    if lost:
        behind = await run.probe.ready(archive)
        rate = ((first_depth or 0) - (behind or 0)) / max(time.monotonic() - t0, 1e-9)
        why = (f"the archiver is behind: {behind:,} messages wait in {t.ARCHIVE_QUEUE}, draining at "
               f"{rate:,.0f}/s" if behind else f"{t.ARCHIVE_QUEUE} is empty: lost")
        problems.append(f"fence_event lacks {len(lost):,} of the {len(want):,} events received ({why}), "
                        "e.g. " + "; ".join(str(run.collector.distinct[e]) for e in sorted(lost)[:3]))
    if extra:
        problems.append(f"fence_event holds {len(extra)} events of the run never received, e.g. "
                        + "; ".join(str(rows[e]) for e in sorted(extra)[:3]))
    differ = [e for e in want & set(rows) if rows[e] != run.collector.distinct[e]]
    if differ:
        problems.append(f"{len(differ)} archived events differ from the ones delivered, e.g. "
                        f"{rows[differ[0]]} vs {run.collector.distinct[differ[0]]}")
    return problems


def _patterns(run: FaultRun, prefix: str) -> list[str]:
    """LIKE patterns of names under `prefix` (the run's objects', the session's fences'),
    qualified: `<tenant>:<prefix>%` per tenant."""
    return [f"{qualify(x, prefix)}%" for x in run.tenants]


async def _archived_crossings(run: FaultRun) -> list[str]:
    """event_ids of archived events of the fences, dated within the run, whose object is not
    of the fence's tenant (a presence event's pseudonym included), read once _archive_problems
    waited for the archiver."""
    try:
        c = await asyncpg.connect(run.stack.conn["postgres"]["dsn"])
        try:
            rows = await c.fetch("SELECT event_id FROM fence_event WHERE fence_id LIKE ANY($1::text[]) "
                                 "AND split_part(fence_id, ':', 1) <> split_part(object_id, ':', 1) "
                                 "AND ts BETWEEN $2 AND $3", _patterns(run, SESSION_FENCES.prefix),
                                 run.start_ts, run.end_ts)
        finally:
            await c.close()
    except (OSError, asyncpg.PostgresError) as exc:
        return [f"(the archive could not be read: {type(exc).__name__})"]
    return [str(r["event_id"]) for r in rows]


def failure_message(out: Outcome) -> str:
    """The message of a failed run's assertion: its problems, then what else it says."""
    return "\n".join([*out.problems, "-- run:", *out.info])
