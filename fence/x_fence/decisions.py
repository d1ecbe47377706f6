"""ENTER and LEAVE from a batch: positions (one observation per object: a set difference;
any other: runs of numbered observations) and re-check rows after a fence change."""

from __future__ import annotations

import numpy as np

from exchanges.fence_events import (
    ENTERED,
    EXITED,
    FENCE_CHANGED,
    Event,
)
from exchanges.object_codes import distinct
from exchanges.worker_batch import WorkerBatch
from fence.x_fence import event_positions
from fence.x_fence.judging import Judging
from fence.x_fence.observations import Observations, Pairs, pair_order
from fence.x_fence.table import _LOW, _SHIFT, F64, I64, WALLED, ttls


class Decisions(Judging):
    """ENTER and LEAVE from a batch of positions or re-check rows (see fence/x_fence/core.py)."""

    def _route(self, wb: WorkerBatch, codes: I64) -> list[Event]:
        """Ordinary rows and re-check rows, in row order (each object's rows are in order);
        each event with the position it was decided from (event_positions.py)."""
        events = self._route_rows(wb, codes)
        event_positions.attach(events, wb)
        return events

    def _route_rows(self, wb: WorkerBatch, codes: I64) -> list[Event]:
        rc = wb.recheck
        if rc is None or not (rc >= 0).any():
            return self._route_positions(wb, codes)
        is_rc = rc >= 0
        cuts = np.flatnonzero(is_rc[1:] != is_rc[:-1]) + 1
        events: list[Event] = []
        for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, is_rc.size].tolist(), strict=True):
            part = wb if (lo, hi) == (0, is_rc.size) else wb.take(np.arange(lo, hi))
            apply = self._apply_rechecks if is_rc[lo] else self._route_positions
            events += apply(part, codes[lo:hi])
        return events

    def _apply_rechecks(self, wb: WorkerBatch, codes: I64) -> list[Event]:
        """Re-check rows (every row one): each decides its object against the current
        version of its fence (see the module's docstring, "Fence changes"). A row for a
        version this worker no longer has (replaced again, or deleted) is superseded: the
        newer change brings its own. A row older than the object's last known position is
        stale, as any position."""
        n = len(wb.positions)
        ts = wb.positions.ts
        code_of = np.fromiter((self._fence_code.get(f, -1) for f in wb.fences), np.int64, len(wb.fences))
        rc = wb.rechecks()
        f = code_of[rc]
        ok = f >= 0
        ok[ok] = wb.fence_versions()[rc[ok]] == self._version_of[f[ok]]
        self.rechecks_superseded += int(n - np.count_nonzero(ok))
        fresh_row = ok & (ts >= self._last_ts[codes])
        self.stale_positions += int(np.count_nonzero(ok & ~fresh_row))
        rows = np.flatnonzero(fresh_row)
        if not rows.size:
            return []
        self.rechecks += int(rows.size)
        # one decision per (object, fence): the latest row (two regions may both have had it)
        key = (codes[rows].astype(np.uint64) << _SHIFT) | f[rows].astype(np.uint64)
        order = np.lexsort((ts[rows], key))
        rows, key = rows[order], key[order]
        last = np.r_[key[1:] != key[:-1], True]
        rows, key = rows[last], key[last]
        obj, fc, t = codes[rows], f[rows], ts[rows]
        newer = t > self._last_ts[obj]  # a position this worker was not sent
        self._last_ts[obj[newer]] = t[newer]
        self._last_lon[obj[newer]] = wb.positions.lon[rows[newer]]
        self._last_lat[obj[newer]] = wb.positions.lat[rows[newer]]
        self._dirty_objs.append(obj)
        # the row's candidate: the fence's new ranges hold it (and it is the object's tenant's)
        inside = (np.diff(wb.ptr)[rows] > 0) & self._sees(obj, fc)
        row_interior = wb.interior[np.minimum(wb.ptr[rows], wb.interior.size - 1)] if wb.interior.size \
            else np.zeros(rows.size, bool)
        at = np.searchsorted(self._keys, key)
        there = at < self._keys.size
        there[there] = self._keys[at[there]] == key[there]
        w = np.flatnonzero(inside & self._refusing[fc])
        if w.size:  # an option refuses it (a filter, ...): it is outside
            inside[w] = self._passes(fc[w], rows[w], wb.positions)
        band = self._opt["hysteresis_m"][fc] > 0
        exact = np.flatnonzero(inside & ~row_interior & ~band)
        if exact.size:
            inside[exact] = self._contains(fc[exact], wb.positions.lon[rows[exact]],
                                           wb.positions.lat[rows[exact]])
        h = np.flatnonzero(inside & band)
        if h.size:  # a band: inside if past it inward, or within it and inside before
            zone = self._zones(fc[h], wb.positions.lon[rows[h]], wb.positions.lat[rows[h]])
            inside[h] = (zone == 2) | ((zone == 1) & there[h])
        # an object silent longer than the timeout before the change is not entered (one
        # inside stays, if the new geometry holds it, until the timer LEAVEs it)
        enter = inside & ~there & (t >= self._changed_at[fc] - self._opt["timeout_s"][fc])
        leave = ~inside & there
        shown_in, shown_out, dwelled = enter, leave, np.empty(0, np.int64)
        if self._dwell_on():
            shown_in, shown_out = enter.copy(), leave.copy()
            e, lv, stay = np.flatnonzero(enter), np.flatnonzero(leave), np.flatnonzero(inside & there)
            keep_in, keep_out = self._dwell_filter(key[e], key[lv])
            shown_in[e[~keep_in]] = False
            shown_out[lv[~keep_out]] = False
            dwelled = stay[self._dwelled(key[stay], t[stay], self._since[at[stay]])]
        created = self._created[fc]
        new_in, changed_in = shown_in & created, shown_in & ~created
        n_in, n_out = int(new_in.sum()), int(shown_out.sum())
        kinds = np.r_[np.zeros(n_in, np.int8), np.ones(n_out, np.int8), np.full(dwelled.size, 2, np.int8)]
        events = self._events(kinds,
                              np.r_[fc[new_in], fc[shown_out], fc[dwelled]],
                              np.r_[obj[new_in], obj[shown_out], obj[dwelled]],
                              np.r_[t[new_in], t[shown_out], t[dwelled]], (ENTERED, FENCE_CHANGED),
                              dated=True, since=np.r_[np.full(n_in, np.nan), self._since[at[shown_out]],
                                                      self._since[at[dwelled]]])
        if changed_in.any():
            events += self._events(np.zeros(int(changed_in.sum()), np.int8), fc[changed_in], obj[changed_in],
                                   t[changed_in], (FENCE_CHANGED, FENCE_CHANGED), dated=True)
            events.sort(key=lambda e: (e.ts, e.object_id, e.fence_id, e.event))
        self._replace_sorted(at[leave], key[enter], np.maximum(t[enter], self._changed_at[fc[enter]]))
        return events

    def _route_positions(self, wb: WorkerBatch, codes: I64) -> list[Event]:
        pos = wb.positions
        if len(pos) == 0:
            return []
        if wb.notice is not None and wb.notice.any():  # the region it came from is done with it
            np.maximum.at(self._ho_ts, codes[wb.notice], pos.ts[wb.notice])
            self._dirty_objs.append(codes[wb.notice])
            keep = np.flatnonzero(~wb.notice)  # a notice opens gates, and says nothing more
            wb, codes = wb.take(keep), codes[keep]
            pos = wb.positions
            if len(pos) == 0:
                return []
        obs = self._observations(codes, pos.ts)
        self._dirty_objs.append(obs.objs)
        cands = self._candidates(wb, codes)
        crossed = self._crossed(wb, obs, codes, *cands) if wb.prev is not None else []
        c_pos, c_fence, b_pos, b_fence = self._inside(wb, obs, *cands)
        if obs.objs.size == 0:
            return crossed
        stored_at = self._stored_pairs(obs.objs)
        if b_pos.size:  # hysteresis: band positions inside where the state before them was
            kept = self._band(obs, stored_at, c_pos, c_fence, b_pos, b_fence)
            c_pos, c_fence = np.r_[c_pos, b_pos[kept]], np.r_[c_fence, b_fence[kept]]
        if obs.single and self.single_observation_path:
            events = self._apply_single(obs, stored_at, c_pos, c_fence)
        else:
            events = self._apply_runs(obs, stored_at, c_pos, c_fence)
        self._last_ts[obs.objs] = pos.ts[obs.last]
        self._last_lon[obs.objs] = pos.lon[obs.last]
        self._last_lat[obs.objs] = pos.lat[obs.last]
        self._ttl[obs.objs] = ttls(pos.extra, obs.last)
        if crossed:
            events = sorted(events + crossed, key=lambda e: (e.ts, e.object_id, e.fence_id, e.event))
        return events

    def _candidates(self, wb: WorkerBatch, codes: I64) -> tuple[I64, I64]:
        """Each candidate's position row and fence code, in the batch's candidate order (its
        per-candidate columns, interior flags and versions, line up with them): -1 a fence not
        defined here, WALLED a fence of another tenant than the position's object (the tenant
        wall, exchanges/tenancy.py: never inside, never a CROSS)."""
        c_pos = np.repeat(np.arange(len(wb.positions)), np.diff(wb.ptr))
        if not wb.fences:
            return c_pos, np.empty(0, np.int64)
        code = self._fence_code.get
        fmap = np.fromiter((code(f, -1) for f in wb.fences), np.int64, len(wb.fences))
        c_fence = fmap[wb.cand]
        wall = (c_fence >= 0) & ~self._sees(codes[c_pos], np.maximum(c_fence, 0))
        if wall.any():
            c_fence[wall] = WALLED
            self.walled_candidates += int(np.count_nonzero(wall))
        return c_pos, c_fence

    # The common batch (each object once, newer than what is stored) is a set difference
    # per object; any other is numbered observations and runs. Both give the same result:
    # the flag lets the tests run the general path on every batch.
    single_observation_path = True

    def _apply_single(self, obs: Observations, stored_at: I64, c_pos: I64, c_fence: I64) -> list[Event]:
        """One new observation per object: ENTER what it is in and was not, LEAVE the reverse."""
        new = (obs.objs[obs.pos_group[c_pos]].astype(np.uint64) << _SHIFT) | c_fence.astype(np.uint64)
        new.sort()
        if new.size > 1 and (new[1:] == new[:-1]).any():  # said twice (e.g. two regions)
            new = np.unique(new)
        old = self._keys[stored_at]
        j = np.minimum(np.searchsorted(old, new), max(old.size - 1, 0))
        stays = old[j] == new if old.size else np.zeros(new.size, bool)
        kept = np.zeros(old.size, bool)
        kept[j[stays]] = True
        entering, leaving = new[~stays], old[~kept]
        group_in = np.searchsorted(obs.objs, (entering >> _SHIFT).astype(np.int64))
        since = np.empty(new.size)
        since[stays] = self._since[stored_at[j[stays]]]
        since[~stays] = np.maximum(obs.obs_ts[group_in], self._changed_at[(entering & _LOW).astype(np.int64)])
        left_since = self._since[stored_at[~kept]]
        dwelled, d_since = np.empty(0, np.uint64), np.empty(0)
        if self._dwell_on():
            keep_in, keep_out = self._dwell_filter(entering, leaving)
            entering, group_in = entering[keep_in], group_in[keep_in]
            leaving, left_since = leaving[keep_out], left_since[keep_out]
            dwelled, d_since = new[stays], since[stays]
            group_d = np.searchsorted(obs.objs, (dwelled >> _SHIFT).astype(np.int64))
            reached = self._dwelled(dwelled, obs.obs_ts[group_d], d_since)
            dwelled, d_since, group_d = dwelled[reached], d_since[reached], group_d[reached]
        else:
            group_d = np.empty(0, np.int64)
        group_out = np.searchsorted(obs.objs, (leaving >> _SHIFT).astype(np.int64))
        groups = np.r_[group_in, group_out, group_d]
        events = self._events(
            np.r_[np.zeros(entering.size, np.int8), np.ones(leaving.size, np.int8),
                  np.full(dwelled.size, 2, np.int8)],
            np.r_[entering & _LOW, leaving & _LOW, dwelled & _LOW].astype(np.int64),
            obs.objs[groups],
            obs.obs_ts[groups],  # the one observation of each object
            (ENTERED, EXITED), dated=True,
            since=np.r_[np.full(entering.size, np.nan), left_since, d_since],
        )
        self._replace_sorted(stored_at, new, since)
        return events

    def _apply_runs(self, obs: Observations, stored_at: I64, c_pos: I64, c_fence: I64) -> list[Event]:
        """Any batch: a run of consecutive observation numbers of one (object, fence) is a
        stay inside; a run starting after number 0 is an ENTER, one ending before the
        object's last observation a LEAVE."""
        pairs = self._pairs(obs, stored_at, c_pos, c_fence)
        enter = pairs.run_start & ((pairs.seq > 0) | ~pairs.stored)
        leave = pairs.run_end & (pairs.seq < obs.k[pairs.group])
        final = pairs.run_end & (pairs.seq == obs.k[pairs.group])
        # each run's stay began at its first entry: the stored since, or that observation
        run_start = pairs.run_start[: pairs.group.size]  # (no pairs: one spurious start)
        run_of = np.cumsum(run_start) - 1
        starts = np.flatnonzero(run_start)
        run_since = pairs.since[starts]
        fresh = ~pairs.stored[starts]
        run_since[fresh] = np.maximum(obs.ts_of(pairs.group[starts[fresh]], pairs.seq[starts[fresh]]),
                                      self._changed_at[pairs.fence[starts[fresh]]])
        e_in, e_out, e_d = np.flatnonzero(enter), np.flatnonzero(leave), np.empty(0, np.int64)
        f_at = np.flatnonzero(final)
        # final state: the runs reaching the object's last observation, since their first
        new_keys = ((obs.objs[pairs.group[f_at]].astype(np.uint64) << _SHIFT)
                    | pairs.fence[f_at].astype(np.uint64))
        if self._dwell_on():  # per run: confirmed at its start, or at its first observation past the dwell
            r_fence = pairs.fence[starts]
            r_key = (obs.objs[pairs.group[starts]].astype(np.uint64) << _SHIFT) | r_fence.astype(np.uint64)
            d = self._opt["dwell_s"][r_fence]
            waiting = np.where(pairs.stored[starts], self._unconfirmed_of(r_key), d > 0)
            cand = np.flatnonzero(waiting[run_of] & (pairs.seq >= 1))
            lasted = obs.ts_of(pairs.group[cand], pairs.seq[cand]) - run_since[run_of[cand]]
            cand = cand[lasted >= d[run_of[cand]]]
            e_d = cand[np.r_[True, run_of[cand][1:] != run_of[cand][:-1]]] if cand.size else cand
            confirmed = ~waiting
            confirmed[run_of[e_d]] = True
            e_in = e_in[~waiting[run_of[e_in]]]  # (an ENTER starts a fresh run: waiting iff a dwell)
            e_out = e_out[confirmed[run_of[e_out]]]
            self._unconfirm(self._keys[stored_at], new_keys[~confirmed[run_of[f_at]]])
        at = np.r_[e_in, e_out, e_d]
        events = self._events(
            np.r_[np.zeros(e_in.size, np.int8), np.ones(e_out.size, np.int8), np.full(e_d.size, 2, np.int8)],
            pairs.fence[at], obs.objs[pairs.group[at]],
            obs.ts_of(pairs.group[at], pairs.seq[at] + np.r_[np.zeros(e_in.size, np.int64),
                                                          np.ones(e_out.size, np.int64),
                                                          np.zeros(e_d.size, np.int64)]),
            (ENTERED, EXITED), dated=True,
            since=np.r_[np.full(e_in.size, np.nan), run_since[run_of[e_out]], run_since[run_of[e_d]]],
        )
        self._replace_sorted(stored_at, new_keys, run_since[run_of[f_at]])
        return events

    def _observations(self, obj: I64, ts: F64) -> Observations:
        """Number each object's fresh observations 1..k after its stored state (number 0);
        an observation at the last known ts is number 0 itself."""
        n = obj.size
        if distinct(obj, len(self._objects)):
            order = np.argsort(obj)
            if (ts[order] > self._last_ts[obj[order]]).all():
                return Observations.single_of(obj, ts, order)
        else:
            order = np.lexsort((ts, obj))
        fresh = ts[order] >= self._last_ts[obj[order]]
        if not fresh.all():
            self.stale_positions += int(n - np.count_nonzero(fresh))
            order = order[fresh]
        o, t = obj[order], ts[order]
        m = o.size
        if m == 0:
            none = np.full(n, -1, np.int64)
            return Observations(*(np.empty(0, np.int64),) * 3, np.empty(0), np.empty(0, np.int64),
                                 none, none)
        new_obj = np.ones(m, bool)
        new_obj[1:] = o[1:] != o[:-1]
        new_obs = new_obj.copy()
        new_obs[1:] |= t[1:] != t[:-1]
        group = np.cumsum(new_obj) - 1
        obs_idx = np.cumsum(new_obs) - 1
        starts = np.flatnonzero(new_obj)
        ends = np.r_[starts[1:] - 1, m - 1]
        objs = o[starts]
        base = obs_idx[starts] - (t[starts] > self._last_ts[objs])
        seq = obs_idx - base[group]
        pos_group = np.full(n, -1, np.int64)
        pos_seq = np.full(n, -1, np.int64)
        pos_group[order] = group
        pos_seq[order] = seq
        return Observations(objs, seq[ends], base, t[new_obs], order[ends], pos_group, pos_seq,
                             single=bool((seq == 1).all()))

    def _pairs(self, obs: Observations, stored_at: I64, c_pos: I64, c_fence: I64) -> Pairs:
        """The stored pairs of the batch's objects (number 0) and the inside candidates,
        sorted by (object, fence, number), one entry per (object, fence, observation)."""
        objs = obs.objs
        n_stored = stored_at.size
        s_keys = self._keys[stored_at]
        s_group = np.searchsorted(objs, (s_keys >> _SHIFT).astype(np.int64))
        group = np.r_[s_group, obs.pos_group[c_pos]]
        fence = np.r_[(s_keys & _LOW).astype(np.int64), c_fence]
        seq = np.r_[np.zeros(n_stored, np.int64), obs.pos_seq[c_pos]]
        order = pair_order(group, fence, seq, n_stored, objs.size, len(self._fences),
                            int(obs.k.max()) + 1)
        group, fence, seq = group[order], fence[order], seq[order]
        stored = order < n_stored
        since = self._since[stored_at[np.minimum(order, n_stored - 1)]] if n_stored else np.zeros(order.size)
        same_pair = (group[1:] == group[:-1]) & (fence[1:] == fence[:-1])
        dup = same_pair & (seq[1:] == seq[:-1])
        if dup.any():  # one observation said twice (or at the stored ts): keep the first
            keep = np.r_[True, ~dup]
            group, fence, seq, stored, since = group[keep], fence[keep], seq[keep], stored[keep], since[keep]
            same_pair = (group[1:] == group[:-1]) & (fence[1:] == fence[:-1])
        cont = same_pair & (seq[1:] == seq[:-1] + 1)
        return Pairs(group, fence, seq, stored, since, np.r_[True, ~cont], np.r_[~cont, True])
