"""The pure core of occupancy-analytics: Arrow rows of events in, Arrow rows of results out.

spark_jobs/occupancy.py (the job: Spark, PostgreSQL, the rules in its docstring) reads a task's
share of the fences into a table of events_sql's columns and calls `analyse` on each chunk of
it (`fence_chunks`); the tests call them directly and hold them equal to the plain loops of
spark_jobs/occupancy_reference.py. Nothing here does I/O: no Spark, no database.

Trade-off: all of a chunk's fences are analysed at once, sorted and swept with numpy array
operations (no Python call per fence or per row), and every kind of output row shares one
schema (CORE_SCHEMA, the columns a kind does not use null), so that one pass yields them all.
The price: the code reads as array algebra rather than as the rules (the reference is there to
check it), it is bound by memory access (random gathers), and it holds a (fence, day, hour)
occupancy cube of the lookback, so a big share is analysed in chunks of whole fences.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.occupancy_reference import (
    DAY_S,
    HOUR_S,
    LOOKBACK_DAYS,
    RANK_SCALE,
    RECENT_DAYS,
    TOP_HOURS,
    TREND_LIMITS,
)

PERCENTILES = (0.5, 0.9)
# The core is bound by memory access (random gathers): ~0.5 us per event up to 1M events,
# twice that at 5M. A bigger partition is analysed in chunks of whole fences, also small
# enough for the chunk's (fence, day, hour) occupancy cube.
CHUNK_EVENTS = 1_000_000
CHUNK_CUBE = 20_000_000


@dataclass(frozen=True)
class Plan:
    """What a core needs besides its rows: the window, and which of the 27 days before it
    were computed (as offsets from its first day, -27 .. -1)."""

    w0: float
    days: int
    computed_before: tuple[int, ...] = ()

    @property
    def first_weekday(self) -> int:
        return dt.datetime.fromtimestamp(self.w0, dt.UTC).isoweekday()



# Input rows (events_sql): the window's events, the objects carried in, and the hourly history
# of the lookback before the window (t = hour offset from the window's start, ts = its mean).
EVENT, CARRIED, HISTORY = 0, 1, 2
# Output rows: one schema for all kinds, so that one pass yields all of them.
HOURLY, OPEN, DAY_EVENTS, BUSIEST, FORECAST = range(5)
CORE_SCHEMA = pa.schema([
    ("kind", pa.int8()), ("fence_id", pa.string()), ("day", pa.int32()), ("hour", pa.int16()),
    ("entries", pa.int32()), ("exits", pa.int32()), ("mean_occupancy", pa.float64()),
    ("peak_occupancy", pa.int32()), ("stays", pa.int32()), ("dwell_p50_s", pa.float64()),
    ("dwell_p90_s", pa.float64()), ("events", pa.int64()), ("object_ids", pa.list_(pa.string())),
    ("weekday", pa.int16()), ("rank", pa.int16()), ("samples", pa.int16()), ("seasonal", pa.float64()),
    ("trend", pa.float64()), ("basis", pa.string()),
])


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """Integer codes of a string column (nulls: 0), and the strings they stand for."""
    encoded = pc.dictionary_encode(column.combine_chunks())
    codes = pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    return codes, encoded.dictionary


def _index(x: np.ndarray, origin: float, step: float) -> np.ndarray:
    """floor((x - origin) / step), exactly: the division's rounding corrected against the
    bounds themselves (whole numbers, so exact)."""
    i = np.floor((x - origin) / step).astype(np.int64)
    i -= x < origin + i * step
    i += x >= origin + (i + 1) * step
    return i


def _rank(*keys: np.ndarray) -> np.ndarray:
    """Each row's rank in the order of keys (first key most significant). One quicksort on
    the first key; only rows tied on it are sorted by the others (ties are rare)."""
    order = np.argsort(keys[0])
    first = keys[0][order]
    tie = first[1:] == first[:-1]
    if tie.any():
        tied = np.zeros(order.size, bool)
        tied[1:] |= tie
        tied[:-1] |= tie
        at = np.flatnonzero(tied)
        run = np.cumsum(~np.r_[False, tie])[at]  # tied runs are contiguous blocks
        sub = order[at]
        order[at] = sub[np.lexsort((*(k[sub] for k in reversed(keys[1:])), run))]
    rank = np.empty(order.size, np.int64)
    rank[order] = np.arange(order.size)
    return rank


def _group_order(group: np.ndarray, n_groups: int, rank: np.ndarray) -> np.ndarray:
    """Rows by (group, rank): one quicksort of a combined key (lexsort if it cannot fit)."""
    if n_groups * max(rank.size, 1) < 2**62:
        return np.argsort(group * rank.size + rank)
    return np.lexsort((rank, group))


def _repeat_ranges(first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ranges first[i] .. first[i] + count[i] - 1: (i, value) of every member."""
    owner = np.repeat(np.arange(first.size), count)
    offset = np.arange(owner.size) - np.repeat(np.cumsum(count) - count, count)
    return owner, first[owner] + offset


def _percentiles(groups: np.ndarray, values: np.ndarray, n: int) -> list[np.ndarray]:
    """Per group 0..n-1 (NaN if empty) the PERCENTILES of its values."""
    v = values[_group_order(groups, n, _rank(values))]
    count = np.bincount(groups, minlength=n)
    start = np.cumsum(count) - count
    some = count > 0
    out = []
    for p in PERCENTILES:
        pos = (count[some] - 1) * p
        lo, hi = np.floor(pos), np.ceil(pos)
        v_lo, v_hi = v[start[some] + lo.astype(np.int64)], v[start[some] + hi.astype(np.int64)]
        r = np.full(n, np.nan)
        r[some] = np.where(lo == hi, v_lo, (hi - pos) * v_lo + (pos - lo) * v_hi)
        out.append(r)
    return out


def core_table(n: int, **columns: Any) -> pa.Table:
    arrays = []
    for field in CORE_SCHEMA:
        value = columns.get(field.name)
        if value is None:
            arrays.append(pa.nulls(n, field.type))
        elif isinstance(value, int | str):
            arrays.append(pa.array([value] * n if isinstance(value, str) else np.full(n, value), field.type))
        elif isinstance(value, pa.Array):
            arrays.append(value.cast(field.type))
        else:
            arrays.append(pa.array(value, field.type, from_pandas=True))  # NaN: null
    return pa.Table.from_arrays(arrays, schema=CORE_SCHEMA)


def analyse(rows: pa.Table, plan: Plan) -> pa.Table:
    """The core rows (CORE_SCHEMA) of the fences in `rows` (events_sql's columns), which hold
    all their events of the window, their objects carried in and their hourly history."""
    w0, n_days = plan.w0, plan.days
    f_all, fence_names = _codes(rows.column("fence_id"))
    kind_all = rows.column("kind").to_numpy()
    hist = kind_all == HISTORY
    ev = np.flatnonzero(~hist)
    hourly, open_rows, day_rows, cube = _sequences(
        rows.take(pa.array(ev)) if hist.any() else rows, f_all[ev], fence_names, w0, n_days)
    h = np.flatnonzero(hist)
    hist_hour = rows.column("t").to_numpy()[h].astype(np.int64)  # from the window's start, < 0
    history = (f_all[h], hist_hour, rows.column("ts").to_numpy()[h])
    busiest, forecast = _seasonal(cube, history, len(fence_names), fence_names, plan)
    return pa.concat_tables([hourly, open_rows, day_rows, busiest, forecast])


def _sequences(events: pa.Table, f_all: np.ndarray, fence_names: pa.Array, w0: float,
               n_days: int) -> tuple[pa.Table, pa.Table, pa.Table, tuple[np.ndarray, np.ndarray]]:
    """Hourly, open and day rows of the events and carried-in objects; and (fence * n_days + day
    of each output day, its 24 hourly means) for the seasonal part."""
    day_bounds = w0 + DAY_S * np.arange(n_days + 1)
    hour_bounds = w0 + HOUR_S * np.arange(24 * n_days + 1)
    w1 = float(day_bounds[-1])
    n_f = len(fence_names)

    o_all, object_names = _codes(events.column("object_id"))
    t_all = events.column("t").to_numpy()
    enter_all = events.column("enter").to_numpy(zero_copy_only=False).astype(bool)
    # sequences in (t, ts, enter first) order; rows equal in all three are interchangeable
    rank = _rank(t_all, events.column("ts").to_numpy(), ~enter_all)
    order = _group_order(f_all * len(object_names) + o_all, n_f * len(object_names), rank)
    f, o, t, enter = f_all[order], o_all[order], t_all[order], enter_all[order]
    carried = events.column("kind").to_numpy()[order] == CARRIED
    n = f.size

    # the state machine of every sequence at once: inside after a row iff it is an enter
    first = np.ones(n, bool)
    first[1:] = (f[1:] != f[:-1]) | (o[1:] != o[:-1])
    inside_before = np.zeros(n, bool)
    inside_before[1:] = enter[:-1]
    inside_before[first] = False
    opens, closes = enter & ~inside_before, ~enter & inside_before
    entries_at = np.flatnonzero(opens & ~carried)
    exits_at = np.flatnonzero(closes)
    turns = np.flatnonzero(opens | closes)  # they alternate within a sequence: open, close, ...
    same_next = np.zeros(turns.size, bool)
    same_next[:-1] = (f[turns[1:]] == f[turns[:-1]]) & (o[turns[1:]] == o[turns[:-1]])
    k_open = np.flatnonzero(opens[turns])
    at = turns[k_open]
    closed = same_next[k_open]
    stay_start = np.where(carried[at], w0, t[at])
    stay_end = np.full(at.size, w1)
    stay_end[closed] = t[turns[k_open[closed] + 1]]

    # each stay cut into its parts, one per day
    d_first = _index(stay_start, w0, DAY_S)
    d_last = np.minimum(_index(stay_end, w0, DAY_S), n_days - 1)
    stay, day = _repeat_ranges(d_first, d_last - d_first + 1)
    p_start = np.maximum(stay_start[stay], day_bounds[day])
    p_end = np.minimum(stay_end[stay], day_bounds[day + 1])
    p_fence = f[at][stay]
    still_inside = stay_end[stay] >= day_bounds[day + 1]

    # output rows: the 24 hours of every (fence, day) with an event or a part
    real = np.flatnonzero(~carried)
    ev_hour = _index(t[real], w0, HOUR_S)
    slot = np.zeros(n_f * n_days, np.int64)
    slot[f[real] * n_days + ev_hour // 24] = 1
    slot[p_fence * n_days + day] = 1
    fd = np.flatnonzero(slot)
    slot[fd] = np.arange(fd.size)
    n_rows = fd.size * 24

    def row(fence: np.ndarray, hour: np.ndarray) -> np.ndarray:  # hour: of the window
        found: np.ndarray = slot[fence * n_days + hour // 24] * 24 + hour % 24
        return found

    hour_at = np.full(n, -1)
    hour_at[real] = ev_hour
    entries = np.bincount(row(f[entries_at], hour_at[entries_at]), minlength=n_rows)
    exits = np.bincount(row(f[exits_at], hour_at[exits_at]), minlength=n_rows)
    p_row = row(p_fence, _index(p_start, w0, HOUR_S))
    stays = np.bincount(p_row, minlength=n_rows)
    p50, p90 = _percentiles(p_row, p_end - p_start, n_rows)

    # mean: each part's overlap with each hour it reaches into
    pos = p_end > p_start
    a, b, pf = p_start[pos], p_end[pos], p_fence[pos]
    h_first, h_last = _index(a, w0, HOUR_S), _index(b, w0, HOUR_S)
    h_last -= b == hour_bounds[h_last]
    piece, h = _repeat_ranges(h_first, h_last - h_first + 1)
    overlap = np.minimum(b[piece], hour_bounds[h + 1]) - np.maximum(a[piece], hour_bounds[h])
    mean = np.bincount(row(pf[piece], h), weights=overlap, minlength=n_rows) / HOUR_S

    # peak: per fence in time order, +1 where a part begins, -1 where it ends and a probe at
    # each row's hour start; the occupancy after an instant is the running sum at the last
    # point of that instant, and an hour's peak the most of these within it (the probe
    # stands for the level already reached at the hour's start)
    probe_t = hour_bounds[(fd % n_days)[:, None] * 24 + np.arange(24)].ravel()
    pt = np.concatenate([a, b, probe_t])
    pfence = np.concatenate([pf, pf, np.repeat(fd // n_days, 24)])
    delta = np.concatenate([np.ones(a.size, np.int64), np.full(b.size, -1), np.zeros(n_rows, np.int64)])
    sweep = _group_order(pfence, n_f, _rank(pt))
    pt, pfence = pt[sweep], pfence[sweep]
    level = np.cumsum(delta[sweep])  # each fence's deltas sum to zero: no reset needed
    last = np.ones(pt.size, bool)
    last[:-1] = (pt[1:] != pt[:-1]) | (pfence[1:] != pfence[:-1])
    last &= pt < w1  # ends at the window's end belong to no row
    peak = np.zeros(n_rows, np.int64)
    np.maximum.at(peak, row(pfence[last], _index(pt[last], w0, HOUR_S)), level[last])

    hourly = core_table(n_rows, kind=HOURLY, fence_id=fence_names.take(pa.array(np.repeat(fd // n_days, 24))),
                        day=np.repeat(fd % n_days, 24), hour=np.tile(np.arange(24), fd.size),
                        entries=entries, exits=exits, mean_occupancy=mean, peak_occupancy=peak, stays=stays,
                        dwell_p50_s=p50, dwell_p90_s=p90)

    # who is inside at each day's end: one list of object ids per (fence, day)
    still = np.flatnonzero(still_inside)
    names = object_names.take(pa.array(o[at][stay][still]))
    keyed = pa.table({"fd": p_fence[still] * n_days + day[still], "name": names})
    keyed = keyed.take(pc.sort_indices(keyed, [("fd", "ascending"), ("name", "ascending")]))
    open_fd = keyed.column("fd").to_numpy()
    group = np.flatnonzero(np.r_[True, open_fd[1:] != open_fd[:-1]]) if open_fd.size else open_fd
    offsets = pa.array(np.r_[group, open_fd.size].astype(np.int32))
    lists = pa.ListArray.from_arrays(offsets, keyed.column("name").combine_chunks())
    open_rows = core_table(group.size, kind=OPEN,
                           fence_id=fence_names.take(pa.array(open_fd[group] // n_days)),
                           day=open_fd[group] % n_days, object_ids=lists)
    day_rows = core_table(n_days, kind=DAY_EVENTS, day=np.arange(n_days),
                          events=np.bincount(ev_hour // 24, minlength=n_days))
    return hourly, open_rows, day_rows, (fd, mean.reshape(-1, 24))


def _seasonal(cube: tuple[np.ndarray, np.ndarray], history: tuple[np.ndarray, np.ndarray, np.ndarray],
              n_f: int, fence_names: pa.Array, plan: Plan) -> tuple[pa.Table, pa.Table]:
    """Busiest and forecast rows as of each day of the window, from the hourly means of the
    window (cube) and of the computed days before it (history: fence, hour offset, mean)."""
    n_days, back = plan.days, LOOKBACK_DAYS - 1
    span = back + n_days  # day j of the arrays is the window's day j - back
    occ = np.zeros((n_f, span, 24))
    present = np.zeros((n_f, span), bool)
    h_fence, h_hour, h_mean = history
    occ[h_fence, back + h_hour // 24, h_hour % 24] = h_mean
    present[h_fence, back + h_hour // 24] = True
    fd, means = cube
    occ[fd // n_days, back + fd % n_days] = means
    present[fd // n_days, back + fd % n_days] = True
    computed = np.zeros(span, bool)
    computed[back + np.array(plan.computed_before, np.int64)] = True
    computed[back:] = True
    weekday = (plan.first_weekday - 1 + np.arange(span) - back) % 7 + 1
    hours = np.arange(24)

    busiest, forecast = [], []
    for k in range(n_days):
        a = back + k
        days = np.arange(k, a + 1)[computed[k:a + 1]]
        scope = np.flatnonzero(present[:, days].any(axis=1))
        if not scope.size:
            continue
        occ_s = occ[scope][:, days]  # (fence, day, hour)
        names = fence_names.take(pa.array(scope))
        for w in range(1, 8):
            same = weekday[days] == w
            if not same.any():
                continue
            m = occ_s[:, same].sum(axis=1) / same.sum()
            # most first, then the earlier hour (whole numbers below 2**53, so exact); none last
            key = np.where(m > 0, -np.floor(m * RANK_SCALE + 0.5) * 32 + hours, np.inf)
            order = np.argsort(key, axis=1)[:, :TOP_HOURS]
            top = np.take_along_axis(m, order, axis=1)
            i, r = np.nonzero(top > 0)
            busiest.append(core_table(i.size, kind=BUSIEST, fence_id=names.take(pa.array(i)), day=k,
                                      weekday=w, rank=r + 1, hour=order[i, r], mean_occupancy=top[i, r],
                                      samples=int(same.sum())))
        level = occ_s.mean(axis=(1, 2))
        recent = days > a - RECENT_DAYS
        level_recent = occ_s[:, recent].mean(axis=(1, 2))
        ratio = np.divide(level_recent, level, out=np.ones_like(level), where=level > 0)
        trend = np.where(level > 0, np.clip(ratio, *TREND_LIMITS), 1.0)
        same = weekday[days] == weekday[a] % 7 + 1
        basis, base = ("weekday", occ_s[:, same]) if same.any() else ("hour", occ_s)
        seasonal = base.mean(axis=1)
        forecast.append(core_table(seasonal.size, kind=FORECAST, fence_id=names.take(pa.array(
            np.repeat(np.arange(scope.size), 24))), day=k + 1, hour=np.tile(hours, scope.size),
            mean_occupancy=(seasonal * trend[:, None]).ravel(), seasonal=seasonal.ravel(),
            trend=np.repeat(trend, 24), basis=basis, samples=int(base.shape[1])))
    return (pa.concat_tables(busiest) if busiest else core_table(0),
            pa.concat_tables(forecast) if forecast else core_table(0))


def fence_chunks(rows: pa.Table, plan: Plan, events: int = CHUNK_EVENTS) -> Iterator[pa.Table]:
    """`rows` in parts of whole fences, of about `events` rows and a cube of CHUNK_CUBE."""
    codes, names = _codes(rows.column("fence_id"))
    cube = len(names) * (LOOKBACK_DAYS - 1 + plan.days) * 24
    k = max(-(-rows.num_rows // events), -(-cube // CHUNK_CUBE))
    if k <= 1:
        yield rows
        return
    chunk = codes % k
    order = np.argsort(chunk, kind="stable")
    bounds = np.searchsorted(chunk[order], np.arange(k + 1))
    for lo, hi in itertools.pairwise(bounds.tolist()):
        if hi > lo:
            yield rows.take(pa.array(order[lo:hi]))
