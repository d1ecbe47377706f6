"""The API's pages: `/ops` (operators: the pipeline's figures from Prometheus), `/venues/{id}`
(a hive's owner: live occupancy from both sources, today by hour, popular times, forecast
against what happened, sensor health), their static files (fence/web/static) and the JS
libraries npm installed under fence/web/node_modules (deploy/setup.sh runs `npm ci` there:
served from this host, no CDN). Without them (a checkout where `npm ci` has not run) the API
warns at start, and each page shows a message in place of its map or charts.

The pages are static files (they hold no data, so they are public); their data is behind
sign-in (fence/page_data.py): each page shows a sign-in form first (email and password through
Firebase Auth's REST API: the Auth emulator on the local stack, `/pages/config` says where; or
a link's `#token=...`, the app opening it) and sends the Firebase ID token with every request
(fence/web/static/common.js). /ops (`/ops/data`: a platform operator's), /venues/{id} (the
owner's routes), /map the live map (`/map/fences`, `/map/objects/{id}` and the websocket
`/map/ws`: a tenant's member sees its tenant's fences and objects, an operator every tenant's;
the roads from `/map/roads`, a GeoJSON file set-up writes from the OSM extract, public: offline
map data, or a tile server where there is internet).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from fence.page_policy import (
    GOOGLE_SIGN_IN,
    SecurityHeaders,
    content_security_policy,
    origin_of,
    security_headers,
)
from fence.service import ApiError

log = logging.getLogger("geofence")

WEB = Path(__file__).resolve().parent / "web"
STATIC = WEB / "static"
# URL /vendor/<name>/ -> directory (npm packages)
VENDOR = {name: WEB / "node_modules" / name / "dist" for name in ("uplot", "leaflet")}
# what the pages load from each (their <script> and <link>), and what they draw with it
VENDOR_FILES = {"uplot": ("uPlot.iife.min.js", "uPlot.min.css"), "leaflet": ("leaflet.js", "leaflet.css")}
VENDOR_USE = {"uplot": "the charts of /ops and /venues/{id}", "leaflet": "the map of /map"}


@dataclass(frozen=True)
class MapFiles:
    roads: Path | None  # GeoJSON (deploy/demo/map_roads.py writes it)
    tiles: str | None  # a raster tile URL template


def add_pages(app: FastAPI, auth: dict[str, Any], map_files: MapFiles = MapFiles(None, None)) -> None:
    """The pages (static, public) and their configuration. `auth`: how a page signs in
    (`/pages/config`): {"project", "emulator" (http://host:port or None), "api_key" (the
    project's web API key; any with the emulator)}. Their data: fence/page_data.py. Every
    answer of `app` gets fence/page_policy.py's headers."""
    tiles = origin_of(map_files.tiles)
    csp = content_security_policy([auth["emulator"]] if auth.get("emulator") else GOOGLE_SIGN_IN,
                                  [tiles] if tiles else [])
    app.add_middleware(SecurityHeaders, headers=security_headers(csp))
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    for name, directory in VENDOR.items():
        if directory.is_dir():
            app.mount(f"/vendor/{name}", StaticFiles(directory=directory), name=f"vendor-{name}")
    # missing (a checkout where `npm ci` has not run): said here, once, at start; each page
    # shows a message in place of what it would draw (fence/web/static/common.js)
    for warning in vendor_warnings():
        log.warning("%s", warning)

    @app.get("/pages/config", include_in_schema=False)
    async def pages_config() -> dict[str, Any]:
        roads = map_files.roads is not None and map_files.roads.is_file()
        return {"auth": auth, "map": {"tiles": map_files.tiles, "roads": "/map/roads" if roads else None}}

    @app.get("/venues/{hive_id}", include_in_schema=False)
    async def venue_page(hive_id: str) -> FileResponse:
        return FileResponse(STATIC / "venue.html", headers={"Cache-Control": "no-cache"})

    @app.get("/ops", include_in_schema=False)
    async def ops_page() -> FileResponse:
        return FileResponse(STATIC / "ops.html", headers={"Cache-Control": "no-cache"})

    @app.get("/map", include_in_schema=False)
    async def map_page() -> FileResponse:
        return FileResponse(STATIC / "map.html", headers={"Cache-Control": "no-cache"})

    @app.get("/map/roads", include_in_schema=False)
    async def map_roads() -> FileResponse:
        if map_files.roads is None or not map_files.roads.is_file():
            raise ApiError(404, "no road layer configured (GEOFENCE_MAP_ROADS)")
        return FileResponse(map_files.roads, media_type="application/geo+json")


def vendor_warnings() -> list[str]:
    """What is missing of the npm libraries the pages load: one line per library."""
    out = []
    for name, directory in VENDOR.items():
        absent = next((directory / f for f in VENDOR_FILES[name] if not (directory / f).is_file()), None)
        if absent is not None:
            out.append(f"pages: /vendor/{name}/{absent.name} is missing ({absent} not found): "
                       f"{VENDOR_USE[name]} will show a message instead; run `bash deploy/setup.sh` "
                       f"(or `npm ci` in {WEB}), then restart the API")
    return out
