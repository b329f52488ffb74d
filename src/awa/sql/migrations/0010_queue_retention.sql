-- Per-queue retention: how long a queue's finished jobs stay, overriding the worker-wide
-- completed_retention / failed_retention. Stored by each worker at start for the queues it
-- runs (a queue without an override has no row), read by the leader's retention duty.

CREATE TABLE awa.queue_retention (
    queue text PRIMARY KEY,
    completed_seconds double precision CHECK (completed_seconds IS NULL OR completed_seconds > 0),
    failed_seconds double precision CHECK (failed_seconds IS NULL OR failed_seconds > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
