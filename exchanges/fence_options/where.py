"""`where`: a filter on the positions' extra fields (exchanges/fence_options/filters.py): a
position that fails it is outside the fence (an object inside whose fields stop matching
LEAVEs; past any band). () = every position."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from shapely.geometry.base import BaseGeometry

from exchanges.fence_options import filters
from exchanges.fence_options.base import F64, Bools, FenceOption, Fields, InvalidFence


def check_where(raw: Any) -> tuple[filters.Clause, ...]:
    """A fence's `where` (a list of clauses); None or [] for none."""
    if raw is None:
        return ()
    try:
        return filters.parse(raw)
    except filters.InvalidFilter as exc:
        raise InvalidFence(str(exc)) from None


class Where(FenceOption):
    key: ClassVar[str] = "where"
    default: ClassVar[Any] = ()
    refuses: ClassVar[bool] = True

    def check(self, raw: Any, geometry: BaseGeometry) -> tuple[filters.Clause, ...]:
        return check_where(raw)

    def encode(self, value: Any) -> Any:
        return filters.to_wire(value)

    def decode(self, raw: Any) -> tuple[filters.Clause, ...]:
        return filters.parse(raw)

    def column(self, value: Any) -> float:
        return float(bool(value))

    def outside(self, value: Any, ts: F64, fields: Fields) -> Bools:
        out: Bools = ~filters.matches(value, fields)
        return out

    def outside_one(self, value: Any, ts: float, fields: Mapping[str, Any] | None) -> bool:
        return not bool(filters.matches(value, [fields])[0])


OPTION = Where()
