-- The nightly venue analytics (spark_jobs/venue_analytics.py, run by occupancy-analytics after
-- the fences; the rules are in spark_jobs/venue_core.py). Days are a hive's business days
-- (fence/venues/occupancy.py: local time, from its reset hour), hours its local clock hours.
-- Two sources side by side: the door sensors (sensor_report) and the app users' phones inside
-- the hive's fence (occupancy_hourly of that fence). A run replaces its days in one transaction
-- from the *_stage tables, as the fence analytics do.

-- Per hive, business day and local hour: every hour of a computed day has a row, zeros included.
CREATE TABLE venue_hourly (
    hive_id         text NOT NULL,
    day             date NOT NULL,
    hour            smallint NOT NULL CHECK (hour BETWEEN 0 AND 23),
    entries         integer NOT NULL,           -- as the sensors counted them (raw)
    exits           integer NOT NULL,
    mean_occupancy  double precision NOT NULL,  -- time-weighted, of the drift-corrected curve
    peak_occupancy  double precision NOT NULL,
    phones_mean     double precision,           -- NULL: the hive has no fence
    phones_peak     integer,
    computed_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (hive_id, day, hour)
);
CREATE INDEX venue_hourly_by_day ON venue_hourly (day);

-- One row per computed (hive, business day): a day with at least one sensor report. A hive
-- whose sensors were silent all day has no row, so a dead sensor is not a day of zero guests.
CREATE TABLE venue_day (
    hive_id     text NOT NULL,
    day         date NOT NULL,
    reports     integer NOT NULL,
    entries     integer NOT NULL,
    exits       integer NOT NULL,
    residual    integer NOT NULL,               -- entries - exits at the day's end, as counted
    correction  text NOT NULL CHECK (correction IN ('none', 'exits', 'entries', 'one-sided', 'open')),
    factor      double precision NOT NULL,      -- what the corrected side was multiplied by
    complete    boolean NOT NULL,               -- false: the day had not ended at the run
    run_id      text NOT NULL,
    computed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (hive_id, day)
);
CREATE INDEX venue_day_incomplete ON venue_day (day) WHERE NOT complete;

-- "Popular times": the mean occupancy per (ISO weekday, local hour) over the computed days of
-- the 28 ending at as_of; one profile per hive, the latest.
CREATE TABLE venue_profile (
    hive_id     text NOT NULL,
    weekday     smallint NOT NULL CHECK (weekday BETWEEN 1 AND 7),
    hour        smallint NOT NULL CHECK (hour BETWEEN 0 AND 23),
    occupancy   double precision NOT NULL,
    phones      double precision,
    samples     smallint NOT NULL,              -- computed days of that weekday averaged
    as_of       date NOT NULL,
    computed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (hive_id, weekday, hour)
);

-- The forecast of each local hour of business day `day`, made as of day - 1.
CREATE TABLE venue_forecast (
    hive_id     text NOT NULL,
    day         date NOT NULL,
    hour        smallint NOT NULL CHECK (hour BETWEEN 0 AND 23),
    occupancy   double precision NOT NULL,
    phones      double precision,
    seasonal    double precision NOT NULL,
    trend       double precision NOT NULL,
    basis       text NOT NULL CHECK (basis IN ('weekday', 'hour')),
    samples     smallint NOT NULL,
    computed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (hive_id, day, hour)
);

CREATE UNLOGGED TABLE venue_hourly_stage (
    run_id text NOT NULL, task text NOT NULL, staged_at timestamptz NOT NULL DEFAULT now(),
    hive_id text NOT NULL, day date NOT NULL, hour smallint NOT NULL, entries integer NOT NULL,
    exits integer NOT NULL, mean_occupancy double precision NOT NULL,
    peak_occupancy double precision NOT NULL, phones_mean double precision, phones_peak integer
);
CREATE UNLOGGED TABLE venue_day_stage (
    run_id text NOT NULL, task text NOT NULL, staged_at timestamptz NOT NULL DEFAULT now(),
    hive_id text NOT NULL, day date NOT NULL, reports integer NOT NULL, entries integer NOT NULL,
    exits integer NOT NULL, residual integer NOT NULL, correction text NOT NULL,
    factor double precision NOT NULL, complete boolean NOT NULL
);
CREATE UNLOGGED TABLE venue_profile_stage (
    run_id text NOT NULL, task text NOT NULL, staged_at timestamptz NOT NULL DEFAULT now(),
    hive_id text NOT NULL, weekday smallint NOT NULL, hour smallint NOT NULL,
    occupancy double precision NOT NULL, phones double precision, samples smallint NOT NULL,
    as_of date NOT NULL
);
CREATE UNLOGGED TABLE venue_forecast_stage (
    run_id text NOT NULL, task text NOT NULL, staged_at timestamptz NOT NULL DEFAULT now(),
    hive_id text NOT NULL, day date NOT NULL, hour smallint NOT NULL,
    occupancy double precision NOT NULL, phones double precision, seasonal double precision NOT NULL,
    trend double precision NOT NULL, basis text NOT NULL, samples smallint NOT NULL
);

