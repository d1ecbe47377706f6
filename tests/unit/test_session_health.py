"""A sidecar without its consumer is down (issue 34: x-fence-w1 lost its broker connection,
never reconnected, and kept answering /metrics for 45 minutes with 0 consumers on its queue).

`run_session` says whether the session consumes (gauge `consuming`) and, with `prepare`,
consumes the control queue only until the state is rebuilt; the watchdog of `serve` ends a
session that consumed nothing for `stall_s` (not recovering, paused or standing by) so that a
new one connects, and exits the process when the stalled one will not end; `geofence status`
reads the gauge."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, cast

import pytest
from aio_pika.abc import AbstractConnection, AbstractQueue

from deploy.stack import NO_METRICS, NOT_CONSUMING, consumer_note
from deploy.worker_cmd import human
from exchanges import shell
from exchanges.shell import lifecycle
from exchanges.shell.intake import Intake

CONFIG = shell.SidecarConfig("x-fence", "w0", "amqp://t@localhost/", "postgresql://t@localhost/",
                            ("a",), ("w0",), stall_s=0.3)


class FakeQueue:
    def __init__(self, name: str) -> None:
        self.name = name
        self.callback: Callable[[Any], Awaitable[None]] | None = None

    async def consume(self, callback: Callable[[Any], Awaitable[None]], **kwargs: Any) -> str:
        self.callback = callback
        return f"ctag-{self.name}"

    async def cancel(self, tag: str) -> None:
        self.callback = None


class FakeConnection:
    def __init__(self) -> None:
        self.close_callbacks: set[Callable[..., None]] = set()
        self.is_closed = False

    def drop(self) -> None:
        self.is_closed = True
        for cb in list(self.close_callbacks):
            cb(None)


async def consume_forever(intake: Intake) -> None:
    async for _ in intake.batches():
        pass


@pytest.fixture
def fast_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle, "WATCH_EVERY_S", 0.02)
    monkeypatch.setattr(lifecycle, "STALLED_END_S", 0.3)


async def until(check: Callable[[], bool], what: str, deadline: float = 5.0) -> None:
    end = asyncio.get_running_loop().time() + deadline
    while not check():
        assert asyncio.get_running_loop().time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_with_prepare_only_the_control_queue_is_consumed_until_the_state_is_rebuilt() -> None:
    counters = shell.Counters()
    controls, inputs = FakeQueue("x-fence.w0.control"), FakeQueue("x-fence.w0")
    ci, ii = Intake(cast(AbstractQueue, controls), 8), Intake(cast(AbstractQueue, inputs), 8)
    rebuilt, stop = asyncio.Event(), asyncio.Event()
    conn = FakeConnection()

    async def prepare() -> None:
        await rebuilt.wait()

    session = asyncio.create_task(shell.run_session(
        stop, [cast(AbstractConnection, conn)], [ci, ii], [consume_forever(ii), consume_forever(ci)], [], 1.0,
        prepare=prepare(), counters=counters))
    await until(lambda: controls.callback is not None, "the control queue consumed")
    assert inputs.callback is None and counters.gauges["consuming"] == 0
    rebuilt.set()
    await until(lambda: inputs.callback is not None, "the input queue consumed")
    assert counters.gauges["consuming"] == 1
    conn.drop()  # the broker goes: the session ends (raising), and says it no longer consumes
    with pytest.raises(ExceptionGroup):
        await session
    assert counters.gauges["consuming"] == 0


async def test_a_stop_during_prepare_ends_the_session_without_consuming_the_input() -> None:
    counters = shell.Counters()
    controls, inputs = FakeQueue("c"), FakeQueue("i")
    ci, ii = Intake(cast(AbstractQueue, controls), 8), Intake(cast(AbstractQueue, inputs), 8)
    stop = asyncio.Event()
    never = asyncio.Event()

    async def prepare() -> None:
        await never.wait()

    session = asyncio.create_task(shell.run_session(
        stop, [cast(AbstractConnection, FakeConnection())], [ci, ii],
        [consume_forever(ii), consume_forever(ci)], [], 1.0, prepare=prepare(), counters=counters))
    await until(lambda: controls.callback is not None, "the control queue consumed")
    stop.set()
    await asyncio.wait_for(session, 5)
    assert inputs.callback is None and counters.gauges["consuming"] == 0


async def test_a_session_that_consumes_nothing_is_ended_and_a_new_one_connects(fast_watch: None) -> None:
    counters = shell.Counters()
    stop = asyncio.Event()
    sessions: list[int] = []

    async def session(stop: asyncio.Event) -> None:
        sessions.append(len(sessions))
        if len(sessions) == 1:
            await asyncio.Event().wait()  # stuck: never consumes, never ends by itself
        counters.gauge("consuming", 1)
        stop.set()

    await asyncio.wait_for(lifecycle._serve(CONFIG, session, stop, counters), 10)
    assert sessions == [0, 1]
    assert counters.other["stalls"] == 1 and counters.other["reconnects"] == 1


async def test_a_session_rebuilding_its_state_or_standing_by_is_not_stalled(fast_watch: None) -> None:
    counters = shell.Counters()
    stop = asyncio.Event()

    async def session(stop: asyncio.Event) -> None:
        counters.gauge("recovering", 1)
        await asyncio.sleep(1.0)  # three times stall_s, rebuilding
        counters.gauge("recovering", 0)
        counters.gauge("consuming", 1)
        stop.set()

    await asyncio.wait_for(lifecycle._serve(CONFIG, session, stop, counters), 10)
    assert counters.other["stalls"] == 0


async def test_a_stalled_session_that_will_not_end_exits_the_process(fast_watch: None,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    exits: list[int] = []

    class Exited(Exception):
        pass

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise Exited

    monkeypatch.setattr(lifecycle.os, "_exit", fake_exit)
    release = threading.Event()

    async def session(stop: asyncio.Event) -> None:
        while not release.is_set():  # swallows its cancellation: a teardown stuck for good
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue

    with pytest.raises(Exited):
        await asyncio.wait_for(lifecycle._serve(CONFIG, session, asyncio.Event(), shell.Counters()), 10)
    release.set()
    assert exits == [lifecycle.EXIT_STALLED]


def serve_metrics(text: str) -> tuple[HTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/metrics"


@pytest.mark.parametrize(("text", "note"), [
    ('# HELP geofence_consuming consuming (now)\ngeofence_consuming{role="x-fence",name="w0"} 1.0\n', ""),
    ('geofence_consuming{role="x-fence",name="x-fence-w1"} 0.0\n', NOT_CONSUMING),
    ('geofence_consuming{role="x-fence",name="w2"} 0.0\ngeofence_recovering{role="x-fence",name="w2"} 1.0\n',
     "recovering"),
    ('geofence_consuming{role="x-ingress"} 0.0\ngeofence_paused{role="x-ingress"} 1.0\n', "paused"),
    ('geofence_messages_received_total{role="fence-api"} 3.0\n', ""),  # no input gauge: up when it answers
])
def test_geofence_status_reads_the_consumer_of_each_sidecar(text: str, note: str) -> None:
    server, url = serve_metrics(text)
    try:
        assert consumer_note(url) == note
    finally:
        server.shutdown()


def test_geofence_status_says_when_metrics_do_not_answer() -> None:
    server, url = serve_metrics("")
    server.shutdown()
    server.server_close()
    assert consumer_note(url, timeout=0.5) == NO_METRICS


def test_geofence_worker_list_says_a_worker_is_recovering_not_down() -> None:
    rows = [{"worker": "w0", "on_ring": True, "weight": 1, "share": 0.5, "up": False,
             "recovering": {"replayed": 1200, "records": 4096}},
            {"worker": "w1", "on_ring": True, "weight": 1, "share": 0.5, "up": False, "recovering": None}]
    text = human({"ring_version": 3, "fences": 10, "workers": rows})
    assert "recovering: 1,200 of 4,096 records" in text.splitlines()[2]
    assert text.splitlines()[3].rstrip().endswith("down")
