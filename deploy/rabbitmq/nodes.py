"""The local stack as the broker side sees it: where its RabbitMQ nodes listen, the passwords,
and the second node's name.

deploy/rabbitmq/ sits below the rest of deploy/ (the stack, the sidecars, the commands use
it), so it imports nothing from there: what it needs of the stack's settings and secrets is
declared here as protocols, which deploy/settings.py's `Settings` and `Secrets` satisfy
(checked by mypy wherever they are passed in).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Protocol

from exchanges import topology as t


class StackSettings(Protocol):
    """What the broker side reads of the local stack's settings (deploy.settings.Settings)."""

    @property
    def host(self) -> str: ...

    @property
    def amqp_port(self) -> int: ...

    @property
    def amqps_port(self) -> int: ...

    @property
    def start_timeout(self) -> float: ...

    @property
    def state_dir(self) -> Path: ...

    @property
    def placement(self) -> tuple[tuple[str, int], ...]: ...

    @property
    def topology(self) -> t.Topology: ...

    @property
    def broker_count(self) -> int: ...

    def broker_of(self, region: str) -> int: ...

    def broker_amqp_port(self, broker: int) -> int: ...

    def broker_management_port(self, broker: int) -> int: ...


class StackSecrets(Protocol):
    """What the broker side reads of the local stack's secrets (deploy.settings.Secrets)."""

    @property
    def rabbitmq_password(self) -> str: ...

    @property
    def users(self) -> dict[str, str]: ...

    def values(self) -> tuple[str, ...]: ...


def broker2_node() -> str:
    """The Erlang node name of the local stack's second RabbitMQ node."""
    return f"geofence2@{socket.gethostname().split('.')[0]}"
