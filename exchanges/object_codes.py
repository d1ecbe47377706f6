"""Per-object state as arrays: object ids mapped to dense codes, shared by the cores.

Every core keeps something per object (x-ingress its last region, x-geo the workers it
routed it to, x-fence its last position). Mapping ids to codes once per batch lets that
state live in numpy arrays indexed by code, and `carry` handle several positions of one
object in a batch in order, without a Python loop per position.
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]


class ObjectCodes:
    """Object id -> dense code (0, 1, 2, ... in order of first sight); codes are never reused."""

    def __init__(self) -> None:
        self.table: dict[str, int] = {}
        self.ids: list[str] = []

    def __len__(self) -> int:
        return len(self.ids)

    def get(self, object_id: str) -> int | None:
        return self.table.get(object_id)

    def codes(self, ids: list[str]) -> I64:
        """The code of each id, new ids numbered on first sight. One dict lookup per id:
        a batch nearly always has a few ids new to this core (objects entering a region
        or reaching a worker), so only those take a second pass."""
        table = self.table
        codes = np.fromiter(map(table.get, ids, repeat(-1)), np.int64, len(ids))
        new = np.flatnonzero(codes < 0)
        if new.size:
            fresh = [ids[i] for i in new.tolist()]
            first_seen = list(dict.fromkeys(fresh))  # an id may repeat within the batch
            table.update(zip(first_seen, range(len(self.ids), len(self.ids) + len(first_seen)), strict=True))
            self.ids += first_seen
            codes[new] = np.fromiter(map(table.__getitem__, fresh), np.int64, len(fresh))
        return codes


def grow(a: npt.NDArray[Any], n: int, fill: Any) -> npt.NDArray[Any]:
    """`a` with room for at least n entries (doubling), new entries set to `fill`."""
    if n <= a.size:
        return a
    out = np.full(max(n, 2 * a.size, 64), fill, dtype=a.dtype)
    out[: a.size] = a
    return out


def carry(codes: I64, values: I64, memory: I64) -> I64:
    """For each position, the value its object had just before it: that of the object's
    previous position in this batch, else memory[code]. Then memory takes each object's
    value at its last position in the batch."""
    if distinct(codes, memory.size):  # the common case: one position per object
        prev = memory[codes]
        memory[codes] = values
        return prev
    order = np.argsort(codes, kind="stable")
    c = codes[order]
    first = np.r_[True, c[1:] != c[:-1]]
    prev_sorted = np.empty(c.size, dtype=memory.dtype)
    prev_sorted[first] = memory[c[first]]
    prev_sorted[~first] = values[order[:-1]][~first[1:]]
    prev = np.empty_like(prev_sorted)
    prev[order] = prev_sorted
    last = np.r_[first[1:], True]
    memory[c[last]] = values[order[last]]
    return prev


def distinct(codes: I64, bound: int) -> bool:
    """Are the codes (all < bound) pairwise distinct? O(n) with a scratch array."""
    if codes.size < 2:
        return True
    seen = np.zeros(bound, dtype=bool)
    seen[codes] = True
    return int(np.count_nonzero(seen)) == codes.size
