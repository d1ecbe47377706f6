"""Fences fuzzed (issue 5; the properties: test_fuzz_decoders.py): a GeoJSON fence is refused with
a reason (InvalidFence, a 422) or round-trips, through from_feature, the fence service, the HTTP
API (never a 5xx) and the AMQP API (every request answered, the malformed dead-lettered).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, cast

import orjson
from aio_pika.abc import AbstractIncomingMessage
from hypothesis import given

from exchanges import shell
from exchanges.fence_def import InvalidFence
from fence.rpc import RpcServer
from fence.service import ApiError, Caller
from fence.spec import from_feature
from tests.faults.fuzz_inputs import RPC_OPS
from tests.unit.fuzz_contract import (
    SEEDS,
    assert_reason,
    fuzz,
    fuzzer,
    is_id,
)
from tests.unit.fuzz_fence_api import HTTP, Verifier, no_fences, service
from tests.unit.fuzz_sidecars import Msg


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


@fuzz("service")
@given(SEEDS)
def test_the_service_answers_422_with_a_reason_or_stores_the_fence(seed: int) -> None:
    z = fuzzer(seed)
    feature, broken = z.feature()
    caller = Caller("uid-1", tenant="t1", role="editor")
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
