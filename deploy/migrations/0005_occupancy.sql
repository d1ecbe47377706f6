-- The nightly occupancy analytics (spark_jobs/occupancy.py; the rules are in its docstring).
-- Days and hours are UTC. A run for day D replaces, in one transaction, every row of D in
-- occupancy_hourly, occupancy_open and occupancy_day, the busiest hours as of D and the
-- forecast for D + 1; the job stages its rows in the *_stage tables first (keyed by run_id).

-- Per fence and UTC hour: every hour of a (fence, day) with any event or any occupancy that
-- day has a row, zeros included, so a day's occupancy curve is complete.
CREATE TABLE occupancy_hourly (
    fence_id        text NOT NULL,
    day             date NOT NULL,
    hour            smallint NOT NULL CHECK (hour BETWEEN 0 AND 23),
    entries         integer NOT NULL,           -- enters that opened a stay (repeats excluded)
    exits           integer NOT NULL,           -- leaves that closed one
    mean_occupancy  double precision NOT NULL,  -- time-weighted mean of the objects inside
    peak_occupancy  integer NOT NULL,           -- most objects inside at one instant
    stays           integer NOT NULL,           -- stays (parts of a day) that began in the hour
    dwell_p50_s     double precision,           -- their length, exact percentiles (NULL: none)
    dwell_p90_s     double precision,
    computed_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (fence_id, day, hour)
);
CREATE INDEX occupancy_hourly_by_day ON occupancy_hourly (day);

-- The objects inside each fence at the end of `day` (sorted): carried into day + 1 as
-- occupancy from 00:00, so the next run need not read the events of earlier days again. One
-- row per fence: the nightly write is per fence, not per object.
CREATE TABLE occupancy_open (
    day         date NOT NULL,
    fence_id    text NOT NULL,
    object_ids  text[] NOT NULL,
    PRIMARY KEY (day, fence_id)
);

-- One row per computed day (also a day without events): a missing day is not a day of zero
-- occupancy, and the seasonal means average only over computed days.
CREATE TABLE occupancy_day (
    day          date PRIMARY KEY,
    events       bigint NOT NULL,     -- events whose effective time falls in the day
    fences       integer NOT NULL,    -- fences with rows in occupancy_hourly
    open_at_end  integer NOT NULL,    -- objects in occupancy_open
    run_id       text NOT NULL,
    computed_at  timestamptz NOT NULL DEFAULT now()
);

-- The busiest hours per weekday as of a day: the mean occupancy of each (weekday, hour) over
-- the 28 days ending at as_of, the top three hours with a mean above zero.
CREATE TABLE occupancy_busiest (
    as_of           date NOT NULL,
    fence_id        text NOT NULL,
    weekday         smallint NOT NULL CHECK (weekday BETWEEN 1 AND 7),  -- ISO: 1 = Monday
    rank            smallint NOT NULL CHECK (rank BETWEEN 1 AND 3),
    hour            smallint NOT NULL CHECK (hour BETWEEN 0 AND 23),
    mean_occupancy  double precision NOT NULL,
    days            smallint NOT NULL,  -- computed days of that weekday averaged
    computed_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (as_of, fence_id, weekday, rank)
);

-- The forecast of each hour of `day`, made at the end of day - 1 (formula in the job's
-- docstring): occupancy = seasonal * trend.
CREATE TABLE occupancy_forecast (
    fence_id     text NOT NULL,
    day          date NOT NULL,
    hour         smallint NOT NULL CHECK (hour BETWEEN 0 AND 23),
    occupancy    double precision NOT NULL,
    seasonal     double precision NOT NULL,
    trend        double precision NOT NULL,  -- a factor, 0.5 to 2
    basis        text NOT NULL CHECK (basis IN ('weekday', 'hour')),
    samples      smallint NOT NULL,  -- computed days the seasonal mean averaged
    computed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (fence_id, day, hour)
);
CREATE INDEX occupancy_forecast_by_day ON occupancy_forecast (day);

-- Staging: the executors append a run's rows here over JDBC; the driver moves them into the
-- tables above in one transaction and deletes them. Unlogged: a crash loses only a run that
-- had not been swapped in, and rows of a run that died are removed a day later.
CREATE UNLOGGED TABLE occupancy_hourly_stage (
    run_id text NOT NULL, staged_at timestamptz NOT NULL DEFAULT now(),
    fence_id text NOT NULL, day date NOT NULL, hour smallint NOT NULL, entries integer NOT NULL,
    exits integer NOT NULL, mean_occupancy double precision NOT NULL, peak_occupancy integer NOT NULL,
    stays integer NOT NULL, dwell_p50_s double precision, dwell_p90_s double precision
);
CREATE UNLOGGED TABLE occupancy_open_stage (
    run_id text NOT NULL, staged_at timestamptz NOT NULL DEFAULT now(),
    day date NOT NULL, fence_id text NOT NULL, object_ids text[] NOT NULL
);
CREATE UNLOGGED TABLE occupancy_busiest_stage (
    run_id text NOT NULL, staged_at timestamptz NOT NULL DEFAULT now(),
    as_of date NOT NULL, fence_id text NOT NULL, weekday smallint NOT NULL, rank smallint NOT NULL,
    hour smallint NOT NULL, mean_occupancy double precision NOT NULL, days smallint NOT NULL
);
CREATE UNLOGGED TABLE occupancy_forecast_stage (
    run_id text NOT NULL, staged_at timestamptz NOT NULL DEFAULT now(),
    fence_id text NOT NULL, day date NOT NULL, hour smallint NOT NULL,
    occupancy double precision NOT NULL, seasonal double precision NOT NULL,
    trend double precision NOT NULL, basis text NOT NULL, samples smallint NOT NULL
);

-- The job reads a window of days by ts and archived_at ranges (one JDBC partition per range).
-- Both grow with the table's physical order, so block-range indexes serve them at a tiny
-- fraction of a B-tree's size and insert cost.
CREATE INDEX fence_event_ts_brin ON fence_event USING brin (ts);
CREATE INDEX fence_event_archived_brin ON fence_event USING brin (archived_at);
