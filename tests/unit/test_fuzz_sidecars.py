"""The sidecars' batch handlers fuzzed (issue 5; the properties: test_fuzz_decoders.py): x-ingress,
x-geo and x-fence with publishing captured in memory; each message is dead-lettered with a
reason or goes on, nothing is silently dropped, and what goes on can be read by the next hop.
x-ingress takes the tenant from the routing key only: a device message's
`positions.<tenant>.<id>`, a gateway batch's key on ingress.gateway (one that is not a tenant,
"" from the retired fanout ingress.batches among them, dead-letters the whole batch).
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
    gateway_key,
    is_qualified,
    mqtt_messages,
)
from tests.unit.fuzz_sidecars import (
    FENCE,
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
    FENCE_WORKER,
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
    assert all(is_qualified(p[0]) for p in forwarded(outs, regions))


@fuzz("ingress_gateway")
@given(SEEDS)
def test_x_ingress_dead_letters_each_bad_gateway_batch_and_forwards_the_good_positions(seed: int) -> None:
    z = fuzzer(seed)
    messages = [(*z.gateway_batch(), gateway_key(z)) for _ in range(z.rng.randint(1, 4))]
    sc, dlx, regions = ingress_sidecar()
    msgs = [Msg(body, key, ct, headers={"n": i}) for i, (body, ct, key) in enumerate(messages)]
    with captured() as outs:
        asyncio.run(drained(sc, sc.handle(incoming(msgs), sc.decode_gateway, "x-ingress.batches")))
    latest = time.time() + SIDECAR.max_future_s  # see the device messages' test
    expected = [expect_gateway(body, ct, latest, routing_key=key) for body, ct, key in messages]
    dead = dead_letters(outs, dlx)
    assert sorted(map(numbered, dead)) == [i for i, e in enumerate(expected) if e is None or None in e]
    assert all(o.headers and o.headers["x-geofence-routing-key"] == msgs[numbered(o)].routing_key
               for o in dead)  # a replay comes back with its tenant
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
        asyncio.run(drained(sc, sc.handle_positions(incoming(msgs))))  # never raises
    dead = set(map(numbered, dead_letters(outs, dlx)))
    assert not dead & {i for i, (_, valid) in enumerate(cases) if valid}, "a valid batch was dead-lettered"
    taken = [region_batch_of(m.body) for i, m in enumerate(msgs) if i not in dead]  # readable
    # the full-range binding gives every position f-all's worker; notices go to every worker
    sent = {o.routing_key: WorkerBatch.from_wire(unpack(o.body)["parts"][0]) for o in outs if to(o, fence_in)}
    worker = sc.core.worker_of(FULL.fence_id)
    assert (len(sent[worker].positions) if worker in sent else 0) == sum(len(rb.batch) for rb in taken)
    for wb in sent.values():  # what x-fence gets is well formed
        assert all(isinstance(i, str) for i in wb.positions.ids)
    # the ids go on as they came (a tenant's qualified ones too): x-geo does not read them
    assert Counter(sent[worker].positions.ids if worker in sent else []) == \
        Counter(i for rb in taken for i in rb.batch.ids)


@fuzz("x_fence")
@given(SEEDS)
def test_x_fence_dead_letters_what_it_cannot_read_and_handles_the_rest(seed: int) -> None:
    cases = wire_bodies(seed, worker_wire, 4)
    sc, dlx, events = fence_sidecar(FENCE_WORKER)
    msgs = [Msg(body, FENCE_WORKER, headers={"n": i}) for i, (body, _) in enumerate(cases)]
    with captured() as outs:
        asyncio.run(drained(sc, sc.handle_inputs(incoming(msgs))))  # never raises
    dead = set(map(numbered, dead_letters(outs, dlx)))
    assert not dead & {i for i, (_, valid) in enumerate(cases) if valid}, "a valid message was dead-lettered"
    # the objects of no tenant among what x-fence took: f-all (the platform's) sees only them,
    # a tenant's object (`<tenant>:<id>`) is behind the tenant wall (exchanges/tenancy.py)
    plain = {i for n, m in enumerate(msgs) if n not in dead for i in _object_ids(m.body) if ":" not in i}
    for o in outs:
        if to(o, events):
            e = orjson.loads(o.body)
            # (an id as x-fence got it: a corrupted message it took may carry any string)
            assert e["event"] in ("enter", "leave") and isinstance(e["object_id"], str)
            assert math.isfinite(e["ts"])
            assert e["object_id"] in plain, f"an event of another tenant's object: {e}"
            # f-all is the platform's (no tenant): no tenant on the event, `_` in its routing key
            assert "tenant" not in e and e["fence_id"] in (FENCE.fence_id, "f-2")
            assert o.routing_key == f"fence-events._.{e['fence_id']}.{e['event']}.{e['object_id']}"


def _object_ids(body: bytes) -> list[str]:
    """The object ids of a positions message x-fence took (readable, then)."""
    msg = unpack(body)
    if msg["kind"] != "positions":
        return []
    return [i for part in msg["parts"] for i in WorkerBatch.from_wire(part).positions.ids]
