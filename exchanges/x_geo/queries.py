"""Spatial queries over the objects' last known positions, as the x-geo regions hold them
(pure: arrays in, rows out).

Each region's x-geo keeps every object's latest position while the object is in the region
(exchanges.x_geo.core.XGeo), so the regions together know where every object was last seen:
a query goes to each region (`answer`), and the caller merges their answers (`merge`). An
object that just crossed may be known to two regions for a moment: the newer position wins.

Kinds, all with the distance on the sphere (haversine, metres) where one is involved:
- `bbox`: objects with lon0 <= lon <= lon1 and lat0 <= lat <= lat1, by id, paged (`after`
  an id, `limit`);
- `within`: objects strictly inside a (Multi)Polygon (shapely.contains_xy, as the fences are
  judged), by id, paged;
- `nearby`: objects within `radius_m` of a point, nearest first, at most `k`.

Each may carry `where` (exchanges/fence_options/filters.py): conditions on the extra fields of the objects'
latest positions (which the rows return as `fields`), applied before the page or the k; and
`tenant`: only that tenant's objects (exchanges/tenancy.py; ids, `after` included, are the
qualified ones), also before the page or the k. Without one the query sees every tenant's
objects: the fence service sends one for every caller but an operator.

Trade-off: the regions answer from memory, so a query costs a scan of the region's present
objects (vectorised; a bbox prefilter before the exact test) and no index: a few ms per
million objects, and nothing to maintain on the hot path.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import shapely
from shapely.geometry.base import BaseGeometry

from exchanges.fence_options import filters
from exchanges.tenancy import NO_TENANT, TENANT_RULE, is_tenant, tenant_of

EARTH_RADIUS_M = 6_371_008.8
MAX_LIMIT = 10_000
KINDS = ("bbox", "within", "nearby")
F64 = npt.NDArray[np.float64]


class InvalidQuery(ValueError):
    """What is wrong with a query, in words a user can act on."""


@dataclass(frozen=True, eq=False)
class Query:
    kind: str
    bbox: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    shape: BaseGeometry | None = None
    point: tuple[float, float] = (0.0, 0.0)
    radius_m: float = 0.0
    limit: int = 1000
    after: str = ""
    where: tuple[filters.Clause, ...] = ()
    tenant: str | None = None  # only this tenant's objects; None: every tenant's

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"query": self.kind, "limit": self.limit, "after": self.after}
        if self.tenant is not None:
            out["tenant"] = self.tenant
        if self.where:
            out["where"] = filters.to_wire(self.where)
        if self.kind == "bbox":
            out["bbox"] = list(self.bbox)
        elif self.kind == "within":
            assert self.shape is not None
            out["shape"] = shapely.to_geojson(self.shape)
        else:
            out["point"], out["radius_m"] = list(self.point), self.radius_m
        return out


def _number(v: Any, what: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise InvalidQuery(f"{what} {v!r}: a number in [{lo:g}, {hi:g}]")
    return float(v)


def parse(msg: Mapping[str, Any]) -> Query:
    """A query as the API, the CLI or the wire gives it ({"query": kind, ...}); InvalidQuery
    says what is wrong."""
    kind = msg.get("query")
    if kind not in KINDS:
        raise InvalidQuery(f"query {kind!r}: one of {', '.join(KINDS)}")
    limit = msg.get("limit", 1000)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidQuery(f"limit {limit!r}: an integer in [1, {MAX_LIMIT}]")
    after = msg.get("after", "")
    if not isinstance(after, str) or len(after) > 200:
        raise InvalidQuery("after: an object id (the previous page's last)")
    try:
        where = filters.parse(msg.get("where"))
    except filters.InvalidFilter as exc:
        raise InvalidQuery(str(exc)) from None
    tenant = msg.get("tenant")
    if tenant is not None and not (tenant == NO_TENANT or is_tenant(tenant)):
        raise InvalidQuery(f"tenant {str(tenant)[:60]!r}: {TENANT_RULE}")
    q = _parse_kind(kind, msg, limit, after, where)
    return q if tenant is None else dataclasses.replace(q, tenant=tenant)


def _parse_kind(kind: str, msg: Mapping[str, Any], limit: int, after: str,
                where: tuple[filters.Clause, ...]) -> Query:
    if kind == "bbox":
        b = msg.get("bbox")
        if not isinstance(b, list | tuple) or len(b) != 4:
            raise InvalidQuery("bbox: [lon0, lat0, lon1, lat1]")
        x0, x1 = (_number(b[i], "bbox lon", -180, 180) for i in (0, 2))
        y0, y1 = (_number(b[i], "bbox lat", -90, 90) for i in (1, 3))
        if x1 < x0 or y1 < y0:
            raise InvalidQuery("bbox: lon0 <= lon1 and lat0 <= lat1")
        return Query("bbox", bbox=(x0, y0, x1, y1), limit=limit, after=after, where=where)
    if kind == "within":
        raw = msg.get("shape")
        try:
            shape = shapely.from_geojson(raw) if isinstance(raw, str | bytes) else shapely.geometry.shape(raw)
        except (shapely.errors.GEOSException, ValueError, TypeError, AttributeError, KeyError) as exc:
            raise InvalidQuery(f"shape: a GeoJSON Polygon or MultiPolygon ({exc})") from None
        if shape.geom_type not in ("Polygon", "MultiPolygon") or shape.is_empty:
            raise InvalidQuery(f"shape: a GeoJSON Polygon or MultiPolygon, not {shape.geom_type}")
        if not shape.is_valid:
            raise InvalidQuery(f"shape: not a valid polygon ({shapely.is_valid_reason(shape)})")
        return Query("within", shape=shape, limit=limit, after=after, where=where)
    p = msg.get("point")
    if not isinstance(p, list | tuple) or len(p) != 2:
        raise InvalidQuery("point: [lon, lat]")
    point = (_number(p[0], "lon", -180, 180), _number(p[1], "lat", -90, 90))
    radius = _number(msg.get("radius_m"), "radius_m", 0, 1_000_000)
    return Query("nearby", point=point, radius_m=radius, limit=limit, where=where)


def distance_m(lon0: float, lat0: float, lon: F64, lat: F64) -> F64:
    """Haversine distances from (lon0, lat0), metres."""
    p0, p, dl = np.radians(lat0), np.radians(lat), np.radians(lon - lon0)
    a = np.sin((p - p0) / 2) ** 2 + np.cos(p0) * np.cos(p) * np.sin(dl / 2) ** 2
    out: F64 = 2 * EARTH_RADIUS_M * np.arcsin(np.sqrt(np.minimum(a, 1.0)))
    return out


def answer(q: Query, ids: Sequence[str], lon: F64, lat: F64, ts: F64,
           extra: npt.NDArray[np.object_] | None = None) -> list[dict[str, Any]]:
    """One region's rows (its present objects given as columns, `extra` their latest extra
    fields): each {id, lon, lat, ts} (distance_m for nearby, fields when the position had
    some), at most q.limit, in the query's order."""
    rows = []
    for i, d in _picked(q, ids, lon, lat, extra):
        row: dict[str, Any] = {"id": ids[i], "lon": float(lon[i]), "lat": float(lat[i]), "ts": float(ts[i])}
        if d is not None:
            row["distance_m"] = d
        if extra is not None and extra[i]:
            row["fields"] = extra[i]
        rows.append(row)
    return rows


def _matching(q: Query, sel: npt.NDArray[np.int64], extra: npt.NDArray[np.object_] | None,
              ids: Sequence[str]) -> npt.NDArray[np.bool_]:
    """Which rows of `sel` are of the query's tenant and have extra fields that pass its filter."""
    if q.tenant is None:
        ok = np.ones(sel.size, bool)
    else:
        tenant = q.tenant
        ok = np.fromiter((tenant_of(ids[i]) == tenant for i in sel.tolist()), bool, sel.size)
    if not q.where or not sel.size:
        return ok
    return ok & filters.matches(q.where, [None] * sel.size if extra is None else extra[sel].tolist())


def _picked(q: Query, ids: Sequence[str], lon: F64, lat: F64,
            extra: npt.NDArray[np.object_] | None) -> list[tuple[int, float | None]]:
    """The answer's objects (their index, and their distance for nearby), in order."""
    if q.kind == "nearby":
        x, y = q.point
        dlat = np.degrees(q.radius_m / EARTH_RADIUS_M)
        dlon = dlat / max(np.cos(np.radians(min(abs(y) + dlat, 89.9))), 1e-9)
        near = np.flatnonzero((np.abs(lat - y) <= dlat) & (np.abs(((lon - x + 180) % 360) - 180) <= dlon))
        d = distance_m(x, y, lon[near], lat[near])
        keep = d <= q.radius_m
        near, d = near[keep], d[keep]
        keep = _matching(q, near, extra, ids)
        ranked = sorted((dd, ids[i], i) for dd, i in zip(d[keep].tolist(), near[keep].tolist(), strict=True))
        return [(i, dd) for dd, _, i in ranked[: q.limit]]
    x0, y0, x1, y1 = q.bbox if q.kind == "bbox" else q.shape.bounds  # type: ignore[union-attr]
    sel = np.flatnonzero((lon >= x0) & (lon <= x1) & (lat >= y0) & (lat <= y1))
    if q.kind == "within" and sel.size:
        sel = sel[shapely.contains_xy(q.shape, lon[sel], lat[sel])]
    sel = sel[_matching(q, sel, extra, ids)]
    picked = sorted((ids[i], i) for i in sel.tolist() if ids[i] > q.after)[: q.limit]
    return [(i, None) for _, i in picked]


def merge(q: Query, answers: Iterable[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """The regions' answers as one: an object known to two regions keeps its newer position;
    in the query's order, at most q.limit; `next_after` when a bbox / within page is full."""
    best: dict[str, Mapping[str, Any]] = {}
    for rows in answers:
        for r in rows:
            have = best.get(r["id"])
            if have is None or r["ts"] > have["ts"]:
                best[r["id"]] = r
    if q.kind == "nearby":
        rows = sorted(best.values(), key=lambda r: (r["distance_m"], r["id"]))[: q.limit]
        return {"query": q.kind, "objects": rows}
    rows = [best[k] for k in sorted(best)][: q.limit]
    out: dict[str, Any] = {"query": q.kind, "objects": rows}
    if len(rows) == q.limit:
        out["next_after"] = rows[-1]["id"]
    return out
