"""The exchange-type contract every routing role follows, after RabbitMQ's exchange
behaviour (`rabbit_exchange_type`): create, delete, validate, add_binding, remove_bindings,
route, recover.

A role's core implements it with plain data in and plain data out (no I/O, no clock, no
randomness): the asyncio shell around it decodes messages, calls the core, publishes what it
returns and acks. That keeps the routing logic exhaustively testable without a broker, the
way RabbitMQ's consistent-hash exchange is one small module behind these callbacks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, TypeVar

B = TypeVar("B", contravariant=True)  # a binding
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


class ExchangeType(Protocol[B, M, R]):
    def create(self) -> None:
        """The exchange comes into being (empty)."""

    def delete(self) -> None:
        """The exchange goes away with all its bindings and state."""

    def validate(self, message: M) -> None:
        """Raise InvalidMessage (with the reason) for what route must never see."""

    def add_binding(self, binding: B) -> None:
        """Add (or replace) one binding."""

    def remove_bindings(self, bindings: Iterable[B]) -> None:
        """Remove bindings; removing an unknown one is not an error (idempotent)."""

    def route(self, message: M) -> R:
        """The routing decision for a (validated) message."""

    def recover(self, bindings: Iterable[B]) -> None:
        """Rebuild from the durable bindings after a restart (replaces current state)."""
