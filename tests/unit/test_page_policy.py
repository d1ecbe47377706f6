"""fence/page_policy.py: the policy and headers every answer of the API carries (the pages
added by fence/pages.py); the browser side (a page runs under it with no violation, markup in
names stays text) is in tests/integration/test_map.py and tests/security/test_page_attacks.py."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from fence.page_policy import GOOGLE_SIGN_IN, content_security_policy, origin_of
from fence.pages import MapFiles, add_pages


def directives(csp: str) -> dict[str, list[str]]:
    out = {}
    for part in csp.split(";"):
        name, *values = part.split()
        out[name] = values
    return out


def client(emulator: str | None, tiles: str | None = None) -> TestClient:
    app = FastAPI()

    @app.get("/data")
    async def data() -> dict[str, str]:
        return {"a": "b"}

    add_pages(app, {"project": "p", "api_key": "k", "emulator": emulator}, MapFiles(None, tiles))
    return TestClient(app)


@pytest.mark.parametrize("path", ["/map", "/ops", "/venues/x", "/static/map.js", "/pages/config", "/data",
                                  "/nothing-here"])
def test_every_answer_carries_the_policy(path: str) -> None:
    r = client("http://127.0.0.1:9099").get(path)
    assert r.status_code in (200, 404)
    d = directives(r.headers["content-security-policy"])
    assert d["default-src"] == ["'none'"] and d["script-src"] == ["'self'"] and d["style-src"] == ["'self'"]
    assert d["connect-src"] == ["'self'", "http://127.0.0.1:9099"]
    assert d["frame-ancestors"] == d["object-src"] == d["base-uri"] == ["'none'"]
    assert d["img-src"] == ["'self'", "data:"]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert "strict-transport-security" not in r.headers  # plain HTTP: a browser would ignore it


def test_no_inline_script_or_eval_is_ever_allowed() -> None:
    csp = client(None, "https://tiles.example.org/{z}/{x}/{y}.png").get("/map").headers["content-security-policy"]
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp and "*" not in csp
    d = directives(csp)
    assert d["connect-src"] == ["'self'", *GOOGLE_SIGN_IN]  # production: Google's sign-in
    assert d["img-src"] == ["'self'", "data:", "https://tiles.example.org"]


def test_a_tile_template_gives_its_origin_and_a_bad_one_is_refused() -> None:
    assert origin_of("https://a.tile.example:8443/{z}/{x}/{y}.png") == "https://a.tile.example:8443"
    assert origin_of(None) is None
    for bad in ("javascript:alert(1)", "https://{s}.tile.example/{z}/{x}/{y}.png", "//x/{z}", "data:x"):
        with pytest.raises(ValueError, match="fixed host"):
            origin_of(bad)


def test_the_policy_names_each_origin_once() -> None:
    d = directives(content_security_policy(["http://a", "http://a"], ["http://t", "http://t"]))
    assert d["connect-src"] == ["'self'", "http://a"] and d["img-src"] == ["'self'", "data:", "http://t"]
