"""The x-fence state directory: what a crash at any point leaves is recovered, a torn record
is cut off, damage that cannot come from a crash stops the worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from exchanges.state_dir import JournalDamaged, StateDir, frame, pack, read_frames


def started(path: Path, snapshot: dict | None = None) -> StateDir:  # type: ignore[type-arg]
    d = StateDir(path)
    got = d.load()
    assert got.snapshot is None and got.records == []
    d.start(snapshot or {"state": 0})
    return d


def test_a_new_directory_is_a_new_worker(tmp_path: Path) -> None:
    got = StateDir(tmp_path / "w0").load()
    assert (got.snapshot, got.records, got.generation, got.torn_bytes) == (None, [], 0, 0)


def test_records_after_the_snapshot_come_back_in_order(tmp_path: Path) -> None:
    d = started(tmp_path)
    for i in range(5):
        d.append({"i": i, "blob": b"x" * i})
    d.close()
    got = StateDir(tmp_path).load()
    assert got.snapshot == {"state": 0} and got.generation == 1
    assert [r["i"] for r in got.records] == [0, 1, 2, 3, 4] and got.records[3]["blob"] == b"xxx"


def test_a_torn_last_record_is_cut_off(tmp_path: Path) -> None:
    d = started(tmp_path)
    d.append({"i": 0})
    d.append({"i": 1})
    d.close()
    journal = tmp_path / "journal-0000000001.log"
    data = journal.read_bytes()
    journal.write_bytes(data[:-3])  # the crash hit during the last write
    got = StateDir(tmp_path).load()
    assert [r["i"] for r in got.records] == [0] and got.torn_bytes > 0
    journal.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # or garbage was written
    assert [r["i"] for r in StateDir(tmp_path).load().records] == [0]


def test_rotation_interrupted_before_the_snapshot_is_durable_loses_nothing(tmp_path: Path) -> None:
    d = started(tmp_path)
    d.append({"i": 0})
    gen = d.rotate_begin()  # journal 2 open, snapshot 2 not written: the crash
    d.append({"i": 1})
    d.close()
    assert gen == 2 and not (tmp_path / "snapshot-0000000002.bin").exists()
    (tmp_path / "snapshot-0000000002.tmp").write_bytes(b"half a snapshot")
    got = StateDir(tmp_path).load()
    assert got.snapshot == {"state": 0} and [r["i"] for r in got.records] == [0, 1]
    assert not (tmp_path / "snapshot-0000000002.tmp").exists()


def test_a_finished_rotation_starts_from_the_new_snapshot_and_deletes_the_old_files(tmp_path: Path) -> None:
    d = started(tmp_path)
    d.append({"i": 0})
    gen = d.rotate_begin()
    d.append({"i": 1})  # appends go on while the snapshot is written
    d.rotate_finish(pack({"state": "after 0"}), gen)
    d.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal-0000000002.log", "snapshot-0000000002.bin"]
    got = StateDir(tmp_path).load()
    assert got.snapshot == {"state": "after 0"} and [r["i"] for r in got.records] == [1]


def test_start_after_recovery_makes_a_new_generation(tmp_path: Path) -> None:
    d = started(tmp_path)
    d.append({"i": 0})
    d.close()
    again = StateDir(tmp_path)
    got = again.load()
    again.start({"state": "recovered", "records": len(got.records)})
    again.append({"i": 9})
    again.close()
    final = StateDir(tmp_path).load()
    assert final.generation == 2 and final.snapshot == {"state": "recovered", "records": 1}
    assert [r["i"] for r in final.records] == [9]


def test_damage_before_the_newest_journal_stops_the_worker(tmp_path: Path) -> None:
    d = started(tmp_path)
    d.append({"i": 0})
    d.rotate_begin()  # a crash left journals 1 and 2 beside snapshot 1
    d.append({"i": 1})
    d.close()
    j1 = tmp_path / "journal-0000000001.log"
    j1.write_bytes(j1.read_bytes()[:-2])
    with pytest.raises(JournalDamaged, match="newer journals follow"):
        StateDir(tmp_path).load()


def test_a_damaged_snapshot_falls_back_to_the_previous_one_with_its_journals(tmp_path: Path) -> None:
    d = started(tmp_path)
    d.append({"i": 0})
    gen = d.rotate_begin()
    d.append({"i": 1})
    d.close()
    # snapshot 2 exists but is damaged (the disk, not a crash: rename is atomic)
    (tmp_path / f"snapshot-{gen:010d}.bin").write_bytes(b"GFXFSNAP" + frame(b"\x81")[:-1])
    got = StateDir(tmp_path).load()
    assert got.snapshot == {"state": 0} and [r["i"] for r in got.records] == [0, 1]


def test_frames_stop_at_the_first_bad_one() -> None:
    data = frame(b"one") + frame(b"two") + b"\x05\x00\x00\x00"
    assert read_frames(data) == ([b"one", b"two"], len(frame(b"one") + frame(b"two")))


def test_rotation_is_wanted_by_size_or_by_number_of_records(tmp_path: Path) -> None:
    d = StateDir(tmp_path, max_journal_bytes=10_000, max_records=5)
    d.start({"n": 0})
    assert d.append_many([{"i": i} for i in range(4)]) > 0 and not d.wants_rotation
    d.append({"i": 4})
    assert d.wants_rotation and d.syncs == 2, "five records, two syncs: many records share one"
    d.rotate_finish(pack({"n": 5}), d.rotate_begin())
    assert not d.wants_rotation and d.journal_records == 0
    d.append({"big": "x" * 20_000})
    assert d.wants_rotation, "one record past the byte limit"
    d.close()
    got = StateDir(tmp_path).load()
    assert got.snapshot == {"n": 5} and got.records == [{"big": "x" * 20_000}]


def test_a_damaged_record_followed_by_intact_ones_is_damage_not_a_torn_tail(tmp_path: Path) -> None:
    """Issue 34: a record whose checksum fails in the middle of the newest journal was cut off
    as a torn tail with every acknowledged record after it. A torn write is only ever last:
    a bad record with an intact one after it stops the worker, and the file is kept."""
    d = started(tmp_path)
    for i in range(4):
        d.append({"i": i, "pad": b"p" * 40})
    d.close()
    journal = tmp_path / "journal-0000000001.log"
    data = journal.read_bytes()
    frames, _ = read_frames(data)
    second = 8 + len(frames[0])  # where record 1 starts
    flipped = bytearray(data)
    flipped[second + 12] ^= 0x01  # one bit of record 1's payload
    journal.write_bytes(bytes(flipped))
    with pytest.raises(JournalDamaged, match="intact one follows"):
        StateDir(tmp_path).load()
    assert journal.read_bytes() == bytes(flipped)  # kept as it was
    length_hit = bytearray(data)
    length_hit[second] ^= 0x40  # record 1's length field: its end is no longer where record 2 starts
    journal.write_bytes(bytes(length_hit))
    with pytest.raises(JournalDamaged, match="intact one follows"):
        StateDir(tmp_path).load()


def test_zeros_after_the_last_record_are_a_torn_tail(tmp_path: Path) -> None:
    """What a crash leaves when the file grew but its data never reached the disk: zeros."""
    d = started(tmp_path)
    d.append({"i": 0})
    d.close()
    journal = tmp_path / "journal-0000000001.log"
    journal.write_bytes(journal.read_bytes() + bytes(4096))
    got = StateDir(tmp_path).load()
    assert [r["i"] for r in got.records] == [0] and got.torn_bytes == 4096
