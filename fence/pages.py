"""The API's pages: `/ops` (operators: the pipeline's figures from Prometheus), `/venues/{id}`
(a hive's owner: live occupancy from both sources, today by hour, popular times, forecast
against what happened, sensor health), their static files (fence/web/static) and the JS
libraries npm installed under fence/web/node_modules (deploy/setup.sh runs `npm ci` there:
served from this host, no CDN). Without them (a checkout where `npm ci` has not run) the API
warns at start, and each page shows a message in place of its map or charts.

/ops and /ops/data need no token: bind the API to an internal address, or put /ops behind the
proxy's authentication, where the figures must not be public. /venues/{id} is a static page:
its data comes from the owner's routes, with the owner's Firebase ID token, which the page gets
by signing in with email and password (Firebase Auth's REST API: the Auth emulator on the local
stack, `/pages/config` says where) or from a link's `#token=...` (the app opening it).

/map (operators, like /ops: every fence and every object, no token; keep it internal) is the
live map: the fences from `/map/fences`, the roads from `/map/roads` (a GeoJSON file set-up
writes from the OSM extract: offline) or a tile server where there is internet, and the
objects, counts and events from the websocket `/map/ws` (fence/map_feed.py: at most two
messages a second per map).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, WebSocket, WebSocketDisconnect
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from fence.map_feed import MAX_FENCES_PAGE, ClientGone, MapClient, MapFeed
from fence.ops import OpsFigures, Unavailable
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


def add_pages(app: FastAPI, ops: OpsFigures | None, auth: dict[str, Any], feed: MapFeed | None = None,
              map_files: MapFiles = MapFiles(None, None)) -> None:
    """`auth`: how a page signs in (`/pages/config`): {"project", "emulator" (http://host:port or
    None), "api_key" (the project's web API key; any with the emulator)}."""
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

    @app.get("/map", include_in_schema=False)
    async def map_page() -> FileResponse:
        return FileResponse(STATIC / "map.html", headers={"Cache-Control": "no-cache"})

    @app.get("/map/roads", include_in_schema=False)
    async def map_roads() -> FileResponse:
        if map_files.roads is None or not map_files.roads.is_file():
            raise ApiError(404, "no road layer configured (GEOFENCE_MAP_ROADS)")
        return FileResponse(map_files.roads, media_type="application/geo+json")

    @app.get("/map/fences", tags=["operators"], summary="Every live fence, a page at a time (the map's)",
             description="GeoJSON FeatureCollection of every user's live fences by id; `next_after` when "
                         "there are more.")
    async def map_fences(after: str = "", limit: int = Query(MAX_FENCES_PAGE, ge=1, le=MAX_FENCES_PAGE)
                         ) -> dict[str, Any]:
        if feed is None:
            raise ApiError(503, "no map feed in this process")
        return await feed.fences(after, limit)

    @app.get("/map/objects/{object_id}", tags=["operators"], summary="An object's last position on the map")
    async def map_object(object_id: str) -> dict[str, Any]:
        got = None if feed is None else feed.view.position(object_id)
        if got is None:
            raise ApiError(404, f"object {object_id!r} is not on the map (no position in the last minutes, "
                                "or no map open to collect them)")
        return {"object_id": object_id, "lon": got[0], "lat": got[1], "ts": got[2]}

    @app.websocket("/map/ws")
    async def map_ws(ws: WebSocket) -> None:
        await ws.accept()
        if feed is None:
            await ws.close(code=1013, reason="no map feed in this process")
            return
        client = feed.join()
        try:
            async with asyncio.TaskGroup() as tg:
                sender = tg.create_task(_pump(ws, client, feed))
                await _until_closed(ws)
                sender.cancel()
        except* (WebSocketDisconnect, ClientGone):
            pass
        finally:
            feed.leave(client)
            with contextlib.suppress(Exception):
                await ws.close(code=1001)


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


async def _pump(ws: WebSocket, client: MapClient, feed: MapFeed) -> None:
    while True:
        await ws.send_bytes(await client.next(feed.snapshot))


async def _until_closed(ws: WebSocket) -> None:
    """A map sends nothing that matters; this returns when it closes."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
