"""Issue 5, "bad input gets a clear error and loses nothing": property tests over every
decoder of the wire contracts, more than 10,000 fuzzed inputs in all (BUDGET in
fuzz_contract.py).

The inputs come from tests/faults/fuzz_inputs.py (the fault test against the live stack uses
the same generator): structured-but-wrong messages (valid JSON / msgpack with wrong types,
NaN and infinities, lat 91, lon -181, ts as strings or in milliseconds, missing and extra
fields, huge numbers, unicode ids, ids with '.', '#', '/' or empty), raw random bytes,
truncated and bit-flipped valid messages. Hypothesis draws the generator's seeds
(derandomize: the same inputs on every run; a failure names its seed and the assertion shows
the input); building a message from a seed costs a fraction of drawing it field by field with
strategies, which keeps 10,000+ examples under a minute on two cores. The properties:

- the tenant is the routing key's (`positions.<tenant>.<id>`, a gateway's key on ingress.gateway),
  never the body's: every id accepted is `<tenant>:<id>`; a key without a tenant (the contract
  before tenants) or with a bad one is refused;
- a decoder raises nothing but its documented refusal (ingress: `Refused`; the sidecars'
  wire: what their `except` clause catches; control: `InvalidMessage`; fences: `InvalidFence`),
  and every refusal has a non-empty, printable reason;
- the verdict on each input equals an oracle written from the contract in docs/reference.md (not from
  the decoder's code: fuzz_contract.py): nothing invalid is accepted, nothing valid refused;
  an accepted position is finite, in range and equal to what was sent;
- per batch, accepted + refused == input (nothing silently dropped), also through the real
  sidecar batch handlers (x-ingress, x-geo, x-fence, the AMQP fence API) with publishing
  captured in memory: each message is dead-lettered with a reason or goes on, and what goes on
  can be read by the next hop;
- a valid fence round-trips; an invalid one is an `InvalidFence` / 422 with a reason, never
  a 5xx.

The bugs this fuzzing found (11: six of them killed a sidecar) are fixed; each keeps a test
of its own (test_fuzz_known_bugs.py), and the generator makes their inputs again.

The properties by front: the ingress decoders here; the internal wire and control messages in
test_fuzz_wire.py; the sidecars' handlers in test_fuzz_sidecars.py; fences, the fence service,
the HTTP and AMQP fence APIs in test_fuzz_fences.py. Shared: the budget, the seeds and the
oracle (fuzz_contract.py), the sidecars without a broker (fuzz_sidecars.py), the wire's
generators (fuzz_wire.py), the fence API without a store (fuzz_fence_api.py).
"""

from __future__ import annotations

from typing import Any, cast

import msgpack
import orjson
from hypothesis import given

from ingress.positions import (
    MAX_BATCH,
    Refused,
    decode_batch,
    decode_mqtt_many,
)
from tests.unit.fuzz_contract import (
    BUDGET,
    MSGPACK_TYPES,
    SEEDS,
    TENANTS,
    TS,
    assert_reason,
    check_decoded,
    expect_gateway,
    expect_mqtt,
    fuzz,
    fuzzer,
    is_qualified,
    mqtt_messages,
)


def test_the_budget_is_ten_thousand_examples() -> None:
    assert sum(BUDGET.values()) >= 10_000


# --------------------------------------------------------------------------- ingress decoders


@fuzz("mqtt")
@given(SEEDS)
def test_decode_mqtt_many_refuses_with_reasons_and_drops_nothing(seed: int) -> None:
    messages = mqtt_messages(fuzzer(seed), 8)
    decoded = decode_mqtt_many(messages)  # documented: never raises, refusals per message
    check_decoded(decoded.batch, decoded.refused, [expect_mqtt(rk, body) for rk, body in messages], messages)
    assert all(is_qualified(i) for i in decoded.batch.ids)  # a device's position is always a tenant's


@fuzz("gateway")
@given(SEEDS)
def test_decode_batch_refuses_with_reasons_and_drops_nothing(seed: int) -> None:
    z = fuzzer(seed)
    body, content_type = z.gateway_batch()
    tenant = z.rng.choice(TENANTS)  # the sidecar's: its routing key, checked (test_fuzz_sidecars.py)
    expected = expect_gateway(body, content_type, routing_key=tenant)
    try:
        decoded = decode_batch(body, content_type, tenant=tenant)
    except Refused as exc:
        assert_reason(str(exc))
        assert expected is None, f"the whole batch refused ({exc}), the contract takes it: {body!r:.300}"
        return
    assert expected is not None, f"a batch the contract refuses as a whole was taken: {body!r:.300}"
    check_decoded(decoded.batch, decoded.refused, expected, _items(body, content_type))
    assert all(i.startswith(f"{tenant}:") for i in decoded.batch.ids)


def _items(body: bytes, content_type: str | None) -> list[Any]:
    obj = msgpack.unpackb(body, raw=False, strict_map_key=False) if content_type in MSGPACK_TYPES \
        else orjson.loads(body)
    return cast(list[Any], obj["positions"])


def test_a_batch_of_exactly_the_limit_is_decoded_position_by_position() -> None:
    """(50,000 real positions do not fit in 256 KiB: most are empty objects here.)"""
    positions: list[dict[str, Any]] = [{} for _ in range(MAX_BATCH)]
    positions[7] = {"id": "o7", "lon": 9.5, "lat": 47.1, "ts": TS}
    positions[MAX_BATCH - 1] = {"id": "last", "lon": 9.5, "lat": 47.1, "ts": TS}
    decoded = decode_batch(msgpack.packb({"positions": positions}), "application/msgpack", tenant="acme")
    assert decoded.batch.ids == ["acme:o7", "acme:last"] and len(decoded.refused) == MAX_BATCH - 2
