"""A sidecar's settings: `SidecarConfig`, built once in `main` from the GEOFENCE_* variables
(`from_env`), and the logging set up from them.

Invariants:
- A setting is checked where it is read, and a bad one ends the start with a `ConfigError`
  naming the variable: an unknown GEOFENCE_* key (a typo is refused, not ignored), a missing
  or non-amqp/postgresql URL, a number that is not positive, a relative journal directory, a
  topology (regions, workers) that does not hold.
- A password never reaches a log line or an error: every URL shown goes through `mask`
  (exchanges/settings.py, the one settings system every process uses).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

from exchanges import topology as t
from exchanges.settings import ConfigError, given, mask, positive

ENV_KEYS = t.SIDECAR_ENV_KEYS
MAX_FUTURE_S = 300.0  # GEOFENCE_MAX_FUTURE_S's default (SidecarConfig.max_future_s)





def parse_listen(value: str) -> tuple[str, int]:
    """host:port (GEOFENCE_METRICS_LISTEN); ValueError says why not."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:  # 0: any free port
        raise ValueError(f"{value!r}: host:port expected")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class SidecarConfig:
    """One sidecar's settings, built once in main from GEOFENCE_* variables.

    GEOFENCE_AMQP_URL is `amqp://user:password@host:port/?name=<connection name>`: the
    sidecar opens one connection per vhost it uses (the URL's path is ignored; the vhosts
    come from the topology). GEOFENCE_POSTGRES_URL is the store of fences and the worldmap.
    """

    role: str
    instance: str
    amqp_url: str
    postgres_url: str
    regions: tuple[str, ...] = t.Topology.regions
    workers: tuple[str, ...] = t.Topology.workers
    drain_s: float = 10.0
    batch_max: int = 5000
    prefetch: int = 10_000
    log_level: str = "INFO"
    # Where a stateful sidecar (x-fence) keeps its snapshot and journal; required there.
    journal_dir: str = ""
    # "on" (production): persistent messages, publisher confirms, x-fence journal. "off":
    # transient messages, no confirms, no journal: a crash loses in-flight work. For
    # benchmarks (bench/e2e.py measures what durability costs); never in production.
    persistence: bool = True
    # memcache://host:port of the venues' read cache (the sensor sidecar fills it, the API
    # reads it); empty: no cache (reads go to PostgreSQL)
    memcached_url: str = ""
    # host:port where the sidecar serves Prometheus' /metrics (exchanges/shell/metrics.py);
    # empty: none
    metrics_listen: str = ""
    # A session that has not consumed its input for this long (neither recovering, paused nor
    # standing by) is stalled: it is ended and a new one connects; if it does not end, the
    # process exits for its supervisor to restart it (exchanges/shell/lifecycle.py).
    stall_s: float = 120.0
    # x-ingress refuses a position whose ts is more than this ahead of its receive time (a
    # device with a wrong clock would otherwise silence its object until then).
    max_future_s: float = MAX_FUTURE_S
    # x-fence: the workers after this one in name order back it up (fence/x_fence/slots.py)
    fence_backups: int = 1
    takeover_s: float = 1.0
    # the other nodes of amqp_url's cluster (host, port): open_connection fails over to them
    amqp_nodes: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_env(cls, role: str, instance: str, environ: Mapping[str, str] | None = None,
                 also_known: Iterable[str] = ()) -> SidecarConfig:
        env = given(environ, {*ENV_KEYS, *also_known})
        missing = [k for k in ("GEOFENCE_AMQP_URL", "GEOFENCE_POSTGRES_URL") if not env.get(k)]
        if missing:
            raise ConfigError(f"{' and '.join(missing)} must be set "
                              "(`geofence status --json` shows the local stack's URLs)")
        amqp = env["GEOFENCE_AMQP_URL"]
        if urlsplit(amqp).scheme not in ("amqp", "amqps"):
            raise ConfigError(f"GEOFENCE_AMQP_URL={mask(amqp)!r}: not an amqp:// URL")
        pg = env["GEOFENCE_POSTGRES_URL"]
        if urlsplit(pg).scheme not in ("postgresql", "postgres"):
            raise ConfigError(f"GEOFENCE_POSTGRES_URL={mask(pg)!r}: not a postgresql:// URL")
        kw: dict[str, Any] = {}
        for key, name in (("GEOFENCE_REGIONS", "regions"), ("GEOFENCE_WORKERS", "workers")):
            if key in env:
                kw[name] = tuple(n.strip() for n in env[key].split(","))
        if "GEOFENCE_DRAIN_S" in env:
            kw["drain_s"] = positive("GEOFENCE_DRAIN_S", env["GEOFENCE_DRAIN_S"], float)
        if "GEOFENCE_BATCH_MAX" in env:
            kw["batch_max"] = positive("GEOFENCE_BATCH_MAX", env["GEOFENCE_BATCH_MAX"], int)
        if "GEOFENCE_PREFETCH" in env:
            kw["prefetch"] = positive("GEOFENCE_PREFETCH", env["GEOFENCE_PREFETCH"], int)
        if "GEOFENCE_LOG_LEVEL" in env:
            kw["log_level"] = env["GEOFENCE_LOG_LEVEL"].upper()
        if env.get("GEOFENCE_JOURNAL_DIR"):
            if not os.path.isabs(env["GEOFENCE_JOURNAL_DIR"]):
                raise ConfigError(f"GEOFENCE_JOURNAL_DIR={env['GEOFENCE_JOURNAL_DIR']!r}: not absolute")
            kw["journal_dir"] = env["GEOFENCE_JOURNAL_DIR"]
        if "GEOFENCE_PERSISTENCE" in env:
            value = env["GEOFENCE_PERSISTENCE"].strip().lower()
            if value not in ("on", "off"):
                raise ConfigError(f"GEOFENCE_PERSISTENCE={env['GEOFENCE_PERSISTENCE']!r}: on or off")
            kw["persistence"] = value == "on"
        if env.get("GEOFENCE_MEMCACHED_URL"):
            mc = urlsplit(env["GEOFENCE_MEMCACHED_URL"])
            if mc.scheme != "memcache" or not mc.hostname:
                raise ConfigError(f"GEOFENCE_MEMCACHED_URL={env['GEOFENCE_MEMCACHED_URL']!r}: "
                                  "memcache://host:port expected")
            kw["memcached_url"] = env["GEOFENCE_MEMCACHED_URL"]
        for key, name in (("GEOFENCE_STALL_S", "stall_s"), ("GEOFENCE_MAX_FUTURE_S", "max_future_s")):
            if key in env:
                kw[name] = positive(key, env[key], float)
        if "GEOFENCE_FENCE_BACKUPS" in env:
            raw = env["GEOFENCE_FENCE_BACKUPS"]
            if not raw.strip().isdigit():
                raise ConfigError(f"GEOFENCE_FENCE_BACKUPS={raw!r}: an integer >= 0")
            kw["fence_backups"] = int(raw)
        if "GEOFENCE_TAKEOVER_S" in env:
            kw["takeover_s"] = positive("GEOFENCE_TAKEOVER_S", env["GEOFENCE_TAKEOVER_S"], float)
        if env.get("GEOFENCE_AMQP_NODES"):
            kw["amqp_nodes"] = parse_nodes("GEOFENCE_AMQP_NODES", env["GEOFENCE_AMQP_NODES"])
        if env.get("GEOFENCE_METRICS_LISTEN"):
            try:
                parse_listen(env["GEOFENCE_METRICS_LISTEN"])
            except ValueError as exc:
                raise ConfigError(f"GEOFENCE_METRICS_LISTEN={exc}") from None
            kw["metrics_listen"] = env["GEOFENCE_METRICS_LISTEN"]
        config = cls(role, instance, amqp, pg, **kw)
        try:
            _ = config.topology
        except ValueError as exc:
            raise ConfigError(f"GEOFENCE_REGIONS / GEOFENCE_WORKERS: {exc}") from None
        return config

    @property
    def topology(self) -> t.Topology:
        return t.Topology(self.regions, self.workers)

    @property
    def name(self) -> str:
        return f"{self.role}-{self.instance}" if self.instance else self.role

    @property
    def amqp_endpoints(self) -> tuple[tuple[str, int], ...]:
        """amqp_url's node, then the other nodes of its cluster."""
        parts = urlsplit(self.amqp_url)
        default = 5671 if parts.scheme == "amqps" else 5672
        return ((parts.hostname or "localhost", parts.port or default), *self.amqp_nodes)

    def amqp_for(self, vhost: str, endpoint: tuple[str, int] | None = None) -> str:
        """The AMQP URL for one vhost, with the connection named after this sidecar; on
        `endpoint` (host, port) when the vhost is on another broker (same user)."""
        parts = urlsplit(self.amqp_url)
        query = parse_qs(parts.query)
        query.setdefault("name", [self.name])
        q = "&".join(f"{k}={quote(v[0], safe='')}" for k, v in sorted(query.items()))
        if endpoint is not None:
            userinfo = parts.netloc.rpartition("@")[0]
            parts = parts._replace(netloc=f"{userinfo}@{endpoint[0]}:{endpoint[1]}" if userinfo
                                   else f"{endpoint[0]}:{endpoint[1]}")
        return urlunsplit(parts._replace(path="/" + quote(vhost, safe=""), query=q))

    def describe(self) -> str:
        return (f"{self.name}: amqp {mask(self.amqp_url)}, postgres {mask(self.postgres_url)}, "
                f"regions {','.join(self.regions)}, workers {','.join(self.workers)}, "
                f"batch <= {self.batch_max}, prefetch {self.prefetch}, drain {self.drain_s:g}s"
                + (f", journal {self.journal_dir}" if self.journal_dir else "")
                + (f", cache {self.memcached_url}" if self.memcached_url else "")
                + (f", metrics {self.metrics_listen}" if self.metrics_listen else "")
                + ("" if self.persistence else ", PERSISTENCE OFF (benchmarks only)"))


def setup_logging(config: SidecarConfig) -> None:
    logging.basicConfig(level=config.log_level,
                        format=f"%(asctime)s {config.name} %(levelname)s %(message)s")


def parse_nodes(key: str, raw: str) -> tuple[tuple[str, int], ...]:
    """`host:port,host:port` (GEOFENCE_AMQP_NODES)."""
    out = []
    for item in (i.strip() for i in raw.split(",")):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{key}={raw!r}: host:port,... expected ({item!r})")
        out.append((host, int(port)))
    return tuple(out)
