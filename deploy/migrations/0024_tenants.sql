-- Tenants (organisations; exchanges/tenancy.py, fence/tenants.py). Inside the pipeline every
-- tenant's name is qualified `<tenant>:<name>`, so a fence's id here is its qualified id
-- (`fleet:depot`) and the tenant is the part before the first ':' (a generated column, the
-- foreign key to its tenant): a lookup by id can never reach another tenant's row. The same
-- for proximity subscriptions and for every object id stored (events, followed objects,
-- subscribers). Users (Firebase uids) are members of tenants with a role, viewer < editor <
-- admin; platform operators are a Firebase claim, not stored here.

CREATE TABLE tenant (
    id          text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9-]{0,31}$'),  -- tenancy.TENANT_RE
    name        text NOT NULL DEFAULT '' CHECK (length(name) <= 200),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE tenant_member (
    tenant      text NOT NULL REFERENCES tenant (id) ON DELETE CASCADE,
    uid         text NOT NULL CHECK (length(uid) BETWEEN 1 AND 128),      -- Firebase uid
    role        text NOT NULL CHECK (role IN ('viewer', 'editor', 'admin')),
    added_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, uid)
);
CREATE INDEX tenant_member_by_uid ON tenant_member (uid);  -- a caller's tenants, on every request

-- An upgrade of a deployment with data: what existed belongs to the tenant `default`, and
-- every stored fence id and object id becomes `default:<id>`. An id that already holds a ':'
-- is left as it is. On an empty database (a fresh clone) nothing is created or rewritten.
-- The events archive is the long part, all in the migration's transaction (47,500 fences and
-- 1.9 million events: about 90 s on the local stack; the archiver's INSERTs wait, they retry,
-- nothing is lost): upgrade a large archive at a quiet hour. This rewrites PostgreSQL only:
-- the sidecars' own state (x-fence snapshots and journals, x-ingress's proximity journal)
-- still names the old ids, so their upgrade must drop or translate it.
INSERT INTO tenant (id, name)
SELECT 'default', 'Existing data (before tenants)'
WHERE EXISTS (SELECT 1 FROM fence) OR EXISTS (SELECT 1 FROM roam_subscription)
   OR EXISTS (SELECT 1 FROM hive WHERE fence_id IS NOT NULL) OR EXISTS (SELECT 1 FROM fence_event);

CREATE FUNCTION pg_temp.to_default(key text) RETURNS text LANGUAGE sql IMMUTABLE AS
    $$ SELECT CASE WHEN strpos(key, ':') > 0 THEN key ELSE 'default:' || key END $$;

-- The foreign keys on fence (id) go while the ids change, and come back as they were.
ALTER TABLE fence_range DROP CONSTRAINT fence_range_fence_id_fkey;
ALTER TABLE hive DROP CONSTRAINT hive_fence_id_fkey;
ALTER TABLE fence DROP CONSTRAINT fence_id_check, DROP CONSTRAINT fence_follow_object_check;

UPDATE fence SET id = pg_temp.to_default(id), follow_object = pg_temp.to_default(follow_object)
WHERE strpos(id, ':') = 0 OR strpos(follow_object, ':') = 0;
UPDATE fence_range SET fence_id = pg_temp.to_default(fence_id) WHERE strpos(fence_id, ':') = 0;
UPDATE hive SET fence_id = pg_temp.to_default(fence_id) WHERE strpos(fence_id, ':') = 0;
UPDATE fence_binding SET fence_id = pg_temp.to_default(fence_id) WHERE strpos(fence_id, ':') = 0;
UPDATE fence_binding_diff SET fence_id = pg_temp.to_default(fence_id) WHERE strpos(fence_id, ':') = 0;
UPDATE fence_event SET fence_id = pg_temp.to_default(fence_id), object_id = pg_temp.to_default(object_id)
WHERE strpos(fence_id, ':') = 0 OR strpos(object_id, ':') = 0;

-- The nightly occupancy tables (and their staging) hold fence ids, occupancy_open the objects
-- inside too (its order kept). The venue_* tables hold hive ids only: nothing to rewrite.
UPDATE occupancy_hourly SET fence_id = pg_temp.to_default(fence_id) WHERE strpos(fence_id, ':') = 0;
UPDATE occupancy_busiest SET fence_id = pg_temp.to_default(fence_id) WHERE strpos(fence_id, ':') = 0;
UPDATE occupancy_forecast SET fence_id = pg_temp.to_default(fence_id) WHERE strpos(fence_id, ':') = 0;
UPDATE occupancy_hourly_stage SET fence_id = pg_temp.to_default(fence_id) WHERE strpos(fence_id, ':') = 0;
UPDATE occupancy_busiest_stage SET fence_id = pg_temp.to_default(fence_id) WHERE strpos(fence_id, ':') = 0;
UPDATE occupancy_forecast_stage SET fence_id = pg_temp.to_default(fence_id) WHERE strpos(fence_id, ':') = 0;
UPDATE occupancy_open SET fence_id = pg_temp.to_default(fence_id),
    object_ids = ARRAY(SELECT pg_temp.to_default(o) FROM unnest(object_ids) WITH ORDINALITY AS u (o, n)
                       ORDER BY n)::text[];
UPDATE occupancy_open_stage SET fence_id = pg_temp.to_default(fence_id),
    object_ids = ARRAY(SELECT pg_temp.to_default(o) FROM unnest(object_ids) WITH ORDINALITY AS u (o, n)
                       ORDER BY n)::text[];

-- Proximity subscriptions: the id, the subscriber (a point's synthetic subscriber stays
-- "@<id>" of the qualified id, exchanges/subscriptions.py point_object), and in each stored
-- change the definition's `id` and `object` (Subscription.to_wire).
UPDATE roam_subscription SET id = pg_temp.to_default(id),
    object_id = CASE WHEN point_lon IS NOT NULL AND object_id = '@' || id THEN '@' || pg_temp.to_default(id)
                     ELSE pg_temp.to_default(object_id) END
WHERE strpos(id, ':') = 0 OR strpos(object_id, ':') = 0;
UPDATE roam_change SET subscription_id = pg_temp.to_default(subscription_id) WHERE strpos(subscription_id, ':') = 0;
UPDATE roam_change SET definition = definition || jsonb_build_object('id', pg_temp.to_default(definition ->> 'id'))
WHERE jsonb_typeof(definition -> 'id') = 'string' AND strpos(definition ->> 'id', ':') = 0;
UPDATE roam_change SET definition = definition || jsonb_build_object('object',
                                                                     pg_temp.to_default(definition ->> 'object'))
WHERE jsonb_typeof(definition -> 'object') = 'string' AND strpos(definition ->> 'object', ':') = 0;

DROP FUNCTION pg_temp.to_default(text);

-- Every live row is qualified from here on. A fence follows only an object of its own tenant;
-- a subscription's subscriber is one of its tenant's objects, or "@<id>" on a point.
ALTER TABLE fence
    ADD CONSTRAINT fence_id_check CHECK (id ~ '^[a-z0-9][a-z0-9-]{0,31}:[A-Za-z0-9][A-Za-z0-9_-]{0,63}$'),
    ADD CONSTRAINT fence_follow_object_check
        CHECK (follow_object ~ '^[a-z0-9][a-z0-9-]{0,31}:[A-Za-z0-9][A-Za-z0-9_-]{0,63}$'),
    ADD CONSTRAINT fence_follow_same_tenant CHECK (split_part(follow_object, ':', 1) = split_part(id, ':', 1)),
    ADD COLUMN tenant text NOT NULL GENERATED ALWAYS AS (split_part(id, ':', 1)) STORED REFERENCES tenant (id);
CREATE INDEX fence_by_tenant ON fence (tenant, id) WHERE deleted_at IS NULL;  -- a tenant's live fences by id

ALTER TABLE fence_range ADD CONSTRAINT fence_range_fence_id_fkey
    FOREIGN KEY (fence_id) REFERENCES fence (id) ON DELETE CASCADE;
ALTER TABLE hive ADD CONSTRAINT hive_fence_id_fkey FOREIGN KEY (fence_id) REFERENCES fence (id);

ALTER TABLE roam_subscription
    ADD CONSTRAINT roam_subscription_id_check
        CHECK (id ~ '^[a-z0-9][a-z0-9-]{0,31}:[A-Za-z0-9][A-Za-z0-9_-]{0,63}$'),
    ADD CONSTRAINT roam_subscription_object_id_check
        CHECK (CASE WHEN point_lon IS NULL
                    THEN object_id ~ '^[a-z0-9][a-z0-9-]{0,31}:[A-Za-z0-9][A-Za-z0-9_-]{0,63}$'
                         AND split_part(object_id, ':', 1) = split_part(id, ':', 1)
                    ELSE object_id = '@' || id END),
    ADD COLUMN tenant text NOT NULL GENERATED ALWAYS AS (split_part(id, ':', 1)) STORED REFERENCES tenant (id);
CREATE INDEX roam_subscription_by_tenant ON roam_subscription (tenant, id);
