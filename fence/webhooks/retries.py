"""When a webhook delivery is tried again, when a message is given up, when an endpoint is
disabled. Pure: times in, decisions out.

A message is retried with exponential backoff and jitter (1 s, 2 s, 4 s ... up to 5 minutes, each
between half and all of that) until it is delivered or GIVE_UP_S after its first attempt, when it
is dead-lettered with the last failure as its reason. Delivery is in order per endpoint: the
message at the head waits for its retries, the ones behind it wait for it; other endpoints are
not affected. An endpoint that failed every attempt for DISABLE_S (no success in between) is
disabled and its owner told; one that answers 410 Gone is disabled at once.

Trade-off: ordered per endpoint means one failing message holds back its endpoint's later ones
until it is delivered or given up; a receiver that wants no head-of-line wait can take batches
and answer 2xx for what it could store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Verdict = Literal["delivered", "retry", "give_up", "disable"]


@dataclass(frozen=True)
class Policy:
    first_s: float = 1.0
    factor: float = 2.0
    max_delay_s: float = 300.0
    give_up_s: float = 86_400.0  # a message is dead-lettered this long after its first attempt
    disable_s: float = 3 * 86_400.0  # an endpoint failing every attempt this long is disabled
    timeout_s: float = 10.0  # one request

    def delay(self, attempt: int, draw: float) -> float:
        """Seconds before attempt `attempt + 1` after `attempt` failed ones (1-based), with
        `draw` in [0, 1): between half and all of the exponential step."""
        step = min(self.max_delay_s, self.first_s * self.factor ** max(0, attempt - 1))
        return step * (0.5 + 0.5 * draw)


def outcome(status: int | None) -> str | None:
    """None for a delivery (2xx); else the failure's reason (no answer: status None)."""
    if status is None:
        return "no answer"
    if 200 <= status < 300:
        return None
    return f"HTTP {status}"


@dataclass
class EndpointHealth:
    """Failures of one endpoint since its last success."""

    failing_since: float | None = None
    failures: int = 0
    last_error: str = ""

    def delivered(self) -> None:
        self.failing_since, self.failures, self.last_error = None, 0, ""

    def failed(self, now: float, error: str) -> None:
        if self.failing_since is None:
            self.failing_since = now
        self.failures += 1
        self.last_error = error


def after_failure(policy: Policy, health: EndpointHealth, status: int | None, first_attempt: float,
                  now: float) -> Verdict:
    """What to do with a message whose attempt failed (`health` already counts it)."""
    if status == 410:
        return "disable"
    if health.failing_since is not None and now - health.failing_since >= policy.disable_s:
        return "disable"
    if now - first_attempt >= policy.give_up_s:
        return "give_up"
    return "retry"
