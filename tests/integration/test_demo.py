"""The demo (the README's first command), short: two tenants' objects (a fleet's vehicles, a
venue app's phones) on the real road network publish over MQTT through the running pipeline,
each through its tenant's gateway user; the run passes only if events came, they are exactly
the events shapely computes from the positions it published (each tenant's objects against its
own fences), and no event paired a fence with another tenant's object."""

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
    assert summary.startswith("SUMMARY OK: 2 tenants (fleet, venue-app), 0 events across them"), summary
    found = re.search(r"Events (\d[\d,]*) \(ENTER", out)
    assert found is not None and int(found.group(1).replace(",", "")) > 0
    sent = re.search(r"Objects 20 \(10 of fleet, 10 of venue-app\), (\d[\d,]*) position updates", out)
    assert sent is not None and int(sent.group(1).replace(",", "")) == 20 * 2 * 10
    assert "Tenant wall: 0 event(s) paired a fence with another tenant's object" in out
    assert "geofence inspect fence li-vaduz --tenant fleet" in out
