"""exchanges/shell/ without a broker: a broker gone (a confirm lost with its channel, a connection
closed under a channel opening) and the instance lock (the configuration: test_shell_config.py)."""

from __future__ import annotations

import contextlib
from typing import Any, cast

import aiormq
import pytest

from exchanges import shell
from exchanges.shell import Counters

# --------------------------------------------------------------------------- a broker gone


class FakeUnderlay:
    """aiormq's channel under an exchange: basic_publish fails with `exc`; closed or not."""

    def __init__(self, exc: BaseException, closed: bool) -> None:
        self.exc, self.is_closed, self.publisher_confirms = exc, closed, True

    async def basic_publish(self, *args: Any, **kwargs: Any) -> None:
        raise self.exc


def out_on(underlay: FakeUnderlay) -> shell.Out:
    class Channel:
        async def get_underlay_channel(self) -> FakeUnderlay:
            return underlay

    class Exchange:
        name, channel = "x", Channel()

    return shell.Out(cast(Any, Exchange()), "k", b"{}")


@pytest.mark.parametrize(("exc", "closed"), [(Exception(), False), (Exception(), True),
                                             (RuntimeError("late"), True)])
async def test_a_confirm_lost_with_its_channel_is_the_broker_gone(exc: BaseException, closed: bool) -> None:
    # aiormq fails pending confirms with a bare Exception when their channel closes: the
    # sidecar reconnects (BROKER_GONE), it does not end as if it had a bug
    with pytest.raises(shell.BROKER_GONE, match="publish lost with its channel"):
        await shell.publish_all([out_on(FakeUnderlay(exc, closed))], Counters())


async def test_a_publish_error_on_an_open_channel_is_not_taken_for_the_broker_gone() -> None:
    with pytest.raises(KeyError):
        await shell.publish_all([out_on(FakeUnderlay(KeyError("bug"), False))], Counters())


class SampleExchange:
    """An aio-pika exchange whose publish fails with `exc` (or succeeds)."""

    def __init__(self, exc: BaseException | None) -> None:
        self.exc = exc
        self.sent: list[bytes] = []

    async def publish(self, message: Any, routing_key: str, mandatory: bool = True) -> None:
        if self.exc is not None:
            raise self.exc
        self.sent.append(message.body)


async def test_a_map_sample_lost_with_its_channel_is_the_broker_gone() -> None:
    # the fault suite's TCP cut under a live-map sample: a bare Exception from aiormq's drain
    # ended x-fence-w1 as a crash instead of a reconnect
    with pytest.raises(shell.BROKER_GONE, match="sample lost with its channel"):
        await shell.publish_sample(cast(Any, SampleExchange(Exception())), b"{}", "application/json", False)


async def test_a_map_sample_says_whether_it_was_routed() -> None:
    routed = SampleExchange(None)
    assert await shell.publish_sample(cast(Any, routed), b"{}", "application/json", True) is True
    assert routed.sent == [b"{}"]
    returned = SampleExchange(aiormq.exceptions.DeliveryError(None, cast(Any, None)))
    assert await shell.publish_sample(cast(Any, returned), b"{}", "application/json", True) is False
    with pytest.raises(KeyError):  # a bug stays a bug
        await shell.publish_sample(cast(Any, SampleExchange(KeyError("bug"))), b"{}", "text/plain", True)


class LockConnection:
    """A connection whose queue declares are refused (locked) while `locked` says so."""

    def __init__(self) -> None:
        self.locked = True
        self.declared: list[tuple[str, dict[str, Any]]] = []

    async def channel(self, **kwargs: Any) -> Any:
        conn = self

        class Channel:
            is_closed = False

            async def declare_queue(self, name: str, **kw: Any) -> None:
                if conn.locked:
                    raise aiormq.exceptions.ChannelLockedResource("locked")
                conn.declared.append((name, kw))

            async def close(self) -> None:
                self.is_closed = True

        return Channel()


async def test_the_instance_lock_stands_by_while_held_and_restarts_after_taking_over() -> None:
    import contextlib

    lock, conn = shell.InstanceLock("lock.x-geo"), LockConnection()
    conn.locked = False
    async with contextlib.AsyncExitStack() as stack:  # free at the start: taken, serve on
        await lock.acquire(cast(Any, conn), stack)
    assert conn.declared == [("lock.x-geo", {"exclusive": True, "auto_delete": True, "durable": False})]
    conn.locked = True
    for _ in range(2):  # held by another: BROKER_GONE (serve backs off and tries again)
        with pytest.raises(shell.BROKER_GONE, match="held by another instance"):
            async with contextlib.AsyncExitStack() as stack:
                await lock.acquire(cast(Any, conn), stack)
    conn.locked = False  # the other went: what this process holds is stale
    with pytest.raises(shell.TookOver):
        async with contextlib.AsyncExitStack() as stack:
            await lock.acquire(cast(Any, conn), stack)


async def test_a_connection_closed_under_a_channel_opening_ends_the_session_not_the_process() -> None:
    """aiormq raises RuntimeError('<Connection ...> closed') when the broker closed the
    connection while a session opened its channels (a broker restart): a ConnectionError, which
    ends the session (the next one reconnects); any other RuntimeError stays a bug."""
    from exchanges.shell.connections import open_channel

    class Conn:
        def __init__(self, exc: Exception) -> None:
            self.exc = exc

        async def channel(self, **kwargs: Any) -> Any:
            raise self.exc

    async with contextlib.AsyncExitStack() as stack:
        with pytest.raises(ConnectionError, match="closed while a channel was opened"):
            await open_channel(cast(Any, Conn(RuntimeError('<Connection: "amqp://x"> closed'))), stack)
        with pytest.raises(RuntimeError, match="something else"):
            await open_channel(cast(Any, Conn(RuntimeError("something else"))), stack)
