"""deploy/tls.py without a server: the local CA and the server certificate (the names it
carries, a client that trusts the CA accepts it, renewal), and the federation links' URIs
(plain on loopback, AMQPS with the peer checked across hosts)."""

from __future__ import annotations

import datetime as dt
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509

from deploy import tls
from deploy.rabbitmq import definitions as d


def test_the_server_certificate_carries_the_hosts_names(tmp_path: Path) -> None:
    files = tls.ensure(tmp_path, "10.1.2.3")
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", socket.gethostname()} <= set(sans.get_values_for_type(x509.DNSName))
    assert {str(i) for i in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1", "10.1.2.3"}
    for key in (files.key, tmp_path / "tls" / "ca.key"):
        assert key.stat().st_mode & 0o777 == 0o600


def test_a_client_trusting_the_ca_completes_a_handshake(tmp_path: Path) -> None:
    files = tls.ensure(tmp_path, "127.0.0.1")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(files.cert, files.key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        conn, _ = listener.accept()
        try:
            with server.wrap_socket(conn, server_side=True) as s:
                s.recv(1)
        except OSError:
            pass

    threading.Thread(target=serve, daemon=True).start()
    client = ssl.create_default_context(cafile=str(files.ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            client.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        assert s.version() in ("TLSv1.3", "TLSv1.2")
    listener.close()
    with pytest.raises(ssl.SSLCertVerificationError):  # the system's CAs do not know it
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        threading.Thread(target=serve, daemon=True).start()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            ssl.create_default_context().wrap_socket(raw, server_hostname="127.0.0.1")
    listener.close()


def test_kept_while_current_renewed_when_near_its_end_or_the_names_change(tmp_path: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    first = tls.ensure(tmp_path, "127.0.0.1", now=now).cert.read_bytes()
    assert tls.ensure(tmp_path, "127.0.0.1", now=now + dt.timedelta(days=30)).cert.read_bytes() == first
    late = now + dt.timedelta(days=tls.SERVER_DAYS - 10)
    renewed = tls.ensure(tmp_path, "127.0.0.1", now=late).cert.read_bytes()
    assert renewed != first
    assert tls.ensure(tmp_path, "10.9.9.9", now=late).cert.read_bytes() != renewed


def test_an_operators_own_directory_is_used_as_it_is(tmp_path: Path) -> None:
    made = tls.ensure(tmp_path / "made", "127.0.0.1")
    own = tmp_path / "own"
    own.mkdir()
    for f in (made.ca, made.cert, made.key):
        (own / f.name).write_bytes(f.read_bytes())
    assert tls.ensure(tmp_path / "state", "127.0.0.1", own_dir=own).cert == own / "server.pem"
    assert not (tmp_path / "state" / "tls").exists()
    (own / "server.key").unlink()
    with pytest.raises(FileNotFoundError, match=r"server\.key"):
        tls.ensure(tmp_path / "state", "127.0.0.1", own_dir=own)


def test_federation_links_use_tls_across_hosts() -> None:
    local = d.amqp_uri(d.Endpoint("127.0.0.1", 5672, 5671, "/s/ca.pem"), "federation", "p w", "gf-region-a")
    assert local == "amqp://federation:p%20w@127.0.0.1:5672/gf-region-a"
    remote = d.amqp_uri(d.Endpoint("10.0.0.7", 5672, 5671, "/s/ca.pem"), "federation", "pw", "gf-region-a")
    assert remote == ("amqps://federation:pw@10.0.0.7:5671/gf-region-a?cacertfile=/s/ca.pem&verify=verify_peer"
                      "&server_name_indication=10.0.0.7")
