"""The internal wire's decoders fuzzed (issue 5; the properties: test_fuzz_decoders.py): `unpack`
refuses with a ValueError and a reason, control.parse with an InvalidMessage, and what they
take is what x-geo and x-fence may rely on.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
from hypothesis import given

from exchanges import control
from exchanges.batch import unpack
from exchanges.binding_diff import diff as binding_diff
from exchanges.contract import InvalidMessage
from exchanges.fence_def import FenceDef
from tests.faults.fuzz_inputs import Fuzzer
from tests.unit.fuzz_contract import (
    SEEDS,
    TS,
    assert_reason,
    fuzz,
    is_id,
)
from tests.unit.fuzz_wire import (
    SQUARE,
    region_wire,
    wire_bodies,
)

# --------------------------------------------------------------------------- the internal wire


@fuzz("unpack")
@given(SEEDS)
def test_unpack_refuses_with_a_value_error_and_a_reason(seed: int) -> None:
    for body, valid in wire_bodies(seed, region_wire, 3):
        try:
            msg = unpack(body)
        except ValueError as exc:
            assert_reason(str(exc))
            assert not valid
            continue
        assert isinstance(msg, dict) and msg["v"] == 1 and isinstance(msg["kind"], str)


# --------------------------------------------------------------------------- control messages


def control_wire(rng: random.Random) -> dict[str, Any]:
    version = rng.randint(2, 9)
    z = Fuzzer(rng)
    fence = FenceDef(fence_id=z.object_id(), version=version, geometry=SQUARE,
                     timeout_s=float(rng.randint(1, 600)), name=z.text(6))
    bounds = sorted(rng.sample(range(1 << 40), 2 * rng.randint(1, 4)))
    ranges = np.array(bounds, np.uint64).reshape(-1, 2)
    interior = np.array([rng.random() < 0.5 for _ in range(len(ranges))], bool)
    k = rng.randint(0, 3)
    if k == 0:
        body = control.define_for_region(fence, TS, 20, ranges, interior)
    elif k == 1:
        body = control.rebind_for_region(fence, TS, 20, version - 1,
                                         binding_diff(ranges, interior, ranges[:1], interior[:1]))
    elif k == 2:
        body = control.drop_message(control.Drop(fence.fence_id, version, TS))
    else:
        body = control.define_for_worker(control.Define(fence, TS))
    return unpack(body)


@fuzz("control")
@given(SEEDS)
def test_control_parse_refuses_with_invalid_message(seed: int) -> None:
    for body, valid in wire_bodies(seed, control_wire, 2):
        try:
            msg = unpack(body)
        except ValueError as exc:
            assert_reason(str(exc))
            assert not valid
            continue
        try:
            change = control.parse(msg)
        except InvalidMessage as exc:
            assert_reason(exc.reason)
            assert not valid, exc.reason
            continue
        check_control(change)


def check_control(change: control.Define | control.Drop) -> None:
    """What x-geo and x-fence may rely on in a parsed control message."""
    if isinstance(change, control.Drop):
        assert is_id(change.fence_id) and type(change.version) is int and change.version >= 1
        assert math.isfinite(change.ts)
        return
    f = change.fence
    assert is_id(f.fence_id) and type(f.version) is int and f.version >= 1 and math.isfinite(change.ts)
    assert f.geometry.is_valid and not f.geometry.is_empty and 0 < f.timeout_s <= 7 * 86400
    diff = change.diff
    for r in (change.ranges, diff.add if diff else None, diff.remove if diff else None):
        if r is not None:
            assert r.ndim == 2 and r.shape[1] == 2 and (r[:, 0] <= r[:, 1]).all()
    if change.ranges is not None:
        assert change.interior is not None and len(change.interior) == len(change.ranges)
    if diff is not None:
        assert len(diff.add_interior) == len(diff.add) and change.base_version < f.version
