"""The demo (the README's first command), short: a fleet on the real road network publishes
over MQTT through the running pipeline; the run passes only if events came and they are
exactly the events shapely computes from the positions it published."""

from __future__ import annotations

import re

import pytest

from tests.integration.clients import geofence

pytestmark = pytest.mark.integration


def test_a_short_demo_produces_the_reference_events() -> None:
    done = geofence("demo", "--vehicles", "20", "--duration", "10", "--rate", "2", "--pois", "6", "--quiet")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "(c) OpenStreetMap contributors" in out
    summary = next(line for line in out.splitlines() if line.startswith("SUMMARY"))
    assert summary.startswith("SUMMARY OK"), summary
    assert "events identical to the shapely reference: True" in summary
    found = re.search(r"Events (\d[\d,]*) \(ENTER", out)
    assert found is not None and int(found.group(1).replace(",", "")) > 0
    sent = re.search(r"Vehicles 20, (\d[\d,]*) position updates", out)
    assert sent is not None and int(sent.group(1).replace(",", "")) == 20 * 2 * 10
    assert "geofence inspect fence li-vaduz" in out
