"""fence/rate_limits.py (the buckets, exactly, on a fake clock) and its shell, fence/api.py's
RateLimit middleware, on a small app: 429 with Retry-After per address, per token and after
failed sign-ins, nobody else touched; the counts."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Header, HTTPException
from fastapi.testclient import TestClient

from exchanges.shell import Counters
from exchanges.token_buckets import Buckets, Limit
from fence.api_edges import RateLimit
from fence.rate_limits import RateLimits, retry_after_header, token_key


def test_a_bucket_gives_its_burst_then_its_rate() -> None:
    b = Buckets(Limit(rate=2.0, burst=3))
    assert [b.take("a", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take("a", 0.0) == pytest.approx(0.5)  # empty: one more in 1/rate
    assert b.take("a", 0.25) == pytest.approx(0.25)  # a refused try takes nothing
    assert b.take("a", 0.5) == 0.0
    assert b.take("a", 0.5) == pytest.approx(0.5)
    assert b.take("a", 100.0) == 0.0  # refilled, to the burst and no more
    assert [b.take("a", 100.0) for _ in range(3)] == [0.0, 0.0, pytest.approx(0.5)]


def test_keys_are_independent_and_bounded_in_number() -> None:
    b = Buckets(Limit(1.0, 1), max_keys=3)
    assert b.take("a", 0.0) == 0.0 and b.take("a", 0.0) > 0
    assert b.take("b", 0.0) == 0.0  # another key: its own bucket
    for k in ("c", "d", "e"):
        b.take(k, 0.0)
    assert len(b) == 3  # the least recently used forgotten: "a" is full again
    assert b.take("a", 0.0) == 0.0


def test_wait_takes_nothing() -> None:
    b = Buckets(Limit(1.0, 2))
    assert b.wait("a", 0.0) == 0.0 and b.take("a", 0.0) == 0.0 and b.take("a", 0.0) == 0.0
    assert b.wait("a", 0.0) == pytest.approx(1.0) and b.wait("a", 0.0) == pytest.approx(1.0)


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (1, 0.5), (float("inf"), 1), (1, float("nan"))])
def test_a_limit_must_be_usable(rate: float, burst: float) -> None:
    with pytest.raises(ValueError, match="rate > 0"):
        Limit(rate, burst)


def limits() -> RateLimits:
    return RateLimits(per_address=Limit(10, 5), per_token=Limit(10, 3), failures=Limit(0.1, 2))


def test_an_address_a_token_and_failed_sign_ins_each_have_their_limit() -> None:
    rl = limits()
    assert all(rl.check("1.1.1.1", None, 0.0).allowed for _ in range(5))
    v = rl.check("1.1.1.1", None, 0.0)
    assert not v.allowed and v.why == "requests from your address" and v.retry_after == pytest.approx(0.1)
    assert rl.check("2.2.2.2", None, 0.0).allowed  # another address
    # one token from many addresses
    assert all(rl.check(f"10.0.0.{i}", "tok", 0.0).allowed for i in range(3))
    v = rl.check("10.0.0.9", "tok", 0.0)
    assert not v.allowed and v.why == "requests with your token"
    # failed sign-ins: after the burst, the address waits whatever it sends, others do not
    assert rl.failed("3.3.3.3", 0.0) is False
    assert rl.failed("3.3.3.3", 0.0) is True  # the last one: throttled from now, said once
    assert rl.failed("3.3.3.3", 0.0) is False
    v = rl.check("3.3.3.3", "another-token", 0.0)
    assert not v.allowed and v.why == "failed sign-ins from your address"
    assert v.retry_after == pytest.approx(10)
    assert rl.check("3.3.3.3", None, 10.0).allowed
    assert rl.check("4.4.4.4", None, 0.0).allowed


def test_the_token_is_kept_as_a_digest_and_retry_after_is_whole_seconds() -> None:
    assert token_key("secret") != "secret" and len(token_key("secret")) == 32
    assert token_key("a") == token_key("a") != token_key("b")
    assert [retry_after_header(s) for s in (0.0, 0.01, 1.0, 1.2, 59.9)] == ["1", "1", "1", "2", "60"]


# --------------------------------------------------------------------------- the middleware


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def app_with(rl: RateLimits, counters: Counters, clock: Clock) -> FastAPI:
    app = FastAPI()

    @app.get("/x")
    async def x(authorization: str | None = Header(default=None)) -> dict[str, bool]:
        if authorization == "Bearer bad":
            raise HTTPException(401, "bad token")
        return {"ok": True}

    app.add_middleware(RateLimit, limits=rl, counters=counters, clock=clock)
    return app


def test_over_the_limit_a_429_with_retry_after_and_a_reason() -> None:
    counters, clock = Counters(), Clock()
    client = TestClient(app_with(limits(), counters, clock))
    assert [client.get("/x").status_code for _ in range(5)] == [200] * 5
    r = client.get("/x")
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert r.json()["error"] == "too many requests from your address: try again in 1 s"
    clock.now = 1.0
    assert client.get("/x").status_code == 200
    assert counters.other["api_rate_limited"] == 1


def test_failed_sign_ins_slow_the_address_down_and_are_counted() -> None:
    counters, clock = Counters(), Clock()
    strict = RateLimits(Limit(100, 100), Limit(100, 100), Limit(0.5, 3))
    client = TestClient(app_with(strict, counters, clock))
    bad = {"Authorization": "Bearer bad"}
    assert [client.get("/x", headers=bad).status_code for _ in range(5)] == [401, 401, 401, 429, 429]
    r = client.get("/x", headers={"Authorization": "Bearer good"})  # the right one too, for now
    assert r.status_code == 429 and r.headers["retry-after"] == "2"
    assert "failed sign-ins" in r.json()["error"]
    clock.now = 2.0
    assert client.get("/x", headers={"Authorization": "Bearer good"}).status_code == 200
    assert counters.other["api_sign_in_failures"] == 3 and counters.other["api_rate_limited"] == 3
