"""fence.auth in production (real) mode with real RS256 signatures: a local key signs ID tokens,
its certificate is served over HTTP on loopback in Google's format ({kid: PEM}), and the
verifier's key set points at it (`certificates_url`). Signatures are enforced: a token signed
by the key passes, with its claims; one tampered with after signing, signed by another key
under the same kid, unsigned, of an unknown kid or expired is refused."""

from __future__ import annotations

import base64
import datetime as dt
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from deploy.firebase_emulator import encode_unsigned
from fence import auth
from fence.auth import FirebaseConfigError, FirebaseVerifier, Reason, Unauthenticated
from tests.unit.service_accounts import service_account_file

PROJECT = "demo-signed"
KID = "local-key-1"
NOW = dt.datetime.now(dt.UTC).timestamp()


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed(key: rsa.RSAPrivateKey, payload: dict[str, Any], kid: str = KID) -> str:
    head = b64(json.dumps({"alg": "RS256", "kid": kid, "typ": "JWT"}).encode())
    body = b64(json.dumps(payload).encode())
    signature = key.sign(f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{head}.{body}.{b64(signature)}"


def claims(**changes: Any) -> dict[str, Any]:
    base = {"iss": f"https://securetoken.google.com/{PROJECT}", "aud": PROJECT, "sub": "uid-1",
            "user_id": "uid-1", "email": "a@example.com", "auth_time": int(NOW) - 20,
            "iat": int(NOW) - 10, "exp": int(NOW) + 3590}
    return base | changes


def certificate(key: rsa.RSAPrivateKey) -> str:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "securetoken test")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=1)).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


@pytest.fixture(scope="module")
def key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def key_set(key: rsa.RSAPrivateKey) -> Iterator[str]:
    """The key set on loopback, as Google serves it (with a Cache-Control firebase-admin reads)."""
    body = json.dumps({KID: certificate(key)}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Cache-Control", "public, max-age=3600")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/certs"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def service_account(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return service_account_file(tmp_path_factory.mktemp("sa"), PROJECT)


@pytest.fixture
def verifier(monkeypatch: pytest.MonkeyPatch, service_account: Path, key_set: str
             ) -> Iterator[FirebaseVerifier]:
    monkeypatch.delenv(auth.EMULATOR_HOST_ENV, raising=False)
    # check_revoked off: its lookup would ask Google for the user; the signature is the point here
    v = FirebaseVerifier(PROJECT, credentials_path=service_account, check_revoked=False,
                         certificates_url=key_set)
    try:
        yield v
    finally:
        v.close()


async def test_a_token_signed_by_the_key_passes_with_its_claims(verifier: FirebaseVerifier,
                                                                key: rsa.RSAPrivateKey) -> None:
    user = await verifier.verify("Bearer " + signed(key, claims(geofence_operator=True)))
    assert user.uid == "uid-1" and user.email == "a@example.com" and user.claims["geofence_operator"] is True


async def test_a_token_tampered_with_after_signing_is_refused(verifier: FirebaseVerifier,
                                                              key: rsa.RSAPrivateKey) -> None:
    head, _, signature = signed(key, claims()).split(".")
    forged_body = b64(json.dumps(claims(geofence_operator=True)).encode())  # the operator claim added
    with pytest.raises(Unauthenticated) as info:
        await verifier.verify(f"Bearer {head}.{forged_body}.{signature}")
    assert info.value.reason is Reason.INVALID


async def test_another_key_under_the_same_kid_is_refused(verifier: FirebaseVerifier) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(Unauthenticated) as info:
        await verifier.verify("Bearer " + signed(other, claims(sub="uid-victim", user_id="uid-victim")))
    assert info.value.reason is Reason.INVALID


@pytest.mark.parametrize("header", [{"alg": "none", "kid": KID}, {"alg": "HS256", "kid": KID},
                                    {"alg": "RS256"}])
async def test_an_unsigned_or_differently_signed_token_is_refused(verifier: FirebaseVerifier,
                                                                  header: dict[str, str]) -> None:
    with pytest.raises(Unauthenticated) as info:
        await verifier.verify("Bearer " + encode_unsigned(claims(), header))
    assert info.value.reason is Reason.INVALID


async def test_a_token_of_an_unknown_kid_is_refused(verifier: FirebaseVerifier,
                                                    key: rsa.RSAPrivateKey) -> None:
    with pytest.raises(Unauthenticated) as info:
        await verifier.verify("Bearer " + signed(key, claims(), kid="not-in-the-set"))
    assert info.value.reason is Reason.INVALID


async def test_an_expired_signed_token_is_refused(verifier: FirebaseVerifier, key: rsa.RSAPrivateKey) -> None:
    with pytest.raises(Unauthenticated) as info:
        await verifier.verify("Bearer " + signed(key, claims(iat=int(NOW) - 7200, exp=int(NOW) - 3600)))
    assert info.value.reason is Reason.EXPIRED


def test_the_emulator_takes_no_key_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(auth.EMULATOR_HOST_ENV, "127.0.0.1:1")
    with pytest.raises(FirebaseConfigError, match="real mode"):
        FirebaseVerifier(PROJECT, "127.0.0.1:1", certificates_url="http://127.0.0.1:1/certs")
