-- Webhooks (issue 40): a tenant's HTTPS endpoints and, per endpoint, the events still to be
-- delivered, in order (fence/webhooks/). Rows of an endpoint are in lanes (a hash of the object):
-- a lane is delivered in `seq` order, one request at a time, so an object's events arrive in order.
CREATE TABLE webhook_endpoint (
    id              text PRIMARY KEY,                       -- wh-<16 hex>
    tenant          text NOT NULL REFERENCES tenant (id) ON DELETE CASCADE,
    url             text NOT NULL,
    fences          text[] NOT NULL DEFAULT '{}',           -- {} = every fence
    kinds           text[] NOT NULL DEFAULT '{}',           -- {} = every kind
    objects         text[] NOT NULL DEFAULT '{}',           -- {} = every object
    batch           integer NOT NULL DEFAULT 1 CHECK (batch BETWEEN 1 AND 500),
    timeout_s       double precision NOT NULL DEFAULT 10 CHECK (timeout_s > 0 AND timeout_s <= 30),
    retry_for_s     double precision NOT NULL DEFAULT 86400 CHECK (retry_for_s > 0),
    local_ok        boolean NOT NULL DEFAULT false,         -- the operator allowed a private address
    enabled         boolean NOT NULL DEFAULT true,
    disabled_reason text,
    disabled_at     timestamptz,
    failing_since   double precision,                        -- epoch s of the first failure since a success
    description     text NOT NULL DEFAULT '',
    secrets         text[] NOT NULL,                         -- whsec_..., newest first
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_endpoint_by_tenant ON webhook_endpoint (tenant);

-- state: 0 to deliver, 1 delivered, 2 given up (dead, `reason` says why). A delivered or dead
-- row is kept for a while (the janitor removes it), so that an event the broker delivers again
-- meets its row and is not sent twice.
CREATE TABLE webhook_outbox (
    endpoint_id     text NOT NULL REFERENCES webhook_endpoint (id) ON DELETE CASCADE,
    event_id        text NOT NULL,
    seq             bigint GENERATED ALWAYS AS IDENTITY,
    lane            smallint NOT NULL,
    body            bytea NOT NULL,                          -- the event's JSON
    event_ts        double precision NOT NULL,
    queued_at       double precision NOT NULL,
    state           smallint NOT NULL DEFAULT 0 CHECK (state IN (0, 1, 2)),
    msg_id          text,                                    -- webhook-id, pinned at the first attempt
    attempts        integer NOT NULL DEFAULT 0,
    first_attempt   double precision,
    next_attempt    double precision NOT NULL DEFAULT 0,
    reason          text,                                    -- the last failure
    done_at         double precision,                        -- delivered or given up
    -- event first: no index but the partial ones below leads with the endpoint, so a lane's
    -- read can only take its own (a stale estimate once had the planner scan the endpoint's
    -- every row by a key that led with it, and sort them, 130 ms a read)
    PRIMARY KEY (event_id, endpoint_id)
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
        autovacuum_vacuum_cost_delay = 0);  -- every row is updated once and removed: vacuum often
CREATE UNIQUE INDEX webhook_outbox_seq ON webhook_outbox (seq);  -- a request's rows are settled by seq
CREATE INDEX webhook_outbox_due ON webhook_outbox (endpoint_id, lane, seq) WHERE state = 0;
CREATE INDEX webhook_outbox_dead ON webhook_outbox (endpoint_id, seq) WHERE state = 2;
CREATE INDEX webhook_outbox_delivered ON webhook_outbox (done_at) WHERE state = 1;
CREATE INDEX webhook_outbox_given_up ON webhook_outbox (done_at) WHERE state = 2;
