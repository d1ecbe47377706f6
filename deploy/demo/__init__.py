"""The live fleet demo, `geofence demo` (the README's first command ends with it).

- `demo_cmd`: the command: the demo's fences, a fleet publishing over MQTT, the events, a summary.
- `traffic`: the fleet: vehicles on round trips over the extract's road network (pure, seeded).
- `osm_extract`: reading the shipped OpenStreetMap extract (`data/`, (c) OpenStreetMap
  contributors, ODbL 1.0): municipalities, points of interest, the road network. The
  benchmarks and tests read it too.
"""
