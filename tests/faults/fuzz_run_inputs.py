"""The inputs of the live fuzz run (tests/faults/test_fuzzed_inputs.py) and what the contract
says of them: from tests/faults/fuzz_inputs.py with one fixed seed per stream, so every run
sends the same inputs (only the ids' run marker differs) and a failure replays.

Invariant: the predictions (`Inputs.dead`, `unroutable`, `reasons`, the HTTP expectations) come
from the pure decoders and the contract, never from the stack: the run compares the stack
against them.

Tenants (exchanges/tenancy.py): the run's positions are its tenant's (the device's topic
`positions/<tenant>/<id>`, the gateway's key); beside them go inputs of the old contract, each
to be dead-lettered with the reason the contract gives: the old topic `positions/<id>` (over
MQTT as the administrator, and as AMQP keys `positions.<id>`) and batches to the retired
fanout `ingress.batches`; and fuzzed keys on ingress.gateway (a word that is no tenant is
dead-lettered with its reason, more than one word is returned to the publisher).
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import orjson

from exchanges import topology as t
from exchanges.shell.config import MAX_FUTURE_S
from ingress.positions import (
    Refused,
    decode_batch,
    decode_mqtt_many,
    object_id_from_routing_key,
    tenant_from_routing_key,
)
from tests.faults.fuzz_inputs import RPC_OPS, Fuzzer

# the inputs are the same on every run (a failure replays); FUZZ_SEED=N explores others
SEED = int(os.environ.get("FUZZ_SEED", "20240505"))
# mqtt: the device, its topic; mqtt-old: the administrator on the device's old topic
# positions/<id>; topic: amq.topic, fuzzed keys; gateway: the tenant's gateway user on
# ingress.gateway under its tenant; gateway-key: ingress.gateway, fuzzed keys; retired: the
# retired fanout ingress.batches
COUNTS = {"mqtt": 3_400, "mqtt-old": 100, "topic": 1_500, "gateway": 2_000, "gateway-key": 250,
          "retired": 250, "http": 1_500, "rpc": 1_000}
# the reason x-ingress gives a batch of the retired fanout starts so (ingress/sidecar.py)
RETIRED_REASON = f"{t.RETIRED_BATCHES_EXCHANGE} carries no tenant"

Keyed = tuple[str, bytes, str | None]  # routing key, body, content type


@dataclass
class Inputs:
    """The run's inputs and what the contract says of them."""

    mqtt: list[bytes] = field(default_factory=list)
    mqtt_old: list[bytes] = field(default_factory=list)
    topic: list[tuple[str, bytes]] = field(default_factory=list)
    gateway: list[tuple[bytes, str | None]] = field(default_factory=list)
    gateway_key: list[Keyed] = field(default_factory=list)
    retired: list[Keyed] = field(default_factory=list)
    http: list[tuple[str, str, bytes, str]] = field(default_factory=list)  # method, path, body, expectation
    rpc: list[bytes] = field(default_factory=list)
    dead: Counter[str] = field(default_factory=Counter)  # per stream, messages to be dead-lettered
    unroutable: Counter[str] = field(default_factory=Counter)  # per stream, returned to the publisher
    # (stream, index) -> the exact reason of its dead letter, where the contract fixes it whatever
    # the time: a routing key's refusal (the old contract's positions.<id>, a word that is no
    # tenant); every one of "retired" starts with RETIRED_REASON
    reasons: dict[tuple[str, int], str] = field(default_factory=dict)
    updates: int = 0  # valid positions among the inputs

    @property
    def total(self) -> int:
        positions = (len(self.mqtt) + len(self.mqtt_old) + len(self.topic) + len(self.gateway)
                     + len(self.gateway_key) + len(self.retired))
        return positions + len(self.http) + len(self.rpc)


def _short(key: str) -> str:
    return key.encode()[:255].decode(errors="ignore")  # an AMQP short string


def make_inputs(run: str, token: str, device_id: str, tenant: str) -> Inputs:
    """The same inputs for every run but the ids: positions' objects start with fz<run>, HTTP
    fences with fh<run>, AMQP API fences with fr<run>; the run's device `device_id` and
    gateway are `tenant`'s."""
    z = Fuzzer(random.Random(SEED), id_prefix=f"fz{run}")
    out = Inputs()
    # x-ingress refuses a ts more than its skew ahead of when it takes the position (the fuzzer's
    # ts fall anywhere in 2000-2100: none within the minutes between now and when it is taken)
    latest = (time.time(), MAX_FUTURE_S)
    for _ in range(COUNTS["mqtt"]):
        body = z.mqtt_payload()
        out.mqtt.append(body)
        d = decode_mqtt_many([(f"positions.{tenant}.{device_id}", body)], latest)
        out.dead["mqtt"] += bool(d.refused)
        out.updates += len(d.batch)
    old_topic = f"positions.{device_id}"  # positions/<id>: the device's topic before tenants
    for i in range(COUNTS["mqtt-old"]):
        out.mqtt_old.append(z.mqtt_payload())
        out.dead["mqtt-old"] += 1
        out.reasons[("mqtt-old", i)] = _key_refusal(old_topic)
    for i in range(COUNTS["topic"]):
        key = _short(z.tenant_routing_key(tenant))
        body = z.mqtt_payload()
        out.topic.append((key, body))
        words = key.split(".")
        # x-ingress.positions is bound with positions.*.* (and the retired positions.*)
        if len(words) not in (2, 3) or words[0] != "positions":
            out.unroutable["topic"] += 1
            continue
        d = decode_mqtt_many([(key, body)], latest)
        out.dead["topic"] += bool(d.refused)
        out.updates += len(d.batch)
        refusal = _key_refusal(key)
        if refusal:
            out.reasons[("topic", i)] = refusal
    for _ in range(COUNTS["gateway"]):
        body, ct = z.gateway_batch()
        out.gateway.append((body, ct))
        dead, updates = _gateway(body, ct, latest, tenant)
        out.dead["gateway"] += dead
        out.updates += updates
    for i in range(COUNTS["gateway-key"]):
        key = _short(z.gateway_key(tenant))
        body, ct = z.gateway_batch()
        out.gateway_key.append((key, body, ct))
        if "." in key:  # ingress.gateway is bound with `*`: one word
            out.unroutable["gateway-key"] += 1
            continue
        try:
            tenant_from_routing_key(key)
        except Refused as exc:
            out.dead["gateway-key"] += 1
            out.reasons[("gateway-key", i)] = str(exc)
            continue
        dead, updates = _gateway(body, ct, latest, key)
        out.dead["gateway-key"] += dead
        out.updates += updates
    for _ in range(COUNTS["retired"]):
        body, ct = z.gateway_batch()
        out.retired.append((z.rng.choice(["", tenant]), body, ct))  # a key there is no tenant's say-so
        out.dead["retired"] += 1
    # HTTP: what to expect of a request depends on the others only through the fence ids valid
    # creations use (the requests run concurrently, in no set order): a fence id created once and
    # named by no other request gives 201; a request naming a fence that may exist, anything but
    # a 5xx; the rest a 4xx (refused, or no such fence)
    z = Fuzzer(random.Random(SEED + 1), id_prefix=f"fh{run}")
    r = z.rng
    planned: list[tuple[str, str, bytes, str | None, bool]] = []  # method, path, body, fence id, valid
    for _ in range(COUNTS["http"]):
        fid = z.object_id() if r.random() < 0.5 else z.bad_id()
        path_id = "/fences/" + quote(fid, safe="")
        k = r.randint(0, 5)
        if k == 0 and "/" not in fid and fid.strip("."):
            planned.append((r.choice(["GET", "DELETE"]), path_id, b"", fid, False))
        elif k <= 1:
            junk = z.raw(60) if r.random() < 0.5 else z.mqtt_payload()
            planned.append(("POST", "/fences", junk, None, False))
        else:
            feature, broken = z.feature()
            body = orjson.dumps(feature, option=orjson.OPT_NON_STR_KEYS) if _json_ready(feature) else b"{oops"
            if k == 2 and "/" not in fid and fid.strip("."):
                planned.append(("PUT", path_id, body, fid, broken is None))
            else:
                planned.append(("POST", "/fences", body, feature["id"] if broken is None else None,
                                broken is None))
    created = Counter(f for m, _, _, f, valid in planned if m == "POST" and valid)
    named = Counter(f for m, _, _, f, _ in planned if m != "POST")
    for m, path, data, f, valid in planned:
        if m == "POST" and valid:
            expect = "201" if created[f] == 1 and not named[f] else "any"
        elif m != "POST" and f in created and (valid or m != "PUT"):
            expect = "any"
        else:
            expect = "4xx"
        out.http.append((m, path, data, expect))
    z = Fuzzer(random.Random(SEED + 2), id_prefix=f"fr{run}", token=token)
    for _ in range(COUNTS["rpc"]):
        body = z.rpc_request()
        out.rpc.append(body)
        try:
            request = orjson.loads(body)
            malformed = not isinstance(request, dict) or request.get("op") not in RPC_OPS
        except orjson.JSONDecodeError:
            malformed = True
        out.dead["rpc"] += malformed
    return out


def _key_refusal(key: str) -> str:
    """The reason x-ingress refuses a device position for its routing key ("" if it does not)."""
    try:
        object_id_from_routing_key(key)
    except Refused as exc:
        return str(exc)
    return ""


def _gateway(body: bytes, ct: str | None, latest: tuple[float, float], tenant: str) -> tuple[bool, int]:
    """Whether a gateway batch of `tenant` is dead-lettered (whole, or some of its positions: the
    good ones go on, the message to the dead letters too), and how many positions go on."""
    try:
        decoded = decode_batch(body, ct, latest, tenant)
    except Refused:
        return True, 0
    return bool(decoded.refused), len(decoded.batch)


def _json_ready(v: Any) -> bool:
    """orjson writes NaN as null and refuses integers over 64 bits: such a body goes broken."""
    if isinstance(v, float):
        return v == v and abs(v) != float("inf")
    if isinstance(v, dict):
        return all(_json_ready(x) for x in v.values())
    if isinstance(v, list):
        return all(_json_ready(x) for x in v)
    if isinstance(v, bytes):
        return False
    return not isinstance(v, int) or -(2**63) <= v < 2**64
