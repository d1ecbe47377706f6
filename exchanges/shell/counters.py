"""What a sidecar did: `Counters`, for its periodic log line and `geofence inspect`, and
`reason_key`, the key dead-lettered messages are counted by.

Trade-off: a dead-letter reason is counted without its variable parts (numbers, quoted
values), so the counters stay small whatever the input; the full reason travels with the
message itself (its x-geofence-reason header, see publish.dead_letter).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

# Bucket bounds of the histograms a role observes (exchanges/shell/metrics.py serves them);
# a name not here gets DEFAULT_BUCKETS.
SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
HISTOGRAM_BUCKETS: dict[str, tuple[float, ...]] = {
    "batch_size": (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000),
    "confirm_wait_seconds": SECONDS,
    "journal_sync_seconds": (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
    # up to minutes: a backlog after an outage shows as what it is, not as "10 s or more"
    "event_latency_seconds": (*SECONDS, 30.0, 60.0, 120.0, 300.0),
    "roam_event_latency_seconds": (*SECONDS, 30.0, 60.0, 120.0, 300.0),
    "http_request_seconds": SECONDS,
    # a position's age when each role takes it in (its own ts to now): the hops' share of the
    # latency, fine where the targets are (tens of milliseconds), up to minutes for backlogs
    "position_age_seconds": (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04,
                             0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
}
DEFAULT_BUCKETS = SECONDS


class Histogram:
    """Counts per bucket (value <= bound; the last one past every bound) and their sum."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = np.asarray(bounds, dtype=np.float64)
        self.counts = np.zeros(len(bounds) + 1, dtype=np.int64)
        self.total = 0.0

    def observe(self, values: npt.ArrayLike) -> None:
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.size:
            self.counts += np.bincount(np.searchsorted(self.bounds, v, side="left"),
                                       minlength=self.counts.size)
            self.total += float(v.sum())

    @property
    def count(self) -> int:
        return int(self.counts.sum())


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
    events_by: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, reason)
    gauges: dict[str, float] = field(default_factory=dict)  # a role's levels now (gauge)
    histograms: dict[str, Histogram] = field(default_factory=dict)  # observe

    def bump(self, name: str, n: int = 1) -> None:
        self.other[name] += n

    def gauge(self, name: str, value: float) -> None:
        self.gauges[name] = float(value)

    def observe(self, name: str, values: npt.ArrayLike) -> None:
        """One value or an array of them into histogram `name` (buckets: HISTOGRAM_BUCKETS)."""
        h = self.histograms.get(name)
        if h is None:
            h = self.histograms[name] = Histogram(HISTOGRAM_BUCKETS.get(name, DEFAULT_BUCKETS))
        h.observe(values)

    def observe_ages(self, name: str, times: npt.ArrayLike) -> None:
        """Now minus each time (epoch seconds) into histogram `name`. A time ahead of now (a
        device clock ahead, within the skew x-ingress allows) is no latency: it is counted as
        `clock_ahead`, never observed (a negative value would drag the sum and the quantiles)."""
        t = np.asarray(times, np.float64)
        if not t.size:
            return
        ages = time.time() - t
        ahead = int((ages < 0).sum())
        if ahead:
            self.bump("clock_ahead", ahead)
            ages = ages[ages >= 0]
        self.observe(name, ages)

    def batch(self, size: int) -> None:
        self.batches += 1
        self.received += size
        self.largest_batch = max(self.largest_batch, size)
        self.observe("batch_size", size)

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
