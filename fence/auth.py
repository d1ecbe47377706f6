"""Authentication of API users with Firebase ID tokens (`Authorization: Bearer <token>`).

`FirebaseVerifier.verify(header)` returns the `User` a valid token belongs to, or raises
`Unauthenticated` with a `Reason` a client can be told (HTTP 401). A verifier owns its own named
firebase_admin App (never the default one), so several verifiers, for several projects, can live
in one process. Nothing is read at import time: `FirebaseVerifier.from_env()` reads the
environment when it is called.

What firebase-admin 7.x checks (read in firebase_admin/_token_gen.py, `_JWTVerifier.verify`,
and _auth_client.py, `Client.verify_id_token`; pinned by tests/unit/test_auth.py):

- Real mode (FIREBASE_AUTH_EMULATOR_HOST unset): the header must carry a `kid` and `alg` RS256;
  `aud` must be the project id and `iss` https://securetoken.google.com/<project>; `sub` a
  non-empty string of at most 128 characters; then google.oauth2.id_token.verify_token checks the
  RS256 signature against Google's public certificates (fetched over HTTPS from
  googleapis.com/robot/v1/metadata/x509/securetoken@system.gserviceaccount.com, cached per
  their Cache-Control) and `iat` / `exp` against the clock (with clock_skew_seconds).
- Emulator mode (FIREBASE_AUTH_EMULATOR_HOST set, read from os.environ at *every* call by
  `_auth_utils.is_emulated()`): the payload is decoded with `verify=False` and returned as is
  after the `aud` / `iss` / `sub` checks. There is NO signature check (the emulator issues
  `alg: none` tokens with an empty signature), no `kid` / `alg` check and, easy to miss, NO
  `exp` / `iat` check either: an expired emulator token is accepted by firebase-admin.
- check_revoked=True (both modes) then looks the uid up (`get_user`, in the emulator's REST API
  in emulator mode): an unknown uid raises UserNotFoundError, a disabled user UserDisabledError,
  and a token whose `iat` is before the user's validSince (tokens revoked) RevokedIdTokenError.

So in emulator mode a forged token is refused if it names an unknown uid, names another
project in `aud` / `iss`, is revoked / for a disabled user, (thanks to the checks below, not to
firebase-admin) is expired or issued in the future, or carries a custom claim or an email its
user's record does not hold (`check_against_record`: the lookup is made in emulator mode
whatever check_revoked says; a forged `geofence_operator` claim is refused). What it CANNOT
detect is a token that copies another existing user's uid and record exactly: without a
signature nothing proves who made it. That is the price of an emulator that needs no keys, and
why the emulator must never be configured in production (SECURITY.md). In real mode the RS256
signature catches every tampering (tests/unit/test_auth_signed.py proves it with a local key).

What this module adds, and why:

- Before firebase-admin, the claims are checked here on the *unverified* payload (`aud`, `iss`,
  `sub`, `exp`, `iat`, in firebase-admin's order): this gives stable, precise reasons instead of
  parsing firebase-admin's messages, refuses bad tokens without a thread hop or a user lookup,
  and enforces `exp` / `iat` in emulator mode too. It never loosens anything: firebase-admin
  still runs all its own checks afterwards. Nothing in the unverified payload is trusted for
  identity; the `User` is built only from the claims firebase-admin returns.
- The mode is an invariant checked at construction and before every verification: a verifier
  built for the emulator requires FIREBASE_AUTH_EMULATOR_HOST to hold its emulator host, and a
  real-mode verifier refuses to run while the variable is set (firebase-admin would silently skip
  signature checks). Because firebase-admin reads the variable process-wide, emulator and real
  verifiers cannot be mixed in one process; a mismatch is a `FirebaseConfigError` (a server
  fault, HTTP 500), never a silent downgrade. The environment is never modified here.
- Failures that are not the token's fault (Google's certificates or the emulator unreachable,
  the backend refusing our credentials) raise `AuthUnavailable`, a subclass of
  `Unauthenticated`: code that catches `Unauthenticated` still fails closed, and the HTTP layer
  can answer 503 instead of telling a legitimate user that their token is bad.
- Error details never contain the token (it is a credential and ends up in logs).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import firebase_admin
import google.auth.exceptions
from firebase_admin import auth as fb_auth
from firebase_admin import credentials as fb_credentials
from firebase_admin import exceptions as fb_exceptions

from exchanges import settings_registry

EMULATOR_HOST_ENV = "FIREBASE_AUTH_EMULATOR_HOST"
# The project-specific variable wins over Google's generic one.
PROJECT_ENV_VARS = ("GEOFENCE_FIREBASE_PROJECT", "GOOGLE_CLOUD_PROJECT")
CREDENTIALS_ENV = "GOOGLE_APPLICATION_CREDENTIALS"
ISSUER_PREFIX = "https://securetoken.google.com/"
# The audience of a custom token (minted by a backend, to be exchanged for an ID token).
CUSTOM_TOKEN_AUDIENCE = (
    "https://identitytoolkit.googleapis.com/google.identity.identitytoolkit.v1.IdentityToolkit"
)
# ID tokens are about 1 KB; custom claims are capped at 1000 bytes by Firebase. The bound only
# keeps a hostile header from costing decoding work.
MAX_TOKEN_LENGTH = 8192
MAX_UID_LENGTH = 128
MAX_CLOCK_SKEW = 60  # firebase-admin refuses more
DEFAULT_HTTP_TIMEOUT = 10.0  # firebase-admin's default (120 s) is far too long on a request path


class Reason(StrEnum):
    """Why a request is not authenticated; safe to show to the client."""

    MISSING_HEADER = "missing Authorization header"
    NOT_BEARER = "Authorization header is not a Bearer token"
    MALFORMED = "malformed token"
    EXPIRED = "token expired"
    NOT_YET_VALID = "token issued in the future"
    CUSTOM_TOKEN = "a custom token, not an ID token"
    WRONG_AUDIENCE = "token is for another Firebase project (audience)"
    WRONG_ISSUER = "token has a wrong issuer"
    INVALID = "invalid token (signature or format)"
    REVOKED = "token revoked"
    USER_DISABLED = "user disabled"
    UNKNOWN_USER = "unknown user"
    NOT_THE_RECORD = "the token's claims are not the user's (forged)"
    UNAVAILABLE = "authentication service unavailable"


class Unauthenticated(Exception):
    """The request carries no valid Firebase ID token. `reason` is stable, `detail` explains."""

    def __init__(self, reason: Reason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else str(reason))
        self.reason = reason
        self.detail = detail


class AuthUnavailable(Unauthenticated):
    """The token could not be checked (certificates, emulator or backend unreachable or
    refusing us). Still an `Unauthenticated` (fail closed), but worth a 503, not a 401."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(Reason.UNAVAILABLE, detail)


class FirebaseConfigError(RuntimeError):
    """The verifier and the process environment disagree, or a setting is missing."""


@dataclass(frozen=True)
class User:
    """An authenticated API user. The platform stores only `uid` (the Firebase user id)."""

    uid: str
    email: str | None
    # Every verified claim (custom claims included). Excluded from the hash so a User can key a
    # dict; equal users still have equal hashes.
    claims: dict[str, Any] = field(hash=False)


def bearer_token(authorization_header: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive)."""
    if authorization_header is None or not authorization_header.strip():
        raise Unauthenticated(Reason.MISSING_HEADER)
    scheme, _, token = authorization_header.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise Unauthenticated(Reason.NOT_BEARER, f"scheme {_short(scheme)}")
    token = token.strip()
    if not token:
        raise Unauthenticated(Reason.MALFORMED, "empty bearer token")
    if len(token) > MAX_TOKEN_LENGTH:
        raise Unauthenticated(Reason.MALFORMED, f"token longer than {MAX_TOKEN_LENGTH} characters")
    if any(c.isspace() for c in token):
        raise Unauthenticated(Reason.MALFORMED, "whitespace inside the token")
    return token


def unverified_claims(token: str) -> dict[str, Any]:
    """The payload of a JWT, decoded WITHOUT any verification (for early refusal only)."""
    parts = token.split(".")
    if len(parts) != 3:
        raise Unauthenticated(Reason.MALFORMED, f"a JWT has 3 segments, not {len(parts)}")
    header, payload = (_b64_json(part) for part in parts[:2])
    if header is None or payload is None:
        raise Unauthenticated(Reason.MALFORMED, "header or payload is not base64url JSON object")
    return payload


def check_claims(claims: Mapping[str, Any], project_id: str, now: float, clock_skew: int = 0) -> None:
    """Refuse claims firebase-admin would refuse, plus `exp` / `iat`, which it does not check in
    emulator mode. Same order as firebase-admin: audience, issuer, subject, then time."""
    audience = claims.get("aud")
    if audience == CUSTOM_TOKEN_AUDIENCE:
        raise Unauthenticated(Reason.CUSTOM_TOKEN, "exchange it for an ID token first")
    if audience != project_id:
        raise Unauthenticated(Reason.WRONG_AUDIENCE, f"got {_short(audience)}, expected {project_id!r}")
    issuer = claims.get("iss")
    if issuer != ISSUER_PREFIX + project_id:
        raise Unauthenticated(Reason.WRONG_ISSUER,
                              f"got {_short(issuer)}, expected {ISSUER_PREFIX + project_id!r}")
    subject = claims.get("sub")
    if not isinstance(subject, str) or not 0 < len(subject) <= MAX_UID_LENGTH:
        raise Unauthenticated(Reason.MALFORMED, f"subject must be 1 to {MAX_UID_LENGTH} characters")
    expires, issued = _number(claims.get("exp")), _number(claims.get("iat"))
    if expires is None or issued is None:
        raise Unauthenticated(Reason.MALFORMED, "exp and iat must be numbers")
    # Same comparisons as google.auth.jwt._verify_iat_and_exp, which real mode runs too.
    if now > expires + clock_skew:
        raise Unauthenticated(Reason.EXPIRED, f"expired {int(now - expires)} s ago")
    if issued > now + clock_skew:
        raise Unauthenticated(Reason.NOT_YET_VALID, f"issued {int(issued - now)} s ahead of our clock")


def error_from_firebase(exc: Exception, token: str = "") -> Unauthenticated:
    """The `Unauthenticated` for an exception raised by firebase_admin.auth.verify_id_token.
    Subclasses are matched before their bases (ExpiredIdTokenError is an InvalidIdTokenError,
    UserNotFoundError a NotFoundError...)."""
    detail = _scrub(str(exc), token)
    if isinstance(exc, fb_auth.ExpiredIdTokenError):
        return Unauthenticated(Reason.EXPIRED, detail)
    if isinstance(exc, fb_auth.RevokedIdTokenError):
        return Unauthenticated(Reason.REVOKED, detail)
    if isinstance(exc, fb_auth.UserDisabledError):
        return Unauthenticated(Reason.USER_DISABLED, detail)
    if isinstance(exc, fb_auth.UserNotFoundError):
        return Unauthenticated(Reason.UNKNOWN_USER, detail)
    if isinstance(exc, fb_auth.CertificateFetchError):
        return AuthUnavailable(f"cannot fetch Google's public certificates: {detail}")
    if isinstance(exc, fb_auth.InvalidIdTokenError):
        # check_claims() already refused what firebase-admin reports as wrong "aud" / "iss";
        # these matches on its (7.x) messages only sharpen the reason should that ever change.
        if '"aud"' in detail:
            return Unauthenticated(Reason.WRONG_AUDIENCE, detail)
        if '"iss"' in detail:
            return Unauthenticated(Reason.WRONG_ISSUER, detail)
        if "custom token" in detail:
            return Unauthenticated(Reason.CUSTOM_TOKEN, detail)
        return Unauthenticated(Reason.INVALID, detail)
    if isinstance(exc, fb_exceptions.InvalidArgumentError):
        return Unauthenticated(Reason.INVALID, detail)  # TenantIdMismatchError and kin
    if isinstance(exc, fb_exceptions.NotFoundError):
        return Unauthenticated(Reason.UNKNOWN_USER, detail)
    if isinstance(exc, fb_exceptions.FirebaseError):
        # Unavailable, DeadlineExceeded, PermissionDenied (our credentials), Unknown...: the
        # backend failed us, the token is not known to be bad.
        return AuthUnavailable(f"{type(exc).__name__}: {detail}")
    if isinstance(exc, google.auth.exceptions.GoogleAuthError):
        return AuthUnavailable(f"our Google credentials failed: {type(exc).__name__}: {detail}")
    if isinstance(exc, ValueError):
        return Unauthenticated(Reason.MALFORMED, detail)  # empty token and other argument errors
    raise TypeError(f"not a firebase_admin verification error: {type(exc).__name__}") from exc


class FirebaseVerifier:
    """Verifies Firebase ID tokens for one project, with its own named firebase_admin App.

    emulator_host ("host:port") selects emulator mode and must equal FIREBASE_AUTH_EMULATOR_HOST
    (see the module docstring). In real mode, credentials_path is a service account JSON file
    of the project (Application Default Credentials without it), resolved at construction.
    check_revoked (default True) refuses tokens of deleted, disabled or revoked users at the
    cost of one user lookup per verification (an HTTP call, to Google or the emulator).
    certificates_url (real mode): where the public keys that sign ID tokens are fetched
    ({kid: PEM certificate}, Google's format), instead of Google's.
    """

    def __init__(
        self,
        project_id: str,
        emulator_host: str | None = None,
        *,
        check_revoked: bool = True,
        clock_skew_seconds: int = 0,
        credentials_path: Path | None = None,
        http_timeout: float = DEFAULT_HTTP_TIMEOUT,
        clock: Callable[[], float] = time.time,
        certificates_url: str | None = None,
    ) -> None:
        if not project_id:
            raise FirebaseConfigError("a Firebase project id is required")
        if emulator_host is not None and (not emulator_host or "/" in emulator_host):
            raise FirebaseConfigError(f"emulator host must be host:port, not {emulator_host!r}")
        if not 0 <= clock_skew_seconds <= MAX_CLOCK_SKEW:
            raise FirebaseConfigError(f"clock_skew_seconds must be within 0..{MAX_CLOCK_SKEW}")
        self.project_id = project_id
        self.emulator_host = emulator_host
        self.check_revoked = check_revoked
        self.clock_skew_seconds = clock_skew_seconds
        self._clock = clock
        self.check_mode()
        # Emulator mode never uses the app's credential (firebase-admin talks to the emulator
        # with a fake "owner" token), so the lazy ApplicationDefault is never resolved there.
        credential = (fb_credentials.ApplicationDefault() if self.emulated
                      else _real_credential(credentials_path))
        self._app: Any = firebase_admin.initialize_app(
            credential,
            options={"projectId": project_id, "httpTimeout": http_timeout},
            name=f"geofence-auth-{uuid.uuid4().hex}",
        )
        self._closed = False
        if certificates_url is not None:  # real mode, keys other than Google's (a mirror, a test)
            if self.emulated:
                raise FirebaseConfigError("certificates_url is for real mode: the emulator signs nothing")
            _id_token_verifier(self._app).cert_url = certificates_url

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, check_revoked: bool = True,
                 ) -> FirebaseVerifier:
        """From GEOFENCE_FIREBASE_PROJECT (or GOOGLE_CLOUD_PROJECT), FIREBASE_AUTH_EMULATOR_HOST
        and, in real mode, GOOGLE_APPLICATION_CREDENTIALS. `environ` defaults to os.environ."""
        env = os.environ if environ is None else environ
        project_id = next((env[name] for name in PROJECT_ENV_VARS if env.get(name)), "")
        if not project_id:
            raise FirebaseConfigError(f"set {' or '.join(PROJECT_ENV_VARS)} to the Firebase project id")
        emulator_host = env.get(EMULATOR_HOST_ENV) or None
        credentials = env.get(CREDENTIALS_ENV) if emulator_host is None else None
        return cls(project_id, emulator_host, check_revoked=check_revoked,
                   credentials_path=Path(credentials) if credentials else None)

    @property
    def emulated(self) -> bool:
        return self.emulator_host is not None

    def check_mode(self) -> None:
        """Raise FirebaseConfigError unless os.environ puts firebase-admin in this verifier's mode."""
        current = settings_registry.read(EMULATOR_HOST_ENV) or ""
        if self.emulator_host is None and current:
            raise FirebaseConfigError(
                f"{EMULATOR_HOST_ENV}={current} is set: firebase-admin would skip signature checks; "
                "refusing to verify tokens for a real project")
        if self.emulator_host is not None and current != self.emulator_host:
            raise FirebaseConfigError(
                f"verifier built for the Auth emulator at {self.emulator_host}, but "
                f"{EMULATOR_HOST_ENV}={current or '(unset)'}; firebase-admin reads only the variable")

    async def verify(self, authorization_header: str | None) -> User:
        """The user of a valid `Bearer` ID token; raises Unauthenticated (or AuthUnavailable)."""
        if self._closed:
            raise RuntimeError("verifier is closed")
        self.check_mode()
        token = bearer_token(authorization_header)
        check_claims(unverified_claims(token), self.project_id, self._clock(), self.clock_skew_seconds)
        # verify_id_token blocks (certificate fetch, user lookup over HTTP): off the event loop.
        claims = await asyncio.to_thread(self._verify_blocking, token)
        return user_from_claims(claims)

    def _verify_blocking(self, token: str) -> dict[str, Any]:
        emulated = self.emulated
        try:
            claims: dict[str, Any] = fb_auth.verify_id_token(
                token, app=self._app, check_revoked=self.check_revoked and not emulated,
                clock_skew_seconds=self.clock_skew_seconds)
            if emulated:  # unsigned: what it says is checked against the user's record
                check_against_record(claims, fb_auth.get_user(claims["uid"], app=self._app))
        except (fb_exceptions.FirebaseError, google.auth.exceptions.GoogleAuthError, ValueError) as exc:
            raise error_from_firebase(exc, token) from None  # the cause would carry the token
        return claims

    def close(self) -> None:
        """Delete the verifier's firebase_admin App. Idempotent."""
        if not self._closed:
            self._closed = True
            firebase_admin.delete_app(self._app)


def _id_token_verifier(app: Any) -> Any:
    """firebase-admin's verifier of ID tokens of `app` (private: tests/unit/test_auth_signed.py
    fails loudly if a release moves it)."""
    verifier = fb_auth._get_client(app)._token_verifier.id_token_verifier
    if not isinstance(getattr(verifier, "cert_url", None), str):
        raise FirebaseConfigError("this firebase-admin keeps its certificate URL elsewhere")
    return verifier


def _real_credential(credentials_path: Path | None) -> Any:
    """The credential of a real-mode app, resolved now. firebase-admin needs one to build its
    auth client even when only signatures are checked (those use Google's public certificates);
    check_revoked's user lookup needs its permissions. Resolving it here makes a missing or bad
    credential fail at start-up instead of on every request (for Application Default
    Credentials on Google Cloud this may ask the metadata server, once)."""
    try:
        credential: Any = (fb_credentials.ApplicationDefault() if credentials_path is None
                           else fb_credentials.Certificate(str(credentials_path)))
        credential.get_credential()
    except (google.auth.exceptions.GoogleAuthError, ValueError, OSError) as exc:
        where = credentials_path or "Application Default Credentials"
        raise FirebaseConfigError(
            f"no usable Google credentials ({where}): {exc}; set {CREDENTIALS_ENV} to a service "
            "account JSON file of the Firebase project") from exc
    return credential


# the claims Firebase puts in every ID token; any other is a custom claim of the user's record
STANDARD_CLAIMS = frozenset({"iss", "aud", "auth_time", "user_id", "sub", "iat", "exp", "email",
                             "email_verified", "firebase", "uid", "name", "picture", "phone_number"})


def check_against_record(claims: Mapping[str, Any], user: Any) -> None:
    """An emulator token's claims, which nobody signed, held against the user's record (the
    lookup the revocation check makes anyway): disabled or revoked as firebase-admin would say;
    a custom claim the record does not hold with the same value (a forged `geofence_operator`),
    or another email, refused. A token may lack a claim the record holds (it was issued
    before the claim was set): that only ever gives less."""
    if user.disabled:
        raise Unauthenticated(Reason.USER_DISABLED)
    iat = _number(claims.get("iat"))
    if iat is None or iat * 1000 < (user.tokens_valid_after_timestamp or 0):
        raise Unauthenticated(Reason.REVOKED)
    held = user.custom_claims or {}
    for key in claims.keys() - STANDARD_CLAIMS:
        if key not in held or held[key] != claims[key]:
            raise Unauthenticated(Reason.NOT_THE_RECORD, f"claim {_short(key, 40)}")
    if "email" in claims and claims["email"] != user.email:
        raise Unauthenticated(Reason.NOT_THE_RECORD, "email")


def user_from_claims(claims: Mapping[str, Any]) -> User:
    uid = claims.get("uid", claims.get("sub"))
    if not isinstance(uid, str) or not uid:
        raise Unauthenticated(Reason.MALFORMED, "no user id in the verified claims")
    email = claims.get("email")
    return User(uid=uid, email=email if isinstance(email, str) else None, claims=dict(claims))


def _b64_json(segment: str) -> dict[str, Any] | None:
    try:
        value = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    except (binascii.Error, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return value if isinstance(value, dict) else None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _short(value: object, limit: int = 80) -> str:
    """repr() of an attacker-controlled value, bounded for messages and logs."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _scrub(message: str, token: str) -> str:
    # firebase-admin puts the token in some messages ("Illegal ID token provided: b'...'").
    return message.replace(token, "<token>") if token else message
