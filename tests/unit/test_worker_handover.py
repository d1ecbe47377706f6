"""Workers added and removed (issue 21) without a broker: objects walk over a dozen fences
and two regions, real x-ingress / x-geo / x-fence cores route them, and at a random batch
the ring changes (a worker added, with a weight, or removed): the pipeline drained (x-ingress
paused), each old worker exports the fences it loses (XFence.export), each new owner takes
its share (take), the x-geos route with the new ring (XGeo.set_ring) and the old workers
forget. Hot fences (N masters, each judging its share of the objects: the ring's `hot`) are
made, unmade and carried through worker changes the same way. The events are shapely's: none
lost, none twice, whatever the moment; the state of every fence is on exactly its new
masters, each inside pair on its owner, and the journal replays the handover."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import shapely
from shapely.geometry import box

import hilbert_c as hk
from exchanges.batch import PositionBatch
from exchanges.fence_binding import INDEX_BITS, FenceBinding
from exchanges.fence_def import FenceDef
from exchanges.fence_events import ENTER, ENTERED, EXITED, LEAVE, Event
from exchanges.hash_ring import HashRing
from exchanges.worldmap import Worldmap
from exchanges.x_geo.core import XGeo
from fence.reference import visit_problems
from fence.x_fence.core import XFence
from ingress.core import XIngress
from tests.unit.test_fence_sidecar_core import Ev, kinds

AREA = (9.50, 47.10, 9.53, 47.13)
OBJECTS = 12
HOT = {"F0": 2, "F1": 3, "F2": 2}  # the big fences (see `world`) made hot
CHANGES: dict[str, tuple[HashRing, HashRing]] = {
    "add w2": (HashRing({"w0": 1, "w1": 1}), HashRing({"w0": 1, "w1": 1, "w2": 1})),
    "add w2 weight 3": (HashRing({"w0": 1, "w1": 1}), HashRing({"w0": 1, "w1": 1, "w2": 3})),
    "remove w1": (HashRing({"w0": 1, "w1": 1, "w2": 1}), HashRing({"w0": 1, "w2": 1})),
    "remove to one": (HashRing({"w0": 1, "w1": 1}), HashRing({"w1": 1})),
    "make hot": (HashRing(["w0", "w1", "w2"]), HashRing(["w0", "w1", "w2"], hot=HOT)),
    "unmake hot": (HashRing(["w0", "w1", "w2"], hot=HOT), HashRing(["w0", "w1", "w2"])),
    "hot, add w3": (HashRing(["w0", "w1", "w2"], hot=HOT), HashRing(["w0", "w1", "w2", "w3"], hot=HOT)),
    "hot, remove w1": (HashRing(["w0", "w1", "w2"], hot=HOT), HashRing(["w0", "w2"], hot=HOT)),
    "hot, re-weight w0": (HashRing(["w0", "w1", "w2"], hot=HOT),
                          HashRing({"w0": 3, "w1": 1, "w2": 1}, hot=HOT)),
}


@dataclasses.dataclass
class World:
    fences: dict[str, object]
    worldmap: Worldmap
    walk: list[tuple[str, float, float, float]]
    truth: list[Ev]


def world(rng: np.random.Generator) -> World:
    x0, y0, x1, y1 = AREA
    centres, sizes = rng.uniform((x0, y0), (x1, y1), (14, 2)), rng.uniform(0.002, 0.006, (14, 2))
    sizes[:3] = rng.uniform(0.006, 0.010, (3, 2))  # F0-F2: big, busy (the hot ones)
    fences = {f"F{i}": box(*(centres[i] - sizes[i]), *(centres[i] + sizes[i])) for i in range(14)}
    lon, lat = rng.uniform(x0, x1, OBJECTS), rng.uniform(y0, y1, OBJECTS)
    walk: list[tuple[str, float, float, float]] = []
    truth: list[Ev] = []
    inside: list[set[str]] = [set() for _ in range(OBJECTS)]
    for t in range(100, 150):
        lon = np.clip(lon + rng.normal(0.0, 0.002, OBJECTS), x0, x1)
        lat = np.clip(lat + rng.normal(0.0, 0.002, OBJECTS), y0, y1)
        for o in rng.permutation(OBJECTS).tolist():
            walk.append((f"o{o}", float(lon[o]), float(lat[o]), float(t)))
            now = {f for f, g in fences.items() if shapely.contains_xy(g, lon[o], lat[o])}
            truth += [(ENTER, f, f"o{o}", ENTERED, float(t)) for f in now - inside[o]]
            truth += [(LEAVE, f, f"o{o}", EXITED, float(t)) for f in inside[o] - now]
            inside[o] = now
    return World(fences, Worldmap.over_area(["a", "b"], AREA), walk, truth)


def batches(w: World, rng: np.random.Generator) -> list[PositionBatch]:
    out, lo = [], 0
    while lo < len(w.walk):
        hi = min(len(w.walk), lo + int(rng.integers(1, 9)))
        ids, lons, lats, tss = zip(*w.walk[lo:hi], strict=True)
        out.append(PositionBatch(list(ids), np.array(lons), np.array(lats), np.array(tss),
                                 np.zeros(hi - lo, np.uint64)))
        lo = hi
    return out


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("seed", range(12))
def test_a_ring_change_mid_stream_loses_and_repeats_no_event(change: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = world(rng)
    before, after = CHANGES[change]
    geo = {}
    for region in w.worldmap.regions:
        g = XGeo(region, list(before.nodes), before, announce_unknown=True)
        for fid, geom in w.fences.items():
            cov = hk.cover(geom, 20).to_bits(INDEX_BITS)
            clipped = w.worldmap.clip(cov.ranges, cov.interior)
            if region in clipped:
                g.add_binding(FenceBinding(fid, 1, *clipped[region]))
        geo[region] = g
    workers = {n: XFence(n) for n in {*before.nodes, *after.nodes}}
    for fid, geom in w.fences.items():
        for n in before.masters(fid):
            workers[n].define(FenceDef(fence_id=fid, version=1, geometry=geom, timeout_s=1e9), 0.0)
    journal = {n: [x.snapshot()] for n, x in workers.items()}
    persisted = dict.fromkeys(workers, 0)

    def persist(n: str) -> None:  # as the sidecar does after each batch
        record = workers[n].changes(persisted[n])
        if record is not None:
            journal[n].append(record)
            persisted[n] = len(workers[n]._objects)

    ingress = XIngress(w.worldmap)
    todo = batches(w, rng)
    switch = int(rng.integers(len(todo) // 5, 4 * len(todo) // 5))
    got: list[Ev] = []
    raw: list[Event] = []
    moved = 0
    for i, batch in enumerate(todo):
        if i == switch:  # drained: every routed batch was applied (x-ingress paused)
            pairs = sum(x.stats()["inside_pairs"] for x in workers.values())
            exports = {n: workers[n].export(after) for n in before.nodes}
            for n in after.nodes:
                for data in exports.values():
                    moved += workers[n].take(data, after)
            for g in geo.values():
                g.set_ring(list(after.nodes), after)
            for n in before.nodes:
                workers[n].forget(after)
            for n in workers:
                persist(n)
            for fid in w.fences:  # each fence on exactly its new masters
                defined = sorted(n for n, x in workers.items() if fid in x.fences())
                assert defined == sorted(after.masters(fid))
            for n, x in workers.items():  # each inside pair on its owner, once
                for fid in x.fences():
                    assert all(after.owner(fid, o["object_id"]) == n for o in x.occupants(fid))
            assert sum(x.stats()["inside_pairs"] for x in workers.values()) == pairs
            assert moved == sum(len(d["since"]) // 8 for d in exports.values())
        ring = after if i >= switch else before
        for region, rb in ingress.route(batch).regions.items():
            for n, wb in geo[region].route(rb.batch, notice=rb.notice, gate=rb.gate,
                                           announced=rb.announced).items():
                assert n in ring.nodes
                emitted = workers[n].route(wb)
                raw += emitted
                got += kinds(emitted)
                persist(n)
    assert len(w.truth) >= 20
    assert sorted(got) == sorted(w.truth)
    assert visit_problems(raw) == []  # a stay handed over keeps its visit id and start
    assert all(x.stats()["held_now"] == 0 for x in workers.values())  # no gate left waiting
    for n, x in workers.items():  # routed by the new ring: a hot fence's objects on their owners
        for fid in x.fences():
            assert all(after.owner(fid, o["object_id"]) == n for o in x.occupants(fid))
    for n, x in workers.items():  # the journal (snapshot, then records) gives the same state
        replayed = XFence.restore(journal[n][0])
        for record in journal[n][1:]:
            replayed.apply(record)
        assert replayed.fences() == x.fences()
        assert {f: replayed.occupants(f) for f in x.fences()} == {f: x.occupants(f) for f in x.fences()}


def test_take_again_changes_nothing_and_refuses_another_format() -> None:
    a, b = XFence("w0"), XFence("w1")
    a.define(FenceDef(fence_id="F", version=1, geometry=box(0, 0, 1, 1), timeout_s=60.0), 0.0)
    from tests.unit.test_fence_sidecar_core import at
    entered = a.route(dataclasses.replace(at("o", (0.5, 0.5), 10.0, ["F"]), worker="w0"))
    to_b, elsewhere = HashRing(["w1"]), HashRing(["w2"])
    data = a.export(to_b)
    assert data["ids"] == ["o"] and [f for f, _ in data["fences"]] == ["F"] and data["whole"] == ["F"]
    assert b.take(data, to_b) == 1 and b.take(data, to_b) == 1
    assert b.occupants("F") == a.occupants("F") and b.fences() == ["F"] and b.stats()["inside_pairs"] == 1
    assert XFence("w1").take(data, elsewhere) == 0
    assert a.forget(to_b) == 1 and a.fences() == [] and a.forget(to_b) == 0
    timed_out = b.expire(10.0 + 61.0)
    assert timed_out[0].reason == "timeout"  # the timer moved with the pair
    assert timed_out[0].visit_id == entered[0].visit_id and timed_out[0].inside_s == 60.0  # and the visit
    with pytest.raises(ValueError, match="format"):
        b.take({**data, "format": 99}, to_b)
    with pytest.raises(ValueError, match="names no exported"):
        b.take({**data, "pair_fence": np.array([5], "<i8").tobytes()}, to_b)


def test_a_hot_fence_spreads_its_objects_over_its_masters_and_gathers_them_again() -> None:
    from tests.unit.test_fence_sidecar_core import at
    one, hot = HashRing(["w0", "w1", "w2"]), HashRing(["w0", "w1", "w2"], hot={"F": 3})
    workers = {n: XFence(n) for n in one.nodes}
    first = one.node_for("F")
    workers[first].define(FenceDef(fence_id="F", version=1, geometry=box(0, 0, 1, 1), timeout_s=60.0), 0.0)
    ids = [f"o{i}" for i in range(60)]
    for i, o in enumerate(ids):
        workers[first].route(dataclasses.replace(at(o, (0.5, 0.5), 10.0 + i, ["F"]), worker=first))
    everyone = sorted(x["object_id"] for x in workers[first].occupants("F"))
    assert everyone == sorted(ids)

    def switch(before: HashRing, after: HashRing) -> None:
        exports = [workers[n].export(after) for n in before.nodes]
        for n in after.nodes:
            for data in exports:
                workers[n].take(data, after)
        for n in before.nodes:
            workers[n].forget(after)

    switch(one, hot)
    shares = {n: sorted(x["object_id"] for x in workers[n].occupants("F")) for n in hot.nodes}
    assert all(workers[n].fence("F") is not None for n in hot.nodes)
    assert sorted(o for objs in shares.values() for o in objs) == everyone  # each once
    assert all(hot.owner("F", o) == n for n, objs in shares.items() for o in objs)
    assert all(len(objs) >= 10 for objs in shares.values())  # spread (60 objects, 3 masters)
    since = {x["object_id"]: x["since"] for n in hot.nodes for x in workers[n].occupants("F")}
    assert since == {o: 10.0 + i for i, o in enumerate(ids)}  # since when: handed over too
    switch(hot, one)
    assert [n for n in one.nodes if workers[n].fence("F") is not None] == [first]
    assert sorted(x["object_id"] for x in workers[first].occupants("F")) == everyone
