"""Text that users send: one rule for every id, and one for every name, type and address, on
every part of the platform (fences, hives, sensors, devices, applications, tenants).

Ids go into routing keys, MQTT topics, RabbitMQ user names, file names and argv: 1-64 of
A-Z a-z 0-9 _ -, starting with a letter or digit (exchanges/ids.py; tenant ids have a narrower
alphabet of their own, exchanges/tenancy).

Names, types and addresses are text in any script, one line, of bounded length, and they are
shown to other people (the map's tooltips and panel, the owner's pages, CLI lists, push
notifications), so what could make them show something else is refused, not cleaned:
- control characters (Unicode category Cc: NUL, which PostgreSQL cannot store, newlines that
  forge lines in a list or a log, escape sequences that drive a terminal);
- lone surrogates (Cs: no valid UTF-8) and noncharacters (U+FDD0-U+FDEF, U+xxFFFE/F);
- the bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069), which
  reorder what follows them: "invoice<U+202E>fdp.exe" shows as "invoiceexe.pdf". The marks
  (U+200E, U+200F, U+061C) stay allowed: Arabic and Hebrew text needs them, and they reorder
  nothing beyond themselves;
- white space around the text (two names that look the same are one name), and an empty text
  where one is required.
Accepted text is returned in Unicode normal form C, so one name typed two ways is stored once.
Markup is not refused: "<b>" is a fine name and is always shown as text (fence/web/).

Trade-off: refusing rather than stripping means a client learns at once that its string was not
stored as sent; the cost is a 422 for text pasted with an invisible character in it, which the
message names (its code point and position).
"""

from __future__ import annotations

import unicodedata
from typing import Any

from exchanges.fence_options.base import shown  # the platform's one way to quote a value
from exchanges.ids import OBJECT_ID_RE, OBJECT_ID_RULE

NAME_MAX = 200  # a fence's, a hive's, a tenant's name
TYPE_MAX = 64  # a hive's type ("bar", "museum")
ADDRESS_MAX = 300  # a postal address on one line
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


class TextError(ValueError):
    """A string that breaks the rule for its field; the message names the field and why."""


def check_id(value: Any, field: str) -> str:
    """An id (see the module's docstring) or TextError naming `field`."""
    if not isinstance(value, str) or OBJECT_ID_RE.fullmatch(value) is None:
        raise TextError(f"{field} {shown(value, 40)}: {OBJECT_ID_RULE}")
    return value


def check_text(value: Any, field: str, max_len: int = NAME_MAX, *, required: bool = True) -> str:
    """A name, type or address (see the module's docstring), in NFC, or TextError naming
    `field`, the rule broken and where."""
    if not isinstance(value, str):
        raise TextError(f"{field}: a string expected, not {type(value).__name__}")
    if not value:
        if required:
            raise TextError(f"{field}: must not be empty")
        return value
    if len(value) > 4 * max_len:  # before normalising: bounded work on a huge body
        raise TextError(f"{field}: {len(value):,} characters; at most {max_len:,}")
    for i, c in enumerate(value):
        why = _refused(c)
        if why is not None:
            raise TextError(f"{field}: {why} U+{ord(c):04X} at character {i + 1} "
                            f"({shown(value[max(0, i - 10):i + 10], 40)})")
    text = unicodedata.normalize("NFC", value)
    if len(text) > max_len:
        raise TextError(f"{field}: {len(text):,} characters; at most {max_len:,}")
    if text != text.strip():
        raise TextError(f"{field} {shown(text, 40)}: white space around the text")
    return text


def allowed(c: str) -> bool:
    """Whether one character may appear in a name, type or address (white space may, inside)."""
    return _refused(c) is None


def _refused(c: str) -> str | None:
    if c in BIDI_CONTROLS:
        return "a bidirectional override, embedding or isolate"
    category = unicodedata.category(c)
    if category == "Cc":
        return "a control character"
    if category == "Cs":
        return "a lone surrogate (not valid Unicode)"
    o = ord(c)
    if 0xFDD0 <= o <= 0xFDEF or (o & 0xFFFE) == 0xFFFE:
        return "a Unicode noncharacter"
    return None
