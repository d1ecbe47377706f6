-- The nightly rebuild of fence bindings (spark_jobs/rebuild_bindings.py).

-- Each live fence's whole covering (not cut by regions) as the last rebuild computed it from
-- the fence's geometry with the C kernel: little-endian uint64 [first, last] pairs at 26 bits
-- per axis, one interior flag per range. Replaced as a whole by each run.
CREATE TABLE fence_binding (
    fence_id    text PRIMARY KEY,
    version     bigint NOT NULL,
    bits        integer NOT NULL CHECK (bits BETWEEN 1 AND 26),
    n_ranges    integer NOT NULL,
    ranges      bytea NOT NULL,
    interior    bytea NOT NULL,
    run_id      text NOT NULL
);

-- One row per rebuild: what it found and did.
CREATE TABLE fence_binding_run (
    run_id            text PRIMARY KEY,
    started_at        timestamptz NOT NULL,
    finished_at       timestamptz,
    fences            integer,
    ranges            bigint,
    failed            integer,          -- fences whose stored geometry could not be covered
    diff_rows         integer,
    applied           integer,          -- diff rows sent to x-geo and stored in fence_range
    skipped           integer,          -- diff rows whose fence changed meanwhile (the API won)
    worldmap_before   bigint,
    worldmap_after    bigint,           -- differs from before when the worldmap was re-split
    imbalance_before  double precision, -- max region load / mean region load (ranges bound)
    imbalance_after   double precision,
    status            text NOT NULL DEFAULT 'running'
);

-- Where the live bindings (fence_range) differed from the computed ones: 'add' (a region
-- lacks a fence it should bind), 'remove' (binds one it should not), 'change' (other ranges).
-- phase: 'repair' (the same worldmap), 'grow' / 'shrink' (the two steps of a re-split).
CREATE TABLE fence_binding_diff (
    run_id          text NOT NULL,
    phase           text NOT NULL CHECK (phase IN ('repair', 'grow', 'shrink')),
    region          text NOT NULL,
    fence_id        text NOT NULL,
    version         bigint NOT NULL,
    action          text NOT NULL CHECK (action IN ('add', 'remove', 'change')),
    ranges_before   integer NOT NULL,
    ranges_after    integer NOT NULL,
    ranges_removed  integer NOT NULL,   -- the minimal diff: ranges only in the live binding
    ranges_added    integer NOT NULL,   -- ... and only in the computed one
    outcome         text NOT NULL DEFAULT 'pending' CHECK (outcome IN ('pending', 'applied', 'skipped',
                                                                        'dry-run')),
    PRIMARY KEY (run_id, phase, region, fence_id)
);

-- The worldmap version each x-ingress routes with, written on every store check: a re-split
-- removes a region's old bindings only once every live x-ingress routes with the new map.
CREATE TABLE worldmap_seen (
    instance  text PRIMARY KEY,
    version   bigint NOT NULL,
    seen_at   timestamptz NOT NULL DEFAULT now()
);
