-- Visits (fence/x_fence/events.py): an ENTER and the LEAVE of the same stay share visit_id,
-- and the LEAVE carries inside_s, the seconds between them. Events archived before, or from
-- a worker of an older version, have neither.
ALTER TABLE fence_event ADD COLUMN visit_id text, ADD COLUMN inside_s double precision;
CREATE INDEX fence_event_by_visit ON fence_event (visit_id) WHERE visit_id IS NOT NULL;
