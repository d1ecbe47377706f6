"""exchanges/shell/ without a broker: reason keys, counters and backoff (the configuration:
test_shell_config.py)."""

from __future__ import annotations

import random
import time

import pytest

from exchanges.shell import Backoff, Counters, reason_key

# --------------------------------------------------------------------------- reason_key, counters


@pytest.mark.parametrize(("reason", "key"), [
    ("malformed JSON: unexpected character: line 1 column 2", "malformed JSON"),
    ("bad define message: KeyError: 'fence'", "bad define message"),
    ("unknown control message kind 'x'", "unknown control message kind '…'"),
    ("x" * 100, "x" * 60),
    ("y" * 100 + ": detail", "y" * 60),
    ("", ""),
])
def test_reason_key(reason: str, key: str) -> None:
    assert reason_key(reason) == key


def test_reason_key_groups_reasons_that_differ_after_the_colon() -> None:
    assert reason_key("malformed msgpack: ExtraData: 3") == reason_key("malformed msgpack: ValueError: x")


def test_reason_key_drops_the_variable_part_of_a_value_reason() -> None:
    assert reason_key("lat 91 is outside [-90, 90]") == reason_key("lat 95.5 is outside [-90, 90]")


def test_counters_batch_and_json() -> None:
    c = Counters()
    assert c.to_json() == {"received": 0, "positions": 0, "published": 0, "events": 0, "batches": 0,
                           "largest_batch": 0, "dead_lettered": 0, "dead_letter_reasons": {},
                           "publish_retries": 0}
    c.batch(3)
    c.batch(10)
    c.batch(2)
    c.positions, c.published, c.events, c.retries = 40, 12, 5, 2
    c.dead_lettered["malformed JSON"] += 2
    c.dead_lettered["lat"] += 1
    j = c.to_json()
    assert j["received"] == 15 and j["batches"] == 3 and j["largest_batch"] == 10
    assert j["positions"] == 40 and j["published"] == 12 and j["events"] == 5 and j["publish_retries"] == 2
    assert j["dead_lettered"] == 3
    assert j["dead_letter_reasons"] == {"malformed JSON": 2, "lat": 1}
    assert list(j["dead_letter_reasons"]) == ["malformed JSON", "lat"]  # most common first


def test_counters_json_keeps_the_20_most_common_reasons_but_counts_all() -> None:
    c = Counters()
    for i in range(30):
        c.dead_lettered[f"reason {i:02d}"] += i + 1
    j = c.to_json()
    assert j["dead_lettered"] == sum(range(1, 31))
    assert len(j["dead_letter_reasons"]) == 20
    assert set(j["dead_letter_reasons"]) == {f"reason {i:02d}" for i in range(10, 30)}


def test_counters_line() -> None:
    assert Counters().line() == ("received 0 msgs in 0 batches (mean 0.0, max 0), positions 0, published 0, "
                                 "events 0, dead-lettered 0, publish retries 0")
    c = Counters()
    c.batch(1)
    c.batch(4)
    c.positions, c.published, c.events, c.retries = 7, 6, 3, 1
    c.dead_lettered["x"] += 2
    assert c.line() == ("received 5 msgs in 2 batches (mean 2.5, max 4), positions 7, published 6, events 3, "
                        "dead-lettered 2, publish retries 1")


def test_counters_are_independent() -> None:
    a, b = Counters(), Counters()
    a.dead_lettered["x"] += 1
    assert b.dead_lettered == {}


# --------------------------------------------------------------------------- backoff


def test_backoff_grows_doubling_to_the_cap_and_resets(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[float, float]] = []

    def uniform(a: float, b: float) -> float:
        calls.append((a, b))
        return 1.0

    monkeypatch.setattr(random, "uniform", uniform)
    b = Backoff(0.5, 5.0)
    assert [b.next() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert set(calls) == {(0.8, 1.2)}
    b.reset()
    assert [b.next() for _ in range(2)] == [0.5, 1.0]


def test_backoff_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "uniform", lambda a, b: 1.0)
    b = Backoff()
    delays = [b.next() for _ in range(10)]
    assert delays[0] == 0.2
    assert max(delays) == 10.0 and delays[-1] == 10.0


def test_backoff_jitter_stays_within_20_percent() -> None:
    b = Backoff(1.0, 8.0)
    nominal = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    for n in nominal:
        d = b.next()
        assert 0.8 * n <= d <= 1.2 * n


def test_observe_ages_counts_a_clock_ahead_and_observes_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: 1000.0)
    c = Counters()
    c.observe_ages("position_age_seconds", [999.996, 999.99, 1000.5, 990.0])
    h = c.histograms["position_age_seconds"]
    assert c.other["clock_ahead"] == 1
    assert h.count == 3 and abs(h.total - (0.004 + 0.01 + 10.0)) < 1e-9
    c.observe_ages("position_age_seconds", [])
    assert h.count == 3
