"""Entries and exits from a sensor's totals: the core of the sensor sidecar (no I/O).

A counter report carries the totals since the device started, not the events: a sensor
sends a report after 5 events (0xFF) or 30 minutes (0x20), loses what the broker did not get
(never resent), restarts (an all-zero report, v2: 0x21 and a counter from 0), and its totals
wrap. So the counts are differences of totals, and each report gets the rule that decided it:

    first       the sensor's first report: a baseline, nothing counted
    same        the totals did not move (a timeout report, or a duplicate delivery)
    duplicate   a delivery seen before (the same totals, time and counter as one of the last
                DUPLICATE_MEMORY reports): counted once, whatever came in between
    increase    both totals grew (or one stayed): the differences are the events
    wrap:counter     a total went down in the very next v2 message (counter + 1, and not
                     counter 1, the first after a lost start-up): delta = new + modulus - old
    wrap:time_gap    a total went down, and going round the modulus gives no more events
                     than `plausible` for the time between the reports (the old total was
                     near the modulus, the new one near zero)
    restart:startup  a start-up report (0x21, or every total zero; legacy zeros after zeros are a
                     quiet door's timeout report: `same`)
    restart:counter  the v2 counter went back (the start-up report was lost)
    restart:implausible  a decrease that is no plausible wrap (legacy: the start-up lost)
    A restart's totals count from zero again, so they are the events since the restart; what
    happened between the previous report and the restart is unknowable (`unknowable` is set:
    up to 4 events per direction not reported yet, plus those of lost reports).

A restart whose start-up report was lost and whose new totals are above the old ones cannot
be told from an increase; it undercounts by the old totals (small, as they were below the new
ones): the one case the protocol cannot make right without v2's counter or start-up report.

`plausible` bounds the events one direction can have between two reports: MAX_RATE per
second of the device time between them, plus one report's worth (STEP_SLACK); a "wrap" larger
than that is a restart whose start-up report was lost.

The modulus is a firmware parameter: documented 65536, observed 65524 (the totals reach 65523
and go back to 0). A total at or above the configured modulus proves it wrong: the sensor's
modulus is raised to 65536 and `modulus_raised` counted.

Lost reports: v2 counter gaps are counted per sensor (`gap` on the report after them); the
totals make the counts right anyway. A legacy 0xFF report more than 5 events after the last
one says reports were lost in between (`lost_reports`, an estimate).

Time (clock skew): a report's instant is the device's time (legacy: the hive's local time,
v2: its own time zone), unless it is more than MAX_SKEW_S away from when the platform
received it: then the receive time, and `skewed` is set. An instant never goes back before
the sensor's previous one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

DOCUMENTED_MODULUS = 65536
OBSERVED_MODULUS = 65524
MAX_RATE = 2.0  # events per second through one door, one direction: a plausible maximum
STEP_SLACK = 40  # events a report may carry beyond the rate (5 per report, and the 32 steps)
MAX_SKEW_S = 300.0
DUPLICATE_MEMORY = 16
COUNTER_MODULUS = 65536
EVENTS_PER_REPORT = 5

FIRST, SAME, DUPLICATE, INCREASE = "first", "same", "duplicate", "increase"
WRAP_COUNTER, WRAP_TIME = "wrap:counter", "wrap:time_gap"
RESTART_STARTUP, RESTART_COUNTER = "restart:startup", "restart:counter"
RESTART_IMPLAUSIBLE = "restart:implausible"
RULES = (FIRST, SAME, DUPLICATE, INCREASE, WRAP_COUNTER, WRAP_TIME, RESTART_STARTUP, RESTART_COUNTER,
         RESTART_IMPLAUSIBLE)


@dataclass
class SensorCounts:
    """What the core keeps per sensor (also what the shell stores, to resume after a restart)."""

    modulus: int = OBSERVED_MODULUS
    total_in: int = -1  # -1: no report yet
    total_out: int = -1
    at: float = float("-inf")  # the instant of the last report counted
    counter: int = -1  # v2: the last message counter
    recent: deque[tuple[int, int, float, int]] = field(default_factory=lambda: deque(maxlen=DUPLICATE_MEMORY))
    reports: int = 0
    entries: int = 0  # events counted since the sensor was first seen
    exits: int = 0
    restarts: int = 0
    wraps: int = 0
    duplicates: int = 0
    gaps: int = 0  # v2 messages missing
    lost_reports: int = 0  # legacy estimate
    skewed: int = 0
    modulus_raised: int = 0

    def to_json(self) -> dict[str, object]:
        out = {k: getattr(self, k) for k in _COUNTS}
        out["at"] = self.at if self.at != float("-inf") else None
        out["recent"] = [list(r) for r in self.recent]
        return out

    @classmethod
    def from_json(cls, d: dict[str, object]) -> SensorCounts:
        s = cls()
        for k, v in d.items():
            if k == "recent":
                s.recent.extend(tuple(r) for r in v)  # type: ignore[attr-defined]
            elif k == "at":
                s.at = float("-inf") if v is None else float(v)  # type: ignore[arg-type]
            else:
                setattr(s, k, int(v))  # type: ignore[call-overload]
        return s


_COUNTS = ("modulus", "total_in", "total_out", "counter", "reports", "entries", "exits", "restarts", "wraps",
           "duplicates", "gaps", "lost_reports", "skewed", "modulus_raised")


@dataclass(frozen=True, slots=True)
class Report:
    """One decoded counter report, its device instant resolved (UTC seconds)."""

    total_in: int
    total_out: int
    device_at: float
    received_at: float
    startup: bool
    counter: int = -1  # -1: legacy (no counter)
    report_type: int = 0xFF


@dataclass(frozen=True, slots=True)
class Derived:
    entries: int
    exits: int
    at: float  # the instant the events are counted at
    rule: str
    gap: int = 0  # v2 messages missing before this one
    lost_reports: int = 0  # legacy estimate of reports missing before this one
    unknowable: bool = False  # events between the previous report and a restart are unknown
    skewed: bool = False


def plausible(gap_s: float) -> int:
    return int(MAX_RATE * max(gap_s, 0.0)) + STEP_SLACK


def derive(state: SensorCounts, r: Report) -> Derived:
    """The events of one report, given what the sensor said before; `state` moves on."""
    key = (r.total_in, r.total_out, r.device_at, r.counter)
    skewed = bool(abs(r.device_at - r.received_at) > MAX_SKEW_S)
    at = max(r.received_at if skewed else r.device_at, state.at if state.at != float("-inf") else -1e18)
    if key in state.recent:
        state.duplicates += 1
        return Derived(0, 0, state.at, DUPLICATE)
    state.recent.append(key)
    state.reports += 1
    state.skewed += skewed
    top = max(r.total_in, r.total_out)
    if top >= state.modulus:
        state.modulus = DOCUMENTED_MODULUS
        state.modulus_raised += 1
    gap = 0
    if r.counter >= 0 and state.counter >= 0 and not r.startup:
        gap = (r.counter - state.counter - 1) % COUNTER_MODULUS
    first = state.total_in < 0
    if first:
        return _set(state, r, at, 0, 0, FIRST, skewed=skewed)
    quiet = r.counter < 0 and state.total_in == 0 and state.total_out == 0  # legacy zeros after zeros
    if r.startup and not quiet:
        state.restarts += 1
        return _set(state, r, at, r.total_in, r.total_out, RESTART_STARTUP, unknowable=True, skewed=skewed)
    d_in, d_out = r.total_in - state.total_in, r.total_out - state.total_out
    if d_in >= 0 and d_out >= 0:
        rule = SAME if d_in == d_out == 0 else INCREASE
        lost = 0
        if r.counter < 0 and r.report_type == 0xFF and d_in + d_out > EVENTS_PER_REPORT:
            lost = -(-(d_in + d_out) // EVENTS_PER_REPORT) - 1
        return _set(state, r, at, d_in, d_out, rule, gap=gap, lost=lost, skewed=skewed)
    # a total went down: a wrap, or a restart whose start-up report was lost
    bound = plausible((r.received_at if skewed else r.device_at) - state.at)
    w_in = d_in if d_in >= 0 else d_in + state.modulus
    w_out = d_out if d_out >= 0 else d_out + state.modulus
    if r.counter >= 0 and state.counter >= 0:  # v2: the counter says whether it restarted
        if gap == 0 and r.counter != 1:  # the very next message, and not the first after a lost 0x21
            state.wraps += 1
            return _set(state, r, at, w_in, w_out, WRAP_COUNTER, gap=gap, skewed=skewed)
        if r.counter < state.counter:  # the counter started again: a restart, its 0x21 lost
            state.restarts += 1
            return _set(state, r, at, r.total_in, r.total_out, RESTART_COUNTER, unknowable=True,
                        skewed=skewed)
    if w_in <= bound and w_out <= bound:
        state.wraps += 1
        return _set(state, r, at, w_in, w_out, WRAP_TIME, gap=gap, skewed=skewed)
    state.restarts += 1
    return _set(state, r, at, r.total_in, r.total_out, RESTART_IMPLAUSIBLE, unknowable=True, skewed=skewed)


def _set(state: SensorCounts, r: Report, at: float, d_in: int, d_out: int, rule: str, *, gap: int = 0,
         lost: int = 0, unknowable: bool = False, skewed: bool = False) -> Derived:
    state.total_in, state.total_out, state.at = r.total_in, r.total_out, at
    if r.counter >= 0:
        state.counter = r.counter
    state.entries += d_in
    state.exits += d_out
    state.gaps += gap
    state.lost_reports += lost
    return Derived(d_in, d_out, at, rule, gap, lost, unknowable, skewed)
