"""Which TCP ports listen beyond loopback on this host: /proc/net/tcp and tcp6 read as the
kernel writes them (no `ss` or psutil). `geofence up` uses it to find a broker started
without the host defaults (epmd and the Erlang distribution on every interface), and the
security tests to prove that only the TLS listeners face the network.

A socket bound to 0.0.0.0 or :: (or to any address outside 127.0.0.0/8 and ::1) is exposed;
one bound to a loopback address is not."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"  # TCP_LISTEN in the kernel's st column
PROC_NET = Path("/proc/net")


@dataclass(frozen=True)
class Listener:
    address: str
    port: int

    @property
    def exposed(self) -> bool:
        return not ipaddress.ip_address(self.address).is_loopback


def _address(hex_addr: str) -> str:
    """The kernel's hex form: IPv4 one little-endian word, IPv6 four of them."""
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    v6 = ipaddress.IPv6Address(words)
    return str(v6.ipv4_mapped) if v6.ipv4_mapped is not None else str(v6)


def parse(text: str) -> list[Listener]:
    """The listening sockets of one /proc/net/tcp{,6} file's text."""
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 4 or fields[3] != LISTEN:
            continue
        addr, port = fields[1].split(":")
        found.append(Listener(_address(addr), int(port, 16)))
    return found


def listeners(proc_net: Path = PROC_NET) -> list[Listener]:
    found: list[Listener] = []
    for name in ("tcp", "tcp6"):
        try:
            found += parse((proc_net / name).read_text())
        except FileNotFoundError:
            continue
    return found


def exposed(ports: Iterable[int], proc_net: Path = PROC_NET) -> set[int]:
    """Those of `ports` with a listener beyond loopback."""
    wanted = set(ports)
    return {x.port for x in listeners(proc_net) if x.port in wanted and x.exposed}
