"""The fuzzing of the wire contracts (issue 5; tests/unit/test_fuzz_*.py): the budget of examples
per property, the seeds hypothesis draws (each seed makes an input with
tests/faults/fuzz_inputs.py), and the oracle: what the contract in docs/reference.md says of each input,
written from the contract, not from the decoders' code.

Invariant: the oracle and the decoders are independent; a test compares one against the other
(nothing invalid accepted, nothing valid refused, every refusal with a printable reason).

Tenants (exchanges/tenancy.py): the generator makes routing keys of the contract before tenants
(`positions.<id>`); `mqtt_messages` puts a tenant word in most of them (a good tenant mostly,
sometimes a bad one), leaves the others as they are (the old contract, refused now), and the
oracle wants `positions.<tenant>.<id>` and the id `<tenant>:<id>`. A gateway's batch comes
with a routing key (`gateway_key`) that must be a tenant.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np
import orjson
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import hilbert_c as hk
from exchanges.batch import PositionBatch
from ingress.positions import (
    MAX_BATCH,
    MAX_BODY_BYTES,
    TS_MAX,
    TS_MIN,
)
from tests.faults.fuzz_inputs import Fuzzer

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


# tenants a credential may carry (its routing key), and words that are none
TENANTS = ("acme", "fleet-2", "0", "t" * 32)
BAD_TENANTS = ("", "Acme", "-acme", "a_b", "a b", "a:b", "*", "#", "acme\n", "t" * 33, "é")


def tenant_word(z: Fuzzer) -> str:
    """A good tenant 7 times in 10, else a bad one or random text."""
    r = z.rng
    k = r.randint(0, 9)
    return r.choice(TENANTS) if k <= 6 else r.choice(BAD_TENANTS) if k <= 8 else z.text(8)


def with_tenant(z: Fuzzer, routing_key: str) -> str:
    """The generator's key with a tenant word after `positions.` (9 in 10 of them); the others
    stay as the contract before tenants had them."""
    prefix = "positions."
    if not routing_key.startswith(prefix) or z.rng.random() < 0.1:
        return routing_key
    return f"{prefix}{tenant_word(z)}.{routing_key[len(prefix):]}"


def mqtt_messages(z: Fuzzer, most: int) -> list[tuple[str, bytes]]:
    """Device messages as x-ingress gets them (routing key `positions.<tenant>.<id>` for the
    topic `positions/<tenant>/<id>`, or a bad one)."""
    return [(with_tenant(z, z.routing_key()), z.mqtt_payload()) for _ in range(z.rng.randint(1, most))]


def gateway_key(z: Fuzzer) -> str:
    """The routing key of a gateway's batch: its tenant on ingress.gateway (or not a tenant:
    "" is what the retired fanout ingress.batches delivers)."""
    return tenant_word(z)


# --------------------------------------------------------------------------- the contract (oracle)


KNOWN = ("id", "lon", "lat", "ts")
# docs/reference.md: object ids (and fence ids) are 1-64 of A-Za-z0-9_- starting with a letter or digit
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
# tenants: 1-32 of a-z 0-9 -, starting with a letter or digit; inside the pipeline an object of a
# tenant is `<tenant>:<object_id>`
TENANT_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
QUALIFIED_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}:[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
ROUTING_KEY_RE = re.compile(r"positions\.([a-z0-9][a-z0-9-]{0,31})\.([A-Za-z0-9][A-Za-z0-9_-]{0,63})")
MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack")
TS = 1_700_000_000.0


Pos = tuple[str, float, float, float, bytes | None]  # id, lon, lat, ts, packed extra fields


def is_id(v: Any) -> bool:
    return isinstance(v, str) and ID_RE.fullmatch(v) is not None


def is_tenant(v: Any) -> bool:
    return isinstance(v, str) and TENANT_RE.fullmatch(v) is not None


def is_qualified(v: Any) -> bool:
    """A tenant's object id as the pipeline names it, `<tenant>:<object_id>`."""
    return isinstance(v, str) and QUALIFIED_RE.fullmatch(v) is not None


def is_number(v: Any, lo: float, hi: float) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and lo <= v <= hi


def packed(extra: dict[Any, Any]) -> bytes:
    """Extra fields compared as bytes (NaN != NaN as a float, not as bytes)."""
    out: bytes = msgpack.packb(extra, use_bin_type=True)
    return out


def extra_fits(extra: dict[Any, Any]) -> bool:
    """docs/reference.md: other fields pass through if nested at most 16 levels, with string keys."""
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


def expect_position(p: Any, latest: float = TS_MAX, tenant: str = "") -> Pos | None:
    """What the contract makes of one position object of `tenant`: the position (its id
    `<tenant>:<id>`), or None (refused). `latest`: the receive time plus the skew x-ingress
    allows (GEOFENCE_MAX_FUTURE_S)."""
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
    oid = f"{tenant}:{p['id']}" if tenant else p["id"]
    return oid, lon, lat, float(p["ts"]), packed(extra) if extra else None


def expect_mqtt(routing_key: str, body: bytes, latest: float = TS_MAX) -> Pos | None:
    """`positions.<tenant>.<id>` (the body's "id", if any, is ignored: the key names the object)."""
    m = ROUTING_KEY_RE.fullmatch(routing_key)
    if m is None or len(body) > MAX_BODY_BYTES:
        return None
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return expect_position({**obj, "id": m[2]}, latest, m[1]) if isinstance(obj, dict) else None


def expect_gateway(body: bytes, content_type: str | None, latest: float = TS_MAX,
                   routing_key: str | None = None) -> list[Pos | None] | None:
    """Per position its verdict, or None when the whole message is refused. `routing_key`: the
    batch's on ingress.gateway, its tenant (anything else refuses the whole batch, "" too);
    None for the decoder called without a tenant (its ids are not qualified)."""
    if len(body) > MAX_BODY_BYTES or (routing_key is not None and not is_tenant(routing_key)):
        return None
    tenant = routing_key or ""
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
    return [expect_position(p, latest, tenant) for p in obj["positions"]]


def assert_reason(reason: Any) -> None:
    assert isinstance(reason, str) and reason.strip(), f"a refusal without a reason: {reason!r}"
    assert reason.isprintable(), f"a reason with control characters: {reason!r}"


def positions_of(batch: PositionBatch) -> list[Pos]:
    """The batch's positions, checked valid (finite, in range, proper ids: a tenant's,
    qualified, or the platform's own)."""
    assert np.isfinite(batch.lon).all() and np.isfinite(batch.lat).all() and np.isfinite(batch.ts).all()
    assert ((batch.lon >= -180) & (batch.lon <= 180) & (batch.lat >= -90) & (batch.lat <= 90)).all()
    assert ((batch.ts >= TS_MIN) & (batch.ts <= TS_MAX)).all()
    assert all(is_qualified(i) or is_id(i) for i in batch.ids)
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
