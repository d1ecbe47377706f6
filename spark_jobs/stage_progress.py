"""A nightly job's running Spark stages as bars with their time left (issue 40: a progress bar
with an ETA on every operation that takes more than a few seconds), on a terminal: `geofence
spark occupancy-analytics` run by hand. Spark's own console bar says tasks done, not the time
left, so the session turns it off (session.py) and this one shows instead.

A thread polls the session's status tracker every EVERY_S: each active stage gets a bar of its
tasks (done of total, the rate, the time left), closed full when the stage leaves the active
set. Where stderr is no terminal (a timer's run, the journal) nothing is drawn: the job's own
lines say its phases.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any

from tqdm import tqdm

EVERY_S = 0.5


@dataclass(frozen=True)
class Stage:
    id: int
    name: str
    tasks: int
    done: int


class StageBars:
    def __init__(self, spark: Any, enabled: bool | None = None, file: IO[str] | None = None,
                 every_s: float = EVERY_S) -> None:
        self.spark, self.every_s = spark, every_s
        self.file = file if file is not None else sys.stderr
        self.enabled = self.file.isatty() if enabled is None else enabled
        self.bars: dict[int, tqdm[Any]] = {}
        self.seen: dict[int, Stage] = {}  # each stage as it was last drawn
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> StageBars:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="spark stage bars", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.update([])
        for bar in self.bars.values():
            bar.close()

    def active(self) -> list[Stage]:
        """The session's active stages, from its status tracker."""
        tracker = self.spark.sparkContext.statusTracker()
        out = []
        for sid in tracker.getActiveStageIds():
            info = tracker.getStageInfo(sid)
            if info is not None:
                out.append(Stage(int(sid), str(info.name), int(info.numTasks), int(info.numCompletedTasks)))
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.update(self.active())
            except Exception:  # a session stopping under the poll: nothing more to draw
                return

    def update(self, stages: list[Stage]) -> None:
        """The bars as `stages` say: new ones opened, progress set, the stages gone closed full."""
        now = {s.id for s in stages}
        for s in stages:
            bar = self.bars.get(s.id)
            if bar is None:
                bar = self.bars[s.id] = tqdm(total=s.tasks, desc=f"stage {s.id}", unit=" task",
                                             file=self.file, dynamic_ncols=True, mininterval=0.2, leave=True)
            bar.total = s.tasks
            bar.update(s.done - bar.n)
            bar.refresh()  # once a poll: tqdm's own interval would skip a poll's change
            self.seen[s.id] = s
        for sid in [sid for sid in self.bars if sid not in now]:
            bar = self.bars.pop(sid)
            bar.update((bar.total or 0) - bar.n)
            bar.close()
