"""Positions split by object over x-ingress's partition queues, as RabbitMQ splits them.

A device's MQTT position reaches gf-ingress's amq.topic with the routing key
`positions.<tenant>.<object_id>`; `x-ingress.partition` (RabbitMQ's own consistent-hash
exchange, type x-consistent-hash) sends it to one of PARTITIONS quorum queues,
`x-ingress.p00` .. `x-ingress.p15`, each bound with weight 1 in name order. Each partition is
owned by one x-ingress instance at a time (single active consumer), so an object's positions
reach one instance, in order. A gateway's batch holds many objects: the instance that takes it
must send each position to the partition RabbitMQ would have picked for that object's MQTT
key, so this module computes exactly that (`partition_of`): RabbitMQ's hash is
`erlang:phash2(RoutingKey)` (Bob Jenkins' lookup2 over the key's bytes, 27 bits) fed to a
jump consistent hash whose random draws are Erlang's `rand` exs1024s seeded with
{H, H, H}. Tested against `erl` itself (tests/unit/test_ingress_partitions.py keeps the
vectors it printed) and against the live broker's routing (tests/integration).

Trade-off: the partition count is part of the contract (fixed: changing it moves objects
between partitions while their positions are queued), and the hash is paid in Python: once
per object (`PartitionOf` remembers it), vectorised over a batch's new objects (about 1 us
each; the scalar form, 14 us, is the reference), and only by the instance that splits
gateway batches, so a batch of 50,000 ids never seen costs it ~55 ms, not most of a second.

The bucket order is the bindings' order: RabbitMQ numbers a consistent-hash exchange's buckets
in the order its bindings were added, and sorts them (by queue name) when it recovers them at
a restart. The plan (deploy/rabbitmq) therefore binds the partitions in name order, and binds
them all again, in order, when one is missing.

Ownership (`assign`): which instance consumes which partitions, stored in PostgreSQL with a
version. Balanced (sizes differ by at most one) and stable: an instance added takes
partitions from the most loaded ones only, an instance removed hands its own to the least
loaded; no other partition moves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

PARTITIONS = 16
EXCHANGE_TYPE = "x-consistent-hash"
ROUTING_PREFIX = "positions"  # MQTT positions/<tenant>/<object_id> -> positions.<tenant>.<object_id>
MAX_REMEMBERED = 1 << 20  # objects whose partition PartitionOf keeps (then it starts again)

U32 = npt.NDArray[Any]  # uint32 columns (numpy's stubs type their shifts as signed)
_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B9  # erts' HCONST
_BINARY_CON = (13 * _GOLDEN) & _M32  # erts' HCONST_13: a binary's initial value in make_hash2


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    a = (a - b - c) & _M32
    a ^= c >> 13
    b = (b - c - a) & _M32
    b ^= (a << 8) & _M32
    c = (c - a - b) & _M32
    c ^= b >> 13
    a = (a - b - c) & _M32
    a ^= c >> 12
    b = (b - c - a) & _M32
    b ^= (a << 16) & _M32
    c = (c - a - b) & _M32
    c ^= b >> 5
    a = (a - b - c) & _M32
    a ^= c >> 3
    b = (b - c - a) & _M32
    b ^= (a << 10) & _M32
    c = (c - a - b) & _M32
    c ^= b >> 15
    return a, b, c


def phash2(data: bytes) -> int:
    """`erlang:phash2(Binary)`: erts' block_hash (lookup2) of the bytes, its low 27 bits."""
    if not data:
        return _BINARY_CON & ((1 << 27) - 1)
    a = b = _GOLDEN
    c = _BINARY_CON
    n, i = len(data), 0
    while n - i >= 12:
        a = (a + int.from_bytes(data[i:i + 4], "little")) & _M32
        b = (b + int.from_bytes(data[i + 4:i + 8], "little")) & _M32
        c = (c + int.from_bytes(data[i + 8:i + 12], "little")) & _M32
        a, b, c = _mix(a, b, c)
        i += 12
    c = (c + n) & _M32
    rest = data[i:]
    a = (a + int.from_bytes(rest[0:4], "little")) & _M32
    b = (b + int.from_bytes(rest[4:8], "little")) & _M32
    c = (c + (int.from_bytes(rest[8:11], "little") << 8)) & _M32  # c's first byte is the length's
    return _mix(a, b, c)[2] & ((1 << 27) - 1)


class _Exs1024:
    """Erlang's rand exs1024s (xorshift1024*) seeded with {k, k, k}: its uniform floats."""

    def __init__(self, k: int) -> None:
        m21 = (1 << 21) - 1
        b1 = (((k & m21) + 1) * 2097131) & m21
        b2 = (((k & m21) + 1) * 2097133) & m21
        b3 = (((k & m21) + 1) * 2097143) & m21
        r = (b1 << 43) | (b2 << 22) | (b3 << 1) | 1
        words: list[int] = []
        for _ in range(16):  # exs64 (xorshift64*), each word put in front
            r ^= r >> 12
            r ^= (r << 25) & _M64
            r ^= r >> 27
            words.insert(0, (r * 2685821657736338717) & _M64)
        self.ring = words  # Erlang's {L, RL}: L from `at`, RL the used words, newest first
        self.at = 0
        self.used: list[int] = []

    def uniform(self) -> float:
        if len(self.ring) - self.at == 1:
            self.ring = [self.ring[self.at], *reversed(self.used)]
            self.at, self.used = 0, []
        s0, s1 = self.ring[self.at], self.ring[self.at + 1]
        s1 ^= (s1 << 31) & _M64
        s1 ^= s1 >> 11
        ns1 = (s0 ^ (s0 >> 30)) ^ s1
        self.at += 1
        self.ring[self.at] = ns1
        self.used.insert(0, s0)
        return (((ns1 * 1181783497276652981) & _M64) >> 11) * 2.0 ** -53


def jump_bucket(key: int, buckets: int) -> int:
    """rabbit_exchange_type_consistent_hash:jump_consistent_hash/2 for an integer key."""
    if buckets < 1:
        raise ValueError(f"buckets must be >= 1, got {buckets}")
    if buckets == 1:
        return 0
    draws = _Exs1024(key)
    b, j = -1, 0
    while j < buckets:
        b = j
        j = int((b + 1) / draws.uniform())
    return b


# -- the same, for many keys at once (numpy: a gateway batch's new objects in one pass) ---------


def _mix_v(a: U32, b: U32, c: U32) -> tuple[U32, U32, U32]:
    a = (a - b - c) ^ (c >> 13)
    b = (b - c - a) ^ (a << 8)
    c = (c - a - b) ^ (b >> 13)
    a = (a - b - c) ^ (c >> 12)
    b = (b - c - a) ^ (a << 16)
    c = (c - a - b) ^ (b >> 5)
    a = (a - b - c) ^ (c >> 3)
    b = (b - c - a) ^ (a << 10)
    c = (c - a - b) ^ (b >> 15)
    return a, b, c


def phash2_many(keys: Sequence[bytes]) -> npt.NDArray[np.int64]:
    """`phash2` of each key, vectorised over the keys (the same lookup2, block by block)."""
    n = len(keys)
    lengths = np.fromiter((len(k) for k in keys), np.int64, n)
    blocks = lengths // 12
    width = 12 * (int(blocks.max(initial=0)) + 1)
    data = np.zeros((n, width), np.uint8)
    flat = np.frombuffer(b"".join(keys), np.uint8)
    rows = np.repeat(np.arange(n), lengths)
    cols = np.arange(flat.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    data[rows, cols] = flat
    words = data.view("<u4").astype(np.uint32)  # 3 words per 12 bytes, little-endian as erts reads them
    a = np.full(n, _GOLDEN, np.uint32)
    b = a.copy()
    c = np.full(n, _BINARY_CON, np.uint32)
    with np.errstate(over="ignore"):
        for i in range(int(blocks.max(initial=0))):
            go = blocks > i
            na, nb, nc = _mix_v(a + words[:, 3 * i], b + words[:, 3 * i + 1], c + words[:, 3 * i + 2])
            a, b, c = np.where(go, na, a), np.where(go, nb, b), np.where(go, nc, c)
        at = np.arange(n)
        tail = 3 * blocks  # the tail's words; bytes past a key's end are 0, as the switch adds none
        c = c + lengths.astype(np.uint32) + (words[at, tail + 2] << 8)
        _, _, c = _mix_v(a + words[at, tail], b + words[at, tail + 1], c)
    out = (c & ((1 << 27) - 1)).astype(np.int64)
    out[lengths == 0] = _BINARY_CON & ((1 << 27) - 1)
    return out


def jump_buckets(keys: npt.NDArray[np.int64], buckets: int) -> npt.NDArray[np.int64]:
    """`jump_bucket` of each integer key, vectorised; the rare key that needs more draws than
    the first 15 (the generator's ring wraps then) is done one by one."""
    n = keys.size
    if buckets == 1 or n == 0:
        return np.zeros(n, np.int64)
    k = keys.astype(np.uint64)
    m21 = np.uint64((1 << 21) - 1)
    with np.errstate(over="ignore"):
        b1 = ((k & m21) + np.uint64(1)) * np.uint64(2097131) & m21
        b2 = ((k & m21) + np.uint64(1)) * np.uint64(2097133) & m21
        b3 = ((k & m21) + np.uint64(1)) * np.uint64(2097143) & m21
        r = (b1 << np.uint64(43)) | (b2 << np.uint64(22)) | (b3 << np.uint64(1)) | np.uint64(1)
        ring: list[npt.NDArray[np.uint64]] = []
        for _ in range(16):
            r = r ^ (r >> np.uint64(12))
            r = r ^ (r << np.uint64(25))
            r = r ^ (r >> np.uint64(27))
            ring.insert(0, r * np.uint64(2685821657736338717))
        b = np.full(n, -1, np.int64)
        j = np.zeros(n, np.int64)
        s0 = ring[0]  # then each draw's new word, against the ring's next one (Erlang's {L, RL})
        for draw in range(15):
            go = j < buckets
            if not go.any():
                break
            b = np.where(go, j, b)
            x = ring[draw + 1] ^ (ring[draw + 1] << np.uint64(31))
            x = x ^ (x >> np.uint64(11))
            s0 = (s0 ^ (s0 >> np.uint64(30))) ^ x
            u = ((s0 * np.uint64(1181783497276652981)) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
            with np.errstate(divide="ignore"):
                nj = np.where(u > 0, np.floor((b + 1) / np.where(u > 0, u, 1.0)), np.inf)
            j = np.where(go, np.minimum(nj, 2.0 ** 62).astype(np.int64), j)
    for i in np.flatnonzero(j < buckets).tolist():  # not done in 15 draws
        b[i] = jump_bucket(int(keys[i]), buckets)
    return b


def routing_key(object_id: str) -> str:
    """The MQTT routing key of a qualified object id `<tenant>:<object_id>`."""
    tenant, sep, name = object_id.partition(":")
    return f"{ROUTING_PREFIX}.{tenant}.{name}" if sep else f"{ROUTING_PREFIX}.{object_id}"


def partition_of_key(key: str | bytes, partitions: int = PARTITIONS) -> int:
    """The partition RabbitMQ's consistent-hash exchange picks for a routing key."""
    data = key.encode() if isinstance(key, str) else key
    return jump_bucket(phash2(data), partitions)


def queue_name(partition: int) -> str:
    return f"x-ingress.p{partition:02d}"


def partition_of_queue(name: str) -> int | None:
    """The partition of a partition queue's name (a hand-on's routing key), else None."""
    head, _, number = name.rpartition(".p")
    if head != "x-ingress" or not number.isdigit() or int(number) >= PARTITIONS:
        return None
    return int(number)


def queue_names(partitions: int = PARTITIONS) -> tuple[str, ...]:
    """In bucket order, which is their binding order (and name order: see the docstring)."""
    return tuple(queue_name(p) for p in range(partitions))


class PartitionOf:
    """Each object's partition, remembered (the hash is paid once per object)."""

    def __init__(self, partitions: int = PARTITIONS) -> None:
        self.partitions = partitions
        self._known: dict[str, int] = {}

    def __call__(self, ids: Sequence[str]) -> npt.NDArray[np.int64]:
        """The new objects of a call hashed together (a batch of new ids costs microseconds
        each, not the scalar hash's 14 us)."""
        known = self._known
        if len(known) > MAX_REMEMBERED:
            known.clear()
        new = [oid for oid in dict.fromkeys(ids) if oid not in known]
        if new:
            found = jump_buckets(phash2_many([routing_key(oid).encode() for oid in new]), self.partitions)
            known.update(zip(new, found.tolist(), strict=True))
        return np.fromiter((known[oid] for oid in ids), np.int64, len(ids))


# -- ownership ------------------------------------------------------------------------------

FIRST_INSTANCE = "x-ingress"  # the first x-ingress instance; an added one: x-ingress-N


def first_only(partitions: int = PARTITIONS) -> dict[int, str]:
    """The map before any is stored: the first instance consumes every partition."""
    return dict.fromkeys(range(partitions), FIRST_INSTANCE)


def assign(instances: Iterable[str], previous: Mapping[int, str] | None = None,
           partitions: int = PARTITIONS) -> dict[int, str]:
    """Partition -> instance: balanced (sizes differ by at most one), moving as few partitions
    from `previous` as that allows. Deterministic: every process computes the same map."""
    names = sorted(set(instances))
    if not names:
        raise ValueError("at least one x-ingress instance is needed")
    owned: dict[str, list[int]] = {n: [] for n in names}
    loose: list[int] = []
    for p in range(partitions):
        owner = (previous or {}).get(p)
        owned.get(owner or "", loose).append(p)
    base, extra = divmod(partitions, len(names))
    # the instances that keep one more: those already holding the most (fewest moves), by name
    by_load = sorted(names, key=lambda n: (-len(owned[n]), n))
    quota = {n: base + (1 if i < extra else 0) for i, n in enumerate(by_load)}
    for n in names:
        while len(owned[n]) > quota[n]:
            loose.append(owned[n].pop())  # its highest partitions go first
    loose.sort()
    for n in sorted(names, key=lambda n: (len(owned[n]) - quota[n], n)):
        while len(owned[n]) < quota[n]:
            owned[n].append(loose.pop(0))
    return {p: n for n, ps in owned.items() for p in ps}


def owned_by(assignment: Mapping[int, str], instance: str) -> list[int]:
    return sorted(p for p, n in assignment.items() if n == instance)


def moved(before: Mapping[int, str], after: Mapping[int, str]) -> list[int]:
    """The partitions whose owner changes."""
    return sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
