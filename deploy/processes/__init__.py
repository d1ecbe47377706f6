"""The processes the local stack starts and stops, and the state file that records them.

Holds process identity (pid plus start time), state.json (what `geofence up` started), the
StackError every part of the stack raises, and the small helpers to run a tool, launch a
daemon, wait for a port or a process, and stop one. No settings: paths and timeouts are
passed in. It imports nothing of the project, and is a package of its own so that every part
of deploy/ can build on it, deploy/rabbitmq/ included, without a circle (the import-layer test
checks sub-packages).

Trade-offs: "running" is a TCP connect (cheap, no subprocess, the test a client makes); "ours"
is a pid plus the process start time recorded in state.json, so `down` never stops a process
it did not start, even after its pid was reused. Every wait polls with a deadline
(GEOFENCE_START_TIMEOUT); there are no fixed sleeps.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POLL_INTERVAL = 0.2

Say = Callable[[str], None]  # one line of progress for the operator (`geofence up` prints it)


class StackError(RuntimeError):
    """A service could not be started, stopped or reached."""


class ServiceUnreachable(StackError):
    """A service a command needs does not answer (deploy/exit_codes.py: exit code 3)."""


# --------------------------------------------------------------------------- processes and state


@dataclass(frozen=True)
class ProcessId:
    """A process, told apart from a later one that reuses its pid by its start time."""

    pid: int
    start_ticks: int


@dataclass(frozen=True)
class ServiceRecord:
    started_by_us: bool
    process: ProcessId | None = None


State = dict[str, ServiceRecord]
Lookup = Callable[[int], ProcessId | None]


def proc_stat_fields(text: str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (field 3, the state, first)."""
    return text[text.rindex(")") + 2:].split()  # the command name may hold spaces and ')'


def parse_proc_stat(text: str) -> tuple[str, int]:
    """(state letter, start time in clock ticks) from the text of /proc/<pid>/stat."""
    fields = proc_stat_fields(text)
    return fields[0], int(fields[19])


def process_identity(pid: int) -> ProcessId | None:
    """The live process `pid`, or None when it is gone (a zombie counts as gone)."""
    try:
        state, start = parse_proc_stat(Path(f"/proc/{pid}/stat").read_text())
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return None
    return None if state in ("Z", "X") else ProcessId(pid, start)


def identify(pid: int) -> ProcessId:
    found = process_identity(pid)
    if found is None:
        raise StackError(f"process {pid} vanished right after it started")
    return found


def is_ours(record: ServiceRecord | None, lookup: Lookup = process_identity) -> bool:
    """True if `up` started this service and that very process still runs."""
    if record is None or not record.started_by_us or record.process is None:
        return False
    return lookup(record.process.pid) == record.process


def record_for_running(previous: ServiceRecord | None,
                       lookup: Lookup = process_identity) -> ServiceRecord:
    """The record of a service found already running: ours as before, or somebody else's."""
    if previous is not None and is_ours(previous, lookup):
        return previous
    return ServiceRecord(started_by_us=False)


def state_to_json(state: State) -> dict[str, Any]:
    services: dict[str, Any] = {}
    for name, rec in sorted(state.items()):
        proc = rec.process
        services[name] = {"started_by_us": rec.started_by_us,
                          "pid": proc.pid if proc else None,
                          "start_ticks": proc.start_ticks if proc else None}
    return {"version": 1, "services": services}


def state_from_json(data: Any) -> State:
    if not isinstance(data, dict) or not isinstance(data.get("services"), dict):
        raise ValueError("expected {'version': 1, 'services': {...}}")
    state: State = {}
    for name, raw in data["services"].items():
        pid, ticks = raw.get("pid"), raw.get("start_ticks")
        proc = ProcessId(int(pid), int(ticks)) if pid is not None and ticks is not None else None
        state[str(name)] = ServiceRecord(bool(raw["started_by_us"]), proc)
    return state


def load_state(path: Path) -> State:
    try:
        return state_from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise StackError(f"{path} is damaged ({exc}); fix or delete it") from None


def save_state(path: Path, state: State) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state_to_json(state), indent=2) + "\n")
    os.replace(tmp, path)


# --------------------------------------------------------------------------- small helpers


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() >= deadline:
            raise StackError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(POLL_INTERVAL)


def run(argv: Sequence[str], *, stdin: str | None = None, env: Mapping[str, str] | None = None,
        timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a tool, output captured; cwd is / so that `runuser -u postgres` finds no fault."""
    try:
        proc = subprocess.run(list(argv), input=stdin if stdin is not None else "", env=env,
                              cwd="/", capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise StackError(f"{argv[0]} not found: run `bash deploy/setup.sh`") from None
    except subprocess.TimeoutExpired:
        raise StackError(f"`{' '.join(argv)}` still running after {timeout:g}s") from None
    if check and proc.returncode != 0:
        raise StackError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): "
                         f"{_tail(proc.stderr or proc.stdout)}")
    return proc


def launch(argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> None:
    """Start a daemonising tool. Its output goes to `log`, never to a pipe that the daemon
    could inherit and keep open."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        try:
            rc = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, cwd="/", timeout=120).returncode
        except FileNotFoundError:
            raise StackError(f"{argv[0]} not found: run `bash deploy/setup.sh`") from None
    if rc != 0:
        raise StackError(f"`{' '.join(argv)}` failed (exit {rc}): {_tail(log.read_text())}")


def _tail(text: str, lines: int = 8) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


def log_tail(path: Path) -> str:
    try:
        return f"; last lines of {path}: {_tail(path.read_text(errors='replace'))}"
    except OSError:
        return ""


def chown(path: Path, user: str) -> None:
    """Give `path` to `user` and that user's primary group."""
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def terminate(proc: ProcessId, timeout: float, what: str) -> None:
    """SIGTERM, wait until gone, SIGKILL at the deadline."""
    try:
        os.kill(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        wait_gone(proc, timeout, what)
    except StackError:
        if process_identity(proc.pid) == proc:
            os.kill(proc.pid, signal.SIGKILL)
        wait_gone(proc, 10, what)


def wait_gone(proc: ProcessId, timeout: float, what: str) -> None:
    wait_until(lambda: process_identity(proc.pid) != proc, timeout, f"{what} to exit")

