-- Venue occupancy (BRIEF s.2 and s.5; fence/venues/): hives, their presence sensors, what
-- the sensors report, each hive's live occupancy and closed days, and the app's users
-- (Firebase uids only), their favourites, notification thresholds, device tokens and the
-- notifications sent. Owners are accounts (a Firebase uid with a name).

CREATE TABLE hive_type (
    id      text PRIMARY KEY CHECK (id ~ '^[a-z][a-z0-9_-]{0,31}$'),
    name    text NOT NULL
);
INSERT INTO hive_type (id, name) VALUES
    ('restaurant', 'Restaurant'), ('bar', 'Bar'), ('cafe', 'Café'), ('shop', 'Shop'),
    ('supermarket', 'Supermarket'), ('other', 'Other');

CREATE TABLE owner_account (
    uid         text PRIMARY KEY CHECK (length(uid) BETWEEN 1 AND 128),  -- Firebase uid
    name        text NOT NULL DEFAULT '',
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE hive (
    id              text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$'),
    owner_uid       text REFERENCES owner_account (uid),
    name            text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    type            text NOT NULL REFERENCES hive_type (id),
    address         text NOT NULL DEFAULT '',
    lon             double precision NOT NULL CHECK (lon BETWEEN -180 AND 180),
    lat             double precision NOT NULL CHECK (lat BETWEEN -90 AND 90),
    tz              text NOT NULL DEFAULT 'UTC',            -- IANA zone: legacy frames are local time
    reset_hour      smallint NOT NULL DEFAULT 4 CHECK (reset_hour BETWEEN 0 AND 23),
    opening_hours   jsonb NOT NULL DEFAULT '{}',            -- {"mon": [["11:00", "23:00"]], ...}
    capacity        integer CHECK (capacity > 0),
    fence_id        text REFERENCES fence (id),             -- its polygon in the fence store
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX hive_by_position ON hive (lon, lat);
CREATE INDEX hive_by_owner ON hive (owner_uid);
CREATE INDEX hive_by_fence ON hive (fence_id);

CREATE TABLE sensor (
    id                  text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$'),
    hive_id             text NOT NULL REFERENCES hive (id),
    modem               text NOT NULL DEFAULT '',           -- IMEI / ICCID, for the owner
    byte_order          text NOT NULL DEFAULT 'little' CHECK (byte_order IN ('little', 'big')),
    modulus             integer NOT NULL DEFAULT 65524 CHECK (modulus BETWEEN 2 AND 65536),
    report_interval_min integer NOT NULL DEFAULT 30 CHECK (report_interval_min > 0),
    low_battery_mv      integer NOT NULL DEFAULT 3400,
    -- the counting state (fence/venues/counting.SensorCounts.to_json) as of the reports
    -- stored: written in the same transaction as them, read back at the sidecar's start
    counts              jsonb,
    last_report_at      timestamptz,
    last_status_at      timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sensor_by_hive ON sensor (hive_id);

-- Every counter report as received (raw frame) and what it counted. A redelivered report
-- meets its key and is stored once.
CREATE TABLE sensor_report (
    sensor_id       text NOT NULL REFERENCES sensor (id),
    device_at       timestamptz NOT NULL,       -- the device's time, resolved to an instant
    received_at     timestamptz NOT NULL,
    at              timestamptz NOT NULL,       -- where the counts are placed (clock skew rule)
    version         smallint NOT NULL,          -- 1 legacy, 2 v2
    report_type     smallint NOT NULL,
    counter         integer NOT NULL,           -- v2 message counter; -1 legacy
    total_in        integer NOT NULL,
    total_out       integer NOT NULL,
    entries         integer NOT NULL,
    exits           integer NOT NULL,
    rule            text NOT NULL,              -- fence/venues/counting.RULES
    gap             integer NOT NULL,           -- v2 messages missing before this one
    lost_reports    integer NOT NULL,           -- legacy estimate
    unknowable      boolean NOT NULL,           -- events before a restart could not be known
    skewed          boolean NOT NULL,
    raw             bytea NOT NULL,
    PRIMARY KEY (sensor_id, device_at, total_in, total_out, counter)
);
CREATE INDEX sensor_report_by_time ON sensor_report (at);

-- v2 event reports (one entry or exit each)
CREATE TABLE sensor_event (
    sensor_id       text NOT NULL REFERENCES sensor (id),
    device_ts       bigint NOT NULL,            -- the frame's timestamp (UTC seconds)
    slot            smallint NOT NULL,          -- its place in the frame
    event_type      smallint NOT NULL,          -- 0 exit, 1 entry, 2 status
    distance_mm     integer NOT NULL,
    at              timestamptz NOT NULL,
    received_at     timestamptz NOT NULL,
    PRIMARY KEY (sensor_id, device_ts, event_type, distance_mm, slot)
);

CREATE TABLE sensor_status (
    sensor_id           text NOT NULL REFERENCES sensor (id),
    received_at         timestamptz NOT NULL,
    startup_time        bigint NOT NULL,
    battery_mv          integer NOT NULL,
    sensor_state        integer NOT NULL,
    discarded_events    integer NOT NULL,
    gprs_signal         integer NOT NULL,
    firmware_version    bigint NOT NULL,
    configuration_id    bigint NOT NULL,
    PRIMARY KEY (sensor_id, received_at)
);

-- Configurations pushed on commands/sensor/<id>; applied once a status carries the id
CREATE TABLE sensor_config (
    sensor_id               text NOT NULL REFERENCES sensor (id),
    configuration_id        bigint NOT NULL CHECK (configuration_id BETWEEN 0 AND 4294967295),
    threshold_cm            integer NOT NULL,
    reporting_interval_min  integer NOT NULL,
    status_interval_min     integer NOT NULL,
    event_threshold         integer NOT NULL,
    created_at              timestamptz NOT NULL DEFAULT now(),
    sent_at                 timestamptz,
    applied_at              timestamptz,
    PRIMARY KEY (sensor_id, configuration_id)
);

-- The live figure per hive (fence/venues/occupancy.py): today's counts since the reset
CREATE TABLE hive_status (
    hive_id         text PRIMARY KEY REFERENCES hive (id),
    day             date NOT NULL,
    entries         integer NOT NULL,
    exits           integer NOT NULL,
    occupancy       integer NOT NULL,           -- shown: max(0, raw)
    raw             integer NOT NULL,           -- entries - exits as counted
    app_occupancy   integer,                    -- app users' phones inside the hive's fence
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Closed days: the counts as they ended, and the residual the reset corrected
CREATE TABLE hive_day (
    hive_id     text NOT NULL REFERENCES hive (id),
    day         date NOT NULL,
    entries     integer NOT NULL,
    exits       integer NOT NULL,
    residual    integer NOT NULL,               -- entries - exits at the reset (set back to 0)
    closed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (hive_id, day)
);

CREATE TABLE user_hive (
    uid             text NOT NULL,
    hive_id         text NOT NULL REFERENCES hive (id) ON DELETE CASCADE,
    favourite       boolean NOT NULL DEFAULT false,
    last_viewed_at  timestamptz,
    PRIMARY KEY (uid, hive_id)
);

CREATE TABLE user_notification_def (
    id              bigserial PRIMARY KEY,
    uid             text NOT NULL,
    hive_id         text NOT NULL REFERENCES hive (id) ON DELETE CASCADE,
    threshold       integer NOT NULL CHECK (threshold >= 0),   -- people
    direction       text NOT NULL CHECK (direction IN ('above', 'below')),
    quiet_start     time,                                      -- local time of the hive
    quiet_end       time,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (uid, hive_id, threshold, direction)
);

CREATE TABLE device_token (
    token           text PRIMARY KEY CHECK (length(token) BETWEEN 1 AND 4096),
    uid             text NOT NULL,
    platform        text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_seen_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX device_token_by_uid ON device_token (uid);

CREATE TABLE notification_log (
    id          bigserial PRIMARY KEY,
    def_id      bigint REFERENCES user_notification_def (id) ON DELETE SET NULL,
    uid         text NOT NULL,
    hive_id     text NOT NULL,
    token       text NOT NULL,
    occupancy   integer NOT NULL,
    status      text NOT NULL,                  -- sent, failed, unregistered
    error       text,
    message_id  text,
    sent_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX notification_log_by_def ON notification_log (def_id, sent_at);
