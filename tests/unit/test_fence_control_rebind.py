"""exchanges/control.py "rebind": the ranges that changed since base_version (exchanges/binding_diff.py),
through the real wire codec, and what a rebind message is refused for."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

import hilbert_c as hk
from exchanges import binding_diff as bd
from exchanges import control
from exchanges.batch import unpack
from exchanges.control import REBIND, Define
from exchanges.fence_binding import INDEX_BITS
from exchanges.fence_def import FenceDef
from fence.follow import circle
from tests.unit.test_fence_control import DELETE, TS, edited, refusal

U64 = npt.NDArray[np.uint64]
BOOL = npt.NDArray[np.bool_]
OLD_C, NEW_C = circle(9.52, 47.14, 800.0), circle(9.5212, 47.1405, 800.0)  # a fence that moved ~100 m


def covering(geometry: Any, bits: int = 18) -> tuple[U64, BOOL]:
    cov = hk.cover(geometry, bits).to_bits(INDEX_BITS)
    return cov.ranges, cov.interior


OLD, NEW = covering(OLD_C), covering(NEW_C)
DIFF = bd.diff(*OLD, *NEW)


def fence(version: int = 5, geometry: Any = NEW_C) -> FenceDef:
    return FenceDef(fence_id="truck-zone", version=version, geometry=geometry, timeout_s=90.0,
                    name="Truck zone")


def rebind_msg(**change: Any) -> dict[str, Any]:
    """A decoded rebind message (version 5 on base 4) with some fields changed (DELETE deletes)."""
    return edited(unpack(control.rebind_for_region(fence(), TS, INDEX_BITS, 4, DIFF)), change)


def parsed(msg: dict[str, Any]) -> Define:
    d = control.parse(msg)
    assert isinstance(d, Define)
    return d


# --------------------------------------------------------------------------- round trips


def test_the_coverings_differ_a_little() -> None:
    assert len(OLD[0]) > 10 and len(NEW[0]) > 10
    assert 0 < len(DIFF.add) < len(NEW[0]) and 0 < len(DIFF.remove) < len(OLD[0])
    assert DIFF.add_interior.any()  # an interior range among the new ones: its flag must travel


def test_rebind_round_trip() -> None:
    msg = unpack(control.rebind_for_region(fence(), TS, INDEX_BITS, 4, DIFF))
    assert msg["kind"] == REBIND == "rebind"
    assert "ranges" not in msg and "interior" not in msg
    d = parsed(msg)
    assert (d.fence.fence_id, d.fence.version, d.fence.name, d.fence.timeout_s) == (
        "truck-zone", 5, "Truck zone", 90.0)
    assert d.fence.geometry.equals(NEW_C)
    assert d.ts == TS and d.bits == INDEX_BITS and d.base_version == 4
    assert d.ranges is None and d.interior is None and d.binding() is None
    assert d.diff is not None
    assert d.diff.add.dtype == np.uint64 and d.diff.add.shape == DIFF.add.shape
    assert d.diff.remove.dtype == np.uint64 and d.diff.remove.shape == DIFF.remove.shape
    assert d.diff.add_interior.dtype == np.bool_
    np.testing.assert_array_equal(d.diff.add, DIFF.add)
    np.testing.assert_array_equal(d.diff.add_interior, DIFF.add_interior)
    np.testing.assert_array_equal(d.diff.remove, DIFF.remove)
    assert d.diff.digest == DIFF.digest == bd.digest(*NEW)
    assert d.diff.size == DIFF.size


def test_the_received_diff_applies_onto_the_base_version() -> None:
    d = parsed(rebind_msg())
    assert d.diff is not None
    ranges, interior = bd.apply(*OLD, d.diff)
    np.testing.assert_array_equal(ranges, NEW[0])
    np.testing.assert_array_equal(interior, NEW[1])
    with pytest.raises(bd.DiffMismatch):
        bd.apply(*NEW, d.diff)  # not the version it was made from


def test_an_empty_diff_round_trips() -> None:
    same = bd.diff(*NEW, *NEW)
    d = parsed(unpack(control.rebind_for_region(fence(), TS, INDEX_BITS, 4, same)))
    assert d.diff is not None and d.diff.size == 0
    assert d.diff.add.shape == (0, 2) and d.diff.remove.shape == (0, 2) and d.diff.add_interior.shape == (0,)
    ranges, _ = bd.apply(*NEW, d.diff)
    np.testing.assert_array_equal(ranges, NEW[0])


def test_a_diff_to_nothing_and_from_nothing() -> None:
    nothing = (np.empty((0, 2), np.uint64), np.empty(0, bool))
    gone = parsed(unpack(control.rebind_for_region(fence(), TS, INDEX_BITS, 4, bd.diff(*OLD, *nothing))))
    assert gone.diff is not None and len(gone.diff.add) == 0
    np.testing.assert_array_equal(gone.diff.remove, OLD[0])
    assert bd.apply(*OLD, gone.diff)[0].shape == (0, 2)
    came = parsed(unpack(control.rebind_for_region(fence(), TS, INDEX_BITS, 4, bd.diff(*nothing, *NEW))))
    assert came.diff is not None and len(came.diff.remove) == 0
    np.testing.assert_array_equal(bd.apply(*nothing, came.diff)[0], NEW[0])


def test_a_far_older_base_version() -> None:
    d = parsed(unpack(control.rebind_for_region(fence(900), TS, INDEX_BITS, 1, DIFF)))
    assert (d.fence.version, d.base_version) == (900, 1)


def test_diff_arrays_in_other_dtypes_are_written_as_uint64() -> None:
    odd = bd.Diff(DIFF.add.astype(np.int64), DIFF.add_interior.astype(np.uint8), DIFF.remove.astype(np.int64),
                  DIFF.digest)
    d = parsed(unpack(control.rebind_for_region(fence(), TS, INDEX_BITS, 4, odd)))
    assert d.diff is not None
    np.testing.assert_array_equal(d.diff.add, DIFF.add)
    np.testing.assert_array_equal(d.diff.add_interior, DIFF.add_interior)
    np.testing.assert_array_equal(d.diff.remove, DIFF.remove)


def test_define_is_still_a_whole_define() -> None:
    d = parsed(unpack(control.define_for_region(fence(), TS, INDEX_BITS, *NEW)))
    assert d.diff is None and d.base_version == 0
    assert d.ranges is not None
    np.testing.assert_array_equal(d.ranges, NEW[0])


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("missing", ["fence", "ts", "bits", "base_version", "add", "add_interior", "remove",
                                     "digest"])
def test_missing_field(missing: str) -> None:
    reason = refusal(rebind_msg(**{missing: DELETE}))
    assert reason.startswith("bad rebind message: KeyError") and repr(missing) in reason


@pytest.mark.parametrize("base", [5, 6, 1000])
def test_base_version_not_older_than_the_version(base: int) -> None:
    assert refusal(rebind_msg(base_version=base)) == (
        f"bad rebind message: ValueError: base_version {base} is not older than version 5")


@pytest.mark.parametrize("base", [0, -1, True, "4", 4.0, None])
def test_base_version_not_a_version(base: Any) -> None:
    assert refusal(rebind_msg(base_version=base)) == (
        f"bad rebind message: ValueError: version {base!r} is not a positive integer")


@pytest.mark.parametrize("digest", [b"", b"\x00" * 15, b"\x00" * 17, DIFF.digest + b"\x00", DIFF.digest.hex(),
                                    None, list(DIFF.digest), bytearray(DIFF.digest)])
def test_digest_of_the_wrong_size_or_type(digest: Any) -> None:
    assert refusal(rebind_msg(digest=digest)) == "bad rebind message: ValueError: digest: 16 bytes expected"


def test_more_flags_or_fewer_than_ranges_to_add() -> None:
    n = len(DIFF.add)
    flags = np.ascontiguousarray(DIFF.add_interior, np.uint8).tobytes()
    assert refusal(rebind_msg(add_interior=flags[:-1])) == (
        f"bad rebind message: ValueError: {n} ranges to add but {n - 1} interior flags")
    assert refusal(rebind_msg(add_interior=flags + b"\x01")) == (
        f"bad rebind message: ValueError: {n} ranges to add but {n + 1} interior flags")
    # ranges and flags cut together are fine (a message is not checked against the digest here)
    fewer = np.ascontiguousarray(DIFF.add[:-1], "<u8").tobytes()
    cut = parsed(rebind_msg(add=fewer, add_interior=flags[:-1]))
    assert cut.diff is not None and len(cut.diff.add) == n - 1
    with pytest.raises(bd.DiffMismatch):
        bd.apply(*OLD, cut.diff)  # the receiver's digest check catches what is missing


@pytest.mark.parametrize("field", ["add", "remove"])
@pytest.mark.parametrize("value", [[[1, 2]], "0102", None, 12])
def test_ranges_not_bytes(field: str, value: Any) -> None:
    assert refusal(rebind_msg(**{field: value})) == (
        f"bad rebind message: TypeError: {field}: bytes expected, got {type(value).__name__}")


@pytest.mark.parametrize("value", [[True, False], None])
def test_flags_not_bytes(value: Any) -> None:
    assert refusal(rebind_msg(add_interior=value)).startswith("bad rebind message: TypeError")


@pytest.mark.parametrize("field", ["add", "remove"])
def test_range_ending_before_its_start(field: str) -> None:
    ranges = (DIFF.add if field == "add" else DIFF.remove).copy()
    ranges[-1] = [ranges[-1, 0], ranges[-1, 0] - np.uint64(1)]
    raw = np.ascontiguousarray(ranges, "<u8").tobytes()
    assert refusal(rebind_msg(**{field: raw})) == (
        f"bad rebind message: ValueError: {field}: a range ends before it starts")


def test_a_one_index_range_is_fine() -> None:
    raw = np.array([[7, 7]], "<u8").tobytes()
    d = parsed(rebind_msg(add=raw, add_interior=b"\x01", remove=raw))
    assert d.diff is not None and d.diff.add.tolist() == [[7, 7]] and d.diff.remove.tolist() == [[7, 7]]


@pytest.mark.parametrize("field", ["add", "remove"])
def test_ranges_not_whole_pairs(field: str) -> None:
    assert refusal(rebind_msg(**{field: b"\x00" * 24})) == (
        f"bad rebind message: ValueError: {field}: not a whole number of [first, last] uint64 pairs")


@pytest.mark.parametrize("ts", [math.nan, math.inf, True, "1700000000", None])
def test_bad_ts(ts: Any) -> None:
    assert refusal(rebind_msg(ts=ts)) == f"bad rebind message: ValueError: ts {ts!r} is not a finite number"


def test_bad_fence() -> None:
    msg = rebind_msg()
    msg["fence"]["id"] = "-bad"
    assert refusal(msg).startswith("bad rebind message: fence id '-bad'")
    msg = rebind_msg()
    msg["fence"]["version"] = 0
    assert refusal(msg) == "bad rebind message: ValueError: version 0 is not a positive integer"
    assert refusal(rebind_msg(fence="truck-zone")).startswith("bad rebind message: TypeError")
