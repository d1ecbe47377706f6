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
between partitions while their positions are queued), and the hash is pure Python (about
15 us a key), paid once per object (`PartitionOf` remembers it) and only by the instance that
splits gateway batches.

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

import numpy as np
import numpy.typing as npt

PARTITIONS = 16
EXCHANGE_TYPE = "x-consistent-hash"
ROUTING_PREFIX = "positions"  # MQTT positions/<tenant>/<object_id> -> positions.<tenant>.<object_id>
MAX_REMEMBERED = 1 << 20  # objects whose partition PartitionOf keeps (then it starts again)

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
        known = self._known
        if len(known) > MAX_REMEMBERED:
            known.clear()
        out = np.empty(len(ids), dtype=np.int64)
        for i, oid in enumerate(ids):
            p = known.get(oid)
            if p is None:
                p = known[oid] = partition_of_key(routing_key(oid), self.partitions)
            out[i] = p
        return out


# -- ownership ------------------------------------------------------------------------------


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
