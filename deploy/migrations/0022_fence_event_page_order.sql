-- `GET /fences/{id}/events` (and the AMQP `events` op) page a fence's archived events by
-- cursor in the order (ts, event_id), a total order (fence/store.py `fence_events`). On
-- (fence_id, ts) alone, every page of a burst of events at one ts (a busy fence deleted, a
-- new fence's ENTERs) read and sorted the whole burst; on this index a page is one range
-- scan of its own rows. It serves every query the old index did (its prefix), so that one
-- goes: still one index to write per archived event.
-- Built inside the migration's transaction: the archiver's INSERTs wait for it (they retry,
-- nothing is lost); on a very large archive run it at a quiet hour.
CREATE INDEX fence_event_by_fence_page ON fence_event (fence_id, ts, event_id);
DROP INDEX fence_event_by_fence;
