"""Standard Webhooks signatures (https://www.standardwebhooks.com, "Signature scheme"): every
request carries `webhook-id` (the message's id: the same on every retry of it, so a receiver
drops a redelivery by it), `webhook-timestamp` (integer seconds since the epoch, when this
attempt was signed) and `webhook-signature`, space-separated `v1,<base64 HMAC-SHA256>` of
`{id}.{timestamp}.{body}` under the endpoint's secret, `whsec_<base64 of 24-64 random bytes>`.

A secret being rotated signs with both, the new one first, so a receiver that knows either
verifies. `verify` is the receiver's side, for the tests and for anyone who wants a reference.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PREFIX = "whsec_"
TOLERANCE_S = 300  # a receiver refuses a timestamp further than this from its clock


class BadSignature(ValueError):
    pass


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def key_of(secret: str) -> bytes:
    """The HMAC key of a `whsec_` secret; ValueError for anything else."""
    if not secret.startswith(PREFIX):
        raise ValueError("a webhook secret is whsec_<base64>")
    try:
        key = base64.b64decode(secret[len(PREFIX):], validate=True)
    except ValueError:
        raise ValueError("a webhook secret is whsec_<base64>") from None
    if not 24 <= len(key) <= 64:
        raise ValueError("a webhook secret's key is 24 to 64 bytes")
    return key


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def headers(keys: list[bytes], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of one attempt, signed with every key given (the newest first)."""
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": " ".join(signature(k, msg_id, timestamp, body) for k in keys)}


def verify(secret: str, got: dict[str, str], body: bytes, now: float) -> str:
    """The receiver's check: the message id if a signature matches and the timestamp is
    within TOLERANCE_S of `now`; BadSignature otherwise."""
    lowered = {k.lower(): v for k, v in got.items()}
    msg_id, stamp, sigs = (lowered.get(h) for h in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    if not msg_id or not stamp or not sigs:
        raise BadSignature("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        ts = int(stamp)
    except ValueError:
        raise BadSignature(f"webhook-timestamp {stamp[:20]!r} is not an integer") from None
    if abs(now - ts) > TOLERANCE_S:
        raise BadSignature(f"webhook-timestamp {ts} is more than {TOLERANCE_S} s from now")
    want = signature(key_of(secret), msg_id, ts, body)
    if not any(hmac.compare_digest(want, s) for s in sigs.split(" ") if s.startswith("v1,")):
        raise BadSignature("no signature matches")
    return msg_id
