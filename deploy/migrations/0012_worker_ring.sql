-- Workers added and removed live (`geofence worker add / remove`, deploy/worker_ops.py).
--
-- The x-fence workers' consistent-hash ring (exchanges.hash_ring.HashRing.to_dict: the
-- workers and their weights), versioned like the worldmap: a new version is stored once the
-- state of the fences it moves has been handed over. x-geo routes, x-fence recovers and the
-- fence service answers with the newest; with none stored, GEOFENCE_WORKERS (weight 1 each).
CREATE TABLE worker_ring (
    version     bigint PRIMARY KEY CHECK (version > 0),
    body        jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- While a row says so (until its lease runs out), every x-ingress stops consuming: the
-- pipeline drains so that a handover finds no position between two workers. A controller
-- that dies leaves the pause to expire on its own. `token` names this pause.
CREATE TABLE ingress_pause (
    id      integer PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    token   text NOT NULL,
    until   timestamptz NOT NULL,
    reason  text NOT NULL
);

-- An x-ingress says which pause it has stopped consuming for (NULL: it consumes), as it
-- says its worldmap: a controller waits for its own token, never for an older pause's.
ALTER TABLE worldmap_seen ADD COLUMN paused_for text;
