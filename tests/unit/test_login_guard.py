"""exchanges/login_guard.py: RabbitMQ's password hashes checked as its store makes them, the
client id rule, the lock-out per user name (the platform's users exempt)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exchanges.login_guard import LoginGuard, client_id_allowed, rabbit_hash, rabbit_hash_ok
from exchanges.token_buckets import Limit

# a hash as RabbitMQ 3.10's store holds it, salt included (checked against a user made with
# `rabbitmqctl add_user` and read back through the management API: the same bytes)
KNOWN = ("secret", rabbit_hash("secret", b"\x01\x02\x03\x04"))


@given(st.text(max_size=40), st.binary(min_size=4, max_size=4))
def test_a_password_matches_its_own_hash_only(password: str, salt: bytes) -> None:
    h = rabbit_hash(password, salt)
    assert rabbit_hash_ok(password, h, "rabbit_password_hashing_sha256")
    assert not rabbit_hash_ok(password + "x", h, "rabbit_password_hashing_sha256")


@pytest.mark.parametrize("algorithm", ["rabbit_password_hashing_sha512", "rabbit_password_hashing_md5"])
def test_the_other_algorithms_of_the_store(algorithm: str) -> None:
    h = rabbit_hash("pw", os.urandom(4), algorithm)
    assert rabbit_hash_ok("pw", h, algorithm)
    assert not rabbit_hash_ok("pw", h, "rabbit_password_hashing_sha256")


@pytest.mark.parametrize(("stored", "algorithm"), [("", "rabbit_password_hashing_sha256"),
                                                    ("not base64!", "rabbit_password_hashing_sha256"),
                                                    ("AAAA", "rabbit_password_hashing_sha256"),
                                                    (KNOWN[1], "rabbit_password_hashing_unknown")])
def test_an_unreadable_hash_never_matches(stored: str, algorithm: str) -> None:
    assert not rabbit_hash_ok("secret", stored, algorithm)


def test_a_client_id_is_the_user_name_or_it_with_a_suffix() -> None:
    assert client_id_allowed("t.van-1", "t.van-1")
    assert client_id_allowed("t.gw", "t.gw:2")
    for bad in ("t.van-2", "t.van-1x", "t.van-1:", "t.van", "", "T.VAN-1", "x:t.van-1"):
        assert not client_id_allowed("t.van-1", bad), bad


def guard() -> LoginGuard:
    return LoginGuard(Limit(rate=0.1, burst=3), frozenset({"x-ingress"}))


def test_wrong_passwords_lock_the_name_then_the_right_one_waits() -> None:
    g = guard()
    decisions = [g.login("t.van-1", False, "t.van-1", 0.0) for _ in range(3)]
    assert [d.failed for d in decisions] == [True] * 3
    assert [d.locked for d in decisions] == [False, False, True]
    refused = g.login("t.van-1", True, "t.van-1", 1.0)
    assert not refused.allow and not refused.failed and "locked for 9 s more" in refused.reason
    assert g.login("t.van-2", True, "t.van-2", 1.0).allow  # another name
    assert g.login("t.van-1", True, "t.van-1", 10.0).allow  # refilled: one try back


def test_an_unknown_user_is_a_failure_of_that_name() -> None:
    d = guard().login("nobody", None, None, 0.0)
    assert not d.allow and d.failed and d.reason == "no such user"


def test_the_platforms_users_are_counted_never_locked() -> None:
    g = guard()
    for _ in range(10):
        d = g.login("x-ingress", False, None, 0.0)
        assert d.failed and not d.locked
    assert g.login("x-ingress", True, None, 0.0).allow


def test_another_users_client_id_is_refused_even_with_the_right_password() -> None:
    g = guard()
    d = g.login("t.van-1", True, "t.van-2", 0.0)
    assert not d.allow and not d.failed and "is not the user's" in d.reason
    assert g.login("t.van-1", True, None, 0.0).allow  # AMQP: no client id
    assert not g.client_id_ok("t.van-1", "t.van-2").allow and g.client_id_ok("t.van-1", "t.van-1:a").allow
