-- A fence's hysteresis band (issue 20, part 2; exchanges/fence_def.py `hysteresis_zones`): a
-- position counts as inside only hysteresis_m metres inside the boundary, as outside only that
-- far outside it, and keeps the pair's state in between (0: no band, as before). x-geo covers
-- the fence grown by the band, stored as cover_geometry (NULL: the geometry itself) so the
-- nightly rebuild of the bindings covers what the API covered.
ALTER TABLE fence ADD COLUMN hysteresis_m double precision NOT NULL DEFAULT 0
    CHECK (hysteresis_m >= 0 AND hysteresis_m <= 1000);
ALTER TABLE fence ADD COLUMN cover_geometry jsonb;
