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
    restart:counter  the v2 counter went back, or came round by more messages than the time
                     allows (the start-up report was lost): decided before the totals
    restart:implausible  a decrease that is no plausible wrap (legacy: the start-up lost)
    late        a report older than the last one counted (a broker requeue, `geofence dlq
                replay`, a delivery held up): its events are in the totals already counted, so
                it counts nothing and leaves the state as it was (see "Order" below)
    A restart's totals count from zero again, so they are the events since the restart; what
    happened between the previous report and the restart is unknowable (`unknowable` is set:
    up to 4 events per direction not reported yet, plus those of lost reports).

Order, decided before the totals (a difference of totals means something only from an older
report to a newer one). A report is late when its device time is before the device time of
the last report counted (`SensorCounts.device_at`), or equal to it and
  - v2: its counter is not after the last one's (serial-number arithmetic, below);
  - legacy: a total went down (a restart cannot happen within the second of a report).
Otherwise it is newer, and then, for v2 (not a start-up report), the counter comes next:
  - a counter not after the last one (it went back, or stayed) with a newer device time: the
    sensor started again and its 0x21 was lost: `restart:counter`, whatever the totals say
    (totals above the old ones included);
  - a counter after the last one but numerically below it (it came round through 0) by more
    messages than the sensor can have sent in the device time between (`plausible_messages`):
    a restart too (a counter above 32768 started again from 0), `restart:counter`;
  - otherwise the messages between are lost (`gap`), and the totals decide.
The v2 counter is a 16-bit serial number (RFC 1982): c is after p when (c - p) mod 65536 is
in [1, 32767]; a difference of 32768 or more (or 0) is "not after". A late report never
moves the state (totals, instants, counter): the next report is judged against the last one
counted, so nothing is counted twice. A device clock set back (not a constant skew, which
keeps the order) makes its reports late until it passes the last time counted: they count
nothing and the first report after counts the whole difference (differences of totals lose
no event, only where in time they are placed).

A legacy restart whose start-up report was lost and whose new totals are above the old ones
cannot be told from an increase; it undercounts by the old totals (small, as they were below
the new ones): the one case the protocol cannot make right without v2's counter or start-up
report (v2: `restart:counter` above).

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
COUNTER_MODULUS = 65536  # the v2 message counter: a 16-bit serial number
COUNTER_HALF = COUNTER_MODULUS // 2
EVENTS_PER_REPORT = 5
TIMEOUT_S = 1800.0  # the firmware's timeout report (0x20)
MESSAGE_SLACK = 8  # v2 messages a sensor may send beyond the rate (start-up, timeouts, rounding)

FIRST, SAME, DUPLICATE, INCREASE = "first", "same", "duplicate", "increase"
WRAP_COUNTER, WRAP_TIME = "wrap:counter", "wrap:time_gap"
RESTART_STARTUP, RESTART_COUNTER = "restart:startup", "restart:counter"
RESTART_IMPLAUSIBLE = "restart:implausible"
LATE = "late"
RULES = (FIRST, SAME, DUPLICATE, INCREASE, WRAP_COUNTER, WRAP_TIME, RESTART_STARTUP, RESTART_COUNTER,
         RESTART_IMPLAUSIBLE, LATE)


@dataclass
class SensorCounts:
    """What the core keeps per sensor (also what the shell stores, to resume after a restart)."""

    modulus: int = OBSERVED_MODULUS
    total_in: int = -1  # -1: no report yet
    total_out: int = -1
    at: float = float("-inf")  # the instant of the last report counted
    device_at: float = float("-inf")  # the device time of the last report counted (its order)
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
    late: int = 0  # reports older than the last one counted (counted nothing)

    def to_json(self) -> dict[str, object]:
        out = {k: getattr(self, k) for k in _COUNTS}
        out["at"] = self.at if self.at != float("-inf") else None
        out["device_at"] = self.device_at if self.device_at != float("-inf") else None
        out["recent"] = [list(r) for r in self.recent]
        return out

    @classmethod
    def from_json(cls, d: dict[str, object]) -> SensorCounts:
        s = cls()
        for k, v in d.items():
            if k == "recent":
                s.recent.extend(tuple(r) for r in v)  # type: ignore[attr-defined]
            elif k in ("at", "device_at"):
                setattr(s, k, float("-inf") if v is None else float(v))  # type: ignore[arg-type]
            else:
                setattr(s, k, int(v))  # type: ignore[call-overload]
        if "device_at" not in d:  # a state stored before device_at: the instant counted is the nearest
            s.device_at = s.at
        return s


_COUNTS = ("modulus", "total_in", "total_out", "counter", "reports", "entries", "exits", "restarts", "wraps",
           "duplicates", "gaps", "lost_reports", "skewed", "modulus_raised", "late")


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


def plausible_messages(gap_s: float) -> int:
    """The v2 messages a sensor can send in `gap_s` seconds: a report per EVENTS_PER_REPORT
    events at MAX_RATE each way, a timeout report per TIMEOUT_S, and MESSAGE_SLACK."""
    g = max(gap_s, 0.0)
    return int(2 * MAX_RATE * g / EVENTS_PER_REPORT + g / TIMEOUT_S) + MESSAGE_SLACK


def counter_after(c: int, p: int) -> bool:
    """Whether v2 message counter `c` comes after `p`: 16-bit serial-number arithmetic (RFC
    1982), (c - p) mod 65536 in [1, 32767]. The same counter is not after; a difference of
    exactly 32768 (undefined in RFC 1982) is taken as not after either."""
    return 0 < (c - p) % COUNTER_MODULUS < COUNTER_HALF


def is_late(state: SensorCounts, r: Report) -> bool:
    """Whether `r` is older than the last report counted (the module's "Order")."""
    if r.device_at != state.device_at:
        return r.device_at < state.device_at
    if r.counter >= 0 and state.counter >= 0 and not r.startup:
        return not counter_after(r.counter, state.counter)
    return not r.startup and (r.total_in < state.total_in or r.total_out < state.total_out)


def derive(state: SensorCounts, r: Report) -> Derived:
    """The events of one report, given what the sensor said before; `state` moves on (unless
    the report is a duplicate or late)."""
    key = (r.total_in, r.total_out, r.device_at, r.counter)
    skewed = bool(abs(r.device_at - r.received_at) > MAX_SKEW_S)
    own_at = r.received_at if skewed else r.device_at
    at = max(own_at, state.at if state.at != float("-inf") else -1e18)
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
    if state.total_in < 0:
        return _set(state, r, at, 0, 0, FIRST, skewed=skewed)
    if is_late(state, r):  # its events are in the totals counted already: the state stays
        state.late += 1
        return Derived(0, 0, own_at, LATE, skewed=skewed)
    quiet = r.counter < 0 and state.total_in == 0 and state.total_out == 0  # legacy zeros after zeros
    if r.startup and not quiet:
        state.restarts += 1
        return _set(state, r, at, r.total_in, r.total_out, RESTART_STARTUP, unknowable=True, skewed=skewed)
    v2 = r.counter >= 0 and state.counter >= 0
    gap, step = 0, 0
    if v2:  # the counter before the totals (a newer report here: is_late said so)
        step = (r.counter - state.counter) % COUNTER_MODULUS
        came_round = r.counter < state.counter and step > plausible_messages(r.device_at - state.device_at)
        if step >= COUNTER_HALF or came_round:  # it started again: a restart whose 0x21 was lost
            state.restarts += 1
            return _set(state, r, at, r.total_in, r.total_out, RESTART_COUNTER, unknowable=True,
                        skewed=skewed)
        gap = max(step - 1, 0)
    d_in, d_out = r.total_in - state.total_in, r.total_out - state.total_out
    if d_in >= 0 and d_out >= 0:
        rule = SAME if d_in == d_out == 0 else INCREASE
        lost = 0
        if r.counter < 0 and r.report_type == 0xFF and d_in + d_out > EVENTS_PER_REPORT:
            lost = -(-(d_in + d_out) // EVENTS_PER_REPORT) - 1
        return _set(state, r, at, d_in, d_out, rule, gap=gap, lost=lost, skewed=skewed)
    # a total went down: a wrap, or a restart whose start-up report was lost
    bound = plausible(own_at - state.at)
    w_in = d_in if d_in >= 0 else d_in + state.modulus
    w_out = d_out if d_out >= 0 else d_out + state.modulus
    if v2 and step == 1 and r.counter != 1:  # the very next message, and not the first after a lost 0x21
        state.wraps += 1
        return _set(state, r, at, w_in, w_out, WRAP_COUNTER, gap=gap, skewed=skewed)
    if w_in <= bound and w_out <= bound:
        state.wraps += 1
        return _set(state, r, at, w_in, w_out, WRAP_TIME, gap=gap, skewed=skewed)
    state.restarts += 1
    rule = RESTART_COUNTER if v2 and r.counter < state.counter else RESTART_IMPLAUSIBLE
    return _set(state, r, at, r.total_in, r.total_out, rule, unknowable=True, skewed=skewed)


def _set(state: SensorCounts, r: Report, at: float, d_in: int, d_out: int, rule: str, *, gap: int = 0,
         lost: int = 0, unknowable: bool = False, skewed: bool = False) -> Derived:
    state.total_in, state.total_out, state.at, state.device_at = r.total_in, r.total_out, at, r.device_at
    if r.counter >= 0:
        state.counter = r.counter
    state.entries += d_in
    state.exits += d_out
    state.gaps += gap
    state.lost_reports += lost
    return Derived(d_in, d_out, at, rule, gap, lost, unknowable, skewed)
