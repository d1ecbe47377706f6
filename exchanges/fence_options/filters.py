"""Attribute filters (as Tile38's WHERE / WHEREIN): conditions on the extra fields a position
carries (`{"type": "truck", "speed": 23.5}`), all of which must hold (pure).

A filter on the wire is a list of clauses, each `[field, op, value...]`:
- `[f, "==", v]`, `[f, "!=", v]`: v a string, a number or a boolean;
- `[f, "<" | "<=" | ">" | ">=", x]`: x a number (the field must be a number too);
- `[f, "in", [v, ...]]`: one of up to 256 values;
- `[f, "between", lo, hi]`: lo <= field <= hi (numbers).

A position without the field, or with a value of another type, does not match (except `!=`,
which a missing field satisfies). Field names are top-level keys of the extra fields.
Errors are InvalidFilter, in words a user can act on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

OPS = ("==", "!=", "<", "<=", ">", ">=", "in", "between")
MAX_CLAUSES = 16
MAX_IN = 256
Clause = tuple[str, str, tuple[Any, ...]]


class InvalidFilter(ValueError):
    """What is wrong with a filter."""


def _scalar(v: Any, what: str) -> Any:
    if isinstance(v, bool) or (isinstance(v, str) and len(v) <= 200):
        return v
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    raise InvalidFilter(f"{what} {str(v)[:40]!r}: a string, a finite number or a boolean")


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise InvalidFilter(f"{what} {str(v)[:40]!r}: a finite number")
    return float(v)


def parse(raw: Any) -> tuple[Clause, ...]:
    """A filter as given (a list of clauses; None or [] for none), checked."""
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple) or len(raw) > MAX_CLAUSES:
        raise InvalidFilter(f"where: a list of at most {MAX_CLAUSES} clauses [field, op, value]")
    out: list[Clause] = []
    for c in raw:
        if not isinstance(c, list | tuple) or len(c) < 3:
            raise InvalidFilter(f"where clause {str(c)[:60]!r}: [field, op, value...] expected")
        field, op, args = c[0], c[1], tuple(c[2:])
        if not isinstance(field, str) or not 0 < len(field) <= 64:
            raise InvalidFilter(f"where field {str(field)[:40]!r}: a name of 1-64 characters")
        if op not in OPS:
            raise InvalidFilter(f"where op {str(op)[:20]!r}: one of {' '.join(OPS)}")
        if op == "between":
            if len(args) != 2:
                raise InvalidFilter("between: [field, \"between\", lo, hi]")
            lo, hi = _number(args[0], "between lo"), _number(args[1], "between hi")
            if lo > hi:
                raise InvalidFilter(f"between {lo:g} and {hi:g}: lo <= hi")
            out.append((field, op, (lo, hi)))
        elif op == "in":
            if len(args) != 1 or not isinstance(args[0], list | tuple) or not 0 < len(args[0]) <= MAX_IN:
                raise InvalidFilter(f"in: [field, \"in\", [value, ...]] with 1-{MAX_IN} values")
            out.append((field, op, tuple(_scalar(v, "in value") for v in args[0])))
        elif len(args) != 1:
            raise InvalidFilter(f"{op}: [field, \"{op}\", value]")
        elif op in ("==", "!="):
            out.append((field, op, (_scalar(args[0], f"{op} value"),)))
        else:
            out.append((field, op, (_number(args[0], f"{op} value"),)))
    return tuple(out)


def to_wire(clauses: Sequence[Clause]) -> list[list[Any]]:
    return [[f, op, list(args)] if op == "in" else [f, op, *args] for f, op, args in clauses]


def _holds(value: Any, op: str, args: tuple[Any, ...]) -> bool:
    if op == "!=":
        return value is None or not _holds(value, "==", args)
    if value is None:
        return False
    v = _typed(value)
    if op == "==":
        return type(v) is type(args[0]) and v == args[0]
    if op == "in":
        return any(type(v) is type(a) and v == a for a in args)
    if not isinstance(v, float):
        return False
    if op == "between":
        return bool(args[0] <= v <= args[1])
    x = args[0]
    return bool(v < x if op == "<" else v <= x if op == "<=" else v > x if op == ">" else v >= x)


def _typed(value: Any) -> Any:
    """Numbers compare as floats (JSON's 3 and 3.0 are one number), the rest as they are."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return value


def matches(clauses: Sequence[Clause], extras: Sequence[Mapping[str, Any] | None]) -> npt.NDArray[np.bool_]:
    """Per position (its extra fields, or None), whether every clause holds."""
    out = np.ones(len(extras), bool)
    if not clauses:
        return out
    for i, e in enumerate(extras):
        out[i] = all(_holds(None if e is None else e.get(f), op, args) for f, op, args in clauses)
    return out
