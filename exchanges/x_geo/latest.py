"""What an x-geo (exchanges/x_geo/core.py) keeps of each object: its latest position in the
region, by object code, as columns. A fence change re-checks the objects at these positions
(XGeo.change), CROSS tests a batch's first segment of each object from here
(exchanges/x_geo/crossings.py), and spatial queries read them (exchanges/x_geo/queries.py).

Invariants:
- a position is remembered only if it is not older than the one known (`ts`): a batch routed
  late never takes an object back in time;
- `present` is False once a handover notice said the object left (its other columns keep the
  last position here), and for a code never seen: the re-checks, CROSS and `of` take only the
  objects present;
- the columns grow with the object codes (never shrink): `remember` makes room for every
  code below the bound it is given.

Trade-off: the columns are memory only, not persisted; after a restart (or a batch routed and
not delivered: XGeo.forget_objects) a fence change re-checks only the objects seen since.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from exchanges.batch import PositionBatch
from exchanges.object_codes import distinct, grow


class LatestPositions:
    """Per object code: its latest position here (ts, lon, lat, h, gate, extra fields) and
    whether it is still here."""

    def __init__(self) -> None:
        self.ts = np.zeros(0, np.float64)
        self.lon = np.zeros(0, np.float64)
        self.lat = np.zeros(0, np.float64)
        self.h = np.zeros(0, np.uint64)
        self.gate = np.zeros(0, np.float64)
        self.present = np.zeros(0, bool)
        self.extra = np.empty(0, dtype=object)  # the extra fields of that position (None: none)

    def remember(self, batch: PositionBatch, codes: npt.NDArray[np.int64], m: int,
                 notice: npt.NDArray[np.bool_] | None, gate: npt.NDArray[np.float64] | None) -> None:
        """Each object's latest position here (its last row in the batch, if not older than
        the one known); a notice says it is no longer here. `m`: the object codes so far
        (every code of the batch is below it)."""
        self.ts = grow(self.ts, m, -np.inf)
        self.lon, self.lat = grow(self.lon, m, np.nan), grow(self.lat, m, np.nan)
        self.h, self.gate = grow(self.h, m, 0), grow(self.gate, m, 0.0)
        self.present = grow(self.present, m, False)
        if self.extra.size < m:
            more = np.empty(m - self.extra.size, dtype=object)
            self.extra = np.concatenate([self.extra, more])
        if distinct(codes, m):
            last = np.arange(codes.size)
        else:
            order = np.argsort(codes, kind="stable")
            c = codes[order]
            last = order[np.r_[c[1:] != c[:-1], True]]
        obj = codes[last]
        newer = batch.ts[last] >= self.ts[obj]
        last, obj = last[newer], obj[newer]
        self.ts[obj] = batch.ts[last]
        self.lon[obj], self.lat[obj], self.h[obj] = batch.lon[last], batch.lat[last], batch.h[last]
        self.gate[obj] = 0.0 if gate is None else gate[last]
        if batch.extra:
            fields = np.empty(last.size, dtype=object)
            fields[:] = [batch.extra[i] for i in last.tolist()]
            self.extra[obj] = fields
        else:
            self.extra[obj] = None
        self.present[obj] = True if notice is None else ~notice[last]

    def of(self, c: int | None) -> dict[str, float] | None:
        """Object code c's latest position here, or None (never seen, or it left)."""
        if c is None or c >= self.present.size or not self.present[c]:
            return None
        return {"ts": float(self.ts[c]), "lon": float(self.lon[c]), "lat": float(self.lat[c])}
