"""What a sidecar did: `Counters`, for its periodic log line and `geofence inspect`, and
`reason_key`, the key dead-lettered messages are counted by.

Trade-off: a dead-letter reason is counted without its variable parts (numbers, quoted
values), so the counters stay small whatever the input; the full reason travels with the
message itself (its x-geofence-reason header, see publish.dead_letter).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Counters:
    """What a sidecar did, for its periodic log line and `geofence inspect`."""

    received: int = 0  # messages
    positions: int = 0
    published: int = 0
    events: int = 0
    batches: int = 0
    largest_batch: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)  # by reason (shortened)
    retries: int = 0
    other: Counter[str] = field(default_factory=Counter)  # a role's own counts (bump)

    def bump(self, name: str, n: int = 1) -> None:
        self.other[name] += n

    def batch(self, size: int) -> None:
        self.batches += 1
        self.received += size
        self.largest_batch = max(self.largest_batch, size)

    def to_json(self) -> dict[str, Any]:
        return {"received": self.received, "positions": self.positions, "published": self.published,
                "events": self.events, "batches": self.batches, "largest_batch": self.largest_batch,
                "dead_lettered": sum(self.dead_lettered.values()),
                "dead_letter_reasons": dict(self.dead_lettered.most_common(20)),
                "publish_retries": self.retries, **self.other}

    def line(self) -> str:
        mean = self.received / self.batches if self.batches else 0.0
        return (f"received {self.received} msgs in {self.batches} batches (mean {mean:.1f}, max "
                f"{self.largest_batch}), positions {self.positions}, published {self.published}, "
                f"events {self.events}, dead-lettered {sum(self.dead_lettered.values())}, "
                f"publish retries {self.retries}")


def reason_key(reason: str) -> str:
    """A reason without its variable parts, to count by: the text before a ':' if any, with
    numbers and quoted values blanked ("lat 91 is outside [-90, 90]" -> "lat N is outside
    [N, N]"), so the counters stay small whatever the input."""
    head = reason.split(":")[0] if ":" in reason else reason
    head = _QUOTED.sub("'…'", head)
    return _NUMBER.sub("N", head)[:60]


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_NUMBER = re.compile(r"[-+]?(?:\d[\d_]*(?:,\d{3})*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|\b(?:nan|inf)\b")
