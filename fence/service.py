"""The fence API's operations, whatever the transport: HTTP (fence/api.py) and AMQP request /
reply (fence/rpc.py) both call these, so the two APIs cannot drift apart.

Input is plain data (a parsed JSON body, path values, the caller), output is plain data
(JSON-ready dicts) or an `ApiError` with the HTTP status and a message a user can act on. The
caller is already authenticated (fence/auth.py) and placed in a tenant (`Caller`, from the
tenant's members in PostgreSQL, fence/tenants.py); here is authorisation. Everything a caller
names is qualified by its tenant (exchanges/tenancy.py) before it reaches the store or the
pipeline, and unqualified on the way out: a fence, an object, a subscription of another
tenant cannot be named, so it is a 404 like one that does not exist (nothing says it does).
A viewer reads, an editor also changes, an admin also manages the members; the operator claim
sees every tenant (the only thing that does).

Concurrency: every change carries an optional expected version (HTTP If-Match); the store
refuses it when the fence moved on (409). Without one, the last writer wins.
"""

from __future__ import annotations

import asyncio
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
from exchanges.subscriptions import InvalidSubscription, Subscription, is_point_object
from exchanges.tenancy import NO_TENANT, ROLES, is_tenant, name_of, qualify, split, tenant_of
from exchanges.x_geo import queries
from fence import quotas, store, tenants
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


OPERATOR_CLAIM = "geofence_operator"  # a Firebase custom claim: the platform's operators
TENANT_HEADER = "X-Geofence-Tenant"  # which of a member's tenants a request acts in


@dataclass(frozen=True)
class Caller:
    """Who asks: a user (uid), acting in one tenant with a role there. `tenant` is NO_TENANT
    when none could be chosen (`problem` says why: no membership, several), which every
    tenant-scoped operation refuses; an operator without a tenant sees every tenant's
    objects in queries, and names nothing else."""

    uid: str
    operator: bool = False  # the token carries OPERATOR_CLAIM: true
    tenant: str = NO_TENANT
    role: str = ""  # viewer | editor | admin ("admin" for an operator acting in a tenant)
    problem: str = ""  # why no tenant was chosen

    @classmethod
    def of(cls, uid: str, claims: Mapping[str, Any], memberships: Mapping[str, str] | None = None,
           asked: str | None = None) -> Caller:
        """The caller of a verified token: `memberships` its tenants and roles (PostgreSQL),
        `asked` the tenant the request names (TENANT_HEADER, or the AMQP request's `tenant`).
        A member of one tenant acts in it; of several, in the one it names."""
        operator = claims.get(OPERATOR_CLAIM) is True
        mine = dict(memberships or {})
        if asked is not None and asked != "":
            if not is_tenant(asked):
                return cls(uid, operator, problem=f"{TENANT_HEADER} {shown(asked)} is not a tenant id")
            if asked in mine:
                return cls(uid, operator, asked, mine[asked])
            if operator:
                return cls(uid, operator, asked, "admin")
            return cls(uid, operator, problem=f"you are not a member of tenant {asked!r}")
        if len(mine) == 1:
            ((tenant, role),) = mine.items()
            return cls(uid, operator, tenant, role)
        if not mine:
            return cls(uid, operator, problem="you are a member of no tenant: a tenant's admin adds you "
                                              "(or the operator: `geofence tenant member add`)")
        return cls(uid, operator, problem=f"you are a member of several tenants ({', '.join(sorted(mine))}): "
                                          f"name one with the {TENANT_HEADER} header")

    def may(self, role: str) -> bool:
        """Whether the caller has `role` (or a higher one) in its tenant."""
        return bool(self.tenant) and self.role in ROLES and ROLES.index(self.role) >= ROLES.index(role)

    def scoped(self, role: str = "viewer") -> str:
        """The caller's tenant, for an operation that needs `role` there; ApiError if none."""
        if not self.tenant:
            if self.operator:
                raise ApiError(400, self.problem or f"an operator names a tenant with the {TENANT_HEADER} "
                                                    "header")
            raise ApiError(403, self.problem or "you are a member of no tenant")
        if not self.may(role):
            raise ApiError(403, f"this needs the {role} role in tenant {self.tenant!r}; you are {self.role}")
        return self.tenant

    def name(self, raw: str) -> str:
        """One of the caller's tenant's names, qualified (the tenant is already checked)."""
        return qualify(self.tenant, raw)


def feature(record: store.FenceRecord) -> dict[str, Any]:
    """A stored fence as a GeoJSON Feature (the API's representation): its id as its tenant
    names it, and `tenant`."""
    j = record.to_json()
    tenant, fence_id = split(j["id"])
    props = {k: v for k, v in j.items() if k not in ("id", "geometry")}
    props["tenant"] = tenant
    follow = props.get("follow")
    if isinstance(follow, dict) and isinstance(follow.get("object_id"), str):
        props["follow"] = {**follow, "object_id": name_of(follow["object_id"])}
    return {"type": "Feature", "id": fence_id, "geometry": j["geometry"], "properties": props}


def _unqualified_row(row: Mapping[str, Any], tenant: str) -> dict[str, Any]:
    """A query's row as the caller sees it: the id as its tenant names it (and, for an
    operator's query across tenants, the tenant)."""
    out = dict(row)
    t, name = split(str(row["id"]))
    out["id"] = name
    if not tenant:
        out["tenant"] = t
    return out


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
    except quotas.QuotaExceeded as exc:
        raise ApiError(403, exc.message) from None


def _public_subscription(stored: Mapping[str, Any]) -> dict[str, Any]:
    """A stored subscription as its tenant sees it: its names unqualified, and `tenant`."""
    out = dict(stored)
    tenant, out["id"] = split(str(stored["id"]))
    if isinstance(out.get("object"), str) and not is_point_object(out["object"]):
        out["object"] = name_of(out["object"])
    out["tenant"] = tenant
    return out


class FenceService:
    def __init__(self, manager: FenceManager,
                 follow_changed: Callable[[], Awaitable[None]] | None = None) -> None:
        """`follow_changed` runs after a change that may start or stop a fence following
        an object (the follower re-reads the following fences)."""
        self.manager = manager
        self.follow_changed = follow_changed

    async def caller(self, uid: str, claims: Mapping[str, Any], asked: str | None = None) -> Caller:
        """The caller of a verified token, placed in its tenant (its memberships read now, so a
        member removed is refused at once)."""
        async with self.manager.pool.acquire() as conn:
            mine = await tenants.memberships(conn, uid)
        return Caller.of(uid, claims, mine, asked)

    # -- reads ----------------------------------------------------------------------------

    async def _owned(self, conn: asyncpg.Connection, caller: Caller, fence_id: str,
                     role: str = "viewer") -> store.FenceRecord:
        """One of the caller's tenant's live fences (404 for any other: a fence of another
        tenant cannot be named)."""
        caller.scoped(role)
        _fence_id(fence_id)
        try:
            return await store.get_fence(conn, caller.name(fence_id))
        except store.UnknownFence:
            raise ApiError(404, f"no fence {fence_id!r}") from None

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
        tenant = caller.scoped()
        async with self.manager.pool.acquire() as conn:
            records = await store.find_fences(conn, tenant, parse_bbox(bbox), limit,
                                              caller.name(after) if after else "")
        out: dict[str, Any] = {"type": "FeatureCollection", "features": [feature(r) for r in records]}
        if len(records) == limit:
            out["next_after"] = name_of(records[-1].fence.fence_id)
        return out

    async def objects(self, caller: Caller, fence_id: str) -> dict[str, Any]:
        """Who is inside, live from the fence's x-fence worker (every master of a hot fence,
        each holding its own objects)."""
        async with self.manager.pool.acquire() as conn:
            record = await self._owned(conn, caller, fence_id)
        key = record.fence.fence_id
        masters = self.manager.ring.masters(key)
        lives = [(await self._ask(w, {"fence_id": key})).get("fence") for w in masters]
        # the tenant's own objects by name; those of a tenant the fence counts from
        # (exchanges/fence_options/shares.py) by their number only
        inside = [o for live in lives if live is not None for o in live["occupants"]]
        occupants = sorted(({**o, "object_id": name_of(str(o["object_id"]))} for o in inside
                            if tenant_of(str(o["object_id"])) == caller.tenant),
                           key=lambda o: str(o["object_id"]))
        versions = [live["version"] for live in lives if live is not None]
        return {"fence_id": fence_id, "version": record.fence.version, "worker": masters[0],
                "workers": masters,
                "worker_version": min(versions) if len(versions) == len(masters) else None,
                "objects": occupants, "shared_inside": len(inside) - len(occupants)}

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
        that id); x-ingress applies it within a second (exchanges/roam_routing.py). It follows
        one of the caller's tenant's objects and reports only that tenant's objects (the
        matcher's tenant wall, fence/x_fence/roaming.py): an editor's."""
        tenant = caller.scoped("editor")
        if not isinstance(body, Mapping):
            raise ApiError(422, "a subscription is a JSON object: object (or point), radius_m, match, where")
        d = dict(body)
        if sub_id is not None:
            if d.setdefault("id", sub_id) != sub_id:
                raise ApiError(422, f"the body's id {shown(d['id'])} is not the path's {sub_id!r}")
        else:
            d.setdefault("id", f"rs-{uuid.uuid4().hex[:16]}")
        for key in ("id", "object"):  # names the tenant gives: checked as they are, then qualified
            if key in d and not is_object_id(d[key]):
                raise ApiError(422, f"{key} {shown(d[key])}: {OBJECT_ID_RULE}")
        public_id = str(d["id"])
        d["id"] = qualify(tenant, public_id)
        if "object" in d:
            d["object"] = qualify(tenant, str(d["object"]))
        try:
            sub = Subscription.from_wire(d)
        except InvalidSubscription as exc:
            raise ApiError(422, str(exc)) from None
        async with self.manager.pool.acquire() as conn:
            try:
                stored = await store.put_subscription(conn, caller.uid, sub.to_wire(), quota_of=tenant)
            except quotas.QuotaExceeded as exc:
                raise ApiError(403, exc.message) from None
            return _public_subscription(stored)

    async def get_subscription(self, caller: Caller, sub_id: str) -> dict[str, Any]:
        caller.scoped()
        async with self.manager.pool.acquire() as conn:
            try:
                found = await store.get_subscription(conn, caller.name(_object_id(sub_id)))
            except store.UnknownSubscription:
                raise ApiError(404, f"no subscription {sub_id!r}") from None
        return _public_subscription(found)

    async def list_subscriptions(self, caller: Caller) -> dict[str, Any]:
        tenant = caller.scoped()
        async with self.manager.pool.acquire() as conn:
            return {"subscriptions": [_public_subscription(s)
                                      for s in await store.list_subscriptions(conn, tenant)]}

    async def delete_subscription(self, caller: Caller, sub_id: str) -> None:
        caller.scoped("editor")
        async with self.manager.pool.acquire() as conn:
            try:
                await store.delete_subscription(conn, caller.name(_object_id(sub_id)))
            except store.UnknownSubscription:
                raise ApiError(404, f"no subscription {sub_id!r}") from None

    async def object_fences(self, caller: Caller, object_id: str) -> dict[str, Any]:
        """Which of the caller's tenant's fences one of its objects is in, live from every
        x-fence worker (a fence sees its own tenant's objects only)."""
        caller.scoped()
        key = caller.name(_object_id(object_id))
        answers = [await self._ask(w, {"object_id": key}) for w in self.manager.workers]
        inside = sorted({f for a in answers for f in a["object"]["fences"]})
        return {"object_id": object_id,
                "fences": [name_of(f) for f in inside if split(f)[0] == caller.tenant]}

    async def events(self, caller: Caller, fence_id: str, since: float = 0.0,
                     limit: int = MAX_EVENTS, cursor: str | None = None) -> dict[str, Any]:
        """A page of the fence's archived events, oldest first by (ts, event_id): from `since`
        (inclusive) and, with `cursor` (a previous page's `next`), strictly after that page's
        last event. `next` is the cursor of this page's last event while more follow, None at
        the end: events sharing one ts (a delete's LEAVEs, a creation's ENTERs) are paged
        through like any others. A cursor this API did not give for this fence is a 400."""
        caller.scoped()
        _fence_id(fence_id)
        key = caller.name(fence_id)
        if not 1 <= limit <= MAX_EVENTS:
            raise ApiError(422, f"limit {shown(limit)}: between 1 and {MAX_EVENTS}")
        if not math.isfinite(since):
            raise ApiError(422, "since: epoch seconds")
        try:
            after = None if cursor is None else store.read_event_cursor(cursor, key)
        except store.BadCursor as exc:
            raise ApiError(400, str(exc)) from None
        async with self.manager.pool.acquire() as conn:
            if await store.fence_owner(conn, key) is None:  # live or deleted: its events stay readable
                raise ApiError(404, f"no fence {fence_id!r}")
            rows = await store.fence_events(conn, key, since, limit + 1, after, objects_of=caller.tenant)
        more = len(rows) > limit
        rows = [{**r, "fence_id": fence_id, "object_id": name_of(r["object_id"]), "tenant": caller.tenant}
                for r in rows[:limit]]
        last = rows[-1] if more else None
        return {"fence_id": fence_id, "since": since, "events": rows,
                "next": None if last is None else store.event_cursor(key, last["ts"], last["event_id"])}

    async def query(self, caller: Caller, body: Any) -> dict[str, Any]:
        """Where objects were last seen (exchanges/x_geo/queries.py), from every region's
        x-geo: `{"query": "bbox" | "within" | "nearby", ...}`. Objects have no owner, so the
        whole map is an operator's (the token's OPERATOR_CLAIM); any user may ask `within`
        one of their own fences (`"fence_id"` instead of a shape)."""
        if not isinstance(body, Mapping):
            raise ApiError(422, "a query is a JSON object")
        msg = dict(body)
        msg.pop("tenant", None)  # the caller's, never the body's
        # a tenant's member sees its tenant's objects; an operator without a tenant, everyone's
        tenant = caller.tenant if caller.tenant or not caller.operator else None
        if tenant is not None:
            caller.scoped()
            msg["tenant"] = tenant
            after = msg.get("after")
            if isinstance(after, str) and after:
                msg["after"] = qualify(tenant, after)
        fence_id = msg.pop("fence_id", None)
        if fence_id is not None:
            if msg.get("query", "within") != "within" or "shape" in msg:
                raise ApiError(422, "fence_id goes with a within query, in place of its shape")
            async with self.manager.pool.acquire() as conn:
                record = await self._owned(conn, caller, fence_id)
            msg["query"], msg["shape"] = "within", shapely.geometry.mapping(record.fence.geometry)
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
        out = queries.merge(q, [a["objects"] for a in answers.values()])
        if tenant is not None:  # the ids as the tenant names them (an operator's stay qualified)
            out["objects"] = [_unqualified_row(r, tenant) for r in out["objects"]]
            if "next_after" in out:
                out["next_after"] = name_of(out["next_after"])
        else:
            out["objects"] = [{**r, "tenant": split(str(r["id"]))[0]} for r in out["objects"]]
        return out

    async def _ask(self, worker: str, request: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.manager.ask_worker(worker, request)
        except WorkerUnavailable as exc:
            raise ApiError(503, str(exc)) from None

    # -- changes --------------------------------------------------------------------------

    async def create(self, caller: Caller, body: Any) -> dict[str, Any]:
        caller.scoped("editor")
        if not isinstance(body, Mapping):
            raise ApiError(422, "expected a GeoJSON Feature object")
        props = body.get("properties")
        given = body.get("id")
        if given is None and isinstance(props, Mapping):
            given = props.get("id")
        # an id given is the id, checked as it is (5 is not fence "5", "" is not "none"); only
        # a Feature without one gets a generated id
        fence_id = given if given is not None else f"f-{uuid.uuid4().hex[:16]}"
        spec = await self._spec(body, fence_id, caller)
        return await self._put(spec, caller, create=True)

    async def replace(self, caller: Caller, fence_id: str, body: Any, if_match: str | None = None
                      ) -> dict[str, Any]:
        """A new geometry (a Feature), or `{"follow": object_id, "radius_m": r}` to attach the
        fence to an object (optionally "lon"/"lat" to place it now; else it keeps its geometry
        until the object's next position)."""
        caller.scoped("editor")
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
            spec = await self._spec(body, fence_id, caller)
        elif "follow" in body:
            spec = await self._follow_spec(caller, fence_id, body)
        else:
            raise ApiError(422, "expected a GeoJSON Feature or {\"follow\": object_id, \"radius_m\": metres}")
        return await self._put(spec, caller, create=False, expected=expected)

    async def delete(self, caller: Caller, fence_id: str, if_match: str | None = None) -> dict[str, Any]:
        caller.scoped("editor")
        with _as_api_errors(fence_id):
            change = await self.manager.remove(caller.name(_fence_id(fence_id)), _version(if_match))
        if self.follow_changed is not None:
            await self.follow_changed()
        return {"id": fence_id, "version": change.version, "deleted": True}

    async def _check_shares(self, spec: FenceSpec, tenant: str) -> None:
        """A fence counts another tenant's objects only while that tenant shares their
        presence with the fence's (both sides opted in: exchanges/fence_options/shares.py)."""
        if tenant in spec.counts_from:
            raise ApiError(422, "counts_from: a fence sees its own tenant's objects already")
        async with self.manager.pool.acquire() as conn:
            sharing = await tenants.sharing_with(conn, list(spec.counts_from), tenant)
        missing = [t for t in spec.counts_from if t not in sharing]
        if missing:
            raise ApiError(422, f"counts_from: tenant {missing[0]!r} does not share its objects' presence "
                                f"with yours (its admin: PUT /tenants/{missing[0]}/shares/{tenant})")

    async def withdraw_share(self, tenant: str, to_tenant: str) -> tuple[str, ...]:
        """`tenant` no longer shares with `to_tenant`: every fence of `to_tenant` that counted
        its objects is put again without it (their objects leave at the change). The fences'
        ids, as `to_tenant` names them."""
        async with self.manager.pool.acquire() as conn:
            records = await store.counting_from(conn, to_tenant, tenant)
        done = []
        for r in records:
            while tenant in r.fence.counts_from:  # changed meanwhile (409): read it again, and again
                spec = FenceSpec.of(r.fence, r.owner, r.follow,
                                    counts_from=tuple(t for t in r.fence.counts_from if t != tenant))
                try:
                    await self.manager.put(spec, r.fence.version, create=False)
                    done.append(name_of(r.fence.fence_id))
                    break
                except store.UnknownFence:  # deleted meanwhile
                    break
                except store.VersionConflict:
                    try:
                        async with self.manager.pool.acquire() as conn:
                            r = await store.get_fence(conn, r.fence.fence_id)
                    except store.UnknownFence:
                        break
        if done and self.follow_changed is not None:
            await self.follow_changed()
        return tuple(done)

    async def _spec(self, body: Mapping[str, Any], fence_id: Any, caller: Caller) -> FenceSpec:
        """The fence a Feature describes, its id checked as the tenant gives it, then
        qualified by the caller's tenant. Parsed and validated off the event loop (a polygon of
        10,000 vertices takes shapely milliseconds; the loop serves the other requests)."""
        try:
            spec = await asyncio.to_thread(from_feature, body, fence_id, owner=caller.uid)
        except InvalidFence as exc:
            raise ApiError(422, str(exc)) from None
        return FenceSpec.of(spec, spec.owner, spec.follow, fence_id=caller.name(spec.fence_id))

    async def _follow_spec(self, caller: Caller, fence_id: str, body: Mapping[str, Any]) -> FenceSpec:
        object_id = _object_id(body.get("follow"))
        radius = body.get("radius_m")
        # compared as given (NaN fails, an integer beyond float range is just too large)
        if isinstance(radius, bool) or not isinstance(radius, int | float) or not 0 < radius <= MAX_RADIUS_M:
            raise ApiError(422, f"radius_m {shown(radius)}: metres in (0, {MAX_RADIUS_M:g}]")
        async with self.manager.pool.acquire() as conn:
            current = await self._owned(conn, caller, fence_id, "editor")
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
        # only an object of the caller's tenant can be followed: its name is qualified so
        return FenceSpec(fence_id=f.fence_id, geometry=geometry, name=name, owner=caller.uid,
                         follow=Follow(caller.name(object_id), float(radius)), **options)

    async def _put(self, spec: FenceSpec, caller: Caller, create: bool, expected: int | None = None
                   ) -> dict[str, Any]:
        if spec.counts_from:
            await self._check_shares(spec, caller.tenant)
        with _as_api_errors(name_of(spec.fence_id)):
            change: Change = await self.manager.put(spec, expected, create=create, quota_of=caller.tenant)
        assert change.record is not None
        if self.follow_changed is not None and (spec.follow is not None or not create):
            await self.follow_changed()
        out = feature(change.record)
        out["properties"]["ranges"] = change.ranges
        out["properties"]["bits"] = change.bits
        return out
