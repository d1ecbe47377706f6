"""The ground truth for ENTER / LEAVE: shapely alone, update by update in time order.

Independent of the Hilbert path (no covering, no range index, no x-geo): an STRtree over the
fences gives bounding-box candidates, then the very predicate x-fence applies
(`shapely.contains_xy`: strictly inside, a point on the edge is out) decides. The benchmarks,
the tests and the demo compare what the pipeline emitted with this, event for event.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Any

import numpy as np
import numpy.typing as npt
import shapely
from shapely.geometry.base import BaseGeometry

from exchanges.fence_def import FenceDef
from exchanges.fence_events import CROSS, CROSSED, DWELLED, ENTER, ENTERED, EXITED, LEAVE, visit_id
from exchanges.fence_options import filters, refused_one, refusing
from exchanges.fence_options.band import hysteresis_zones
from exchanges.fence_options.cross import CROSS_MAX_SEGMENT_DEG, crosses
from exchanges.tenancy import name_of, tenant_of

EventTuple = tuple[str, str, str, float, str]  # (event, fence_id, object_id, ts, reason)


def reference_events(names: Sequence[str], geometries: Sequence[BaseGeometry], object_ids: Sequence[str],
                     obj: npt.NDArray[np.integer[Any]], lon: npt.NDArray[np.float64],
                     lat: npt.NDArray[np.float64], ts: npt.NDArray[np.float64],
                     chunk: int = 100_000, inside: list[frozenset[int]] | None = None,
                     hysteresis: Sequence[float] | None = None,
                     extras: Sequence[Any] | None = None, dwell: Sequence[float] | None = None,
                     waiting: dict[int, dict[int, float]] | None = None,
                     fences: Sequence[FenceDef] | None = None) -> list[EventTuple]:
    """Events of positions (obj[i] indexes object_ids), taken in the order given (sort them
    by ts per object first). Every object starts outside every fence, or, with `inside`
    (per object, the fence indexes it is in; updated here), where an earlier call left it.
    With `hysteresis` (metres per fence, 0: none), a fence with a band holds a position
    inside only past the band inward, outside only past it outward, and within it as the
    object was at its position before (exchanges/fence_options/band.py `hysteresis_zones`).
    With `dwell` (seconds per fence, 0: none), a stay in a fence with a dwell time is reported
    only at its first position at least that long after the stay began (ENTER `dwelled`), and a stay that ends
    before has no event; `waiting` (per object, fence: when the stay began; updated here) holds
    the stays not reported yet across calls. With `fences` (per fence, its definition) and
    `extras` (each position's extra fields), a position an option of its fence refuses
    (exchanges/fence_options/: its filter, its expiry, ...; each option's `outside_one`) is
    outside it (past any band); its band and dwell time are the definitions' unless
    `hysteresis` / `dwell` are given."""
    geoms = np.array(list(geometries), dtype=object)
    if fences is not None:  # the definitions say the band and the dwell time too
        hysteresis = [f.hysteresis_m for f in fences] if hysteresis is None else hysteresis
        dwell = [f.dwell_s for f in fences] if dwell is None else dwell
    band = [float(m) for m in hysteresis] if hysteresis is not None else [0.0] * len(geoms)
    zones = [hysteresis_zones(g, m) if m else (g, g) for g, m in zip(geoms, band, strict=True)]
    inner = np.array([z[0] for z in zones], dtype=object)
    outer = np.array([z[1] for z in zones], dtype=object)
    tree = shapely.STRtree(outer)
    if inside is None:
        inside = [frozenset()] * len(object_ids)
    dwell_s = [float(d) for d in dwell] if dwell is not None else [0.0] * len(geoms)
    refuses = np.array([bool(refusing(f)) for f in fences] if fences is not None else [], bool)
    if waiting is None:
        waiting = {}
    events: list[EventTuple] = []
    for lo in range(0, len(obj), chunk):
        hi = min(lo + chunk, len(obj))
        x, y = lon[lo:hi], lat[lo:hi]
        pt, fi = tree.query(shapely.points(x, y))
        zone = shapely.contains_xy(outer[fi], x[pt], y[pt]).astype(np.int8) + \
            shapely.contains_xy(inner[fi], x[pt], y[pt])  # without a band: 0 or 2
        if fences is not None:  # an option of the fence refuses the position: outside
            for j in np.flatnonzero((zone > 0) & refuses[fi]).tolist():
                i = lo + int(pt[j])
                if refused_one(fences[int(fi[j])], float(ts[i]), extras[i] if extras else None):
                    zone[j] = 0
        ok = zone > 0
        pt, fi, zone = pt[ok], fi[ok], zone[ok]
        order = np.lexsort((fi, pt))
        pt, fi, zone = pt[order], fi[order], zone[order]
        ptr = np.searchsorted(pt, np.arange(hi - lo + 1))
        fence_lists, zone_lists = fi.tolist(), zone.tolist()
        for i, o in enumerate(obj[lo:hi].tolist()):
            before = inside[o]
            now = frozenset(f for f, z in zip(fence_lists[ptr[i]:ptr[i + 1]], zone_lists[ptr[i]:ptr[i + 1]],
                                              strict=True) if z == 2 or f in before)
            oid, t = object_ids[o], float(ts[lo + i])
            if now != before:
                wait = waiting.setdefault(o, {})
                for f in now - before:
                    if dwell_s[f] > 0:
                        wait[f] = t
                    else:
                        events.append((ENTER, names[f], oid, t, ENTERED))
                for f in before - now:
                    if wait.pop(f, None) is None:
                        events.append((LEAVE, names[f], oid, t, EXITED))
                inside[o] = now
            pending = waiting.get(o)
            if pending:
                for f, since in list(pending.items()):
                    if t - since >= dwell_s[f]:
                        events.append((ENTER, names[f], oid, t, DWELLED))
                        del pending[f]
    return events


def cross_events(names: Sequence[str], geometries: Sequence[BaseGeometry], object_ids: Sequence[str],
                 obj: npt.NDArray[np.integer[Any]], lon: npt.NDArray[np.float64],
                 lat: npt.NDArray[np.float64], ts: npt.NDArray[np.float64],
                 region: npt.NDArray[np.integer[Any]] | None = None,
                 extras: Sequence[Any] | None = None, fences: Sequence[FenceDef] | None = None
                 ) -> list[EventTuple]:
    """CROSS events of positions (each object's in time order) for the fences given (those
    that detect it): an object's consecutive positions, in one region (`region`, per
    position; None: one region) and at most CROSS_MAX_SEGMENT_DEG apart on each axis, both
    outside the fence with the segment between them through it (exchanges/fence_options/cross.py
    `crosses`); with `fences`, no option of the fence refuses the second position (its filter,
    ...). Every pair of positions and fence is tested (no bounding-box step)."""
    order = np.lexsort((np.arange(len(obj)), obj))  # each object's positions, in the order given
    o = np.asarray(obj)[order]
    cur = order[1:][o[1:] == o[:-1]]
    before = order[:-1][o[1:] == o[:-1]]
    keep = (ts[before] < ts[cur]) & (np.abs(lon[cur] - lon[before]) <= CROSS_MAX_SEGMENT_DEG) \
        & (np.abs(lat[cur] - lat[before]) <= CROSS_MAX_SEGMENT_DEG)
    if region is not None:
        keep &= region[cur] == region[before]
    cur, before = cur[keep], before[keep]
    events: list[EventTuple] = []
    for f, (name, g) in enumerate(zip(names, geometries, strict=True)):
        hit = np.flatnonzero(crosses(np.full(cur.size, g, dtype=object), lon[before], lat[before], lon[cur],
                                     lat[cur]))
        for i in cur[hit].tolist():
            if fences is not None and refused_one(fences[f], float(ts[i]), extras[i] if extras else None):
                continue
            events.append((CROSS, name, object_ids[int(obj[i])], float(ts[i]), CROSSED))
    return events


def compare(got: Sequence[EventTuple], want: Sequence[EventTuple], show: int = 10) -> list[str]:
    """Empty if both are the same multiset; else the first differences, described."""
    g, w = sorted(got), sorted(want)
    if g == w:
        return []
    extra = Counter(g) - Counter(w)
    missing = Counter(w) - Counter(g)
    lines = [f"{len(g)} events, the reference has {len(w)}: "
             f"{sum(extra.values())} unexpected, {sum(missing.values())} missing"]
    lines += [f"  unexpected {e}" for e in sorted(extra)[:show]]
    lines += [f"  missing    {e}" for e in sorted(missing)[:show]]
    return lines


def visit_problems(events: Sequence[Any]) -> list[str]:
    """What is wrong with the visits of events (exchanges.fence_events.Event, in the order
    emitted): each ENTER opens a stay whose visit id hashes (fence, object, its ts), or, for a
    `dwelled` one, the stay's start, inside_s before it; the next LEAVE of that (fence, object)
    carries the same id and inside_s = the time since the stay began."""
    open_at: dict[tuple[str, str], Any] = {}
    bad = []
    for e in events:
        k = (e.fence_id, e.object_id)
        if e.event == ENTER and e.reason == DWELLED:  # the stay began inside_s before it
            if e.inside_s is None or e.inside_s < 0 or not e.visit_id:
                bad.append(f"ENTER dwelled {k} at {e.ts}: visit {e.visit_id!r}, inside_s {e.inside_s}")
            open_at[k] = e
            continue
        if e.event == ENTER:
            if e.visit_id != visit_id(e.fence_id, e.object_id, e.ts) or e.inside_s is not None:
                bad.append(f"ENTER {k} at {e.ts}: visit {e.visit_id}, inside_s {e.inside_s}")
            open_at[k] = e
            continue
        enter = open_at.pop(k, None)
        if enter is None:
            continue  # the stay began before these events
        expected = e.ts - enter.ts + (enter.inside_s or 0.0)
        if e.visit_id != enter.visit_id or e.inside_s is None or not math.isclose(e.inside_s, expected,
                                                                                   abs_tol=1e-6):
            bad.append(f"LEAVE {k} at {e.ts}: visit {e.visit_id} (ENTER's {enter.visit_id}), "
                       f"inside_s {e.inside_s} (expected {expected})")
    return bad


RoamTuple = tuple[str, str, str, float]  # (subscription, object, "nearby" | "faraway", ts)


def _haversine_m(lon0: Any, lat0: Any, lon1: Any, lat1: Any) -> npt.NDArray[np.float64]:
    p0, p1 = np.radians(lat0), np.radians(lat1)
    dl = np.radians(np.subtract(lon1, lon0))
    a = np.sin((p1 - p0) / 2) ** 2 + np.cos(p0) * np.cos(p1) * np.sin(dl / 2) ** 2
    out: npt.NDArray[np.float64] = 2 * 6_371_008.8 * np.arcsin(np.sqrt(np.minimum(a, 1.0)))
    return out


def roam_events(subscriptions: Sequence[Any], ids: Sequence[str], lon: npt.NDArray[np.float64],
                lat: npt.NDArray[np.float64], ts: npt.NDArray[np.float64],
                extras: Sequence[dict[str, Any] | None] | None = None) -> list[RoamTuple]:
    """Proximity events by brute force, row by row in the order given: for each update, every
    subscription against every object, before and after (fence/x_fence/roaming.py states the
    rule). `subscriptions` carry id, object, radius_m, match and where."""
    names = sorted(set(ids) | {s.object for s in subscriptions})
    slot = {o: i for i, o in enumerate(names)}
    n = len(names)
    plon, plat, pts = np.full(n, np.nan), np.full(n, np.nan), np.full(n, -np.inf)
    ext: list[dict[str, Any] | None] = [None] * n
    subs = list(subscriptions)
    s_slot = np.array([slot[s.object] for s in subs], np.int64)
    s_r = np.array([s.radius_m for s in subs], np.float64)
    classes = sorted({(s.match, s.where) for s in subs}, key=repr)
    s_cls = np.array([classes.index((s.match, s.where)) for s in subs], np.int64)
    by_id = np.array([[not o.startswith("@") and (m == "*" or fnmatchcase(o, m)) for o in names]
                      for m, _ in classes], bool)
    for s in subs:  # a fixed point's subscriber stands there from the start
        if getattr(s, "point", None) is not None:
            plon[slot[s.object]], plat[slot[s.object]] = s.point
    by_id = by_id.reshape(len(classes), n)
    passes = by_id.copy()  # per filter, per object: passes it now
    out: list[RoamTuple] = []
    for i, o in enumerate(ids):
        b = slot[o]
        if ts[i] < pts[b]:  # older than the object's last position: changes nothing
            continue
        pts[b] = ts[i]
        ox, oy = plon[b], plat[b]
        nx, ny = float(lon[i]), float(lat[i])
        e = extras[i] if extras else None
        was_pass = passes[s_cls, b]
        now_cls = by_id[:, b] & np.array([filters.matches(w, [e])[0] for _, w in classes], bool)
        now_pass = now_cls[s_cls]
        # subscriptions on o: every other object with a position
        for j in np.flatnonzero(s_slot == b).tolist():
            others = np.flatnonzero(~np.isnan(plon) & (np.arange(n) != b))
            d_was = _haversine_m(ox, oy, plon[others], plat[others])
            d_now = _haversine_m(nx, ny, plon[others], plat[others])
            ok = passes[s_cls[j], others]
            was, now = ok & (d_was <= s_r[j]), ok & (d_now <= s_r[j])
            for t in others[was & ~now].tolist():
                out.append((subs[j].id, names[t], "faraway", float(ts[i])))
            for t in others[now & ~was].tolist():
                out.append((subs[j].id, names[t], "nearby", float(ts[i])))
        # o as the other object of every subscription on someone else with a position
        js = np.flatnonzero((s_slot != b) & ~np.isnan(plon[s_slot]))
        a = s_slot[js]
        was = was_pass[js] & (_haversine_m(plon[a], plat[a], ox, oy) <= s_r[js])
        now = now_pass[js] & (_haversine_m(plon[a], plat[a], nx, ny) <= s_r[js])
        for j in js[was & ~now].tolist():
            out.append((subs[j].id, o, "faraway", float(ts[i])))
        for j in js[now & ~was].tolist():
            out.append((subs[j].id, o, "nearby", float(ts[i])))
        plon[b], plat[b], ext[b] = nx, ny, e
        passes[:, b] = now_cls
    return out


def roam_timeline(items: Sequence[tuple[Any, ...]]) -> list[RoamTuple]:
    """Proximity events by brute force over a stream of ("pos", object, lon, lat, ts, extra),
    ("put", subscription, ts) and ("drop", subscription_id, ts), in that order: for each
    position, every subscription against every object, before and after; a put reports the
    pairs near now that were not near under the subscription's previous definition (nearby)
    and those no longer near (faraway); a drop reports nothing. A subscription matches only
    objects of its own tenant (names `<tenant>:<name>`, the glob on the name; bare names are
    one tenant of their own). Objects count from their first position while their tenant has a
    subscription (none kept while it has none); a position older than its object's last one
    changes nothing."""
    pos: dict[str, tuple[float, float]] = {}
    last_ts: dict[str, float] = {}
    ext: dict[str, dict[str, Any] | None] = {}
    subs: dict[str, Any] = {}
    out: list[RoamTuple] = []

    def passes(sub: Any, obj: str, extra: dict[str, Any] | None) -> bool:
        by_id = not obj.startswith("@") and tenant_of(obj) == tenant_of(sub.id) and \
            (sub.match == "*" or fnmatchcase(name_of(obj), sub.match))
        return by_id and bool(filters.matches(sub.where, [extra])[0])

    def near_set(sub: Any) -> set[str]:
        if sub is None or sub.object not in pos:
            return set()
        a = pos[sub.object]
        others = [o for o in pos if o != sub.object and passes(sub, o, ext.get(o))]
        if not others:
            return set()
        ox, oy = np.array([pos[o][0] for o in others]), np.array([pos[o][1] for o in others])
        d = _haversine_m(a[0], a[1], ox, oy)
        return {o for o, dd in zip(others, d.tolist(), strict=True) if dd <= sub.radius_m}

    for item in items:
        if item[0] == "put":
            sub, t = item[1], item[2]
            old = subs.get(sub.id)
            before = near_set(old)
            if old is not None and old.point is not None:
                pos.pop(old.object, None)
            if sub.point is not None:  # a fixed point's subscriber stands there
                pos[sub.object] = sub.point
            subs[sub.id] = sub
            after = near_set(sub)
            out += [(sub.id, o, "faraway", t) for o in sorted(before - after)]
            out += [(sub.id, o, "nearby", t) for o in sorted(after - before)]
            continue
        if item[0] == "drop":
            gone = subs.pop(item[1], None)
            if gone is not None and gone.point is not None:
                pos.pop(gone.object, None)
            if gone is not None and not any(tenant_of(k) == tenant_of(gone.id) for k in subs):
                for o in [o for o in pos if not o.startswith("@") and tenant_of(o) == tenant_of(gone.id)]:
                    pos.pop(o)
                    ext.pop(o, None)
                    last_ts.pop(o, None)
            continue
        _, o, x, y, t, e = item
        if not any(tenant_of(k) == tenant_of(o) for k in subs) or t < last_ts.get(o, -math.inf):
            continue  # none kept for its tenant; or older than its last: nothing
        last_ts[o] = t
        old = pos.get(o)
        for sub in subs.values():
            if sub.object == o:  # the subscriber moved: every other object
                others = [b for b in pos if b != o and passes(sub, b, ext.get(b))]
                if not others:
                    continue
                bx = np.array([pos[b][0] for b in others])
                by = np.array([pos[b][1] for b in others])
                was = _haversine_m(old[0], old[1], bx, by) <= sub.radius_m if old else np.zeros(bx.size, bool)
                now = _haversine_m(x, y, bx, by) <= sub.radius_m
                for b, w, n in zip(others, was.tolist(), now.tolist(), strict=True):
                    if w != n:
                        out.append((sub.id, b, "nearby" if n else "faraway", t))
            elif sub.object in pos:  # o is the other object
                a = pos[sub.object]
                was = old is not None and passes(sub, o, ext.get(o)) and \
                    bool(_haversine_m(a[0], a[1], np.array([old[0]]), np.array([old[1]]))[0] <= sub.radius_m)
                now = passes(sub, o, e) and \
                    bool(_haversine_m(a[0], a[1], np.array([x]), np.array([y]))[0] <= sub.radius_m)
                if was != now:
                    out.append((sub.id, o, "nearby" if now else "faraway", t))
        pos[o], ext[o] = (x, y), e
    return out
