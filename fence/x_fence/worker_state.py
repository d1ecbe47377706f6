"""A worker's whole state as its journal rebuilds it: the core (XFence) and the proximity
matcher, from a snapshot (the sidecar's `_state`: the core's, with the matcher's under
"roam") and the journal records after it (the core's changes, or {"roam": [messages]}).
Pure: the local journal (exchanges/state_dir.py) and the worker's stream (replica.py) both
give their snapshot and records here, and a backup keeps one current as records come."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fence.x_fence import roaming
from fence.x_fence.core import XFence


@dataclass
class WorkerState:
    worker: str
    core: XFence
    roam: roaming.RoamMatcher | None = None

    @classmethod
    def of(cls, snapshot: dict[str, Any] | None, worker: str) -> WorkerState:
        if snapshot is None:
            return cls(worker, XFence(worker))
        roam = snapshot.get("roam")
        return cls(worker, XFence.restore(snapshot),
                   roaming.matcher_of(roam, worker) if roam is not None else None)

    def apply(self, record: dict[str, Any]) -> None:
        """One journal record, as the live worker's step left it."""
        if "roam" in record:  # the proximity messages applied, again (their events were sent)
            for msg in record["roam"]:
                self.roam, _ = roaming.step(self.roam, msg, self.worker)
        else:
            self.core.apply(record)
