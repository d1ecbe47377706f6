"""`geofence broker-guard`: the login guard's HTTP shell (the decisions: exchanges/login_guard.py).

RabbitMQ's chain of auth backends is `[{rabbit_auth_backend_http, rabbit_auth_backend_internal}]`
(deploy/services.py): every login (AMQP, MQTT, the management API's basic auth) is
authenticated here, over POST /auth/user, and authorised by RabbitMQ's own store (permissions,
topic permissions, user limits), so the guard is asked once per connection, never per
message. It checks the password against the user's hash in RabbitMQ's store, all users read at
once by `rabbitmqctl export_definitions` (over the Erlang distribution: no login, so no call
back into the guard; reading them through the management API would need a login that RabbitMQ
sends here while its HTTP client waits on the logins that wait on that read) and kept in
memory (`UserDirectory`): read again every REFRESH_S, and for a login of a user it does not
know or with a password that does not match (which waits for a read started after it came,
reads starting at most every RETRY_S). So a new device logs in at once (within a read), and
a changed password takes effect within REFRESH_S for its old one.

Answers: `allow <tags>` (the user's tags, as the store has them) or `deny`; RabbitMQ refuses a
login on anything else, a timeout included (fails closed). GET /metrics (loopback): logins by
result, failures, lock-outs, lookups.

Trade-off: the guard is on every login's path: when it is down nobody logs in (connections
already open stay). It is small, restarted by its supervisor (systemd's Restart=, `geofence up`
here), and answers from memory after the first lookup of a user.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import orjson
import uvicorn

from exchanges import topology as t
from exchanges.login_guard import Decision, LoginGuard, rabbit_hash_ok
from exchanges.settings import given, positive
from exchanges.settings_registry import keys_for
from exchanges.token_buckets import Limit

log = logging.getLogger("geofence.broker-guard")

ROLE = "broker-guard"
BODY_MAX = 8 * 1024  # a login's form: user name, password, vhost, client id
REFRESH_S = 30.0  # every user read again this often
RETRY_S = 1.0  # reads for unknown users or wrong passwords start at most this often
READ_TIMEOUT_S = 60.0
PLATFORM_USERS = frozenset({t.ADMIN_USER, t.INGRESS_USER, t.GEO_USER, t.FENCE_USER, t.MANAGER_USER,
                            t.ARCHIVER_USER, t.VENUES_USER, t.FEDERATION_USER})

Asgi = Callable[[Mapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
                Awaitable[None]]


@dataclass(frozen=True)
class GuardConfig:
    host: str = "127.0.0.1"
    port: int = 15680
    node: str | None = None  # rabbitmqctl -n (None: its default, this host's node)
    failed_logins: float = 10.0  # a minute per user name, in bursts of twice as many

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> GuardConfig:
        given(env, keys_for(ROLE))
        kw: dict[str, Any] = {}
        if env.get("GEOFENCE_GUARD_HOST"):
            kw["host"] = env["GEOFENCE_GUARD_HOST"]
        if env.get("GEOFENCE_GUARD_PORT"):
            kw["port"] = positive("GEOFENCE_GUARD_PORT", env["GEOFENCE_GUARD_PORT"], int)
        if env.get("GEOFENCE_GUARD_NODE"):
            kw["node"] = env["GEOFENCE_GUARD_NODE"]
        if env.get("GEOFENCE_GUARD_FAILED_LOGINS"):
            key = "GEOFENCE_GUARD_FAILED_LOGINS"
            kw["failed_logins"] = positive(key, env[key], float)
        return cls(**kw)

    def limit(self) -> Limit:
        return Limit(self.failed_logins / 60, 2 * self.failed_logins)


@dataclass(frozen=True)
class StoredUser:
    password_hash: str
    algorithm: str
    tags: tuple[str, ...]


def users_of(definitions: Mapping[str, Any]) -> dict[str, StoredUser]:
    """The users of a RabbitMQ definitions document (export_definitions' JSON)."""
    found = {}
    for u in definitions.get("users") or []:
        raw = u.get("tags") or []
        tags = tuple(x for x in raw.split(",") if x) if isinstance(raw, str) else tuple(map(str, raw))
        found[str(u["name"])] = StoredUser(str(u.get("password_hash", "")),
                                           str(u.get("hashing_algorithm", "")), tags)
    return found


class UserDirectory:
    """Every user of RabbitMQ's store, read whole by `read`, one read at a time."""

    def __init__(self, read: Callable[[], Awaitable[dict[str, StoredUser]]],
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.read, self.clock, self.sleep = read, clock, sleep
        self.users: dict[str, StoredUser] = {}
        self.read_started = -math.inf
        self.started = 0  # reads started
        self.reads = 0  # reads done
        self._lock = asyncio.Lock()

    async def fresh(self, seen: int) -> None:
        """Make sure the users were read by a read started after `seen` reads had started
        (the caller's arrival): none is started less than RETRY_S after the one before, and
        logins waiting meanwhile share the next, so a stream of unknown names costs at most
        one read every RETRY_S."""
        async with self._lock:
            if self.started > seen:
                return
            wait = self.read_started + RETRY_S - self.clock()
            if wait > 0:
                await self.sleep(wait)
            self.read_started = self.clock()
            self.started += 1
            try:
                self.users = await self.read()
                self.reads += 1
            except Exception as exc:  # the broker down or starting: known users still log in
                log.warning("cannot read RabbitMQ's users: %s", exc)

    async def get(self, name: str, stale: bool = False) -> StoredUser | None:
        """The user; read again first when it is unknown (a user made before the login came is
        known), or `stale` (its password did not match) and the last read is RETRY_S old: a
        password changed since is seen, and a guessing client is not slowed to a read a try
        (its tries must reach the lock-out)."""
        if name not in self.users or (stale and self.clock() - self.read_started >= RETRY_S):
            await self.fresh(self.started)
        return self.users.get(name)

    async def keep_fresh(self) -> None:
        """Every user read again every REFRESH_S (deleted users, changed passwords), in the
        background: no login waits for it unless it needs it."""
        while True:
            await self.fresh(self.started)
            await asyncio.sleep(REFRESH_S)


def rabbitmqctl_reader(node: str | None) -> Callable[[], Awaitable[dict[str, StoredUser]]]:
    argv = ["rabbitmqctl", *(["-n", node] if node else []), "-q", "export_definitions", "-",
            "--format", "json"]

    async def read() -> dict[str, StoredUser]:
        pipe = asyncio.subprocess.PIPE
        proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, stdout=pipe,
                                                    stderr=pipe)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), READ_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError(f"rabbitmqctl export_definitions took over {READ_TIMEOUT_S:g}s") from None
        if proc.returncode != 0:
            why = (err.decode(errors="replace").strip().splitlines() or [""])[0][:300]
            raise RuntimeError(f"rabbitmqctl export_definitions failed ({proc.returncode}): {why}")
        return await asyncio.to_thread(lambda: users_of(orjson.loads(out)))

    return read


class Guard:
    """The decisions (LoginGuard) with the store's hashes (UserCache) and the counts."""

    def __init__(self, config: GuardConfig, users: UserDirectory) -> None:
        self.config, self.users = config, users
        self.decide = LoginGuard(config.limit(), PLATFORM_USERS)
        self.counts: Counter[str] = Counter()

    async def login(self, form: Mapping[str, str], now: float) -> str:
        username, password = form.get("username", ""), form.get("password")
        client_id = form.get("client_id")  # MQTT password logins only
        user = await self.users.get(username)
        ok: bool | None = None if user is None else password is not None and rabbit_hash_ok(
            password, user.password_hash, user.algorithm)
        if ok is False and password is not None:  # its password changed since the last read?
            user = await self.users.get(username, stale=True)
            ok = None if user is None else rabbit_hash_ok(password, user.password_hash, user.algorithm)
        decision = self.decide.login(username, ok, client_id, now)
        self._count(username, client_id, decision)
        return "allow " + " ".join(user.tags) if decision.allow and user is not None else "deny"

    def _count(self, username: str, client_id: str | None, d: Decision) -> None:
        kind = "mqtt" if client_id is not None else "amqp"
        if d.allow:
            self.counts[f"allowed_{kind}"] += 1
            return
        self.counts["failures" if d.failed else "refused"] += 1
        if d.locked:
            self.counts["lockouts"] += 1
        if d.locked or (not d.failed):
            log.warning("login of %r refused: %s", username[:100], d.reason)

    def metrics(self) -> bytes:
        c = self.counts
        name = "geofence_broker_logins_total"
        lines = [f"# TYPE {name} counter",
                 *(f'{name}{{result="allowed",protocol="{k}"}} {c["allowed_" + k]}'
                   for k in ("amqp", "mqtt")),
                 f'{name}{{result="wrong_password",protocol="any"}} {c["failures"]}',
                 f'{name}{{result="refused",protocol="any"}} {c["refused"]}',
                  "# TYPE geofence_broker_lockouts_total counter",
                  f"geofence_broker_lockouts_total {c['lockouts']}",
                  "# TYPE geofence_broker_user_reads_total counter",
                  f"geofence_broker_user_reads_total {self.users.reads}"]
        return ("\n".join(lines) + "\n").encode()


def app(guard: Guard, clock: Callable[[], float] = time.monotonic) -> Asgi:
    """The ASGI application: POST /auth/user, GET /metrics, GET /health; nothing else."""

    async def respond(send: Callable[[Any], Awaitable[None]], status: int, body: bytes,
                      kind: bytes = b"text/plain") -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def handle(scope: Mapping[str, Any], receive: Callable[[], Awaitable[Any]],
                     send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path == "/metrics":
            return await respond(send, 200, guard.metrics(), b"text/plain; version=0.0.4")
        if method == "GET" and path == "/health":
            return await respond(send, 200, b"ok")
        if path != "/auth/user":
            return await respond(send, 404, b"deny")
        if method != "POST":
            return await respond(send, 405, b"deny")
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > BODY_MAX:
                return await respond(send, 413, b"deny")
            if not message.get("more_body"):
                break
        try:
            form = dict(parse_qsl(body.decode(), keep_blank_values=True, max_num_fields=16))
        except (UnicodeDecodeError, ValueError):
            return await respond(send, 400, b"deny")
        await respond(send, 200, (await guard.login(form, clock())).encode())

    return handle


async def serve(config: GuardConfig) -> None:
    directory = UserDirectory(rabbitmqctl_reader(config.node))
    guard = Guard(config, directory)
    server = uvicorn.Server(uvicorn.Config(app(guard), host=config.host, port=config.port,
                                           log_level="warning", access_log=False, lifespan="on",
                                           timeout_keep_alive=30))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
    log.info("broker login guard on http://%s:%d/auth/user (users of %s, %g failed logins a minute per "
             "user name)", config.host, config.port, config.node or "this host's node", config.failed_logins)
    async with asyncio.TaskGroup() as tg:
        refresher = tg.create_task(directory.keep_fresh())
        await server.serve()
        refresher.cancel()


def main(env: Mapping[str, str]) -> int:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {ROLE} %(levelname)s %(message)s")
    asyncio.run(serve(GuardConfig.from_env(env)))
    return 0
