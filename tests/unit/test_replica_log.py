"""exchanges/replica_log.py: a backup rebuilds its master's state from the stream's frames: the
newest complete snapshot and the records after it; an unfinished snapshot, a redelivery, a gap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exchanges.replica_log import Frame, ReplicaLog, backed_by, marker_frame, records_frame, snapshot_frames


def fed(frames: list[Frame], start: int = 0) -> ReplicaLog:
    log = ReplicaLog()
    for i, f in enumerate(frames):
        log.feed(start + i, f.headers, f.body)
    return log


@given(st.binary(max_size=5000), st.integers(min_value=1, max_value=700))
def test_a_snapshot_in_parts_comes_back_whole(data: bytes, part: int) -> None:
    frames = snapshot_frames(3, data, part)
    assert all(len(f.body) <= part for f in frames) and len(frames) == max(1, -(-len(data) // part))
    got = fed(frames).recovered()
    assert got is not None
    assert (got.generation, got.snapshot, got.records, got.first_offset) == (3, data, [], 0)


def test_the_records_after_the_newest_complete_snapshot() -> None:
    frames = [*snapshot_frames(1, b"s1" * 10, 7), records_frame(1, 0, b"a"), records_frame(1, 1, b"b"),
              *snapshot_frames(2, b"s2" * 10, 7), records_frame(2, 0, b"c")]
    got = fed(frames, start=100).recovered()
    assert got is not None and got.generation == 2 and got.snapshot == b"s2" * 10 and got.records == [b"c"]
    assert got.first_offset == 100 + 5  # 3 parts of the first snapshot, 2 records


def test_an_unfinished_snapshot_leaves_the_previous_generation_standing() -> None:
    newer = snapshot_frames(2, b"x" * 30, 10)
    frames = [*snapshot_frames(1, b"old", 10), records_frame(1, 0, b"a"), *newer[:2]]  # its master died
    got = fed(frames).recovered()
    assert got is not None and (got.generation, got.snapshot, got.records) == (1, b"old", [b"a"])


def test_a_redelivered_offset_is_read_once() -> None:
    log = ReplicaLog()
    frames = [*snapshot_frames(1, b"s", 10), records_frame(1, 0, b"a"), records_frame(1, 1, b"b")]
    for i, f in enumerate(frames):
        log.feed(i, f.headers, f.body)
    log.feed(1, frames[1].headers, frames[1].body)  # a consumer reconnected one offset back
    got = log.recovered()
    assert got is not None and got.records == [b"a", b"b"]


def test_a_gap_breaks_the_log_until_the_next_snapshot() -> None:
    log = fed([*snapshot_frames(1, b"s", 10), records_frame(1, 0, b"a"), records_frame(1, 2, b"c")])
    assert log.recovered() is None and "record 2 after 1" in log.broken
    for i, f in enumerate([*snapshot_frames(2, b"t", 10), records_frame(2, 0, b"d")], start=10):
        log.feed(i, f.headers, f.body)
    got = log.recovered()
    assert got is not None and (got.snapshot, got.records, log.broken) == (b"t", [b"d"], "")


def test_reading_from_the_middle_waits_for_a_snapshot_start() -> None:
    frames = [*snapshot_frames(1, b"y" * 25, 10), records_frame(1, 0, b"a"), *snapshot_frames(2, b"z", 10)]
    log = fed(frames[1:], start=1)  # the stream's retention began inside generation 1's snapshot
    got = log.recovered()
    assert got is not None and (got.generation, got.snapshot, got.records) == (2, b"z", [])


def test_a_frame_of_no_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown frame kind"):
        ReplicaLog().feed(0, {"gf-gen": 1}, b"")
    with pytest.raises(ValueError, match="no generation"):
        ReplicaLog().feed(0, {"gf-kind": "records"}, b"")


def test_each_worker_is_backed_by_the_next_ones_in_name_order() -> None:
    ws = ["w2", "w0", "w1"]
    assert backed_by("w0", ws, 1) == ["w2"] and backed_by("w1", ws, 1) == ["w0"]
    assert backed_by("w0", ws, 2) == ["w2", "w1"] and backed_by("w0", ws, 5) == ["w2", "w1"]
    assert backed_by("w0", ["w0"], 1) == [] and backed_by("w0", ws, 0) == []
    # every worker has `copies` backups, none of them itself
    for copies in (1, 2):
        holders = {w: [p for p in ws if w in backed_by(p, ws, copies)] for w in ws}
        assert all(len(h) == copies and w not in h for w, h in holders.items())
    with pytest.raises(ValueError):
        backed_by("w9", ws, 1)


def test_the_newest_snapshot_says_when_it_began_and_markers_who_wrote_before() -> None:
    frames = [*snapshot_frames(4, b"s", 10, "m1", since=1234), records_frame(4, 0, b"a", "m1", 1234),
              marker_frame("m2", "m2#1", 1234)]
    log = fed(frames)
    got = log.recovered()
    assert got is not None and got.since == 1234 and log.max_generation == 4
    assert log.writer_before("m2#1") == (True, "m1") and log.writer_before("m3#1") == (False, None)
    assert log.last_writer == "m2"
