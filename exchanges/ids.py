"""Object ids: one definition for every part that takes one (positions, devices, the API).

An object id is a device's RabbitMQ user name, its MQTT client id and a word of routing keys
(`positions.<id>`, `fence-events.<fence>.<kind>.<id>`): 1-64 of A-Z a-z 0-9 _ -, not starting
with "-" (it goes into argv), no dots, no regex or shell specials. Match it with `fullmatch`:
"$" would let "id\\n" in.
"""

from __future__ import annotations

import re

OBJECT_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
OBJECT_ID_RULE = "1-64 characters from A-Z a-z 0-9 _ -, starting with a letter or digit"


def is_object_id(value: object) -> bool:
    return isinstance(value, str) and OBJECT_ID_RE.fullmatch(value) is not None


def check_object_id(object_id: str) -> str:
    """The id itself, or ValueError saying what an object id is."""
    if not is_object_id(object_id):
        raise ValueError(f"object id {object_id!r}: {OBJECT_ID_RULE}")
    return object_id
