"""exchanges/shell/publish.py writes plain batches straight into aiormq's channel: it counts
delivery tags itself under the channel's lock, registers a `_Confirm` per tag in the channel's
`confirmations`, and queues one `ChannelFrame` on the connection's write queue. None of that is
aiormq's public API, so pyproject pins aiormq to the minor version checked here, and this test
drives aiormq's own confirm handling with publish.py's objects: if an upgrade changes any of
it, this fails by name rather than a confirm going missing in production."""

from __future__ import annotations

import asyncio
import re
import tomllib
import types
from importlib import metadata
from pathlib import Path

import aiormq
import pytest
from aiormq.abc import ChannelFrame
from aiormq.base import FutureStore
from aiormq.channel import Channel
from pamqp.commands import Basic

from exchanges.shell.publish import _Batch, _Confirm

ROOT = Path(__file__).resolve().parents[2]


def _pin() -> tuple[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if re.match(r"aiormq\b", d))
    low = re.search(r">=\s*([\d.]+)", spec)
    high = re.search(r"<\s*([\d.]+)", spec)
    assert low and high, f"aiormq is not pinned to a minor version in pyproject.toml: {spec!r}"
    return low.group(1), high.group(1)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(".")[:3])


def test_the_installed_aiormq_is_the_pinned_minor_version() -> None:
    low, high = _pin()
    installed = _version(metadata.version("aiormq"))
    assert _version(low) <= installed < _version(high), (metadata.version("aiormq"), low, high)
    assert _version(high)[:2] == (_version(low)[0], _version(low)[1] + 1), \
        f"the pin spans more than one minor version: >={low},<{high}"


def _channel(loop: asyncio.AbstractEventLoop) -> tuple[Channel, asyncio.Queue[ChannelFrame]]:
    write_queue: asyncio.Queue[ChannelFrame] = asyncio.Queue()
    store = FutureStore(loop)
    connector = types.SimpleNamespace(loop=loop, publisher_confirms=True, write_queue=write_queue,
                                      connection_tune=types.SimpleNamespace(frame_max=131072),
                                      _future_store_child=store.get_child)
    return Channel(connector, 1, publisher_confirms=True), write_queue  # type: ignore[arg-type]


async def test_publish_py_s_use_of_the_channel_holds() -> None:
    channel, write_queue = _channel(asyncio.get_running_loop())
    # what publish.py reads and writes on the channel
    assert channel.delivery_tag == 0 and channel.number == 1 and channel.publisher_confirms
    assert channel.write_queue is write_queue and not channel.is_closed
    assert isinstance(channel.on_consumer_cancel_callbacks, set)  # exchanges/shell/intake.py
    async with channel.lock:  # an async context manager that refuses a closed channel
        batch = _Batch(4, channel.create_future())
        first = channel.delivery_tag + 1
        channel.delivery_tag += 4
        for i in range(4):
            channel.confirmations[first + i] = _Confirm(batch, i)
        await channel.write_queue.put(ChannelFrame(payload=b"frames", should_close=False,
                                                   drain_future=channel.create_future()))
    assert write_queue.get_nowait().payload == b"frames"
    # the broker's confirms, as aiormq's reader hands them on: a multiple ack, then a nack
    await channel._on_confirm_frame(Basic.Ack(delivery_tag=2, multiple=True))
    await channel._on_confirm_frame(Basic.Nack(delivery_tag=3))
    await channel._on_confirm_frame(Basic.Ack(delivery_tag=4))
    async with asyncio.timeout(5):
        await batch.future
    assert sorted(batch.refused) == [2]  # the third message (tag 3) refused, by its index
    assert isinstance(batch.refused[2], aiormq.exceptions.DeliveryError)
    assert not channel.confirmations
    await channel.close()
    with pytest.raises(aiormq.exceptions.ChannelInvalidStateError):
        async with channel.lock:
            pass
