-- The events archive (fence/archive.py writes it, `GET /fences/{id}/events` reads it) and
-- fences that follow an object (fence/follow.py).

-- One row per event, whatever the number of deliveries: event_id is the x-fence core's stable
-- id (the same decision on the same input always gets the same id), so a redelivered event
-- meets the primary key and is dropped by ON CONFLICT DO NOTHING.
CREATE TABLE fence_event (
    event_id     text PRIMARY KEY,
    fence_id     text NOT NULL,                 -- no foreign key: events outlive their fence
    object_id    text NOT NULL,
    event        text NOT NULL CHECK (event IN ('enter', 'leave')),
    reason       text NOT NULL CHECK (reason IN ('entered', 'exited', 'timeout', 'fence_changed',
                                                 'fence_deleted')),
    ts           double precision NOT NULL,     -- the event's time, epoch seconds (as on the wire)
    archived_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX fence_event_by_fence ON fence_event (fence_id, ts);
CREATE INDEX fence_event_by_object ON fence_event (object_id, ts);

-- A fence may follow an object: a circle of follow_radius_m around the object's latest
-- position, moved by the fence service. follow_ts is the time of the position the geometry was
-- built from: a move with an older position is refused, so replicas and redeliveries never move
-- a fence backwards.
ALTER TABLE fence
    ADD COLUMN follow_object   text CHECK (follow_object ~ '^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$'),
    ADD COLUMN follow_radius_m double precision CHECK (follow_radius_m > 0),
    ADD COLUMN follow_ts       double precision,
    ADD CONSTRAINT fence_follow_whole CHECK ((follow_object IS NULL) = (follow_radius_m IS NULL));
CREATE INDEX fence_following ON fence (follow_object) WHERE deleted_at IS NULL AND follow_object IS NOT NULL;
CREATE INDEX fence_by_owner ON fence (owner) WHERE deleted_at IS NULL;
