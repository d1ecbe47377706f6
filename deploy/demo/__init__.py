"""The live fleet demo's data and generators (`geofence demo`, deploy/demo_cmd.py, the README's
first command ends with it; the benchmarks and tests use them too).

- `traffic`: the fleet: vehicles on round trips over the extract's road network (pure, seeded).
- `osm_extract`: reading the shipped OpenStreetMap extract (`data/`, (c) OpenStreetMap
  contributors, ODbL 1.0): municipalities, points of interest, the road network. The
  benchmarks and tests read it too.
"""
