"""The webhooks' pure core (fence/webhooks/): Standard Webhooks signatures against the
specification's published test vector, endpoints' checks and filters (a tenant's URL is held to
a public HTTPS callback), and the retry, give-up and disable decisions."""

from __future__ import annotations

import ipaddress
import random

import pytest
from geofence_client import webhooks as receiver

from fence.webhooks import endpoints as ep
from fence.webhooks import retries, signing

VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR = ("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
VECTOR_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_the_specifications_test_vector() -> None:
    msg_id, ts, body = VECTOR
    assert signing.signature(signing.key_of(VECTOR_SECRET), msg_id, ts, body) == VECTOR_SIGNATURE
    got = signing.headers([signing.key_of(VECTOR_SECRET)], msg_id, ts, body)
    assert got == {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": VECTOR_SIGNATURE}
    assert receiver.verify(VECTOR_SECRET, got, body, now=ts + 10) == msg_id


def test_verification_refuses_what_it_must() -> None:
    msg_id, ts, body = VECTOR
    good = signing.headers([signing.key_of(VECTOR_SECRET)], msg_id, ts, body)
    for changed, why in (({**good, "webhook-id": "msg_other"}, "no signature"),
                         ({**good, "webhook-timestamp": str(ts + 1)}, "no signature"),
                         ({**good, "webhook-signature": "v1,AAAA"}, "no signature"),
                         ({k: v for k, v in good.items() if k != "webhook-signature"}, "missing"),
                         ({**good, "webhook-timestamp": "soon"}, "not an integer")):
        with pytest.raises(receiver.BadSignature, match=why):
            receiver.verify(VECTOR_SECRET, changed, body, now=ts)
    with pytest.raises(receiver.BadSignature, match="no signature"):
        receiver.verify(VECTOR_SECRET, good, body + b" ", now=ts)
    with pytest.raises(receiver.BadSignature, match="from now"):  # a replay, later
        receiver.verify(VECTOR_SECRET, good, body, now=ts + receiver.TOLERANCE_S + 1)


def test_a_rotated_secret_signs_with_both_and_either_verifies() -> None:
    old, new = signing.new_secret(), signing.new_secret()
    assert old != new and old.startswith("whsec_") and len(signing.key_of(new)) == 32
    got = signing.headers([signing.key_of(new), signing.key_of(old)], "m1", 1_700_000_000, b"{}")
    assert len(got["webhook-signature"].split(" ")) == 2
    assert receiver.verify(old, got, b"{}", 1_700_000_000) == receiver.verify(new, got, b"{}", 1_700_000_000)
    for bad in ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_!!!", "whsec_" + "QUJD"):
        with pytest.raises(ValueError):
            signing.key_of(bad)


URLS_OK = ["https://hooks.example.com/geofence", "https://93.184.216.34:8443/in?x=1", "https://[2606:4700::1]/h"]
URLS_REFUSED = {"http://hooks.example.com/": "https:// only", "ftp://x/": "https:// only",
                "https://user:pw@hooks.example.com/": "no user", "https:///path": "host",
                "https://127.0.0.1/": "not a public", "https://10.0.0.5/": "not a public",
                "https://169.254.169.254/latest/meta-data": "not a public", "https://[::1]/": "not a public",
                "https://[::ffff:10.0.0.1]/": "not a public", "https://0.0.0.0/": "not a public",
                "https://hooks.example.com/#frag": "fragment", "https://h.example.com/ x": "spaces",
                "https://h.example.com:99999/": "url", "": "url", "https://x/" + "a" * 2100: "2048"}


@pytest.mark.parametrize("url", URLS_OK)
def test_public_https_urls_are_taken(url: str) -> None:
    assert ep.check_url(url) == url


@pytest.mark.parametrize(("url", "why"), URLS_REFUSED.items(), ids=lambda v: str(v)[:40])
def test_other_urls_are_refused_with_the_reason(url: str, why: str) -> None:
    with pytest.raises(ep.InvalidEndpoint, match=why):
        ep.check_url(url)


def test_a_local_receiver_only_where_the_operator_allows_it() -> None:
    assert ep.check_url("http://127.0.0.1:8765/hook", local=True)
    with pytest.raises(ep.InvalidEndpoint):
        ep.check_url("http://127.0.0.1:8765/hook")
    for addr, public in (("8.8.8.8", True), ("192.168.1.1", False), ("100.64.0.1", False), ("fd00::1", False),
                         ("fe80::1", False), ("224.0.0.1", False), ("2001:db8::1", False)):
        assert ep.public_address(ipaddress.ip_address(addr)) is public, addr


def test_an_endpoint_from_a_request_and_what_it_wants() -> None:
    e = ep.from_request({"url": "https://h.example.com/in", "fences": ["depot", "depot", "yard"],
                         "kinds": ["enter"], "batch": 50, "description": "dispatch"}, "wh-0123456789abcdef",
                        "fleet", signing.new_secret())
    assert e.fences == ("depot", "yard") and e.kinds == ("enter",) and e.batch == 50
    assert "secret" not in str(e.public()) and "whsec" not in repr(e)
    event = {"schema": 1, "event": "enter", "tenant": "fleet", "fence_id": "depot", "object_id": "van-1"}
    assert e.wants(event)
    assert not e.wants({**event, "event": "leave"}) and not e.wants({**event, "fence_id": "other"})
    assert not e.wants({**event, "tenant": "other"})  # never another tenant's
    assert not e.wants({**event, "shared": True, "object_id": "anon-" + "a" * 24})  # nor a presence count
    every = ep.from_request({"url": "https://h.example.com/in"}, "wh-0123456789abcdef", "fleet", "s")
    proximity = {"schema": 1, "event": "nearby", "tenant": "fleet", "subscription": "s1", "object": "van-2"}
    assert every.wants(event) and every.wants(proximity) and every.batch == 1
    only_van = ep.from_request({"url": "https://h.example.com/in", "objects": ["van-2"]}, "wh-1", "fleet",
                               "s")
    assert only_van.wants(proximity) and not only_van.wants(event)


@pytest.mark.parametrize(("body", "why"), [
    ([], "a JSON object"), ({"url": "https://h.example.com", "secret": "x"}, "unknown field"),
    ({"url": "https://h.example.com", "kinds": ["exit"]}, "kinds"),
    ({"url": "https://h.example.com", "batch": 0}, "batch"),
    ({"url": "https://h.example.com", "batch": True}, "batch"),
    ({"url": "https://h.example.com", "fences": ["a b"]}, "not an id"),
    ({"url": "https://h.example.com", "objects": ["o"] * 101}, "at most 100"),
    ({"url": "https://h.example.com", "description": "x" * 201}, "description")])
def test_a_bad_request_is_refused_with_the_reason(body: object, why: str) -> None:
    with pytest.raises(ep.InvalidEndpoint, match=why):
        ep.from_request(body, "wh-1", "fleet", "s")


def test_backoff_grows_with_jitter_up_to_its_ceiling() -> None:
    p = retries.Policy()
    draws = random.Random(7)
    delays = [p.delay(n, draws.random()) for n in range(1, 20)]
    for n, d in enumerate(delays, start=1):
        step = min(p.max_delay_s, p.first_s * 2 ** (n - 1))
        assert step / 2 <= d <= step
    assert max(delays) <= p.max_delay_s and delays[0] <= 1.0


def test_give_up_disable_and_recovery() -> None:
    p = retries.Policy(give_up_s=600.0, disable_s=3600.0)
    h = retries.EndpointHealth()
    assert retries.outcome(204) is None and retries.outcome(None) == "no answer"
    assert retries.outcome(500) == "HTTP 500" and retries.outcome(301) == "HTTP 301"
    h.failed(1000.0, "HTTP 500")
    assert retries.after_failure(p, h, 500, first_attempt=1000.0, now=1000.0) == "retry"
    h.failed(1601.0, "no answer")
    assert retries.after_failure(p, h, None, first_attempt=1000.0, now=1601.0) == "give_up"
    h.failed(4601.0, "HTTP 503")  # an hour of failures, nothing delivered in between
    assert retries.after_failure(p, h, 503, first_attempt=4500.0, now=4601.0) == "disable"
    h.delivered()
    assert h.failing_since is None and h.failures == 0
    h.failed(5000.0, "HTTP 410")
    assert retries.after_failure(p, h, 410, first_attempt=5000.0, now=5000.0) == "disable"  # Gone
