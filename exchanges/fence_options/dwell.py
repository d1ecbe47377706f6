"""`dwell_s`: a stay counts, and is reported, only once the object has been inside this long.

Its ENTER waits (the pair is inside, *unconfirmed*), the first observation inside at
`since + dwell_s` or later emits ENTER reason `dwelled` and confirms it, and the LEAVE of a
stay never confirmed is silent: a shorter stay gives no event at all. x-fence keeps the
unconfirmed stays beside its pair table (fence/x_fence/judging.py) and in its journal.
"""

from __future__ import annotations

from typing import Any, ClassVar

from shapely.geometry.base import BaseGeometry

from exchanges.fence_options.base import F64, Bools, FenceOption, number_in

MAX_DWELL_S = 86_400.0
DWELLED = "dwelled"  # the reason of the ENTER of a stay past its dwell time


def check_dwell(value: Any) -> float:
    """A fence's `dwell_s`: seconds in [0, 86400] (0: ENTER at once, as without dwell)."""
    return number_in("dwell_s", value, 0.0, MAX_DWELL_S, "seconds")


def reached(ts: F64, since: F64, dwell_s: F64) -> Bools:
    """Per stay seen inside at `ts` that began at `since`: whether it has lasted its dwell time
    (the rule, for x-fence and the reference alike)."""
    out: Bools = ts - since >= dwell_s
    return out


class Dwell(FenceOption):
    key: ClassVar[str] = "dwell_s"
    default: ClassVar[Any] = 0.0

    def check(self, raw: Any, geometry: BaseGeometry) -> float:
        return check_dwell(raw)

    def decode(self, raw: Any) -> float:
        return float(raw)


OPTION = Dwell()
