"""A proximity subscription as the API takes it and the wire carries it (issue 20): a circle of
`radius_m` that follows one object, matching the other objects whose id matches the glob `match`
and whose latest position's extra fields pass `where` (exchanges/filters.py). The router
(exchanges/roam_routing.py) and the workers' matchers (fence/x_fence/roaming.py) hold them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exchanges import filters
from exchanges.ids import check_object_id

MAX_RADIUS_M = 50_000.0


class InvalidSubscription(ValueError):
    """What is wrong with a subscription, in words a user can act on."""


@dataclass(frozen=True)
class Subscription:
    id: str
    object: str  # the subscriber: the moving object the circle follows
    radius_m: float
    match: str = "*"  # glob on the other object's id
    where: tuple[filters.Clause, ...] = ()

    def __post_init__(self) -> None:
        if not self.id or not self.object:
            raise InvalidSubscription("a subscription needs an id and an object")
        for what, value in (("id", self.id), ("object", self.object)):
            try:
                check_object_id(value)
            except ValueError as exc:
                raise InvalidSubscription(f"{what}: {exc}") from None
        r = self.radius_m
        if isinstance(r, bool) or not isinstance(r, int | float) or not 0 < r <= MAX_RADIUS_M:
            raise InvalidSubscription(f"radius_m must be a number in (0, {MAX_RADIUS_M:.0f}], got {r!r}")

    @staticmethod
    def from_wire(msg: Mapping[str, Any]) -> Subscription:
        unknown = set(msg) - {"id", "object", "radius_m", "match", "where"}
        if unknown:
            raise InvalidSubscription(f"unknown fields {sorted(unknown)}")
        match = msg.get("match", "*")
        if not isinstance(match, str) or not match:
            raise InvalidSubscription("match must be a non-empty glob string")
        try:
            where = filters.parse(msg.get("where", []))
        except filters.InvalidFilter as exc:
            raise InvalidSubscription(f"where: {exc}") from None
        return Subscription(str(msg.get("id", "")), str(msg.get("object", "")),
                            msg.get("radius_m"), match, where)  # type: ignore[arg-type]

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "object": self.object, "radius_m": self.radius_m}
        if self.match != "*":
            d["match"] = self.match
        if self.where:
            d["where"] = filters.to_wire(self.where)
        return d
