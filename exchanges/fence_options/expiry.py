"""`expires_at`: the fence holds no one from this time on (as Radar's and AWS Location's
expiring geofences): a campaign's area, a temporary closure, an event's venue.

Epoch seconds; the API also takes an RFC 3339 time with its offset ("2026-12-24T18:00:00Z").
Its refusal: a position at or after `expires_at` is outside the fence, so nothing ENTERs it any
more (x-fence judges a position at the time its event would carry: a change of the fence after
its expiry enters no one). Its timer: x-fence LEAVEs every object still inside at `expires_at`, reason
`fence_expired` (a stay still within its dwell time ends silently, as for every timer). The
fence stays defined: its history stays readable, and a PUT can move `expires_at` or remove it
(`null`); delete it to drop its bindings. As for the timeout, the timer runs when the worker's
clock passes the time: an object whose next position after `expires_at` reaches the worker
first (a device clock ahead of the worker's) LEAVEs `exited` at that position instead.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, ClassVar

from shapely.geometry.base import BaseGeometry

from exchanges.fence_options.base import F64, Bools, FenceOption, Fields, InvalidFence, shown

FENCE_EXPIRED = "fence_expired"  # the LEAVE reason
MAX_EXPIRES_AT = 4_102_444_800.0  # 2100-01-01T00:00:00Z


def check_expires_at(value: Any) -> float:
    """Epoch seconds in (0, 2100-01-01], or an RFC 3339 time with an offset; None: never."""
    if value is None:
        return math.inf
    if isinstance(value, str) and len(value) <= 40:
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidFence(f"expires_at {shown(value)}: not an RFC 3339 time "
                               "(e.g. \"2026-12-24T18:00:00Z\")") from None
        if when.tzinfo is None:
            raise InvalidFence(f"expires_at {shown(value)}: give the time's offset (Z or +hh:mm)")
        value = when.timestamp()
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_EXPIRES_AT:
        raise InvalidFence(f"expires_at {shown(value)}: epoch seconds up to {MAX_EXPIRES_AT:.0f} (2100), "
                           "an RFC 3339 time with its offset, or null")
    return float(value)


class Expiry(FenceOption):
    key: ClassVar[str] = "expires_at"
    default: ClassVar[Any] = math.inf
    refuses: ClassVar[bool] = True
    by_column: ClassVar[bool] = True
    reason: ClassVar[str] = FENCE_EXPIRED

    def check(self, raw: Any, geometry: BaseGeometry) -> float:
        return check_expires_at(raw)

    def decode(self, raw: Any) -> float:
        return float(raw)

    def outside(self, value: Any, ts: F64, fields: Fields) -> Bools:
        out: Bools = ts >= value
        return out

    def due(self, column: F64, last_ts: F64, ttl: F64) -> F64:
        return column


OPTION = Expiry()
