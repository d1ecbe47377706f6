-- Fences (the source of truth), their live Hilbert bindings per x-geo region, and the
-- worldmap. Applied once, in order, by deploy/migrate.py (`geofence up` runs it).

CREATE TABLE fence (
    id          text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$'),
    name        text NOT NULL DEFAULT '',
    owner       text NOT NULL DEFAULT '',
    geometry    jsonb NOT NULL,                 -- GeoJSON Polygon / MultiPolygon, lon/lat
    timeout_s   double precision NOT NULL CHECK (timeout_s > 0),
    -- Bumped by every change, deletion included, and never reset: x-geo and x-fence ignore
    -- a change older than the one they know, so a re-created id must continue the count.
    version     bigint NOT NULL CHECK (version > 0),
    min_lon     double precision NOT NULL,
    min_lat     double precision NOT NULL,
    max_lon     double precision NOT NULL,
    max_lat     double precision NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz                     -- a deleted fence keeps its row (and version)
);
CREATE INDEX fence_live_bbox ON fence (min_lon, max_lon, min_lat, max_lat) WHERE deleted_at IS NULL;

-- What each x-geo region has bound: the fence's covering ranges (little-endian uint64
-- [first, last] pairs at 26 bits per axis) clipped to the region, with one interior flag per
-- range. A region a fence does not touch has no row. x-geo recovers from this table.
CREATE TABLE fence_range (
    fence_id    text NOT NULL REFERENCES fence (id) ON DELETE CASCADE,
    region      text NOT NULL,
    version     bigint NOT NULL,
    bits        integer NOT NULL CHECK (bits BETWEEN 1 AND 26),
    ranges      bytea NOT NULL,
    interior    bytea NOT NULL,
    PRIMARY KEY (region, fence_id)
);

-- Which Hilbert intervals belong to which region (ingress.worldmap.Worldmap.to_json).
-- The newest version is the one in force; x-ingress polls for it.
CREATE TABLE worldmap (
    version     bigint PRIMARY KEY CHECK (version > 0),
    body        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
