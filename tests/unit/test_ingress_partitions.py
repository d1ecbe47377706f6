"""exchanges/ingress_partitions.py: RabbitMQ's consistent-hash routing replayed in Python, and
the partitions' ownership."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from exchanges import ingress_partitions as ip

VECTORS = Path(__file__).parent / "data" / "rabbitmq_consistent_hash_vectors.tsv"
BUCKETS = (2, 3, 5, 16, 64, 1000)


def _vectors() -> list[tuple[str, int, list[int]]]:
    rows = []
    for line in VECTORS.read_text().splitlines():
        if line.startswith("#"):
            continue
        key, h, buckets = line.split("\t")
        rows.append((key, int(h), [int(b) for b in buckets.split()]))
    return rows


def test_the_vectors_cover_every_tail_length_of_the_hash() -> None:
    lengths = {len(k) % 12 for k, _, _ in _vectors()}
    assert lengths == set(range(12)) and len(_vectors()) == 300


@pytest.mark.parametrize("key, expected, buckets", _vectors())
def test_phash2_and_the_bucket_are_erlangs(key: str, expected: int, buckets: list[int]) -> None:
    assert ip.phash2(key.encode()) == expected
    assert [ip.jump_bucket(expected, n) for n in BUCKETS] == buckets
    assert [ip.partition_of_key(key, n) for n in BUCKETS] == buckets


def test_the_vectorised_hash_is_the_scalar_one() -> None:
    rows = _vectors()
    keys = [k.encode() for k, _, _ in rows]
    assert ip.phash2_many(keys).tolist() == [h for _, h, _ in rows]
    rng = random.Random(11)
    more = [bytes(rng.randrange(256) for _ in range(rng.randrange(90))) for _ in range(3000)]
    hashes = ip.phash2_many(more)
    assert hashes.tolist() == [ip.phash2(k) for k in more]
    for n in (*BUCKETS, 100_000):  # 100,000 buckets: some keys need more draws than the vector pass
        assert ip.jump_buckets(hashes, n).tolist() == [ip.jump_bucket(int(h), n) for h in hashes]
    assert [ip.jump_buckets(np.array([h for _, h, _ in rows]), n).tolist() for n in BUCKETS] == [
        [b[i] for _, _, b in rows] for i in range(len(BUCKETS))]
    assert ip.phash2_many([]).size == 0 and ip.jump_buckets(np.zeros(0, np.int64), 16).size == 0


def test_one_bucket_and_bad_counts() -> None:
    assert ip.jump_bucket(12345, 1) == 0
    with pytest.raises(ValueError):
        ip.jump_bucket(1, 0)


def test_the_routing_key_of_a_qualified_id_is_its_mqtt_key() -> None:
    assert ip.routing_key("acme:truck-7") == "positions.acme.truck-7"
    assert ip.routing_key("legacy") == "positions.legacy"


def test_partition_of_remembers_and_agrees_with_the_hash() -> None:
    of = ip.PartitionOf()
    ids = [f"t{i % 3}:obj-{i}" for i in range(500)]
    got = of(ids + ids[:10])
    assert got.tolist() == [ip.partition_of_key(ip.routing_key(i)) for i in ids + ids[:10]]
    assert set(got.tolist()) == set(range(ip.PARTITIONS))  # 500 objects reach every partition
    assert max(Counter(got.tolist()).values()) < 3 * 500 / ip.PARTITIONS


def test_queue_names_sort_in_bucket_order() -> None:
    names = ip.queue_names()
    assert list(names) == sorted(names) and names[0] == "x-ingress.p00" and len(names) == ip.PARTITIONS


# -- ownership ------------------------------------------------------------------------------


def _sizes(a: dict[int, str]) -> list[int]:
    return sorted(Counter(a.values()).values())


def test_assign_is_balanced_and_complete() -> None:
    for n in range(1, ip.PARTITIONS + 1):
        names = [f"x-ingress-{i}" for i in range(n)]
        a = ip.assign(names)
        assert sorted(a) == list(range(ip.PARTITIONS))
        sizes = _sizes(a)
        assert set(a.values()) == set(names)
        assert sizes[-1] - sizes[0] <= 1


def test_assign_moves_only_what_balance_needs() -> None:
    rng = random.Random(7)
    names = ["a"]
    a = ip.assign(names)
    for step in range(200):
        if len(names) > 1 and (rng.random() < 0.4 or len(names) == ip.PARTITIONS):
            names.remove(rng.choice(names))
        else:
            names.append(f"n{step}")
        b = ip.assign(names, a)
        sizes = _sizes(b)
        assert sizes[-1] - sizes[0] <= 1 and sorted(b) == list(range(ip.PARTITIONS))
        # a partition moves only off an instance that is gone or over its quota
        moved = ip.moved(a, b)
        quota_max = -(-ip.PARTITIONS // len(set(names)))
        for p in moved:
            old = a[p]
            floor = ip.PARTITIONS // len(set(names))
            assert old not in names or Counter(a.values())[old] > floor, (step, p)
        kept = [p for p in range(ip.PARTITIONS) if a[p] in names]
        assert len(moved) <= ip.PARTITIONS - len(kept) + sum(
            max(0, Counter(a.values())[n] - (ip.PARTITIONS // len(set(names)))) for n in set(names))
        assert max(Counter(b.values()).values()) <= quota_max
        a = b


def test_assign_is_deterministic_and_adds_take_from_the_most_loaded() -> None:
    one = ip.assign(["x-ingress"])
    two = ip.assign(["x-ingress", "x-ingress-2"], one)
    assert two == ip.assign(["x-ingress-2", "x-ingress"], one)
    assert len(ip.moved(one, two)) == ip.PARTITIONS // 2
    three = ip.assign(["x-ingress", "x-ingress-2", "x-ingress-3"], two)
    assert len(ip.moved(two, three)) == 5  # 16 = 6 + 5 + 5: the new one takes 5, nothing else moves
    assert all(three[p] == "x-ingress-3" for p in ip.moved(two, three))
    back = ip.assign(["x-ingress", "x-ingress-2"], three)
    assert all(three[p] == "x-ingress-3" for p in ip.moved(three, back))
    assert ip.owned_by(back, "x-ingress") + ip.owned_by(back, "x-ingress-2") == sorted(
        ip.owned_by(back, "x-ingress")) + sorted(ip.owned_by(back, "x-ingress-2"))


def test_assign_needs_an_instance() -> None:
    with pytest.raises(ValueError):
        ip.assign([])
