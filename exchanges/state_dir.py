"""The durable state of a sidecar: a snapshot plus an append-only journal, in a directory of its
own (GEOFENCE_JOURNAL_DIR). An x-fence worker's records are XFence.changes (formats:
fence/x_fence/codec.py) with its proximity matcher's rows; x-ingress's are its proximity
router's (exchanges/roam_routing.py).

    snapshot-<gen>.bin   the whole state when journal <gen> was started
    journal-<gen>.log    the records since: [u32 length][u32 crc32][msgpack payload] ...

Writes are coalesced as in RabbitMQ's message store: one record per batch of messages, one
fdatasync per record, and the sidecar acks the batch only after that sync (the events it
caused were confirmed before). A crash can leave a torn record at the end of the newest
journal: its batch was never acked, so the broker redelivers it, and the torn bytes are cut
off at the next start. A torn record is only ever the last thing in the file: a bad record
followed by an intact one is damage (disk, a copy, a hand), not a crash, and the records
after it were acknowledged: the worker refuses to start (JournalDamaged) and keeps the file.

Rotation (when the journal passes `max_journal_bytes` or `max_records`, and at a clean stop): journal <gen+1>
is opened first, then the snapshot of the state at that instant is written beside it
(temporary name, fsync, rename, fsync of the directory), and only then are the older files
deleted. Recovery takes the newest complete snapshot and replays every journal from its
generation on, in order; so a crash at any point of a rotation loses nothing.

Trade-off: records hold final values (see fence/x_fence/codec.py), so a record is larger than an
operation log would be (every pair of each touched object), but replay needs no routing
code, is idempotent and cannot diverge from what the live core did.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import struct
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgpack

log = logging.getLogger("geofence")
_FRAME = struct.Struct("<II")  # length, crc32 of the payload
_SNAPSHOT_MAGIC = b"GFXFSNAP"
_NAME = re.compile(r"(snapshot|journal)-(\d{10})\.(bin|log)")
MAX_JOURNAL_BYTES = 64 << 20
# Replay costs per record too (an x-fence record merges its pairs into the sorted state: ~1 ms
# with a large state): pipelined workers write a record per small batch, and 16,000 of them
# took 18 s to replay (the fault suite's 30 s to recover ran out behind a broker restart).
MAX_RECORDS = 4_096


class JournalDamaged(RuntimeError):
    """The state directory cannot be trusted (a damaged record before the newest journal's
    end): the worker refuses to start rather than run on a wrong state."""


@dataclass
class Recovered:
    snapshot: dict[str, Any] | None  # None: a new worker
    records: list[dict[str, Any]]
    generation: int  # of the snapshot (0: none)
    torn_bytes: int  # cut off the newest journal's end


def pack(data: dict[str, Any]) -> bytes:
    out: bytes = msgpack.packb(data, use_bin_type=True)
    return out


def unpack(raw: bytes) -> dict[str, Any]:
    out: dict[str, Any] = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    return out


def frame(payload: bytes) -> bytes:
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def read_frames(data: bytes) -> tuple[list[bytes], int]:
    """The complete, intact frames at the start of `data`, and where they end (a frame is
    never empty: zeros, as a torn write may leave, are no frame)."""
    out, at = [], 0
    while at + _FRAME.size <= len(data):
        n, crc = _FRAME.unpack_from(data, at)
        end = at + _FRAME.size + n
        if n == 0 or end > len(data) or zlib.crc32(data[at + _FRAME.size:end]) != crc:
            break
        out.append(data[at + _FRAME.size:end])
        at = end
    return out, at


SCAN_LIMIT = 16 << 20  # bytes after a bad record searched for an intact one


def intact_after(data: bytes, bad: int) -> int | None:
    """Where an intact record (a frame whose payload is a msgpack map) starts after the bad
    one at `bad`, or None: what tells damage from a torn tail. The bad record's own length is
    tried first, then every offset (its length field may be what is damaged), up to
    SCAN_LIMIT bytes."""
    def intact(at: int) -> bool:
        if at + _FRAME.size > len(data):
            return False
        n, crc = _FRAME.unpack_from(data, at)
        end = at + _FRAME.size + n
        if n == 0 or end > len(data) or zlib.crc32(data[at + _FRAME.size:end]) != crc:
            return False
        try:
            return isinstance(unpack(data[at + _FRAME.size:end]), dict)
        except Exception:  # msgpack raises a zoo of types on garbage
            return False

    if bad + _FRAME.size <= len(data):
        declared: int = bad + _FRAME.size + _FRAME.unpack_from(data, bad)[0]
        if declared < len(data) and intact(declared):
            return declared
    for at in range(bad + 1, min(len(data), bad + SCAN_LIMIT)):
        if intact(at):
            return at
    return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_T = TypeVar("_T")


def _locked(method: Callable[..., _T]) -> Callable[..., _T]:
    """The method under the directory's lock (StateDir._io, reentrant)."""
    @functools.wraps(method)
    def run(self: StateDir, *args: Any, **kwargs: Any) -> _T:
        with self._io:
            return method(self, *args, **kwargs)
    return run


class StateDir:
    def __init__(self, path: Path, max_journal_bytes: int = MAX_JOURNAL_BYTES,
                 max_records: int = MAX_RECORDS) -> None:
        self.path = path
        self.max_journal_bytes = max_journal_bytes
        self.max_records = max_records
        self.generation = 0
        self._fd: int | None = None
        self.journal_bytes = 0
        self.journal_records = 0  # in the current generation
        # Writes run in threads (asyncio.to_thread) that outlive a cancelled task: a reload
        # (close, load, start) waits for the write in flight instead of closing its fd under it.
        self._io = threading.RLock()
        self.records_written = 0
        self.syncs = 0

    def _file(self, kind: str, gen: int) -> Path:
        return self.path / f"{kind}-{gen:010d}.{'bin' if kind == 'snapshot' else 'log'}"

    def _generations(self, kind: str) -> list[int]:
        found = []
        for p in self.path.iterdir():
            m = _NAME.fullmatch(p.name)
            if m and m.group(1) == kind:
                found.append(int(m.group(2)))
        return sorted(found)

    # -- recovery ----------------------------------------------------------------------------

    @_locked
    def load(self) -> Recovered:
        """The newest complete snapshot and the records after it (nothing is written)."""
        self.path.mkdir(parents=True, exist_ok=True)
        for tmp in self.path.glob("*.tmp"):
            tmp.unlink()
        snapshot, gen = None, 0
        for g in reversed(self._generations("snapshot")):
            data = self._file("snapshot", g).read_bytes()
            frames, end = read_frames(data[len(_SNAPSHOT_MAGIC):]) if data.startswith(_SNAPSHOT_MAGIC) \
                else ([], 0)
            if len(frames) == 1 and len(_SNAPSHOT_MAGIC) + end == len(data):
                snapshot, gen = unpack(frames[0]), g
                break
            log.warning("%s is incomplete; using an older snapshot", self._file("snapshot", g))
        journals = [g for g in self._generations("journal") if g >= gen]
        if snapshot is None and journals and journals[0] != 0 and self._generations("snapshot"):
            raise JournalDamaged(f"{self.path}: no readable snapshot for journal {journals[0]}")
        records: list[dict[str, Any]] = []
        torn = 0
        for i, g in enumerate(journals):
            data = self._file("journal", g).read_bytes()
            frames, end = read_frames(data)
            if end < len(data):
                if i != len(journals) - 1:
                    raise JournalDamaged(f"{self._file('journal', g)}: damaged at byte {end} of "
                                         f"{len(data)}, and newer journals follow")
                good = intact_after(data, end)
                if good is not None:
                    raise JournalDamaged(
                        f"{self._file('journal', g)}: the record at byte {end} is damaged and an intact "
                        f"one follows at byte {good} (of {len(data)}): not a torn last write but damage; "
                        "the records after it were acknowledged. The file is kept as it is: restore the "
                        "directory from a copy, or move it aside to start this worker empty")
                torn = len(data) - end
            records += [unpack(f) for f in frames]
        self.generation = max([gen, *journals]) if journals or gen else 0
        return Recovered(snapshot, records, gen, torn)

    @_locked
    def take_over(self) -> None:
        """Instead of `load`, when the state comes from elsewhere (a worker's journal stream,
        issue 38): the next generation is past every file here, which `start` then deletes."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.generation = max([0, *self._generations("snapshot"), *self._generations("journal")])

    # -- writing -----------------------------------------------------------------------------

    @_locked
    def start(self, snapshot: dict[str, Any]) -> None:
        """After `load`: a new generation from the recovered state (the old files go)."""
        self.rotate_begin()
        self.rotate_finish(pack(snapshot))

    def append(self, record: dict[str, Any]) -> None:
        """One record, synced before this returns."""
        self.append_many([record])

    @_locked
    def commit(self, records: list[dict[str, Any]], snapshot: bytes | None = None) -> int:
        """Records appended and synced, then (with `snapshot`: the state right after them) a new
        generation from it, as one step no reload can come between; the bytes appended."""
        written = self.append_many(records)
        if snapshot is not None:
            self.rotate_finish(snapshot, self.rotate_begin())
        return written

    @_locked
    def append_many(self, records: list[dict[str, Any]]) -> int:
        """Records in order, one sync for them all before this returns; the bytes written."""
        assert self._fd is not None, "start() first"
        if not records:
            return 0
        data = b"".join(frame(pack(r)) for r in records)
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        os.fdatasync(self._fd)
        self.journal_bytes += len(data)
        self.journal_records += len(records)
        self.records_written += len(records)
        self.syncs += 1
        return len(data)

    @property
    def wants_rotation(self) -> bool:
        return self.journal_bytes > self.max_journal_bytes or self.journal_records >= self.max_records

    @_locked
    def rotate_begin(self) -> int:
        """Open journal <gen+1> (appends go there from now on); returns its generation. The
        caller takes the snapshot of the state at this instant and passes it to
        `rotate_finish` (which may run in a thread: it touches no shared state)."""
        self.path.mkdir(parents=True, exist_ok=True)
        self.generation += 1
        fd = os.open(self._file("journal", self.generation), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        _fsync_dir(self.path)
        old, self._fd = self._fd, fd
        if old is not None:
            os.close(old)
        self.journal_bytes = 0
        self.journal_records = 0
        return self.generation

    @_locked
    def rotate_finish(self, snapshot: bytes, generation: int | None = None) -> None:
        gen = self.generation if generation is None else generation
        final = self._file("snapshot", gen)
        tmp = final.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(_SNAPSHOT_MAGIC + frame(snapshot))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.path)
        for kind in ("snapshot", "journal"):
            for g in self._generations(kind):
                if g < gen:
                    with contextlib.suppress(FileNotFoundError):
                        self._file(kind, g).unlink()

    @_locked
    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
