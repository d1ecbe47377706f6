"""A worker's journal shipped to its backups (issue 38): the frames a master publishes to its
stream (`x-fence.<worker>.journal`, a RabbitMQ stream queue) and what a backup rebuilds from
them. Pure: bytes and headers in, the state to load out; the shells publish and consume.

The stream carries, in the master's order (its pipeline's tails are serial):
- a snapshot of generation g as `parts` frames (a message is at most the broker's
  max_message_size: a snapshot of a few hundred thousand objects is tens of MB), then
- the journal records of generation g, numbered from 0, one frame per journaled step.

A backup keeps the newest complete snapshot and the records after it. A snapshot whose parts
never all arrive (its master died while writing it) is ignored: the previous generation and
its records stand. A record that is not the next of its generation (a gap) makes the log
unusable until the next complete snapshot (`broken`): the backup then has to be told, and
its promotion must wait or read the stream again from an older snapshot.

Trade-off: a backup replays records as the master wrote them, so its state is the master's
at its last shipped step; the steps after it are redelivered to the promoted backup (inputs
were acked only after shipping) and their events carry the same ids (deduplicated by id).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

KIND, GEN, PART, PARTS, SEQ, MASTER = "gf-kind", "gf-gen", "gf-part", "gf-parts", "gf-seq", "gf-master"
# on every frame: when (ms since the epoch, the writer's clock) its writer's newest snapshot began:
# a reader new to the stream starts a little before it, not at the stream's first offset
SINCE = "gf-since"
SNAPSHOT, RECORDS, MARKER = "snapshot", "records", "marker"
PART_BYTES = 8 * 1024 * 1024  # under the broker's 16 MiB message bound (deploy/broker_host.py)


@dataclass(frozen=True)
class Frame:
    headers: dict[str, Any]
    body: bytes


def snapshot_frames(generation: int, data: bytes, part_bytes: int = PART_BYTES,
                    master: str = "", since: int = 0) -> list[Frame]:
    """A snapshot as frames of at most `part_bytes` (one, empty, for an empty snapshot)."""
    if part_bytes < 1:
        raise ValueError("part_bytes must be positive")
    pieces = [data[i:i + part_bytes] for i in range(0, len(data), part_bytes)] or [b""]
    return [Frame({KIND: SNAPSHOT, GEN: generation, PART: i, PARTS: len(pieces), MASTER: master,
                   SINCE: since}, p) for i, p in enumerate(pieces)]


def records_frame(generation: int, seq: int, body: bytes, master: str = "", since: int = 0) -> Frame:
    return Frame({KIND: RECORDS, GEN: generation, SEQ: seq, MASTER: master, SINCE: since}, body)


def marker_frame(master: str, token: str, since: int = 0) -> Frame:
    """Written by a master when its session begins, its instance lock held: a reader that
    sees it has read everything written before (`ReplicaLog.writer_before`)."""
    return Frame({KIND: MARKER, MASTER: master, SINCE: since}, token.encode())


def backed_by(worker: str, workers: list[str] | tuple[str, ...], copies: int) -> list[str]:
    """The workers `worker`'s process backs up: each worker is backed by the `copies` workers
    after it in name order (wrapping), so this is the `copies` before it; none when alone."""
    order = sorted(set(workers))
    if worker not in order:
        raise ValueError(f"{worker!r} is not one of {order}")
    n, i = len(order), order.index(worker)
    return [order[(i - k) % n] for k in range(1, min(copies, n - 1) + 1)]


@dataclass
class Recovered:
    generation: int
    snapshot: bytes
    records: list[bytes]
    first_offset: int  # the stream offset of the snapshot's first part: where a reader restarts
    since: int = 0  # its SINCE header: when its master began it


@dataclass
class ReplicaLog:
    """What a backup has read of its master's stream."""

    last_offset: int = -1
    max_generation: int = 0  # the newest generation seen (a new master ships the next one)
    last_writer: str | None = None  # the master of the newest frame read (None: none yet)
    broken: str = ""  # why the records after the snapshot cannot be trusted ("" while they can)
    _done: Recovered | None = None
    # generation -> (its first part's offset, parts, the parts read, its SINCE)
    _parts: dict[int, tuple[int, int, dict[int, bytes], int]] = field(default_factory=dict)
    _markers: dict[str, str | None] = field(default_factory=dict)  # token -> the writer before it

    def feed(self, offset: int, headers: Mapping[str, Any], body: bytes) -> None:
        """One delivery of the stream, in offset order; a redelivered offset is ignored."""
        if offset <= self.last_offset:
            return
        self.last_offset = offset
        kind, gen, master = headers.get(KIND), headers.get(GEN), headers.get(MASTER)
        if kind == MARKER:
            self._markers[body.decode(errors="replace")] = self.last_writer
            self.last_writer = str(master)
            return
        self.last_writer = str(master)
        if not isinstance(gen, int):
            raise ValueError(f"stream offset {offset}: no generation")
        self.max_generation = max(self.max_generation, gen)
        if kind == SNAPSHOT:
            self._snapshot_part(offset, gen, headers, body)
        elif kind == RECORDS:
            self._record(gen, headers.get(SEQ), body)
        else:
            raise ValueError(f"stream offset {offset}: unknown frame kind {kind!r}")

    def _snapshot_part(self, offset: int, gen: int, headers: Mapping[str, Any], body: bytes) -> None:
        part, parts = headers.get(PART), headers.get(PARTS)
        if not (isinstance(part, int) and isinstance(parts, int) and 0 <= part < parts):
            raise ValueError(f"stream offset {offset}: bad snapshot part {part!r} of {parts!r}")
        if part == 0:
            since = headers.get(SINCE)
            self._parts[gen] = (offset, parts, {}, since if isinstance(since, int) else 0)
        if gen not in self._parts:  # a snapshot whose start was before what we read: useless
            return
        first, n, got, since = self._parts[gen]
        got[part] = body
        if len(got) == n:
            del self._parts[gen]
            self._parts = {g: v for g, v in self._parts.items() if g > gen}  # older unfinished ones
            self._done = Recovered(gen, b"".join(got[i] for i in range(n)), [], first, since)
            self.broken = ""

    def _record(self, gen: int, seq: object, body: bytes) -> None:
        done = self._done
        if done is None or gen != done.generation:
            # records of a generation whose snapshot we do not have (before our first one, or
            # a newer one whose snapshot is still arriving: it carries their effects)
            return
        if seq != len(done.records):
            if not self.broken:
                self.broken = f"generation {gen}: record {seq!r} after {len(done.records)} records"
            return
        if not self.broken:
            done.records.append(body)

    def writer_before(self, token: str) -> tuple[bool, str | None]:
        """Whether the marker `token` was read, and the master of the frame before it."""
        if token not in self._markers:
            return False, None
        return True, self._markers[token]

    def recovered(self) -> Recovered | None:
        """The newest complete snapshot and the records after it, if usable."""
        if self._done is None or self.broken:
            return None
        return self._done
