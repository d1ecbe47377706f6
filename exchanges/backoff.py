"""Capped exponential backoff with jitter: how every part waits before trying again (a broker
reconnect, a refused publish, PostgreSQL away)."""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, first: float = 0.2, cap: float = 10.0) -> None:
        self.first, self.cap, self._next = first, cap, first

    def reset(self) -> None:
        self._next = self.first

    def next(self) -> float:
        delay = self._next * random.uniform(0.8, 1.2)
        self._next = min(self.cap, self._next * 2)
        return delay
