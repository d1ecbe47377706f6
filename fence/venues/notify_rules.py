"""When a user is told a favourite place crossed their threshold (no I/O).

A definition says: hive, threshold (people), above or below, optional quiet hours (the hive's
local time). It fires once per crossing:

- **hysteresis**: after firing it is disarmed until the occupancy has gone back past the
  threshold by `hysteresis(threshold)` people (10%, at least 1): a count bouncing around the
  threshold does not fire again and again;
- **cool-down**: never twice within COOLDOWN_S; a crossing inside it waits (still armed) and
  fires at the first update after it if the occupancy is still past the threshold;
- **quiet hours**: a crossing inside them is dropped (disarmed, logged as quiet): nobody wants
  last night's crowd at 8 a.m.

Per device, FCM allows a burst of about 20 collapsible messages, then one every few minutes:
`TokenBucket` holds each token to BURST messages refilled one per REFILL_S; a message the
bucket refuses is dropped and logged (`throttled`), the definition stays disarmed (its user
was told of this hive recently enough). Messages of one hive collapse on the device (the
newest replaces an unread older one).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, time
from functools import lru_cache
from zoneinfo import ZoneInfo

COOLDOWN_S = 900.0
BURST = 20
REFILL_S = 180.0

SEND, WAIT, QUIET, NOTHING = "send", "cooldown", "quiet", "nothing"


@dataclass(frozen=True)
class Definition:
    def_id: int
    uid: str
    hive_id: str
    threshold: int
    direction: str  # above | below
    quiet_start: time | None = None
    quiet_end: time | None = None


@dataclass
class DefState:
    armed: bool = True
    last_sent_at: float | None = None


def hysteresis(threshold: int) -> int:
    return max(1, round(threshold * 0.1))


@lru_cache(maxsize=256)
def _zone(tz: str) -> ZoneInfo:
    return ZoneInfo(tz)


def in_quiet_hours(d: Definition, tz: str, at: float) -> bool:
    if d.quiet_start is None or d.quiet_end is None or d.quiet_start == d.quiet_end:
        return False
    local = datetime.fromtimestamp(at, UTC).astimezone(_zone(tz)).time()
    if d.quiet_start < d.quiet_end:
        return d.quiet_start <= local < d.quiet_end
    return local >= d.quiet_start or local < d.quiet_end  # over midnight


def decide(d: Definition, state: DefState, occupancy: int, tz: str, at: float) -> str:
    """What to do with a new occupancy of the hive; `state` moves on."""
    past = occupancy >= d.threshold if d.direction == "above" else occupancy <= d.threshold
    back = (occupancy <= d.threshold - hysteresis(d.threshold) if d.direction == "above"
            else occupancy >= d.threshold + hysteresis(d.threshold))
    if not state.armed:
        if back:
            state.armed = True
        return NOTHING
    if not past:
        return NOTHING
    if in_quiet_hours(d, tz, at):
        state.armed = False
        return QUIET
    if state.last_sent_at is not None and at - state.last_sent_at < COOLDOWN_S:
        return WAIT
    state.armed = False
    state.last_sent_at = at
    return SEND


class TokenBucket:
    """Per device token: BURST messages, one more every REFILL_S."""

    def __init__(self) -> None:
        self.level: dict[str, tuple[float, float]] = {}  # token -> (tokens left, at)

    def take(self, token: str, at: float) -> bool:
        left, then = self.level.get(token, (float(BURST), at))
        left = min(float(BURST), left + max(0.0, at - then) / REFILL_S)
        if left < 1.0:
            self.level[token] = (left, at)
            return False
        self.level[token] = (left - 1.0, at)
        return True


def message_text(hive_name: str, occupancy: int, capacity: int | None, d: Definition) -> tuple[str, str]:
    """(title, body) of the push."""
    share = f" ({round(100 * occupancy / capacity)}% full)" if capacity else ""
    if d.direction == "above":
        return f"{hive_name} is getting busy", f"{occupancy} people there now{share}, {d.threshold} or more."
    return f"{hive_name} is quiet now", f"{occupancy} people there now{share}, {d.threshold} or fewer."
