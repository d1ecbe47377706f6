"""A lean MQTT 3.1.1 load generator for the benchmarks: QoS 1 publishes encoded up front and
written many per socket write, PUBACKs counted by a reader thread.

Why: paho-mqtt spends ~250 us of CPU per publish in Python. On this two-core machine the
benchmark's own publishers then took half the CPU, and every MQTT figure (the bare broker's
and the pipeline's alike) said more about paho than about the broker or the pipeline. Devices
run elsewhere in production; this publisher costs a few microseconds a message, so the
figures are the broker's and the pipeline's. `bench.e2e --mode mqtt --paho` keeps paho for a
run as a device library would drive it.

What it does of MQTT: CONNECT (clean session, user name and password; TLS with a CA file when
given), waits for an accepted CONNACK, PUBLISH QoS 1 with packet ids 1..65535 (at most
`window` unacknowledged: an id is reused only once its PUBACK came), DISCONNECT once every
PUBACK came. Nothing else (no subscribe, no QoS 2, no will).
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
import time
from collections.abc import Sequence

import numpy as np

WINDOW = 8000  # publishes without a PUBACK yet
CHUNK = 256  # publishes per socket write (fewer when paced)


def _remaining_length(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack(">H", len(raw)) + raw


def connect_packet(client_id: str, username: str, password: str, keepalive: int = 60) -> bytes:
    body = _string("MQTT") + bytes((4, 0xC2)) + struct.pack(">H", keepalive)  # level 4; user, password, clean
    body += _string(client_id) + _string(username) + _string(password)
    return b"\x10" + _remaining_length(len(body)) + body


def publish_packet(topic: str, payload: bytes, packet_id: int) -> bytes:
    body = _string(topic) + struct.pack(">H", packet_id) + payload
    return b"\x32" + _remaining_length(len(body)) + body  # PUBLISH, QoS 1


class Publisher:
    """One MQTT connection publishing QoS 1; `acked` counts the PUBACKs."""

    def __init__(self, host: str, port: int, client_id: str, username: str, password: str,
                 ca: str | None = None) -> None:
        raw = socket.create_connection((host, port), timeout=30)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock: socket.socket = ssl.create_default_context(cafile=ca).wrap_socket(
            raw, server_hostname=host) if ca else raw
        self.sock.sendall(connect_packet(client_id, username, password))
        ack = self._read_exactly(4)
        if ack[0] != 0x20 or ack[3] != 0:
            self.sock.close()
            raise ConnectionError(f"MQTT CONNACK refused the login (return code {ack[3]})")
        self.acked = 0
        self.error: BaseException | None = None
        self._freed = threading.Condition()
        self._reader = threading.Thread(target=self._read_acks, daemon=True)
        self._reader.start()

    def _read_exactly(self, n: int) -> bytes:
        got = b""
        while len(got) < n:
            part = self.sock.recv(n - len(got))
            if not part:
                raise ConnectionError("the broker closed the MQTT connection")
            got += part
        return got

    def _read_acks(self) -> None:
        buf = b""
        try:
            while True:
                part = self.sock.recv(65536)
                if not part:
                    return
                buf += part
                n = 0
                while len(buf) - n >= 2:
                    kind, size = buf[n], buf[n + 1]  # PUBACK and PINGRESP are 4 and 2 bytes
                    if len(buf) - n < 2 + size:
                        break
                    if kind == 0x40:
                        with self._freed:
                            self.acked += 1
                            self._freed.notify_all()
                    n += 2 + size
                buf = buf[n:]
        except OSError as exc:
            self.error = exc
            with self._freed:
                self._freed.notify_all()

    def publish(self, packets: Sequence[bytes], sent: int) -> None:
        """Writes `packets` (the `sent`-th publish onwards), waiting while `window` are unacked."""
        with self._freed:
            while sent + len(packets) - self.acked > WINDOW and self.error is None:
                self._freed.wait(1.0)
        if self.error is not None:
            raise ConnectionError(f"the MQTT connection failed: {self.error!r}")
        self.sock.sendall(b"".join(packets))

    def finish(self, total: int, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        with self._freed:
            while self.acked < total and self.error is None and time.monotonic() < end:
                self._freed.wait(1.0)
        if self.acked < total:
            raise TimeoutError(f"{total - self.acked} of {total} publishes without a PUBACK "
                               f"after {timeout:g}s")
        self.sock.sendall(b"\xe0\x00")  # DISCONNECT
        self.sock.close()


def run(cfg: dict[str, object], client_id: str, index: Sequence[int], topics: Sequence[str],
        payloads: Sequence[bytes], rate: float | None, t_start: float) -> np.ndarray:
    """Publishes the updates at `index` (their topics and payloads) from `t_start` (epoch
    seconds), paced at `rate` updates/s of the whole stream if given; their send times."""
    pub = Publisher(str(cfg["host"]), int(str(cfg["port"])), client_id, str(cfg["username"]),
                    str(cfg["password"]), str(cfg["ca"]) if cfg.get("ca") else None)
    packets = [publish_packet(t, p, k % 65535 + 1)
               for k, (t, p) in enumerate(zip(topics, payloads, strict=True))]
    sent_at = np.empty(len(packets))
    while time.time() < t_start:
        time.sleep(0.001)
    start = time.perf_counter()
    k = 0
    while k < len(packets):
        end = min(len(packets), k + CHUNK)
        if rate:
            due = index[k] / rate - (time.perf_counter() - start)
            if due > 0:
                time.sleep(due)
            now = (time.perf_counter() - start) * rate
            end = k + 1 + int(np.searchsorted(np.asarray(index[k + 1:end]), now, side="right"))
        sent_at[k:end] = time.time()
        pub.publish(packets[k:end], k)
        k = end
    pub.finish(len(packets))
    return sent_at
