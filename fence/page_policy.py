"""What every answer of the API tells a browser it may do with it: a strict Content-Security-
Policy and the headers beside it (issue 37).

The pages (fence/pages.py) build every string a user chose (fence, object, hive and tenant
names, event reasons) into the DOM as text (textContent, never innerHTML: fence/web/static);
this policy is the second wall, for the day a page forgets: no inline script, no eval, no
inline style attribute, no plugin, nothing framed, scripts and styles from this origin only
(the npm libraries are served from here: /vendor), connections to this origin (the API and
the map's websocket) and to the sign-in service alone (the Auth emulator's origin on the
local stack, Google's identity services otherwise), images from here and from the tile
server when one is configured. The same headers go on the JSON answers: a browser led to one
renders nothing of it (nosniff) and no other site frames any page (frame-ancestors,
X-Frame-Options for older browsers).

Trade-off: the policy is one per server, not one per page, so every page is held to what the
most demanding one needs (the map's tiles and websocket); a page needing something else must
change it here, where a reviewer sees it.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

GOOGLE_SIGN_IN = ("https://identitytoolkit.googleapis.com", "https://securetoken.googleapis.com")


def origin_of(url: str | None) -> str | None:
    """scheme://host[:port] of a URL or URL template ({z}/{x}/{y} in its path), None if none."""
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or "{" in parts.netloc:
        raise ValueError(f"not an http(s) URL with a fixed host: {url!r}")
    return f"{parts.scheme}://{parts.netloc}"


def content_security_policy(sign_in: Iterable[str], images: Iterable[str] = ()) -> str:
    """The policy: `sign_in` the origins a page signs in with (Firebase Auth's REST API),
    `images` the origins of map tiles."""
    directives = {
        "default-src": ["'none'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:", *images],
        "font-src": ["'self'"],
        "connect-src": ["'self'", *sign_in],
        "manifest-src": ["'self'"],
        "frame-ancestors": ["'none'"],
        "form-action": ["'self'"],
        "base-uri": ["'none'"],
        "object-src": ["'none'"],
    }
    return "; ".join(f"{k} {' '.join(dict.fromkeys(v))}" for k, v in directives.items())


def security_headers(csp: str, https: bool = False) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-security-policy", csp.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", b"DENY"),
        (b"referrer-policy", b"no-referrer"),
        (b"cross-origin-opener-policy", b"same-origin"),
        (b"permissions-policy", b"camera=(), microphone=(), geolocation=(), payment=(), usb=()"),
    ]
    if https:  # a browser that once came over TLS never again tries plain HTTP (a year)
        headers.append((b"strict-transport-security", b"max-age=31536000"))
    return headers


class SecurityHeaders:
    """ASGI middleware: the headers above on every HTTP answer (pages, files, JSON, errors),
    replacing any of the same name the app set."""

    def __init__(self, app: ASGIApp, headers: list[tuple[bytes, bytes]]) -> None:
        self.app, self.headers = app, headers
        self.names = {k for k, _ in headers}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in self.names]
                message = {**message, "headers": kept + self.headers}
            await send(message)

        await self.app(scope, receive, with_headers)
