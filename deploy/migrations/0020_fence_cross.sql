-- CROSS on a fence (issue 20, part 2; exchanges/fence_def.py FenceDef.cross): an object whose
-- two consecutive positions are both outside the fence while the segment between them passes
-- through it gets an event `cross`, reason `crossed`. x-geo reads the flag with the bindings
-- (exchanges/routing_store.py) and tests segments against the bounding boxes of such fences.
ALTER TABLE fence ADD COLUMN detect_cross boolean NOT NULL DEFAULT false;
ALTER TABLE fence_event DROP CONSTRAINT fence_event_event_check;
ALTER TABLE fence_event ADD CONSTRAINT fence_event_event_check CHECK (event IN ('enter', 'leave', 'cross'));
ALTER TABLE fence_event DROP CONSTRAINT fence_event_reason_check;
ALTER TABLE fence_event ADD CONSTRAINT fence_event_reason_check
    CHECK (reason IN ('entered', 'exited', 'timeout', 'fence_changed', 'fence_deleted', 'expired',
                      'dwelled', 'crossed'));
