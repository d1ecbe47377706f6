"""A live operation's progress (deploy/progress.Steps): its lines as before off a terminal, the
number of steps of a successful run learned for the next run's bar (its end, hence its ETA), a
failed run learning nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploy.progress import Steps


def test_lines_are_printed_and_the_count_is_learned(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    record = tmp_path / "progress.json"
    with Steps("region add c", "region add", record, "geofence region") as steps:
        assert steps.bar.total is None  # never ran: steps and time, no end
        steps.say("splitting a")
        steps.say("x-geo-c started")
    assert capsys.readouterr().out.splitlines() == ["geofence region: splitting a",
                                                   "geofence region: x-geo-c started"]
    assert json.loads(record.read_text()) == {"region add": 2}
    with Steps("region add d", "region add", record, "geofence region") as steps:
        assert steps.bar.total == 2  # the last run's count: the bar has an end
        steps.say("one")


def test_a_failed_run_teaches_nothing(tmp_path: Path) -> None:
    record = tmp_path / "progress.json"
    record.write_text(json.dumps({"worker add": 7}))
    with pytest.raises(RuntimeError), \
            Steps("worker add w2", "worker add", record, "geofence worker") as steps:
        steps.say("planned")
        raise RuntimeError("refused")
    assert json.loads(record.read_text()) == {"worker add": 7}
    record.write_text("not json")
    with Steps("worker add w2", "worker add", record, "geofence worker") as steps:
        assert steps.bar.total is None  # a damaged record is no record
        steps.say("planned")
    assert json.loads(record.read_text()) == {"worker add": 1}
