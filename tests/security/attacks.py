"""What the attack tests share: what a response reveals of the victim, the row a test records
(and asserts), and what the broker answered."""

from __future__ import annotations

from typing import Any

import aio_pika
import aiormq
import httpx

from tests.security import table
from tests.security.conftest import DRIVERS, World


def revealed(world: World, text: str, named: tuple[str, ...] = ()) -> list[str]:
    """What of the victim's a response shows: its drivers, its objects only it has (but those
    the attacker `named` itself), its tenant."""
    secrets = [*DRIVERS.values(), *(v for v in ("van-2", "van-3") if v not in named), world.a]
    return [s for s in secrets if s in text]


def holds(who: str, attack: str, answer: str, legit: str, ok: bool) -> None:
    table.record(who, attack, answer, legit, ok)
    assert ok, f"{who} / {attack}: got {answer}; legitimate: {legit}"


def ids(reply: httpx.Response) -> set[str]:
    return {o["id"] for o in reply.json().get("objects", [])} if reply.status_code == 200 else set()


# --------------------------------------------------------------------------- the HTTP API



async def refused(coro: Any) -> str:
    """'refused (<reason>)' when the broker closes the channel / connection for it, else 'accepted'."""
    try:
        await coro
    except (
        aiormq.exceptions.ChannelAccessRefused,
        aiormq.exceptions.ChannelClosed,
        aiormq.exceptions.ConnectionClosed,
        aio_pika.exceptions.AMQPError,
    ) as exc:
        return f"refused ({type(exc).__name__})"
    return "accepted"


