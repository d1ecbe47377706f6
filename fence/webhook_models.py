"""The `/webhooks` routes' bodies and answers as types (pydantic), so the OpenAPI document
describes them whole and a generated client has their fields. What a field must be beyond its
type (an https URL to a public address, ids as the pipeline names them) is checked by
fence/webhooks/endpoints.py, with its own messages."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fence.webhooks.endpoints import (
    DEFAULT_RETRY_FOR_S,
    DEFAULT_TIMEOUT_S,
    MAX_BATCH,
    MAX_FILTER,
    MAX_RETRY_FOR_S,
    MAX_TIMEOUT_S,
    MAX_URL,
)

Kind = Literal["enter", "leave", "cross", "nearby", "faraway"]


class WebhookIn(BaseModel):
    """A new endpoint: where, which events, how many per request, how long to try."""

    model_config = ConfigDict(extra="forbid")
    url: str = Field(max_length=MAX_URL, description="https://..., a public address")
    fences: list[str] | None = Field(None, max_length=MAX_FILTER, description="only these fences' events")
    kinds: list[Kind] | None = Field(None, description="only these kinds")
    objects: list[str] | None = Field(None, max_length=MAX_FILTER, description="only these objects' events")
    batch: int = Field(1, ge=1, le=MAX_BATCH, description="events per request: 1, the event; more, an array")
    timeout_s: float = Field(DEFAULT_TIMEOUT_S, ge=0.5, le=MAX_TIMEOUT_S, description="one request")
    retry_for_s: float = Field(DEFAULT_RETRY_FOR_S, ge=1.0, le=MAX_RETRY_FOR_S,
                               description="a failing request is given up this long after its first attempt")
    description: str = Field("", max_length=200)


class Webhook(BaseModel):
    id: str
    url: str
    fences: list[str]
    kinds: list[Kind]
    objects: list[str]
    batch: int
    enabled: bool
    disabled_reason: str | None
    description: str
    timeout_s: float
    retry_for_s: float
    local: bool = Field(description="allowed on a private address by the operator")


class WebhookCreated(Webhook):
    secret: str = Field(description="whsec_...: the signing secret, shown this once")


class Delivery(BaseModel):
    to_deliver: int
    dead: int
    oldest_queued_at: float | None
    last_error: str | None
    failing_since: float | None
    disabled_at: str | None


class WebhookShown(Webhook):
    delivery: Delivery


class WebhookList(BaseModel):
    webhooks: list[Webhook]


class Rotated(BaseModel):
    id: str
    secret: str


class DeadEvent(BaseModel):
    seq: int = Field(description="a cursor: pass the last one as `after`")
    event_id: str
    msg_id: str | None = Field(description="the webhook-id it was tried under")
    attempts: int
    reason: str | None
    done_at: float | None
    event: dict[str, object]


class DeadPage(BaseModel):
    dead: list[DeadEvent]
    next: int | None


class Replayed(BaseModel):
    id: str
    queued: int


class Notice(BaseModel):
    """What the platform told the tenant's admins (pushed to their registered devices too)."""

    id: int = Field(description="a cursor: pass the last one as `after`")
    kind: str = Field(description="what happened: `webhook.disabled`")
    subject: str = Field(description="what it is about: the endpoint's id")
    title: str
    body: str
    pushed: int = Field(description="the admins' devices it was pushed to")
    created_at: str = Field(description="ISO 8601")


class NoticePage(BaseModel):
    notices: list[Notice]
    next: int | None = Field(description="`after` for the next page; null: none")
