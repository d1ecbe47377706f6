-- Proximity ("roaming") subscriptions (issue 20): definitions only, never positions (those
-- live in x-ingress's router and the workers' matchers, exchanges/roam_routing.py).
CREATE TABLE roam_subscription (
    id          text PRIMARY KEY,
    owner       text NOT NULL,
    object_id   text NOT NULL,
    radius_m    double precision NOT NULL CHECK (radius_m > 0 AND radius_m <= 50000),
    match       text NOT NULL DEFAULT '*',
    where_json  jsonb NOT NULL DEFAULT '[]',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX roam_subscription_owner ON roam_subscription (owner);

-- Every change, in the order x-ingress applies them (each once: its cursor is in its journal).
-- Writers serialise on an advisory lock, so a seq is never committed after a higher one.
CREATE TABLE roam_change (
    seq             bigserial PRIMARY KEY,
    subscription_id text NOT NULL,
    definition      jsonb,  -- NULL: deleted
    at              timestamptz NOT NULL DEFAULT now()
);
