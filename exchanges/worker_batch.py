"""What an x-fence worker receives from x-geo: positions with their candidate fences (CSR),
and the columns that keep an object's rows in order across regions (notices, gates, origins)
and tie them to fence versions (binding versions, re-check rows). The wire vocabulary between
the x-geo and x-fence roles, so the worker's core needs nothing of x-geo's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from exchanges.batch import PositionBatch


@dataclass(frozen=True, eq=False)
class WorkerBatch:
    """What one x-fence worker receives: positions (CSR of candidates per position)."""

    worker: str
    positions: PositionBatch
    ptr: npt.NDArray[np.int64]  # candidates of position i: cand[ptr[i]:ptr[i+1]]
    fences: list[str]  # the fence ids this message mentions
    cand: npt.NDArray[np.int32]  # index into `fences`
    interior: npt.NDArray[np.bool_]
    notice: npt.NDArray[np.bool_] | None = None  # per position: a handover notice (None: none is)
    gate: npt.NDArray[np.float64] | None = None  # per position: hold until a notice this recent
    # per position: a notice that is only a barrier (x-ingress announced the object after its
    # start, see ingress/core.py): it opens gates and changes nothing else
    barrier: npt.NDArray[np.bool_] | None = None
    # per position: the x-geo region it came through (region_code; 0: not said). A worker keeps
    # each region's rows of an object in order: a row is held while an earlier one is.
    origin: npt.NDArray[np.int64] | None = None
    # per entry of `fences`: the version of the binding x-geo routed with (0: not said), so a
    # worker judges a row routed just before its region applied a change against the
    # geometry that region still had (see fence.x_fence.core, "Fence changes")
    versions: npt.NDArray[np.int64] | None = None
    # per position: the index in `fences` of the fence whose change this row re-checks (-1:
    # an ordinary position). A re-check row is its object's latest position in the region
    # when the region applied the change; its candidates are that fence alone, or none.
    recheck: npt.NDArray[np.int32] | None = None
    # per position (n x 3): lon, lat, ts of the object's position before it in the region (NaN:
    # none known), sent when a candidate is a CROSS test (a fence's bounding box meets the
    # segment between the two: fence.x_fence.core, "Cross")
    prev: npt.NDArray[np.float64] | None = None

    def previous(self) -> npt.NDArray[np.float64]:
        return self.prev if self.prev is not None else np.full((len(self.positions), 3), np.nan)

    def notices(self) -> npt.NDArray[np.bool_]:
        return self.notice if self.notice is not None else np.zeros(len(self.positions), bool)

    def gates(self) -> npt.NDArray[np.float64]:
        return self.gate if self.gate is not None else np.zeros(len(self.positions), np.float64)

    def sent_rows(self) -> npt.NDArray[np.bool_]:
        """Per position: a device's report routed here for the first time, not a handover
        notice (an object's last position announced again) nor a fence change's re-check:
        the rows whose age is a position's latency."""
        rows = ~self.notices()
        if self.recheck is not None:
            rows &= self.recheck < 0
        return rows

    def barriers(self) -> npt.NDArray[np.bool_]:
        return self.barrier if self.barrier is not None else np.zeros(len(self.positions), bool)

    def origins(self) -> npt.NDArray[np.int64]:
        return self.origin if self.origin is not None else np.zeros(len(self.positions), np.int64)

    def fence_versions(self) -> npt.NDArray[np.int64]:
        return self.versions if self.versions is not None else np.zeros(len(self.fences), np.int64)

    def rechecks(self) -> npt.NDArray[np.int32]:
        return self.recheck if self.recheck is not None else np.full(len(self.positions), -1, np.int32)

    def take(self, rows: npt.ArrayLike) -> WorkerBatch:
        """The positions at `rows` (in that order) with their candidates."""
        r = np.asarray(rows, np.int64)
        lo, hi = self.ptr[r], self.ptr[r + 1]
        counts = hi - lo
        ptr = np.zeros(r.size + 1, np.int64)
        np.cumsum(counts, out=ptr[1:])
        at = np.repeat(lo - ptr[:-1], counts) + np.arange(int(ptr[-1]))
        cand, fences, versions = self.cand[at], self.fences, self.versions
        recheck = None if self.recheck is None else self.recheck[r]
        if len(fences) > 4 * (cand.size + r.size) + 16:
            # a few rows of a batch naming many fences (a position held for a notice): keep
            # only the fences they name, so what is held, and merged again, stays small
            used = np.zeros(len(fences), bool)
            used[cand] = True
            if recheck is not None:
                used[recheck[recheck >= 0]] = True
            keep = np.flatnonzero(used)
            number = np.full(len(fences), -1, np.int32)
            number[keep] = np.arange(keep.size, dtype=np.int32)
            cand = number[cand]
            fences = [fences[i] for i in keep.tolist()]
            versions = None if versions is None else versions[keep]
            recheck = None if recheck is None else np.where(recheck >= 0, number[np.maximum(recheck, 0)], -1
                                                             ).astype(np.int32)
        return WorkerBatch(self.worker, self.positions.take(r), ptr, fences, cand,
                           self.interior[at], None if self.notice is None else self.notice[r],
                           None if self.gate is None else self.gate[r],
                           None if self.barrier is None else self.barrier[r],
                           None if self.origin is None else self.origin[r], versions, recheck,
                           None if self.prev is None else self.prev[r])

    def candidates(self, i: int) -> list[tuple[str, bool]]:
        lo, hi = int(self.ptr[i]), int(self.ptr[i + 1])
        return [(self.fences[int(c)], bool(f)) for c, f in zip(self.cand[lo:hi], self.interior[lo:hi],
                                                              strict=True)]

    @staticmethod
    def concat(batches: Sequence[WorkerBatch]) -> WorkerBatch:
        """One batch holding the positions of several for the same worker (e.g. what several
        regions routed), fence lists merged and candidates renumbered."""
        if not batches:
            raise ValueError("nothing to concatenate")
        if len(batches) == 1:
            return batches[0]
        worker = batches[0].worker
        if any(b.worker != worker for b in batches):
            raise ValueError(f"batches for different workers: {sorted({b.worker for b in batches})}")
        # one entry per (fence, version): two regions may route one fence at two versions
        number: dict[tuple[str, int], int] = {}
        cands, ptrs, remaps, offset = [], [np.zeros(1, np.int64)], [], 0
        for b in batches:
            remap = np.fromiter((number.setdefault(k, len(number))
                                 for k in zip(b.fences, b.fence_versions().tolist(), strict=True)),
                                np.int32, len(b.fences))
            remaps.append(remap)
            cands.append(remap[b.cand] if b.cand.size else np.empty(0, np.int32))
            ptrs.append(b.ptr[1:] + offset)
            offset += int(b.ptr[-1])
        fences = [f for f, _ in number]
        versioned = any(b.versions is not None for b in batches)
        noticed = any(b.notice is not None for b in batches)
        gated = any(b.gate is not None for b in batches)
        barred = any(b.barrier is not None for b in batches)
        said = any(b.origin is not None for b in batches)
        rechecked = any(b.recheck is not None for b in batches)
        crossing = any(b.prev is not None for b in batches)
        return WorkerBatch(
            worker, PositionBatch.concat([b.positions for b in batches]), np.concatenate(ptrs),
            fences, np.concatenate(cands), np.concatenate([b.interior for b in batches]),
            np.concatenate([b.notices() for b in batches]) if noticed else None,
            np.concatenate([b.gates() for b in batches]) if gated else None,
            np.concatenate([b.barriers() for b in batches]) if barred else None,
            np.concatenate([b.origins() for b in batches]) if said else None,
            np.array([v for _, v in number], np.int64) if versioned else None,
            np.concatenate([np.where(b.rechecks() >= 0, r[np.maximum(b.rechecks(), 0)], -1)
                            if r.size else b.rechecks() for b, r in zip(batches, remaps, strict=True)]
                           ).astype(np.int32) if rechecked else None,
            np.concatenate([b.previous() for b in batches]) if crossing else None,
        )

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "worker": self.worker,
            "positions": self.positions.to_wire(),
            "ptr": self.ptr.astype("<i8").tobytes(),
            "fences": self.fences,
            "cand": self.cand.astype("<i4").tobytes(),
            "interior": self.interior.astype(np.uint8).tobytes(),
        }
        if self.notice is not None and self.notice.any():
            d["notice"] = self.notice.astype(np.uint8).tobytes()
        if self.gate is not None and self.gate.any():
            d["gate"] = self.gate.astype("<f8").tobytes()
        if self.barrier is not None and self.barrier.any():
            d["barrier"] = self.barrier.astype(np.uint8).tobytes()
        if self.origin is not None and self.origin.size:
            first = int(self.origin[0])
            d["origin"] = first if (self.origin == first).all() else self.origin.astype("<i8").tobytes()
        if self.versions is not None and self.versions.any():
            d["versions"] = self.versions.astype("<i8").tobytes()
        if self.recheck is not None and (self.recheck >= 0).any():
            d["recheck"] = self.recheck.astype("<i4").tobytes()
        if self.prev is not None:
            d["prev"] = self.prev.astype("<f8").tobytes()
        return d

    @staticmethod
    def from_wire(d: dict[str, Any]) -> WorkerBatch:
        """A batch from the wire; ValueError if its columns do not fit together."""
        pos = PositionBatch.from_wire(d["positions"])
        n = len(pos)
        ptr = np.frombuffer(d["ptr"], "<i8").astype(np.int64)
        cand = np.frombuffer(d["cand"], "<i4").astype(np.int32)
        interior = np.frombuffer(d["interior"], np.uint8).astype(bool)
        fences = list(d["fences"])
        if not isinstance(d["worker"], str) or not all(isinstance(f, str) for f in fences):
            raise ValueError("a worker batch whose worker or fence ids are not strings")
        notice = np.frombuffer(d["notice"], np.uint8).astype(bool) if d.get("notice") else None
        gate = np.frombuffer(d["gate"], "<f8").astype(np.float64) if d.get("gate") else None
        barrier = np.frombuffer(d["barrier"], np.uint8).astype(bool) if d.get("barrier") else None
        raw = d.get("origin")
        if isinstance(raw, int) and not -(1 << 63) <= raw < (1 << 63):
            raise ValueError(f"a worker batch whose origin {raw} is not a 64-bit integer")
        origin = None if raw is None else np.full(n, raw, np.int64) if isinstance(raw, int) \
            else np.frombuffer(raw, "<i8").astype(np.int64)
        versions = np.frombuffer(d["versions"], "<i8").astype(np.int64) if d.get("versions") else None
        recheck = np.frombuffer(d["recheck"], "<i4").astype(np.int32) if d.get("recheck") else None
        prev = np.frombuffer(d["prev"], "<f8").astype(np.float64) if d.get("prev") is not None else None
        if d.get("handover"):  # a whole part of notices (wire of the first pipeline version)
            notice = np.ones(n, bool)
        if (ptr.size != n + 1 or (ptr.size and (ptr[0] != 0 or (np.diff(ptr) < 0).any()))
                or int(ptr[-1]) != cand.size or interior.size != cand.size
                or (cand.size and (cand.min() < 0 or cand.max() >= len(fences)))
                or (notice is not None and notice.size != n) or (gate is not None and gate.size != n)
                or (gate is not None and not np.isfinite(gate).all())
                or (barrier is not None
                    and (barrier.size != n or notice is None or (barrier & ~notice).any()))
                or (origin is not None and origin.size != n)
                or (versions is not None and (versions.size != len(fences) or (versions < 0).any()))
                or (recheck is not None and (recheck.size != n or (recheck < -1).any()
                                             or (recheck >= len(fences)).any()
                                             or (notice is not None and (notice & (recheck >= 0)).any())))
                or (prev is not None and prev.size != 3 * n)):
            raise ValueError("a worker batch whose columns do not fit together")
        return WorkerBatch(d["worker"], pos, ptr, fences, cand, interior, notice, gate, barrier, origin,
                           versions, recheck, None if prev is None else prev.reshape(n, 3))
