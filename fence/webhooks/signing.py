"""Standard Webhooks signatures (https://www.standardwebhooks.com, "Signature scheme"): every
request carries `webhook-id` (the message's id: the same on every retry of it, so a receiver
drops a redelivery by it), `webhook-timestamp` (integer seconds since the epoch, when this
attempt was signed) and `webhook-signature`, space-separated `v1,<base64 HMAC-SHA256>` of
`{id}.{timestamp}.{body}` under the endpoint's secret, `whsec_<base64 of 24-64 random bytes>`.

A secret being rotated signs with both, the new one first, so a receiver that knows either
verifies. The receiver's side is the client package's (geofence_client/webhooks.py `verify`):
written apart from this one, so the tests and bench/webhooks.py check each against the other.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

PREFIX = "whsec_"


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
