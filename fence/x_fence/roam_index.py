"""The roaming matcher's persistent index of the positions it holds (fence/x_fence/roaming.py):
each held position filed under its index cell (cells half the routing's), in two sorted
files, by x * side + y and by y * side + x, so the C search (hilbert_c/proximity.c) reads a
box by columns or by rows of cells, whichever takes fewer searches.

Invariants:
- `filed[slot]` is the key the slot is filed under in the x file (-1: not filed), and each
  file holds exactly the slots whose `filed` is >= 0, sorted by key;
- after `refile`, a slot is filed iff its position is held, under its current cell.

Trade-off: the files are kept across batches and brought up to date by merging (time linear
in the held positions, no sort of them): a batch sorts only its own places (`with_batch`), at
the price of the `filed` column and of a merge of the files per batch in which positions
changed.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


def merged(keys: I64, values: I64, more_keys: I64, more_values: I64) -> tuple[I64, I64]:
    """Two key-sorted lists (keys with a value each) as one, in time linear in their sizes."""
    if not more_keys.size:
        return keys, values
    at = np.searchsorted(keys, more_keys, side="right")
    return np.insert(keys, at, more_keys), np.insert(values, at, more_values)


class CellFiles:
    """The held positions sorted by index cell, both ways (x * side + y, y * side + x), kept
    across batches: per slot the cell it is filed under (-1: not filed), and the files."""

    def __init__(self, side: int, cap: int) -> None:
        self.side = side
        self.filed = np.full(cap, -1, np.int64)
        self.x_key = self.x_slot = self.y_key = self.y_slot = np.zeros(0, np.int64)

    def grow(self, cap: int) -> None:
        """Room for `cap` slots (the matcher's columns grew); the new ones filed nowhere."""
        b = np.full(cap, -1, self.filed.dtype)
        b[: self.filed.size] = self.filed
        self.filed = b

    def refile(self, n: int, held: B, cell: I64) -> None:
        """The files brought up to date for slots 0..n: the slots whose position changed (or
        went) since refiled, in time linear in the held positions (no sort of them). `cell`:
        each slot's index cell as x * side + y (valid where `held`)."""
        side = self.side
        cur = np.where(held, cell[:n], -1)
        changed = np.flatnonzero(cur != self.filed[:n])
        if not changed.size:
            return
        moved = np.zeros(n, bool)
        moved[changed] = True
        ins = changed[cur[changed] >= 0]
        kx = cur[ins]
        ox = np.argsort(kx, kind="stable")
        keep = ~moved[self.x_slot]
        self.x_key, self.x_slot = merged(self.x_key[keep], self.x_slot[keep], kx[ox], ins[ox])
        ky = (kx % side) * side + kx // side
        oy = np.argsort(ky, kind="stable")
        keep = ~moved[self.y_slot]
        self.y_key, self.y_slot = merged(self.y_key[keep], self.y_slot[keep], ky[oy], ins[oy])
        self.filed[changed] = cur[changed]

    def with_batch(self, n: int, cell: I64, rcell: I64) -> tuple[I64, I64, I64, I64]:
        """The files merged with a batch's places, whose entries are numbered from n (the
        slots' entries are the slots): (x keys, x entries, y keys, y entries). `cell` and
        `rcell` are the places' cells both ways (x * side + y, y * side + x). A sort of the
        batch's places, none of the held; the files themselves are left as they are."""
        bx = np.argsort(cell, kind="stable")
        ax_key, ax_ent = merged(self.x_key, self.x_slot, cell[bx], n + bx)
        by = np.argsort(rcell, kind="stable")
        ay_key, ay_ent = merged(self.y_key, self.y_slot, rcell[by], n + by)
        return ax_key, ax_ent, ay_key, ay_ent
