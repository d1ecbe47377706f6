"""Consistent-hash ring spreading fences and objects over x-fence workers (ActiveMQ's HashRing).

Trade-off: ownership is decided by hashing alone, so every process that knows the membership (node names
and weights) computes the same owner with no registry and no coordination, and a join or leave moves only
~1/N of the keys (those on the arcs the node gains or loses). The price is that balance is statistical,
not exact: a node with `weight * vnodes` points owns an arc share whose relative spread is about
1/sqrt(weight * vnodes) (~3% at the default 1000 points; 160, the classic figure, gives ~8%
and up to +-13% per node with 3-5 nodes), and the ring knows nothing about load, so a hot
key is handled by giving it N masters rather than by moving it.

Hot keys (seed 001: "a hot fence can have N masters"): the ring also holds `hot`, key -> N.
Such a key's masters are the first N distinct nodes clockwise from it (`masters`), and each
of its members (an object of a hot fence) belongs to one of them: the first of the key's
masters met walking clockwise from the member's own position (`owner`). That is consistent
hashing again, over the masters: a master added or removed moves only the members on its
arcs, and every process computes the same owner with no coordination. The hot keys are part
of the ring (its equality, its stored form): changing N is a ring change, handed over as one.

Conventions (part of the wire contract: changing them moves keys):
- a position is the first 8 bytes, big-endian, of `blake2b(utf8(s), digest_size=8)`, on [0, 2**64);
- node `n` gets points `f"{n}#{i}"` for i in range(weight * vnodes_per_weight);
- a key belongs to the first point at or after its position, wrapping past 2**64 to the smallest point;
  equal points are ordered by node name;
- a member of a hot key belongs to the first of the key's masters in the member's own walk.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice

import numpy as np
import numpy.typing as npt

HASH_NAME = "blake2b-64"
RING_SIZE = 1 << 64
DEFAULT_VNODES_PER_WEIGHT = 1000
MAX_MASTERS = 16


def position(key: str) -> int:
    """The ring position of `key`: stable across processes, platforms and Python versions."""
    return int.from_bytes(_digest(key), "big")


def _digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_weight(node: str, weight: object) -> int:
    if not _positive_int(weight):
        raise ValueError(f"weight of node {node!r} must be a positive int, got {weight!r}")
    assert isinstance(weight, int)
    return weight


class HashRing:
    """An immutable weighted consistent-hash ring; `with_node` / `without_node` return new rings."""

    __slots__ = ("_hot", "_names", "_owner_idx", "_owners", "_points", "_points_np", "_vnodes", "_weights")

    def __init__(
        self, nodes: Mapping[str, int] | Iterable[str], vnodes_per_weight: int = DEFAULT_VNODES_PER_WEIGHT,
        hot: Mapping[str, int] | None = None,
    ) -> None:
        if isinstance(nodes, str):
            raise TypeError("nodes must be a mapping name -> weight or an iterable of names, not a str")
        if not _positive_int(vnodes_per_weight):
            raise ValueError(f"vnodes_per_weight must be a positive int, got {vnodes_per_weight!r}")
        weights: dict[str, int] = {}
        pairs = nodes.items() if isinstance(nodes, Mapping) else ((name, 1) for name in nodes)
        for name, weight in pairs:
            if not isinstance(name, str) or not name:
                raise ValueError(f"node names must be non-empty strings, got {name!r}")
            if name in weights:
                raise ValueError(f"duplicate node {name!r}")
            weights[name] = _check_weight(name, weight)
        self._weights = weights
        self._vnodes = vnodes_per_weight
        self._hot: dict[str, int] = {}
        for key, n in sorted((hot or {}).items()):
            if not isinstance(key, str) or not key:
                raise ValueError(f"hot keys must be non-empty strings, got {key!r}")
            if not _positive_int(n) or n > MAX_MASTERS:
                raise ValueError(f"hot key {key!r}: masters must be an int in 1..{MAX_MASTERS}, got {n!r}")
            if n > 1:  # one master is the default: not kept
                self._hot[key] = n
        self._names = tuple(sorted(weights))
        ring = sorted(
            (position(f"{name}#{i}"), rank)
            for rank, name in enumerate(self._names)
            for i in range(weights[name] * vnodes_per_weight)
        )
        self._points = [p for p, _ in ring]
        self._owners = [self._names[rank] for _, rank in ring]
        self._points_np: npt.NDArray[np.uint64] = np.array(self._points, dtype=np.uint64)
        self._owner_idx: npt.NDArray[np.intp] = np.array([rank for _, rank in ring], dtype=np.intp)

    # -- membership -------------------------------------------------------------------------------------

    @property
    def nodes(self) -> tuple[str, ...]:
        """Node names in insertion order."""
        return tuple(self._weights)

    @property
    def weights(self) -> dict[str, int]:
        return dict(self._weights)

    @property
    def vnodes_per_weight(self) -> int:
        return self._vnodes

    @property
    def hot(self) -> dict[str, int]:
        """The keys with more than one master, and how many each has."""
        return dict(self._hot)

    def __len__(self) -> int:
        return len(self._weights)

    def __contains__(self, node: object) -> bool:
        return node in self._weights

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HashRing):
            return NotImplemented
        return self._vnodes == other._vnodes and self._weights == other._weights and self._hot == other._hot

    def __hash__(self) -> int:
        return hash((self._vnodes, frozenset(self._weights.items()), frozenset(self._hot.items())))

    def __repr__(self) -> str:
        hot = f", hot={self._hot!r}" if self._hot else ""
        return f"HashRing({self._weights!r}, vnodes_per_weight={self._vnodes}{hot})"

    def with_node(self, name: str, weight: int = 1) -> HashRing:
        if name in self._weights:
            raise ValueError(f"duplicate node {name!r}: already on the ring")
        return HashRing({**self._weights, name: _check_weight(name, weight)}, self._vnodes, self._hot)

    def without_node(self, name: str) -> HashRing:
        if name not in self._weights:
            raise KeyError(f"node {name!r} is not on the ring (nodes: {sorted(self._weights)})")
        return HashRing({n: w for n, w in self._weights.items() if n != name}, self._vnodes, self._hot)

    def with_weights(self, weights: Mapping[str, int]) -> HashRing:
        """The same hot keys over other nodes (a node added, removed or re-weighted)."""
        return HashRing(weights, self._vnodes, self._hot)

    def with_hot(self, key: str, masters: int) -> HashRing:
        """`key` with `masters` masters (1: an ordinary key again)."""
        return HashRing(self._weights, self._vnodes, {**self._hot, key: masters})

    # -- lookups ----------------------------------------------------------------------------------------

    def _start(self, key: str) -> int:
        if not self._points:
            raise ValueError(f"hash ring is empty: no node can own key {key!r}")
        i = bisect_left(self._points, position(key))
        return 0 if i == len(self._points) else i

    def node_for(self, key: str) -> str:
        """The master of `key`: the owner of the first point clockwise from the key's position."""
        return self._owners[self._start(key)]

    def iter_nodes(self, key: str) -> Iterator[str]:
        """Every node once, in the order met walking clockwise from `key` (master, then backups)."""
        return self._walk(self._start(key))

    def _walk(self, start: int) -> Iterator[str]:
        seen: set[str] = set()
        total, count = len(self._owners), len(self._weights)
        for step in range(total):
            owner = self._owners[(start + step) % total]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == count:
                    return

    def nodes_for(self, key: str, n: int) -> list[str]:
        """The first `n` distinct nodes clockwise from `key` (all nodes if `n` exceeds their number)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return list(islice(self.iter_nodes(key), n))

    def masters(self, key: str) -> list[str]:
        """The masters of `key`: its node, or for a hot key its first N nodes clockwise."""
        return self.nodes_for(key, self._hot.get(key, 1))

    def owner(self, key: str, member: str) -> str:
        """Which master of `key` holds `member` (an object of a hot fence): the first of the
        key's masters in the member's own walk. For an ordinary key, its node."""
        masters = self.masters(key)
        if len(masters) == 1:
            return masters[0]
        return next(n for n in self.iter_nodes(member) if n in masters)

    def owners(self, key: str, members: Sequence[str]) -> list[str]:
        """`[self.owner(key, m) for m in members]`, the masters computed once."""
        masters = self.masters(key)
        if len(masters) == 1:
            return masters * len(members)
        return [next(n for n in self.iter_nodes(m) if n in masters) for m in members]

    def nodes_for_many(self, keys: Sequence[str]) -> list[str]:
        """`[self.node_for(k) for k in keys]`, hashing per key but searching the ring in one numpy call."""
        if not self._points:
            raise ValueError(f"hash ring is empty: no node can own {len(keys)} keys")
        if not keys:
            return []
        digests = b"".join(_digest(k) for k in keys)
        positions = np.frombuffer(digests, dtype=">u8").astype(np.uint64)
        idx = np.searchsorted(self._points_np, positions, side="left")
        idx[idx == len(self._points)] = 0
        names = self._names
        return [names[i] for i in self._owner_idx[idx].tolist()]

    # -- inspection -------------------------------------------------------------------------------------

    def shares(self) -> dict[str, float]:
        """Each node's exact fraction of the ring: the arcs (previous point, point] it owns."""
        arcs = dict.fromkeys(self._weights, 0)
        prev = self._points[-1] - RING_SIZE if self._points else 0
        for point, owner in zip(self._points, self._owners, strict=True):
            arcs[owner] += point - prev
            prev = point
        return {name: arc / RING_SIZE for name, arc in arcs.items()}

    def to_dict(self) -> dict[str, object]:
        shares = self.shares()
        out: dict[str, object] = {
            "hash": HASH_NAME,
            "vnodes_per_weight": self._vnodes,
            "points": len(self._points),
            "nodes": {
                name: {"weight": weight, "vnodes": weight * self._vnodes, "share": shares[name]}
                for name, weight in self._weights.items()
            },
        }
        if self._hot:
            out["hot"] = dict(self._hot)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> HashRing:
        """Rebuild a ring from `to_dict()` output; derived fields (points, vnodes, share) are ignored."""
        if data.get("hash", HASH_NAME) != HASH_NAME:
            raise ValueError(f"unsupported ring hash {data.get('hash')!r}; this ring uses {HASH_NAME!r}")
        vnodes, nodes = data.get("vnodes_per_weight"), data.get("nodes")
        if not isinstance(vnodes, int) or not isinstance(nodes, Mapping):
            raise ValueError("ring dict needs an int 'vnodes_per_weight' and a 'nodes' mapping")
        weights: dict[str, int] = {}
        for name, entry in nodes.items():
            if not isinstance(entry, Mapping) or "weight" not in entry:
                raise ValueError(f"ring dict: node {name!r} needs a 'weight'")
            weights[name] = entry["weight"]
        hot = data.get("hot", {})
        if not isinstance(hot, Mapping):
            raise ValueError("ring dict: 'hot' must map keys to their number of masters")
        return cls(weights, vnodes, hot)
