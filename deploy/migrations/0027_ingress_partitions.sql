-- x-ingress instances (issue 39): which instance consumes which partition queue
-- (exchanges/ingress_partitions.py), a new version per `geofence ingress add / remove`; and,
-- beside the worldmap each instance routes with, the partition map it consumes by.
CREATE TABLE ingress_assignment (
    version     bigint PRIMARY KEY CHECK (version > 0),
    owners      jsonb NOT NULL,  -- {"<partition>": "<instance>", ...}, every partition once
    stored_at   timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE worldmap_seen ADD COLUMN partitions_version bigint NOT NULL DEFAULT 0;
