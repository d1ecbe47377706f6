"""A fence's options, one module each, and the registry every role reads them through.

OPTIONS is the one list: the fence service validates a user's options with it (the API and
the GeoJSON files), the control messages, x-fence's journal, the database's `options` column
and the API's answers encode and decode them with it, and x-fence runs their refusals and
timers through it (fence/x_fence/). A fence's field for each is declared once, on FenceDef
(exchanges/fence_def.py); a test keeps the two lists equal.

Adding an option: a module here (a FenceOption: key, default, check, and its step), its line
in OPTIONS, its field on FenceDef, and its row in docs/reference.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shapely.geometry.base import BaseGeometry

from exchanges.fence_options import band, cross, dwell, expiry, shares, timeout, ttl, where
from exchanges.fence_options.base import FenceOption

# In this order: a timer's tie goes to the first (a fence's timeout before an object's TTL).
OPTIONS: tuple[FenceOption, ...] = (
    timeout.OPTION, ttl.OPTION, band.OPTION, where.OPTION, dwell.OPTION, cross.OPTION, expiry.OPTION,
    shares.OPTION,
)
FENCE_OPTIONS = tuple(o for o in OPTIONS if o.on_fence)  # the fields of FenceDef
REFUSING = tuple(o for o in FENCE_OPTIONS if o.refuses)
TIMERS = tuple(o for o in OPTIONS if o.reason)
BY_KEY = {o.key: o for o in FENCE_OPTIONS}
REASONS = (*(o.reason for o in TIMERS), dwell.DWELLED, cross.CROSSED)  # the reasons options give


def check_options(raw: Mapping[str, Any], geometry: BaseGeometry, strict: bool = False) -> dict[str, Any]:
    """The options in a user's (or a message's) mapping, checked, as FenceDef's keyword
    arguments (those not given are left to FenceDef's defaults). `strict`: a required option
    missing raises KeyError (a control message always carries it)."""
    out: dict[str, Any] = {}
    for o in FENCE_OPTIONS:
        if o.key in raw:
            out[o.key] = o.check(raw[o.key], geometry)
        elif strict and o.required:
            raise KeyError(o.key)
    return out


def encode_options(fence: Any) -> dict[str, Any]:
    """A fence's options in their JSON form: those set, and the required ones."""
    out: dict[str, Any] = {}
    for o in FENCE_OPTIONS:
        value = getattr(fence, o.key)
        if o.required or o.is_set(value):
            out[o.key] = o.encode(value)
    return out


def decode_options(raw: Mapping[str, Any]) -> dict[str, Any]:
    """`encode_options`' form back, as FenceDef's keyword arguments (trusted input)."""
    return {o.key: o.decode(raw[o.key]) for o in FENCE_OPTIONS if o.key in raw and raw[o.key] is not None}


def refusing(fence: Any) -> list[FenceOption]:
    """The refusing options `fence` sets."""
    return [o for o in REFUSING if o.is_set(getattr(fence, o.key))]


def refused_one(fence: Any, ts: float, fields: Mapping[str, Any] | None) -> bool:
    """Whether one of the fence's options refuses a position (the reference's rule)."""
    return any(o.outside_one(getattr(fence, o.key), ts, fields) for o in refusing(fence))
