"""fence.auth without a Firebase emulator: header parsing, claim checks, the mapping of
firebase_admin's exceptions, the mode guard, and (offline) what firebase-admin itself checks."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google.auth.exceptions
import pytest
from firebase_admin import auth as fb_auth
from firebase_admin import exceptions as fb_exceptions

from deploy.firebase_emulator import encode_unsigned
from fence import auth
from fence.auth import (
    AuthUnavailable,
    FirebaseConfigError,
    FirebaseVerifier,
    Reason,
    Unauthenticated,
    User,
)
from tests.unit.service_accounts import service_account_file

PROJECT = "demo-unit"
NOW = 1_800_000_000.0
REFRESH_ERROR: Any = google.auth.exceptions.RefreshError  # its __init__ is unannotated
EMULATOR = "127.0.0.1:1"  # never contacted: the lookups here are fakes


def claims(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "iss": f"https://securetoken.google.com/{PROJECT}", "aud": PROJECT, "sub": "uid-1",
        "user_id": "uid-1", "email": "a@example.com", "iat": int(NOW) - 10, "exp": int(NOW) + 3590,
    }
    base.update(changes)
    return {key: value for key, value in base.items() if value is not None}


def token(**changes: Any) -> str:
    return encode_unsigned(claims(**changes))


def reason_of(exc_info: pytest.ExceptionInfo[Unauthenticated]) -> Reason:
    return exc_info.value.reason


# --------------------------------------------------------------------------- header


@pytest.mark.parametrize("header", [None, "", "   "])
def test_missing_header(header: str | None) -> None:
    with pytest.raises(Unauthenticated) as info:
        auth.bearer_token(header)
    assert reason_of(info) is Reason.MISSING_HEADER


@pytest.mark.parametrize("header", ["Basic dXNlcjpwYXNz", "Token abc", "abc.def.ghi"])
def test_not_a_bearer_token(header: str) -> None:
    with pytest.raises(Unauthenticated) as info:
        auth.bearer_token(header)
    assert reason_of(info) is Reason.NOT_BEARER


@pytest.mark.parametrize("header", ["Bearer", "Bearer    ", "Bearer a b", "Bearer a\tb",
                                    "Bearer " + "x" * (auth.MAX_TOKEN_LENGTH + 1)])
def test_malformed_bearer(header: str) -> None:
    with pytest.raises(Unauthenticated) as info:
        auth.bearer_token(header)
    assert reason_of(info) is Reason.MALFORMED


@pytest.mark.parametrize("header", ["Bearer tok", "bearer tok", "BEARER  tok ", " Bearer tok"])
def test_bearer_token(header: str) -> None:
    assert auth.bearer_token(header) == "tok"


@pytest.mark.parametrize("value", ["garbage", "a.b", "a.b.c.d", "!!!.???.x", "e30.W10.", "bm90IGpzb24.e30."])
def test_unverified_claims_malformed(value: str) -> None:
    with pytest.raises(Unauthenticated) as info:
        auth.unverified_claims(value)
    assert reason_of(info) is Reason.MALFORMED


def test_unverified_claims() -> None:
    assert auth.unverified_claims(token()) == claims()


# --------------------------------------------------------------------------- claims


@pytest.mark.parametrize(("changes", "reason"), [
    ({"aud": "demo-other"}, Reason.WRONG_AUDIENCE),
    ({"aud": None}, Reason.WRONG_AUDIENCE),
    ({"aud": auth.CUSTOM_TOKEN_AUDIENCE}, Reason.CUSTOM_TOKEN),
    ({"iss": "https://securetoken.google.com/demo-other"}, Reason.WRONG_ISSUER),
    ({"iss": "https://evil.example.com/" + PROJECT}, Reason.WRONG_ISSUER),
    ({"sub": None}, Reason.MALFORMED),
    ({"sub": ""}, Reason.MALFORMED),
    ({"sub": 42}, Reason.MALFORMED),
    ({"sub": "u" * 129}, Reason.MALFORMED),
    ({"exp": None}, Reason.MALFORMED),
    ({"exp": "1900000000"}, Reason.MALFORMED),
    ({"iat": True}, Reason.MALFORMED),
    ({"exp": int(NOW) - 1}, Reason.EXPIRED),
    ({"iat": int(NOW) + 5}, Reason.NOT_YET_VALID),
])
def test_check_claims_refuses(changes: dict[str, Any], reason: Reason) -> None:
    with pytest.raises(Unauthenticated) as info:
        auth.check_claims(claims(**changes), PROJECT, NOW)
    assert reason_of(info) is reason


def test_check_claims_accepts_within_clock_skew() -> None:
    auth.check_claims(claims(), PROJECT, NOW)
    auth.check_claims(claims(exp=int(NOW) - 5, iat=int(NOW) - 3600), PROJECT, NOW, clock_skew=5)
    auth.check_claims(claims(iat=int(NOW) + 5), PROJECT, NOW, clock_skew=5)
    auth.check_claims(claims(exp=int(NOW)), PROJECT, NOW)  # still valid at exp itself


def test_hostile_values_are_bounded_in_details() -> None:
    with pytest.raises(Unauthenticated) as info:
        auth.check_claims(claims(aud="x" * 10_000), PROJECT, NOW)
    assert len(str(info.value)) < 300


# --------------------------------------------------------------------------- exception mapping


@pytest.mark.parametrize(("exc", "reason"), [
    (fb_auth.ExpiredIdTokenError("Token expired, 5 < 6", cause=None), Reason.EXPIRED),
    (fb_auth.RevokedIdTokenError("The Firebase ID token has been revoked."), Reason.REVOKED),
    (fb_auth.UserDisabledError("The user record is disabled."), Reason.USER_DISABLED),
    (fb_auth.UserNotFoundError("No user record found for the provided user ID: x."), Reason.UNKNOWN_USER),
    (fb_auth.InvalidIdTokenError('Firebase ID token has incorrect "aud" (audience) claim.'),
     Reason.WRONG_AUDIENCE),
    (fb_auth.InvalidIdTokenError('Firebase ID token has incorrect "iss" (issuer) claim.'),
     Reason.WRONG_ISSUER),
    (fb_auth.InvalidIdTokenError("verify_id_token() expects an ID token, but was given a custom token."),
     Reason.CUSTOM_TOKEN),
    (fb_auth.InvalidIdTokenError("Could not verify token signature."), Reason.INVALID),
    (fb_auth.InvalidIdTokenError('Firebase ID token has no "kid" claim.'), Reason.INVALID),
    (fb_exceptions.InvalidArgumentError("Invalid tenant ID: t"), Reason.INVALID),
    (fb_exceptions.NotFoundError("not found"), Reason.UNKNOWN_USER),
    (REFRESH_ERROR("invalid_grant"), Reason.UNAVAILABLE),
    (ValueError("Illegal ID token provided"), Reason.MALFORMED),
])
def test_error_from_firebase(exc: Exception, reason: Reason) -> None:
    mapped = auth.error_from_firebase(exc)
    assert type(mapped) is (AuthUnavailable if reason is Reason.UNAVAILABLE else Unauthenticated)
    assert mapped.reason is reason


@pytest.mark.parametrize("exc", [
    fb_auth.CertificateFetchError("Failed to establish a new connection", cause=None),
    fb_exceptions.UnavailableError("Failed to establish a new connection"),
    fb_exceptions.DeadlineExceededError("Timed out"),
    fb_exceptions.PermissionDeniedError("Caller does not have permission"),
    fb_exceptions.UnknownError("Unexpected response"),
])
def test_backend_failures_are_unavailable(exc: Exception) -> None:
    mapped = auth.error_from_firebase(exc)
    assert isinstance(mapped, AuthUnavailable)
    assert isinstance(mapped, Unauthenticated)  # catching Unauthenticated still fails closed
    assert mapped.reason is Reason.UNAVAILABLE


def test_token_is_scrubbed_from_details() -> None:
    secret = token()
    mapped = auth.error_from_firebase(ValueError(f"Illegal ID token provided: b'{secret}'."), secret)
    assert secret not in str(mapped)
    assert "<token>" in mapped.detail


def test_unrelated_exceptions_are_not_mapped() -> None:
    with pytest.raises(TypeError):
        auth.error_from_firebase(KeyError("bug"))


# --------------------------------------------------------------------------- the verifier


@pytest.fixture
def emulated(monkeypatch: pytest.MonkeyPatch) -> Iterator[FirebaseVerifier]:
    monkeypatch.setenv(auth.EMULATOR_HOST_ENV, EMULATOR)
    verifier = FirebaseVerifier(PROJECT, EMULATOR, clock=lambda: NOW)
    try:
        yield verifier
    finally:
        verifier.close()


@pytest.fixture(scope="module")
def service_account(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A syntactically valid service account file (a fresh key no Google server knows)."""
    return service_account_file(tmp_path_factory.mktemp("sa"), PROJECT)


@pytest.fixture
def real(monkeypatch: pytest.MonkeyPatch, service_account: Path) -> Iterator[FirebaseVerifier]:
    monkeypatch.delenv(auth.EMULATOR_HOST_ENV, raising=False)
    verifier = FirebaseVerifier(PROJECT, credentials_path=service_account, clock=lambda: NOW)
    try:
        yield verifier
    finally:
        verifier.close()


class FakeVerifyIdToken:
    def __init__(self, result: dict[str, Any] | Exception) -> None:
        self.result = result
        self.calls: list[dict[str, Any]] = []

    def __call__(self, id_token: str, app: Any = None, check_revoked: bool = False,
                 clock_skew_seconds: int = 0) -> dict[str, Any]:
        self.calls.append({"token": id_token, "app": app, "check_revoked": check_revoked,
                           "clock_skew_seconds": clock_skew_seconds})
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


@dataclass
class Record:
    """What fb_auth.get_user returns, as far as check_against_record reads it."""

    email: str | None = "a@example.com"
    custom_claims: dict[str, Any] | None = None
    disabled: bool = False
    tokens_valid_after_timestamp: int = 0


class FakeGetUser:
    def __init__(self, record: Record | Exception) -> None:
        self.record = record
        self.uids: list[str] = []

    def __call__(self, uid: str, app: Any = None) -> Record:
        self.uids.append(uid)
        if isinstance(self.record, Exception):
            raise self.record
        return self.record


async def test_verify_returns_the_user(emulated: FirebaseVerifier, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeVerifyIdToken({**claims(role="admin"), "uid": "uid-1"})
    monkeypatch.setattr(fb_auth, "verify_id_token", fake)
    lookup = FakeGetUser(Record(custom_claims={"role": "admin"}))
    monkeypatch.setattr(fb_auth, "get_user", lookup)
    user = await emulated.verify("Bearer " + token())
    assert user == User("uid-1", "a@example.com", {**claims(role="admin"), "uid": "uid-1"})
    assert user.claims["role"] == "admin"
    assert hash(user) == hash(User("uid-1", "a@example.com", {}))
    [call] = fake.calls
    # emulator mode: the revocation check is ours, in the same lookup that checks the claims
    assert call["check_revoked"] is False and call["token"] == token() and lookup.uids == ["uid-1"]
    assert call["app"] is not None and call["app"].name.startswith("geofence-auth-")


@pytest.mark.parametrize(("token_claims", "record", "reason"), [
    ({"geofence_operator": True}, Record(), Reason.NOT_THE_RECORD),  # a forged operator
    ({"geofence_operator": True}, Record(custom_claims={"geofence_operator": False}), Reason.NOT_THE_RECORD),
    ({"role": "admin"}, Record(custom_claims={"role": "viewer"}), Reason.NOT_THE_RECORD),
    ({"email": "victim@example.com"}, Record(), Reason.NOT_THE_RECORD),
    ({}, Record(disabled=True), Reason.USER_DISABLED),
    ({}, Record(tokens_valid_after_timestamp=int(NOW) * 1000), Reason.REVOKED),
])
async def test_an_emulator_token_is_held_against_the_users_record(
        emulated: FirebaseVerifier, monkeypatch: pytest.MonkeyPatch, token_claims: dict[str, Any],
        record: Record, reason: Reason) -> None:
    verified = FakeVerifyIdToken({**claims(**token_claims), "uid": "uid-1"})
    monkeypatch.setattr(fb_auth, "verify_id_token", verified)
    monkeypatch.setattr(fb_auth, "get_user", FakeGetUser(record))
    with pytest.raises(Unauthenticated) as info:
        await emulated.verify("Bearer " + token())
    assert info.value.reason is reason


@pytest.mark.parametrize(("token_claims", "record"), [
    ({"geofence_operator": True}, Record(custom_claims={"geofence_operator": True})),
    ({}, Record(custom_claims={"geofence_operator": True})),  # issued before the claim was set: less
    ({"email": None}, Record()),
])
async def test_an_emulator_token_that_matches_its_record_passes(
        emulated: FirebaseVerifier, monkeypatch: pytest.MonkeyPatch, token_claims: dict[str, Any],
        record: Record) -> None:
    verified = FakeVerifyIdToken({**claims(**token_claims), "uid": "uid-1"})
    monkeypatch.setattr(fb_auth, "verify_id_token", verified)
    monkeypatch.setattr(fb_auth, "get_user", FakeGetUser(record))
    assert (await emulated.verify("Bearer " + token())).uid == "uid-1"


async def test_an_emulator_token_of_an_unknown_user_is_refused(emulated: FirebaseVerifier,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fb_auth, "verify_id_token", FakeVerifyIdToken({**claims(), "uid": "uid-9"}))
    monkeypatch.setattr(fb_auth, "get_user", FakeGetUser(fb_auth.UserNotFoundError("No user record found")))
    with pytest.raises(Unauthenticated) as info:
        await emulated.verify("Bearer " + token())
    assert info.value.reason is Reason.UNKNOWN_USER


@pytest.mark.parametrize(("exc", "reason"), [
    (fb_auth.RevokedIdTokenError("The Firebase ID token has been revoked."), Reason.REVOKED),
    (fb_auth.UserDisabledError("The user record is disabled."), Reason.USER_DISABLED),
    (fb_auth.UserNotFoundError("No user record found for the provided user ID: uid-1."), Reason.UNKNOWN_USER),
    (fb_exceptions.UnavailableError("connection refused"), Reason.UNAVAILABLE),
])
async def test_verify_maps_firebase_errors(emulated: FirebaseVerifier, monkeypatch: pytest.MonkeyPatch,
                                           exc: Exception, reason: Reason) -> None:
    monkeypatch.setattr(fb_auth, "verify_id_token", FakeVerifyIdToken(exc))
    with pytest.raises(Unauthenticated) as info:
        await emulated.verify("Bearer " + token())
    assert info.value.reason is reason
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no token in tracebacks


async def test_cheap_checks_run_before_firebase(emulated: FirebaseVerifier,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeVerifyIdToken({**claims(), "uid": "uid-1"})
    monkeypatch.setattr(fb_auth, "verify_id_token", fake)
    for header, reason in [(None, Reason.MISSING_HEADER), ("Bearer garbage", Reason.MALFORMED),
                           ("Bearer " + token(exp=int(NOW) - 60), Reason.EXPIRED),
                           ("Bearer " + token(aud="demo-other"), Reason.WRONG_AUDIENCE)]:
        with pytest.raises(Unauthenticated) as info:
            await emulated.verify(header)
        assert info.value.reason is reason
    assert fake.calls == []


# --------------------------------------------------------------------------- configuration


def test_real_verifier_refuses_emulator_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(auth.EMULATOR_HOST_ENV, EMULATOR)
    with pytest.raises(FirebaseConfigError, match="skip signature checks"):
        FirebaseVerifier(PROJECT)


def test_emulator_verifier_needs_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(auth.EMULATOR_HOST_ENV, raising=False)
    with pytest.raises(FirebaseConfigError, match="unset"):
        FirebaseVerifier(PROJECT, EMULATOR)
    monkeypatch.setenv(auth.EMULATOR_HOST_ENV, "127.0.0.1:2")
    with pytest.raises(FirebaseConfigError, match=r"127\.0\.0\.1:2"):
        FirebaseVerifier(PROJECT, EMULATOR)


async def test_mode_is_checked_at_every_verification(real: FirebaseVerifier,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fb_auth, "verify_id_token", FakeVerifyIdToken({**claims(), "uid": "uid-1"}))
    assert (await real.verify("Bearer " + token())).uid == "uid-1"
    monkeypatch.setenv(auth.EMULATOR_HOST_ENV, EMULATOR)
    with pytest.raises(FirebaseConfigError):
        await real.verify("Bearer " + token())


@pytest.mark.parametrize("kwargs", [{"project_id": ""}, {"project_id": PROJECT, "emulator_host": "http://h:1"},
                                    {"project_id": PROJECT, "clock_skew_seconds": 61}])
def test_bad_settings(kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(auth.EMULATOR_HOST_ENV, raising=False)
    with pytest.raises(FirebaseConfigError):
        FirebaseVerifier(**kwargs)


def test_real_mode_needs_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(auth.EMULATOR_HOST_ENV, raising=False)
    with pytest.raises(FirebaseConfigError, match=auth.CREDENTIALS_ENV):
        FirebaseVerifier(PROJECT, credentials_path=tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(FirebaseConfigError):
        FirebaseVerifier(PROJECT, credentials_path=tmp_path / "bad.json")


def test_from_env(monkeypatch: pytest.MonkeyPatch, service_account: Path) -> None:
    monkeypatch.setenv(auth.EMULATOR_HOST_ENV, EMULATOR)
    verifier = FirebaseVerifier.from_env({"GOOGLE_CLOUD_PROJECT": "demo-generic",
                                          "GEOFENCE_FIREBASE_PROJECT": "demo-ours",
                                          auth.EMULATOR_HOST_ENV: EMULATOR})
    try:
        assert (verifier.project_id, verifier.emulator_host) == ("demo-ours", EMULATOR)
        assert verifier.emulated
    finally:
        verifier.close()
    with pytest.raises(FirebaseConfigError, match="GEOFENCE_FIREBASE_PROJECT"):
        FirebaseVerifier.from_env({auth.EMULATOR_HOST_ENV: EMULATOR})
    monkeypatch.delenv(auth.EMULATOR_HOST_ENV)
    verifier = FirebaseVerifier.from_env({"GOOGLE_CLOUD_PROJECT": "my-project",
                                          auth.CREDENTIALS_ENV: str(service_account)}, check_revoked=False)
    try:
        assert verifier.project_id == "my-project"
        assert not verifier.emulated and not verifier.check_revoked
    finally:
        verifier.close()


async def test_several_verifiers_and_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(auth.EMULATOR_HOST_ENV, EMULATOR)
    first = FirebaseVerifier("demo-a", EMULATOR)
    second = FirebaseVerifier("demo-b", EMULATOR)
    assert first._app.name != second._app.name and first._app.project_id == "demo-a"
    for verifier in (first, second):
        verifier.close()
        verifier.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        await first.verify("Bearer " + token())


# --------------------------------------------------------------------------- firebase-admin itself
# Offline pins of the findings in fence/auth.py's docstring, against the installed firebase-admin.


def test_firebase_admin_skips_signature_and_expiry_in_emulator_mode(emulated: FirebaseVerifier) -> None:
    forged = encode_unsigned(claims(exp=1, iat=0), {"alg": "RS256", "kid": "made-up"}) + "bm90LWEtc2ln"
    verified = fb_auth.verify_id_token(forged, app=emulated._app, check_revoked=False)
    assert verified["uid"] == "uid-1" and verified["exp"] == 1


@pytest.mark.parametrize(("changes", "reason"), [
    ({"aud": "demo-other"}, Reason.WRONG_AUDIENCE),
    ({"iss": "https://securetoken.google.com/demo-other"}, Reason.WRONG_ISSUER),
    ({"aud": auth.CUSTOM_TOKEN_AUDIENCE}, Reason.CUSTOM_TOKEN),
])
def test_firebase_admin_messages_are_classified(emulated: FirebaseVerifier, changes: dict[str, Any],
                                                reason: Reason) -> None:
    with pytest.raises(fb_auth.InvalidIdTokenError) as info:
        fb_auth.verify_id_token(token(**changes), app=emulated._app, check_revoked=False)
    assert auth.error_from_firebase(info.value).reason is reason


async def test_real_mode_refuses_unsigned_tokens_offline(real: FirebaseVerifier) -> None:
    # No "kid": refused before any certificate fetch, so this needs no network.
    with pytest.raises(Unauthenticated) as info:
        await real.verify("Bearer " + token())
    assert info.value.reason is Reason.INVALID
    assert '"kid"' in info.value.detail
