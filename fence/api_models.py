"""The fence API's bodies and answers as types (pydantic): fences as GeoJSON (RFC 7946), the
live state's answers, proximity subscriptions. They describe the routes in the OpenAPI
document, so that a client generated from it (openapi-python-client, openapi-generator) has
their fields.

Trade-off: a route's answer is described by its model (`documented`), not passed through it:
the service builds plain dicts, and a response model would silently drop a field the model
does not list. Models that allow extra fields (a fence's properties: options come and go) say
so. What keeps the description true is tests: tests/unit/test_api_models.py checks the
service's answers against these models, and tests/integration/test_generated_client.py drives
the live API through a client generated from the served document. What a body must be beyond
its type (a valid ring, ids as the pipeline names them, options' ranges) the service checks,
with its own messages (fence/spec.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

# -- GeoJSON (RFC 7946): the geometries a fence may have -------------------------------------

Position = Annotated[list[float], Field(min_length=2, max_length=3, description="[lon, lat]")]
Ring = Annotated[list[Position], Field(min_length=4, description="closed: the first position again last")]


class Polygon(BaseModel):
    type: Literal["Polygon"]
    coordinates: list[Ring] = Field(min_length=1, description="the exterior ring, then holes")


class MultiPolygon(BaseModel):
    type: Literal["MultiPolygon"]
    coordinates: list[list[Ring]] = Field(min_length=1)


Geometry = Annotated[Polygon | MultiPolygon, Field(discriminator="type")]

# a filter's clause: [field, op, value] ("in": [field, "in", [values]]; "between": [field,
# "between", lo, hi]); ops == != < <= > >= in between (exchanges/fence_options/filters.py)
Clause = Annotated[list[Any], Field(min_length=3, max_length=4)]


# -- fences --------------------------------------------------------------------------------


class Follow(BaseModel):
    """A fence that follows an object: a circle of `radius_m` around its last position."""

    model_config = ConfigDict(extra="allow")
    object_id: str
    radius_m: float
    ts: float | None = Field(None, description="the position it was last moved to (epoch seconds)")


class FenceOptionsIn(BaseModel):
    """A fence's name and options as a client sends them (`properties` of a Feature)."""

    model_config = ConfigDict(extra="allow")
    name: str | None = Field(None, description="shown in events and on the map; default: the id")
    timeout_s: float | None = Field(None, description="an object silent this long LEAVEs with reason timeout")
    hysteresis_m: float | None = Field(None, description="a band: inside until this far out")
    dwell_s: float | None = Field(None, description="an ENTER only after this long inside")
    cross: bool | None = Field(None, description="CROSS events for a position pair passing through")
    expires_at: float | None = Field(None, description="epoch seconds: the fence deletes itself then")
    where: list[Clause] | None = Field(None, description="filters on the positions' fields")
    counts_from: list[str] | None = Field(None, description="tenants whose objects' presence it counts")


class FenceIn(BaseModel):
    """A GeoJSON Feature to create a fence from (POST /fences) or to replace one with (PUT)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["Feature"]
    id: str | None = Field(None, description="the fence's id (POST: required unless given in properties)")
    geometry: Geometry
    properties: FenceOptionsIn | None = None


class FollowIn(BaseModel):
    """PUT /fences/{id} to make the fence a circle that moves with one of your objects."""

    model_config = ConfigDict(extra="forbid")
    follow: str = Field(description="one of your objects")
    radius_m: float = Field(gt=0)
    lon: float | None = Field(None, description="where to place it now (else it keeps its geometry)")
    lat: float | None = None


class FenceProperties(FenceOptionsIn):
    """A stored fence's properties: its options, and what the service keeps of it."""

    name: str
    version: int = Field(description="changes at every change (the ETag)")
    tenant: str
    owner: str | None = None
    created_at: str = Field(description="ISO 8601")
    updated_at: str = Field(description="ISO 8601")
    regions: list[str] = Field(description="the regions whose x-geo bind it")
    follow: Follow | None = None  # stored: the object followed


class Fence(BaseModel):
    """A fence as a GeoJSON Feature."""

    type: Literal["Feature"]
    id: str
    geometry: Geometry
    properties: FenceProperties


class FencePage(BaseModel):
    """A page of fences (a GeoJSON FeatureCollection): ask again with `after=<next_after>`."""

    type: Literal["FeatureCollection"]
    features: list[Fence]
    next_after: str | None = Field(None, description="present while more follow")


class FenceDeleted(BaseModel):
    id: str
    version: int
    deleted: Literal[True]


# -- the live state ----------------------------------------------------------------------------


class Occupant(BaseModel):
    model_config = ConfigDict(extra="allow")
    object_id: str
    since: float = Field(description="its stay began (epoch seconds)")
    last_seen: float = Field(description="its last position (epoch seconds)")
    confirmed: bool = Field(description="False while the stay is shorter than the fence's dwell_s")


class FenceOccupants(BaseModel):
    fence_id: str
    version: int
    worker: str
    workers: list[str] = Field(description="every master of a hot fence")
    worker_version: int | None = Field(description="the oldest version its workers apply (None: one is away)")
    objects: list[Occupant]
    shared_inside: int = Field(description="objects of tenants the fence counts from, by number only")


class Loiterer(Occupant):
    inside_s: float


class Loitering(BaseModel):
    fence_id: str
    version: int
    min_s: float
    worker_version: int | None
    objects: list[Loiterer] = Field(description="longest inside first")


class ObjectFences(BaseModel):
    object_id: str
    fences: list[str] = Field(description="the fences it is in now")


class ObjectSeen(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    lon: float
    lat: float
    ts: float = Field(description="its last position's time (epoch seconds)")
    distance_m: float | None = Field(None, description="nearby: from the point asked")
    fields: dict[str, Any] | None = Field(None, description="its last position's extra fields")
    tenant: str | None = Field(None, description="an operator's query across tenants: its tenant")


class ObjectsPage(BaseModel):
    query: Literal["bbox", "within", "nearby"]
    objects: list[ObjectSeen]
    next_after: str | None = Field(None, description="bbox / within: present while more follow")


# -- proximity subscriptions --------------------------------------------------------------------


class SubscriptionIn(BaseModel):
    """One of your objects (or a fixed point) and a radius: `nearby` / `faraway` events for
    the other objects of your tenant matching `match` and `where`."""

    model_config = ConfigDict(extra="allow")
    id: str | None = Field(None, description="POST: chosen by the service unless given")
    object: str | None = Field(None, description="the object the circle follows")
    point: list[float] | None = Field(None, min_length=2, max_length=2,
                                      description="[lon, lat]: a fixed circle")
    radius_m: float = Field(gt=0)
    match: str = Field("*", description="a glob on the other objects' ids")
    where: list[Clause] | None = Field(None, description="filters on their positions' fields")


class Subscription(SubscriptionIn):
    id: str
    tenant: str
    owner: str | None = None
    created_at: float
    updated_at: float


class SubscriptionList(BaseModel):
    subscriptions: list[Subscription]


class SchemaIndex(BaseModel):
    """The published message contract: each JSON Schema's URL by name, and the AsyncAPI document."""

    schema_version: int = Field(description="the `schema` every event body carries")
    asyncapi: str
    schemas: dict[str, str]


class Health(BaseModel):
    model_config = ConfigDict(extra="allow")
    ok: bool


# -- tenants ------------------------------------------------------------------------------------

Role = Literal["viewer", "editor", "admin"]


class TenantIn(BaseModel):
    """A new tenant (a platform operator's)."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(description="1-32 of a-z 0-9 -, starting with a letter or digit")
    name: str = ""


class Tenant(BaseModel):
    id: str
    name: str
    created_at: float
    members: int
    live_fences: int


class MyTenant(BaseModel):
    tenant: str
    name: str
    role: Role


class MyTenants(BaseModel):
    """Your tenants and your role in each."""

    tenants: list[MyTenant]


class RoleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Role


class Member(BaseModel):
    tenant: str
    uid: str
    role: Role
    added_at: float


class Members(BaseModel):
    """A tenant's members and their roles."""

    tenant: str
    members: list[Member]


class QuotaUse(BaseModel):
    max: int
    used: int
    default: bool = Field(description="the platform's default (no quota of the tenant's own)")


class Quota(BaseModel):
    """What the tenant holds against each quota (fences, vertices, follow_fences, subscriptions)."""

    tenant: str
    quota: dict[str, QuotaUse]


class Shares(BaseModel):
    """Whom the tenant shares its objects' presence with, and who shares with it."""

    tenant: str
    shares_with: list[str]
    shared_by: list[str]


class ShareWithdrawn(BaseModel):
    tenant: str
    to_tenant: str
    fences_changed: int = Field(description="the other tenant's fences that stopped counting")


# -- venues (fence/venues/) ------------------------------------------------------------------------

OpeningHours = dict[str, list[Annotated[list[str], Field(min_length=2, max_length=2)]]]


class HiveStatus(BaseModel):
    """A hive's counts now (the business day's): at most a minute or two old."""

    day: str | None = Field(description="the business day (ISO date)")
    entries: int
    exits: int
    occupancy: int = Field(description="people inside, by the sensors")
    raw: int = Field(description="entries - exits, before the corrections")
    app_occupancy: int | None = Field(description="phones inside the hive's fence (None: no fence)")
    percent: float | None = Field(description="of the capacity (None: no capacity)")
    updated_at: float


class Usual(BaseModel):
    """The nightly profile's figure for this weekday and hour ("popular times")."""

    occupancy: float
    phones: float | None
    samples: int
    as_of: str | None
    weekday: int = Field(description="1 Monday ... 7 Sunday")
    hour: int
    busyness: str | None = Field(None, description="busier / as busy / less busy than usual")


class HivePlace(BaseModel):
    """What a hive is and where (every answer about a hive has these)."""

    id: str
    name: str
    type: str
    address: str
    lon: float
    lat: float
    tz: str = Field(description="an IANA zone: the hive's local time")
    capacity: int | None = None
    opening_hours: OpeningHours = Field(description='{"mon": [["11:00", "23:00"]], ...}')


class Hive(HivePlace):
    """A hive (a venue) and how busy it is now."""

    open_now: bool | None = Field(description="None: the hive gave no opening hours")
    occupancy: HiveStatus | None
    usual: Usual | None
    distance_m: float | None = Field(None, description="with near=: from that point")


class HivePage(BaseModel):
    """Hives by proximity, type and name."""

    hives: list[Hive]
    count: int


class HiveIn(BaseModel):
    """A hive an owner adds or changes."""

    model_config = ConfigDict(extra="forbid")
    id: str
    name: str
    type: str = Field(description="restaurant, bar, cafe, shop, supermarket, other")
    lon: float
    lat: float
    tz: str = Field("UTC", description="an IANA zone: the sensors' local time")
    address: str = ""
    reset_hour: int = Field(4, ge=0, le=23, description="the local hour the day's count starts again")
    opening_hours: OpeningHours | None = None
    capacity: int | None = Field(None, gt=0)
    fence_id: str | None = Field(None, description="one of your fences: phones inside it are counted")


class HiveStored(HivePlace):
    """An owner's hive as stored."""

    reset_hour: int
    fence_id: str | None


class OwnedHive(BaseModel):
    id: str
    name: str
    type: str
    capacity: int | None
    occupancy: int | None
    entries: int | None
    exits: int | None
    day: str | None


class OwnedHives(BaseModel):
    """Your hives and how busy they are."""

    hives: list[OwnedHive]


class ConfigSent(BaseModel):
    """A sensor configuration sent: applied once the sensor's next status carries its id."""

    configuration_id: int
    state: Literal["pending"]


class MyHives(BaseModel):
    """Your favourite and recently viewed hives."""

    favourites: list[str]
    recent: list[str]


class NotificationIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hive_id: str
    threshold: int = Field(ge=0, description="people")
    direction: Literal["above", "below"]
    quiet_start: str | None = Field(None, description="HH:MM, the hive's local time (with quiet_end)")
    quiet_end: str | None = None


class Notification(BaseModel):
    """An occupancy notification: once per crossing, with hysteresis and a cool-down."""

    id: int
    hive_id: str
    threshold: int
    direction: Literal["above", "below"]
    quiet_start: str | None
    quiet_end: str | None
    armed: bool | None = Field(None, description="listed: ready to fire at the next crossing")
    last_sent_at: float | None = None


class Notifications(BaseModel):
    """Your occupancy notifications."""

    notifications: list[Notification]


class SensorConfigIn(BaseModel):
    """A sensor's whole configuration (sent on MQTT commands/sensor/<sensor_id>, 12 bytes)."""

    model_config = ConfigDict(extra="forbid")
    threshold_cm: int = Field(ge=0, le=0xFFFF)
    reporting_interval_min: int = Field(ge=0, le=0xFFFF)
    status_interval_min: int = Field(ge=0, le=0xFFFF)
    event_threshold: int = Field(ge=0, le=0xFFFF)


class DeviceTokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str
    platform: str | None = Field(None, description="android, ios or web")


# -- into the OpenAPI document --------------------------------------------------------------------

BODIES: tuple[type[BaseModel], ...] = (FenceIn, FollowIn, SubscriptionIn, TenantIn, RoleIn, HiveIn,
                                       NotificationIn, SensorConfigIn, DeviceTokenIn)



def answer(model: type[BaseModel], status: int = 200) -> dict[int | str, dict[str, Any]]:
    """A route's `responses` entry for its answer, described by `model` (see the module's
    trade-off), under the route's own media type (application/geo+json for fences)."""
    doc = (model.__doc__ or model.__name__).strip().splitlines()[0]
    return {status: {"model": model, "description": doc}}


BODY_KEY = "x-geofence-body"  # a route's body models, put in place by `document`


def body(*models: type[BaseModel]) -> dict[str, Any]:
    """A route's `openapi_extra`: its JSON body is one of `models` (the service parses it)."""
    return {BODY_KEY: [m.__name__ for m in models]}


def document(app: FastAPI) -> None:
    """The bodies' schemas into the document's components, and each route's request body
    described by its models in place of the plain object its parameter says."""
    plain: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = plain()
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for model in BODIES:
            found = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in found.pop("$defs", {}).items():
                schemas.setdefault(name, sub)
            schemas.setdefault(model.__name__, found)
        for operations in doc.get("paths", {}).values():
            for operation in operations.values():
                names = operation.pop(BODY_KEY, None)
                if not names:
                    continue
                refs = [{"$ref": f"#/components/schemas/{n}"} for n in names]
                media = operation["requestBody"]["content"]["application/json"]
                media["schema"] = refs[0] if len(refs) == 1 else {"oneOf": refs}
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
