"""Reads of a worker's state: `geofence inspect fence`, the API's occupants and the live map's
counts."""

from __future__ import annotations

from typing import Any

import numpy as np

from exchanges.fence_def import FenceDef
from fence.x_fence.table import _LOW, _SHIFT, FenceTable


class Queries(FenceTable):
    """State for `geofence inspect fence`, the API's reads and the live map."""

    def version_of(self, fence_id: str) -> int:
        """The version this worker knows of a fence (0: none)."""
        return self._versions.get(fence_id, 0)

    def fences(self) -> list[str]:
        return sorted(self._fence_code)

    def fence(self, fence_id: str) -> FenceDef | None:
        code = self._fence_code.get(fence_id)
        return None if code is None else self._fences[code]

    def counts(self) -> dict[str, int]:
        """How many objects are inside each fence that has any (the live map's colours); a stay
        not past its fence's dwell time is not counted (it has had no ENTER)."""
        keys = self._keys[~self._unconfirmed_of(self._keys)] if self._unconfirmed.size else self._keys
        codes, n = np.unique((keys & _LOW).astype(np.int64), return_counts=True)
        out = {}
        for code, k in zip(codes.tolist(), n.tolist(), strict=True):
            d = self._fences[code]
            if d is not None:
                out[d.fence_id] = k
        return out

    def occupants(self, fence_id: str) -> list[dict[str, Any]]:
        code = self._fence_code.get(fence_id)
        if code is None:
            raise KeyError(f"fence {fence_id!r} is not on worker {self.worker}")
        mask = (self._keys & _LOW) == np.uint64(code)
        objs = (self._keys[mask] >> _SHIFT).astype(np.int64)
        waiting = self._unconfirmed_of(self._keys[mask]).tolist()
        # confirmed: its ENTER was emitted (False while a stay has not reached the dwell time)
        return [{"object_id": self._objects.ids[o], "since": float(s), "last_seen": float(self._last_ts[o]),
                 "confirmed": not w}
                for o, s, w in zip(objs.tolist(), self._since[mask].tolist(), waiting, strict=True)]

    def last_seen(self, object_id: str) -> float | None:
        """The time of the object's last position this worker was sent (it is sent an
        object's positions while they are in one of its fences' ranges; elsewhere, the
        object is in none of its fences and this time goes stale)."""
        code = self._objects.get(object_id)
        return None if code is None or not np.isfinite(self._last_ts[code]) else float(self._last_ts[code])

    def fences_of(self, object_id: str) -> list[str]:
        code = self._objects.get(object_id)
        if code is None:
            return []
        lo, hi = np.searchsorted(self._keys, [np.uint64(code) << _SHIFT, np.uint64(code + 1) << _SHIFT])
        keys = self._keys[lo:hi]
        return sorted(self._fence_ids(keys[~self._unconfirmed_of(keys)]))  # stays reported (ENTER emitted)

    def stats(self) -> dict[str, int]:
        return {"fences": len(self._fence_code), "objects": len(self._objects.ids),
                "inside_pairs": int(self._keys.size),
                "unknown_fence_candidates": self.unknown_fence_candidates,
                "walled_candidates": self.walled_candidates,
                "stale_positions": self.stale_positions, "held_positions": self.held_positions,
                "held_now": len(self._held), "holds_expired": self.holds_expired,
                "rechecks": self.rechecks, "rechecks_superseded": self.rechecks_superseded}
