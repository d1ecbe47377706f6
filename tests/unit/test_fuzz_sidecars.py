"""The sidecars' batch handlers fuzzed (issue 5; the properties: test_fuzz_decoders.py): x-ingress,
x-geo and x-fence with publishing captured in memory; each message is dead-lettered with a
reason or goes on, nothing is silently dropped, and what goes on can be read by the next hop.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter

import orjson
from hypothesis import given

from exchanges.batch import unpack
from exchanges.worker_batch import WorkerBatch
from tests.unit.fuzz_contract import (
    SEEDS,
    expect_gateway,
    expect_mqtt,
    fuzz,
    fuzzer,
    is_id,
    mqtt_messages,
)
from tests.unit.fuzz_sidecars import (
    FULL,
    SIDECAR,
    Msg,
    captured,
    dead_letters,
    drained,
    fence_sidecar,
    forwarded,
    geo_sidecar,
    incoming,
    ingress_sidecar,
    numbered,
    to,
)
from tests.unit.fuzz_wire import (
    region_batch_of,
    region_wire,
    wire_bodies,
    worker_wire,
)

# --------------------------------------------------------------------------- x-ingress


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


# --------------------------------------------------------------------------- x-geo and x-fence


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
