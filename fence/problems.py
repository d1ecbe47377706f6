"""The API's error answers as RFC 9457 problem details (`application/problem+json`): `type` (a
URI naming the kind of problem: PROBLEM_BASE + a slug, or about:blank when the status says it
all), `title` (the status's phrase), `status`, `detail` (what is wrong, for a person), plus
extension members: `error`, the same text as `detail` (what every
client before read, kept), and `errors` for a body that failed validation (each field's place and
message). Pure: the FastAPI handlers and the ASGI middlewares build their answers here.

No `instance`: it would echo the request's path, a caller's string, into every refusal (the
attack table reads answers for what they reveal), and says nothing the caller does not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

MEDIA_TYPE = "application/problem+json"
PROBLEM_BASE = "https://geofence.invalid/problems/"  # the docs' anchor per kind: docs/reference.md#problems
# the kinds with a type of their own (the others: about:blank, their status being the whole story)
KINDS = {
    "validation": "a field of the request is missing or not what it must be (`errors` lists them)",
    "refused-value": "PostgreSQL refused a value the checks let through (a NUL, an overlong string)",
    "unavailable": "a service the request needs is unreachable for now (`Retry-After`)",
    "rate-limited": "too many requests, or failed sign-ins (`Retry-After`)",
    "too-large": "the body is larger than the API takes",
}


def body(status: int, detail: str, kind: str | None = None, **extra: Any) -> dict[str, Any]:
    """A problem's JSON members."""
    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    out: dict[str, Any] = {"type": PROBLEM_BASE + kind if kind in KINDS else "about:blank", "title": title,
                           "status": status, "detail": detail, "error": detail}
    out.update(extra)
    return out


def response(status: int, detail: str, kind: str | None = None,
             headers: Mapping[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse(body(status, detail, kind, **extra), status_code=status,
                        headers=dict(headers or {}), media_type=MEDIA_TYPE)


class Problem(BaseModel):
    """An error answer (RFC 9457), as the OpenAPI document describes it."""

    type: str = Field(description="a URI naming the kind of problem; about:blank when the status says it all")
    title: str = Field(description="the status's phrase")
    status: int
    detail: str = Field(description="what is wrong, for a person")
    error: str = Field(description="the same text as detail (what clients before RFC 9457 read)")
    errors: list[dict[str, Any]] | None = Field(None, description="a validation problem's fields")


# every route's error answers in the OpenAPI document (FastAPI(responses=...))
RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": Problem, "description": "the request's problem"},
    "5XX": {"model": Problem, "description": "our problem, for now"},
}


def retyped(doc: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document with its error answers served as they are: FastAPI lists a
    response model under the route's own media type, the problems go as application/problem+json."""
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            for status, answer in operation.get("responses", {}).items():
                content = answer.get("content", {})
                if status[:1] in "45" and content and MEDIA_TYPE not in content:
                    answer["content"] = {MEDIA_TYPE: next(iter(content.values()))}
    return doc
