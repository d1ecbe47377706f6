"""The GeofenceQueueNearLimit alert (deploy/prometheus/rules.yml) fires at 80% of the bounds the
policies give the queues (deploy/rabbitmq/definitions.py): the numbers are written twice, so
they are checked against each other here."""

from __future__ import annotations

import re
from pathlib import Path

from deploy.rabbitmq import definitions as d

RULES = Path(__file__).parents[2] / "deploy" / "prometheus" / "rules.yml"


def _expr() -> str:
    """The rule's expression as Prometheus reads it (its PromQL strings' escapes undone)."""
    text = RULES.read_text()
    rule = text[text.index("alert: GeofenceQueueNearLimit"):]
    block = rule[rule.index("expr: >"):rule.index("for:")]
    return block.replace("\\\\", "\\")


def test_the_thresholds_are_80_percent_of_the_policies_bounds() -> None:
    series = r"(rabbitmq_detailed_queue_messages(?:_bytes)?)\{queue(=|!)~?\"([^\"]+)\"\}\)\s*>\s*(\d+)"
    found = re.findall(series, _expr())
    by = {(metric, pattern): int(value) for metric, _, pattern, value in found}
    clients = r"app\..+|mqtt-subscription-.+"
    messages, size = "rabbitmq_detailed_queue_messages", "rabbitmq_detailed_queue_messages_bytes"
    assert by[(messages, "dead-letters")] == int(0.8 * d.DEAD_LETTER_MAX_LENGTH)
    assert by[(size, "dead-letters")] == int(0.8 * d.DEAD_LETTER_MAX_BYTES)
    assert by[(messages, clients)] == int(0.8 * d.CLIENT_QUEUE_MAX_LENGTH)
    assert by[(size, clients)] == int(0.8 * d.CLIENT_QUEUE_MAX_BYTES)
    inputs = [v for (m, p), v in by.items() if p.startswith("dead-letters|")]
    assert inputs == [int(0.8 * d.INPUT_QUEUE_MAX_LENGTH)]


def test_the_client_queue_pattern_is_the_policys() -> None:
    pattern = r"app\..+|mqtt-subscription-.+"
    for vhost in ("gf-ingress", "gf-fences"):
        for prefix in d.client_queue_prefixes(vhost):
            assert re.fullmatch(pattern, prefix + "x") and not re.fullmatch(pattern, prefix)
    assert pattern in _expr()
