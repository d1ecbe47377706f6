"""Where the broker's federation links connect (`Endpoint`) and their upstream parameters'
values: plain AMQP on a loopback broker, AMQPS with the peer checked across hosts. Pure data."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from exchanges import topology as t


@dataclass(frozen=True)
class Endpoint:
    """Where federation links connect: the broker's plain AMQP listener when it is on this
    host's loopback, else its AMQPS one, the peer's certificate checked against `cacertfile`
    (the CA as the downstream broker reads it) and its name."""

    host: str
    amqp_port: int
    amqps_port: int = 5671
    cacertfile: str = ""

    @property
    def loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"



def amqp_uri(endpoint: Endpoint, user: str, password: str, vhost: str) -> str:
    """A federation link's URI: plain on loopback, AMQPS with verify_peer across hosts."""
    who = f"{quote(user, safe='')}:{quote(password, safe='')}"
    if endpoint.loopback:
        return f"amqp://{who}@{endpoint.host}:{endpoint.amqp_port}/{quote(vhost, safe='')}"
    tls = (f"cacertfile={quote(endpoint.cacertfile, safe='/')}&verify=verify_peer"
           f"&server_name_indication={quote(endpoint.host, safe='')}")
    return f"amqps://{who}@{endpoint.host}:{endpoint.amqps_port}/{quote(vhost, safe='')}?{tls}"


def upstream(endpoint: Endpoint, federation_password: str, vhost: str, exchange: str) -> dict[str, Any]:
    return {"uri": amqp_uri(endpoint, t.FEDERATION_USER, federation_password, vhost),
            "exchange": exchange, "ack-mode": "on-confirm", "trust-user-id": False, "max-hops": 1}
