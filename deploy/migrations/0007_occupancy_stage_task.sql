-- The occupancy job's executors stage their own rows (COPY), each task tagged with its
-- partition and attempt ("3.0"): the swap takes the rows of the attempts Spark kept, so a task
-- that failed half-way, or a speculative copy, adds nothing.
ALTER TABLE occupancy_hourly_stage ADD COLUMN task text NOT NULL DEFAULT '';
ALTER TABLE occupancy_open_stage ADD COLUMN task text NOT NULL DEFAULT '';
ALTER TABLE occupancy_busiest_stage ADD COLUMN task text NOT NULL DEFAULT '';
ALTER TABLE occupancy_forecast_stage ADD COLUMN task text NOT NULL DEFAULT '';
