"""The platform's HTTP API from a client: fences, their archived events (typed, page by page),
who is inside, proximity subscriptions, webhook endpoints. Authenticated by a Firebase ID token
(a string, or a callable returning a fresh one: tokens expire after an hour); a member of
several tenants names one (`tenant`). An answer that is not a 2xx raises ApiError with the
server's message.

    async with GeofenceHttp("https://geofence.example.com", token=id_token) as api:
        fence = await api.create_fence(feature)
        async for event in api.all_events("depot"):
            ...
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from geofence_client.events import FenceEvent, event_of

TENANT_HEADER = "X-Geofence-Tenant"


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


def _path(name: str) -> str:
    return quote(name, safe="")


class GeofenceHttp:
    def __init__(self, base_url: str, token: str | Callable[[], str], tenant: str | None = None,
                 timeout: float = 30.0) -> None:
        self._token, self.tenant = token, tenant
        self._http = httpx.AsyncClient(base_url=base_url, timeout=timeout)

    async def __aenter__(self) -> GeofenceHttp:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    def _headers(self) -> dict[str, str]:
        token = self._token() if callable(self._token) else self._token
        headers = {"Authorization": f"Bearer {token}"}
        if self.tenant:
            headers[TENANT_HEADER] = self.tenant
        return headers

    async def _call(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None
                    ) -> Any:
        answer = await self._http.request(method, path, json=body, headers=self._headers(),
                                          params={k: v for k, v in (params or {}).items() if v is not None})
        if not answer.is_success:
            try:
                detail = answer.json()
                message = str(detail.get("error") or detail.get("detail") or detail)
            except ValueError:
                message = answer.text[:500]
            raise ApiError(answer.status_code, message)
        return None if answer.status_code == 204 or not answer.content else answer.json()

    # -- fences ---------------------------------------------------------------------------

    async def create_fence(self, feature: dict[str, Any]) -> dict[str, Any]:
        """A GeoJSON Feature (its `id` the fence's, `properties` its options)."""
        fence: dict[str, Any] = await self._call("POST", "/fences", feature)
        return fence

    async def fence(self, fence_id: str) -> dict[str, Any]:
        fence: dict[str, Any] = await self._call("GET", f"/fences/{_path(fence_id)}")
        return fence

    async def replace_fence(self, fence_id: str, feature: dict[str, Any]) -> dict[str, Any]:
        fence: dict[str, Any] = await self._call("PUT", f"/fences/{_path(fence_id)}", feature)
        return fence

    async def delete_fence(self, fence_id: str) -> dict[str, Any]:
        gone: dict[str, Any] = await self._call("DELETE", f"/fences/{_path(fence_id)}")
        return gone

    async def fences(self, bbox: Sequence[float] | None = None) -> AsyncIterator[dict[str, Any]]:
        """Every fence of the tenant (those meeting `bbox`), page by page."""
        after = ""
        while True:
            page = await self._call("GET", "/fences", params={
                "bbox": None if bbox is None else ",".join(map(str, bbox)), "after": after})
            for fence in page["features"]:
                yield fence
            after = page.get("next_after") or ""
            if not after:
                return

    async def occupants(self, fence_id: str) -> dict[str, Any]:
        """Who is inside the fence now."""
        found: dict[str, Any] = await self._call("GET", f"/fences/{_path(fence_id)}/objects")
        return found

    # -- events ---------------------------------------------------------------------------

    async def events_page(self, fence_id: str, since: float = 0.0, limit: int = 1000,
                          cursor: str | None = None) -> tuple[list[FenceEvent], str | None]:
        """One page of the fence's archived events and the cursor of the next (None: the end)."""
        page = await self._call("GET", f"/fences/{_path(fence_id)}/events",
                                params={"since": since, "limit": limit, "cursor": cursor})
        return [self._archived(fence_id, e) for e in page["events"]], page.get("next")

    async def all_events(self, fence_id: str, since: float = 0.0, limit: int = 1000
                         ) -> AsyncIterator[FenceEvent]:
        """Every archived event of the fence from `since`, oldest first, each once."""
        cursor: str | None = None
        while True:
            events, cursor = await self.events_page(fence_id, since, limit, cursor)
            for e in events:
                yield e
            if cursor is None:
                return

    @staticmethod
    def _archived(fence_id: str, e: dict[str, Any]) -> FenceEvent:
        event = event_of({"fence_id": fence_id, **e})
        assert isinstance(event, FenceEvent)
        return event

    # -- proximity subscriptions ----------------------------------------------------------

    async def subscribe(self, subscription: dict[str, Any]) -> dict[str, Any]:
        """`{"object", "radius_m", "match"?, "where"?}`: nearby / faraway events."""
        made: dict[str, Any] = await self._call("POST", "/subscriptions", subscription)
        return made

    async def subscriptions(self) -> list[dict[str, Any]]:
        found = await self._call("GET", "/subscriptions")
        subs: list[dict[str, Any]] = found["subscriptions"]
        return subs

    async def unsubscribe(self, sub_id: str) -> None:
        await self._call("DELETE", f"/subscriptions/{_path(sub_id)}")

    # -- webhooks (a tenant admin's) ------------------------------------------------------

    async def add_webhook(self, url: str, fences: Sequence[str] | None = None,
                          kinds: Sequence[str] | None = None, objects: Sequence[str] | None = None,
                          batch: int = 1, **more: Any) -> dict[str, Any]:
        """An HTTPS endpoint for the tenant's events; the answer's `secret` is shown this once."""
        body: dict[str, Any] = {"url": url, "batch": batch, **more}
        for key, value in (("fences", fences), ("kinds", kinds), ("objects", objects)):
            if value:
                body[key] = list(value)
        made: dict[str, Any] = await self._call("POST", "/webhooks", body)
        return made

    async def webhooks(self) -> list[dict[str, Any]]:
        found = await self._call("GET", "/webhooks")
        hooks: list[dict[str, Any]] = found["webhooks"]
        return hooks

    async def webhook(self, endpoint_id: str) -> dict[str, Any]:
        """The endpoint and its delivery: events waiting, given up, the last error."""
        shown: dict[str, Any] = await self._call("GET", f"/webhooks/{_path(endpoint_id)}")
        return shown

    async def remove_webhook(self, endpoint_id: str) -> None:
        await self._call("DELETE", f"/webhooks/{_path(endpoint_id)}")

    async def enable_webhook(self, endpoint_id: str) -> dict[str, Any]:
        shown: dict[str, Any] = await self._call("POST", f"/webhooks/{_path(endpoint_id)}/enable")
        return shown

    async def rotate_webhook(self, endpoint_id: str) -> str:
        rotated = await self._call("POST", f"/webhooks/{_path(endpoint_id)}/rotate")
        secret: str = rotated["secret"]
        return secret

    async def dead_webhook_events(self, endpoint_id: str) -> AsyncIterator[dict[str, Any]]:
        after = 0
        while True:
            page = await self._call("GET", f"/webhooks/{_path(endpoint_id)}/dead", params={"after": after})
            for row in page["dead"]:
                yield row
            if page.get("next") is None:
                return
            after = page["next"]
