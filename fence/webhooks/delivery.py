"""One signed POST to a tenant's endpoint, bounded in time and in what it reads back.

The URL is a tenant's string, so where it leads is checked at every request, not only when the
endpoint was added: its name is resolved here, every address it resolves to must be public
(endpoints.public_address; a name with one private address among public ones is refused), and
the request goes to the address that was checked, with the name as Host and as TLS server name
(so a DNS answer that changes between the check and the connection cannot point the platform at
its own network). An endpoint the operator allowed on a private network (`local`) skips the check.

No redirects are followed (a 3xx is a failure); of the answer only the status counts: up to
64 KiB of its body is read and dropped (so its connection is kept for the next request), a longer
one is cut (its connection closed), so a receiver cannot make the platform hold a large body; the
whole request, the connection included, is bounded by the endpoint's timeout.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

from fence.webhooks import signing
from fence.webhooks.endpoints import Endpoint, public_address

RESOLVED_FOR_S = 30.0  # a name's checked addresses are reused this long
USER_AGENT = "geofence-webhooks/1"
MAX_ANSWER_BYTES = 65_536  # of an answer's body read (and dropped) to keep its connection


class Refused(Exception):
    """The endpoint's address may not be connected to (the reason is the failure's)."""


@dataclass(frozen=True)
class Attempt:
    status: int | None  # None: no answer (refused, unreachable, timed out)
    error: str  # "" for a 2xx
    seconds: float


class Poster:
    """The HTTP clients of the endpoints: one per endpoint (its own connections, at most one per
    lane), so an endpoint's slow or dead receiver holds no connection another one needs, and a
    connection made to an address for one endpoint's name is never reused for another's."""

    def __init__(self, connections: int) -> None:
        self.connections = connections
        self.clients: dict[str, httpx.AsyncClient] = {}
        self._resolved: dict[tuple[str, int], tuple[float, str]] = {}

    def _client(self, endpoint_id: str) -> httpx.AsyncClient:
        client = self.clients.get(endpoint_id)
        if client is None:
            client = self.clients[endpoint_id] = httpx.AsyncClient(
                follow_redirects=False, trust_env=False,
                limits=httpx.Limits(max_connections=self.connections,
                                    max_keepalive_connections=self.connections))
        return client

    async def forget(self, endpoint_id: str) -> None:
        client = self.clients.pop(endpoint_id, None)
        if client is not None:
            await client.aclose()

    async def close(self) -> None:
        for endpoint_id in list(self.clients):
            await self.forget(endpoint_id)

    async def address(self, host: str, port: int, local: bool) -> str:
        """The address to connect to for `host`, checked; Refused if none may be used."""
        try:
            literal = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            if not local and not public_address(literal):
                raise Refused(f"{host} is not a public address")
            return host
        now = time.monotonic()
        hit = self._resolved.get((host, port))
        if hit is not None and hit[0] > now:
            return hit[1]
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise Refused(f"{host} does not resolve ({exc.strerror or exc})") from None
        addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
        if not addresses:
            raise Refused(f"{host} does not resolve")
        if not local:
            private = [a for a in addresses if not public_address(a)]
            if private:
                raise Refused(f"{host} resolves to {private[0]}, not a public address")
        chosen = str(addresses[0])
        self._resolved[(host, port)] = (now + RESOLVED_FOR_S, chosen)
        if len(self._resolved) > 10_000:
            self._resolved.clear()
        return chosen

    async def post(self, ep: Endpoint, msg_id: str, body: bytes, keys: list[bytes]) -> Attempt:
        started = time.monotonic()
        try:
            async with asyncio.timeout(ep.timeout_s):
                status = await self._post(ep, msg_id, body, keys)
        except Refused as exc:
            return Attempt(None, f"refused: {exc}", time.monotonic() - started)
        except TimeoutError:
            return Attempt(None, f"no answer within {ep.timeout_s:g} s", time.monotonic() - started)
        except httpx.HTTPError as exc:
            return Attempt(None, f"no answer: {type(exc).__name__}: {str(exc)[:200]}",
                           time.monotonic() - started)
        except OSError as exc:
            return Attempt(None, f"no answer: {exc}"[:300], time.monotonic() - started)
        took = time.monotonic() - started
        return Attempt(status, "" if 200 <= status < 300 else f"HTTP {status}", took)

    async def _post(self, ep: Endpoint, msg_id: str, body: bytes, keys: list[bytes]) -> int:
        parts = urlsplit(ep.url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = await self.address(host, port, ep.local_ok)
        shown = f"[{address}]" if ":" in address else address
        target = urlunsplit((parts.scheme, f"{shown}:{port}", parts.path or "/", parts.query, ""))
        headers = {"content-type": "application/json", "user-agent": USER_AGENT,
                   "host": parts.netloc.rsplit("@", 1)[-1],
                   **signing.headers(keys, msg_id, int(time.time()), body)}
        extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
        client = self._client(ep.id)
        request = client.build_request("POST", target, content=body, headers=headers,
                                       extensions=extensions, timeout=ep.timeout_s)
        response = await client.send(request, stream=True)
        try:  # the status is all we want; a short body is read so the connection is kept for the next
            seen = 0
            async for chunk in response.aiter_raw():
                seen += len(chunk)
                if seen > MAX_ANSWER_BYTES:
                    break  # not read further: the connection is closed instead of kept
        finally:
            await response.aclose()
        return response.status_code
