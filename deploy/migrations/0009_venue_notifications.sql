-- Notification definitions keep their state (fence/venues/notify_rules.py): disarmed after
-- firing until the occupancy goes back past the threshold, and when they last fired (the
-- cool-down). The log keeps the message's title and every outcome: sent, local (the local
-- stack: nothing leaves the machine), unregistered (the token was deleted), failed, quiet,
-- throttled (the device's FCM budget).
ALTER TABLE user_notification_def ADD COLUMN armed boolean NOT NULL DEFAULT true;
ALTER TABLE user_notification_def ADD COLUMN last_sent_at timestamptz;
ALTER TABLE notification_log ADD COLUMN title text NOT NULL DEFAULT '';
ALTER TABLE notification_log ALTER COLUMN token DROP NOT NULL;
CREATE INDEX user_notification_def_by_hive ON user_notification_def (hive_id);
