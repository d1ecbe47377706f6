"""x-ingress's proximity journal (ingress/proximity.py): the router a restart rebuilds from the
snapshot and records is the one that was running, with its change cursor, across rotations,
with records written behind the routing (as x-ingress's pipeline writes them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from exchanges.batch import PositionBatch
from exchanges.hash_ring import HashRing
from exchanges.shell import Counters, Pipeline
from exchanges.subscriptions import Subscription
from ingress.proximity import Entry, Proximity


def _batch(rng: np.random.Generator, n: int, t: float) -> PositionBatch:
    ids = [f"o{int(i)}" for i in rng.integers(0, 40, n)]
    return PositionBatch(ids, 9.5 + rng.random(n) * 0.02, 47.1 + rng.random(n) * 0.02, np.full(n, t),
                         np.zeros(n, np.uint64), [{"speed": int(s)} for s in rng.integers(0, 50, n)])


def test_a_restart_rebuilds_the_router_it_had(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    ring = HashRing(["w0", "w1"])
    p = Proximity(ring, str(tmp_path), Counters(), Pipeline())
    p.load()  # a new one: empty
    assert not p.stream.active and p.cursor == 0
    assert p.journal is not None
    p.journal.max_journal_bytes = 20_000  # rotations on the way, each carried by an entry
    seq = 0
    behind: list[Entry] = []  # routed, not written yet: the pipeline's tails
    for step in range(120):
        if step % 7 == 0:
            seq += 1
            sub = Subscription(f"s{step % 3}", f"o{step % 11}", 100.0 + step)
            p.stream.put(sub, float(step), seq)
            p.cursor = seq
            behind.append(p.entry({"put": sub.to_wire(), "ts": float(step), "seq": seq}))
        elif step % 13 == 0 and p.stream.subs:
            seq += 1
            sid = sorted(p.stream.subs)[0]
            p.stream.drop(sid, float(step))
            p.cursor = seq
            behind.append(p.entry({"drop": sid, "ts": float(step), "seq": seq}))
        else:
            b = _batch(rng, 25, float(step))
            p.stream.rows(b)
            behind.append(p.entry({"rows": b.to_wire()}))
        while len(behind) > 3:  # three entries in flight
            p._write(behind.pop(0))
            p.unwritten -= 1
    rotations = p.journal.generation
    for e in behind:
        p._write(e)
        p.unwritten -= 1
    assert p.unwritten == 0 and p.journal.generation == rotations
    assert rotations >= 3, "entries carried snapshots"
    assert p.stream.active and len(p.stream.router) == 40
    # a crash (no close): the last snapshot and the records after it
    again = Proximity(ring, str(tmp_path), Counters(), Pipeline())
    again.load()
    assert again.stream.snapshot() == p.stream.snapshot()
    assert again.cursor == p.cursor == seq
    again.close()  # a clean stop: a snapshot
    third = Proximity(ring, str(tmp_path), Counters(), Pipeline())
    third.load()
    assert third.stream.snapshot() == p.stream.snapshot() and third.cursor == seq


def test_entries_not_written_are_not_in_the_router_a_restart_rebuilds(tmp_path: Path) -> None:
    """A session that ends with entries routed and not written: the journal has the router as
    it was before them (x-ingress reloads it; their batches come again)."""
    rng = np.random.default_rng(6)
    p = Proximity(HashRing(["w0"]), str(tmp_path), Counters(), Pipeline())
    p.load()
    p.stream.put(Subscription("s", "o1", 150.0), 0.0, 1)
    p.cursor = 1
    p._write(p.entry({"put": Subscription("s", "o1", 150.0).to_wire(), "ts": 0.0, "seq": 1}))
    first = _batch(rng, 30, 1.0)
    p.stream.rows(first)
    p._write(p.entry({"rows": first.to_wire()}))
    kept = p.stream.snapshot()
    p.stream.rows(_batch(rng, 30, 2.0))
    p.entry({"rows": _batch(rng, 30, 2.0).to_wire()})  # never written: the session was cut
    assert p.unwritten == 3
    p.load()  # what the next session does
    assert p.unwritten == 0 and p.stream.snapshot() == kept and p.cursor == 1
