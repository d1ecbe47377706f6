"""The local stack's certificates (issue 37): a private CA under the state dir and one server
certificate for every TLS listener of the host (AMQPS, MQTTS, the API's HTTPS, PostgreSQL),
made once by `geofence up` and renewed 30 days before it expires or when the names it must
carry change. With GEOFENCE_TLS_DIR, an operator's own `ca.pem`, `server.pem` and `server.key`
are used as they are (nothing is made).

Each server reads its own copy of the key, owned by its user (RabbitMQ's `rabbitmq`,
PostgreSQL's `postgres`, which refuses a key others can read); clients trust `ca.pem` only.

Trade-off: a private CA means every client outside the host needs `ca.pem` (devices, gateways,
applications, browsers): the README says where it is; an operator with a public certificate
sets GEOFENCE_TLS_DIR instead.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
SERVER_DAYS = 397  # what browsers accept for a server certificate
RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # what clients trust
    cert: Path  # the server certificate (chain: itself, signed by ca)
    key: Path  # its key (root's copy; servers get their own: `copy_key`)

    @property
    def dir(self) -> Path:
        return self.cert.parent


def server_names(host: str) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) a server certificate of this host carries: the host name,
    localhost, loopback, GEOFENCE_HOST."""
    dns = sorted({socket.gethostname(), "localhost"})
    ips = {"127.0.0.1", "::1"}
    try:
        ipaddress.ip_address(host)
        if host not in ("0.0.0.0", "::"):
            ips.add(host)
    except ValueError:
        dns = sorted({*dns, host})
    return dns, sorted(ips)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def make_ca(directory: Path, now: dt.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"geofence local CA ({socket.gethostname()})")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         key_cert_sign=True, crl_sign=True, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write(directory / "ca.key", _pem_key(key), 0o600)
    _write(directory / "ca.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return cert, key


def make_server(directory: Path, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, host: str,
                now: dt.datetime) -> None:
    dns, ips = server_names(host)
    key = _key()
    sans: list[x509.GeneralName] = [*(x509.DNSName(d) for d in dns),
                                    *(x509.IPAddress(ipaddress.ip_address(i)) for i in ips)]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns[0])])
    cert = (x509.CertificateBuilder().subject_name(subject)
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=SERVER_DAYS))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write(directory / "server.key", _pem_key(key), 0o600)
    _write(directory / "server.pem", cert.public_bytes(serialization.Encoding.PEM), 0o644)


def _current(directory: Path, host: str, now: dt.datetime) -> bool:
    """The server certificate exists, is signed by this CA, is valid beyond RENEW_BEFORE and
    carries the names it must."""
    try:
        cert = x509.load_pem_x509_certificate((directory / "server.pem").read_bytes())
        ca = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
        (directory / "server.key").stat()
    except (FileNotFoundError, ValueError):
        return False
    if cert.issuer != ca.subject or cert.not_valid_after_utc - now < RENEW_BEFORE:
        return False
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns, ips = server_names(host)
    have_ips = {str(i) for i in sans.get_values_for_type(x509.IPAddress)}
    return set(dns) <= set(sans.get_values_for_type(x509.DNSName)) and set(ips) <= have_ips


def ensure(state_dir: Path, host: str, own_dir: Path | None = None,
           now: dt.datetime | None = None) -> TlsFiles:
    """The CA and server certificate (made or renewed as needed), or the operator's own."""
    if own_dir is not None:
        files = TlsFiles(own_dir / "ca.pem", own_dir / "server.pem", own_dir / "server.key")
        missing = [p.name for p in (files.ca, files.cert, files.key) if not p.exists()]
        if missing:
            raise FileNotFoundError(f"GEOFENCE_TLS_DIR={own_dir} lacks {', '.join(missing)}")
        return files
    now = now or dt.datetime.now(dt.UTC)
    directory = state_dir / "tls"
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        ca = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
        ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        if ca.not_valid_after_utc - now < RENEW_BEFORE:
            raise ValueError("the CA expires")
    except (FileNotFoundError, ValueError, AssertionError):
        ca, ca_key = make_ca(directory, now)
        (directory / "server.pem").unlink(missing_ok=True)
    if not _current(directory, host, now):
        make_server(directory, ca, ca_key, host, now)
    return TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")


def copy_key(files: TlsFiles, owner: str, directory: Path) -> TlsFiles:
    """A server's own copy of the certificate and key, owned by `owner` (mode 600): returns
    where they are. Copied again when they differ."""
    directory.mkdir(mode=0o750, parents=True, exist_ok=True)
    out = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    pairs = ((files.ca, out.ca, 0o644), (files.cert, out.cert, 0o644), (files.key, out.key, 0o600))
    for src, dst, mode in pairs:
        data = src.read_bytes()
        if not dst.exists() or dst.read_bytes() != data:
            _write(dst, data, mode)
        shutil.chown(dst, owner, owner)
        os.chmod(dst, mode)
    shutil.chown(directory, owner, owner)
    return out
