"""The stages' bars on a real Spark session (spark_jobs/stage_progress.py): a stage of four
tasks, each waiting for a file the test writes once the poll has seen the stage, so the bar is
drawn while the stage runs, then closed full when it ends."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from typing import Any

from spark_jobs.stage_progress import StageBars


def _wait_for(flag: str) -> Any:
    def task(x: int) -> int:
        import os
        import time as t

        end = t.monotonic() + 60
        while not os.path.exists(flag) and t.monotonic() < end:
            t.sleep(0.05)  # a task waiting for the driver's go, with a deadline
        return x
    return task


def test_a_running_stage_is_a_bar_with_its_tasks_then_closed_full(spark: Any, tmp_path: Path) -> None:
    flag = tmp_path / "go"
    out = io.StringIO()
    got: list[int] = []
    with StageBars(spark, enabled=True, file=out, every_s=0.1) as bars:
        job = threading.Thread(target=lambda: got.extend(
            spark.sparkContext.parallelize(range(4), 4).map(_wait_for(str(flag))).collect()))
        job.start()
        end = time.monotonic() + 60
        while not any(s.tasks == 4 for s in bars.seen.values()):
            assert time.monotonic() < end, "the stage never showed as active"
            time.sleep(0.05)  # polling the bars' view, with a deadline
        flag.touch()
        job.join(60)
    assert sorted(got) == [0, 1, 2, 3]
    stage = next(s for s in bars.seen.values() if s.tasks == 4)
    assert f"stage {stage.id}" in out.getvalue() and "4/4" in out.getvalue()
    assert bars.bars == {}
