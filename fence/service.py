"""The fence API's operations, whatever the transport: HTTP (fence/api.py) and AMQP request /
reply (fence/rpc.py) both call these, so the two APIs cannot drift apart.

Input is plain data (a parsed JSON body, path values, the caller's uid), output is plain data
(JSON-ready dicts) or an `ApiError` with the HTTP status and a message a user can act on. The
caller is already authenticated (fence/auth.py); here is authorisation: a fence belongs to the
user that created it, another user's fence is 403 (its existence is not a secret worth the
confusion of a 404 for a fence the caller can see on a map of events).

Concurrency: every change carries an optional expected version (HTTP If-Match); the store
refuses it when the fence moved on (409). Without one, the last writer wins.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg
import shapely.geometry

from exchanges import control
from exchanges.fence_def import InvalidFence, check_fence_id, check_name, shown
from exchanges.fence_options import check_options, encode_options
from exchanges.ids import OBJECT_ID_RULE, is_object_id
from exchanges.subscriptions import InvalidSubscription, Subscription
from exchanges.x_geo import queries
from fence import store
from fence.follow import circle
from fence.manager import Change, FenceManager, WorkerUnavailable
from fence.spec import FenceSpec, Follow, from_feature, named_fence_id

MAX_LIST = 1000
MAX_EVENTS = 10_000
MAX_RADIUS_M = 50_000.0


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


OPERATOR_CLAIM = "geofence_operator"  # a Firebase custom claim: may query every object's position


@dataclass(frozen=True)
class Caller:
    uid: str
    operator: bool = False  # the token carries OPERATOR_CLAIM: true

    @classmethod
    def of(cls, uid: str, claims: Mapping[str, Any]) -> Caller:
        return cls(uid, claims.get(OPERATOR_CLAIM) is True)


def feature(record: store.FenceRecord) -> dict[str, Any]:
    """A stored fence as a GeoJSON Feature (the API's representation)."""
    j = record.to_json()
    props = {k: v for k, v in j.items() if k not in ("id", "geometry")}
    return {"type": "Feature", "id": j["id"], "geometry": j["geometry"], "properties": props}


def parse_bbox(raw: Any) -> tuple[float, float, float, float] | None:
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str):  # the AMQP API's JSON can hold anything
        raise ApiError(422, f"bbox {shown(raw)}: a string min_lon,min_lat,max_lon,max_lat expected")
    try:
        x0, y0, x1, y1 = (float(v) for v in raw.split(","))
    except ValueError:
        raise ApiError(422, f"bbox {raw!r}: four numbers min_lon,min_lat,max_lon,max_lat expected") from None
    if not all(math.isfinite(v) for v in (x0, y0, x1, y1)) or not (-180 <= x0 <= x1 <= 180
                                                                    and -90 <= y0 <= y1 <= 90):
        raise ApiError(422, f"bbox {raw!r}: min <= max, lon in [-180, 180], lat in [-90, 90]")
    return x0, y0, x1, y1


def _version(raw: Any) -> int | None:
    """An expected version from If-Match ("3" or W/"3") or a body's "version"."""
    if raw is None:
        return None
    text = str(raw).strip().removeprefix("W/").strip('"')
    if not (text.isascii() and text.isdigit() and len(text) <= 18) or int(text) < 1:
        raise ApiError(422, f"expected version {shown(raw)}: a positive integer (the fence's version / ETag)")
    return int(text)


def _fence_id(raw: Any) -> str:
    """A fence id checked before it reaches the store (PostgreSQL refuses NUL characters)."""
    try:
        return check_fence_id(raw)
    except InvalidFence as exc:
        raise ApiError(422, str(exc)) from None


def _object_id(raw: Any) -> str:
    if not is_object_id(raw):
        raise ApiError(422, f"object id {shown(raw)}: {OBJECT_ID_RULE}")
    assert isinstance(raw, str)
    return raw


def _degrees(body: Mapping[str, Any], key: str, limit: float) -> float:
    """A longitude / latitude given as a JSON number (not "9.5", not true) within +-limit."""
    v = body.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not -limit <= v <= limit:
        raise ApiError(422, f"{key} {shown(v)}: a number in [{-limit:g}, {limit:g}] "
                            "(lon and lat go together)")
    return float(v)


@contextlib.contextmanager
def _as_api_errors(fence_id: str) -> Iterator[None]:
    """What the store refuses, as the API's statuses."""
    try:
        yield
    except InvalidFence as exc:
        raise ApiError(422, str(exc)) from None
    except store.UnknownFence:
        raise ApiError(404, f"no fence {fence_id!r}") from None
    except store.NotOwner:
        raise ApiError(403, f"fence {fence_id!r} belongs to another user") from None
    except store.VersionConflict as exc:
        raise ApiError(409, str(exc)) from None


class FenceService:
    def __init__(self, manager: FenceManager,
                 follow_changed: Callable[[], Awaitable[None]] | None = None) -> None:
        """`follow_changed` runs after a change that may start or stop a fence following
        an object (the follower re-reads the following fences)."""
        self.manager = manager
        self.follow_changed = follow_changed

    # -- reads ----------------------------------------------------------------------------

    async def _owned(self, conn: asyncpg.Connection, caller: Caller, fence_id: str) -> store.FenceRecord:
        _fence_id(fence_id)
        try:
            record = await store.get_fence(conn, fence_id)
        except store.UnknownFence:
            raise ApiError(404, f"no fence {fence_id!r}") from None
        if record.owner != caller.uid:
            raise ApiError(403, f"fence {fence_id!r} belongs to another user")
        return record

    async def get(self, caller: Caller, fence_id: str) -> dict[str, Any]:
        async with self.manager.pool.acquire() as conn:
            return feature(await self._owned(conn, caller, fence_id))

    async def list(self, caller: Caller, bbox: str | None = None, limit: int = MAX_LIST,
                   after: str = "") -> dict[str, Any]:
        if not 1 <= limit <= MAX_LIST:
            raise ApiError(422, f"limit {shown(limit)}: between 1 and {MAX_LIST}")
        if after != "":  # a page cursor is a fence id (the previous page's next_after)
            try:
                check_fence_id(after)
            except InvalidFence as exc:
                raise ApiError(422, f"after: {exc}") from None
        async with self.manager.pool.acquire() as conn:
            records = await store.find_fences(conn, caller.uid, parse_bbox(bbox), limit, after)
        out: dict[str, Any] = {"type": "FeatureCollection", "features": [feature(r) for r in records]}
        if len(records) == limit:
            out["next_after"] = records[-1].fence.fence_id
        return out

    async def objects(self, caller: Caller, fence_id: str) -> dict[str, Any]:
        """Who is inside, live from the fence's x-fence worker (every master of a hot fence,
        each holding its own objects)."""
        async with self.manager.pool.acquire() as conn:
            record = await self._owned(conn, caller, fence_id)
        masters = self.manager.ring.masters(fence_id)
        lives = [(await self._ask(w, {"fence_id": fence_id})).get("fence") for w in masters]
        occupants = sorted((o for live in lives if live is not None for o in live["occupants"]),
                           key=lambda o: str(o["object_id"]))
        versions = [live["version"] for live in lives if live is not None]
        return {"fence_id": fence_id, "version": record.fence.version, "worker": masters[0],
                "workers": masters,
                "worker_version": min(versions) if len(versions) == len(masters) else None,
                "objects": occupants}

    async def loitering(self, caller: Caller, fence_id: str, min_s: float) -> dict[str, Any]:
        """The loitering report: the objects inside the fence for at least `min_s` seconds by
        their last position (the stay's start to the latest position seen inside), longest
        first; stays still within the fence's dwell time are included, flagged unconfirmed."""
        if not (isinstance(min_s, int | float) and 0 <= min_s <= 365 * 86400):
            raise ApiError(422, f"min_s {shown(min_s)}: seconds in [0, 31536000]")
        live = await self.objects(caller, fence_id)
        rows = [{**o, "inside_s": float(o["last_seen"]) - float(o["since"])} for o in live["objects"]]
        rows = sorted((o for o in rows if o["inside_s"] >= min_s),
                      key=lambda o: (-o["inside_s"], o["object_id"]))
        return {"fence_id": fence_id, "version": live["version"], "min_s": float(min_s),
                "worker_version": live["worker_version"], "objects": rows}

    # -- proximity subscriptions (exchanges/subscriptions.py) -------------------------------

    async def put_subscription(self, caller: Caller, body: Any, sub_id: str | None = None) -> dict[str, Any]:
        """Store a proximity subscription (new without `sub_id`, else created or changed under
        that id); x-ingress applies it within a second (exchanges/roam_routing.py). A
        subscription reports other objects' ids and distances, and objects have no owner,
        so it is an operator's (the token's OPERATOR_CLAIM), as whole-map queries are."""
        if not caller.operator:
            raise ApiError(403, f"a proximity subscription reports every matching object near yours: it "
                                f"needs the {OPERATOR_CLAIM} claim")
        if not isinstance(body, Mapping):
            raise ApiError(422, "a subscription is a JSON object: object (or point), radius_m, match, where")
        d = dict(body)
        if sub_id is not None:
            if d.setdefault("id", sub_id) != sub_id:
                raise ApiError(422, f"the body's id {d['id']!r} is not the path's {sub_id!r}")
        else:
            d.setdefault("id", f"rs-{uuid.uuid4().hex[:16]}")
        try:
            sub = Subscription.from_wire(d)
        except InvalidSubscription as exc:
            raise ApiError(422, str(exc)) from None
        async with self.manager.pool.acquire() as conn:
            try:
                return await store.put_subscription(conn, caller.uid, sub.to_wire())
            except PermissionError as exc:
                raise ApiError(403, str(exc)) from None

    async def get_subscription(self, caller: Caller, sub_id: str) -> dict[str, Any]:
        async with self.manager.pool.acquire() as conn:
            try:
                found = await store.get_subscription(conn, sub_id)
            except store.UnknownSubscription:
                raise ApiError(404, f"no subscription {sub_id!r}") from None
        if found["owner"] != caller.uid:
            raise ApiError(403, f"subscription {sub_id!r} belongs to another user")
        return found

    async def list_subscriptions(self, caller: Caller) -> dict[str, Any]:
        async with self.manager.pool.acquire() as conn:
            return {"subscriptions": await store.list_subscriptions(conn, caller.uid)}

    async def delete_subscription(self, caller: Caller, sub_id: str) -> None:
        async with self.manager.pool.acquire() as conn:
            try:
                await store.delete_subscription(conn, caller.uid, sub_id)
            except store.UnknownSubscription:
                raise ApiError(404, f"no subscription {sub_id!r}") from None
            except PermissionError as exc:
                raise ApiError(403, str(exc)) from None

    async def object_fences(self, caller: Caller, object_id: str) -> dict[str, Any]:
        """The caller's fences the object is in, live from every x-fence worker."""
        _object_id(object_id)
        answers = [await self._ask(w, {"object_id": object_id}) for w in self.manager.workers]
        inside = sorted({f for a in answers for f in a["object"]["fences"]})
        async with self.manager.pool.acquire() as conn:
            owners = {f: await store.fence_owner(conn, f) for f in inside}
        return {"object_id": object_id, "fences": [f for f in inside if owners[f] == caller.uid]}

    async def events(self, caller: Caller, fence_id: str, since: float = 0.0,
                     limit: int = MAX_EVENTS, cursor: str | None = None) -> dict[str, Any]:
        """A page of the fence's archived events, oldest first by (ts, event_id): from `since`
        (inclusive) and, with `cursor` (a previous page's `next`), strictly after that page's
        last event. `next` is the cursor of this page's last event while more follow, None at
        the end: events sharing one ts (a delete's LEAVEs, a creation's ENTERs) are paged
        through like any others. A cursor this API did not give for this fence is a 400."""
        _fence_id(fence_id)
        if not 1 <= limit <= MAX_EVENTS:
            raise ApiError(422, f"limit {shown(limit)}: between 1 and {MAX_EVENTS}")
        if not math.isfinite(since):
            raise ApiError(422, "since: epoch seconds")
        try:
            after = None if cursor is None else store.read_event_cursor(cursor, fence_id)
        except store.BadCursor as exc:
            raise ApiError(400, str(exc)) from None
        async with self.manager.pool.acquire() as conn:
            owner = await store.fence_owner(conn, fence_id)
            if owner is None:
                raise ApiError(404, f"no fence {fence_id!r}")
            if owner != caller.uid:
                raise ApiError(403, f"fence {fence_id!r} belongs to another user")
            rows = await store.fence_events(conn, fence_id, since, limit + 1, after)
        more = len(rows) > limit
        rows = rows[:limit]
        last = rows[-1] if more else None
        return {"fence_id": fence_id, "since": since, "events": rows,
                "next": None if last is None else store.event_cursor(fence_id, last["ts"], last["event_id"])}

    async def query(self, caller: Caller, body: Any) -> dict[str, Any]:
        """Where objects were last seen (exchanges/x_geo/queries.py), from every region's
        x-geo: `{"query": "bbox" | "within" | "nearby", ...}`. Objects have no owner, so the
        whole map is an operator's (the token's OPERATOR_CLAIM); any user may ask `within`
        one of their own fences (`"fence_id"` instead of a shape)."""
        if not isinstance(body, Mapping):
            raise ApiError(422, "a query is a JSON object")
        msg = dict(body)
        fence_id = msg.pop("fence_id", None)
        if fence_id is not None:
            if msg.get("query", "within") != "within" or "shape" in msg:
                raise ApiError(422, "fence_id goes with a within query, in place of its shape")
            async with self.manager.pool.acquire() as conn:
                record = await self._owned(conn, caller, fence_id)
            msg["query"], msg["shape"] = "within", shapely.geometry.mapping(record.fence.geometry)
        elif not caller.operator:
            raise ApiError(403, f"querying every object's position needs the {OPERATOR_CLAIM} claim; "
                                "ask within one of your fences with fence_id")
        try:
            q = queries.parse(msg)
        except queries.InvalidQuery as exc:
            raise ApiError(422, str(exc)) from None
        try:
            answers = await self.manager.ask_regions(control.QUERY, q.to_wire())
        except WorkerUnavailable as exc:
            raise ApiError(503, str(exc)) from None
        bad = [a["error"] for a in answers.values() if "error" in a]
        if bad:
            raise ApiError(422, bad[0])
        return queries.merge(q, [a["objects"] for a in answers.values()])

    async def _ask(self, worker: str, request: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.manager.ask_worker(worker, request)
        except WorkerUnavailable as exc:
            raise ApiError(503, str(exc)) from None

    # -- changes --------------------------------------------------------------------------

    async def create(self, caller: Caller, body: Any) -> dict[str, Any]:
        if not isinstance(body, Mapping):
            raise ApiError(422, "expected a GeoJSON Feature object")
        props = body.get("properties")
        given = body.get("id")
        if given is None and isinstance(props, Mapping):
            given = props.get("id")
        # an id given is the id, checked as it is (5 is not fence "5", "" is not "none"); only
        # a Feature without one gets a generated id
        fence_id = given if given is not None else f"f-{uuid.uuid4().hex[:16]}"
        spec = self._spec(body, fence_id, caller)
        return await self._put(spec, caller, create=True)

    async def replace(self, caller: Caller, fence_id: str, body: Any, if_match: str | None = None
                      ) -> dict[str, Any]:
        """A new geometry (a Feature), or `{"follow": object_id, "radius_m": r}` to attach the
        fence to an object (optionally "lon"/"lat" to place it now; else it keeps its geometry
        until the object's next position)."""
        if not isinstance(body, Mapping):
            raise ApiError(422, "expected a GeoJSON Feature or {\"follow\": ..., \"radius_m\": ...}")
        is_feature = body.get("type") == "Feature"
        props = body.get("properties") if is_feature else None
        if props is not None and not isinstance(props, Mapping):
            raise ApiError(422, "the Feature's properties must be an object (or null)")
        expected = _version(if_match if if_match is not None else
                            (props or {}).get("version") if is_feature else body.get("version"))
        if is_feature:
            # the path names the fence: a body naming another (or no valid id) is a mistake,
            # never a silent rename
            named = named_fence_id(body)
            if named is not None and named != fence_id:
                raise ApiError(422, f"the Feature names fence {shown(named)}, the path {fence_id!r}")
            spec = self._spec(body, fence_id, caller)
        elif "follow" in body:
            spec = await self._follow_spec(caller, fence_id, body)
        else:
            raise ApiError(422, "expected a GeoJSON Feature or {\"follow\": object_id, \"radius_m\": metres}")
        return await self._put(spec, caller, create=False, expected=expected)

    async def delete(self, caller: Caller, fence_id: str, if_match: str | None = None) -> dict[str, Any]:
        with _as_api_errors(fence_id):
            change = await self.manager.remove(_fence_id(fence_id), _version(if_match), caller.uid)
        if self.follow_changed is not None:
            await self.follow_changed()
        return {"id": fence_id, "version": change.version, "deleted": True}

    def _spec(self, body: Mapping[str, Any], fence_id: Any, caller: Caller) -> FenceSpec:
        try:
            spec = from_feature(body, fence_id, owner=caller.uid)
        except InvalidFence as exc:
            raise ApiError(422, str(exc)) from None
        return spec

    async def _follow_spec(self, caller: Caller, fence_id: str, body: Mapping[str, Any]) -> FenceSpec:
        object_id = _object_id(body.get("follow"))
        radius = body.get("radius_m")
        # compared as given (NaN fails, an integer beyond float range is just too large)
        if isinstance(radius, bool) or not isinstance(radius, int | float) or not 0 < radius <= MAX_RADIUS_M:
            raise ApiError(422, f"radius_m {shown(radius)}: metres in (0, {MAX_RADIUS_M:g}]")
        async with self.manager.pool.acquire() as conn:
            current = await self._owned(conn, caller, fence_id)
        f = current.fence
        try:
            geometry = f.geometry
            if "lon" in body or "lat" in body:
                geometry = circle(_degrees(body, "lon", 180), _degrees(body, "lat", 90), float(radius))
            # the options the body gives, the fence's own for the others: all checked (a band
            # must fit the new circle)
            options = check_options(encode_options(f) | dict(body), geometry)
        except InvalidFence as exc:
            raise ApiError(422, str(exc)) from None
        try:
            name = check_name(body.get("name", f.name))
        except InvalidFence as exc:
            raise ApiError(422, str(exc)) from None
        return FenceSpec(fence_id=fence_id, geometry=geometry, name=name, owner=caller.uid,
                         follow=Follow(object_id, float(radius)), **options)

    async def _put(self, spec: FenceSpec, caller: Caller, create: bool, expected: int | None = None
                   ) -> dict[str, Any]:
        with _as_api_errors(spec.fence_id):
            change: Change = await self.manager.put(spec, expected, create=create, owner=caller.uid)
        assert change.record is not None
        if self.follow_changed is not None and (spec.follow is not None or not create):
            await self.follow_changed()
        out = feature(change.record)
        out["properties"]["ranges"] = change.ranges
        out["properties"]["bits"] = change.bits
        return out
