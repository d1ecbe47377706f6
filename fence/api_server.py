"""`geofence api`: the fence service process. One FenceManager (PostgreSQL pool, control
exchanges of every region, x-fence's control queues) serves three fronts:

- the HTTP API (fence/api.py, uvicorn) on GEOFENCE_API_HOST:GEOFENCE_API_PORT;
- the AMQP API (fence/rpc.py) on queue fence.api (replicas share it);
- the follower (fence/follow_shell.py) on queue fence.follow: fences that follow objects;
- the pages (fence/pages.py) and the live map's feed (fence/map_feed.py), while a map is open.

Settings: the sidecar ones (GEOFENCE_AMQP_URL as the fence-manager user, GEOFENCE_POSTGRES_URL,
GEOFENCE_REGIONS, GEOFENCE_WORKERS, ...) plus GEOFENCE_API_HOST (127.0.0.1), GEOFENCE_API_PORT
(8080), GEOFENCE_MAP_ROADS (a GeoJSON file: /map's offline roads), GEOFENCE_MAP_TILES (a tile
URL template, where there is internet) and GEOFENCE_FIREBASE_PROJECT (the Firebase project
whose ID tokens are accepted);
FIREBASE_AUTH_EMULATOR_HOST (host:port) points firebase-admin at the Auth emulator instead of
Google. SIGTERM: the HTTP server stops taking requests, the AMQP fronts drain, then the
manager closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from exchanges import shell
from exchanges import topology as t
from exchanges.settings import positive
from exchanges.settings_registry import keys_for
from exchanges.token_buckets import Limit
from fence.api import create_app
from fence.auth import FirebaseVerifier
from fence.follow_shell import DUE_EVERY_S, REFRESH_S, Follower
from fence.manager import FenceManager
from fence.map_feed import MapFeed
from fence.ops import OpsFigures
from fence.page_data import add_page_data
from fence.page_policy import origin_of
from fence.pages import MapFiles, add_pages
from fence.rate_limits import RateLimits
from fence.rpc import RpcServer
from fence.service import FenceService
from fence.venues.commands import SensorCommands
from fence.venues.reads import VenueCache, VenueReads

log = logging.getLogger("geofence")
# Every GEOFENCE_* key the API reads (exchanges/settings_registry.py), the sidecar ones among them
API_KEYS = keys_for("api")
ROLE = "fence-api"
RPC_BATCH = 64


@dataclass(frozen=True)
class ApiConfig:
    sidecar: shell.SidecarConfig
    host: str = "127.0.0.1"
    port: int = 8080
    firebase_project: str = "demo-geofence"
    emulator_host: str | None = None
    credentials_path: str | None = None  # a service account JSON (real Firebase; optional)
    prometheus_url: str | None = None  # where /ops reads its figures (fence/ops.py)
    web_api_key: str | None = None  # the Firebase project's web API key: the pages sign in with it
    map_roads: str | None = None  # a GeoJSON file of roads: /map's offline background
    map_tiles: str | None = None  # a raster tile URL template ({z}/{x}/{y}): /map's background online
    rate: float = 200.0  # requests/s per client address (fence/rate_limits.py)
    token_rate: float = 100.0  # requests/s per bearer token
    failed_sign_ins: float = 30.0  # a minute, per client address
    tls_listen: tuple[str, int] | None = None  # HTTPS as well, here (GEOFENCE_API_TLS_LISTEN)
    tls_cert: str | None = None
    tls_key: str | None = None

    def rate_limits(self) -> RateLimits:
        return RateLimits(Limit(self.rate, 2 * self.rate), Limit(self.token_rate, 2 * self.token_rate),
                          Limit(self.failed_sign_ins / 60, 2 * self.failed_sign_ins))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 also_known: tuple[str, ...] = ()) -> ApiConfig:
        env = os.environ if environ is None else environ
        sidecar = shell.SidecarConfig.from_env(ROLE, "", env, also_known=(*API_KEYS, *also_known))
        kw: dict[str, Any] = {}
        if env.get("GEOFENCE_API_HOST"):
            kw["host"] = env["GEOFENCE_API_HOST"]
        if env.get("GEOFENCE_API_PORT"):
            port = positive("GEOFENCE_API_PORT", env["GEOFENCE_API_PORT"], int)
            if port > 65535:
                raise shell.ConfigError(f"GEOFENCE_API_PORT={port}: not a TCP port")
            kw["port"] = port
        if env.get("GEOFENCE_FIREBASE_PROJECT"):
            kw["firebase_project"] = env["GEOFENCE_FIREBASE_PROJECT"]
        if env.get("GEOFENCE_FIREBASE_WEB_API_KEY"):
            kw["web_api_key"] = env["GEOFENCE_FIREBASE_WEB_API_KEY"]
        if env.get("GEOFENCE_PROMETHEUS_URL"):
            if not env["GEOFENCE_PROMETHEUS_URL"].startswith(("http://", "https://")):
                raise shell.ConfigError(f"GEOFENCE_PROMETHEUS_URL={env['GEOFENCE_PROMETHEUS_URL']!r}: "
                                        "http(s)://host:port expected")
            kw["prometheus_url"] = env["GEOFENCE_PROMETHEUS_URL"]
        if env.get("GEOFENCE_MAP_ROADS"):
            kw["map_roads"] = env["GEOFENCE_MAP_ROADS"]
        if env.get("GEOFENCE_MAP_TILES"):
            tiles = env["GEOFENCE_MAP_TILES"]
            placeholders = all(k in tiles for k in ("{z}", "{x}", "{y}"))
            if not tiles.startswith(("http://", "https://")) or not placeholders:
                raise shell.ConfigError(f"GEOFENCE_MAP_TILES={tiles!r}: "
                                        "an http(s) URL with {z}, {x} and {y}")
            try:
                origin_of(tiles)  # the pages' policy names its origin (fence/page_policy.py)
            except ValueError as exc:
                raise shell.ConfigError(f"GEOFENCE_MAP_TILES: {exc}") from None
            kw["map_tiles"] = tiles
        for key, field in (("GEOFENCE_API_RATE", "rate"), ("GEOFENCE_API_TOKEN_RATE", "token_rate"),
                           ("GEOFENCE_API_FAILED_SIGN_INS", "failed_sign_ins")):
            if env.get(key):
                kw[field] = positive(key, env[key], float)
                if not math.isfinite(kw[field]):
                    raise shell.ConfigError(f"{key}={env[key]!r}: a finite number")
        if env.get("GEOFENCE_API_TLS_LISTEN"):
            raw = env["GEOFENCE_API_TLS_LISTEN"]
            host, _, port_text = raw.rpartition(":")
            tls_port = positive("GEOFENCE_API_TLS_LISTEN", port_text, int) if port_text.isdigit() else 0
            if not host or not 0 < tls_port <= 65535:
                raise shell.ConfigError(f"GEOFENCE_API_TLS_LISTEN={raw!r}: host:port expected")
            files = {k: env.get(k) for k in ("GEOFENCE_API_TLS_CERT", "GEOFENCE_API_TLS_KEY")}
            missing = [k for k, v in files.items() if not v or not Path(v).is_file()]
            if missing:
                raise shell.ConfigError(f"GEOFENCE_API_TLS_LISTEN needs {' and '.join(missing)} "
                                        "(readable files)")
            kw.update(tls_listen=(host, tls_port), tls_cert=files["GEOFENCE_API_TLS_CERT"],
                      tls_key=files["GEOFENCE_API_TLS_KEY"])
        return cls(sidecar, emulator_host=env.get("FIREBASE_AUTH_EMULATOR_HOST") or None,
                   credentials_path=env.get("GOOGLE_APPLICATION_CREDENTIALS") or None, **kw)

    def describe(self) -> str:
        auth = f"Auth emulator {self.emulator_host}" if self.emulator_host else "Firebase"
        https = f", HTTPS on {self.tls_listen[0]}:{self.tls_listen[1]}" if self.tls_listen else ""
        return (f"{self.sidecar.describe()}; HTTP on {self.host}:{self.port}{https}; ID tokens of project "
                f"{self.firebase_project} ({auth})")


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the process's stop event ends it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


async def serve_amqp(config: ApiConfig, rpc: RpcServer, follower: Follower, counters: shell.Counters,
                     stop: asyncio.Event, extra: Callable[[], Mapping[str, float]] | None = None) -> None:
    cfg = config.sidecar

    async def session(stop: asyncio.Event) -> None:
        async with contextlib.AsyncExitStack() as stack:
            fences = await shell.open_connection(cfg, t.FENCES_VHOST, stack)
            ingress = await shell.open_connection(cfg, t.INGRESS_VHOST, stack)
            out = await shell.open_channel(fences, stack)
            api_dlx = await out.get_exchange(t.DEAD_LETTER_EXCHANGE, ensure=False)
            rpc.bind(out, api_dlx)
            in_out = await shell.open_channel(ingress, stack)
            follow_dlx = await in_out.get_exchange(t.DEAD_LETTER_EXCHANGE, ensure=False)
            follower.bind(follow_dlx)
            api_ch = await shell.open_channel(fences, stack)
            follow_ch = await shell.open_channel(ingress, stack)
            requests = shell.Intake.on(await api_ch.get_queue(t.API_QUEUE), RPC_BATCH, 4 * RPC_BATCH,
                                       exclusive=False)
            follows = shell.Intake.on(await follow_ch.get_queue(t.FOLLOW_QUEUE), 1000, 1000, exclusive=False)
            log.info("consuming %s (fence API) and %s (follower)", t.API_QUEUE, t.FOLLOW_QUEUE)
            await shell.run_session(
                stop, [fences, ingress], [requests, follows],
                [shell.run_batches(requests, rpc.handle, counters, api_dlx),
                 shell.run_batches(follows, follower.handle, counters, follow_dlx)],
                [shell.periodic(stop, REFRESH_S, follower.refresh),
                 shell.periodic(stop, DUE_EVERY_S, follower.due),
                 shell.periodic(stop, 30, lambda: log.info("%s", counters.line()))], cfg.drain_s,
                counters=counters)

    await shell.serve(cfg, session, stop, counters, extra)


def venue_metrics(venues: VenueReads) -> dict[str, float]:
    """The venue reads' counts for /metrics (names ending _total are counters)."""
    c = venues.cache
    out = {"venue_pg_reads_total": float(venues.pg_reads)}
    if c is not None:
        out.update({"venue_cache_hits_total": float(c.hits), "venue_cache_misses_total": float(c.misses),
                    "venue_cache_failures_total": float(c.failures)})
    return out


def venue_health(venues: VenueReads) -> dict[str, Any]:
    c = venues.cache
    return {"venues": {"pg_reads": venues.pg_reads, "cache": None if c is None else
                       {"hits": c.hits, "misses": c.misses, "failures": c.failures}}}


async def main(config: ApiConfig) -> int:
    stop = asyncio.Event()
    shell.install_signal_handlers(stop)
    log.info("%s", config.describe())
    cfg = config.sidecar
    verifier = FirebaseVerifier(config.firebase_project, config.emulator_host,
                                credentials_path=Path(config.credentials_path) if config.credentials_path
                                else None)
    async with FenceManager(cfg.amqp_url, cfg.postgres_url, cfg.regions, cfg.workers) as manager:
        counters = manager.counters
        follower = Follower(manager, counters)
        await follower.refresh()
        service = FenceService(manager, follower.refresh)
        rpc = RpcServer(service, verifier, counters)
        cache = VenueCache(cfg.memcached_url) if cfg.memcached_url else None
        venues = VenueReads(manager.pool, cache)
        commands = SensorCommands(cfg.amqp_for(t.INGRESS_VHOST))
        app = create_app(service, verifier, lambda: {"counters": counters.to_json(), **venue_health(venues)},
                         venues, commands, counters, config.rate_limits())
        feed = MapFeed(cfg, manager, counters)
        emulator = f"http://{config.emulator_host}" if config.emulator_host else None
        add_pages(app, {"project": config.firebase_project, "api_key": config.web_api_key or "local-emulator",
                        "emulator": emulator},
                  MapFiles(Path(config.map_roads) if config.map_roads else None, config.map_tiles))
        add_page_data(app, OpsFigures(config.prometheus_url) if config.prometheus_url else None, feed)
        def server_on(host: str, port: int, **tls: Any) -> _Server:
            return _Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                          lifespan="off", http="httptools", ws="wsproto",
                                          ws_per_message_deflate=False, **tls))  # see fence/map_view.py

        # the plain one on GEOFENCE_API_HOST (loopback, or behind a TLS proxy), the HTTPS one
        # where clients outside the host reach it: one application, one set of limits
        servers = [server_on(config.host, config.port)]
        if config.tls_listen is not None:
            servers.append(server_on(*config.tls_listen, ssl_certfile=config.tls_cert,
                                     ssl_keyfile=config.tls_key))

        async def stop_http() -> None:
            await stop.wait()
            for server in servers:
                server.should_exit = True

        async def http(server: _Server) -> None:
            try:
                await server.serve()
            finally:
                stop.set()  # an HTTP server ended (or never started): stop the rest too

        async with asyncio.TaskGroup() as tg:
            for server in servers:
                tg.create_task(http(server))
            tg.create_task(stop_http())
            tg.create_task(serve_amqp(config, rpc, follower, counters, stop, lambda: venue_metrics(venues)))
            tg.create_task(feed.run(stop))
    log.info("stopped: %s", counters.line())
    return 0
