"""Gates and timers: positions held until their handover notice opens them, and the LEAVEs of
objects silent past their fence's timeout or their own TTL."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from exchanges.fence_events import (
    ENTERED,
    Event,
)
from exchanges.fence_options import TIMERS
from exchanges.worker_batch import WorkerBatch
from fence.x_fence.decisions import Decisions
from fence.x_fence.held import pair_key
from fence.x_fence.table import _LOW, _SHIFT, I64


class Gates(Decisions):
    """Positions waiting for a handover notice (their gate), and the timers' LEAVEs."""

    def route(self, wb: WorkerBatch, received_at: float = 0.0) -> list[Event]:
        """Apply a batch routed by x-geo: ENTER / LEAVE (exited) events, in time order.

        A position older than the object's last known one is dropped (stale). Positions of
        one object with the same ts are one observation, and what they say is united: so an
        observation at the object's last known ts can add fences, never remove one.

        A notice (a handover: the object left a region; or a barrier: x-ingress announcing
        an object it had not seen since its start, see ingress/core.py) only opens gates:
        the region the object went to sends its first position there to every worker, and
        that position decides what the object is in (applied in one batch with the notice
        that opens it, see `_with_opened`). A gated position waits (held here) until
        the notice of the region its object came from was applied (see exchanges.x_geo),
        then is applied with the others of its object in time order; a row behind a held
        row of the same object and region waits with it. `received_at` (the caller's clock)
        bounds that wait: `expire` applies a position held HOLD_S anyway.
        """
        if len(wb.positions) == 0:
            return []
        codes = self._codes(wb.positions.ids)
        if wb.gate is not None or (self._held and wb.origin is not None):
            blocked = self._blocked(wb, codes)
            if blocked.any():
                rows = np.flatnonzero(blocked)
                self._held.add(wb.take(rows), codes[rows], received_at)
                self.held_positions += int(rows.size)
                self._held_dirty = True
                keep = np.flatnonzero(~blocked)
                wb, codes = wb.take(keep), codes[keep]
        events = self._route(*self._with_opened(wb, codes))
        if self._pending:
            self._end_transitions()
        return events


    # Longest wait for a handover notice. The notice always comes (x-ingress sends it with the
    # position it gates); only a backlog delays it, and a saturated pipeline runs a backlog of
    # tens of seconds: giving up sooner would apply positions out of order.
    HOLD_S = 300.0

    def _blocked(self, wb: WorkerBatch, codes: I64) -> npt.NDArray[np.bool_]:
        """Positions whose gate is not open yet. The gate alone keeps an object's order:
        the positions of one stay in a region share their gate, so they wait together, and
        nothing later can pass them: a later stay's gate (or notice's) is a later entry,
        which needs a later notice than the one they wait for."""
        blocked: npt.NDArray[np.bool_] = wb.gates() > self._ho_ts[codes]
        if wb.origin is None or not (blocked.any() or self._held):
            return blocked
        # A region's rows of an object stay in order: a row behind a held one of the same
        # region waits too (a notice behind a held position of its region may not open it),
        # as does a row behind a blocked one of its region in this batch.
        ordered = wb.origin != 0
        rows = np.flatnonzero(ordered & (blocked | np.isin(codes, self._held.codes())))
        if not rows.size:
            return blocked
        keys = pair_key(codes[rows], wb.origin[rows])
        waits = blocked[rows] | np.isin(keys, self._held.pair_keys())
        # within each (object, region) in batch order: from its first waiting row on
        order = np.lexsort((rows, keys))
        k, w = keys[order], waits[order]
        start = np.r_[True, k[1:] != k[:-1]]
        count = np.cumsum(w)
        base = np.maximum.accumulate(np.where(start, count - w, 0))
        blocked[rows[order]] = (count - base) > 0
        return blocked

    def _release(self, now: float | None) -> list[Event]:
        """Apply the held positions whose gate opened (with `now`: also those held HOLD_S),
        all in one batch, so each object's are taken in time order."""
        ready, codes = self._ready(now)
        if ready is None:
            return []
        events = self._route(*self._with_opened(ready, codes))
        if self._pending:
            self._end_transitions()
        return events

    def _with_opened(self, wb: WorkerBatch, codes: I64) -> tuple[WorkerBatch, I64]:
        """`wb` and, behind it, the held rows its notices open (and those these open in
        turn), to be routed as one batch: a notice and the position it opens (the object's
        position in the region it went to: the same instant) are then one observation, which
        unites what each says. Routed apart, a notice judged against a fence's new version
        and the position routed with its old one would LEAVE and ENTER at one instant."""
        parts, part_codes = [wb], [codes]
        while self._held and parts[-1].notice is not None and parts[-1].notice.any():
            last, last_codes = parts[-1], part_codes[-1]
            assert last.notice is not None
            np.maximum.at(self._ho_ts, last_codes[last.notice], last.positions.ts[last.notice])
            ready, ready_codes = self._ready(None)
            if ready is None:
                break
            parts.append(ready)
            part_codes.append(ready_codes)
        if len(parts) == 1:
            return wb, codes
        return WorkerBatch.concat(parts), np.concatenate(part_codes)

    def _ready(self, now: float | None) -> tuple[WorkerBatch | None, I64]:
        """Take out the held rows whose gate is open (with `now`: also those held HOLD_S),
        each region's rows of an object in order; with their object codes."""
        ready, codes, expired = self._held.ready(self._ho_ts, now, self.HOLD_S)
        if ready is not None:
            self.holds_expired += expired
            self._held_dirty = True
        return ready, codes

    def expire(self, now: float) -> list[Event]:
        """LEAVE for every pair whose stay a timer ended before `now` (exchanges/fence_options/:
        the fence's timeout, reason timeout: its object silent longer than it; the object's
        TTL, reason expired, when that comes first: the `ttl` of its latest position sent here,
        a re-check row, which carries no extra fields, keeping the TTL it had; ...); the event
        is dated when the first timer ended the stay, so it does not depend on when we look.
        Positions held longer than HOLD_S for a handover notice are applied first."""
        held = self._release(now) if self._held else []
        if not self._keys.size:
            return held
        objs = (self._keys >> _SHIFT).astype(np.int64)
        fences = (self._keys & _LOW).astype(np.int64)
        last_ts, ttl = self._last_ts[objs], self._ttl[objs]
        due_at, timer = np.full(objs.size, np.inf), np.zeros(objs.size, np.int64)
        for i, option in enumerate(TIMERS):  # the first timer to end the stay (ties: the first listed)
            column = self._opt[option.key][fences] if option.on_fence else np.zeros(objs.size)
            at = option.due(column, last_ts, ttl)
            sooner = at < due_at
            due_at[sooner], timer[sooner] = at[sooner], i
        due_at = np.maximum(due_at, self._since)  # never before the stay began (a timer moved earlier)
        due = due_at < now
        if not due.any():
            return held
        silent = due & self._unconfirmed_of(self._keys)  # stays never reported
        self._unconfirm(self._keys[silent])
        events = []
        told = due & ~silent
        for i, option in enumerate(TIMERS):
            mine = told & (timer == i)
            if mine.any():
                events += self._events(np.ones(int(mine.sum()), np.int8), fences[mine], objs[mine],
                                       due_at[mine], (ENTERED, option.reason), since=self._since[mine])
        events.sort(key=lambda e: (e.ts, e.object_id, e.fence_id, e.event))
        self._keys, self._since = self._keys[~due], self._since[~due]
        self._dirty_objs.append(objs[due])
        return held + events
