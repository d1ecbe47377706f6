"""The internal wire fuzzed (tests/unit/test_fuzz_*.py): what the sidecars send each other (region
batches, worker batches, definitions) as the sender makes it, then mutated, corrupted or
replaced by junk; each body says whether it is still valid as sent. The object ids are as
x-ingress sends them: a tenant's qualified (`<tenant>:<id>`), some of no tenant.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any, cast

import msgpack
import numpy as np
from shapely.geometry import box

from exchanges import control
from exchanges.batch import PositionBatch, RegionBatch, unpack
from exchanges.fence_def import FenceDef
from exchanges.tenancy import qualify
from exchanges.worker_batch import WorkerBatch
from exchanges.x_geo.core import XGeo
from ingress.positions import (
    TS_MAX,
    TS_MIN,
)
from tests.faults.fuzz_inputs import Fuzzer, msgpack_bytes
from tests.unit.fuzz_contract import TS
from tests.unit.fuzz_sidecars import (
    FULL,
    RING,
    WORKERS,
)


def wire_junk(rng: random.Random) -> Any:
    options: list[Callable[[], Any]] = [
        lambda: None, lambda: rng.random() < 0.5, lambda: rng.randint(-(2**63), 2**64 - 1),
        lambda: rng.choice([math.nan, math.inf, -math.inf, 0.0, 1e308, -1.5]),
        lambda: "x" * rng.randint(0, 5), lambda: rng.randbytes(rng.randint(0, 40)),
        lambda: [rng.randint(0, 9) for _ in range(rng.randint(0, 3))],
        lambda: ["a", "b"][: rng.randint(0, 2)],
        lambda: [b"a"], lambda: {"k": 1}, lambda: [[1], [2]]]
    return rng.choice(options)()


WIRE_TENANTS = ("", "acme", "fleet-2")  # "": the platform's own names


def position_batch(rng: random.Random, n_max: int = 6) -> PositionBatch:
    n = rng.randint(0, n_max)
    z = Fuzzer(rng)
    extra: list[dict[str, Any] | None] = []
    if rng.random() < 0.5:
        values: list[Any] = [1, -(2**63), 2**64 - 1, "x", 2.5, math.nan, None, True, [1, "y"], b"z"]
        extra = [None if rng.random() < 0.5 else {z.text(4): rng.choice(values)} for _ in range(n)]
    return PositionBatch([qualify(rng.choice(WIRE_TENANTS), z.object_id()) for _ in range(n)],
                         np.array([rng.uniform(-180, 180) for _ in range(n)]),
                         np.array([rng.uniform(-90, 90) for _ in range(n)]),
                         np.array([rng.uniform(TS_MIN, TS_MAX) for _ in range(n)]),
                         np.array([rng.randrange(1 << 52) for _ in range(n)], np.uint64), extra)


def key_paths(d: Any, prefix: tuple[Any, ...] = (), depth: int = 4) -> list[tuple[Any, ...]]:
    """Every key path into nested dicts / lists (the places a mutation can hit)."""
    out: list[tuple[Any, ...]] = []
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
    for k, v in items if depth else ():
        out.append((*prefix, k))
        out += key_paths(v, (*prefix, k), depth - 1)
    return out


def mutated(rng: random.Random, wire: dict[str, Any]) -> dict[str, Any]:
    """One or two changes to a wire dict: a value dropped, replaced by junk, or its bytes cut or
    lengthened."""
    d = msgpack.unpackb(msgpack.packb(wire, use_bin_type=True), raw=False)  # a deep copy
    for _ in range(rng.randint(1, 2)):
        where = key_paths(d)
        if not where:
            break
        path = rng.choice(where)
        parent = d
        for k in path[:-1]:
            parent = parent[k]
        key, value = path[-1], parent[path[-1]]
        op = rng.randint(0, 3)
        if op == 0 and isinstance(parent, dict):
            del parent[key]
        elif op == 1 and isinstance(value, bytes):
            parent[key] = value[: rng.randint(0, max(0, len(value) - 1))] if value and rng.random() < 0.5 \
                else value + rng.randbytes(rng.randint(1, 9))
        else:
            parent[key] = wire_junk(rng)
    return cast(dict[str, Any], d)


WIRE_ODDITIES = [msgpack.packb({"v": 2, "kind": "positions"}), msgpack.packb({"v": 1, "kind": 5}),
                 msgpack.packb({"v": 1}), msgpack.packb({1: 1, "v": 1, "kind": "positions"}),
                 msgpack.packb({"v": 1, "kind": "teleport"}), b"\x81\x91\x01\x01", b"", b"\xc1"]


def wire_bodies(seed: int, make: Callable[[random.Random], dict[str, Any]], most: int
                ) -> list[tuple[bytes, bool]]:
    """(body, valid as the sender makes it): valid, mutated, corrupted or raw."""
    rng = random.Random(seed)
    z = Fuzzer(rng)
    out = []
    for _ in range(rng.randint(1, most)):
        wire = make(rng)
        k = rng.randint(0, 7)
        if k <= 2:
            out.append((msgpack.packb(wire, use_bin_type=True), True))
        elif k <= 5:
            out.append((msgpack.packb(mutated(rng, wire), use_bin_type=True), False))
        elif k == 6:
            out.append((z.corrupt(msgpack.packb(wire, use_bin_type=True)), False))
        else:
            junk = rng.choice([z.raw(80), msgpack_bytes(z.json_value()), rng.choice(WIRE_ODDITIES)])
            out.append((junk, False))
    return out


def region_wire(rng: random.Random) -> dict[str, Any]:
    pb = position_batch(rng)
    n = len(pb)
    if rng.random() < 0.2:  # the first pipeline version's notices apart
        return {"v": 1, "kind": "handover", "batch": pb.to_wire()}
    notice = np.array([rng.random() < 0.3 for _ in range(n)], bool)
    gate = np.where(np.array([rng.random() < 0.3 for _ in range(n)], bool), pb.ts, 0.0)
    return {"v": 1, "kind": "positions", **RegionBatch(pb, notice, gate).to_wire()}


def _loads(body: bytes) -> Any:
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception:
        return None


def region_batch_of(body: bytes) -> RegionBatch:
    msg = unpack(body)
    if msg["kind"] == "handover":
        b = PositionBatch.from_wire(msg["batch"])
        return RegionBatch(b, np.ones(len(b), bool), np.zeros(len(b)))
    return RegionBatch.from_wire(msg)


def worker_wire(rng: random.Random) -> dict[str, Any]:
    k = rng.randint(0, 5)
    if k == 0:
        return unpack(control.define_for_worker(control.Define(
            FenceDef(fence_id="f-2", version=rng.randint(1, 5), geometry=box(0, 0, 1, 1), timeout_s=60.0,
                     name="n"), TS)))
    if k == 1:
        return unpack(control.drop_message(control.Drop("f-2", rng.randint(1, 5), TS)))
    geo = XGeo("a", list(WORKERS), RING)
    geo.add_binding(FULL)
    pb = position_batch(rng)
    notice = np.array([rng.random() < 0.3 for _ in range(len(pb))], bool)
    mine = geo.route(pb, notice=notice).get(FENCE_WORKER) or WorkerBatch(
        FENCE_WORKER, PositionBatch.empty(), np.zeros(1, np.int64), [], np.empty(0, np.int32),
        np.empty(0, bool))
    # what x-geo sends to f-all's worker: the positions with f-all their candidate, and notices
    return {"v": 1, "kind": "positions", "parts": [mine.to_wire()]}


def _fence_worker() -> str:
    geo = XGeo("a", list(WORKERS), RING)
    geo.add_binding(FULL)
    return geo.worker_of(FULL.fence_id)


FENCE_WORKER = _fence_worker()  # the worker of f-all (FULL), where its events are made


SQUARE = box(9.50, 47.10, 9.51, 47.11)
