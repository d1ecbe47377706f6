"""The fence options' registry (exchanges/fence_options/__init__.py) and FenceDef declare the
same fields: each option of a fence is a field of FenceDef with the option's default, in the
registry's order, and every option's default is "off" (nothing set, nothing on the wire, no
refusal, no timer)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from shapely.geometry import box

from exchanges.fence_def import FenceDef
from exchanges.fence_options import (
    FENCE_OPTIONS,
    OPTIONS,
    REFUSING,
    TIMERS,
    check_options,
    decode_options,
    encode_options,
    refusing,
)

F = box(0, 0, 1, 1)
OWN = ("fence_id", "version", "geometry", "name")  # a fence's own fields, before its options


def test_fence_def_declares_every_fence_option_with_its_default_in_order() -> None:
    fields = [f for f in dataclasses.fields(FenceDef) if f.name not in OWN]
    assert [f.name for f in fields] == [o.key for o in FENCE_OPTIONS]
    assert [f.default for f in fields] == [o.default for o in FENCE_OPTIONS]
    assert all(o.key not in OWN for o in OPTIONS) and len({o.key for o in OPTIONS}) == len(OPTIONS)


def test_a_fence_with_no_option_set_refuses_nothing_and_carries_only_the_required() -> None:
    plain = FenceDef(fence_id="F", version=1, geometry=F)
    assert refusing(plain) == []
    assert encode_options(plain) == {o.key: o.encode(o.default) for o in FENCE_OPTIONS if o.required}
    assert FenceDef(fence_id="F", version=1, geometry=F, **decode_options(encode_options(plain))) \
        .__dict__ == plain.__dict__
    assert all(not o.is_set(o.default) for o in OPTIONS)


def test_the_defaults_give_no_timer_and_no_refusal() -> None:
    ts = np.array([0.0, 1e9])
    for o in REFUSING:
        assert not o.outside(o.default, ts, [None, None]).any()
    for o in TIMERS:
        if o.on_fence and not o.required:
            assert np.isinf(o.due(np.full(2, o.column(o.default)), ts, np.full(2, np.inf))).all()


def test_check_options_takes_only_option_keys_and_requires_the_required_when_strict() -> None:
    assert check_options({"name": "x", "follow": "o", "timeout_s": 60}, F) == {"timeout_s": 60.0}
    with pytest.raises(KeyError, match="timeout_s"):
        check_options({}, F, strict=True)
