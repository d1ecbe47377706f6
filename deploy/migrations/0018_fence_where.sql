-- A fence's filter on the positions' extra fields (issue 20, part 3; exchanges/filters.py
-- clauses, as a proximity subscription's `where`): a position that fails it is outside the
-- fence. NULL: every position counts.
ALTER TABLE fence ADD COLUMN where_clauses jsonb;
