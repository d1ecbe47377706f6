"""The proximity router's messages (exchanges/roam_routing.py) as an x-fence worker decodes them
for its roaming matcher (fence/x_fence/roaming.py): a `rows` message's positions with each
object's previous position and fields (`Rows`), and any message's mark (`mark_of`).

Invariant: a run of `rows` messages concatenated, or one cut into slices, is the same rows in
the same order: the matcher's events do not depend on how the rows were grouped. The mark is
the last message's, and a matcher takes it only once every row up to it is applied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from exchanges.batch import PositionBatch

F64 = npt.NDArray[np.float64]


def mark_of(msg: Mapping[str, Any]) -> tuple[int, int] | None:
    """A router message's [epoch, step] (exchanges/roam_routing.py RoamStream); None without one."""
    raw = msg.get("mark")
    if raw is None:
        return None
    epoch, n = raw
    if not isinstance(epoch, int) or not isinstance(n, int) or isinstance(epoch, bool) or isinstance(n, bool):
        raise ValueError(f"roaming mark {raw!r}: two integers")
    return epoch, n


@dataclass(frozen=True, eq=False)
class Rows:
    """A `rows` message decoded: positions with each object's previous position and fields."""

    batch: PositionBatch
    prev_lon: F64
    prev_lat: F64
    prev_extra: list[Mapping[str, Any] | None]
    mark: tuple[int, int] | None = None

    @staticmethod
    def of(msg: Mapping[str, Any]) -> Rows:
        """ValueError / KeyError / TypeError for a message that does not fit."""
        b = PositionBatch.from_wire(msg["batch"])
        n = len(b)
        plon = np.frombuffer(msg["prev_lon"], "<f8").astype(np.float64)
        plat = np.frombuffer(msg["prev_lat"], "<f8").astype(np.float64)
        pex = list(msg["prev_extra"]) if msg.get("prev_extra") else [None] * n
        if plon.size != n or plat.size != n or len(pex) != n:
            raise ValueError(f"roaming rows: previous positions / fields do not fit {n} rows")
        return Rows(b, plon, plat, pex, mark_of(msg))

    def slice(self, lo: int, hi: int) -> Rows:
        """Rows lo..hi (the mark stays the whole message's: see RoamMatcher.apply_sliced)."""
        hi = min(hi, len(self.batch))
        return Rows(self.batch.take(np.arange(lo, hi)), self.prev_lon[lo:hi], self.prev_lat[lo:hi],
                    self.prev_extra[lo:hi], self.mark)

    @staticmethod
    def concat(parts: Sequence[Rows]) -> Rows:
        """Consecutive messages as one (a worker applies a run of them in one call)."""
        if len(parts) == 1:
            return parts[0]
        return Rows(PositionBatch.concat([p.batch for p in parts]),
                    np.concatenate([p.prev_lon for p in parts]), np.concatenate([p.prev_lat for p in parts]),
                    [e for p in parts for e in p.prev_extra], parts[-1].mark)
