"""The exchange-type contract the routing roles follow, after RabbitMQ's exchange behaviour
(`rabbit_exchange_type`), narrowed to what the roles really are: every core is a `Router`;
x-geo is an `ExchangeType` (create, delete, validate, add_binding, remove_bindings, route,
recover); x-fence a `StatefulExchange` (define, drop, route, expire, and durable state).
tests/unit/test_contract.py has mypy check each core against its protocol.

A role's core implements it with plain data in and plain data out (no I/O, no clock, no
randomness): the asyncio shell around it decodes messages, calls the core, publishes what it
returns and acks. That keeps the routing logic exhaustively testable without a broker, the
way RabbitMQ's consistent-hash exchange is one small module behind these callbacks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

B = TypeVar("B", contravariant=True)  # a binding
K = TypeVar("K", contravariant=True)  # what names a binding to remove
D = TypeVar("D", contravariant=True)  # a definition (a stateful exchange's binding)
M = TypeVar("M", contravariant=True)  # what is routed (a batch)
R = TypeVar("R", covariant=True)  # the routing decision


class InvalidMessage(ValueError):
    """The message cannot be processed; `reason` goes to the dead-letter queue with it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# What decoding and validating a message may raise for input that cannot be processed: the
# message is dead-lettered with the reason (every shell, one path). Anything else is a bug:
# the process stops unacked (crash-only) and the message comes back.
BAD_INPUT: tuple[type[Exception], ...] = (InvalidMessage, ValueError, KeyError, TypeError)


class Router(Protocol[M, R]):
    """What every routing role's core is: a batch in, the routing decision out (plain data,
    no I/O). x-ingress is only this (its "bindings" are the worldmap, replaced whole)."""

    def route(self, message: M, /) -> R:
        """The routing decision for a (validated) message."""
        ...


class ExchangeType(Router[M, R], Protocol[B, K, M, R]):
    """An exchange with bindings, RabbitMQ's callbacks: x-geo (bindings: fences' Hilbert ranges,
    B; removed by key, K: fence id and version)."""

    def create(self) -> None:
        """The exchange comes into being (empty)."""

    def delete(self) -> None:
        """The exchange goes away with all its bindings and state."""

    def validate(self, message: M, /) -> None:
        """Raise InvalidMessage (with the reason) for what route must never see."""

    def add_binding(self, binding: B, /) -> None:
        """Add (or replace) one binding."""

    def remove_bindings(self, bindings: Iterable[K], /) -> None:
        """Remove bindings; removing an unknown one is not an error (idempotent)."""

    def recover(self, bindings: Iterable[B], /) -> None:
        """Rebuild from the durable bindings after a restart (replaces current state)."""


class StatefulExchange(Router[M, R], Protocol[D, M, R]):
    """An exchange whose routing keeps state: x-fence (who is inside which fence). Its
    bindings are definitions (D) that carry a version and a time, and deciding them emits
    events as routing does (R); its state is durable as whole snapshots and per-batch records,
    so a restart recovers it instead of rebuilding from bindings."""

    def define(self, definition: D, ts: float, /) -> R:
        """Create or replace a binding at time ts (an older version is ignored)."""
        ...

    def drop(self, key: str, version: int, ts: float, /) -> R:
        """Delete a binding at time ts (idempotent)."""
        ...

    def expire(self, now: float, /) -> R:
        """What the clock decides (timeouts), at `now`."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain data; what `changes` would report is cleared."""
        ...

    def changes(self, n_persisted: int, /) -> dict[str, Any] | None:
        """What changed since the last call, as one journal record (None: nothing)."""
        ...

    def apply(self, record: dict[str, Any], /) -> None:
        """Replay one record of `changes`."""
