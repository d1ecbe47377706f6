"""`shell.Sidecar`, what `run_sidecar` takes: every role's sidecar has its shape (checked by
mypy through the annotations below), and `run_sidecar` drives one through recover, sessions
and close, without a broker."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from exchanges import shell
from exchanges.x_geo.sidecar import GeoSidecar
from fence.archive import Archiver
from fence.x_fence.sidecar import FenceSidecar
from ingress.sidecar import IngressSidecar

CONFIG = shell.SidecarConfig("x-geo", "a", "amqp://t@localhost/", "postgresql://t@localhost/",
                            ("a",), ("w0",))


def test_every_role_sidecar_is_a_sidecar() -> None:
    # the assignment is the check (mypy): each class's instances satisfy the protocol
    sidecars: list[type[shell.Sidecar]] = [GeoSidecar, FenceSidecar, IngressSidecar, Archiver]
    for cls in sidecars:
        for name in ("recover", "session", "close"):
            assert inspect.iscoroutinefunction(getattr(cls, name)), f"{cls.__name__}.{name}"


class FakeSidecar:
    """Records what run_sidecar called; its one session ends the run (or raises `fail`)."""

    def __init__(self, recovers: bool = True, fail: BaseException | None = None) -> None:
        self.counters = shell.Counters()
        self.recovers, self.fail = recovers, fail
        self.calls: list[str] = []

    async def recover(self, stop: asyncio.Event) -> bool:
        self.calls.append("recover")
        return self.recovers

    async def session(self, stop: asyncio.Event) -> None:
        self.calls.append("session")
        if self.fail is not None:
            raise self.fail
        stop.set()

    async def close(self) -> None:
        self.calls.append("close")


@pytest.fixture(autouse=True)
def no_signal_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    # run_sidecar would take SIGTERM / SIGINT on the test session's loop
    monkeypatch.setattr(shell.lifecycle, "install_signal_handlers", lambda stop: None)


async def test_run_sidecar_recovers_serves_then_closes() -> None:
    sidecar = FakeSidecar()
    assert await shell.run_sidecar(CONFIG, ("a", "b"), "region", lambda config: sidecar) == 0
    assert sidecar.calls == ["recover", "session", "close"]


async def test_run_sidecar_stopped_during_recovery_neither_serves_nor_closes() -> None:
    sidecar = FakeSidecar(recovers=False)
    assert await shell.run_sidecar(CONFIG, ("a",), "region", lambda config: sidecar) == 0
    assert sidecar.calls == ["recover"]


async def test_run_sidecar_after_a_takeover_exits_to_be_restarted_without_closing() -> None:
    sidecar = FakeSidecar(fail=shell.TookOver("got the lock after another instance held it"))
    assert await shell.run_sidecar(CONFIG, ("a",), "region", lambda config: sidecar) == shell.EXIT_TOOK_OVER
    assert sidecar.calls == ["recover", "session"]


async def test_run_sidecar_refuses_an_instance_not_in_the_topology() -> None:
    made: list[shell.SidecarConfig] = []

    def make(config: shell.SidecarConfig) -> shell.Sidecar:
        made.append(config)
        return FakeSidecar()

    assert await shell.run_sidecar(CONFIG, ("b", "c"), "region", make) == 2
    assert made == []
