-- Dwell on a fence (issue 20, part 2; exchanges/fence_def.py FenceDef.dwell_s): a stay counts,
-- and is reported by an ENTER with reason `dwelled`, only once the object has been inside
-- dwell_s seconds; a shorter stay gives no event. 0: ENTER at once, as before.
ALTER TABLE fence ADD COLUMN dwell_s double precision NOT NULL DEFAULT 0
    CHECK (dwell_s >= 0 AND dwell_s <= 86400);
ALTER TABLE fence_event DROP CONSTRAINT fence_event_reason_check;
ALTER TABLE fence_event ADD CONSTRAINT fence_event_reason_check
    CHECK (reason IN ('entered', 'exited', 'timeout', 'fence_changed', 'fence_deleted', 'expired',
                      'dwelled'));
