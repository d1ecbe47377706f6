"""A tenant's webhook endpoint: where its events go (an HTTPS URL), which of them (fences, event
kinds, objects: empty means all), how many per request, and its signing secret. Checks here are
the API's and the CLI's: a refusal says what is wrong.

The URL is a tenant's string, so it is held to what a public HTTPS callback is: https, a host
name or a public address (http and private addresses only for an endpoint the operator added
with `geofence webhook add --local`, never through the API), no credentials in it, at most
2,048 characters. Where it resolves to is checked again at every connection
(`public_address`): a name that resolves to a private, loopback or link-local address is
refused then, so a tenant cannot point the platform at its own services (RabbitMQ's management
API, PostgreSQL, the cloud's metadata address) by DNS.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from exchanges.fence_def import FENCE_ID_RE
from exchanges.ids import OBJECT_ID_RE

MAX_URL = 2048
MAX_FILTER = 100  # fences or objects an endpoint names
MAX_BATCH = 500  # events per request, when the receiver takes arrays
KINDS = ("enter", "leave", "cross", "nearby", "faraway")
ENDPOINT_ID_RE = re.compile(r"wh-[0-9a-f]{16}")
MAX_ENDPOINTS = 20  # per tenant
DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S = 10.0, 30.0
DEFAULT_RETRY_FOR_S, MAX_RETRY_FOR_S = 86_400.0, 3 * 86_400.0
FIELDS = ("url", "fences", "kinds", "objects", "batch", "description", "timeout_s", "retry_for_s")


class InvalidEndpoint(ValueError):
    pass


@dataclass(frozen=True)
class Endpoint:
    id: str
    tenant: str
    url: str
    fences: tuple[str, ...] = ()  # as the tenant names them; () = every fence
    kinds: tuple[str, ...] = ()  # () = every kind
    objects: tuple[str, ...] = ()  # () = every object
    batch: int = 1  # events per request: 1 = one event, an object; more = a JSON array
    enabled: bool = True
    disabled_reason: str | None = None
    description: str = ""
    secrets: tuple[str, ...] = field(default=(), repr=False)  # newest first; signing keys
    timeout_s: float = DEFAULT_TIMEOUT_S  # one request, connection included
    retry_for_s: float = DEFAULT_RETRY_FOR_S  # a message is given up this long after its first attempt
    local_ok: bool = False  # the operator allowed a private address (`geofence webhook add --local`)

    def wants(self, event: dict[str, Any]) -> bool:
        """An event body of the endpoint's tenant (exchanges/schemas/event.schema.json or
        proximity-event.schema.json) it asked for."""
        if event.get("tenant") != self.tenant or event.get("shared"):
            return False
        if self.kinds and event.get("event") not in self.kinds:
            return False
        fence = event.get("fence_id") if "fence_id" in event else None
        if self.fences and fence not in self.fences:
            return False
        obj = event.get("object_id", event.get("object"))
        return not self.objects or obj in self.objects

    def public(self) -> dict[str, Any]:
        """What the API shows (never the secret)."""
        return {"id": self.id, "url": self.url, "fences": list(self.fences), "kinds": list(self.kinds),
                "objects": list(self.objects), "batch": self.batch, "enabled": self.enabled,
                "disabled_reason": self.disabled_reason, "description": self.description,
                "timeout_s": self.timeout_s, "retry_for_s": self.retry_for_s, "local": self.local_ok}


def check_url(url: Any, local: bool = False) -> str:
    if not isinstance(url, str) or not url:
        raise InvalidEndpoint("url: a string, the https:// address of the receiver")
    if len(url) > MAX_URL:
        raise InvalidEndpoint(f"url: at most {MAX_URL} characters")
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise InvalidEndpoint("url: no spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidEndpoint(f"url: {exc}") from None
    if parts.scheme != "https" and not (local and parts.scheme == "http"):
        raise InvalidEndpoint("url: https:// only")
    if parts.username is not None or parts.password is not None:
        raise InvalidEndpoint("url: no user or password in it (the requests are signed instead)")
    host = parts.hostname
    if not host:
        raise InvalidEndpoint("url: a host is needed")
    if port == 0:
        raise InvalidEndpoint("url: port 0")
    if parts.fragment:
        raise InvalidEndpoint("url: no #fragment")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None and not local and not public_address(address):
        raise InvalidEndpoint(f"url: {host} is not a public address")
    return url


def public_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """An address the platform may connect to on a tenant's behalf."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    # is_global is False for private, loopback, link-local, shared (100.64/10), documentation,
    # reserved and unspecified addresses; multicast is never a receiver
    return address.is_global and not address.is_multicast


def _names(value: Any, what: str, pattern: re.Pattern[str]) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_FILTER:
        raise InvalidEndpoint(f"{what}: a list of at most {MAX_FILTER}")
    for v in value:
        if not isinstance(v, str) or not pattern.fullmatch(v):
            raise InvalidEndpoint(f"{what}: {str(v)[:80]!r} is not an id (1-64 of A-Z a-z 0-9 _ -)")
    return tuple(dict.fromkeys(value))


def from_request(body: Any, endpoint_id: str, tenant: str, secret: str, local: bool = False) -> Endpoint:
    """An endpoint from `POST /webhooks`' body: {url, fences?, kinds?, objects?, batch?,
    description?, timeout_s?, retry_for_s?}; unknown fields are refused. `local`: the operator
    allows a private address (never from the API)."""
    if not isinstance(body, dict):
        raise InvalidEndpoint("a JSON object: {url, fences?, kinds?, objects?, batch?, description?, "
                              "timeout_s?, retry_for_s?}")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise InvalidEndpoint(f"unknown field(s): {', '.join(k[:40] for k in unknown)}")
    kinds = body.get("kinds")
    if kinds is not None and (not isinstance(kinds, list) or any(k not in KINDS for k in kinds)):
        raise InvalidEndpoint(f"kinds: a list of {', '.join(KINDS)}")
    batch = body.get("batch", 1)
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise InvalidEndpoint(f"batch: events per request, 1 to {MAX_BATCH}")
    description = body.get("description", "")
    if not isinstance(description, str) or len(description) > 200 or "\x00" in description:
        raise InvalidEndpoint("description: a string of at most 200 characters")
    timeout_s = _seconds(body.get("timeout_s", DEFAULT_TIMEOUT_S), "timeout_s", 0.5, MAX_TIMEOUT_S)
    retry_for_s = _seconds(body.get("retry_for_s", DEFAULT_RETRY_FOR_S), "retry_for_s", 1.0, MAX_RETRY_FOR_S)
    return Endpoint(endpoint_id, tenant, check_url(body.get("url"), local),
                    _names(body.get("fences"), "fences", FENCE_ID_RE), tuple(dict.fromkeys(kinds or ())),
                    _names(body.get("objects"), "objects", OBJECT_ID_RE), batch, True, None, description,
                    (secret,), timeout_s, retry_for_s, local)


def _seconds(value: Any, what: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidEndpoint(f"{what}: seconds, {low:g} to {high:g}")
    return float(value)
