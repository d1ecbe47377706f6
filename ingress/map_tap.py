"""The live map's sample of positions, taken where every position already passes (x-ingress).

Trade-off: a map needs where objects are, not every fix. Copying the stream to the map
through the broker would cost a second routing of every position; instead x-ingress keeps the
batches it routed (a reference each, no copy) and, once a second, sends one message: the
latest position of each object that moved in that second, at most `limit` of them. Above the
limit a rotating stride picks which ones go (every object gets its turn within `ceil(n /
limit)` seconds while it keeps moving); the message says how many moved. The cost is one
list append per batch and, per second, one pass over that second's ids.

"Latest" is the last one routed: x-ingress routes an object's positions in the order they
came, which for one device is the order it sent them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from exchanges.batch import PositionBatch

DEFAULT_LIMIT = 20_000  # objects per second on the map's wire (~500 kB of msgpack)


@dataclass(frozen=True)
class MapSample:
    batch: PositionBatch  # the objects' latest positions (one row per object)
    moved: int  # objects that moved in the window (>= len(batch))
    positions: int  # positions routed in the window

    def to_wire(self) -> dict[str, object]:
        return {"batch": self.batch.to_wire(), "moved": self.moved, "positions": self.positions}


class MapSampler:
    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError("limit: at least one object per sample")
        self.limit = limit
        self._batches: list[PositionBatch] = []
        self._turn = 0  # which stride offset goes next when there are more than `limit`

    def note(self, batch: PositionBatch) -> None:
        if len(batch):
            self._batches.append(batch)

    def take(self) -> MapSample | None:
        """The window's sample, and a new window; None when nothing moved."""
        batches, self._batches = self._batches, []
        if not batches:
            return None
        ids: list[str] = []
        for b in batches:
            ids += b.ids
        last = dict(zip(ids, range(len(ids)), strict=True))  # an id's last row wins
        rows: npt.NDArray[np.int64] = np.fromiter(last.values(), np.int64, len(last))
        moved = rows.size
        if moved > self.limit:
            stride = -(-moved // self.limit)
            rows = rows[self._turn % stride::stride]
            self._turn += 1
        picked = rows.tolist()
        lon, lat, ts, h = (np.concatenate([getattr(b, c) for b in batches])[rows]
                           for c in ("lon", "lat", "ts", "h"))
        # the pass-through fields stay behind: the map shows where, not what
        return MapSample(PositionBatch([ids[i] for i in picked], lon, lat, ts, h), moved, len(ids))
