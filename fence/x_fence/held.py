"""Positions an x-fence worker holds until a gate opens (see fence/x_fence/core.py, `route`):
in arrival order, as a few batches of rows (one per `add`), never one object per row.

The rules, per row (code = its object, origin = the x-geo region it came through, gate):
- it is open once the object's latest handover notice applied is at least its gate;
- a region's rows of an object stay in order: a row is released only if no earlier row of
  the same object and region (origin != 0) stays held;
- a row held HOLD_S (by the caller's clock) is released anyway (an expired hold).

Trade-off: `ready` decides for every held row at once (sorts by object and region, one pass
of numpy), so the first positions of ten thousand new objects, each held for its barrier,
cost a few array operations per batch instead of a Python loop over every held row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from exchanges.worker_batch import WorkerBatch

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
ORIGIN_SPAN = 1 << 20  # (object code, origin) as one key: origins are region codes, far below


class Chunk:
    """Rows held by one `add`, in arrival order, with their object codes and arrival time."""

    __slots__ = ("at", "codes", "gates", "origins", "rows")

    def __init__(self, rows: WorkerBatch, codes: I64, at: F64) -> None:
        self.rows, self.codes, self.at = rows, codes, at
        self.gates, self.origins = rows.gates(), rows.origins()

    def __len__(self) -> int:
        return int(self.codes.size)

    def take(self, keep: I64) -> Chunk:
        return Chunk(self.rows.take(keep), self.codes[keep], self.at[keep])


class Held:
    def __init__(self) -> None:
        self.chunks: list[Chunk] = []

    def __len__(self) -> int:
        return sum(map(len, self.chunks))

    def __bool__(self) -> bool:
        return bool(self.chunks)

    def add(self, rows: WorkerBatch, codes: I64, at: float) -> None:
        if len(codes):
            self.chunks.append(Chunk(rows, np.asarray(codes, np.int64), np.full(len(codes), at)))

    def codes(self) -> I64:
        """The objects with a held row (sorted, unique)."""
        return np.unique(self._column("codes"))

    def pair_keys(self) -> I64:
        """(object code, origin) of every held row, as sorted unique keys (`pair_key`)."""
        return np.unique(pair_key(self._column("codes"), self._column("origins")))

    def fence_versions(self) -> set[tuple[str, int]]:
        """The (fence, version) entries the held rows' batches carry."""
        out: set[tuple[str, int]] = set()
        for c in self.chunks:
            out.update(zip(c.rows.fences, c.rows.fence_versions().tolist(), strict=True))
        return out

    def ready(self, handover_ts: F64, now: float | None, hold_s: float
              ) -> tuple[WorkerBatch | None, I64, int]:
        """Take out the rows that may go now (with `now`: also those held hold_s), in
        arrival order: (their rows, their object codes, how many went only because expired)."""
        if not self.chunks:
            return None, np.empty(0, np.int64), 0
        codes, origins = self._column("codes"), self._column("origins")
        gates, at = self._column("gates"), self._column("at")
        open_ = gates <= handover_ts[codes]
        expired = (now - at >= hold_s) if now is not None else np.zeros(codes.size, bool)
        ordered = origins != 0
        # a row waits behind an earlier row of its object and region that stays: within each
        # (object, origin) group in arrival order, "an earlier row is not free to go"
        stuck_before = np.zeros(codes.size, bool)
        rows = np.flatnonzero(ordered)
        if rows.size:
            order = rows[np.lexsort((rows, origins[rows], codes[rows]))]
            stays = ~(open_[order] | expired[order])
            key = pair_key(codes[order], origins[order])
            start = np.r_[True, key[1:] != key[:-1]]
            count = np.cumsum(stays)
            before = count - stays  # stays strictly before, from the first row
            base = np.maximum.accumulate(np.where(start, before, 0))
            stuck_before[order] = (before - base) > 0
        go = (open_ & ~stuck_before) | expired
        if not go.any():
            return None, np.empty(0, np.int64), 0
        n_expired = int((go & ~(open_ & ~stuck_before)).sum())
        out, kept, lo = [], [], 0
        for c in self.chunks:
            hi = lo + len(c)
            g = go[lo:hi]
            if g.all():
                out.append(c.rows)
            elif g.any():
                out.append(c.rows.take(np.flatnonzero(g)))
                kept.append(c.take(np.flatnonzero(~g)))
            else:
                kept.append(c)
            lo = hi
        self.chunks = kept
        return WorkerBatch.concat(out), codes[go], n_expired

    def _column(self, name: str) -> Any:
        parts = [getattr(c, name) for c in self.chunks]
        if not parts:
            return np.empty(0, np.float64 if name in ("gates", "at") else np.int64)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    # -- the durable form (fence/x_fence/codec.py) -------------------------------------------

    def pack(self) -> list[list[Any]]:
        """[[codes, batch wire, arrival times], ...] per chunk."""
        return [[c.codes.tolist(), c.rows.to_wire(), c.at.tolist()] for c in self.chunks]

    @classmethod
    def unpack(cls, entries: Iterable[Sequence[Any]]) -> Held:
        """From `pack`, or from the earlier per-row form [[code, row wire, at], ...]."""
        held = cls()
        for codes, wire, at in entries:
            rows = WorkerBatch.from_wire(wire)
            if isinstance(codes, int | np.integer):  # the per-row form: one row
                codes, at = [codes], [at]
            c = np.asarray(codes, np.int64)
            a = np.asarray(at, np.float64)
            if not (c.size == a.size == len(rows.positions)):
                raise ValueError(f"held rows: {c.size} codes and {a.size} times for "
                                 f"{len(rows.positions)} rows")
            held.chunks.append(Chunk(rows, c, a))
        return held


def pair_key(codes: I64, origins: I64) -> I64:
    return codes * ORIGIN_SPAN + origins
