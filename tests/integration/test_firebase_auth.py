"""fence.auth against a real Firebase Auth emulator (firebase-tools, offline).

The module fixture uses the emulator already answering on 127.0.0.1:9099 (the local stack's)
or installs and starts one, and then stops it, only if it started it. Users get unique emails,
so a shared emulator is never wiped."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deploy import firebase_emulator as emu
from fence.auth import EMULATOR_HOST_ENV, AuthUnavailable, FirebaseVerifier, Reason, Unauthenticated

pytestmark = pytest.mark.integration

HOST, PORT = emu.DEFAULT_HOST, emu.DEFAULT_PORT
PREFIX = Path("/var/lib/geofence/firebase-tools")
STATE_DIR = Path("/var/lib/geofence/firebase")
START_TIMEOUT = 180.0  # ~12 s to start on 2 cores; an install (first run) is ~2 minutes more


@dataclass(frozen=True)
class Emulator:
    host: str
    port: int
    project_id: str
    started_pid: int | None  # None: somebody else's emulator, left running

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class SignedUp:
    uid: str
    email: str
    password: str
    token: str


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    started = emu.start(PREFIX, STATE_DIR, HOST, PORT, emu.DEFAULT_PROJECT, timeout=START_TIMEOUT)
    try:
        # An emulator somebody else started may sign users up in another project: adopt it.
        project = emu.default_project(HOST, PORT)
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(EMULATOR_HOST_ENV, f"{HOST}:{PORT}")
            yield Emulator(HOST, PORT, project, started)
    finally:
        if started is not None:
            emu.stop(started)


@pytest.fixture(scope="module")
def verifier(emulator: Emulator) -> Iterator[FirebaseVerifier]:
    made = FirebaseVerifier(emulator.project_id, emulator.address)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def user(emulator: Emulator) -> Iterator[SignedUp]:
    email, password = f"t-{uuid.uuid4().hex[:12]}@example.com", uuid.uuid4().hex
    uid, token = emu.sign_up(emulator.host, emulator.port, emulator.project_id, email, password)
    try:
        yield SignedUp(uid, email, password, token)
    finally:
        with suppress(emu.EmulatorError):  # the test may have deleted it
            emu.delete_user(emulator.host, emulator.port, emulator.project_id, uid)


async def refused(verifier: FirebaseVerifier, header: str | None) -> Unauthenticated:
    with pytest.raises(Unauthenticated) as info:
        await verifier.verify(header)
    return info.value


def test_the_emulator_is_the_one_listening(emulator: Emulator) -> None:
    pid = emu.find_pid(emulator.host, emulator.port)
    assert pid is not None and emu.alive(pid)
    if emulator.started_pid is not None:
        assert pid == emulator.started_pid


async def test_signed_up_user_verifies(verifier: FirebaseVerifier, user: SignedUp) -> None:
    verified = await verifier.verify(f"Bearer {user.token}")
    assert (verified.uid, verified.email) == (user.uid, user.email)
    assert verified.claims["firebase"]["sign_in_provider"] == "password"


async def test_signed_in_token_verifies(verifier: FirebaseVerifier, emulator: Emulator,
                                        user: SignedUp) -> None:
    token = emu.sign_in(emulator.host, emulator.port, emulator.project_id, user.email, user.password)
    assert (await verifier.verify(f"bearer {token}")).uid == user.uid


@pytest.mark.parametrize(("header", "reason"), [
    (None, Reason.MISSING_HEADER),
    ("", Reason.MISSING_HEADER),
    ("Basic dXNlcjpwYXNz", Reason.NOT_BEARER),
    ("Bearer", Reason.MALFORMED),
    ("Bearer garbage", Reason.MALFORMED),
    ("Bearer a.b.c", Reason.MALFORMED),
])
async def test_bad_headers(verifier: FirebaseVerifier, header: str | None, reason: Reason) -> None:
    assert (await refused(verifier, header)).reason is reason


async def test_expired_token(verifier: FirebaseVerifier, user: SignedUp) -> None:
    # firebase-admin checks no exp in emulator mode: this is fence.auth's own check.
    assert (await refused(verifier, f"Bearer {emu.expired_token(user.token)}")).reason is Reason.EXPIRED


async def test_forged_token_for_unknown_uid(verifier: FirebaseVerifier, emulator: Emulator,
                                            user: SignedUp) -> None:
    nobody = f"forged-{uuid.uuid4().hex}"
    forged = emu.forged_token(user.token, sub=nobody, user_id=nobody)
    assert (await refused(verifier, f"Bearer {forged}")).reason is Reason.UNKNOWN_USER
    # without check_revoked too: in emulator mode the uid is always looked up (its record holds
    # the claims the token is checked against), so an invented identity never gets in
    lax = FirebaseVerifier(emulator.project_id, emulator.address, check_revoked=False)
    try:
        assert (await refused(lax, f"Bearer {forged}")).reason is Reason.UNKNOWN_USER
    finally:
        lax.close()


@pytest.mark.parametrize("changes", [{"geofence_operator": True}, {"email": "someone-else@example.com"},
                                     {"admin": True}])
async def test_a_token_whose_claims_are_not_its_users_record_is_refused(
        verifier: FirebaseVerifier, user: SignedUp, changes: dict[str, Any]) -> None:
    tampered = emu.forged_token(user.token, **changes)
    assert (await refused(verifier, f"Bearer {tampered}")).reason is Reason.NOT_THE_RECORD


async def test_a_copy_of_an_existing_users_token_is_the_limit_of_emulator_mode(
        verifier: FirebaseVerifier, user: SignedUp) -> None:
    # The documented limit (SECURITY.md): with no signature, a token made up for an existing
    # user with exactly its record's claims passes; real mode's RS256 check refuses it
    # (tests/unit/test_auth_signed.py).
    copied = emu.forged_token(user.token)  # made up, unsigned, with the record's very claims
    assert (await verifier.verify(f"Bearer {copied}")).uid == user.uid


@pytest.mark.parametrize(("claims", "reason"), [
    ({"aud": "demo-someone-else"}, Reason.WRONG_AUDIENCE),
    ({"iss": "https://securetoken.google.com/demo-someone-else"}, Reason.WRONG_ISSUER),
    ({"aud": "demo-someone-else", "iss": "https://securetoken.google.com/demo-someone-else"},
     Reason.WRONG_AUDIENCE),
])
async def test_token_of_another_project(verifier: FirebaseVerifier, user: SignedUp,
                                        claims: dict[str, str], reason: Reason) -> None:
    forged = emu.forged_token(user.token, **claims)
    assert (await refused(verifier, f"Bearer {forged}")).reason is reason


async def test_deleted_user_is_refused(verifier: FirebaseVerifier, emulator: Emulator,
                                       user: SignedUp) -> None:
    assert (await verifier.verify(f"Bearer {user.token}")).uid == user.uid
    emu.delete_user(emulator.host, emulator.port, emulator.project_id, user.uid)
    assert (await refused(verifier, f"Bearer {user.token}")).reason is Reason.UNKNOWN_USER


async def test_disabled_user_is_refused(verifier: FirebaseVerifier, emulator: Emulator,
                                        user: SignedUp) -> None:
    emu.disable_user(emulator.host, emulator.port, emulator.project_id, user.uid)
    assert (await refused(verifier, f"Bearer {user.token}")).reason is Reason.USER_DISABLED
    emu.disable_user(emulator.host, emulator.port, emulator.project_id, user.uid, disabled=False)
    assert (await verifier.verify(f"Bearer {user.token}")).uid == user.uid


async def test_revoked_token_is_refused(verifier: FirebaseVerifier, emulator: Emulator,
                                        user: SignedUp) -> None:
    issued_at = int(emu.decode_unsigned(user.token)[1]["iat"])
    emu.revoke_tokens(emulator.host, emulator.port, emulator.project_id, user.uid, issued_at + 1)
    assert (await refused(verifier, f"Bearer {user.token}")).reason is Reason.REVOKED


async def test_several_projects_and_clear_accounts(emulator: Emulator, user: SignedUp) -> None:
    """A second verifier, for another project, in the same process; clear_accounts wipes only
    that project."""
    other = f"demo-geofence-other-{uuid.uuid4().hex[:8]}"
    email = f"{uuid.uuid4().hex[:8]}@example.com"
    uid = emu.create_user(emulator.host, emulator.port, other, email, "secret123")
    # Emulator sign-in only serves its default project: the other project's token is forged,
    # which emulator mode accepts for an existing uid (see above). Issued now, not when `user`
    # signed up: a token issued before the new user's creation second counts as revoked.
    now = int(time.time())
    token = emu.forged_token(user.token, aud=other, iss=f"https://securetoken.google.com/{other}",
                             sub=uid, user_id=uid, email=email, iat=now, auth_time=now, exp=now + 3600)
    second = FirebaseVerifier(other, emulator.address)
    try:
        assert (await second.verify(f"Bearer {token}")).uid == uid
        emu.clear_accounts(emulator.host, emulator.port, other)
        assert (await refused(second, f"Bearer {token}")).reason is Reason.UNKNOWN_USER
    finally:
        second.close()
    assert (await verified_uid(emulator, user)) == user.uid  # the default project is untouched


async def verified_uid(emulator: Emulator, user: SignedUp) -> str:
    verifier = FirebaseVerifier(emulator.project_id, emulator.address)
    try:
        return (await verifier.verify(f"Bearer {user.token}")).uid
    finally:
        verifier.close()


async def test_unreachable_emulator_is_unavailable(emulator: Emulator, user: SignedUp,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    closed = f"{emulator.host}:1"
    monkeypatch.setenv(EMULATOR_HOST_ENV, closed)
    unreachable = FirebaseVerifier(emulator.project_id, closed)
    try:
        error = await refused(unreachable, f"Bearer {user.token}")
    finally:
        unreachable.close()
    assert isinstance(error, AuthUnavailable) and error.reason is Reason.UNAVAILABLE
