"""Fuzzed inputs for the wire contracts (issue 5, "bad input gets a clear error and loses
nothing"), built by a seeded `random.Random`: the same seed gives the same inputs, so the
unit properties (tests/unit/test_fuzz_decoders.py, hypothesis draws the seeds) and the fault
test against the live stack (tests/faults/test_fuzzed_inputs.py, one fixed seed) share them.

Mostly valid messages mutated: fields missing or of the wrong type (strings, booleans, null,
lists), NaN and infinities, lat 91, lon -181, ts in milliseconds or as a date string, huge
numbers, extra fields (nested up to 1,100 deep), ids that are empty, too long, unicode or hold
'.', '#', '/'; then raw random bytes, truncated and bit-flipped valid messages, bodies over
the size limit. Fences: GeoJSON Features broken in one way each (self-intersecting, unclosed,
too few points, NaN, out of range, over 10,000 vertices, wrong types, bad ids and timeouts).

Tenants (exchanges/tenancy.py): `routing_key` draws keys of the contract before tenants
(`positions.<id>`: tests/unit/fuzz_contract.py puts a tenant word in them); the live run draws
`tenant_routing_key` (mostly `positions.<tenant>.<id>`, some of the old contract, some odd) and,
for ingress.gateway, `gateway_key` (mostly the tenant, some words that are none).

The inputs that tripped the bugs this fuzzing found (tests/unit/test_fuzz_decoders.py names
each, now fixed) are among them.
"""

from __future__ import annotations

import json
import math
import random
import re
import unicodedata
from collections.abc import Callable
from typing import Any

import msgpack
import orjson

from exchanges.text import allowed
from hilbert_c import COORD_SLACK_DEG
from ingress.positions import MAX_BATCH, MAX_BODY_BYTES, TS_MAX, TS_MIN

TS = 1_700_000_000.0
KNOWN = ("id", "lon", "lat", "ts")
MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack")
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # object and fence ids (docs/reference.md)
ID_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
ODD_CHARS = ".#/+* \t\n\r\x00\x7f\u00e9\u00df\u8eca\u200b\u00a0\U0001f4a5\"\\'%?&=:;,{}[]"
BAD_IDS = ["", ".", "a.b", "car.1", "#", "a#b", "/", "a/b", "+", "*", "a b", " ", "-a", "_a", "a\n", "a\x00",
           "\u00e9t\u00e9", "\u8eca", "a" * 65, "\U0001f4a5", "a\u200b", "a\r", "positions", "..", "a/../b"]
EDGES: list[Any] = [91, -91, 90.0000001, 180.0000001, -181, -180.5, 1e308, -1e308, 5e-324, -0.0, 0,
                    TS_MIN - 1, TS_MAX + 1, TS * 1000, 2**63 - 1, -(2**63), 2**64 - 1, 10**30, -(10**30)]
DATE_STRINGS = ["9.5", "47.1", "1700000000", "", "NaN", "Infinity", "2023-11-14T22:13:20Z", "1e3", "0x10"]
# Depth of a list nested in an extra field: 16 passes (docs/reference.md, "Wire contracts"),
# deeper is refused. Bug 1 was
# 1,019-1,023 passing x-ingress, then breaking x-fence's unpack (1,019), x-geo's pack (1,020),
# x-geo's unpack (1,021), x-ingress's pack (1,022-1,023, MQTT only).
MQTT_DEPTHS = (1, 2, 15, 17, 64, 500, 1000, 1018, 1019, 1020, 1021, 1022, 1024, 1100)
BATCH_DEPTHS = (1, 2, 15, 17, 64, 500, 1000, 1018, 1019, 1020, 1021, 1022)
DEEP = "\x00deep\x00"  # placeholder key: json.dumps cannot nest 1,000 deep (RecursionError)

OVERSIZE = b'{"lon": 9.5, "lat": 47.1, "ts": 1700000000, "pad": "' + b"x" * MAX_BODY_BYTES + b'"}'
_HEAD = b'{"lon": 9.5, "lat": 47.1, "ts": 1700000000, "pad": "'
AT_LIMIT = _HEAD + b"x" * (MAX_BODY_BYTES - len(_HEAD) - 2) + b'"}'  # exactly the limit: valid
LITERALS = [
    b'{"lon": NaN, "lat": 47.1, "ts": 1700000000}', b'{"lon": 9.5, "lat": Infinity, "ts": 1700000000}',
    b'{"lon": 9.5, "lat": 47.1, "ts": -Infinity}', b'{"lon": 9.5, "lat": 47.1, "ts": 1700000000,}',
    b'\xef\xbb\xbf{"lon": 9.5, "lat": 47.1, "ts": 1700000000}', b'{"lon": 9.5, "lat": 47.1, "ts": 1.7e9}{}',
    b'{"lon": 9.5, "lon": 200, "lat": 47.1, "ts": 1700000000}',
    b' \n{"lon":9.5,"lat":47.1,"ts":1700000000}\t',
    b"", b"null", b'"lon"', b"[9.5, 47.1, 1700000000]", b'{"lon": 1e400, "lat": 47.1, "ts": 1700000000}',
    b'{"lon": 9.5, "lat": 47.1, "ts": "1700000000"}', b'{"lon": "9.5", "lat": "47.1", "ts": 1700000000}',
    b'{"lon": 9.5, "lat": 47.1, "ts": 1700000000000}', b'{"lon": 9.5, "lat": 47.1}',
    b'{"lon": 9.5, "lat": 91, "ts": 1700000000}', b'{"lon": -181, "lat": 47.1, "ts": 1700000000}',
    b'{"lon": 9.5, "lat": 47.1, "ts": 100000000000000000000000000000}',
    b'{"lon": true, "lat": 0, "ts": 1.7e9}',
    b'{"lon": 9.5, "lat": 47.1, "ts": 1700000000, "id": "spoofed.id/#"}', b"\x00" * 8, OVERSIZE, AT_LIMIT,
    b'{"lon": 9.5, "lat": 47.1, "ts": 1700000000, "\xff": 1}',
    b'{"lon": 9.5, "lat": 47.1, "ts": 1.7e9, "s": "\xed\xa0\x80"}',
    b'{"lon": 9.5, "lat": 47.1, "ts": 1700000000, "lat": null}',
    b'{"lon": -0.0, "lat": -90, "ts": 946684800}',
    b'{"lon": 180, "lat": 90, "ts": 4102444800}', b'{"lon": 1E2, "lat": 4.71e1, "ts": 17e8}',
]
TOO_MANY_JSON = b'{"positions": [' + b",".join([b"{}"] * (MAX_BATCH + 1)) + b"]}"
TOO_MANY_MSGPACK: bytes = msgpack.packb({"positions": [{}] * (MAX_BATCH + 1)})
MSGPACK_ODDITIES = [b"\x81\x91\x01\x01", b"\xc1", b"\xd4\x05\x00", b"\x81\xa9positions\xc7\x01\x07\x00",
                    b"\x81\xa9positions\xdd\xff\xff\xff\xff", b"\x81\xa9positions\x91\x84"]


def nested(depth: int) -> Any:
    v: Any = []
    for _ in range(depth - 1):
        v = [v]
    return v


def deepen(obj: Any) -> Any:
    """{DEEP: n} -> {"deep": [[...]]} (n deep), for msgpack."""
    if isinstance(obj, dict):
        return {("deep" if k == DEEP else k): (nested(v) if k == DEEP else deepen(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [deepen(v) for v in obj]
    return obj


def json_bytes(obj: Any, ascii_only: bool = True) -> bytes:
    """JSON as a device might write it: NaN / Infinity literals, big integers, lone surrogates
    (invalid UTF-8) included; {DEEP: n} becomes "deep": [[...]] n deep."""
    text = json.dumps(obj, allow_nan=True, ensure_ascii=ascii_only)
    key = json.dumps(DEEP, ensure_ascii=ascii_only)
    while key in text:
        at = text.index(key)
        m = re.match(r"\s*:\s*(\d+)", text[at + len(key):])
        assert m is not None
        n = int(m[1])
        text = text[:at] + '"deep": ' + "[" * n + "]" * n + text[at + len(key) + m.end():]
    return text.encode("utf-8", "surrogatepass")


def msgpack_bytes(obj: Any, bin_type: bool = True) -> bytes:
    out: bytes = msgpack.packb(deepen(_msgpack_safe(obj)), use_bin_type=bin_type)
    return out


def _msgpack_safe(obj: Any) -> Any:
    """msgpack holds integers in [-2**63, 2**64): bigger ones as floats."""
    if isinstance(obj, bool):
        return obj
    if isinstance(obj, int) and not -(2**63) <= obj < 2**64:
        return float(obj)
    if isinstance(obj, list):
        return [_msgpack_safe(v) for v in obj]
    if isinstance(obj, dict):
        return {k: _msgpack_safe(v) for k, v in obj.items()}
    return obj


ODD_ROUTING_KEYS = ["positions", "positions.", "position.car-1", "telemetry.car-1", "positions.a.b", "",
                    ".car-1", "positions/car-1", "positions.car-1.", "Positions.car-1", "positions..car-1",
                    "positions.#", "positions.*"]
# tenant words that are none (tenant ids: 1-32 of a-z 0-9 -, starting with a letter or digit),
# none holding a dot (a word of a routing key)
BAD_TENANTS = ["Acme", "-acme", "a_b", "a b", "a:b", "*", "#", "acme\n", "t" * 33, "\u00e9", "ACME", "_",
               "a/b", "acme "]


class Fuzzer:
    """Inputs drawn from `rng`. `id_prefix` starts every valid object / fence id (a run marker)."""

    def __init__(self, rng: random.Random, id_prefix: str = "o", token: str = "good") -> None:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,39}", id_prefix), id_prefix
        self.rng = rng
        self.id_prefix = id_prefix
        self.token = token  # the fence API token of the requests meant to authenticate

    # -- atoms ------------------------------------------------------------------------------

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def text(self, n: int = 8) -> str:
        r = self.rng
        pool = r.choice([ID_CHARS, ID_CHARS + ODD_CHARS, ODD_CHARS, "".join(map(chr, range(32, 127)))])
        return "".join(r.choice(pool) for _ in range(r.randint(0, n)))

    def object_id(self) -> str:
        r = self.rng
        n = r.randint(0, 64 - len(self.id_prefix))
        return self.id_prefix + "".join(r.choice(ID_CHARS) for _ in range(n))

    def bad_id(self) -> str:
        r = self.rng
        if r.random() < 0.5:
            return r.choice(BAD_IDS)
        s = self.text(70)
        return s if r.random() < 0.5 else self.id_prefix + s

    def scalar(self) -> Any:
        r = self.rng
        options: list[Callable[[], Any]] = [
            lambda: None, lambda: r.random() < 0.5, lambda: r.randint(-(2**63), 2**64 - 1),
            lambda: r.randint(-1000, 1000), lambda: r.uniform(-1e6, 1e6), lambda: r.choice(EDGES),
            lambda: self.text(12)]
        return r.choice(options)()

    def json_value(self, depth: int = 2) -> Any:
        r = self.rng
        k = r.randint(0, 5 if depth > 0 else 3)
        if k <= 3:
            return self.scalar()
        if k == 4:
            return [self.json_value(depth - 1) for _ in range(r.randint(0, 3))]
        return {self.text(6): self.json_value(depth - 1) for _ in range(r.randint(0, 3))}

    def wrong(self) -> Any:
        """A value of the wrong type or out of range for a coordinate or a timestamp."""
        r = self.rng
        options: list[Callable[[], Any]] = [
            lambda: None, lambda: r.random() < 0.5, lambda: self.text(8), lambda: r.choice(DATE_STRINGS),
            lambda: [r.uniform(-180, 180) for _ in range(r.randint(0, 2))], lambda: {"v": r.randint(0, 9)},
            lambda: r.choice([math.nan, math.inf, -math.inf]), lambda: r.choice(EDGES),
            lambda: r.choice(EDGES), lambda: r.uniform(-1e9, 1e9)]
        return r.choice(options)()

    def outside(self, lo: float, hi: float) -> float | int:
        """A number just (or far) outside [lo, hi] (for a coordinate, beyond the float noise
        at the world's edge that is taken as the edge: hilbert_c.COORD_SLACK_DEG)."""
        r = self.rng
        up = math.nextafter(hi + 2 * COORD_SLACK_DEG, math.inf)
        down = math.nextafter(lo - 2 * COORD_SLACK_DEG, -math.inf)
        return r.choice([up, down, math.floor(hi) + 1, math.ceil(lo) - 1, up + r.uniform(0, 1e3),
                         down - r.uniform(0, 1e3), hi * 1000])

    def number(self, lo: float, hi: float) -> float | int:
        r = self.rng
        k = r.randint(0, 9)
        if k == 0:
            return r.choice([lo, hi, int(lo), int(hi), 0 if lo <= 0 <= hi else int(lo),
                             -0.0 if lo <= 0 else hi])
        if k <= 2:
            return r.randint(math.ceil(lo), math.floor(hi))
        return r.uniform(lo, hi)

    # -- positions --------------------------------------------------------------------------

    def position(self, ids: str = "none", depths: tuple[int, ...] = MQTT_DEPTHS,
                 odd_keys: bool = False) -> dict[Any, Any]:
        """A position object: each known field missing (1/12), wrong (2/12) or right; extras.
        ids: "none" (MQTT: the topic names the object), "ok" or "mixed"."""
        r = self.rng
        p: dict[Any, Any] = {}
        if r.random() < 0.25:
            for _ in range(r.randint(1, 3)):
                key: Any = self.text(8)
                if odd_keys and r.random() < 0.3:  # msgpack: other keys than strings (refused)
                    key = r.choice([self.text(3).encode(), r.randint(-5, 5), None, 1.5, True])
                if key not in KNOWN:
                    p[key] = self.json_value()
        if r.random() < 0.03:
            p[DEEP] = r.choice(depths)
        fields: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
            ("lon", lambda: self.number(-180, 180), lambda: self.outside(-180, 180)),
            ("lat", lambda: self.number(-90, 90), lambda: self.outside(-90, 90)),
            ("ts", lambda: self.number(TS_MIN, TS_MAX), lambda: self.outside(TS_MIN, TS_MAX))]
        if ids != "none":
            good_id = ids == "ok" or r.random() < 0.6
            fields.insert(0, ("id", self.object_id if good_id else self.bad_id, self.wrong))
        for key, right, out in fields:
            k = r.randint(0, 11)
            if k == 0:
                continue
            p[key] = self.wrong() if k == 1 else out() if k == 2 else right()
        if r.random() < 0.5:  # fields in another order
            items = list(p.items())
            r.shuffle(items)
            p = dict(items)
        return p

    def corrupt(self, valid: bytes) -> bytes:
        """A valid message cut short or with bytes flipped."""
        r = self.rng
        if r.random() < 0.5 or not valid:
            return valid[: r.randint(0, max(0, len(valid) - 1))]
        out = bytearray(valid)
        for _ in range(r.randint(1, 3)):
            out[r.randrange(len(out))] = r.randrange(256)
        return bytes(out)

    def raw(self, n: int = 120) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, n))

    def mqtt_payload(self) -> bytes:
        """A device's MQTT payload for `positions/<its id>`."""
        r = self.rng
        k = r.randint(0, 9)
        if k <= 4:
            p = self.position("none")
            if k == 4:
                p["id"] = self.bad_id()  # a body's id never overrides the topic's
            return json_bytes(p, ascii_only=r.random() < 0.5)
        if k == 5:
            return self.raw()
        if k == 6:
            return self.corrupt(orjson.dumps({"lon": self.number(-180, 180), "lat": self.number(-90, 90),
                                              "ts": self.number(TS_MIN, TS_MAX), "speed": 3.5}))
        if k == 7:
            return json_bytes(self.json_value(), ascii_only=r.random() < 0.5)
        return r.choice(LITERALS)

    def routing_key(self) -> str:
        """A routing key for amq.topic (one word after `positions.` reaches x-ingress)."""
        r = self.rng
        k = r.randint(0, 9)
        if k <= 5:
            return f"positions.{self.object_id()}"
        if k <= 7:
            return f"positions.{self.bad_id()}"
        if k == 8:
            return r.choice(ODD_ROUTING_KEYS)
        return self.text(30)

    def tenant_routing_key(self, tenant: str) -> str:
        """A routing key for amq.topic in the contract with tenants (`positions.<tenant>.<id>`
        reaches x-ingress as the MQTT topic positions/<tenant>/<id>): mostly of `tenant`, some
        with a word that is no tenant, some of the old contract (`positions.<id>`, still
        bound: dead-lettered with the reason), some odd."""
        r = self.rng
        k = r.randint(0, 19)
        if k <= 10:
            return f"positions.{tenant}.{self.object_id()}"
        if k <= 12:
            return f"positions.{tenant}.{self.bad_id()}"
        if k <= 14:
            return f"positions.{r.choice(BAD_TENANTS)}.{self.object_id()}"
        if k <= 17:
            return f"positions.{self.object_id()}"  # the old contract
        if k == 18:
            return r.choice([*ODD_ROUTING_KEYS, f"positions.{tenant}", f"positions.{tenant}.", f"{tenant}.x"])
        return self.text(30)

    def gateway_key(self, tenant: str) -> str:
        """A routing key for ingress.gateway (topic, bound with `*`: one word): the tenant, a
        word that is no tenant, or more than one word (no binding takes it)."""
        r = self.rng
        k = r.randint(0, 9)
        if k <= 3:
            return tenant
        if k <= 6:
            return r.choice(BAD_TENANTS)
        if k == 7:
            return r.choice([f"{tenant}.x", f"positions.{tenant}", ".", f"{tenant}."])
        return self.text(20) or tenant

    def gateway_batch(self) -> tuple[bytes, str | None]:
        """(body, content type) for exchange ingress.gateway (or the retired ingress.batches)."""
        r = self.rng
        as_msgpack = r.random() < 0.5
        ct: str | None = r.choice(MSGPACK_TYPES) if as_msgpack else r.choice([None, "application/json"])
        if r.random() < 0.1:  # the content type lies, or is odd
            ct = r.choice([None, "application/json", *MSGPACK_TYPES, "application/MSGPACK", "text/plain",
                           "application/msgpack; charset=utf-8", ""])
        k = r.randint(0, 9)
        obj: Any
        if k <= 5:
            items: list[Any] = []
            for _ in range(r.randint(0, 10)):
                c = r.randint(0, 3)
                items.append(self.json_value() if c == 0 else
                             self.position("mixed" if c == 1 else "ok", BATCH_DEPTHS, odd_keys=as_msgpack))
            obj = {"positions": items}
            if k == 5:
                obj.update({self.text(5): self.json_value() for _ in range(r.randint(1, 2))})
        elif k == 6:
            obj = r.choice([self.json_value(), {"positions": self.json_value()},
                            {"Positions": [{"id": "a", "lon": 1, "lat": 1, "ts": TS}]}, {}])
        elif k == 7:
            return self.raw(160), ct
        elif k == 8:
            valid = {"positions": [
                {"id": self.object_id(), "lon": 9.5, "lat": 47.1, "ts": TS},
                {"id": self.object_id(), "lon": -9.5, "lat": -47.1, "ts": TS + 1, "x": [1, "y"]}]}
            return self.corrupt(msgpack_bytes(valid) if as_msgpack else orjson.dumps(valid)), ct
        else:
            return r.choice([TOO_MANY_JSON, TOO_MANY_MSGPACK, OVERSIZE, *MSGPACK_ODDITIES]), ct
        if as_msgpack:
            return msgpack_bytes(obj, bin_type=r.random() < 0.5), ct
        return json_bytes(obj, ascii_only=r.random() < 0.5), ct

    # -- fences -----------------------------------------------------------------------------

    def ring(self, lon: float, lat: float, radius: float) -> list[list[float]]:
        """A convex polygon's closed ring: 3-24 distinct directions out of 64 around (lon, lat)."""
        steps = sorted(self.rng.sample(range(64), self.rng.randint(3, 24)))
        pts = [[lon + radius * math.cos(2 * math.pi * s / 64), lat + radius * math.sin(2 * math.pi * s / 64)]
               for s in steps]
        return [*pts, list(pts[0])]

    def geometry(self) -> dict[str, Any]:
        r = self.rng
        lon, lat, radius = r.uniform(-170, 170), r.uniform(-80, 80), r.choice([r.uniform(1e-4, 0.01),
                                                                               r.uniform(0.01, 2.0)])
        outer = self.ring(lon, lat, radius)
        k = r.randint(0, 2)
        if k == 0:
            return {"type": "Polygon", "coordinates": [outer]}
        if k == 1:  # a hole: the ring shrunk to a quarter around its vertices' mean (inside: convex)
            cx, cy = (sum(v[i] for v in outer[:-1]) / (len(outer) - 1) for i in (0, 1))
            hole = [[cx + (x - cx) / 4, cy + (y - cy) / 4] for x, y in outer][::-1]
            return {"type": "Polygon", "coordinates": [outer, hole]}
        other = self.ring(lon + 2.5 * radius + 0.1, lat, radius)
        return {"type": "MultiPolygon", "coordinates": [[outer], [other]]}

    def fence_id(self) -> str:
        return self.object_id()

    def valid_feature(self) -> dict[str, Any]:
        r = self.rng
        props: dict[str, Any] = {}
        if r.random() < 0.7:  # a name holds no control or bidi character, no space around it
            raw = "".join(c for c in self.text(r.choice([8, 200]))[:200] if allowed(c))
            props["name"] = unicodedata.normalize("NFC", raw.strip())
        if r.random() < 0.7:
            props["timeout_s"] = r.choice([r.randint(1, 604800), r.uniform(0.001, 604800.0), 604800, 300])
        f: dict[str, Any] = {"type": "Feature", "id": self.fence_id(), "geometry": self.geometry(),
                             "properties": props}
        if r.random() < 0.15:
            f["bbox"] = [0, 0, 1, 1]  # a foreign member (RFC 7946 allows them)
        return f

    def feature(self) -> tuple[Any, str | None]:
        """(a GeoJSON Feature or something else, None if valid else what breaks it)."""
        r = self.rng
        f = self.valid_feature()
        k = r.randint(0, 9)
        if k <= 2:
            return f, None
        if k == 3:
            other = self.json_value() if r.random() < 0.7 else self.raw(40)
            return other, "not a Feature at all"
        broken = r.choice(sorted(BREAKERS))
        BREAKERS[broken](f, self)
        return f, broken

    def rpc_request(self) -> bytes:
        """A body for the AMQP fence API (exchange fence.api)."""
        r = self.rng
        k = r.randint(0, 4)
        if k == 0:
            return self.raw(60)
        if k == 1:
            return json_bytes(self.json_value())
        req: dict[str, Any] = {}
        if r.random() < 0.85:
            req["op"] = r.choice(RPC_OPS) if r.random() < 0.7 else self.scalar()
            if r.random() < 0.05:  # unhashable
                req["op"] = r.choice([[], {}, ["create"]])
        if r.random() < 0.85:
            req["token"] = self.token if r.random() < 0.7 else self.scalar()
        for arg in r.sample(RPC_ARGS, r.randint(0, 3)):
            if arg in ("feature", "body"):
                req[arg] = self.valid_feature() if r.random() < 0.5 else self.feature()[0]
            elif arg in ("fence_id", "object_id"):
                req[arg] = self.object_id() if r.random() < 0.5 else self.bad_id()
            elif arg == "bbox" and r.random() < 0.7:  # else not a string (a list, a number, ...)
                req[arg] = r.choice(["9,47,10,48", "", "1,2,3", "a,b,c,d", "10,0,0,10", "nan,0,1,1"])
            else:
                req[arg] = r.choice([self.json_value(), 1e308, -1e308, 2**64 - 1, 5, "5"])
        try:
            return orjson.dumps(req)
        except TypeError:  # bytes from feature(): not JSON
            return json_bytes({"op": "create", "token": self.token})[:-1] + b", oops}"


RPC_OPS = ["create", "get", "list", "replace", "delete", "objects", "object_fences", "events"]
RPC_ARGS = ["feature", "fence_id", "object_id", "body", "bbox", "limit", "after", "since", "if_match"]


def _first_ring(f: dict[str, Any]) -> list[Any]:
    g = f["geometry"]
    return list(g["coordinates"][0] if g["type"] == "Polygon" else g["coordinates"][0][0])


def _set_vertex(f: dict[str, Any], i: int, axis: int, value: Any) -> None:
    g = f["geometry"]
    ring = g["coordinates"][0] if g["type"] == "Polygon" else g["coordinates"][0][0]
    ring[i] = list(ring[i])
    ring[i][axis] = value
    if i == 0:  # keep the ring closed on the changed vertex
        ring[-1] = list(ring[0])


BOWTIE = [[9.50, 47.10], [9.51, 47.11], [9.51, 47.10], [9.50, 47.11], [9.50, 47.10]]
SQUARE = [[0, 0], [1, 0], [1, 1], [0, 1], [0, 0]]
# Each breaks a valid Feature in one way (in place).
BREAKERS: dict[str, Callable[[dict[str, Any], Fuzzer], None]] = {
    "not a Feature": lambda f, z: f.update(type=z.rng.choice(["Polygon", "feature", "FeatureCollection", None,
                                                               1])),
    "no geometry": lambda f, z: f.pop("geometry"),
    "geometry not an object": lambda f, z: f.update(geometry=z.wrong()),
    "geometry type": lambda f, z: f["geometry"].update(type=z.rng.choice(
        ["Point", "LineString", "polygon", "GeometryCollection", "", None, 3])),
    "no coordinates": lambda f, z: f["geometry"].pop("coordinates"),
    "coordinates not arrays": lambda f, z: f["geometry"].update(coordinates=z.wrong()),
    "empty coordinates": lambda f, z: f["geometry"].update(coordinates=z.rng.choice([[], [[]], [[[]]]])),
    "self-intersecting": lambda f, z: f.update(geometry={"type": "Polygon", "coordinates": [BOWTIE]}),
    "two distinct points": lambda f, z: f.update(geometry={"type": "Polygon", "coordinates": [
        [[1.0, 1.0], [2.0, 2.0], [1.0, 1.0], [1.0, 1.0]]]}),
    "collinear": lambda f, z: f.update(geometry={"type": "Polygon", "coordinates": [
        [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [1.0, 1.0]]]}),
    "NaN / inf vertex": lambda f, z: _set_vertex(f, z.rng.randint(0, 1), z.rng.randint(0, 1),
                                                 z.rng.choice([math.nan, math.inf, -math.inf])),
    "out of range": lambda f, z: _set_vertex(f, 1, *z.rng.choice(
        [(0, 180.001), (0, -181), (1, 91), (1, -90.5), (0, 1e308), (1, -1e300)])),
    "vertex of one number": lambda f, z: f.update(geometry={"type": "Polygon", "coordinates": [
        [[9.5, 47.1], [9.51], [9.51, 47.11], [9.5, 47.1]]]}),
    "vertex not a number": lambda f, z: _set_vertex(f, 1, 0, z.rng.choice([None, [1.0], {"x": 1}])),
    "over 10,000 vertices": lambda f, z: f.update(geometry={"type": "Polygon", "coordinates": [
        [[9.5 + 0.01 * math.cos(2 * math.pi * i / 10_001), 47.1 + 0.01 * math.sin(2 * math.pi * i / 10_001)]
         for i in range(10_001)] + [[9.51, 47.1]]]}),
    "over 10 degrees": lambda f, z: f.update(geometry={"type": "Polygon", "coordinates": [
        [[0, 0], [10.5, 0], [10.5, 1], [0, 1], [0, 0]]]}),
    "hole outside": lambda f, z: f.update(geometry={"type": "Polygon", "coordinates": [
        SQUARE, [[5, 5], [6, 5], [6, 6], [5, 5]]]}),
    "overlapping parts": lambda f, z: f.update(geometry={"type": "MultiPolygon", "coordinates": [
        [SQUARE], [[[0.5, 0.5], [1.5, 0.5], [1.5, 1.5], [0.5, 0.5]]]]}),
    "bad id": lambda f, z: f.update(id=z.rng.choice([i for i in BAD_IDS if i and not ID_RE.fullmatch(i)])),
    "id not a string": lambda f, z: f.update(id=z.rng.choice([["a"], {"a": 1}])),
    "properties not an object": lambda f, z: f.update(properties=z.rng.choice(["x", 5, [1], True])),
    "name not a string": lambda f, z: f["properties"].update(name=z.rng.choice([5, None, ["n"], {}])),
    "name too long": lambda f, z: f["properties"].update(name="n" * z.rng.randint(201, 400)),
    "bad timeout": lambda f, z: f["properties"].update(timeout_s=z.rng.choice(
        [0, -1, 604801, 1e9, math.nan, math.inf, -math.inf, "300", True, False, None, [300], 2**64])),
    "NUL in the name": lambda f, z: f["properties"].update(name=z.rng.choice(["\x00", "a\x00b", "n\x00n"])),
    "control in the name": lambda f, z: f["properties"].update(
        name=z.rng.choice(["a\nb", "\x1b[2J", "t\tab"])),
    "a bidi override in the name": lambda f, z: f["properties"].update(name="invoice\u202efdp.exe"),
    "spaces around the name": lambda f, z: f["properties"].update(name=z.rng.choice([" a", "a ", "\u00a0a"])),
    # integers beyond float range (JSON has no limit), and wrong types that a lenient reader coerces
    "huge integer coordinate": lambda f, z: _set_vertex(f, 1, 0, 10**400),
    "huge integer timeout": lambda f, z: f["properties"].update(timeout_s=-(10**400)),
    "string coordinates": lambda f, z: f.update(geometry={"type": "Polygon", "coordinates": [
        [[str(x), str(y)] for x, y in _first_ring(f)]]}),
    "boolean coordinate": lambda f, z: _set_vertex(f, 1, z.rng.randint(0, 1), z.rng.random() < 0.5),
    "falsy properties": lambda f, z: f.update(properties=z.rng.choice([[], 0, False, ""])),
    "numeric id": lambda f, z: f.update(id=z.rng.choice([5, 1.5, True, 0, ""])),
}
