"""The consistent-hash ring spreading fences over x-fence workers (exchanges/hash_ring.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exchanges.hash_ring import DEFAULT_VNODES_PER_WEIGHT, HashRing, position

ROOT = Path(__file__).resolve().parents[2]
KEYS = [f"fence:{i}" for i in range(100_000)]
# Balance is statistical: a node's arc share has a relative spread of ~sqrt((N-1)/N) / sqrt(weight * vnodes),
# ~7-8% at 160 points, so +-10% per node only holds reliably with ~1000 points per unit of weight
# (the default)
# (spread <= 2.9%, so 10% is >= 3.5 sigma). The default is checked separately against its own 4-sigma bound.
BALANCED_VNODES = 1000


def names(n: int) -> list[str]:
    return [f"x-fence-{i}" for i in range(n)]


def key_shares(ring: HashRing, keys: list[str] = KEYS) -> dict[str, float]:
    counts = Counter(ring.nodes_for_many(keys))
    return {node: counts[node] / len(keys) for node in ring.nodes}


# -- determinism --------------------------------------------------------------------------------------------


def test_positions_are_pinned() -> None:
    """Changing the hash convention silently moves every key: these values must never change."""
    assert position("") == 16476032584258269876
    assert position("fence:42") == 10104111898317935498
    assert position("x-fence-0#0") == 468825340159750566
    assert position("é") == 14635220546840893743
    ring = HashRing(names(3), vnodes_per_weight=160)
    owners = [ring.node_for(f"fence:{i}") for i in range(8)]
    assert owners == [f"x-fence-{i}" for i in (2, 0, 2, 0, 1, 2, 1, 2)]


def test_same_ring_twice_same_owners() -> None:
    keys = KEYS[:5000]
    a, b = HashRing(names(5)), HashRing(list(reversed(names(5))))
    assert a == b
    assert [a.node_for(k) for k in keys] == [b.node_for(k) for k in keys]


def test_same_owners_in_another_process() -> None:
    keys = KEYS[:2000]
    code = (
        "import json, sys\nfrom exchanges.hash_ring import HashRing\n"
        "keys = json.load(sys.stdin)\n"
        "ring = HashRing({'x-fence-0': 1, 'x-fence-1': 2, 'x-fence-2': 3})\n"
        "print(json.dumps([ring.nodes_for(k, 2) for k in keys]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # the built-in hash() would differ here
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(keys),
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=env,
    ).stdout
    ring = HashRing({"x-fence-0": 1, "x-fence-1": 2, "x-fence-2": 3})
    assert json.loads(out) == [ring.nodes_for(k, 2) for k in keys]


# -- distribution -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 5])
def test_equal_nodes_share_keys_evenly(n: int) -> None:
    shares = key_shares(HashRing(names(n), BALANCED_VNODES))
    for node, share in shares.items():
        assert abs(share * n - 1) <= 0.10, (node, share, shares)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_default_vnodes_spread_within_four_sigma(n: int) -> None:
    bound = 4 * math.sqrt((n - 1) / n) / math.sqrt(DEFAULT_VNODES_PER_WEIGHT)
    shares = key_shares(HashRing(names(n)))
    for node, share in shares.items():
        assert abs(share * n - 1) <= bound, (node, share, bound)


def test_weights_give_proportional_shares() -> None:
    weights = {"x-fence-0": 1, "x-fence-1": 2, "x-fence-2": 3}
    shares = key_shares(HashRing(weights, BALANCED_VNODES))
    for node, weight in weights.items():
        assert abs(shares[node] / (weight / 6) - 1) <= 0.10, (node, shares)


@pytest.mark.parametrize(
    "nodes", [{"a": 1}, dict.fromkeys(names(2), 1), dict.fromkeys(names(5), 1), {"x": 1, "y": 2, "z": 3}]
)
def test_arc_shares_sum_to_one_and_match_key_shares(nodes: dict[str, int]) -> None:
    ring = HashRing(nodes)
    arcs, keys = ring.shares(), key_shares(ring)
    assert math.isclose(sum(arcs.values()), 1.0, abs_tol=1e-12)
    for node in nodes:  # binomial sampling sd of 100k keys is <= 0.0016
        assert abs(arcs[node] - keys[node]) <= 0.006, (node, arcs, keys)


# -- movement -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_adding_a_node_moves_only_keys_to_it(n: int) -> None:
    before = HashRing(names(n))
    after = before.with_node("x-fence-new")
    old, new = before.nodes_for_many(KEYS), after.nodes_for_many(KEYS)
    moved = [b for a, b in zip(old, new, strict=True) if a != b]
    assert set(moved) == {"x-fence-new"}
    fraction = len(moved) / len(KEYS)
    assert 0.5 / (n + 1) <= fraction <= 1.5 / (n + 1), fraction
    assert abs(fraction - after.shares()["x-fence-new"]) <= 0.006


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_removing_a_node_moves_only_its_keys(n: int) -> None:
    before = HashRing(names(n))
    gone = "x-fence-1"
    after = before.without_node(gone)
    old, new = before.nodes_for_many(KEYS), after.nodes_for_many(KEYS)
    moved = [a for a, b in zip(old, new, strict=True) if a != b]
    assert set(moved) == {gone}
    assert moved.count(gone) == old.count(gone)
    assert gone not in new


def test_backup_is_promoted_when_master_leaves() -> None:
    ring = HashRing({"x-fence-0": 1, "x-fence-1": 2, "x-fence-2": 1, "x-fence-3": 3})
    shrunk = ring.without_node("x-fence-3")
    promoted = 0
    for key in KEYS[:20_000]:
        master, backup = ring.nodes_for(key, 2)
        if master == "x-fence-3":
            assert shrunk.node_for(key) == backup, key
            promoted += 1
    assert promoted > 5000  # x-fence-3 holds ~3/7 of the keys


# -- N masters / backups ------------------------------------------------------------------------------------


def test_nodes_for_is_distinct_and_starts_at_master() -> None:
    ring = HashRing({"x-fence-0": 1, "x-fence-1": 2, "x-fence-2": 1, "x-fence-3": 3, "x-fence-4": 1})
    for key in KEYS[:2000]:
        everyone = list(ring.iter_nodes(key))
        assert sorted(everyone) == sorted(ring.nodes)
        assert everyone[0] == ring.node_for(key)
        for n in range(len(ring) + 3):
            got = ring.nodes_for(key, n)
            assert got == everyone[:n]
            assert len(got) == min(n, len(ring)) == len(set(got))


def test_masters_of_hot_keys_spread_over_nodes() -> None:
    ring = HashRing(names(5))
    firsts = Counter(tuple(ring.nodes_for(k, 2)) for k in KEYS[:20_000])
    assert len(firsts) == 20  # every ordered pair of distinct nodes occurs as (master, second master)


@settings(max_examples=200, deadline=None)
@given(
    nodes=st.dictionaries(st.text(min_size=1, max_size=12), st.integers(1, 4), min_size=1, max_size=6),
    keys=st.lists(st.text(max_size=30), max_size=60),
)
def test_nodes_for_many_equals_node_for(nodes: dict[str, int], keys: list[str]) -> None:
    ring = HashRing(nodes, vnodes_per_weight=8)
    assert ring.nodes_for_many(keys) == [ring.node_for(k) for k in keys]


def test_a_key_on_a_point_belongs_to_that_point() -> None:
    ring = HashRing({"x-fence-0": 1, "x-fence-1": 2}, vnodes_per_weight=20)
    on_points = [f"{node}#{i}" for node in ring.nodes for i in range(20 * ring.weights[node])]
    owners = [key.split("#")[0] for key in on_points]
    assert [ring.node_for(k) for k in on_points] == owners
    assert ring.nodes_for_many(on_points) == owners


def test_nodes_for_many_at_the_wrap_around() -> None:
    ring = HashRing(names(3), vnodes_per_weight=4)
    last = max(range(100_000), key=lambda i: position(f"k{i}"))  # a key past the last point
    key = f"k{last}"
    assert ring.nodes_for_many([key]) == [ring.node_for(key)]
    first_point_owner = min(ring.nodes, key=lambda n: min(position(f"{n}#{i}") for i in range(4)))
    assert ring.node_for(key) == first_point_owner


# -- value object, inspection, errors -----------------------------------------------------------------------


def test_membership_changes_return_new_rings() -> None:
    ring = HashRing(names(2))
    grown = ring.with_node("x-fence-9", weight=3)
    assert ring.nodes == ("x-fence-0", "x-fence-1") and "x-fence-9" not in ring
    assert grown.weights == {"x-fence-0": 1, "x-fence-1": 1, "x-fence-9": 3}
    assert grown.without_node("x-fence-9") == ring
    ring.weights["x-fence-0"] = 7
    assert ring.weights["x-fence-0"] == 1


def test_to_dict_from_dict_round_trip() -> None:
    ring = HashRing({"x-fence-0": 1, "x-fence-1": 2, "x-fence-2": 3}, vnodes_per_weight=50)
    data = json.loads(json.dumps(ring.to_dict()))
    assert data["vnodes_per_weight"] == 50 and data["points"] == 300
    assert data["nodes"]["x-fence-2"]["vnodes"] == 150
    assert data["nodes"]["x-fence-1"]["share"] == ring.shares()["x-fence-1"]
    back = HashRing.from_dict(data)
    assert back == ring and back.nodes == ring.nodes
    assert back.nodes_for_many(KEYS[:1000]) == ring.nodes_for_many(KEYS[:1000])


def test_empty_ring() -> None:
    ring = HashRing([])
    assert ring.shares() == {} and len(ring) == 0
    with pytest.raises(ValueError, match="empty"):
        ring.node_for("fence:1")
    with pytest.raises(ValueError, match="empty"):
        ring.iter_nodes("fence:1")  # eagerly, not at the first next()
    with pytest.raises(ValueError, match="empty"):
        ring.nodes_for("fence:1", 1)
    with pytest.raises(ValueError, match="empty"):
        ring.nodes_for_many(["fence:1"])
    assert ring.with_node("a").node_for("fence:1") == "a"


def test_errors() -> None:
    ring = HashRing(names(2))
    with pytest.raises(KeyError, match="x-fence-7"):
        ring.without_node("x-fence-7")
    with pytest.raises(ValueError, match="duplicate"):
        HashRing(["a", "b", "a"])
    with pytest.raises(ValueError, match="duplicate"):
        ring.with_node("x-fence-0")
    for weight in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive"):
            HashRing({"a": weight})
        with pytest.raises(ValueError, match="positive"):
            ring.with_node("c", weight)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="vnodes_per_weight"):
        HashRing(["a"], vnodes_per_weight=0)
    with pytest.raises(ValueError, match="non-empty"):
        HashRing([""])
    with pytest.raises(TypeError):
        HashRing("abc")
    with pytest.raises(ValueError, match="n must be"):
        ring.nodes_for("k", -1)
    with pytest.raises(ValueError, match="unsupported ring hash"):
        HashRing.from_dict({**ring.to_dict(), "hash": "md5"})
    with pytest.raises(ValueError, match="weight"):
        HashRing.from_dict({"vnodes_per_weight": 160, "nodes": {"a": {}}})


# -- hot keys: N masters, each member on one of them ------------------------------------------------------


def test_a_hot_key_has_n_masters_and_each_member_one_owner_among_them() -> None:
    ring = HashRing(names(5), hot={"stadium": 3})
    masters = ring.masters("stadium")
    assert masters == ring.nodes_for("stadium", 3) and masters[0] == ring.node_for("stadium")
    assert ring.masters("quiet") == [ring.node_for("quiet")]
    members = [f"car-{i}" for i in range(30_000)]
    owners = ring.owners("stadium", members)
    assert owners == [ring.owner("stadium", m) for m in members[:500]] + owners[500:]
    counts = Counter(owners)
    assert set(counts) == set(masters)
    assert all(abs(counts[m] / len(members) - 1 / 3) < 0.1 for m in masters), counts  # spread


def test_a_master_added_moves_only_the_members_it_takes() -> None:
    """Consistent over the masters: from 3 to 4 masters, only the members the new master
    owns move (about a quarter), and none moves between the old ones."""
    members = [f"car-{i}" for i in range(20_000)]
    three, four = (HashRing(names(6), hot={"stadium": n}) for n in (3, 4))
    new = (set(four.masters("stadium")) - set(three.masters("stadium"))).pop()
    before, after = three.owners("stadium", members), four.owners("stadium", members)
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert all(a == new for _, a in moved)
    assert 0.15 < len(moved) / len(members) < 0.35


def test_hot_keys_are_part_of_the_ring_and_its_stored_form() -> None:
    plain = HashRing(names(3))
    hot = plain.with_hot("stadium", 2)
    assert hot != plain and hot.hot == {"stadium": 2} and hot.with_hot("stadium", 1) == plain
    assert HashRing.from_dict(json.loads(json.dumps(hot.to_dict()))) == hot
    assert "hot" not in plain.to_dict()
    assert hot.with_weights({"x-fence-0": 2, "x-fence-1": 1}).hot == {"stadium": 2}
    assert hot.without_node("x-fence-2").hot == hot.with_node("x-fence-9").hot == {"stadium": 2}
    assert len(HashRing(names(2), hot={"stadium": 5}).masters("stadium")) == 2  # at most every node


@pytest.mark.parametrize("bad", [{"stadium": 0}, {"stadium": 17}, {"stadium": True}, {"": 2}, {"s": "2"}])
def test_a_bad_hot_key_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"hot key|masters"):
        HashRing(names(3), hot=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        HashRing.from_dict({**HashRing(names(3)).to_dict(), "hot": bad})
