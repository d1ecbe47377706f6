"""A proximity subscription as the API takes it and the wire carries it (issue 20): a circle of
`radius_m` that follows one object, matching the other objects whose id matches the glob `match`
and whose latest position's extra fields pass `where` (exchanges/fence_options/filters.py). The router
(exchanges/roam_routing.py) and the workers' matchers (fence/x_fence/roaming.py) hold them.

A subscription on a fixed point (`point`: [lon, lat], no `object`) is a circle that stays put:
its subscriber is the synthetic object `@<id>` (no device id can start with `@`, so none
collides, and no subscription ever matches one as its other object), which the router places
at the point when the subscription is put, and forgets when it is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exchanges.fence_options import filters
from exchanges.ids import check_object_id
from exchanges.tenancy import InvalidTenant, check_tenant, split, tenant_of

MAX_RADIUS_M = 50_000.0
POINT_PREFIX = "@"  # the synthetic subscriber of a subscription on a fixed point: "@<id>"


def point_object(sub_id: str) -> str:
    return f"{POINT_PREFIX}{sub_id}"


def is_point_object(obj: str) -> bool:
    return obj.startswith(POINT_PREFIX)


class InvalidSubscription(ValueError):
    """What is wrong with a subscription, in words a user can act on."""


@dataclass(frozen=True)
class Subscription:
    id: str
    object: str  # the subscriber: the moving object the circle follows
    radius_m: float
    match: str = "*"  # glob on the other object's id
    where: tuple[filters.Clause, ...] = ()
    point: tuple[float, float] | None = None  # (lon, lat) of a fixed circle; then object is "@<id>"

    def __post_init__(self) -> None:
        if not self.id or not self.object:
            raise InvalidSubscription("a subscription needs an id and an object (or a point)")
        for what, value in (("id", self.id), *((("object", self.object),) if self.point is None else ())):
            tenant, name = split(value)
            try:
                check_object_id(name)
                if tenant:
                    check_tenant(tenant)
            except (ValueError, InvalidTenant) as exc:
                raise InvalidSubscription(f"{what}: {exc}") from None
        if self.point is None and tenant_of(self.object) != self.tenant:
            raise InvalidSubscription("a subscription follows an object of its own tenant")
        if self.point is not None:
            lon, lat = self.point
            if self.object != point_object(self.id):
                raise InvalidSubscription("a subscription on a point has no object")
            if not (-180 <= lon <= 180 and -90 <= lat <= 90):
                raise InvalidSubscription(f"point [{lon}, {lat}]: lon in [-180, 180], lat in [-90, 90]")
        r = self.radius_m
        if isinstance(r, bool) or not isinstance(r, int | float) or not 0 < r <= MAX_RADIUS_M:
            raise InvalidSubscription(f"radius_m must be a number in (0, {MAX_RADIUS_M:.0f}], got {r!r}")

    @staticmethod
    def from_wire(msg: Mapping[str, Any]) -> Subscription:
        unknown = set(msg) - {"id", "object", "radius_m", "match", "where", "point"}
        if unknown:
            raise InvalidSubscription(f"unknown fields {sorted(unknown)}")
        point = None
        if msg.get("point") is not None:
            raw = msg["point"]
            if "object" in msg:
                raise InvalidSubscription("a subscription follows an object or stays on a point, not both")
            if not (isinstance(raw, list | tuple) and len(raw) == 2
                    and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                            for v in raw)):
                raise InvalidSubscription(f"point {str(raw)[:60]}: [lon, lat] expected")
            point = (float(raw[0]), float(raw[1]))
        match = msg.get("match", "*")
        if not isinstance(match, str) or not match:
            raise InvalidSubscription("match must be a non-empty glob string")
        try:
            where = filters.parse(msg.get("where", []))
        except filters.InvalidFilter as exc:
            raise InvalidSubscription(f"where: {exc}") from None
        sub_id = str(msg.get("id", ""))
        obj = point_object(sub_id) if point is not None and sub_id else str(msg.get("object", ""))
        return Subscription(sub_id, obj, msg.get("radius_m"), match, where, point)  # type: ignore[arg-type]

    @property
    def tenant(self) -> str:
        """The tenant the subscription is of (its id's, exchanges/tenancy.py): it sees only
        that tenant's objects."""
        return tenant_of(self.id)

    @property
    def filter_key(self) -> tuple[str, str, tuple[filters.Clause, ...]]:
        """What decides which other objects it matches: its tenant, its glob, its filter."""
        return self.tenant, self.match, self.where

    def to_wire(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "radius_m": self.radius_m}
        if self.point is None:
            d["object"] = self.object
        else:
            d["point"] = list(self.point)
        if self.match != "*":
            d["match"] = self.match
        if self.where:
            d["where"] = filters.to_wire(self.where)
        return d
