"""Venue occupancy (the Bizzy use case, BRIEF s.2 and s.5): presence-sensor frames, counts
derived from their totals, hive occupancy."""
