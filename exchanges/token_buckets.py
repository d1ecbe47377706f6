"""Token buckets: at most `burst` at once, refilled at `rate` a second, one bucket per key, at
most `max_keys` keys (the least recently used forgotten first: a full bucket is the same as no
bucket, so forgetting one never loosens a limit by more than one burst). Pure: the caller's
clock in, decisions out. Used by the API's rate limits (fence/rate_limits.py) and the broker's
login guard (exchanges/login_guard.py).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    rate: float  # per second, refilled continuously
    burst: float  # the most taken at once

    def __post_init__(self) -> None:
        if not (self.rate > 0 and self.burst >= 1 and math.isfinite(self.rate) and math.isfinite(self.burst)):
            raise ValueError(f"a limit needs rate > 0 and burst >= 1, not {self.rate}, {self.burst}")


class Buckets:
    """Token buckets of one limit, one per key, at most `max_keys` of them (LRU)."""

    def __init__(self, limit: Limit, max_keys: int = 100_000) -> None:
        self.limit, self.max_keys = limit, max_keys
        self._level: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)

    def _now_level(self, key: str, now: float) -> float:
        got = self._level.get(key)
        if got is None:
            return self.limit.burst
        tokens, at = got
        return min(self.limit.burst, tokens + max(0.0, now - at) * self.limit.rate)

    def wait(self, key: str, now: float) -> float:
        """Seconds until `key` may take one (0: now), taking nothing."""
        level = self._now_level(key, now)
        return 0.0 if level >= 1 else (1 - level) / self.limit.rate

    def take(self, key: str, now: float) -> float:
        """Take one for `key` if there is one: 0.0, else the seconds until there is (nothing
        taken)."""
        level = self._now_level(key, now)
        if level < 1:
            self._store(key, level, now)
            return (1 - level) / self.limit.rate
        self._store(key, level - 1, now)
        return 0.0

    def _store(self, key: str, level: float, now: float) -> None:
        self._level[key] = (level, now)
        self._level.move_to_end(key)
        while len(self._level) > self.max_keys:
            self._level.popitem(last=False)

    def __len__(self) -> int:
        return len(self._level)
