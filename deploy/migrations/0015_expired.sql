-- An object silent past its own TTL (the `ttl` of its latest position) LEAVEs every fence it
-- is in with reason `expired` (fence/x_fence/core.py, `expire`).
ALTER TABLE fence_event DROP CONSTRAINT fence_event_reason_check;
ALTER TABLE fence_event ADD CONSTRAINT fence_event_reason_check
    CHECK (reason IN ('entered', 'exited', 'timeout', 'fence_changed', 'fence_deleted', 'expired'));
