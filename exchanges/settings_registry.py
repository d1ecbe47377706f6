"""Every environment variable the project reads, declared once: its type, default, meaning,
the processes that read it and whether its value is secret.

The per-process key lists are views of this registry, not lists of their own: a sidecar's
(`SIDECAR_KEYS`, exchanges.topology.SIDECAR_ENV_KEYS: SidecarConfig knows the keys of every
sidecar role), the API's (`keys_for("api")`), the nightly jobs' (`keys_for("spark")`) and the
local stack's (`keys_for("stack")`). Each process still refuses, through
exchanges/settings.py's `given`, a GEOFENCE_* key that no part of it knows.

Nothing outside this module reads the environment by key (tests/unit/test_settings_registry.py
checks the source): a process takes its environment whole in `main` and hands it to its
settings' `from_env`; the few live reads go through `read` (and `setdefault`), which refuse an
undeclared key. The one exception is GEOFENCE_KERNEL_CFLAGS, read by hilbert_c/build_kernel.py
when setup.py builds the C kernel, before this package exists. `geofence settings` prints the
registry; docs/settings.md is generated from it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

PREFIX = "GEOFENCE_"  # the project's own keys (the ones `given` checks)

# role -> who that is
ROLES: dict[str, str] = {
    "x-ingress": "the x-ingress sidecar (positions in)",
    "x-geo": "an x-geo sidecar (one per region)",
    "x-fence": "an x-fence worker (ENTER / LEAVE events out)",
    "archiver": "the events archiver (`geofence fence-archiver`)",
    "venue-sensors": "the sensor sidecar (`geofence venue-sensors`)",
    "webhooks": "the webhooks sidecar (`geofence fence-webhooks`)",
    "api": "the fence service (`geofence api`: HTTP and AMQP API, follower, pages)",
    "spark": "the nightly PySpark jobs (spark_jobs/, `geofence spark`, spark-submit)",
    "stack": "the local stack's settings (deploy/settings.py): `geofence up / down / status` and "
             "every command that works on the local stack",
    "cli": "a `geofence` command itself (up, fence, dlq, region, worker)",
    "build": "the C kernel's build (hilbert_c/build_kernel.py, at pip install)",
    "broker-guard": "the broker's login guard (`geofence broker-guard`, exchanges/broker_guard.py)",
}
# The roles SidecarConfig (exchanges/shell/config.py) serves: each of them accepts the keys of
# all of them (one parser, one file may serve several). The API reads the sidecar keys too,
# beside its own (fence/api_server.py).
SIDECAR_ROLES = ("x-ingress", "x-geo", "x-fence", "archiver", "venue-sensors", "webhooks")
_SIDECARS = (*SIDECAR_ROLES, "api")
_ALL = (*_SIDECARS, "spark", "stack", "cli")


@dataclass(frozen=True)
class Setting:
    name: str
    type: str  # what a value looks like
    default: str | None  # as the code has it; None: none (unset, or required where said)
    roles: tuple[str, ...]  # who reads it (ROLES)
    description: str
    secret: bool = False  # the value holds a password: shown masked (exchanges.settings.mask)


SETTINGS: tuple[Setting, ...] = (
    # ------------------------------------------------------------ every sidecar (SidecarConfig)
    Setting("GEOFENCE_AMQP_URL", "amqp URL", None, (*_SIDECARS, "spark", "cli"),
            "amqp://user:password@host:5672/?name=<connection name>: the process's RabbitMQ user; "
            "the vhosts come from the topology (the URL's path is ignored). Required by the "
            "sidecars and the API; the nightly jobs' fence-manager user (rebuild-bindings' "
            "repairs). `geofence fence`, `geofence dlq` and `geofence spark` use it instead of the "
            "local stack's when set.", secret=True),
    Setting("GEOFENCE_POSTGRES_URL", "postgresql URL", None, (*_SIDECARS, "spark", "cli"),
            "postgresql://user:password@host:port/db: fences, the worldmap, the events archive, "
            "the venues. Required by the sidecars, the API and the nightly jobs. `geofence fence` "
            "and `geofence spark` use it instead of the local stack's when set.", secret=True),
    Setting("GEOFENCE_REGIONS", "names a,b,...", "a,b", _ALL,
            "The x-geo regions (vhosts gf-region-<r>). For the local stack, when set, it says what "
            "the stack runs over what a live `geofence region` change recorded (and such a change "
            "is refused while it is set)."),
    Setting("GEOFENCE_WORKERS", "names w0,w1,...", "w0,w1", _ALL,
            "The x-fence workers (each of weight 1 on the consistent-hash ring). For the local "
            "stack, when set, it says what the stack runs over what a live `geofence worker` "
            "change recorded (and such a change is refused while it is set)."),
    Setting("GEOFENCE_DRAIN_S", "seconds > 0", "10", (*_SIDECARS, "cli"),
            "On SIGTERM, how long the batches in hand may take to finish. `geofence up` passes it "
            "on from its environment to the sidecars."),
    Setting("GEOFENCE_BATCH_MAX", "integer > 0", "5000", (*SIDECAR_ROLES, "cli"),
            "The most messages in one batch. `geofence up` passes it on."),
    Setting("GEOFENCE_PREFETCH", "integer > 0", "10000", (*SIDECAR_ROLES, "cli"),
            "Unacknowledged messages the broker may send ahead on an input queue. `geofence up` "
            "passes it on."),
    Setting("GEOFENCE_LOG_LEVEL", "log level", "INFO", (*_SIDECARS, "cli"),
            "Python logging level (DEBUG, INFO, WARNING, ...; any case). `geofence up` passes it "
            "on."),
    Setting("GEOFENCE_JOURNAL_DIR", "absolute path", None, ("x-ingress", "x-fence"),
            "Where x-fence keeps its snapshot and journal (required there) and x-ingress the "
            "proximity router's. The local stack: <state dir>/state/<process>; systemd: the "
            "unit's StateDirectory (`geofence host render` never writes it)."),
    Setting("GEOFENCE_PERSISTENCE", "on | off", "on",
            ("x-ingress", "x-geo", "x-fence", "venue-sensors", "cli"),
            "off: transient messages, no publisher confirms, no x-fence journal, so a crash loses "
            "work in flight; for benchmarks only (`python -m bench.e2e --mode durability`), never "
            "in production. `geofence up` passes it on."),
    Setting("GEOFENCE_MEMCACHED_URL", "memcache://host:port", None, ("venue-sensors", "api"),
            "The venues' read cache: the sensor sidecar fills it, the API reads it. Unset: no "
            "cache (reads go to PostgreSQL)."),
    Setting("GEOFENCE_METRICS_LISTEN", "host:port", None, _SIDECARS,
            "Where the process serves Prometheus' /metrics (port 0: any free one). Unset: no "
            "/metrics. The local stack gives each process its own port (GEOFENCE_METRICS_PORT)."),
    Setting("GEOFENCE_STALL_S", "seconds > 0", "120", _SIDECARS,
            "A session that consumed nothing for this long (neither recovering, paused nor "
            "standing by) is ended and a new one connects; one that will not end within 30 s "
            "makes the process exit (70) for its supervisor to restart it."),
    Setting("GEOFENCE_AMQP_NODES", "host:port,...", None, _SIDECARS,
            "The other nodes of GEOFENCE_AMQP_URL's RabbitMQ cluster (same user, same vhosts): a "
            "connection that cannot reach its node goes to the next one. `geofence up "
            "--broker-nodes 3` sets it for every sidecar."),
    Setting("GEOFENCE_FENCE_BACKUPS", "integer >= 0", "1", ("x-fence", "cli"),
            "How many other x-fence processes hold each worker's state as a backup (the next "
            "workers in name order), kept current from the worker's journal stream "
            "(x-fence.<worker>.journal); one of them takes the worker over when its process is "
            "gone. 0: none (a worker lost with its disk loses its state). `geofence up` passes it on."),
    Setting("GEOFENCE_TAKEOVER_S", "seconds > 0", "1", ("x-fence", "cli"),
            "How long a backup sees a worker's instance lock free before it takes the worker over "
            "(its own process takes it at once: it stays home when both are up)."),
    Setting("GEOFENCE_MAX_FUTURE_S", "seconds > 0", "300", ("x-ingress",),
            "x-ingress refuses (dead-letters, with the reason) a position whose ts is more than "
            "this ahead of its receive time: a device or gateway clock ahead."),
    # ------------------------------------------------------------ the fence service (ApiConfig)
    Setting("GEOFENCE_API_HOST", "address", "127.0.0.1", ("api",),
            "The address the HTTP API listens on."),
    Setting("GEOFENCE_API_PORT", "port", "8080", ("api", "stack"),
            "The HTTP API's port; the local stack's API listens there."),
    Setting("GEOFENCE_API_TLS_LISTEN", "host:port", None, ("api",),
            "Where the API also serves HTTPS (with GEOFENCE_API_TLS_CERT and _KEY); unset: plain "
            "HTTP only (behind a TLS proxy)."),
    Setting("GEOFENCE_API_TLS_CERT", "file", None, ("api",), "The HTTPS certificate (PEM, its chain)."),
    Setting("GEOFENCE_API_TLS_KEY", "file", None, ("api",), "The HTTPS certificate's key (PEM)."),
    Setting("GEOFENCE_API_RATE", "requests/s", "200", ("api",),
            "Requests (and map websockets) a second one client address may make, in bursts of "
            "twice as many; more are answered 429 with Retry-After (fence/rate_limits.py)."),
    Setting("GEOFENCE_API_TOKEN_RATE", "requests/s", "100", ("api",),
            "Requests a second one bearer token may make, from however many addresses, in bursts "
            "of twice as many; more are answered 429 with Retry-After."),
    Setting("GEOFENCE_API_FAILED_SIGN_INS", "per minute", "30", ("api",),
            "Failed sign-ins (answers 401) a minute one client address may have, in bursts of "
            "twice as many; beyond, every request of that address is answered 429 until it "
            "refills (a guessing client is slowed, nobody else)."),
    # ------------------------------------------------------------ the broker's login guard
    Setting("GEOFENCE_GUARD_HOST", "IPv4 address", "127.0.0.1", ("broker-guard",),
            "Where the login guard listens (RabbitMQ calls it for every login: keep it on loopback)."),
    Setting("GEOFENCE_GUARD_PORT", "port", "15680", ("broker-guard", "stack"),
            "The login guard's port (its /auth/user, /metrics and /health)."),
    Setting("GEOFENCE_GUARD_NODE", "Erlang node name", None, ("broker-guard",),
            "The RabbitMQ node whose users the guard reads (`rabbitmqctl -n`; unset: "
            "rabbitmqctl's default, the node of this host)."),
    Setting("GEOFENCE_GUARD_FAILED_LOGINS", "per minute", "10", ("broker-guard", "stack"),
            "Failed RabbitMQ logins (AMQP, MQTT, management) a minute one user name may have, in "
            "bursts of twice as many; beyond, its right password is refused too until the bucket "
            "refills. The platform's own users are never locked out (their failures are counted)."),
    Setting("GEOFENCE_FIREBASE_PROJECT", "Firebase project id", "demo-geofence", ("api",),
            "The Firebase project whose ID tokens the API accepts (demo-*: the Auth emulator, "
            "offline). A real project also needs GOOGLE_APPLICATION_CREDENTIALS and "
            "FIREBASE_AUTH_EMULATOR_HOST unset."),
    Setting("GEOFENCE_PROMETHEUS_URL", "http(s) URL", None, ("api",),
            "The Prometheus /ops reads its figures from. Unset: /ops/data answers 503 (no "
            "Prometheus configured). The local stack: its own (GEOFENCE_PROMETHEUS_PORT)."),
    Setting("GEOFENCE_FIREBASE_WEB_API_KEY", "text", None, ("api",),
            "The Firebase project's web API key, which the pages sign in with (not a secret: "
            "browsers get it). Unset: \"local-emulator\", for the Auth emulator."),
    Setting("GEOFENCE_MAP_ROADS", "path", None, ("api",),
            "A GeoJSON file of roads: /map's offline background (the local stack: <state dir>/"
            "web/roads.geojson, written by `geofence up`; never written for a host)."),
    Setting("GEOFENCE_MAP_TILES", "tile URL template", None, ("api", "stack"),
            "http(s)://.../{z}/{x}/{y}.png: /map's background from a tile server, where there is "
            "internet, instead of the roads. The local stack passes it on to its API."),
    # ------------------------------------------------------------ the nightly jobs (JobConfig)
    Setting("GEOFENCE_SPARK_MASTER", "Spark master URL", None, ("spark",),
            "The Spark master the jobs run on (`--master` wins). Unset: spark-submit's, else "
            "local[*]. `geofence spark cluster up` starts spark://127.0.0.1:7077."),
    Setting("GEOFENCE_JDBC_JAR", "path", "/usr/share/java/postgresql.jar", ("spark",),
            "PostgreSQL's JDBC driver (Debian's libpostgresql-jdbc-java), passed as spark.jars."),
    Setting("GEOFENCE_SPARK_PARTITIONS", "integer", "0", ("spark",),
            "Partitions of the jobs' work (`--partitions` wins); 0: twice the cores Spark has."),
    Setting("GEOFENCE_ARCHIVE_RETENTION_DAYS", "integer >= 0", "0", ("spark", "cli"),
            "How long the events archive (fence_event, one table per month) keeps a month: "
            "`geofence archive maintain` (nightly: geofence-archive-months.timer) takes out each "
            "month whose events are all older than this many days, exported first when "
            "GEOFENCE_ARCHIVE_EXPORT_DIR is set. 0: every month is kept."),
    Setting("GEOFENCE_ARCHIVE_EXPORT_DIR", "absolute path", None, ("spark", "cli"),
            "Where `geofence archive maintain` writes a month as Parquet before dropping it "
            "(<dir>/fence_event/month=YYYY-MM/part-<t>.parquet: spark.read.parquet(\"<dir>/"
            "fence_event\")). Unset: a month past the retention is dropped without an export."),
    # ------------------------------------------------------------ the local stack (deploy/settings.py)
    Setting("GEOFENCE_STATE_DIR", "absolute path", "/var/lib/geofence", ("stack",),
            "Where the local stack keeps everything: PostgreSQL's cluster, the second RabbitMQ "
            "node, secrets.json (mode 600), state.json, logs, journals, the live topology."),
    Setting("GEOFENCE_HOST", "IPv4 address", "127.0.0.1", ("stack",),
            "The address the local stack's services listen on. `geofence host render` for a "
            "second host: the first host's address."),
    Setting("GEOFENCE_AMQP_PORT", "port", "5672", ("stack",),
            "RabbitMQ's AMQP port (the second node: the next port)."),
    Setting("GEOFENCE_MQTT_PORT", "port", "1883", ("stack",), "RabbitMQ's MQTT port."),
    Setting("GEOFENCE_PUBLIC_HOST", "IPv4 address", "0.0.0.0", ("stack",),
            "The address the TLS listeners face the network on: AMQPS, MQTTS and the API's HTTPS "
            "(the plain ones stay on GEOFENCE_HOST); 127.0.0.1 keeps them on this host."),
    Setting("GEOFENCE_AMQPS_PORT", "port", "5671", ("stack",), "RabbitMQ's AMQP over TLS."),
    Setting("GEOFENCE_MQTTS_PORT", "port", "8883", ("stack",), "RabbitMQ's MQTT over TLS."),
    Setting("GEOFENCE_API_TLS_PORT", "port", "8443", ("stack",), "The API's HTTPS port."),
    Setting("GEOFENCE_TLS_DIR", "directory", None, ("stack",),
            "An operator's own certificates (`ca.pem`, `server.pem`, `server.key`) for every TLS "
            "listener; unset: a local CA and certificate made under the state dir (deploy/tls.py)."),
    Setting("GEOFENCE_MANAGEMENT_PORT", "port", "15672", ("stack",),
            "RabbitMQ's management API (the second node: the next port)."),
    Setting("GEOFENCE_PG_PORT", "port", "55432", ("stack",), "The local stack's PostgreSQL."),
    Setting("GEOFENCE_MEMCACHED_PORT", "port", "11211", ("stack",), "The local stack's memcached."),
    Setting("GEOFENCE_FIREBASE_AUTH_PORT", "port", "9099", ("stack",), "The Firebase Auth emulator."),
    Setting("GEOFENCE_PROMETHEUS_PORT", "port", "9090", ("stack",),
            "The local stack's Prometheus (Debian's), which /ops reads."),
    Setting("GEOFENCE_RABBITMQ_METRICS_PORT", "port", "15692", ("stack",),
            "RabbitMQ's rabbitmq_prometheus plugin (the second node: the next port)."),
    Setting("GEOFENCE_METRICS_PORT", "port", "9470", ("stack",),
            "x-ingress's /metrics; each next process of the local stack the next port (x-fence "
            "workers a block of 16, then the regions)."),
    Setting("GEOFENCE_PG_BINDIR", "absolute path", None, ("stack",),
            "PostgreSQL's programs. Unset: the newest /usr/lib/postgresql/*/bin."),
    Setting("GEOFENCE_START_TIMEOUT", "seconds > 0", "120", ("stack",),
            "How long `geofence up` waits for each service (every wait polls with this deadline)."),
    Setting("GEOFENCE_BROKERS", "1 | 2", "1", ("stack",),
            "RabbitMQ nodes of the local stack: 2 starts a second, independent node (not "
            "clustered) on the next ports, for regions placed on it (`geofence region`)."),
    Setting("GEOFENCE_BROKER_NODES", "1 | 3", "1", ("stack",),
            "Nodes of the local stack's RabbitMQ cluster: 3 starts two more nodes (ports 100 and "
            "200 above the first's) that join the first; quorum queues and streams get a member "
            "on each, sidecars fail over between them. `geofence up --broker-nodes N` sets it "
            "and records it in the state dir."),
    # ------------------------------------------------------------ build
    Setting("GEOFENCE_KERNEL_CFLAGS", "compiler flags", None, ("build",),
            "Extra C compiler flags for the Hilbert kernel (-march=native for a local build; the "
            "default is portable -O3). Read by hilbert_c/build_kernel.py at build time (setup.py, "
            "pip install), before the package exists."),
    # ------------------------------------------------------------ others' keys the project reads
    Setting("FIREBASE_AUTH_EMULATOR_HOST", "host:port", None, ("api",),
            "Points firebase-admin at the Firebase Auth emulator instead of Google: no signature "
            "checks, never in production (a real-project verifier refuses to run while it is "
            "set). The local stack sets it for its API; `geofence host render` never writes it."),
    Setting("GOOGLE_APPLICATION_CREDENTIALS", "path", None, ("api", "venue-sensors", "webhooks"),
            "A service account key of the Firebase project: the API's token checks in real mode "
            "(it looks users up), the sensor sidecar's and the webhooks sidecar's Cloud Messaging "
            "(unset: notifications are logged as local, nothing leaves the machine)."),
    Setting("GOOGLE_CLOUD_PROJECT", "Firebase project id", None, ("api",),
            "FirebaseVerifier.from_env's project when GEOFENCE_FIREBASE_PROJECT is unset "
            "(fence/auth.py; the API process takes GEOFENCE_FIREBASE_PROJECT only)."),
    Setting("PYSPARK_PYTHON", "path", "the driver's Python", ("spark",),
            "The Python Spark's executors run; set to the driver's interpreter (the project's "
            "virtualenv) when unset."),
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def keys_for(*roles: str) -> tuple[str, ...]:
    """The GEOFENCE_* keys (the ones `given` checks) that any of `roles` reads, in registry order."""
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise ValueError(f"unknown role(s) {', '.join(unknown)}; roles: {', '.join(ROLES)}")
    return tuple(s.name for s in SETTINGS if s.name.startswith(PREFIX) and set(s.roles) & set(roles))


# What SidecarConfig accepts (every sidecar role's keys): exchanges.topology.SIDECAR_ENV_KEYS.
SIDECAR_KEYS = keys_for(*SIDECAR_ROLES)


def declared(key: str) -> Setting:
    """The declaration of `key`; KeyError (a programming error) when it has none."""
    try:
        return BY_NAME[key]
    except KeyError:
        raise KeyError(f"{key} is not a declared setting (exchanges/settings_registry.py)") from None


def read(key: str, env: Mapping[str, str] | None = None) -> str | None:
    """The value of the declared setting `key` in `env` (default: the process's environment, as
    it is now), None when unset."""
    declared(key)
    return (os.environ if env is None else env).get(key)


def setdefault(key: str, value: str) -> str:
    """For a tool that reads the declared `key` itself: set it in the process's environment to
    `value` unless it is set; its value."""
    declared(key)
    return os.environ.setdefault(key, value)
