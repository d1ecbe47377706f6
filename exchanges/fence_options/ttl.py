"""`ttl`: a position's own time to live (a field of the position, not of the fence: Tile38's
`SET ... EX`). An object whose latest position had a TTL and that is silent longer than it
has left every fence it was in (LEAVE `expired`), when that comes before the fence's timeout.
x-ingress checks the field (`ttl_problem`); x-fence keeps the TTL of each object's latest
position it was sent (a re-check row, which carries no extra fields, keeps the TTL it had).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from shapely.geometry.base import BaseGeometry

from exchanges.fence_options.base import F64, FenceOption

MAX_TTL_S = 7 * 86400.0
EXPIRED = "expired"  # the LEAVE reason


def ttl_problem(v: Any) -> str | None:
    """What is wrong with a position's `ttl` field, None if nothing."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= MAX_TTL_S:
        return f"ttl {str(v)[:40]!r}: seconds in (0, {MAX_TTL_S:g}]"
    return None


def ttl_of(fields: Mapping[str, Any] | None) -> float:
    """The TTL a position's extra fields give its object (inf: none)."""
    return float(fields["ttl"]) if fields is not None and "ttl" in fields else float("inf")


class Ttl(FenceOption):
    key: ClassVar[str] = "ttl"
    default: ClassVar[Any] = float("inf")
    reason: ClassVar[str] = EXPIRED
    on_fence: ClassVar[bool] = False

    def check(self, raw: Any, geometry: BaseGeometry) -> float:
        raise TypeError("ttl is a field of positions, not of fences")

    def due(self, column: F64, last_ts: F64, ttl: F64) -> F64:
        out: F64 = last_ts + ttl
        return out


OPTION = Ttl()
