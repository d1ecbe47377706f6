"""What the API's answers are. A fence, or a page of them, is `application/geo+json` (RFC 7946).
Every error answer of the API is an RFC 9457 problem (fence/problems.py): its media type, its
members (type, title, status, detail; `error` kept as `detail`; `errors` for a failed
validation), for the API's own refusals, FastAPI's (no route, no method), a validation, the body
limit and the rate limit; and the OpenAPI document describes them."""

from __future__ import annotations

from typing import Any, cast

from fastapi.testclient import TestClient

from fence import problems
from fence.api import create_app
from fence.api_edges import BodyLimit
from tests.unit.test_fence_api_inputs import Verifier, echo, service, stored

HTTP = TestClient(create_app(service(), Verifier()), raise_server_exceptions=False)
GOOD = {"Authorization": "Bearer good"}


def problem(r: Any, status: int, kind: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == problems.MEDIA_TYPE
    body: dict[str, Any] = r.json()
    assert body["status"] == status and body["detail"] == body["error"] and body["detail"]
    assert body["type"] == (problems.PROBLEM_BASE + kind if kind else "about:blank")
    assert body["title"] and "instance" not in body  # a caller's path is never echoed
    return body


def test_refusals_of_the_api_and_of_fastapi_are_problems() -> None:
    unauthenticated = HTTP.get("/fences")
    assert problem(unauthenticated, 401)["title"] == "Unauthorized"
    assert unauthenticated.headers["www-authenticate"] == 'Bearer realm="geofence"'
    assert problem(HTTP.get("/no/such/route", headers=GOOD), 404)["title"] == "Not Found"
    assert problem(HTTP.patch("/fences", headers=GOOD), 405)["title"] == "Method Not Allowed"


def test_a_failed_validation_names_its_fields() -> None:
    with stored():  # a member of t1, whose fences the store would give
        body = problem(HTTP.get("/fences?limit=0", headers=GOOD), 422, "validation")
    assert body["errors"][0]["loc"] == ["query", "limit"] and body["detail"].startswith("query.limit:")


def test_the_edges_answer_problems_too() -> None:
    limited = TestClient(cast(Any, BodyLimit(echo, 10)))
    body = problem(limited.post("/x", content=b"0123456789a"), 413, "too-large")
    assert body["detail"] == "body of 11 bytes; at most 10"


def test_the_openapi_document_describes_the_problems() -> None:
    doc = HTTP.get("/openapi.json").json()
    assert set(doc["components"]["schemas"]["Problem"]["required"]) >= {"type", "title", "status", "detail"}
    answers = doc["paths"]["/fences/{fence_id}"]["get"]["responses"]
    for status in ("4XX", "5XX"):
        assert answers[status]["content"][problems.MEDIA_TYPE]["schema"]["$ref"].endswith("/Problem")


def test_a_fence_is_geojson() -> None:
    with stored():
        one = HTTP.get("/fences/f-1", headers=GOOD)
        page = HTTP.get("/fences", headers=GOOD)
    assert one.status_code == 200 and one.headers["content-type"] == "application/geo+json"
    assert one.json()["type"] == "Feature" and one.json()["id"] == "f-1"
    assert page.headers["content-type"] == "application/geo+json"
    assert page.json()["type"] == "FeatureCollection"
    doc = HTTP.get("/openapi.json").json()
    assert "application/geo+json" in doc["paths"]["/fences/{fence_id}"]["get"]["responses"]["200"]["content"]
