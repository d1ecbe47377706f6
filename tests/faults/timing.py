"""How long the fault suite waits for things, how it polls for them, and its progress lines.

Every deadline of the suite is here (seconds): the recovery of a fault is measured against
CONSUMER_DEADLINE_S and FLOW_DEADLINE_S, the end of a run against SETTLE_DEADLINE_S and the
quiet spells, the archive against ARCHIVE_*; `poll_until` checks every POLL_S.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

POLL_S = 0.1
CONSUMER_DEADLINE_S = 30.0  # after a fault, a sidecar consumes again within this (backoff cap 10 s)
FLOW_DEADLINE_S = 30.0  # ... and its first new event comes out within this
SETTLE_DEADLINE_S = 150.0  # after the last position is confirmed, for the last events
QUIET_S = 8.0  # no delivery for this long and no backlog: nothing more is coming
QUIET_LONG_S = 30.0  # no delivery for this long: nothing more is coming, whatever the backlog
GRACE_S = 2.0  # listening on after the last expected event (a late duplicate is seen)
ARCHIVE_STUCK_S = 15.0  # the archive table did not grow for this long: it will not
ARCHIVE_DEADLINE_S = 150.0  # the longest wait for the archiver to catch up
PUBLISH_TIMEOUT_S = 30.0  # a confirm not back by then counts as failed (republished)


def say(line: str) -> None:
    """A progress line of the suite: timestamped, printed at once (pytest -s shows it live)."""
    print(f"[faults {time.strftime('%H:%M:%S')}] {line}", flush=True)


async def poll_until(check: Callable[[], Awaitable[bool]], deadline: float) -> bool:
    """True once check() holds, False at the deadline (seconds)."""
    end = time.monotonic() + deadline
    while True:
        if await check():
            return True
        if time.monotonic() > end:
            return False
        await asyncio.sleep(POLL_S)
