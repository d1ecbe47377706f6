"""The inputs of the live fuzz run (tests/faults/test_fuzzed_inputs.py) and what the contract
says of them: from tests/faults/fuzz_inputs.py with one fixed seed per stream, so every run
sends the same inputs (only the ids' run marker differs) and a failure replays.

Invariant: the predictions (`Inputs.dead`, `unroutable`, the HTTP expectations) come from the
pure decoders and the contract, never from the stack: the run compares the stack against them.
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

from exchanges.shell.config import MAX_FUTURE_S
from ingress.positions import Refused, decode_batch, decode_mqtt_many
from tests.faults.fuzz_inputs import RPC_OPS, Fuzzer

# the inputs are the same on every run (a failure replays); FUZZ_SEED=N explores others
SEED = int(os.environ.get("FUZZ_SEED", "20240505"))
COUNTS = {"mqtt": 3_500, "topic": 1_500, "gateway": 2_500, "http": 1_500, "rpc": 1_000}


@dataclass
class Inputs:
    """The run's inputs and what the contract says of them."""

    mqtt: list[bytes] = field(default_factory=list)
    topic: list[tuple[str, bytes]] = field(default_factory=list)
    gateway: list[tuple[bytes, str | None]] = field(default_factory=list)
    http: list[tuple[str, str, bytes, str]] = field(default_factory=list)  # method, path, body, expectation
    rpc: list[bytes] = field(default_factory=list)
    dead: Counter[str] = field(default_factory=Counter)  # per stream, messages to be dead-lettered
    unroutable: int = 0  # topic messages no binding takes (returned to the publisher)
    updates: int = 0  # valid positions among the inputs

    @property
    def total(self) -> int:
        return len(self.mqtt) + len(self.topic) + len(self.gateway) + len(self.http) + len(self.rpc)


def make_inputs(run: str, token: str, device_id: str) -> Inputs:
    """The same inputs for every run but the ids: positions' objects start with fz<run>, HTTP
    fences with fh<run>, AMQP API fences with fr<run>."""
    z = Fuzzer(random.Random(SEED), id_prefix=f"fz{run}")
    out = Inputs()
    # x-ingress refuses a ts more than its skew ahead of when it takes the position (the fuzzer's
    # ts fall anywhere in 2000-2100: none within the minutes between now and when it is taken)
    latest = (time.time(), MAX_FUTURE_S)
    for _ in range(COUNTS["mqtt"]):
        body = z.mqtt_payload()
        out.mqtt.append(body)
        d = decode_mqtt_many([(f"positions.{device_id}", body)], latest)
        out.dead["mqtt"] += bool(d.refused)
        out.updates += len(d.batch)
    for _ in range(COUNTS["topic"]):
        key = z.routing_key().encode()[:255].decode(errors="ignore")  # an AMQP short string
        body = z.mqtt_payload()
        out.topic.append((key, body))
        words = key.split(".")
        if len(words) != 2 or words[0] != "positions":  # x-ingress.positions is bound with positions.*
            out.unroutable += 1
            continue
        d = decode_mqtt_many([(key, body)], latest)
        out.dead["topic"] += bool(d.refused)
        out.updates += len(d.batch)
    for _ in range(COUNTS["gateway"]):
        body, ct = z.gateway_batch()
        out.gateway.append((body, ct))
        try:
            decoded = decode_batch(body, ct, latest)
        except Refused:
            out.dead["gateway"] += 1
            continue
        out.dead["gateway"] += bool(decoded.refused)  # the good positions go on, the message to DLQ too
        out.updates += len(decoded.batch)
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
