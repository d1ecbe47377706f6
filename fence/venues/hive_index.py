"""The public hive search (no I/O): hives by name, type and distance, as the app asks
`GET /hives?near=lon,lat&radius_m=&type=&q=`.

The index keeps the hives sorted by longitude (sortedcontainers): a `near` query takes the
band of longitudes the radius can reach by bisection, then measures the great-circle distance
of that band only. Names match case- and accent-insensitively, by word prefix or substring.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sortedcontainers import SortedKeyList

EARTH_RADIUS_M = 6_371_008.8
MAX_RADIUS_M = 50_000.0
MAX_RESULTS = 100


@dataclass(frozen=True, slots=True)
class HiveCard:
    """What the public sees of a hive, without its live status."""

    hive_id: str
    name: str
    type: str
    address: str
    lon: float
    lat: float
    tz: str
    capacity: int | None
    opening_hours: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.hive_id, "name": self.name, "type": self.type, "address": self.address,
                "lon": self.lon, "lat": self.lat, "tz": self.tz, "capacity": self.capacity,
                "opening_hours": self.opening_hours}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HiveCard:
        return cls(d["id"], d["name"], d["type"], d.get("address", ""), float(d["lon"]), float(d["lat"]),
                   d.get("tz", "UTC"), d.get("capacity"), d.get("opening_hours") or {})


def fold(text: str) -> str:
    """Lower case without accents: 'Café Zürich' -> 'cafe zurich'."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()


def distance_m(lon1: float, lat1: float, lon2: float, lat2: float) -> float:
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    a = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(a)))


class SearchError(ValueError):
    """A query the search refuses (the API answers 422 with it)."""


def parse_near(near: str | None, radius_m: float | None) -> tuple[float, float, float] | None:
    if near is None:
        if radius_m is not None:
            raise SearchError("radius_m needs near=lon,lat")
        return None
    try:
        lon_s, lat_s = near.split(",")
        lon, lat = float(lon_s), float(lat_s)
    except ValueError:
        raise SearchError(f"near={near!r}: lon,lat expected") from None
    if not (-180 <= lon <= 180 and -90 <= lat <= 90):
        raise SearchError(f"near={near!r}: lon in [-180, 180] and lat in [-90, 90]")
    r = 1000.0 if radius_m is None else radius_m
    if not (0 < r <= MAX_RADIUS_M) or math.isnan(r):
        raise SearchError(f"radius_m={radius_m}: in (0, {MAX_RADIUS_M:g}] metres")
    return lon, lat, r


class HiveIndex:
    def __init__(self, cards: Iterable[HiveCard] = ()) -> None:
        self.by_lon: SortedKeyList = SortedKeyList(key=lambda c: c.lon)
        self.by_id: dict[str, HiveCard] = {}
        self.names: dict[str, str] = {}
        for c in cards:
            self.add(c)

    def __len__(self) -> int:
        return len(self.by_id)

    def add(self, card: HiveCard) -> None:
        if card.hive_id in self.by_id:
            self.remove(card.hive_id)
        self.by_id[card.hive_id] = card
        self.names[card.hive_id] = fold(card.name)
        self.by_lon.add(card)

    def remove(self, hive_id: str) -> None:
        card = self.by_id.pop(hive_id, None)
        if card is not None:
            self.by_lon.remove(card)
            self.names.pop(hive_id, None)

    def to_json(self) -> list[dict[str, Any]]:
        return [c.to_json() for c in self.by_lon]

    @classmethod
    def from_json(cls, rows: Sequence[dict[str, Any]]) -> HiveIndex:
        return cls(HiveCard.from_json(r) for r in rows)

    def search(self, near: tuple[float, float, float] | None = None, type_: str | None = None,
               q: str | None = None, limit: int = 50) -> list[tuple[HiveCard, float | None]]:
        """(card, metres away or None) of the hives that match, nearest first (by name when
        no `near`), at most `limit`."""
        if not 1 <= limit <= MAX_RESULTS:
            raise SearchError(f"limit={limit}: 1 to {MAX_RESULTS}")
        words = fold(q).split() if q else []
        if near is not None:
            lon, lat, r = near
            # the band of longitudes within r (wider near the poles; the whole world past them)
            cos_lat = math.cos(math.radians(lat))
            dlon = 360.0 if cos_lat < 1e-6 else math.degrees(r / (EARTH_RADIUS_M * cos_lat))
            candidates: Iterable[HiveCard] = (self.by_lon if dlon >= 180 else
                                              self._band(lon - dlon, lon + dlon))
        else:
            candidates = self.by_lon
        found: list[tuple[HiveCard, float | None]] = []
        for c in candidates:
            if type_ is not None and c.type != type_:
                continue
            if words and not all(w in self.names[c.hive_id] for w in words):
                continue
            d = None
            if near is not None:
                d = distance_m(near[0], near[1], c.lon, c.lat)
                if d > near[2]:
                    continue
            found.append((c, d))
        found.sort(key=lambda cd: (cd[1] if cd[1] is not None else 0.0, self.names[cd[0].hive_id],
                                   cd[0].hive_id))
        return found[:limit]

    def _band(self, lo: float, hi: float) -> Iterable[HiveCard]:
        """Cards with lon in [lo, hi], across the antimeridian when the band crosses it."""
        if lo < -180:
            yield from self.by_lon.irange_key(lo + 360, 180)
        yield from self.by_lon.irange_key(max(lo, -180), min(hi, 180))
        if hi > 180:
            yield from self.by_lon.irange_key(-180, hi - 360)
