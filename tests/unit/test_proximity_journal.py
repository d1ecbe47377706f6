"""x-ingress's proximity journal (ingress/proximity.py): the router a restart rebuilds from the
snapshot and records is the one that was running, with its change cursor, across rotations."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from exchanges.batch import PositionBatch
from exchanges.hash_ring import HashRing
from exchanges.shell import Counters
from exchanges.state_dir import pack
from exchanges.subscriptions import Subscription
from ingress.proximity import Proximity


def _batch(rng: np.random.Generator, n: int, t: float) -> PositionBatch:
    ids = [f"o{int(i)}" for i in rng.integers(0, 40, n)]
    return PositionBatch(ids, 9.5 + rng.random(n) * 0.02, 47.1 + rng.random(n) * 0.02, np.full(n, t),
                         np.zeros(n, np.uint64), [{"speed": int(s)} for s in rng.integers(0, 50, n)])


def test_a_restart_rebuilds_the_router_it_had(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    ring = HashRing(["w0", "w1"])
    p = Proximity(ring, str(tmp_path), Counters())
    p.load()  # a new one: empty
    assert not p.stream.active and p.cursor == 0
    seq = 0
    for step in range(60):
        if step % 7 == 0:
            seq += 1
            sub = Subscription(f"s{step % 3}", f"o{step % 11}", 100.0 + step)
            p.stream.put(sub, float(step), seq)
            p._record({"put": sub.to_wire(), "ts": float(step), "seq": seq})
            p.cursor = seq
        elif step % 13 == 0 and p.stream.subs:
            seq += 1
            sid = sorted(p.stream.subs)[0]
            p.stream.drop(sid, float(step))
            p._record({"drop": sid, "ts": float(step), "seq": seq})
            p.cursor = seq
        else:
            b = _batch(rng, 25, float(step))
            p.stream.rows(b)
            p._record({"rows": b.to_wire()})
        if step == 30:  # a rotation in the middle: snapshot + the records after it
            gen = p.journal.rotate_begin()  # type: ignore[union-attr]
            p.journal.rotate_finish(pack(p._snapshot()), gen)  # type: ignore[union-attr]
    assert p.stream.active and len(p.stream.router) == 40
    # a crash (no close): the snapshot of step 30 and the records after it
    again = Proximity(ring, str(tmp_path), Counters())
    again.load()
    assert again.stream.snapshot() == p.stream.snapshot()
    assert again.cursor == p.cursor == seq
    again.close()  # a clean stop: a snapshot
    third = Proximity(ring, str(tmp_path), Counters())
    third.load()
    assert third.stream.snapshot() == p.stream.snapshot() and third.cursor == seq
