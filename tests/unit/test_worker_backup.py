"""A worker's backup (issue 38) through the real x-fence shell and core, the broker replaced
by a list: what the master ships to its stream (fence/x_fence/replica.py), read by a backup's
ReplicaLog (exchanges/replica_log.py) into its hot shadow, and a takeover from it.

- the shadow kept current record by record is the master's state, and so is a takeover's;
- a batch cut off before its record was shipped is not in the backup's state: the backup,
  given the redelivered batch, gives the master's events again with the same ids (dropped by
  event_id downstream), none lost;
- a marker says who wrote the stream before a session began (a later session of a master
  that finds another writer there stands down: replica.check_in).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiormq
import pytest

from deploy.rabbitmq import definitions as d
from exchanges import replica_log, shell
from exchanges import topology as t
from exchanges.hash_ring import HashRing
from exchanges.replica_log import ReplicaLog, marker_frame
from exchanges.shell import replica_stream
from exchanges.x_geo.core import XGeo
from fence.x_fence.replica import Replica, Shadow
from fence.x_fence.sidecar import FenceSidecar
from tests.unit.test_fence_sidecar_durability import (
    BINDING,
    FENCE,
    HALF,
    TS,
    Exchange,
    events,
    positions,
    publishing,
    settled,
    sidecar,
)

JOURNAL = t.fence_journal_queue("w0")


@pytest.fixture
def geo() -> XGeo:
    g = XGeo("a", ["w0"], HashRing(["w0"]))
    g.add_binding(BINDING)
    return g


def shipped(outs: list[shell.Out]) -> list[shell.Out]:
    return [o for o in outs if o.routing_key == JOURNAL]


class Stream:
    """The stream as a backup reads it: frames in order, offsets from 0."""

    def __init__(self) -> None:
        self.frames: list[shell.Out] = []

    def add(self, outs: list[shell.Out]) -> None:
        self.frames += shipped(outs)

    def read(self, log: ReplicaLog | None = None) -> ReplicaLog:
        log = log if log is not None else ReplicaLog()
        for offset, o in enumerate(self.frames):
            log.feed(offset, dict(o.headers or {}), o.body)
        return log


def with_replica(sc: FenceSidecar, replica: Replica) -> FenceSidecar:
    sc.replica = replica
    sc.out_ch = SimpleNamespace(default_exchange=Exchange(""))  # type: ignore[assignment]
    return sc


async def master(tmp_path: Path, stream: Stream) -> FenceSidecar:
    sc = with_replica(sidecar(tmp_path / "master"), Replica("w0"))
    sc.core.define(FENCE, TS - 100)
    sc.recovered = True
    with publishing() as outs:
        await sc._prepare(asyncio.Event())
    stream.add(outs)
    return sc


def state_of(sc: FenceSidecar) -> tuple[Any, ...]:
    s = sc.core.stats()
    return (sc.core.fences_of("car-1"), s["objects"], s["inside_pairs"], s["fences"])


async def test_the_backup_s_shadow_and_takeover_are_the_master_s_state(tmp_path: Path, geo: XGeo) -> None:
    stream = Stream()
    sc = await master(tmp_path, stream)
    assert len(stream.frames) == 1 and stream.frames[0].headers["gf-kind"] == "snapshot"  # type: ignore[index]
    log, shadow = ReplicaLog(), Shadow("w0")
    for i, (ts, h) in enumerate([(TS, 5), (TS + 1, 6), (TS + 2, HALF + 5), (TS + 3, 7)]):
        with publishing() as outs:
            await settled(sc, sc.handle_inputs(positions(geo, ts, h)))
        stream.add(outs)
        assert len(shipped(outs)) == 1, "one records frame per journaled step"
        got = stream.read(log).recovered()
        assert got is not None and len(got.records) == i + 1
        shadow.catch_up(got)  # as the standby does, step by step
        assert shadow.state is not None
        assert shadow.state.core.fences_of("car-1") == sc.core.fences_of("car-1")
    # a takeover in another process: its state from the stream, the standby's work reused
    backup = with_replica(sidecar(tmp_path / "backup"), Replica("w0"))
    assert backup.replica is not None
    backup.replica.follower.log, backup.replica.shadow = log, shadow
    where = backup._load(True)
    assert where == f"stream {JOURNAL}" and state_of(backup) == state_of(sc)


async def test_a_batch_cut_off_before_it_was_shipped_is_redelivered_to_the_backup(tmp_path: Path,
                                                                                  geo: XGeo) -> None:
    stream = Stream()
    sc = await master(tmp_path, stream)
    with publishing() as outs:
        await settled(sc, sc.handle_inputs(positions(geo, TS, 5)))
    stream.add(outs)
    leave = positions(geo, TS + 1, HALF + 5)
    with publishing(fail=True) as cut, pytest.raises(ConnectionError):
        await settled(sc, sc.handle_inputs(leave))  # the master's host dies here
    stream.add(cut)  # (a publish that failed: nothing of it reached the stream's confirms)
    assert not shipped(cut), "the step's records are shipped only after its events were confirmed"
    first = events(cut)
    backup = with_replica(sidecar(tmp_path / "backup"), Replica("w0"))
    assert backup.replica is not None
    backup.replica.follower.log = stream.read()
    backup._load(True)
    backup.recovered = True
    assert backup.core.fences_of("car-1") == ["f-1"], "the acked ENTER is in the backup's state"
    with publishing():
        await backup._start_journal()
    with publishing() as again:
        await settled(backup, backup.handle_inputs(leave))  # the redelivery, to the backup
    assert events(again) == first, "the same LEAVE, the same event id"


async def test_markers_say_who_wrote_the_stream_before_a_session(tmp_path: Path) -> None:
    stream = Stream()
    sc = await master(tmp_path, stream)
    assert sc.replica is not None
    replica = sc.replica
    log = stream.read()
    assert log.last_writer == replica.master
    # another process took the worker meanwhile: its marker, then this master's new one
    other, token = marker_frame("elsewhere/1/x", "elsewhere#1"), f"{replica.master}#2"
    log.feed(len(stream.frames), other.headers, other.body)
    mine = marker_frame(replica.master, token)
    log.feed(len(stream.frames) + 1, mine.headers, mine.body)
    assert log.writer_before(token) == (True, "elsewhere/1/x")
    same = stream.read()
    mine_again = marker_frame(replica.master, "again")
    same.feed(len(stream.frames), mine_again.headers, mine_again.body)
    assert same.writer_before("again") == (True, replica.master)


def test_each_worker_has_its_journal_stream_with_a_retention_and_no_dead_lettering() -> None:
    topology = t.Topology(("a", "b"), ("w0", "w1"))
    streams = {q.name for q in d.queues(topology) if q.type == d.STREAM}
    assert streams == {"x-fence.w0.journal", "x-fence.w1.journal"}
    policy = {p.name: p for p in d.policies(topology) if p.vhost == t.FENCES_VHOST}
    kept = policy[t.JOURNAL_STREAMS_POLICY]
    assert kept.definition["max-length-bytes"] >= 4 * d.JOURNAL_STREAM_SEGMENT_BYTES
    assert all(re.fullmatch(kept.pattern, s) for s in streams)
    assert not any(re.fullmatch(policy[t.DEAD_LETTER_POLICY].pattern, s) for s in streams)
    fence_user = [p for p in d.permissions(topology) if p.user == t.FENCE_USER and p.vhost == t.FENCES_VHOST]
    assert all(re.fullmatch(fence_user[0].read, s) for s in streams)  # the backups read them
    assert all(re.fullmatch(fence_user[0].configure, t.fence_home_lock(w)) for w in ("w0", "w1"))


@pytest.mark.parametrize(("raised", "seen"), [
    (aiormq.exceptions.ChannelNotFoundEntity("NOT_FOUND - home node 'rabbit@vm' of durable queue 'x-fence."
                                             "w0.journal' in vhost 'gf-fences' is down or inaccessible"),
     ConnectionError),
    (aiormq.exceptions.ChannelNotFoundEntity("NOT_FOUND - no queue 'x' in vhost 'gf-fences'"),
     aiormq.exceptions.ChannelNotFoundEntity),
    (Exception("<Channel closed>"), ConnectionError),
    (ValueError("a bug"), ValueError),
])
async def test_a_stream_not_up_yet_or_a_closing_connection_is_the_broker_gone(raised: Exception,
                                                                              seen: type[Exception]) -> None:
    @replica_stream._gone_on_bare
    async def op() -> None:
        raise raised

    with pytest.raises(seen):
        await op()


async def test_a_frame_the_stream_never_confirms_ends_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """RabbitMQ 3.10 drops the confirm of a frame whose stream lost its leader: the master
    must not wait for it forever (its inputs would stay unacked, its worker stalled)."""
    async def never(*_: Any, **__: Any) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(replica_stream.publish, "publish_all", never)
    monkeypatch.setattr(replica_stream, "SHIP_CONFIRM_S", 0.05)
    monkeypatch.setattr(replica_stream, "PROBE_AFTER_S", 0.01)
    frames = [marker_frame("m", "m#1", 0)]
    counters = shell.Counters()
    with pytest.raises(ConnectionError, match="nothing confirmed within"):
        await replica_stream.ship(SimpleNamespace(), "x-fence.w0.journal", frames,  # type: ignore[arg-type]
                                  counters)
    assert counters.other["replica_confirms_lost"] == 1


def _publisher(lost: set[bytes], slow_s: float, published: list[list[Any]]) -> Any:
    """publish_all as a stream confirms: in order, after `slow_s` each; never those in `lost`."""
    confirmed = asyncio.Lock()

    async def publish_all(outs: list[Any], counters: Any) -> None:
        published.append(outs)
        if any(o.body in lost for o in outs):  # in flight at a leader change
            await asyncio.Event().wait()
        async with confirmed:  # in order: a later publish is confirmed after an earlier one
            await asyncio.sleep(slow_s)
    return publish_all


async def test_a_probe_confirmed_first_tells_a_lost_confirm_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream changed leader with the frames in flight: the probe sent after them goes to
    the new leader and is confirmed, theirs never are: the session ends at the probe, not
    at SHIP_CONFIRM_S."""
    published: list[list[Any]] = []
    monkeypatch.setattr(replica_stream.publish, "publish_all", _publisher({b"records"}, 0.0, published))
    monkeypatch.setattr(replica_stream, "PROBE_AFTER_S", 0.02)
    counters = shell.Counters()
    frames = [replica_log.records_frame(3, 0, b"records", "m#1", 7)]
    with pytest.raises(ConnectionError, match="a probe sent after them was confirmed first"):
        ship = replica_stream.ship(SimpleNamespace(), "x-fence.w0.journal", frames, counters)  # type: ignore[arg-type]
        await asyncio.wait_for(ship, replica_stream.SHIP_CONFIRM_S / 10)
    probe = published[1][0]
    assert probe.headers[replica_log.KIND] == replica_log.MARKER
    assert probe.headers[replica_log.MASTER] == "m#1"
    assert counters.other["replica_confirms_lost"] == 1


async def test_a_slow_stream_confirms_the_frames_before_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only slow: the frames' confirms come first (a stream confirms in order), the probe
    costs a small marker frame and the frames count as shipped."""
    published: list[list[Any]] = []
    monkeypatch.setattr(replica_stream.publish, "publish_all", _publisher(set(), 0.05, published))
    monkeypatch.setattr(replica_stream, "PROBE_AFTER_S", 0.01)
    counters = shell.Counters()
    frames = [replica_log.records_frame(3, 0, b"records", "m#1", 7)]
    await replica_stream.ship(SimpleNamespace(), "x-fence.w0.journal", frames, counters)  # type: ignore[arg-type]
    assert len(published) == 2  # the frames, then the probe
    assert counters.other["replica_frames"] == 1 and counters.other["replica_confirms_lost"] == 0
