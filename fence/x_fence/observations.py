"""A batch's fresh observations per object, and the (object, fence, observation) entries
sorted into stays: the numbering that lets x-fence apply a batch with array operations
(see fence/x_fence/core.py, "Trade-off")."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fence.x_fence.table import F64, I64


@dataclass(frozen=True, eq=False)
class Observations:
    """The fresh observations of one batch, per object (a "group", by ascending code)."""

    objs: I64  # object code of each group
    k: I64  # number of the group's last observation (0: only its stored state's ts)
    base: I64  # index in obs_ts of the group's observation number 0
    obs_ts: F64
    last: I64  # batch index of the group's last position
    pos_group: I64  # per position: its group, -1 if stale
    pos_seq: I64  # per position: its observation number, -1 if stale

    single: bool = False  # every object has one observation (number 1), newer than stored

    @staticmethod
    def single_of(obj: I64, ts: F64, order: I64) -> Observations:
        """Distinct objects, each with one position newer than stored (order sorts obj)."""
        n = obj.size
        pos_group = np.empty(n, np.int64)
        pos_group[order] = np.arange(n)
        return Observations(obj[order], np.ones(n, np.int64), np.arange(n) - 1, ts[order], order,
                             pos_group, np.ones(n, np.int64), single=True)

    def ts_of(self, group: I64, seq: I64) -> F64:
        out: F64 = self.obs_ts[self.base[group] + seq]
        return out


@dataclass(frozen=True, eq=False)
class Pairs:
    """(group, fence, observation number) entries sorted in that order; a run of
    consecutive numbers of one (group, fence) is a stay inside the fence."""

    group: I64
    fence: I64
    seq: I64
    stored: npt.NDArray[np.bool_]  # the entry is the stored state (number 0, with its since)
    since: F64  # meaningful where stored
    run_start: npt.NDArray[np.bool_]
    run_end: npt.NDArray[np.bool_]


def pair_order(group: I64, fence: I64, seq: I64, n_sorted: int, n_groups: int, n_fences: int,
                n_seq: int) -> I64:
    """Stable order by (group, fence, seq) when the first n_sorted entries are already in
    that order. One int64 key when it fits: sorting the rest and merging the two runs
    (timsort finds them) is ~10x cheaper than a three-key lexsort."""
    if n_groups * max(n_fences, 1) * n_seq >= 1 << 62:
        return np.lexsort((seq, fence, group))
    key = (group * n_fences + fence) * n_seq + seq
    order = np.r_[np.arange(n_sorted), np.argsort(key[n_sorted:]) + n_sorted]
    merged: I64 = order[np.argsort(key[order], kind="stable")]
    return merged
