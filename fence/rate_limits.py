"""The API's rate limits: how many requests an address and a token may make, and how many
failed sign-ins an address may have, before it is answered 429 with Retry-After (issue 37).

Three token buckets, each keyed by who asks:
- per client address: every request and websocket (a client hammering the API);
- per bearer token (a digest of it, never the token): every request carrying one (one
  account's scripts, from however many addresses);
- per client address, failed sign-ins (401s): a guessing or spraying client is slowed to
  a few tries a minute, without touching anyone else (the check comes before the token is
  verified, so a throttled client costs no verification either).
A bucket holds `burst` and refills at `rate` a second; a request takes one, a 401 takes one of
the failures bucket. Pure: plain data and the caller's clock in, decisions out; the ASGI shell
is fence/api_edges.py's RateLimit.

Memory is bounded: each kind keeps at most `max_keys` buckets, the least recently used going
first. A full bucket is the same as no bucket, so forgetting one never loosens a limit by more
than one burst; an attacker with more addresses than `max_keys` wins at most that.

Trade-off: one process's counts. Several API processes behind a balancer each count their own
share (a client gets up to N times the limit over N processes); a shared store (memcached's
incr) would count exactly at a round trip per request, which the limits are meant to save.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from exchanges.token_buckets import Buckets, Limit


@dataclass(frozen=True)
class Verdict:
    retry_after: float  # 0: go on
    why: str = ""  # which limit, for the 429's message and the metric

    @property
    def allowed(self) -> bool:
        return self.retry_after == 0


ALLOWED = Verdict(0.0)


class RateLimits:
    def __init__(self, per_address: Limit, per_token: Limit, failures: Limit,
                 max_keys: int = 100_000) -> None:
        self.addresses = Buckets(per_address, max_keys)
        self.tokens = Buckets(per_token, max_keys)
        self.failures = Buckets(failures, max_keys)

    def check(self, address: str, token: str | None, now: float) -> Verdict:
        """Before a request: may `address` (with `token`, if it sent one) go on?"""
        wait = self.failures.wait(address, now)
        if wait:
            return Verdict(wait, "failed sign-ins from your address")
        wait = self.addresses.take(address, now)
        if wait:
            return Verdict(wait, "requests from your address")
        if token:
            wait = self.tokens.take(token_key(token), now)
            if wait:
                return Verdict(wait, "requests with your token")
        return ALLOWED

    def failed(self, address: str, now: float) -> bool:
        """After a request: it was refused for its credentials (a 401). True when this failure
        used the address's last one (it is throttled from now: the moment to say so, once)."""
        return self.failures.take(address, now) == 0.0 and self.failures.wait(address, now) > 0


def token_key(token: str) -> str:
    """What a bucket is keyed by: a digest (the token is a credential and stays out of memory
    dumps and logs)."""
    return hashlib.blake2b(token.encode(errors="replace"), digest_size=16).hexdigest()


def retry_after_header(seconds: float) -> str:
    """Retry-After in whole seconds, at least 1 (RFC 9110: a non-negative integer)."""
    return str(max(1, math.ceil(seconds)))
