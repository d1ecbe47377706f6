"""Whether a candidate position is inside its fence: the exact polygon test (in C, shapely
where C is unsure), a fence's filter, its hysteresis band, its dwell time, and CROSS."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import shapely

from exchanges.batch import PositionBatch
from exchanges.fence_events import (
    ENTERED,
    EXITED,
    Event,
)
from exchanges.fence_options import REFUSING, band, dwell, refusing
from exchanges.fence_options.band import hysteresis_zones
from exchanges.fence_options.cross import crosses
from exchanges.worker_batch import WorkerBatch
from fence.x_fence.observations import Observations
from fence.x_fence.table import _LOW, _SHIFT, F64, I64, FenceTable
from hilbert_c import kernel


class Judging(FenceTable):
    """Whether a position is inside a fence: the exact test, a band, a filter, a crossing."""

    def _inside(self, wb: WorkerBatch, obs: Observations, c_pos: I64, c_fence: I64
                ) -> tuple[I64, I64, I64, I64]:
        """Candidate (position, fence code) pairs of fresh positions that pass the exact
        test (skipped on interior blocks), and those in a fence's hysteresis band (decided
        by `_band`); candidates of unknown fences are counted, dropped. A candidate x-geo
        routed with the version of its fence replaced last (a region that had not applied the
        change yet) is judged as that version: its filter, its band or its geometry (its
        interior flags hold for it); one routed with any other version than the current, by
        the current version exactly."""
        keep = c_fence >= 0  # neither unknown here nor another tenant's (WALLED)
        self.unknown_fence_candidates += int(np.count_nonzero(c_fence == -1))
        none = np.empty(0, np.int64)
        if not c_fence.size:
            return c_pos, c_fence, none, none
        keep &= obs.pos_seq[c_pos] >= 0  # stale positions have no observation
        f = np.maximum(c_fence, 0)
        interior = wb.interior
        old = np.zeros(c_fence.size, bool)  # judged as the version replaced last
        if wb.versions is not None:  # candidates routed with another version than defined here
            said = wb.versions[wb.cand]
            other = np.flatnonzero(keep & (said != 0) & (said != self._version_of[f]))
            if other.size:
                kept = self._prev
                old[other] = np.fromiter((c in kept and kept[c].version == v for c, v in
                                          zip(c_fence[other].tolist(), said[other].tolist(), strict=True)),
                                         bool, other.size)
                interior = interior.copy()
                interior[other[~old[other]]] = False  # blocks of a version gone: the current one, exactly
        o = np.flatnonzero(keep & old)
        prev = [self._prev[c] for c in c_fence[o].tolist()]
        filtered = self._refusing[f] & ~old
        filtered[o] = [bool(refusing(d)) for d in prev]
        w = np.flatnonzero(keep & filtered)
        if w.size:  # an option refuses the position (a filter, ...): it is outside (past any band)
            keep[w] = self._passes(c_fence[w], c_pos[w], wb.positions, old[w])
        banded = (self._opt["hysteresis_m"][f] > 0) & ~old
        banded[o] = [d.hysteresis_m > 0 for d in prev]
        banded &= keep
        b_pos, b_fence = none, none
        if banded.any():  # judged by zone (x-geo covers the grown fence)
            at = np.flatnonzero(banded)
            zone = self._zones(c_fence[at], wb.positions.lon[c_pos[at]], wb.positions.lat[c_pos[at]], old[at])
            keep[at] = zone == 2
            b_pos, b_fence = c_pos[at[zone == 1]], c_fence[at[zone == 1]]
        exact = keep & ~interior & ~banded
        at = np.flatnonzero(exact & ~old)
        if at.size:
            keep[at] = self._contains(c_fence[at], wb.positions.lon[c_pos[at]], wb.positions.lat[c_pos[at]])
        at = np.flatnonzero(exact & old)
        if at.size:  # rare: only positions in flight across a change
            geoms = np.array([self._prev[c].geometry for c in c_fence[at].tolist()], dtype=object)
            keep[at] = shapely.contains_xy(geoms, wb.positions.lon[c_pos[at]], wb.positions.lat[c_pos[at]])
        return c_pos[keep], c_fence[keep], b_pos, b_fence

    def _passes(self, fences: I64, rows: I64, positions: PositionBatch,
                old: npt.NDArray[np.bool_] | None = None) -> npt.NDArray[np.bool_]:
        """Per (fence with a refusing option, position row): whether no option of the fence
        refuses the row (exchanges/fence_options/: its filter, its expiry, ...), judged at the
        time its event would carry (the position's, or the fence's change time when later: a
        change after an expiry enters no one). An option judged by its column alone (an expiry)
        is one array operation for every candidate; one judged by its value (a filter's
        clauses), one call per fence of the batch. `old`: by the version replaced last."""
        was = old if old is not None else np.zeros(fences.size, bool)
        when = np.maximum(positions.ts[rows], self._changed_at[fences])
        out = np.ones(fences.size, bool)
        for option in REFUSING:
            column = self._opt[option.key][fences]
            if was.any():  # rare: positions in flight across a change
                column = column.copy()
                for i in np.flatnonzero(was).tolist():
                    column[i] = option.column(getattr(self._prev[int(fences[i])], option.key))
            on = np.flatnonzero(column != option.column(option.default))
            if not on.size:
                continue
            if option.by_column:
                out[on] &= ~option.outside(column[on], when[on], ())
                continue
            groups, of = np.unique(fences[on] * 2 + was[on], return_inverse=True)
            order = np.argsort(of, kind="stable")
            bounds = np.searchsorted(of[order], np.arange(groups.size + 1))
            extra = positions.extra
            for g, key in enumerate(groups.tolist()):
                at = on[order[bounds[g]:bounds[g + 1]]]
                fence = self._prev[key // 2] if key % 2 else self._fences[key // 2]
                assert fence is not None
                fields = [extra[r] if extra else None for r in rows[at].tolist()]
                out[at] &= ~option.outside(getattr(fence, option.key), when[at], fields)
        return out

    def _zones(self, fences: I64, x: F64, y: F64, old: npt.NDArray[np.bool_] | None = None
               ) -> npt.NDArray[np.int8]:
        """Per (fence with a band, point): 2 past the band inward (in `inner`), 1 within the
        band, 0 past it outward (not in `outer`); `old`: by the version replaced last."""
        inner, outer = self._inner[fences], self._outer[fences]
        if old is not None and old.any():
            inner, outer = inner.copy(), outer.copy()
            for i in np.flatnonzero(old).tolist():
                d = self._prev[int(fences[i])]
                inner[i], outer[i] = hysteresis_zones(d.geometry, d.hysteresis_m)
        return band.zones(inner, outer, x, y)

    def _band(self, obs: Observations, stored_at: I64, c_pos: I64, c_fence: I64, b_pos: I64,
              b_fence: I64) -> npt.NDArray[np.bool_]:
        """Which band candidates are inside: those whose object was inside the fence at its
        observation before, through a chain of consecutive observations within the band back
        to one past it inward or to the stored state (number 0). An observation with no
        candidate for the fence was past the band outward (x-geo covers the grown fence)."""
        s_keys = self._keys[stored_at]
        s_fence = (s_keys & _LOW).astype(np.int64)
        s = np.flatnonzero(np.isin(s_fence, b_fence))  # the anchors of the fences with band candidates
        i = np.flatnonzero(np.isin(c_fence, b_fence))
        group = np.r_[np.searchsorted(obs.objs, (s_keys[s] >> _SHIFT).astype(np.int64)),
                      obs.pos_group[c_pos[i]], obs.pos_group[b_pos]]
        fence = np.r_[s_fence[s], c_fence[i], b_fence]
        seq = np.r_[np.zeros(s.size, np.int64), obs.pos_seq[c_pos[i]], obs.pos_seq[b_pos]]
        anchor = np.r_[np.ones(s.size + i.size, bool), np.zeros(b_pos.size, bool)]
        order = np.lexsort((~anchor, seq, fence, group))  # an observation said twice: anchor first
        g, f, q, a = group[order], fence[order], seq[order], anchor[order]
        same = np.r_[False, (g[1:] == g[:-1]) & (f[1:] == f[:-1])]
        start = ~(same & ((q - np.r_[0, q[:-1]]) <= 1))  # a new chain of consecutive observations
        chain = np.cumsum(start) - 1
        anchors = np.cumsum(a)
        before = np.r_[0, anchors][np.flatnonzero(start)][chain]  # anchors before each chain began
        inside = anchors - before > 0
        out = np.zeros(b_pos.size, bool)
        mine = order >= s.size + i.size
        out[order[mine] - s.size - i.size] = inside[mine]
        return out

    def _contains(self, fences: I64, x: F64, y: F64) -> npt.NDArray[np.bool_]:
        """shapely.contains_xy(fence, x, y) elementwise: in C, and by shapely where C is unsure."""
        verdict = self._edges.locate(fences, x, y)
        unsure = np.flatnonzero(verdict == kernel.PIP_UNSURE)
        if unsure.size:
            verdict[unsure] = shapely.contains_xy(self._geoms[fences[unsure]], x[unsure], y[unsure])
        out: npt.NDArray[np.bool_] = verdict == kernel.PIP_IN
        return out

    def _crossed(self, wb: WorkerBatch, obs: Observations, codes: I64, c_pos: I64, c_fence: I64
                 ) -> list[Event]:
        """CROSS events of the batch (see the module's docstring, "Cross"): per fresh position
        and candidate fence that detects CROSS, with the position before it known."""
        cross = self._opt["cross"] > 0
        if not c_fence.size or not cross.any():
            return []
        prev = wb.previous()
        at = np.flatnonzero((c_fence >= 0) & cross[np.maximum(c_fence, 0)] & (obs.pos_seq[c_pos] >= 1)
                            & np.isfinite(prev[c_pos, 0]))
        if not at.size:
            return []
        _, once = np.unique(c_pos[at] * len(self._fences) + c_fence[at], return_index=True)  # (two regions)
        p, f = c_pos[at[once]], c_fence[at[once]]
        x, y = wb.positions.lon[p], wb.positions.lat[p]
        hit = crosses(self._geoms[f], prev[p, 0], prev[p, 1], x, y)
        w = np.flatnonzero(hit & self._refusing[f])
        if w.size:  # the fence's refusals (its filter, ...) of the second position, as for ENTER
            hit[w] = self._passes(f[w], p[w], wb.positions)
        p, f = p[hit], f[hit]
        return self._events(np.full(p.size, 3, np.int8), f, codes[p], wb.positions.ts[p], (ENTERED, EXITED),
                            dated=True)

    def _dwell_filter(self, entering: npt.NDArray[np.uint64], leaving: npt.NDArray[np.uint64]
                      ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        """Which ENTERs and LEAVEs of these pairs are emitted: an ENTER into a fence with a
        dwell time waits (its stay is unconfirmed), the LEAVE of an unconfirmed stay is silent."""
        wait = self._opt["dwell_s"][(entering & _LOW).astype(np.int64)] > 0
        silent = self._unconfirmed_of(leaving)
        self._unconfirm(leaving[silent], entering[wait])
        return ~wait, ~silent

    def _dwelled(self, keys: npt.NDArray[np.uint64], ts: F64, since: F64) -> npt.NDArray[np.bool_]:
        """Of pairs still inside, seen inside at ts: the unconfirmed ones whose stay has now
        lasted their fence's dwell time (ENTER `dwelled`; they are confirmed)."""
        reached = self._unconfirmed_of(keys)
        dwell_s = self._opt["dwell_s"][(keys[reached] & _LOW).astype(np.int64)]
        reached[reached] = dwell.reached(ts[reached], since[reached], dwell_s)
        self._unconfirm(keys[reached])
        return reached
