"""A fence that expires at a time (`expires_at`, exchanges/fence_options/expiry.py; issue 35's
proof that an option goes in through the option interface alone): the check of a user's
value, every form it travels in (a GeoJSON property, a control message, x-fence's journal),
its refusal (a position at or after it is outside) and its timer (LEAVE `fence_expired` at
that time), against the reference (fence/reference.py), which knows nothing of the option but
what its module says."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from shapely.geometry import box, mapping

from exchanges.batch import PositionBatch
from exchanges.control import _fence, fence_json
from exchanges.fence_def import FenceDef, InvalidFence
from exchanges.fence_events import REASONS
from exchanges.fence_options import BY_KEY, OPTIONS
from exchanges.fence_options.expiry import FENCE_EXPIRED, check_expires_at
from exchanges.hash_ring import HashRing
from exchanges.worker_batch import WorkerBatch
from fence.reference import compare, reference_events, visit_problems
from fence.spec import from_feature
from fence.x_fence import codec
from fence.x_fence.core import XFence

F = box(0, 0, 1, 1)
IN, OUT = (0.5, 0.5), (2.0, 2.0)
AT = 1_000.0  # the fence expires then


def fence(expires_at: float = AT, **kw: object) -> FenceDef:
    return FenceDef(fence_id="F", version=1, geometry=F, timeout_s=600.0, expires_at=expires_at, **kw)  # type: ignore[arg-type]


def seen(x: XFence, oid: str, where: tuple[float, float], ts: float) -> list:  # type: ignore[type-arg]
    pos = PositionBatch([oid], np.array([where[0]]), np.array([where[1]]), np.array([ts]),
                        np.zeros(1, np.uint64), [])
    inside = where == IN
    wb = WorkerBatch(x.worker, pos, np.array([0, int(inside)], np.int64), ["F"],
                     np.zeros(int(inside), np.int32), np.zeros(int(inside), bool))
    return x.route(wb)


def worker(expires_at: float = AT) -> XFence:
    x = XFence("w0")
    x.define(fence(expires_at), 0.0)
    return x


@pytest.mark.parametrize(("raw", "want"), [
    (1_800_000_000, 1_800_000_000.0), (1.5, 1.5), (None, math.inf),
    ("2026-12-24T18:00:00Z", 1_798_135_200.0), ("2026-12-24T19:00:00+01:00", 1_798_135_200.0),
])
def test_a_users_expiry_is_epoch_seconds_or_an_rfc3339_time(raw: object, want: float) -> None:
    assert check_expires_at(raw) == want


@pytest.mark.parametrize("raw", [0, -5, True, float("nan"), float("inf"), 10**400, 5e9, "tomorrow",
                                 "2026-12-24T18:00:00", "2026-12-24T18:00:00Z" + " " * 40, [1], {}])
def test_a_bad_expiry_is_refused_with_its_reason(raw: object) -> None:
    with pytest.raises(InvalidFence, match="expires_at"):
        check_expires_at(raw)


def test_the_option_is_registered_with_its_field_and_its_reason() -> None:
    assert BY_KEY["expires_at"] in OPTIONS and FENCE_EXPIRED in REASONS
    assert FenceDef(fence_id="F", version=1, geometry=F).expires_at == math.inf


def test_it_travels_in_every_form_of_a_fence() -> None:
    feature = {"type": "Feature", "geometry": mapping(F), "properties": {"id": "F", "expires_at": AT}}
    spec = from_feature(feature)
    assert spec.expires_at == AT and spec.definition(3).expires_at == AT
    wire = fence_json(fence())
    assert wire["expires_at"] == AT and _fence(wire).expires_at == AT
    assert "expires_at" not in fence_json(fence(math.inf))  # never: not on the wire
    packed = codec.pack_fence(codec.StoredFence(fence(), 0.0, True, fence(500.0), frozenset()))
    stored = codec.unpack_fence(packed)
    assert stored.fence.expires_at == AT and stored.prev is not None and stored.prev.expires_at == 500.0


def test_nothing_enters_at_or_after_the_expiry_and_the_timer_leaves_who_is_inside() -> None:
    x = worker()
    entered = seen(x, "a", IN, 900.0)
    assert [(e.event, e.reason) for e in entered] == [("enter", "entered")]
    assert seen(x, "b", IN, AT) == []  # refused: the fence holds no one from AT on
    assert x.expire(AT - 1.0) == []
    left = x.expire(AT + 0.5)
    assert [(e.event, e.object_id, e.reason, e.ts, e.inside_s) for e in left] == [
        ("leave", "a", FENCE_EXPIRED, AT, 100.0)]
    assert visit_problems(entered + left) == []
    assert seen(x, "a", IN, AT + 10.0) == [] and x.fences_of("a") == []


def test_a_timeout_before_the_expiry_wins() -> None:
    x = XFence("w0")
    x.define(dataclasses.replace(fence(), timeout_s=30.0), 0.0)
    seen(x, "a", IN, 900.0)
    assert [(e.reason, e.ts) for e in x.expire(AT + 1.0)] == [("timeout", 930.0)]


def test_a_stay_within_its_dwell_time_ends_silently_at_the_expiry() -> None:
    x = XFence("w0")
    x.define(fence(dwell_s=500.0), 0.0)
    assert seen(x, "a", IN, 900.0) == []
    assert x.expire(AT + 1.0) == [] and x.occupants("F") == []


def test_the_expiry_survives_the_journal_a_snapshot_and_a_handover() -> None:
    x = worker()
    seen(x, "a", IN, 900.0)
    y = XFence("w0")
    y.apply(x.changes(0) or {})
    z = XFence.restore(x.snapshot())
    ring = HashRing({"w1": 1})
    w1 = XFence("w1")
    w1.take(x.export(ring), ring)
    for other in (y, z, w1):
        assert [(e.object_id, e.reason, e.ts) for e in other.expire(AT + 1.0)] == [("a", FENCE_EXPIRED, AT)]


def test_moving_the_expiry_earlier_never_dates_a_leave_before_its_stay() -> None:
    x = worker()
    seen(x, "a", IN, 900.0)
    x.define(dataclasses.replace(fence(950.0), version=2), 960.0)  # no re-check row came for a
    assert [(e.reason, e.ts, e.inside_s) for e in x.expire(2_000.0)] == [(FENCE_EXPIRED, 950.0, 50.0)]


def test_the_core_gives_the_reference_events() -> None:
    """Random walks across the fence and its expiry, positions only (no timer): the refusal
    alone decides, as the reference's rule from the option's module does."""
    rng = np.random.default_rng(35)
    n_obj, steps = 40, 30
    obj = np.repeat(np.arange(n_obj), steps)
    ts = np.tile(np.arange(steps) * 60.0 + 100.0, n_obj) + rng.uniform(0, 30, n_obj * steps)
    ts = np.sort(ts.reshape(n_obj, steps), axis=1).ravel()
    lon, lat = rng.uniform(-0.5, 1.5, obj.size), rng.uniform(-0.5, 1.5, obj.size)
    expires = 100.0 + steps * 60.0 / 2
    names, ids = ["F"], [f"o{i}" for i in range(n_obj)]
    want = reference_events(names, [F], ids, obj, lon, lat, ts, fences=[fence(expires)])
    x = worker(expires)
    got = []
    order = np.argsort(ts, kind="stable")
    for i in order.tolist():
        where = (float(lon[i]), float(lat[i]))
        inside = bool(F.contains(box(*where, *where).centroid))
        pos = PositionBatch([ids[obj[i]]], np.array([where[0]]), np.array([where[1]]), np.array([ts[i]]),
                            np.zeros(1, np.uint64), [])
        wb = WorkerBatch("w0", pos, np.array([0, int(inside)], np.int64), ["F"],
                         np.zeros(int(inside), np.int32), np.zeros(int(inside), bool))
        got += [(e.event, e.fence_id, e.object_id, e.ts, e.reason) for e in x.route(wb)]
    assert any(t >= expires for *_, t, r in got if r == "exited")  # the refusal was exercised
    assert compare(got, want) == []


def test_a_change_after_the_expiry_enters_no_one() -> None:
    """A position is judged at the time its event would carry: after a change of the fence
    past its expiry (a rename, a follow move), an object last seen before the expiry is not
    entered at the change's time."""
    x = worker()
    x.define(dataclasses.replace(fence(), version=2, name="renamed"), AT + 100.0)
    assert seen(x, "a", IN, AT - 10.0) == []
    assert x.fences_of("a") == [] and x.expire(AT + 200.0) == []


def test_a_timer_never_dates_a_leave_before_its_stay_began() -> None:
    """A fence defined after an object's position: its stay begins at the change (ENTER dated
    then); its timeout, counted from the position, is past already: the LEAVE comes at the
    stay's start, inside_s 0, never before it (every timer alike)."""
    x = XFence("w0")
    x.define(FenceDef(fence_id="F", version=1, geometry=F, timeout_s=60.0), 1_000.0)
    entered = seen(x, "a", IN, 5.0)
    assert [(e.event, e.ts) for e in entered] == [("enter", 1_000.0)]
    left = x.expire(2_000.0)
    assert [(e.reason, e.ts, e.inside_s) for e in left] == [("timeout", 1_000.0, 0.0)]
    assert visit_problems(entered + left) == []
