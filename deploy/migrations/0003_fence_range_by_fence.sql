-- A fence change deletes and rewrites its fence_range rows by fence_id; the primary key
-- (region, fence_id) cannot serve that, so each change scanned the table.
CREATE INDEX fence_range_by_fence ON fence_range (fence_id);
