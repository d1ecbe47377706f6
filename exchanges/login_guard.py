"""The broker's login guard, its decisions (issue 37): who may log in to RabbitMQ beyond what
RabbitMQ's own user store says. Pure; its HTTP shell answers rabbitmq_auth_backend_http.

RabbitMQ 3.10 keeps MQTT client ids in one registry keyed by the id alone, across vhosts: any
user who can log in anywhere may take another's client id, and the broker disconnects the
other (the MQTT spec's "session takeover"). It neither throttles failed logins. The guard
authenticates every login in the broker's chain of auth backends (deploy/services.py:
`[{rabbit_auth_backend_http, rabbit_auth_backend_internal}]`, authorisation left to RabbitMQ's
own store), so it sees every login, right or wrong, once per connection. It checks the
password itself against the user's hash in RabbitMQ's store (`rabbit_hash_ok`; the hash read
through the management API and cached by the shell, exchanges/broker_guard.py).

A login is refused when:
- the password is wrong, or the user unknown: counted against the user name;
- the user name has had too many failures lately (`failures`, a token bucket per name): the
  right password is refused too until it refills (a guessing client gets a few tries a
  minute). The platform's own users (the sidecars', the administrator) are never locked out
  (their failures are counted and alerted): a stranger guessing their names must not stop the
  pipeline;
- over MQTT, its client id is neither the user name nor `<user name>:<suffix>` (a gateway
  opening several connections): no user can take another's id, as user names hold no ':'.

Trade-off: a lock-out is per user name, so an attacker can keep a device out by guessing its
name's password (a denial of service the lock-out's short refill bounds: a few tries a
minute come back); the platform's users are exempt for that reason.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass

from exchanges.token_buckets import Buckets, Limit

HASHES = {"rabbit_password_hashing_sha256": hashlib.sha256, "rabbit_password_hashing_sha512": hashlib.sha512,
          "rabbit_password_hashing_md5": hashlib.md5}
CLIENT_ID_SEP = ":"


def rabbit_hash_ok(password: str, password_hash: str, algorithm: str) -> bool:
    """Whether `password` is the one of a RabbitMQ user whose store holds `password_hash`
    (base64 of a 4-byte salt and the digest of salt + UTF-8 password) made by `algorithm`."""
    digest = HASHES.get(algorithm)
    if digest is None or not password_hash:
        return False
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        return False
    salt, stored = raw[:4], raw[4:]
    if len(salt) != 4 or not stored:
        return False
    return hmac.compare_digest(digest(salt + password.encode()).digest(), stored)


def rabbit_hash(password: str, salt: bytes, algorithm: str = "rabbit_password_hashing_sha256") -> str:
    """The hash RabbitMQ's store would hold for `password` with this 4-byte salt (tests, and
    the guard's own check of its reading)."""
    if len(salt) != 4:
        raise ValueError("RabbitMQ's salt is 4 bytes")
    return base64.b64encode(salt + HASHES[algorithm](salt + password.encode()).digest()).decode()


def client_id_for(username: str, suffix: str) -> str:
    """An MQTT client id the guard lets `username` use beside its own name (several
    connections of one user: a gateway's, a tool's)."""
    return f"{username}{CLIENT_ID_SEP}{suffix}"


def client_id_allowed(username: str, client_id: str) -> bool:
    return client_id == username or (client_id.startswith(username + CLIENT_ID_SEP)
                                     and len(client_id) > len(username) + 1)


@dataclass(frozen=True)
class Decision:
    allow: bool
    reason: str = ""  # why refused: in the broker's log (RabbitMQ logs the backend's refusal)
    failed: bool = False  # a wrong password or an unknown user (counted)
    locked: bool = False  # this failure used the name's last try: locked from now (said once)


ALLOW = Decision(True)


class LoginGuard:
    def __init__(self, failures: Limit, platform_users: frozenset[str], max_keys: int = 100_000) -> None:
        self.failures = Buckets(failures, max_keys)
        self.platform_users = platform_users

    def login(self, username: str, password_ok: bool | None, client_id: str | None, now: float) -> Decision:
        """A login of `username` (`password_ok`: the password checked against the store; None:
        no such user), over MQTT with `client_id` (None: AMQP)."""
        exempt = username in self.platform_users
        if not password_ok:
            wait = self.failures.take(username, now)
            locked = wait == 0.0 and self.failures.wait(username, now) > 0 and not exempt
            why = "no such user" if password_ok is None else "wrong password"
            return Decision(False, why, failed=True, locked=locked)
        if not exempt:
            wait = self.failures.wait(username, now)
            if wait:
                return Decision(False, f"too many failed logins: locked for {wait:.0f} s more")
        if client_id is not None and not client_id_allowed(username, client_id):
            return Decision(False, f"MQTT client id {client_id[:80]!r} is not the user's: "
                                   f"use {username!r} or {username + CLIENT_ID_SEP}<suffix>")
        return ALLOW

    def client_id_ok(self, username: str, client_id: str | None) -> Decision:
        """The vhost check (it carries the client id again): the same rule."""
        if client_id is not None and not client_id_allowed(username, client_id):
            return Decision(False, f"MQTT client id {client_id[:80]!r} is not the user's")
        return ALLOW
