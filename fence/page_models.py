"""The answers the pages read, as types (pydantic), so the OpenAPI document describes them whole
(issue 40: a typed API): a venue owner's sensors and analytics (fence/venues/owner_store.py),
the operators' figures (`/ops/data`, fence/ops.py `shape`), the live map's fences and an
object's position (fence/map_feed.py, fence/page_data.py). As in fence/api_models.py, the
models describe the answers without filtering them; tests/unit/test_api_models.py and the live
tests check each answer against its model, every field declared."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

# ------------------------------------------------------------------ a venue owner's hive


class SensorConfigState(BaseModel):
    configuration_id: int
    state: Literal["applied", "pending"] = Field(description="applied once a status carries its id")
    sent_at: float | None


class SensorCounts(BaseModel):
    """The sensor's counting state: what the reports' sequence showed (fence/venues/counting.py)."""

    restarts: int | None
    wraps: int | None
    gaps: int | None
    lost_reports: int | None
    duplicates: int | None
    late: int | None
    skewed: int | None
    reports: int | None


class OwnerSensor(BaseModel):
    id: str
    modem: str = Field(description="IMEI / ICCID, as installed")
    last_report_at: float | None
    silent: bool = Field(description="no report for more than twice its interval")
    battery_mv: int | None
    low_battery: bool
    gprs_signal: int | None
    discarded_events: int | None
    firmware_version: int | None
    config: SensorConfigState | None = Field(description="the newest configuration sent to it")
    alerts: list[str] = Field(description="`kind: detail` of each alert not cleared")
    counts: SensorCounts


class OwnerSensors(BaseModel):
    sensors: list[OwnerSensor]


class HourFigures(BaseModel):
    hour: int = Field(ge=0, le=23, description="local hour")
    entries: int
    exits: int
    mean_occupancy: float
    peak_occupancy: float


class AnalyticsHour(HourFigures):
    phones_mean: float | None = Field(description="phones inside the hive's fence; null: no fence")
    phones_peak: int | None


class AnalyticsToday(BaseModel):
    day: str = Field(description="the business day so far (YYYY-MM-DD), raw until it ends")
    hours: list[HourFigures]


class AnalyticsDay(BaseModel):
    day: str
    reports: int
    entries: int
    exits: int
    residual: int = Field(description="entries - exits at the day's end, as counted")
    correction: str = Field(description="which side the drift correction scaled")
    factor: float
    complete: bool = Field(description="false: the day had not ended when the job ran")


class AnalyticsProfile(BaseModel):
    as_of: str
    weekdays: list[list[float | None]] = Field(description="7 x 24: Monday first, by local hour")
    phones: list[list[float | None]]
    samples: list[int] = Field(description="days averaged, per weekday")


class AnalyticsForecast(BaseModel):
    day: str
    hour: int
    occupancy: float
    phones: float | None
    seasonal: float
    trend: float
    basis: Literal["weekday", "hour"]
    samples: int
    actual: float | None = Field(description="what happened (the computed mean), once it has")


class HiveAnalytics(BaseModel):
    hive_id: str
    today: AnalyticsToday
    days: list[AnalyticsDay]
    hourly: dict[str, list[AnalyticsHour]] = Field(description="by day (YYYY-MM-DD)")
    profile: AnalyticsProfile | None
    forecast: list[AnalyticsForecast]


# ------------------------------------------------------------------ /ops/data


class OpsProcess(BaseModel):
    name: str
    role: str
    up: bool
    state: str = Field(description="up, DOWN, not consuming, or why it waits (recovering, paused, standby)")
    received_per_s: float | None
    positions: float | None
    events: float | None
    objects: float | None
    fences: float | None
    held: float | None


class OpsQueue(BaseModel):
    vhost: str
    queue: str
    ready: float | None
    unacked: float | None


class OpsDeadLetters(BaseModel):
    role: str
    reason: str
    total: float | None
    last_15m: float | None


class OpsLatency(BaseModel):
    p50: float | None
    p99: float | None


class OpsWebhook(BaseModel):
    endpoint: str
    tenant: str
    enabled: bool
    delivered_per_s: float | None
    failed_per_s: float | None
    backlog: float | None
    oldest_s: float | None
    lag_p99_ms: float | None
    dead: float | None


class OpsAlert(BaseModel):
    name: str
    state: str
    summary: str


class OpsData(BaseModel):
    """The pipeline's figures, from Prometheus."""

    at: float
    processes: list[OpsProcess]
    queues: list[OpsQueue] = Field(description="the deepest")
    dead_letters: list[OpsDeadLetters]
    latency_ms: OpsLatency = Field(description="device to event")
    series: dict[str, list[float | None]] = Field(description="`t` and one list per figure, over 15 minutes")
    webhooks: list[OpsWebhook]
    alerts: list[OpsAlert]


# ------------------------------------------ the live map (its fences: api_models.FencePage)


class MapObject(BaseModel):
    object_id: str
    lon: float
    lat: float
    ts: float
    tenant: str | None = Field(None, description="an operator acting in no tenant: whose it is")
