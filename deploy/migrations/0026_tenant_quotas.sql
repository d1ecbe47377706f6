-- Per-tenant quotas (fence/quotas.py): what a tenant may hold at most, where it differs from
-- the platform's defaults (a row per resource set by `geofence tenant quota`; none: the
-- default). And each fence's vertex count, kept with it, so a tenant's vertices are one sum.

CREATE TABLE tenant_quota (
    tenant      text NOT NULL REFERENCES tenant (id) ON DELETE CASCADE,
    resource    text NOT NULL CHECK (resource IN ('fences', 'vertices', 'follow_fences', 'subscriptions')),
    max         bigint NOT NULL CHECK (max >= 0),
    PRIMARY KEY (tenant, resource)
);

ALTER TABLE fence ADD COLUMN vertices integer NOT NULL DEFAULT 0 CHECK (vertices >= 0);

-- the fences stored before: their GeoJSON's positions, ring by ring (closing ones included,
-- as shapely counts them, fence/quotas.py)
UPDATE fence SET vertices = (
    SELECT coalesce(sum(jsonb_array_length(ring)), 0)::integer FROM (
        SELECT jsonb_array_elements(geometry -> 'coordinates') AS ring
        WHERE geometry ->> 'type' = 'Polygon'
        UNION ALL
        SELECT jsonb_array_elements(polygon)
        FROM jsonb_array_elements(geometry -> 'coordinates') AS polygon
        WHERE geometry ->> 'type' = 'MultiPolygon'
    ) AS rings);
