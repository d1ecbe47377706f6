"""Issue 5, "bad input gets a clear error and loses nothing": property tests over every
decoder of the wire contracts, more than 10,000 fuzzed inputs in all (BUDGET below).

The inputs come from tests/faults/fuzz_inputs.py (the fault test against the live stack uses
the same generator): structured-but-wrong messages (valid JSON / msgpack with wrong types,
NaN and infinities, lat 91, lon -181, ts as strings or in milliseconds, missing and extra
fields, huge numbers, unicode ids, ids with '.', '#', '/' or empty), raw random bytes,
truncated and bit-flipped valid messages. Hypothesis draws the generator's seeds
(derandomize: the same inputs on every run; a failure names its seed and the assertion shows
the input); building a message from a seed costs a fraction of drawing it field by field with
strategies, which keeps 10,000+ examples under a minute on two cores. The properties:

- a decoder raises nothing but its documented refusal (ingress: `Refused`; the sidecars'
  wire: what their `except` clause catches; control: `InvalidMessage`; fences: `InvalidFence`),
  and every refusal has a non-empty, printable reason;
- the verdict on each input equals an oracle written here from the README's contract (not
  from the decoder's code): nothing invalid is accepted, nothing valid refused; an accepted
  position is finite, in range and equal to what was sent;
- per batch, accepted + refused == input (nothing silently dropped), also through the real
  sidecar batch handlers (x-ingress, x-geo, x-fence, the AMQP fence API) with publishing
  captured in memory: each message is dead-lettered with a reason or goes on, and what goes on
  can be read by the next hop;
- a valid fence round-trips; an invalid one is an `InvalidFence` / 422 with a reason, never
  a 5xx.

The bugs this fuzzing found (11: six of them killed a sidecar) are fixed; each keeps a test
of its own at the end of this file, and the generator makes their inputs again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast
from unittest import mock

import msgpack
import numpy as np
import orjson
import pytest
from aio_pika.abc import AbstractIncomingMessage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shapely.geometry import Polygon, box

import hilbert_c as hk
from exchanges import control, shell
from exchanges import topology as t
from exchanges.batch import PositionBatch, RegionBatch, pack, unpack
from exchanges.binding_diff import diff as binding_diff
from exchanges.contract import InvalidMessage
from exchanges.fence_binding import FenceBinding
from exchanges.fence_def import FenceDef, InvalidFence
from exchanges.hash_ring import HashRing
from exchanges.worker_batch import WorkerBatch
from exchanges.worldmap import Worldmap
from exchanges.x_geo import sidecar as geo_sidecar_module
from exchanges.x_geo.core import XGeo
from exchanges.x_geo.sidecar import GeoSidecar
from fence import store
from fence.auth import Reason, Unauthenticated, User
from fence.manager import Change
from fence.rpc import RpcServer
from fence.service import ApiError, Caller, FenceService
from fence.spec import from_feature
from fence.x_fence import sidecar as fence_sidecar_module
from fence.x_fence.sidecar import FenceSidecar
from ingress.core import XIngress
from ingress.positions import (
    MAX_BATCH,
    MAX_BODY_BYTES,
    TS_MAX,
    TS_MIN,
    Refused,
    decode_batch,
    decode_mqtt_many,
)
from ingress.sidecar import IngressSidecar
from tests.faults.fuzz_inputs import RPC_OPS, Fuzzer, msgpack_bytes, nested

# Examples per property (hypothesis runs max_examples of each): 10,000 or more in all. Several
# properties take a list of messages per example, so the inputs are about twice as many.
BUDGET = {
    "mqtt": 1500, "gateway": 1500, "ingress_mqtt": 600, "ingress_gateway": 600, "unpack": 800,
    "x_geo": 800, "x_fence": 600, "control": 1000, "feature": 1500, "service": 600, "http": 300,
    "rpc": 700,
}
SEEDS = st.integers(0, 2**64 - 1)


def fuzz(name: str) -> settings:
    return settings(max_examples=BUDGET[name], deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def fuzzer(seed: int) -> Fuzzer:
    return Fuzzer(random.Random(seed))


def test_the_budget_is_ten_thousand_examples() -> None:
    assert sum(BUDGET.values()) >= 10_000


# --------------------------------------------------------------------------- the contract (oracle)

KNOWN = ("id", "lon", "lat", "ts")
# README: object ids (and fence ids) are 1-64 of A-Za-z0-9_- starting with a letter or digit
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
ROUTING_KEY_RE = re.compile(r"positions\.([A-Za-z0-9][A-Za-z0-9_-]{0,63})")
MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack")
TS = 1_700_000_000.0

Pos = tuple[str, float, float, float, bytes | None]  # id, lon, lat, ts, packed extra fields


def is_id(v: Any) -> bool:
    return isinstance(v, str) and ID_RE.fullmatch(v) is not None


def is_number(v: Any, lo: float, hi: float) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and lo <= v <= hi


def packed(extra: dict[Any, Any]) -> bytes:
    """Extra fields compared as bytes (NaN != NaN as a float, not as bytes)."""
    out: bytes = msgpack.packb(extra, use_bin_type=True)
    return out


def extra_fits(extra: dict[Any, Any]) -> bool:
    """README: other fields pass through if nested at most 16 levels, with string keys."""
    level, depth = [extra], 1
    while level:
        if depth > 16:
            return False
        nxt: list[Any] = []
        for v in level:
            if isinstance(v, dict):
                if not all(isinstance(k, str) for k in v):
                    return False
                nxt += [x for x in v.values() if isinstance(x, dict | list)]
            else:
                nxt += [x for x in v if isinstance(x, dict | list)]
        level, depth = nxt, depth + 1
    return True


def expect_position(p: Any, latest: float = TS_MAX) -> Pos | None:
    """What the contract makes of one position object: the position, or None (refused).
    `latest`: the receive time plus the skew x-ingress allows (GEOFENCE_MAX_FUTURE_S)."""
    if not isinstance(p, dict) or any(k not in p for k in KNOWN):
        return None
    slack = hk.COORD_SLACK_DEG  # float noise at the world's edge is the edge
    if not (is_id(p["id"]) and is_number(p["lon"], -180 - slack, 180 + slack)
            and is_number(p["lat"], -90 - slack, 90 + slack)
            and is_number(p["ts"], TS_MIN, min(TS_MAX, latest))):
        return None
    extra = {k: v for k, v in p.items() if k not in KNOWN}
    if not extra_fits(extra):
        return None
    lon, lat = min(max(float(p["lon"]), -180.0), 180.0), min(max(float(p["lat"]), -90.0), 90.0)
    return p["id"], lon, lat, float(p["ts"]), packed(extra) if extra else None


def expect_mqtt(routing_key: str, body: bytes, latest: float = TS_MAX) -> Pos | None:
    m = ROUTING_KEY_RE.fullmatch(routing_key)
    if m is None or len(body) > MAX_BODY_BYTES:
        return None
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return expect_position({**obj, "id": m[1]}, latest) if isinstance(obj, dict) else None


def expect_gateway(body: bytes, content_type: str | None, latest: float = TS_MAX) -> list[Pos | None] | None:
    """Per position its verdict, or None when the whole message is refused."""
    if len(body) > MAX_BODY_BYTES:
        return None
    try:
        if content_type in MSGPACK_TYPES:
            obj = msgpack.unpackb(body, raw=False, strict_map_key=False)
        else:
            obj = orjson.loads(body)
    except Exception:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("positions"), list) \
            or len(obj["positions"]) > MAX_BATCH:
        return None
    return [expect_position(p, latest) for p in obj["positions"]]


def assert_reason(reason: Any) -> None:
    assert isinstance(reason, str) and reason.strip(), f"a refusal without a reason: {reason!r}"
    assert reason.isprintable(), f"a reason with control characters: {reason!r}"


def positions_of(batch: PositionBatch) -> list[Pos]:
    """The batch's positions, checked valid (finite, in range, proper ids)."""
    assert np.isfinite(batch.lon).all() and np.isfinite(batch.lat).all() and np.isfinite(batch.ts).all()
    assert ((batch.lon >= -180) & (batch.lon <= 180) & (batch.lat >= -90) & (batch.lat <= 90)).all()
    assert ((batch.ts >= TS_MIN) & (batch.ts <= TS_MAX)).all()
    assert all(is_id(i) for i in batch.ids)
    extra = batch.extra or [None] * len(batch)
    return [(i, float(x), float(y), float(t), None if e is None else packed(e))
            for i, x, y, t, e in zip(batch.ids, batch.lon.tolist(), batch.lat.tolist(), batch.ts.tolist(),
                                     extra, strict=True)]


def check_decoded(batch: PositionBatch, refused: list[tuple[int, str]], expected: list[Pos | None],
                  inputs: Sequence[Any]) -> None:
    """One verdict per input, the oracle's; accepted positions as sent, in input order."""
    n = len(expected)
    by_index = dict(refused)
    assert len(by_index) == len(refused), f"an input refused twice: {refused}"
    for i, reason in refused:
        assert 0 <= i < n
        assert_reason(reason)
    assert len(batch) + len(by_index) == n, "an input neither accepted nor refused (silently dropped)"
    want_refused = {i for i, e in enumerate(expected) if e is None}
    wrong = sorted(set(by_index) ^ want_refused)
    assert not wrong, "verdicts differ from the contract: " + "; ".join(
        f"input {i} {inputs[i]!r:.300}: decoder {'refused: ' + by_index[i] if i in by_index else 'accepted'}"
        for i in wrong)
    assert positions_of(batch) == [e for e in expected if e is not None]


# --------------------------------------------------------------------------- ingress decoders


def mqtt_messages(z: Fuzzer, most: int) -> list[tuple[str, bytes]]:
    """Device messages as x-ingress gets them (routing key `positions.<id>` for the topic)."""
    return [(z.routing_key(), z.mqtt_payload()) for _ in range(z.rng.randint(1, most))]


@fuzz("mqtt")
@given(SEEDS)
def test_decode_mqtt_many_refuses_with_reasons_and_drops_nothing(seed: int) -> None:
    messages = mqtt_messages(fuzzer(seed), 8)
    decoded = decode_mqtt_many(messages)  # documented: never raises, refusals per message
    check_decoded(decoded.batch, decoded.refused, [expect_mqtt(rk, body) for rk, body in messages], messages)


@fuzz("gateway")
@given(SEEDS)
def test_decode_batch_refuses_with_reasons_and_drops_nothing(seed: int) -> None:
    body, content_type = fuzzer(seed).gateway_batch()
    expected = expect_gateway(body, content_type)
    try:
        decoded = decode_batch(body, content_type)
    except Refused as exc:
        assert_reason(str(exc))
        assert expected is None, f"the whole batch refused ({exc}), the contract takes it: {body!r:.300}"
        return
    assert expected is not None, f"a batch the contract refuses as a whole was taken: {body!r:.300}"
    check_decoded(decoded.batch, decoded.refused, expected, _items(body, content_type))


def _items(body: bytes, content_type: str | None) -> list[Any]:
    obj = msgpack.unpackb(body, raw=False, strict_map_key=False) if content_type in MSGPACK_TYPES \
        else orjson.loads(body)
    return cast(list[Any], obj["positions"])


def test_a_batch_of_exactly_the_limit_is_decoded_position_by_position() -> None:
    """(50,000 real positions do not fit in 256 KiB: most are empty objects here.)"""
    positions: list[dict[str, Any]] = [{} for _ in range(MAX_BATCH)]
    positions[7] = {"id": "o7", "lon": 9.5, "lat": 47.1, "ts": TS}
    positions[MAX_BATCH - 1] = {"id": "last", "lon": 9.5, "lat": 47.1, "ts": TS}
    decoded = decode_batch(msgpack.packb({"positions": positions}), "application/msgpack")
    assert decoded.batch.ids == ["o7", "last"] and len(decoded.refused) == MAX_BATCH - 2


# --------------------------------------------------------------------------- the sidecars' handlers


@dataclass
class Msg:
    """What the handlers read of an aio-pika incoming message."""

    body: bytes
    routing_key: str | None = ""
    content_type: str | None = None
    headers: dict[str, Any] | None = None
    message_id: str | None = None
    reply_to: str | None = None
    correlation_id: str | None = None

    async def ack(self, multiple: bool = False) -> None:
        """Settled by a pipeline's tail (exchanges/shell/pipeline.py): nothing to do here."""


@dataclass(frozen=True)
class Exchange:
    name: str


@contextlib.contextmanager
def captured() -> Iterator[list[shell.Out]]:
    """shell.publish_all into a list (every publish confirmed at once)."""
    outs: list[shell.Out] = []

    async def publish_all(o: Sequence[shell.Out | shell.Plains], counters: shell.Counters,
                          deadline: float | None = None, retry: bool = True) -> None:
        outs.extend(m for x in o for m in (x.outs() if isinstance(x, shell.Plains) else [x]))

    # the roles' calls (shell.publish_all) and a pipeline's (shell.send: publish.publish_all)
    with mock.patch.object(shell, "publish_all", publish_all), \
            mock.patch.object(shell.publish, "publish_all", publish_all):
        yield outs


async def drained(sc: Any, handled: Awaitable[None]) -> None:
    """A handler's call, then its pipeline's tails (a pipelined sidecar's batch is settled there)."""
    await handled
    pipeline = getattr(sc, "pipeline", None)
    if pipeline is not None:
        await pipeline.drain()


def to(o: shell.Out, exchange: Exchange) -> bool:
    return cast(Any, o.exchange) is exchange


def incoming(messages: Sequence[Msg]) -> list[AbstractIncomingMessage]:
    return cast(list[AbstractIncomingMessage], list(messages))


def numbered(o: shell.Out) -> int:
    assert o.headers is not None
    return cast(int, o.headers["n"])


def dead_letters(outs: Sequence[shell.Out], dlx: Exchange) -> list[shell.Out]:
    """The dead-lettered messages, checked: a reason (not an internal error), the source."""
    dead = [o for o in outs if to(o, dlx)]
    for o in dead:
        assert o.headers is not None
        assert_reason(o.headers["x-geofence-reason"])
        assert not str(o.headers["x-geofence-reason"]).startswith("internal error"), o.headers
        assert o.headers["x-geofence-source"]
    return dead


SIDECAR = shell.SidecarConfig("test", "", "amqp://fuzz@localhost/", "postgresql://fuzz@localhost/",
                              ("a", "b"), ("w0", "w1"))
WORLDMAP = Worldmap.over_area(["a", "b"], version=1)
WORKERS = ("w0", "w1")
RING = HashRing(list(WORKERS))  # immutable; building one costs ~10 ms (its virtual nodes)


def the_ring(workers: Sequence[str]) -> HashRing:
    assert tuple(workers) == WORKERS
    return RING
FULL = FenceBinding("f-all", 1, np.array([[0, (1 << 52) - 1]], np.uint64), np.array([True]))


def ingress_sidecar() -> tuple[IngressSidecar, Exchange, dict[str, Exchange]]:
    sc = IngressSidecar(SIDECAR, XIngress(WORLDMAP))
    dlx = Exchange("dead-letters")
    sc.dlx = cast(Any, dlx)
    sc.follow = cast(Any, Exchange("fence.follow"))
    regions = {r: Exchange(f"x-geo.in@{r}") for r in WORLDMAP.regions}
    sc.geo_in = cast(Any, regions)
    return sc, dlx, regions


def forwarded(outs: Sequence[shell.Out], regions: dict[str, Exchange]) -> list[Pos]:
    """What x-ingress sent on, read the way x-geo reads it, routed and packed the way x-geo
    does, and read the way x-fence reads that: every hop must understand what it gets."""
    got: list[Pos] = []
    for o in outs:
        if any(to(o, r) for r in regions.values()):
            rb = RegionBatch.from_wire(unpack(o.body))
            geo = XGeo("a", list(WORKERS), RING)
            geo.validate(rb.batch)
            geo.add_binding(FULL)
            for wb in geo.route(rb.batch, notice=rb.notice, gate=rb.gate, announced=rb.announced).values():
                WorkerBatch.from_wire(unpack(pack("positions", parts=[wb.to_wire()]))["parts"][0])
            got += positions_of(rb.batch.take(np.flatnonzero(~rb.notice)))
    return got


@fuzz("ingress_mqtt")
@given(SEEDS)
def test_x_ingress_dead_letters_each_bad_device_message_and_forwards_the_rest(seed: int) -> None:
    messages = mqtt_messages(fuzzer(seed), 8)
    sc, dlx, regions = ingress_sidecar()
    msgs = [Msg(body, rk, headers={"n": i}) for i, (rk, body) in enumerate(messages)]
    with captured() as outs:
        asyncio.run(drained(sc, sc.handle(incoming(msgs), sc.decode_mqtt, "x-ingress.positions")))
    # what x-ingress refuses as from the future (ts past its receive time + the skew): the
    # fuzzer's ts fall anywhere in 2000-2100, a second either side of this bound is never hit
    latest = time.time() + SIDECAR.max_future_s
    expected = [expect_mqtt(rk, body, latest) for rk, body in messages]
    dead = dead_letters(outs, dlx)
    assert sorted(map(numbered, dead)) == [i for i, e in enumerate(expected) if e is None]
    assert all(o.body == msgs[numbered(o)].body and o.headers and
               o.headers["x-geofence-routing-key"] == msgs[numbered(o)].routing_key for o in dead)
    assert Counter(forwarded(outs, regions)) == Counter(e for e in expected if e is not None)


@fuzz("ingress_gateway")
@given(SEEDS)
def test_x_ingress_dead_letters_each_bad_gateway_batch_and_forwards_the_good_positions(seed: int) -> None:
    z = fuzzer(seed)
    messages = [z.gateway_batch() for _ in range(z.rng.randint(1, 4))]
    sc, dlx, regions = ingress_sidecar()
    msgs = [Msg(body, "", ct, headers={"n": i}) for i, (body, ct) in enumerate(messages)]
    with captured() as outs:
        asyncio.run(drained(sc, sc.handle(incoming(msgs), sc.decode_gateway, "x-ingress.batches")))
    latest = time.time() + SIDECAR.max_future_s  # see the device messages' test
    expected = [expect_gateway(body, ct, latest) for body, ct in messages]
    dead = dead_letters(outs, dlx)
    assert sorted(map(numbered, dead)) == [i for i, e in enumerate(expected) if e is None or None in e]
    good = [p for e in expected if e is not None for p in e if p is not None]
    assert Counter(forwarded(outs, regions)) == Counter(good)


# --------------------------------------------------------------------------- the internal wire


def wire_junk(rng: random.Random) -> Any:
    options: list[Callable[[], Any]] = [
        lambda: None, lambda: rng.random() < 0.5, lambda: rng.randint(-(2**63), 2**64 - 1),
        lambda: rng.choice([math.nan, math.inf, -math.inf, 0.0, 1e308, -1.5]),
        lambda: "x" * rng.randint(0, 5), lambda: rng.randbytes(rng.randint(0, 40)),
        lambda: [rng.randint(0, 9) for _ in range(rng.randint(0, 3))],
        lambda: ["a", "b"][: rng.randint(0, 2)],
        lambda: [b"a"], lambda: {"k": 1}, lambda: [[1], [2]]]
    return rng.choice(options)()


def position_batch(rng: random.Random, n_max: int = 6) -> PositionBatch:
    n = rng.randint(0, n_max)
    z = Fuzzer(rng)
    extra: list[dict[str, Any] | None] = []
    if rng.random() < 0.5:
        values: list[Any] = [1, -(2**63), 2**64 - 1, "x", 2.5, math.nan, None, True, [1, "y"], b"z"]
        extra = [None if rng.random() < 0.5 else {z.text(4): rng.choice(values)} for _ in range(n)]
    return PositionBatch([z.object_id() for _ in range(n)],
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


def geo_sidecar() -> tuple[GeoSidecar, Exchange, Exchange]:
    with mock.patch.object(geo_sidecar_module, "HashRing", the_ring):
        sc = GeoSidecar(dataclasses.replace(SIDECAR, role="x-geo", instance="a"))
    sc.core.add_binding(FULL)
    dlx, fence_in = Exchange("dead-letters"), Exchange("x-fence.in")
    sc.dlx, sc.fence_in = cast(Any, dlx), cast(Any, fence_in)
    return sc, dlx, fence_in


def region_batch_of(body: bytes) -> RegionBatch:
    msg = unpack(body)
    if msg["kind"] == "handover":
        b = PositionBatch.from_wire(msg["batch"])
        return RegionBatch(b, np.ones(len(b), bool), np.zeros(len(b)))
    return RegionBatch.from_wire(msg)


@fuzz("unpack")
@given(SEEDS)
def test_unpack_refuses_with_a_value_error_and_a_reason(seed: int) -> None:
    for body, valid in wire_bodies(seed, region_wire, 3):
        try:
            msg = unpack(body)
        except ValueError as exc:
            assert_reason(str(exc))
            assert not valid
            continue
        assert isinstance(msg, dict) and msg["v"] == 1 and isinstance(msg["kind"], str)


@fuzz("x_geo")
@given(SEEDS)
def test_x_geo_dead_letters_what_it_cannot_read_and_routes_the_rest(seed: int) -> None:
    cases = wire_bodies(seed, region_wire, 4)
    sc, dlx, fence_in = geo_sidecar()
    msgs = [Msg(body, "", headers={"n": i}) for i, (body, _) in enumerate(cases)]
    with captured() as outs:
        asyncio.run(sc.handle_positions(incoming(msgs)))  # never raises
    dead = set(map(numbered, dead_letters(outs, dlx)))
    assert not dead & {i for i, (_, valid) in enumerate(cases) if valid}, "a valid batch was dead-lettered"
    taken = [region_batch_of(m.body) for i, m in enumerate(msgs) if i not in dead]  # readable
    # the full-range binding gives every position f-all's worker; notices go to every worker
    sent = {o.routing_key: WorkerBatch.from_wire(unpack(o.body)["parts"][0]) for o in outs if to(o, fence_in)}
    worker = sc.core.worker_of(FULL.fence_id)
    assert (len(sent[worker].positions) if worker in sent else 0) == sum(len(rb.batch) for rb in taken)
    for wb in sent.values():  # what x-fence gets is well formed
        assert all(isinstance(i, str) for i in wb.positions.ids)


FENCE = FenceDef("f-all", 1, box(-20.0, -10.0, 20.0, 10.0), 300.0, "everything near 0,0")


def worker_wire(rng: random.Random) -> dict[str, Any]:
    k = rng.randint(0, 5)
    if k == 0:
        return unpack(control.define_for_worker(control.Define(
            FenceDef("f-2", rng.randint(1, 5), box(0, 0, 1, 1), 60.0, "n"), TS)))
    if k == 1:
        return unpack(control.drop_message(control.Drop("f-2", rng.randint(1, 5), TS)))
    geo = XGeo("a", list(WORKERS), RING)
    geo.add_binding(FULL)
    pb = position_batch(rng)
    notice = np.array([rng.random() < 0.3 for _ in range(len(pb))], bool)
    mine = geo.route(pb, notice=notice).get("w0") or WorkerBatch(
        "w0", PositionBatch.empty(), np.zeros(1, np.int64), [], np.empty(0, np.int32), np.empty(0, bool))
    return {"v": 1, "kind": "positions", "parts": [mine.to_wire()]}  # what x-geo sends to w0


def fence_sidecar(worker: str = "w0") -> tuple[FenceSidecar, Exchange, Exchange]:
    config = dataclasses.replace(SIDECAR, role="x-fence", instance=worker)
    if hasattr(config, "persistence"):  # x-fence's snapshot and journal: not here
        config = dataclasses.replace(config, persistence=False)
    with mock.patch.object(fence_sidecar_module, "HashRing", the_ring):
        sc = FenceSidecar(config)
    sc.core.define(FENCE, TS_MIN)
    dlx, events = Exchange("dead-letters"), Exchange("fence.events")
    sc.dlx, sc.events = cast(Any, dlx), cast(Any, events)
    sc.event_batches = cast(Any, Exchange("fence.event-batches"))
    return sc, dlx, events


@fuzz("x_fence")
@given(SEEDS)
def test_x_fence_dead_letters_what_it_cannot_read_and_handles_the_rest(seed: int) -> None:
    cases = wire_bodies(seed, worker_wire, 4)
    sc, dlx, events = fence_sidecar()
    msgs = [Msg(body, "w0", headers={"n": i}) for i, (body, _) in enumerate(cases)]
    with captured() as outs:
        asyncio.run(drained(sc, sc.handle_inputs(incoming(msgs))))  # never raises
    dead = set(map(numbered, dead_letters(outs, dlx)))
    assert not dead & {i for i, (_, valid) in enumerate(cases) if valid}, "a valid message was dead-lettered"
    for o in outs:
        if to(o, events):
            e = orjson.loads(o.body)
            assert e["event"] in ("enter", "leave") and is_id(e["object_id"]) and math.isfinite(e["ts"])


# --------------------------------------------------------------------------- control messages

SQUARE = box(9.50, 47.10, 9.51, 47.11)


def control_wire(rng: random.Random) -> dict[str, Any]:
    version = rng.randint(2, 9)
    z = Fuzzer(rng)
    fence = FenceDef(z.object_id(), version, SQUARE, float(rng.randint(1, 600)), z.text(6))
    bounds = sorted(rng.sample(range(1 << 40), 2 * rng.randint(1, 4)))
    ranges = np.array(bounds, np.uint64).reshape(-1, 2)
    interior = np.array([rng.random() < 0.5 for _ in range(len(ranges))], bool)
    k = rng.randint(0, 3)
    if k == 0:
        body = control.define_for_region(fence, TS, 20, ranges, interior)
    elif k == 1:
        body = control.rebind_for_region(fence, TS, 20, version - 1,
                                         binding_diff(ranges, interior, ranges[:1], interior[:1]))
    elif k == 2:
        body = control.drop_message(control.Drop(fence.fence_id, version, TS))
    else:
        body = control.define_for_worker(control.Define(fence, TS))
    return unpack(body)


@fuzz("control")
@given(SEEDS)
def test_control_parse_refuses_with_invalid_message(seed: int) -> None:
    for body, valid in wire_bodies(seed, control_wire, 2):
        try:
            msg = unpack(body)
        except ValueError as exc:
            assert_reason(str(exc))
            assert not valid
            continue
        try:
            change = control.parse(msg)
        except InvalidMessage as exc:
            assert_reason(exc.reason)
            assert not valid, exc.reason
            continue
        check_control(change)


def check_control(change: control.Define | control.Drop) -> None:
    """What x-geo and x-fence may rely on in a parsed control message."""
    if isinstance(change, control.Drop):
        assert is_id(change.fence_id) and type(change.version) is int and change.version >= 1
        assert math.isfinite(change.ts)
        return
    f = change.fence
    assert is_id(f.fence_id) and type(f.version) is int and f.version >= 1 and math.isfinite(change.ts)
    assert f.geometry.is_valid and not f.geometry.is_empty and 0 < f.timeout_s <= 7 * 86400
    diff = change.diff
    for r in (change.ranges, diff.add if diff else None, diff.remove if diff else None):
        if r is not None:
            assert r.ndim == 2 and r.shape[1] == 2 and (r[:, 0] <= r[:, 1]).all()
    if change.ranges is not None:
        assert change.interior is not None and len(change.interior) == len(change.ranges)
    if diff is not None:
        assert len(diff.add_interior) == len(diff.add) and change.base_version < f.version


# --------------------------------------------------------------------------- fences (GeoJSON)


def check_round_trip(given_feature: dict[str, Any], fence_id: str, geometry: Any, name: str, timeout_s: float
                     ) -> None:
    props = given_feature.get("properties") or {}
    assert fence_id == given_feature["id"]
    assert name == props.get("name", "")
    assert timeout_s == float(props.get("timeout_s", 300))
    g = given_feature["geometry"]
    want = g["coordinates"] if g["type"] == "MultiPolygon" else [g["coordinates"]]
    got = geometry["coordinates"] if geometry["type"] == "MultiPolygon" else [geometry["coordinates"]]
    assert geometry["type"] == g["type"]
    assert [[[list(p) for p in r] for r in poly] for poly in got] == want


@fuzz("feature")
@given(SEEDS)
def test_a_fence_is_refused_with_a_reason_or_round_trips(seed: int) -> None:
    feature, broken = fuzzer(seed).feature()
    try:
        spec = from_feature(feature)
    except InvalidFence as exc:
        assert_reason(str(exc))
        assert broken is not None, f"a valid fence refused: {exc}"
        return
    assert broken is None, f"accepted a fence that is invalid ({broken})"
    check_round_trip(feature, spec.fence_id, spec.geojson(), spec.name, spec.timeout_s)


class FakeManager:
    """What FenceService needs of the FenceManager, in memory: put echoes the spec."""

    ring = RING
    workers = WORKERS

    async def put(self, spec: Any, expected: int | None = None, create: bool | None = None,
                  owner: str | None = None, follow_ts: float | None = None) -> Change:
        now = datetime.now(UTC)
        record = store.FenceRecord(spec.definition(1), owner or "", now, now, ("a",), spec.follow)
        return Change(spec.fence_id, 1, ("a",), 1, 20, "w0", record=record)

    async def remove(self, fence_id: str, expected: int | None, owner: str) -> Change:
        raise store.UnknownFence(fence_id)

    async def ask_worker(self, worker: str, request: dict[str, Any]) -> dict[str, Any]:
        return {"fence": None, "object": {"fences": []}}

    @property
    def pool(self) -> Any:
        return self

    @contextlib.asynccontextmanager
    async def acquire(self) -> Any:
        yield None


@contextlib.contextmanager
def no_fences() -> Iterator[None]:
    """The store, empty (FakeManager's connections are None)."""
    async def unknown(conn: Any, fence_id: str) -> Any:
        raise store.UnknownFence(fence_id)

    async def nothing(*args: Any) -> Any:
        return None

    async def none_found(*args: Any) -> list[Any]:
        return []

    with mock.patch.object(store, "get_fence", unknown), mock.patch.object(store, "fence_owner", nothing), \
            mock.patch.object(store, "find_fences", none_found):
        yield


def service() -> FenceService:
    return FenceService(cast(Any, FakeManager()))


@fuzz("service")
@given(SEEDS)
def test_the_service_answers_422_with_a_reason_or_stores_the_fence(seed: int) -> None:
    z = fuzzer(seed)
    feature, broken = z.feature()
    caller = Caller("uid-1")
    try:
        if z.rng.random() < 0.5:
            out = asyncio.run(service().create(caller, feature))
        else:
            # PUT /fences/{id}: the path names the fence; a body naming another one (a bad id
            # included) is refused, so a feature whose id is not broken is PUT at its own id
            path = "f-1"
            if broken not in ("bad id", "id not a string", "numeric id") and isinstance(feature, dict) \
                    and isinstance(feature.get("id"), str):
                path = feature["id"]
            out = asyncio.run(service().replace(caller, path, feature))
            feature = {**feature, "id": path}
    except ApiError as exc:
        assert exc.status == 422, (exc.status, exc.message)
        assert_reason(exc.message)
        assert broken is not None, f"a valid fence refused: {exc.message}"
        return
    assert broken is None, f"accepted a fence that is invalid ({broken})"
    p = out["properties"]
    check_round_trip(feature, out["id"], out["geometry"], p["name"], p["timeout_s"])


class Verifier:
    async def verify(self, authorization: str | None) -> User:
        if authorization != "Bearer good":
            raise Unauthenticated(Reason.INVALID, "not the test token")
        return User("uid-1", None, {})


def http_client() -> Any:
    from fastapi.testclient import TestClient

    from fence.api import create_app

    return TestClient(create_app(service(), Verifier()), raise_server_exceptions=False)


HTTP = http_client()


def quoted(fence_id: str) -> str:
    return "".join(c if (c.isalnum() and c.isascii()) or c in "-_"
                   else "".join(f"%{b:02X}" for b in c.encode()) for c in fence_id)


@fuzz("http")
@given(SEEDS)
def test_the_http_api_answers_4xx_with_a_reason_never_5xx(seed: int) -> None:
    z = fuzzer(seed)
    fid = (z.object_id() if z.rng.random() < 0.5 else z.bad_id()) or "."  # "/fences/" is the list
    k = z.rng.randint(0, 5)
    body = b""
    broken: str | None
    if k == 0:
        method, path, broken = z.rng.choice(["GET", "DELETE"]), f"/fences/{quoted(fid)}", "nothing stored"
    elif k == 1:
        body = z.raw(60) if z.rng.random() < 0.5 else z.mqtt_payload()
        method, path, broken = "POST", "/fences", "bytes"
    else:
        feature, broken = z.feature()
        if k == 2 and isinstance(feature, dict) and broken not in ("bad id", "id not a string", "numeric id"):
            feature["id"] = fid  # PUT: a body naming another fence than the path is refused
        if isinstance(feature, bytes):
            body = feature
        else:
            body = orjson.dumps(feature, option=orjson.OPT_NON_STR_KEYS) if _finite(feature) else b"{not json"
        method, path = ("PUT", f"/fences/{quoted(fid)}") if k == 2 else ("POST", "/fences")
        if k == 2 and not is_id(fid):
            broken = "bad id in the path"
    with no_fences():
        r = HTTP.request(method, path, content=body, headers={"Authorization": "Bearer good",
                                                              "Content-Type": "application/json"})
    assert r.status_code < 500, (r.status_code, r.text)
    if k == 0 and ("/" in fid or not fid.strip(".")):
        return  # a path that is no fence id ("/fences//" is the list): anything but a 5xx
    if broken is None:
        assert r.status_code in (200, 201), r.text
        return
    assert 400 <= r.status_code < 500
    answer = r.json()
    assert_reason(answer.get("error") or answer.get("detail"))  # "detail": FastAPI's own 404 / 405


def _finite(v: Any) -> bool:
    """orjson writes NaN as null: such a feature goes as text the API refuses as JSON."""
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, dict):
        return all(_finite(x) for x in v.values())
    if isinstance(v, list):
        return all(_finite(x) for x in v)
    return not isinstance(v, int) or -(2**63) <= v < 2**64


@fuzz("rpc")
@given(SEEDS)
def test_the_amqp_api_answers_every_request_and_dead_letters_the_malformed(seed: int) -> None:
    body = fuzzer(seed).rpc_request()
    server = RpcServer(service(), Verifier(), shell.Counters())
    with no_fences():
        reply, bad = asyncio.run(server.answer(cast(AbstractIncomingMessage, Msg(body))))
    status = reply["status"]
    assert isinstance(status, int) and status < 500, reply
    if status >= 400:
        assert_reason(reply["error"])
    try:
        request = orjson.loads(body)
        malformed = not isinstance(request, dict) or request.get("op") not in RPC_OPS
    except orjson.JSONDecodeError:
        malformed = True
    assert (bad is not None) == malformed, (reply, bad)
    if bad is not None:
        assert status == 400
        assert_reason(bad)


# --------------------------------------------------------------------------- known bugs (pinned)


def _through_the_pipeline(messages: list[Msg], gateway: bool = False) -> list[shell.Out]:
    """x-ingress, x-geo, x-fence handlers in turn, each fed what the one before published:
    every dead letter and event of the three."""
    sc, dlx, regions = ingress_sidecar()
    with captured() as outs:
        decode = sc.decode_gateway if gateway else sc.decode_mqtt
        asyncio.run(drained(sc, sc.handle(incoming(messages), decode, "in")))
    geo, geo_dlx, fence_in = geo_sidecar()
    with captured() as geo_outs:
        asyncio.run(geo.handle_positions(incoming([Msg(o.body) for o in outs
                                                   if any(to(o, r) for r in regions.values())])))
    worker = geo.core.worker_of(FULL.fence_id)
    xf, _, _ = fence_sidecar(worker)  # the x-fence of FULL's worker
    with captured() as xf_outs:
        asyncio.run(drained(xf, xf.handle_inputs(incoming([Msg(o.body, o.routing_key) for o in geo_outs
                                               if to(o, fence_in) and o.routing_key == worker]))))
    return [o for o in outs if to(o, dlx)] + [o for o in geo_outs if to(o, geo_dlx)] + list(xf_outs)


@pytest.mark.parametrize("depth", [17, 1019, 1020, 1021, 1022, 1023])
def test_deep_extra_fields_are_refused_at_x_ingress_and_the_others_go_on(depth: int) -> None:
    """Bug 1, fixed: an extra field nested 1,019-1,023 deep passed x-ingress and then broke
    (or killed) x-geo or x-fence; deeper than 16 is now refused at the door."""
    body = b'{"lon":0.5,"lat":0.5,"ts":1700000000,"x":' + b"[" * depth + b"]" * depth + b"}"
    good = Msg(b'{"lon":0.5,"lat":0.5,"ts":1700000001}', "positions.dev-2")
    outs = _through_the_pipeline([Msg(body, "positions.dev-1"), good])
    dead = [o for o in outs if o.exchange.name == "dead-letters"]
    assert len(dead) == 1 and "nested deeper than 16" in (dead[0].headers or {})[t.REASON_HEADER]
    assert any(orjson.loads(o.body)["object_id"] == "dev-2" for o in outs
               if o.exchange.name == "fence.events")


@pytest.mark.parametrize("extra", ["nested 1,019", "nested 1,020", "nested 1,021", "int key"])
def test_gateway_extra_fields_too_deep_or_with_other_keys_are_refused_alone(extra: str) -> None:
    """Bug 1 (gateway), fixed: the bad position is refused, the other goes on."""
    bad: dict[Any, Any] = {"id": "a", "lon": 0.5, "lat": 0.5, "ts": TS}
    if extra == "int key":
        bad[1] = "x"
    else:
        bad["x"] = nested(int(extra.split()[1].replace(",", "")))
    body = msgpack.packb({"positions": [bad, {"id": "b", "lon": 0.5, "lat": 0.5, "ts": TS + 1}]})
    outs = _through_the_pipeline([Msg(body, "", "application/msgpack")], gateway=True)
    dead = [o for o in outs if o.exchange.name == "dead-letters"]
    assert len(dead) == 1 and "1 of 2 positions refused" in (dead[0].headers or {})[t.REASON_HEADER]
    assert any(orjson.loads(o.body)["object_id"] == "b" for o in outs if o.exchange.name == "fence.events")


BAD_RING = [[9.5, 47.1], [9.51, 47.1], [9.51, 47.11], [9.5, 47.1]]


@pytest.mark.parametrize("where", ["coordinate", "timeout_s"])
def test_known_bug_huge_integers_in_a_fence(where: str) -> None:
    """Bug 2 (fixed): a coordinate or timeout_s that is an integer beyond float range (JSON
    allows it; the HTTP API parses with the json module) raised OverflowError in fence/spec.py."""
    f: dict[str, Any] = {"type": "Feature", "id": "f-1", "properties": {},
                         "geometry": {"type": "Polygon", "coordinates": [[list(p) for p in BAD_RING]]}}
    if where == "coordinate":
        f["geometry"]["coordinates"][0][1][0] = 10**400
    else:
        f["properties"]["timeout_s"] = 10**400
    with pytest.raises(InvalidFence):
        from_feature(f)


def test_known_bug_huge_integers_are_a_500_over_http() -> None:
    """Bug 2 over HTTP (fixed): POST /fences with timeout_s = 10**400 was a 500."""
    body = b'{"type": "Feature", "id": "f-1", "properties": {"timeout_s": 1' + b"0" * 400 + b"}, " \
        b'"geometry": {"type": "Polygon", "coordinates": ' + orjson.dumps([BAD_RING]) + b"}}"
    r = HTTP.post("/fences", content=body, headers={"Authorization": "Bearer good",
                                                    "Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]


@pytest.mark.parametrize("where", ["name", "after", "events"])
def test_known_bug_nul_characters_reach_postgresql(where: str) -> None:
    """Bug 10 (fixed): strings with a NUL character reached PostgreSQL, which refuses them
    (CharacterNotInRepertoireError): a 500 for a fence name with \\u0000 (POST /fences, AMQP
    create), GET /fences?after=%00, and the unchecked fence id of GET /fences/{id}/events."""
    if where == "name":
        with pytest.raises(InvalidFence):
            from_feature({"type": "Feature", "id": "f-1", "properties": {"name": "a\x00b"},
                          "geometry": {"type": "Polygon", "coordinates": [BAD_RING]}})
        return
    with no_fences(), pytest.raises(ApiError) as info:
        if where == "after":
            asyncio.run(service().list(Caller("uid-1"), after="a\x00b"))
        else:
            asyncio.run(service().events(Caller("uid-1"), "a\x00b"))
    assert info.value.status == 422
    assert_reason(info.value.message)


def test_known_bug_chunked_body_over_the_limit() -> None:
    """Bug 11 (fixed): the 4 MiB body limit (413) read only Content-Length: a chunked body of
    any size was read whole and parsed."""
    def chunks() -> Iterator[bytes]:
        yield b'{"type": "Feature", "id": "f-1", "properties": {"name": "'
        for _ in range(5):
            yield b"x" * (1 << 20)
        yield b'"}, "geometry": {}}'

    r = HTTP.post("/fences", content=chunks(), headers={"Authorization": "Bearer good",
                                                        "Content-Type": "application/json"})
    assert r.status_code == 413, (r.status_code, r.text[:200])


@pytest.mark.parametrize("wrong", ["string coordinates", "boolean coordinates", "properties []", "id 5",
                                   "id ''"])
def test_known_bug_wrong_types_coerced(wrong: str) -> None:
    """Bug 3 (fixed): wrong types were coerced instead of refused: coordinates given as strings
    ('9.5') or booleans, properties that are [] / 0 / false / '' (taken as no properties), and in
    FenceService.create an id that is a number or true (str() made it a fence id) or empty / 0 /
    false (a generated id)."""
    f: dict[str, Any] = {"type": "Feature", "id": "f-1", "properties": {},
                         "geometry": {"type": "Polygon", "coordinates": [BAD_RING]}}
    if wrong == "string coordinates":
        f["geometry"]["coordinates"] = [[[str(x), str(y)] for x, y in BAD_RING]]
    elif wrong == "boolean coordinates":
        f["geometry"]["coordinates"] = [[[True, False], [True, True], [False, True], [True, False]]]
    elif wrong == "properties []":
        f["properties"] = []
    else:
        f["id"] = 5 if wrong == "id 5" else ""
        with pytest.raises(ApiError):
            asyncio.run(service().create(Caller("uid-1"), f))
        return
    with pytest.raises(InvalidFence):
        from_feature(f)


def test_x_geo_refuses_ids_that_are_not_strings() -> None:
    """Bug 4, fixed: object ids that are not strings are refused by PositionBatch.from_wire
    (they crashed XGeo.route outside the handler's try)."""
    sc, dlx, _ = geo_sidecar()
    pb = PositionBatch(["a", "b"], np.zeros(2), np.zeros(2), np.full(2, TS), np.zeros(2, np.uint64))
    wire = {"v": 1, "kind": "positions", **RegionBatch(pb, np.zeros(2, bool), np.zeros(2)).to_wire()}
    wire["batch"]["ids"] = [[1], [2]]
    with captured() as outs:
        asyncio.run(sc.handle_positions(incoming([Msg(msgpack.packb(wire, use_bin_type=True))])))
    assert [o.exchange.name for o in outs] == [dlx.name]


def test_x_fence_refuses_ids_that_are_not_strings() -> None:
    """Bug 4 (x-fence), fixed: bytes ids are refused (orjson could not encode the event)."""
    geo = XGeo("a", list(WORKERS), RING)
    geo.add_binding(FULL)
    pb = PositionBatch(["a"], np.zeros(1), np.zeros(1), np.full(1, TS), np.zeros(1, np.uint64))
    part = next(iter(geo.route(pb).values())).to_wire()
    part["positions"]["ids"] = [b"a"]
    wire = {"v": 1, "kind": "positions", "parts": [part]}
    sc, dlx, _ = fence_sidecar()
    with captured() as outs:
        msgs = incoming([Msg(msgpack.packb(wire, use_bin_type=True), "w0")])
        asyncio.run(drained(sc, sc.handle_inputs(msgs)))
    assert [o.exchange.name for o in outs] == [dlx.name]


def test_x_fence_refuses_a_message_without_parts() -> None:
    """Bug 9, fixed: a positions message without parts is dead-lettered (WorkerBatch.concat
    raised outside the handler's try)."""
    sc, dlx, _ = fence_sidecar()
    with captured() as outs:
        no_parts = msgpack.packb({"v": 1, "kind": "positions", "parts": []})
        asyncio.run(drained(sc, sc.handle_inputs(incoming([Msg(no_parts)]))))
    assert [o.exchange.name for o in outs] == [dlx.name]


def test_x_fence_refuses_parts_for_another_worker() -> None:
    """Bug 9, fixed: parts for another worker are dead-lettered."""
    geo = XGeo("a", list(WORKERS), RING)
    geo.add_binding(FULL)
    pb = PositionBatch(["a"], np.zeros(1), np.zeros(1), np.full(1, TS), np.zeros(1, np.uint64))
    part = next(iter(geo.route(pb, notice=np.ones(1, bool)).values())).to_wire()
    bodies = [msgpack.packb({"v": 1, "kind": "positions", "parts": [{**part, "worker": w}]})
              for w in ("w0", "elsewhere")]
    sc, dlx, _ = fence_sidecar()
    with captured() as outs:
        asyncio.run(drained(sc, sc.handle_inputs(incoming([Msg(b, "w0") for b in bodies]))))
    assert [o.exchange.name for o in outs] == [dlx.name]


def test_control_refuses_infinite_bits() -> None:
    """Bug 5, fixed: bits = inf is an InvalidMessage, not an OverflowError."""
    fence = FenceDef("f-1", 1, SQUARE, 300.0, "n")
    msg = unpack(control.define_for_region(fence, TS, 20, np.zeros((0, 2), np.uint64), np.zeros(0, bool)))
    msg["bits"] = math.inf
    with pytest.raises(InvalidMessage):
        control.parse(msg)


@pytest.mark.parametrize("op", [[], {}])
def test_known_bug_rpc_op_unhashable(op: Any) -> None:
    """Bug 6 (fixed): an AMQP fence API request whose op is a list or an object: `op not in OPS`
    raised TypeError (unhashable) outside RpcServer.answer's try: the fence-api process stopped,
    and the request came back to it after every restart."""
    server = RpcServer(service(), Verifier(), shell.Counters())
    reply, bad = asyncio.run(server.answer(cast(AbstractIncomingMessage, Msg(orjson.dumps({"op": op})))))
    assert reply["status"] == 400 and bad


def test_known_bug_replace_with_properties_not_an_object() -> None:
    """Bug 7 (fixed): PUT /fences/{id} (and the AMQP replace) with a Feature whose properties are
    a string, number or list: FenceService.replace called .get on them, AttributeError: a 500."""
    f = {"type": "Feature", "properties": "x", "geometry": {"type": "Polygon", "coordinates": [BAD_RING]}}
    with pytest.raises(ApiError):
        asyncio.run(service().replace(Caller("uid-1"), "f-1", f))


def test_known_bug_rpc_list_bbox_not_a_string() -> None:
    """Bug 8 (fixed): the AMQP `list` op with a bbox that is not a string (a list, a number):
    parse_bbox called .split on it, AttributeError, answered 500 'internal error'."""
    server = RpcServer(service(), Verifier(), shell.Counters())
    body = orjson.dumps({"op": "list", "token": "good", "bbox": [9, 47, 10, 48]})
    with no_fences():
        reply, _ = asyncio.run(server.answer(cast(AbstractIncomingMessage, Msg(body))))
    assert reply["status"] < 500, reply


def test_an_unclosed_ring_is_closed_not_refused() -> None:
    """A leniency, not a refusal: an unclosed ring is taken as closed (shapely closes it)."""
    spec = from_feature({"type": "Feature", "id": "f-1", "properties": {},
                         "geometry": {"type": "Polygon", "coordinates": [BAD_RING[:-1]]}})
    assert Polygon(spec.geometry.exterior).equals(Polygon(BAD_RING))
