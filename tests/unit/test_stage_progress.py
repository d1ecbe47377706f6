"""The Spark stages' bars (spark_jobs/stage_progress.py) without Spark: what a poll found
becomes a bar with its tasks and time left; a stage gone is closed full; nothing is drawn
where stderr is no terminal."""

from __future__ import annotations

import io

from spark_jobs.stage_progress import Stage, StageBars


def test_a_stage_is_a_bar_with_its_time_left_closed_full_when_it_ends() -> None:
    out = io.StringIO()
    bars = StageBars(None, enabled=True, file=out)
    bars.update([Stage(3, "collect at occupancy.py:384", 10, 0)])
    bars.update([Stage(3, "collect at occupancy.py:384", 10, 4), Stage(4, "collect", 2, 0)])
    assert sorted(bars.bars) == [3, 4] and bars.bars[3].n == 4
    assert "stage 3" in out.getvalue() and "4/10" in out.getvalue()
    assert "<" in out.getvalue().split("4/10")[-1]  # tqdm's [elapsed<left] once there is a rate
    bars.update([Stage(4, "collect", 2, 1)])
    assert list(bars.bars) == [4] and "10/10" in out.getvalue()  # stage 3 done: full, closed
    with bars:
        pass
    assert bars.bars == {} and "2/2" in out.getvalue()
    assert bars.seen[3].done == 4 and bars.seen[4].tasks == 2


def test_nothing_is_drawn_where_stderr_is_no_terminal() -> None:
    out = io.StringIO()
    with StageBars(None, file=out) as bars:
        assert not bars.enabled and bars._thread is None
    assert out.getvalue() == ""
