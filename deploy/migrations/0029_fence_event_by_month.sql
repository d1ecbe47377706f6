-- The events archive partitioned by month of the event's time (issue 40: the archive had no
-- partitions and no retention). A month is a table of its own, `fence_event_YYYY_MM` (UTC),
-- so an old month leaves by DETACH + DROP (or its export to Parquet first, `geofence archive
-- maintain`), never by a DELETE that scans and bloats; a read by fence and time, or the
-- nightly job's window, touches the months it names only.
--
-- The key is (event_id, ts): a partitioned table's unique key must hold the partition column.
-- It dedupes as the old one did: an event id is a hash of the decision, its ts included
-- (exchanges/fence_events.event_id), so an id has one ts.
--
-- A month's table is made by `fence_event_month(ts)` the first time an event of that month is
-- archived (the archiver calls it for each month it has not seen; `maintain` makes this month's
-- and the next ahead). There is no DEFAULT partition: a month's table could not be made later
-- while the default held rows of it.
--
-- The rows already archived are copied here, in this file's transaction: the archiver's
-- INSERTs wait for it and retry, its queue holding the events meanwhile (nothing is lost).
-- Measured on the project's 2-core machine, the fault suite running beside it: 746,919 rows in
-- 43 s (~17,000 rows/s, five indexes written per row). An archive of millions of rows holds the
-- archiver for minutes: run `geofence migrate` at a quiet hour. (Attaching the old table as one
-- partition instead would skip the copy, but it needs a unique index on (event_id, ts) built
-- and its range validated first, and leaves a partition that is not a month.)

CREATE FUNCTION fence_event_month(at double precision) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    lo   timestamp := date_trunc('month', to_timestamp(at) AT TIME ZONE 'UTC');
    hi   timestamp := lo + interval '1 month';
    name text := 'fence_event_' || to_char(lo, 'YYYY_MM');
BEGIN
    -- a month of this fence_event (the search path's: a test's schema has its own)
    IF NOT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                   WHERE i.inhparent = 'fence_event'::regclass AND c.relname = name) THEN
        BEGIN
            EXECUTE format('CREATE TABLE %I PARTITION OF fence_event FOR VALUES FROM (%s) TO (%s)', name,
                           extract(epoch FROM lo AT TIME ZONE 'UTC'), extract(epoch FROM hi AT TIME ZONE 'UTC'));
        EXCEPTION WHEN duplicate_table OR unique_violation THEN
            NULL;  -- another archiver made it meanwhile
        END;
    END IF;
    RETURN name;
END $$;

ALTER TABLE fence_event RENAME TO fence_event_unpartitioned;
ALTER INDEX fence_event_pkey RENAME TO fence_event_unpartitioned_pkey;
ALTER INDEX fence_event_archived_brin RENAME TO fence_event_unpartitioned_archived_brin;
ALTER INDEX fence_event_by_fence_page RENAME TO fence_event_unpartitioned_by_fence_page;
ALTER INDEX fence_event_by_object RENAME TO fence_event_unpartitioned_by_object;
ALTER INDEX fence_event_by_visit RENAME TO fence_event_unpartitioned_by_visit;
ALTER INDEX fence_event_ts_brin RENAME TO fence_event_unpartitioned_ts_brin;

CREATE TABLE fence_event (
    event_id     text NOT NULL,
    fence_id     text NOT NULL,                 -- no foreign key: events outlive their fence
    object_id    text NOT NULL,
    event        text NOT NULL CONSTRAINT fence_event_event_check CHECK (event IN ('enter', 'leave', 'cross')),
    reason       text NOT NULL CONSTRAINT fence_event_reason_check CHECK (reason ~ '^[a-z][a-z_]{0,31}$'),
    ts           double precision NOT NULL,     -- the event's time, epoch seconds (as on the wire)
    archived_at  timestamptz NOT NULL DEFAULT now(),
    visit_id     text,
    inside_s     double precision,
    PRIMARY KEY (event_id, ts)
) PARTITION BY RANGE (ts);
CREATE INDEX fence_event_by_fence_page ON fence_event (fence_id, ts, event_id);
CREATE INDEX fence_event_by_object ON fence_event (object_id, ts);
CREATE INDEX fence_event_by_visit ON fence_event (visit_id) WHERE visit_id IS NOT NULL;
CREATE INDEX fence_event_ts_brin ON fence_event USING brin (ts);
CREATE INDEX fence_event_archived_brin ON fence_event USING brin (archived_at);

SELECT fence_event_month(m)
FROM (SELECT DISTINCT extract(epoch FROM date_trunc('month', to_timestamp(ts) AT TIME ZONE 'UTC')
                              AT TIME ZONE 'UTC')::double precision AS m
      FROM fence_event_unpartitioned) AS months;
SELECT fence_event_month(extract(epoch FROM now())::double precision);

INSERT INTO fence_event (event_id, fence_id, object_id, event, reason, ts, archived_at, visit_id, inside_s)
SELECT event_id, fence_id, object_id, event, reason, ts, archived_at, visit_id, inside_s
FROM fence_event_unpartitioned;
DROP TABLE fence_event_unpartitioned;
