"""The workload's fences, stored once for the whole fault suite rather than by every run:
storing and removing 1,000 fences took 18 s of each row. A run's objects are its own (named
with the run's prefix) and its close parks them outside every fence, so in the shared fences
a run sees only its own objects' events (tests/faults/clients.EventCollector). The suite's
fixture removes them at the session's end (tests/faults/tenants.remove_leftover_fences), and
the next session does at its start after a crash."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from bench import broker_modes as bm
from bench import workload as wl
from deploy.settings import ConnectionSettings
from tests.faults.tenants import RUN_GATEWAY_PREFIX


class SessionFences:
    def __init__(self) -> None:
        # `b...`: the names remove_leftover_fences looks for
        self.prefix = f"b{RUN_GATEWAY_PREFIX}s{uuid.uuid4().hex[:6]}-"
        self.stored = False

    async def ensure(self, conn: ConnectionSettings, fences: Sequence[wl.Fence]) -> None:
        """The fences stored (the first run of the session stores them, the others find them)."""
        if not self.stored:
            await bm.put_fences(conn, fences)
            self.stored = True

    def forget(self) -> None:
        """They were removed (the end of the session): a later run stores them again."""
        self.stored = False


SESSION_FENCES = SessionFences()
