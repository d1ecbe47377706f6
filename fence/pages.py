"""The API's pages: `/ops` (operators: the pipeline's figures from Prometheus), `/venues/{id}`
(a hive's owner: live occupancy from both sources, today by hour, popular times, forecast
against what happened, sensor health), their static files (fence/web/static) and the JS
libraries npm installed under fence/web/node_modules (deploy/setup.sh runs `npm ci` there:
served from this host, no CDN).

/ops and /ops/data need no token: bind the API to an internal address, or put /ops behind the
proxy's authentication, where the figures must not be public. /venues/{id} is a static page:
its data comes from the owner's routes, with the owner's Firebase ID token, which the page gets
by signing in with email and password (Firebase Auth's REST API: the Auth emulator on the local
stack, `/pages/config` says where) or from a link's `#token=...` (the app opening it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from fence.ops import OpsFigures, Unavailable
from fence.service import ApiError

WEB = Path(__file__).resolve().parent / "web"
STATIC = WEB / "static"
VENDOR = {"uplot": WEB / "node_modules" / "uplot" / "dist"}  # URL /vendor/<name>/ -> directory


def add_pages(app: FastAPI, ops: OpsFigures | None, auth: dict[str, Any]) -> None:
    """`auth`: how a page signs in (`/pages/config`): {"project", "emulator" (http://host:port or
    None), "api_key" (the project's web API key; any with the emulator)}."""
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    for name, directory in VENDOR.items():
        if directory.is_dir():  # missing: `bash deploy/setup.sh` installs it; the page says so
            app.mount(f"/vendor/{name}", StaticFiles(directory=directory), name=f"vendor-{name}")

    @app.get("/pages/config", include_in_schema=False)
    async def pages_config() -> dict[str, Any]:
        return {"auth": auth}

    @app.get("/venues/{hive_id}", include_in_schema=False)
    async def venue_page(hive_id: str) -> FileResponse:
        return FileResponse(STATIC / "venue.html", headers={"Cache-Control": "no-cache"})

    @app.get("/ops", include_in_schema=False)
    async def ops_page() -> FileResponse:
        return FileResponse(STATIC / "ops.html", headers={"Cache-Control": "no-cache"})

    @app.get("/ops/data", tags=["operators"], summary="The pipeline's figures (from Prometheus)",
             description="Per process: up, messages/s, positions/s, events/s, objects, fences, held "
                         "positions; the deepest queues; dead letters by reason (all time and the last 15 "
                         "minutes); device-to-event latency p50 / p99; updates/s, events/s and p99 over the "
                         "last 15 minutes; the alerts firing. 503 when Prometheus does not answer.")
    async def ops_data() -> dict[str, Any]:
        if ops is None:
            raise ApiError(503, "no Prometheus configured (GEOFENCE_PROMETHEUS_URL)")
        try:
            return await ops.take()
        except Unavailable as exc:
            raise ApiError(503, str(exc)) from None
