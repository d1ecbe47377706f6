"""`timeout_s`: an object silent this long inside a fence has left it (LEAVE `timeout`).

Its timer: a stay ends at the object's last position time + timeout_s. A fence change (see
fence/x_fence/core.py, "Fence changes") does not enter an object last seen more than
timeout_s before the change either: it would be timed out at once.
"""

from __future__ import annotations

from typing import Any, ClassVar

from shapely.geometry.base import BaseGeometry

from exchanges.fence_options.base import F64, FenceOption, number_in

DEFAULT_TIMEOUT_S = 300.0
MAX_TIMEOUT_S = 7 * 86400.0
TIMEOUT = "timeout"  # the LEAVE reason


def check_timeout(value: Any) -> float:
    return number_in("timeout_s", value, 0.0, MAX_TIMEOUT_S, "seconds", open_lo=True)


class Timeout(FenceOption):
    key: ClassVar[str] = "timeout_s"
    default: ClassVar[Any] = DEFAULT_TIMEOUT_S
    required: ClassVar[bool] = True
    reason: ClassVar[str] = TIMEOUT

    def check(self, raw: Any, geometry: BaseGeometry) -> float:
        return check_timeout(raw)

    def decode(self, raw: Any) -> float:
        return float(raw)

    def due(self, column: F64, last_ts: F64, ttl: F64) -> F64:
        out: F64 = last_ts + column
        return out


OPTION = Timeout()
