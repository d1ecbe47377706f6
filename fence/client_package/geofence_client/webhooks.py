"""The receiving side of the platform's webhooks (Standard Webhooks, https://www.standardwebhooks.com):
`verify` checks a request's `webhook-signature` (space-separated `v1,<base64 HMAC-SHA256>` of
`{webhook-id}.{webhook-timestamp}.{body}` under the endpoint's `whsec_` secret) and that its
timestamp is within TOLERANCE_S of now, and returns the webhook-id: a retry keeps it, so a
receiver that stored a request drops its repeat by that id. `events` parses the body."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Mapping

from geofence_client.events import Event, parse

PREFIX = "whsec_"
TOLERANCE_S = 300


class BadSignature(ValueError):
    pass


def key_of(secret: str) -> bytes:
    if not secret.startswith(PREFIX):
        raise ValueError("a webhook secret is whsec_<base64>")
    try:
        return base64.b64decode(secret[len(PREFIX):], validate=True)
    except ValueError:
        raise ValueError("a webhook secret is whsec_<base64>") from None


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def verify(secret: str, headers: Mapping[str, str], body: bytes, now: float | None = None) -> str:
    """The webhook-id of a request whose signature matches and whose timestamp is recent;
    BadSignature otherwise."""
    lowered = {k.lower(): v for k, v in headers.items()}
    msg_id, stamp, sigs = (lowered.get(h) for h in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    if not msg_id or not stamp or not sigs:
        raise BadSignature("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        ts = int(stamp)
    except ValueError:
        raise BadSignature(f"webhook-timestamp {stamp[:20]!r} is not an integer") from None
    if abs((time.time() if now is None else now) - ts) > TOLERANCE_S:
        raise BadSignature(f"webhook-timestamp {ts} is more than {TOLERANCE_S} s from now")
    want = signature(key_of(secret), msg_id, ts, body)
    if not any(hmac.compare_digest(want, s) for s in sigs.split(" ") if s.startswith("v1,")):
        raise BadSignature("no signature matches")
    return msg_id


def events(body: bytes) -> list[Event]:
    """A request's events (an endpoint of batch 1 gets one event, a batch endpoint an array)."""
    return parse(body)
