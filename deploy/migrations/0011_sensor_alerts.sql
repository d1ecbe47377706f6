-- Owner alerts (fence/venues/sensor_alerts.py): a sensor silent for more than twice its
-- reporting interval, or whose last status said its battery is low. An alert is raised once,
-- pushed to the hive owner's devices, and cleared when the condition ends (a report came; the
-- battery is back above its threshold by a margin); at most one open alert per sensor and kind.
CREATE TABLE sensor_alert (
    id          bigserial PRIMARY KEY,
    sensor_id   text NOT NULL REFERENCES sensor (id) ON DELETE CASCADE,
    hive_id     text NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('silent', 'low_battery')),
    detail      text NOT NULL,
    raised_at   timestamptz NOT NULL DEFAULT now(),
    cleared_at  timestamptz
);
CREATE UNIQUE INDEX sensor_alert_open ON sensor_alert (sensor_id, kind) WHERE cleared_at IS NULL;
CREATE INDEX sensor_alert_by_hive ON sensor_alert (hive_id, raised_at);

-- the notification log also holds the owner alerts' pushes (no occupancy, no definition)
ALTER TABLE notification_log ADD COLUMN alert_id bigint REFERENCES sensor_alert (id) ON DELETE SET NULL;
ALTER TABLE notification_log ALTER COLUMN occupancy DROP NOT NULL;
