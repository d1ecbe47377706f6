"""A hive's business day as an occupancy curve by local hour (no I/O): the day's counts in,
each local hour's entries, exits, mean and peak occupancy out, drift-corrected once the day has
ended. The owners' live "today" (fence/venues/owner_store.py) and the nightly analytics
(spark_jobs/venue_core.py, which has the rules in full) share it.

Rules in short: the business day runs from its reset hour to the next day's (its zone); slots
of 3,600 s from its start, labelled by the local hour they begin in (23 on the day clocks go
forward, the repeated hour merged when they go back); the curve starts at zero and steps at
each counted instant; a day that has ended is corrected so that it ends at zero (the side that
came up short scaled: `correction`); always clamped at zero.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from zoneinfo import ZoneInfo

import numpy as np

HOUR_S = 3_600.0
CORRECTIONS = ("none", "exits", "entries", "one-sided", "open")


@lru_cache(maxsize=1024)
def _zone(tz: str) -> ZoneInfo:
    return ZoneInfo(tz)


@dataclass(frozen=True)
class HiveInput:
    """One hive's data for a run: its counts (any order), its fence's phones per UTC hour
    start (mean, peak), and its computed days before the run (day -> the 24 hourly means of the
    sensors, and of the phones or None)."""

    hive_id: str
    tz: str
    reset_hour: int
    has_fence: bool
    at: np.ndarray  # float64 epoch seconds
    entries: np.ndarray  # int64
    exits: np.ndarray  # int64
    phones: Mapping[float, tuple[float, int]] = field(default_factory=dict)
    history: Mapping[dt.date, tuple[np.ndarray, np.ndarray | None]] = field(default_factory=dict)


def day_bounds(day: dt.date, tz: str, reset_hour: int) -> tuple[float, float]:
    """The instants business day `day` starts and ends at."""
    z = _zone(tz)

    def start(d: dt.date) -> float:
        return dt.datetime.combine(d, dt.time(reset_hour), z).timestamp()

    return start(day), start(day + dt.timedelta(days=1))


def slots(day: dt.date, tz: str, reset_hour: int) -> tuple[np.ndarray, np.ndarray]:
    """The day's hour slots: their edges (n + 1 instants) and the local hour each begins in."""
    start, end = day_bounds(day, tz, reset_hour)
    n = max(1, round((end - start) / HOUR_S))
    edges = start + HOUR_S * np.arange(n + 1, dtype=np.float64)
    edges[-1] = end
    z = _zone(tz)
    labels = np.array([dt.datetime.fromtimestamp(e, dt.UTC).astimezone(z).hour for e in edges[:-1]],
                      dtype=np.int64)
    return edges, labels


@dataclass(frozen=True)
class Day:
    """One computed day: its row for venue_day and its 24 hourly figures."""

    day: dt.date
    reports: int
    entries: int
    exits: int
    correction: str
    factor: float
    complete: bool
    hourly_entries: np.ndarray  # (24,) int64
    hourly_exits: np.ndarray
    mean: np.ndarray  # (24,) float64
    peak: np.ndarray
    present: np.ndarray  # (24,) bool: the hour exists that day
    phones_mean: np.ndarray | None
    phones_peak: np.ndarray | None


def correction(entries: int, exits: int, complete: bool) -> tuple[str, float, float]:
    """(rule, entry factor, exit factor) of a day's drift correction."""
    if not complete:
        return "open", 1.0, 1.0
    if entries == exits:
        return "none", 1.0, 1.0
    if entries > exits:
        return ("exits", 1.0, entries / exits) if exits else ("one-sided", 1.0, 1.0)
    return ("entries", exits / entries, 1.0) if entries else ("one-sided", 1.0, 1.0)


def analyse_day(h: HiveInput, day: dt.date, now: float) -> Day | None:
    """A day of a hive, None when nothing was counted in it."""
    edges, labels = slots(day, h.tz, h.reset_hour)
    start, end = float(edges[0]), float(edges[-1])
    sel = (h.at >= start) & (h.at < end)
    if not sel.any():
        return None
    order = np.argsort(h.at[sel], kind="stable")
    at, ent, ex = h.at[sel][order], h.entries[sel][order], h.exits[sel][order]
    e_tot, x_tot = int(ent.sum()), int(ex.sum())
    complete = end <= now
    rule, fe, fx = correction(e_tot, x_tot, complete)
    value = np.maximum(0.0, fe * np.cumsum(ent) - fx * np.cumsum(ex))
    last = np.flatnonzero(np.r_[at[1:] != at[:-1], True])  # one step per instant
    t, v = at[last], value[last]
    # the curve: 0 before t[0], v[i] on [t[i], t[i+1]); area from the start up to each knot
    width = np.diff(np.r_[t, end])
    area = np.r_[0.0, np.cumsum(v * width)[:-1]]
    k = np.searchsorted(t, edges, side="right") - 1
    inside = k >= 0
    at_edge = np.where(inside, v[np.maximum(k, 0)], 0.0)
    cum = np.where(inside, area[np.maximum(k, 0)] + at_edge * (edges - t[np.maximum(k, 0)]), 0.0)
    n = len(labels)
    slot_mean = np.diff(cum) / np.diff(edges)
    slot_peak = at_edge[:-1].copy()
    np.maximum.at(slot_peak, np.searchsorted(edges, t, side="right") - 1, v)
    slot_of = np.searchsorted(edges, at, side="right") - 1
    slot_e = np.bincount(slot_of, ent, minlength=n)
    slot_x = np.bincount(slot_of, ex, minlength=n)

    # local hours: a repeated hour (DST ends) merges its two slots
    present = np.zeros(24, bool)
    present[labels] = True
    times = np.bincount(labels, minlength=24)
    mean = np.bincount(labels, slot_mean, minlength=24) / np.maximum(times, 1)
    peak = np.zeros(24)
    np.maximum.at(peak, labels, slot_peak)
    phones_mean = phones_peak = None
    if h.has_fence:
        got = [h.phones.get(math.floor(s / HOUR_S) * HOUR_S, (0.0, 0)) for s in edges[:-1]]
        phones_mean = np.bincount(labels, [g[0] for g in got], minlength=24) / np.maximum(times, 1)
        phones_peak = np.zeros(24, np.int64)
        np.maximum.at(phones_peak, labels, np.array([g[1] for g in got], np.int64))
    return Day(day, len(at), e_tot, x_tot, rule, fx if rule == "exits" else fe, complete,
               np.bincount(labels, slot_e, minlength=24).round().astype(np.int64),
               np.bincount(labels, slot_x, minlength=24).round().astype(np.int64),
               mean, peak, present, phones_mean, phones_peak)
