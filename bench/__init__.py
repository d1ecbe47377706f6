"""The benchmarks: figures, not tests (docs/benchmarks.md).

Each benchmark is a module of this package, run from the repository's root as
`python -m bench.<name> [--help]` (or, as before, `python bench/<name>.py`: bench/cli.py):

- `hilbert`: the C Hilbert kernel and polygon coverings, no services;
- `e2e`: the fleet-over-fences workload through the cores (`--mode core`, no services) or the
  running stack (`amqp`, `mqtt`, `half`, `durability`);
- `moving_fences`: fences that follow objects, on the running stack;
- `devices`: device onboarding in bulk against one by one, on the running stack;
- `spark_jobs` (and its part `spark_occupancy_part`): the nightly PySpark jobs on generated data.

Shared, not run: `workload` (the fleet-over-fences workload, its shapely reference and the
in-process core pipeline; also used by the tests), `broker_modes` (that workload through the
running stack), `tenant` (the benchmarks' tenant `bench` on the stack: its creation, a gateway
user for a run, qualified ids, events qualified again for the comparisons), `moving_fleet`
(moving_fences's fences following cars, also soak's), `report` (how every benchmark prints its
figures: tables, ratios to a target or a named reference, the SUMMARY line, progress) and `cli`
(what their command lines share).
"""
