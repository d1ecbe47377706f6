"""The archive's months without a database (fence/archive_months.py): which months have passed
the retention, the names of a month's table and of a detached one, and the months a batch of
events touches (fence/store.py `month_starts`, the tables the archiver makes first)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fence import archive_months as am
from fence.store import month_starts
from spark_jobs.archive_export import part_path


def month(y: int, m: int) -> am.Month:
    return am.Month(f"fence_event_{y:04d}_{m:02d}", y, m, 10, 8192)


MONTHS = [month(2025, 11), month(2025, 12), month(2026, 1), month(2026, 2), month(2026, 3)]


def test_no_retention_keeps_every_month() -> None:
    assert am.expired(MONTHS, datetime(2030, 1, 1, tzinfo=UTC), 0) == []


@pytest.mark.parametrize(("now", "days", "gone"), [
    # a month leaves once its last instant is `days` old: January ends 2026-02-01 00:00
    (datetime(2026, 3, 3, tzinfo=UTC), 30, ["2025-11", "2025-12", "2026-01"]),
    (datetime(2026, 3, 2, 23, 59, tzinfo=UTC), 30, ["2025-11", "2025-12"]),
    (datetime(2026, 3, 15, tzinfo=UTC), 1, ["2025-11", "2025-12", "2026-01", "2026-02"]),
    (datetime(2026, 1, 1, tzinfo=UTC), 400, []),
])
def test_a_month_leaves_when_its_last_day_is_past_the_retention(now: datetime, days: int,
                                                                gone: list[str]) -> None:
    assert [m.label for m in am.expired(list(reversed(MONTHS)), now, days)] == gone


def test_month_bounds_and_names_cross_the_year() -> None:
    dec = month(2025, 12)
    assert (dec.start, dec.end) == (datetime(2025, 12, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC))
    assert am.table_name(datetime(2026, 1, 31, 23, 59, tzinfo=UTC)) == "fence_event_2026_01"
    assert am.next_month(datetime(2024, 1, 31, tzinfo=UTC)) == datetime(2024, 2, 1, tzinfo=UTC)
    assert am.MONTH_RE.fullmatch("fence_event_2026_01")
    assert not am.MONTH_RE.fullmatch("fence_event_2026_01_out_5")
    assert am.LEAVING_RE.fullmatch("fence_event_2026_01_out_1796010340")


def test_a_batch_touches_the_months_of_its_events_once_each() -> None:
    jan31 = datetime(2026, 1, 31, 23, 59, 59, tzinfo=UTC).timestamp()
    feb1 = datetime(2026, 2, 1, tzinfo=UTC).timestamp()
    assert month_starts([feb1 + 5, jan31, feb1, jan31 - 86400 * 20, 0.0]) == [
        0.0, datetime(2026, 1, 1, tzinfo=UTC).timestamp(), feb1]
    assert month_starts([]) == []


def test_only_a_detached_month_is_dropped_or_exported(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert part_path(tmp_path, "fence_event_2026_01_out_7") == (
        tmp_path / "fence_event" / "month=2026-01" / "part-7.parquet")
    with pytest.raises(ValueError, match="no detached month"):
        part_path(tmp_path, "fence_event_2026_01")
    with pytest.raises(ValueError, match="no detached month"):
        import asyncio
        asyncio.run(am.drop(None, 'fence_event"; DROP TABLE fence; --'))  # type: ignore[arg-type]
