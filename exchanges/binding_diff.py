"""The difference between two versions of a fence's bindings in one region (pure, numpy).

A change of a fence sends each x-geo region it touched or touches only the ranges that
changed: the ranges of the old covering that are gone and the ranges of the new one that
are new, a range being (first, last, interior) at INDEX_BITS. A reshaped fence keeps the
ranges of what did not change; a moved one keeps few (a range runs edge to edge of the
fence, so a shift changes most of them): the manager sends whichever of the diff and the
whole covering is smaller (bench/moving_fences.py measured diffs of ~2x the covering for
follow moves, so those go whole).

The receiver applies a diff only onto the very version it was computed from (`base_version`)
and checks the result against the digest of the new ranges: anything else (a region that
missed a change, restarted, or applied them out of order) is a `DiffMismatch`, and the region
reads the fence's bindings from the store instead. So a diff can never leave a region with
ranges that no version of the fence had.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
BOOL = npt.NDArray[np.bool_]


class DiffMismatch(ValueError):
    """The diff does not fit the ranges in hand; read the fence's bindings from the store."""


@dataclass(frozen=True, eq=False)
class Diff:
    add: U64  # (n, 2) ranges of the new version that the old one does not have
    add_interior: BOOL
    remove: U64  # (m, 2) ranges of the old version that the new one does not have
    digest: bytes  # of the new version's ranges and flags (see `digest`)

    @property
    def size(self) -> int:
        return len(self.add) + len(self.remove)


def digest(ranges: U64, interior: BOOL) -> bytes:
    """16 bytes that identify a set of ranges and flags (sorted, as bindings always are)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(np.ascontiguousarray(ranges, "<u8").tobytes())
    h.update(np.ascontiguousarray(interior, np.uint8).tobytes())
    return h.digest()


def _same_rows(old: U64, old_f: BOOL, new: U64, new_f: BOOL) -> tuple[BOOL, BOOL]:
    """(for each new range: the old version has it, for each old range: the new one has it).
    Both are sorted and disjoint, so a range is found by its first index alone."""
    if not len(old) or not len(new):
        return np.zeros(len(new), bool), np.zeros(len(old), bool)
    i = np.searchsorted(old[:, 0], new[:, 0])
    j = np.minimum(i, len(old) - 1)
    same = (i < len(old)) & (old[j, 0] == new[:, 0]) & (old[j, 1] == new[:, 1]) & (old_f[j] == new_f)
    kept = np.zeros(len(old), bool)
    kept[j[same]] = True
    return same, kept


def diff(old: U64, old_interior: BOOL, new: U64, new_interior: BOOL) -> Diff:
    old, new = old.reshape(-1, 2), new.reshape(-1, 2)
    same, kept = _same_rows(old, old_interior, new, new_interior)
    return Diff(new[~same], new_interior[~same], old[~kept], digest(new, new_interior))


def apply(old: U64, old_interior: BOOL, d: Diff) -> tuple[U64, BOOL]:
    """The new version's ranges; DiffMismatch if `old` is not what the diff was made from."""
    old = old.reshape(-1, 2)
    drop = np.zeros(len(old), bool)
    if len(d.remove):
        if not len(old):
            raise DiffMismatch(f"{len(d.remove)} ranges to remove from no ranges")
        i = np.searchsorted(old[:, 0], d.remove[:, 0])
        j = np.minimum(i, len(old) - 1)
        found = (i < len(old)) & (old[j, 0] == d.remove[:, 0]) & (old[j, 1] == d.remove[:, 1])
        if not found.all():
            raise DiffMismatch(f"{int((~found).sum())} of the ranges to remove are not bound")
        drop[j] = True
    ranges = np.concatenate([old[~drop], d.add.reshape(-1, 2)])
    flags = np.concatenate([old_interior[~drop], d.add_interior])
    order = np.argsort(ranges[:, 0], kind="stable")
    ranges, flags = ranges[order], flags[order]
    if digest(ranges, flags) != d.digest:
        raise DiffMismatch("the ranges after the diff differ from the new version's")
    return ranges, flags
