"""deploy/firebase_emulator.py: which processes still hold the Auth emulator's port once its
own process is gone (`geofence down` stops them too, so an `up` right after finds the port
free). Real processes listening on real sockets; only firebase-tools' are named."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from deploy.firebase_emulator import find_pid, leftover_pids

LISTEN = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
          "print(s.getsockname()[1], flush=True); time.sleep(60)")


@pytest.fixture
def listener(request: pytest.FixtureRequest) -> Iterator[tuple[int, int]]:
    """(pid, port) of a process listening on loopback, its command line ending in `param`."""
    proc = subprocess.Popen([sys.executable, "-c", LISTEN, request.param], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield proc.pid, port
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("listener", ["/usr/lib/node_modules/firebase-tools/lib/bin/firebase.js"],
                         indirect=True)
def test_a_firebase_tools_process_on_the_port_is_a_leftover(listener: tuple[int, int]) -> None:
    pid, port = listener
    assert leftover_pids("127.0.0.1", port) == [pid]
    assert find_pid("127.0.0.1", port) is None  # not the emulator's own `emulators:start` process


@pytest.mark.parametrize("listener", ["someone-else"], indirect=True)
def test_another_program_on_the_port_is_left_alone(listener: tuple[int, int]) -> None:
    _, port = listener
    assert leftover_pids("127.0.0.1", port) == []


def test_a_free_port_has_no_leftover() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert leftover_pids("127.0.0.1", port) == []
