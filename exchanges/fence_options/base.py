"""The one interface every fence option implements, and the errors they share.

An option is a field of a fence (FenceDef, exchanges/fence_def.py) with everything that
follows from it in one module: its default, its validation (`check`: a user's value, or
InvalidFence in words they can act on), its JSON form (`encode` / `decode`: the control
messages, x-fence's journal and snapshots, the database's `options` column and the API all
carry it so), the number x-fence keeps per fence (`column`), and its decision step, which is
one of two kinds that x-fence runs for every option alike:
- a refusal (`refuses`): a position the option refuses is outside the fence, as if it were
  beyond its geometry (`outside`, per position; `outside_one`, the same rule one position at
  a time, is what the reference, fence/reference.py, applies);
- a timer (`reason`): every stay in the fence ends at the latest at `due`, and x-fence's timer
  emits its LEAVE then, dated `due`, with the option's reason (the earliest of the timers
  wins; on a tie, the first in OPTIONS).
Options whose step is of neither kind (band, dwell, cross) keep their rule here too (zones,
dwell reached, segment crosses) and x-fence calls it at its own point of the decision.

Trade-off: the interface is a class per option with a handful of optional hooks, not a
pipeline of generic stages: the enter/leave decision stays one vectorised pass over a batch
(the hooks take and return arrays), and an option pays nothing where no fence sets it
(`is_set`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
from shapely.geometry.base import BaseGeometry

F64 = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
Fields = Sequence[Mapping[str, Any] | None]


class InvalidFence(ValueError):
    """What is wrong with a fence, in words a user can act on."""


def shown(value: Any, limit: int = 80) -> str:
    """A value as an error message names it: its repr, cut to `limit` characters (the input
    may be huge; an integer of thousands of digits has no repr at all)."""
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def is_storable(text: str) -> bool:
    """PostgreSQL's text refuses NUL, and UTF-8 has no lone surrogates (JSON's "\\ud800")."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def number_in(key: str, value: Any, lo: float, hi: float, unit: str, open_lo: bool = False) -> float:
    """`value` as a float in [lo, hi] (or (lo, hi]), compared as given, never converted first:
    an integer beyond float range (JSON has no limit) must be refused, not raise
    OverflowError; NaN fails every comparison; a boolean is no number."""
    ok = (isinstance(value, int | float) and not isinstance(value, bool)
          and (lo < value if open_lo else lo <= value) and value <= hi)
    if not ok:
        bound = f"{'(' if open_lo else '['}{lo:g}, {hi:g}]"
        raise InvalidFence(f"{key} {shown(value)}: a number of {unit} in {bound}")
    return float(value)


class FenceOption:
    """One option of a fence (see the module's docstring). A subclass sets `key` and `default`
    and overrides what applies; an instance is stateless (OPTIONS holds one of each)."""

    key: ClassVar[str]  # the FenceDef field, and the key on the wire, in the API and the database
    default: ClassVar[Any]
    # on every wire form even when default (a control message without it is refused)
    required: ClassVar[bool] = False
    # the option has a refusal step (`outside`)
    refuses: ClassVar[bool] = False
    # its refusal needs only its column (an expiry): x-fence judges every candidate at once,
    # `value` being the candidates' columns (else one call per fence, `value` the field's)
    by_column: ClassVar[bool] = False
    # the option has a timer (`due`); its LEAVE's reason
    reason: ClassVar[str] = ""
    # the option is a field of the fence (else of the position, e.g. an object's TTL)
    on_fence: ClassVar[bool] = True

    def check(self, raw: Any, geometry: BaseGeometry) -> Any:
        """A user's value (JSON) as the field holds it; InvalidFence says what is wrong."""
        raise NotImplementedError

    def encode(self, value: Any) -> Any:
        """The field's JSON form."""
        return value

    def decode(self, raw: Any) -> Any:
        """`encode`'s form back (trusted: a journal or the database, checked when it came in)."""
        return raw

    def is_set(self, value: Any) -> bool:
        return bool(value != self.default)

    def column(self, value: Any) -> float:
        """The number x-fence keeps per fence for it (the default's when a fence is gone)."""
        return float(value)

    def outside(self, value: Any, ts: F64, fields: Fields) -> Bools:
        """Per position (its time, its extra fields): whether the option refuses it."""
        return np.zeros(ts.size, bool)

    def outside_one(self, value: Any, ts: float, fields: Mapping[str, Any] | None) -> bool:
        """`outside` for one position: the reference's rule (fence/reference.py)."""
        return bool(self.outside(value, np.array([ts]), [fields])[0])

    def due(self, column: F64, last_ts: F64, ttl: F64) -> F64:
        """Per stay (its fence's column, its object's last position time and TTL): when the
        timer ends it (inf: never)."""
        return np.full(last_ts.size, np.inf)
