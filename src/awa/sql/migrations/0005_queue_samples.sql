-- Queue gauges for metrics: the maintenance leader counts each queue's jobs by state and
-- the age of its oldest available job every few seconds and stores them here, so that a
-- metrics scrape (of any process) reads a few rows instead of counting the job table.

CREATE TABLE awa.queue_samples (
    queue text PRIMARY KEY,
    -- Jobs by state: {"available": n, "running": n, ...}; states without jobs are absent.
    counts jsonb NOT NULL DEFAULT '{}',
    oldest_available_at timestamptz,
    sampled_at timestamptz NOT NULL DEFAULT now()
);
