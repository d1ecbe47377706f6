"""Which workers see a position, for proximity subscriptions (pure; see exchanges/roam_cells.py).

A row goes to the owners of:
- its object's cell, now and at the object's previous position (the publisher side: the worker
  that owned the old cell learns the object left, and reports what that ends);
- when the object carries subscriptions, every block its largest circle's box touches, now and
  at the previous position with the radius it had then (the subscriber side).

Each row travels with its object's previous position and extra fields, so a worker that did not
hold the object can still tell what the move changed (fence/x_fence/roaming.py). Rows keep the batch's order
within each worker's share.

Trade-off: the router keeps every object's last position (a dict entry per object), which
x-geo holds anyway for queries; in exchange a worker never needs a position it was not sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from exchanges.roam_cells import BlockOwners, RoamGrid, unique_pairs

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class RoamRows:
    """One worker's share of a batch: row numbers (in order) and each row's previous position
    (NaN: the object had none) and extra fields."""

    rows: I64
    prev_lon: F64
    prev_lat: F64
    prev_extra: list[Mapping[str, Any] | None]

    def __len__(self) -> int:
        return int(self.rows.size)


class RoamRouter:
    def __init__(self, grid: RoamGrid, owners: BlockOwners) -> None:
        self.grid = grid
        self.owners = owners
        self._radius: dict[str, float] = {}  # subscriber object -> its largest radius
        self._last: dict[str, tuple[float, float, float]] = {}  # object -> (lon, lat, radius routed with)
        self._extra: dict[str, Mapping[str, Any]] = {}  # object -> extra fields of its last position

    def set_radius(self, obj: str, radius_m: float) -> None:
        """The largest radius of `obj`'s subscriptions (0: it has none)."""
        if radius_m > 0:
            self._radius[obj] = float(radius_m)
        else:
            self._radius.pop(obj, None)

    def radius(self, obj: str) -> float:
        return self._radius.get(obj, 0.0)

    def last(self, obj: str) -> tuple[float, float] | None:
        p = self._last.get(obj)
        return None if p is None else (p[0], p[1])

    def __len__(self) -> int:
        return len(self._last)

    def route(self, ids: list[str], lon: F64, lat: F64,
              extra: Sequence[Mapping[str, Any] | None] | None = None) -> dict[int, RoamRows]:
        """Worker number -> its rows of the batch."""
        n = len(ids)
        prev_extra: list[Mapping[str, Any] | None] = [None] * n
        if extra or self._extra:
            ex, last_ex = extra or [None] * n, self._extra
            for i, o in enumerate(ids):
                prev_extra[i] = last_ex.get(o)
                e = ex[i]
                if e:
                    last_ex[o] = e
                elif prev_extra[i] is not None:
                    del last_ex[o]
        prev = np.full((n, 3), np.nan)
        rad = np.zeros(n)
        last, radius = self._last, self._radius
        lons, lats = lon.tolist(), lat.tolist()
        for i, o in enumerate(ids):
            p = last.get(o)
            if p is not None:
                prev[i] = p
            r = radius.get(o, 0.0)
            rad[i] = r
            last[o] = (lons[i], lats[i], r)
        had = ~np.isnan(prev[:, 0])
        grid = self.grid
        rows = [np.arange(n, dtype=np.int64)]
        keys = [grid.point_keys(lon, lat)]
        h = np.flatnonzero(had)
        rows.append(h)
        keys.append(grid.point_keys(prev[h, 0], prev[h, 1]))
        s = np.flatnonzero(rad > 0)
        if s.size:
            br, bk = grid.box_keys(lon[s], lat[s], rad[s])
            rows.append(s[br])
            keys.append(bk)
        ps = np.flatnonzero(had & (prev[:, 2] > 0))
        if ps.size:
            br, bk = grid.box_keys(prev[ps, 0], prev[ps, 1], prev[ps, 2])
            rows.append(ps[br])
            keys.append(bk)
        all_keys = np.concatenate(keys)
        worker, row = unique_pairs(self.owners.of(all_keys), np.concatenate(rows))
        out: dict[int, RoamRows] = {}
        if row.size == 0:
            return out
        cuts = np.flatnonzero(np.diff(worker)) + 1
        for part in np.split(np.arange(row.size), cuts):
            rr = row[part]
            out[int(worker[part[0]])] = RoamRows(rr, prev[rr, 0], prev[rr, 1],
                                                 [prev_extra[i] for i in rr.tolist()])
        return out
