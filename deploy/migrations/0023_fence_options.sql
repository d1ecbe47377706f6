-- A fence's options in one column (issue 35; exchanges/fence_options/): the fields of FenceDef
-- after its name, in their JSON form (`encode_options`: those set, and timeout_s always), so an
-- option is added without a migration. The fence service validates every option before it
-- stores one (the checks of each option's module); x-geo reads `cross` with the bindings
-- (exchanges/routing_store.py).
ALTER TABLE fence ADD COLUMN options jsonb NOT NULL DEFAULT '{}'::jsonb
    CHECK (jsonb_typeof(options) = 'object');
UPDATE fence SET options = jsonb_strip_nulls(jsonb_build_object(
    'timeout_s', timeout_s,
    'hysteresis_m', CASE WHEN hysteresis_m <> 0 THEN hysteresis_m END,
    'where', CASE WHEN where_clauses IS NOT NULL AND jsonb_typeof(where_clauses) = 'array'
                       AND where_clauses <> '[]'::jsonb THEN where_clauses END,
    'dwell_s', CASE WHEN dwell_s <> 0 THEN dwell_s END,
    'cross', CASE WHEN detect_cross THEN true END));
ALTER TABLE fence DROP COLUMN timeout_s, DROP COLUMN hysteresis_m, DROP COLUMN where_clauses,
    DROP COLUMN dwell_s, DROP COLUMN detect_cross;
-- An event's reason is one of the reasons the pipeline and the options give
-- (exchanges/fence_events.py REASONS, which the archiver checks before it stores an event):
-- here only its shape, so a new option's reason needs no migration.
ALTER TABLE fence_event DROP CONSTRAINT fence_event_reason_check;
ALTER TABLE fence_event ADD CONSTRAINT fence_event_reason_check CHECK (reason ~ '^[a-z][a-z_]{0,31}$');
