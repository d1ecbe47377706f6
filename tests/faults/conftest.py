"""The fault suite (issue 5): its tests run after every other test of the session (they
kill sidecars and restart the broker), its table is printed at the end, and the stack is
left as `geofence up` leaves it (every service and sidecar running) whatever happened. Its
workload is two tenants sharing the stack (tests/faults/tenants.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.processes import StackError
from deploy.settings import ConnectionSettings, Settings
from tests.faults import report
from tests.faults.run import Workload, make_workload
from tests.faults.session_fences import SESSION_FENCES
from tests.faults.stack import Stack
from tests.faults.tenants import remove_leftover_fences, remove_leftover_gateways
from tests.faults.timing import say

FAULTS_DIR = Path(__file__).parent
CLUSTER_ROW = "test_broker_cluster.py"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The fault tests last (a stable sort: every group keeps its order); they need the stack.
    The cluster's row last of them: it makes RabbitMQ three nodes and one again."""
    for item in items:
        if FAULTS_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: (FAULTS_DIR in item.path.parents, item.path.name == CLUSTER_ROW))


SEEDS: list[int] = []  # the session's fault seed, for the summary
KEPT_LOGS = FAULTS_DIR.parents[1] / "test-output" / "fault-logs"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A fault row that fails keeps the stack's logs as they were (test-output/fault-logs/<row>-
    <time>/): the next row's restarts and the next session's clean-up would bury or lose them."""
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    if rep.when != "call" or not rep.failed or FAULTS_DIR not in item.path.parents:
        return
    logs = Settings.from_env().state_dir / "log"
    kept = KEPT_LOGS / f"{item.name}-{time.strftime('%Y%m%dT%H%M%S')}"
    with contextlib.suppress(OSError):
        shutil.copytree(logs, kept)
        say(f"{item.name} failed: the stack's logs kept in {kept}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if report.ROWS:
        terminalreporter.section("fault suite: faults injected, updates, events expected / received "
                                 "(distinct event_ids) / duplicated, dead letters, events pairing a fence "
                                 "with another tenant's object (x-tenant), recovery per fault")
        for line in report.table():
            terminalreporter.write_line(line)
        if SEEDS:
            seed = SEEDS[0]
            terminalreporter.write_line(f"seed {seed} (FAULT_SEED={seed} replays the faults' moments)")


@pytest.fixture(scope="session")
def fault_seed() -> int:
    """The seed of the faults' moments and order: FAULT_SEED, else a fresh one (printed)."""
    raw = os.environ.get("FAULT_SEED")
    seed = int(raw) if raw else random.SystemRandom().randrange(1, 1 << 31)
    print(f"\nfault suite seed: {seed} (FAULT_SEED={seed} replays the moments)")
    SEEDS.append(seed)
    return seed


@pytest.fixture(scope="session")
def workload() -> Workload:
    return make_workload()


@pytest.fixture(scope="session")
def fault_stack(stack: ConnectionSettings) -> Iterator[Stack]:
    """The stack, every sidecar running at the start (else the suite fails, it never skips);
    afterwards every sidecar consumes again (a stuck one is restarted) and `geofence up`
    brings back whatever a fault left down."""
    s = Stack()
    dead = s.dead()
    if dead:
        pytest.fail(f"sidecars not running: {', '.join(dead)}; start them with `.venv/bin/geofence up`",
                    pytrace=False)
    gone = remove_leftover_gateways(s.settings, s.pw)
    if gone:
        say(f"removed gateway users earlier fault runs left behind: {', '.join(gone)}")
    fences = asyncio.run(remove_leftover_fences(s.conn))
    if fences:
        say(f"removed {fences} fences earlier fault runs left behind")
    try:
        yield s
    finally:
        try:
            s.restore()
        except StackError as exc:  # e.g. a sidecar that exited at once: once more, then fail
            say(f"geofence up failed ({exc}); once more")
            s.restore()
        dead = s.dead()
        assert not dead, f"sidecars still dead after `geofence up`: {', '.join(dead)}"
        say(f"removed the suite's {asyncio.run(remove_leftover_fences(s.conn))} fences")
        SESSION_FENCES.forget()
